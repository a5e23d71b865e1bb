"""Every PIL mode is decoded to its picture, scaled into 8 bits and never clipped, on every path an image takes
(``data.pixels.picture``): checked against float64 formulas written here, for each mode PIL lists."""

from __future__ import annotations

import colorsys
import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crate_transformer.data.memory import decode_image, image_transform
from crate_transformer.data.pixels import picture

H, W = 4, 6
RNG = np.random.default_rng(0)


def _srgb_from_lab(lab: np.ndarray) -> np.ndarray:
    """CIE L*a*b* (D50; PIL's bytes: L·255/100, a and b as signed bytes) → sRGB 0…255 (Bradford D50→D65)."""
    signed = np.where(lab > 127, lab - 256, lab)
    L, a, b = lab[..., 0] * 100 / 255, signed[..., 1], signed[..., 2]
    fy = (L + 16) / 116
    fx, fz = fy + a / 500, fy - b / 200
    inv = lambda f: np.where(f**3 > 216 / 24389, f**3, (116 * f - 16) / (24389 / 27))  # noqa: E731
    xyz50 = np.stack([inv(fx) * 0.96422, inv(fy) * 1.0, inv(fz) * 0.82521], -1)
    bradford = np.array(
        [[0.9555766, -0.0230393, 0.0631636], [-0.0282895, 1.0099416, 0.0210077], [0.0122982, -0.0204830, 1.3299098]]
    )
    to_rgb = np.array(
        [[3.2404542, -1.5371385, -0.4985314], [-0.9692660, 1.8760108, 0.0415560], [0.0556434, -0.2040259, 1.0572252]]
    )
    lin = np.clip(xyz50 @ bradford.T @ to_rgb.T, 0, 1)
    return 255 * np.where(lin <= 0.0031308, 12.92 * lin, 1.055 * lin ** (1 / 2.4) - 0.055)


def _case(mode: str) -> tuple[Image.Image, np.ndarray, float]:
    """An image of ``mode`` made from random samples, its picture by a float64 formula, and the tolerance."""
    u8 = lambda *c: RNG.integers(0, 256, (H, W, *c), dtype=np.uint8)  # noqa: E731
    if mode == "1":
        bits = RNG.integers(0, 2, (H, W)).astype(bool)
        return Image.fromarray(bits), bits * 255.0, 0
    if mode in ("L", "LA", "La"):
        grey = u8()
        alpha = np.full((H, W), 255, np.uint8)  # opaque: La's premultiplied grey is then the grey itself
        data = grey if mode == "L" else np.stack([grey, alpha], -1)
        return Image.frombytes(mode, (W, H), data.tobytes()), grey.astype(float), 0
    if mode.startswith("I;16"):
        v = RNG.integers(0, 65536, (H, W)).astype(np.uint16)
        order = {"I;16B": ">u2", "I;16": "<u2", "I;16L": "<u2", "I;16N": "=u2"}[mode]
        return Image.frombytes(mode, (W, H), v.astype(order).tobytes()), v / 65535 * 255, 0.5
    if mode == "I":
        v = RNG.integers(0, 65536, (H, W)).astype(np.int32)
        return Image.frombytes(mode, (W, H), v.astype("=i4").tobytes()), v / 65535 * 255, 0.5
    if mode == "F":
        v = RNG.random((H, W)).astype(np.float32)
        return Image.frombytes(mode, (W, H), v.astype("=f4").tobytes()), v.astype(float) * 255, 0.5
    if mode in ("P", "PA"):
        palette = u8(3).reshape(-1, 3)[:16]
        idx = RNG.integers(0, len(palette), (H, W)).astype(np.uint8)
        data = idx if mode == "P" else np.stack([idx, np.full((H, W), 255, np.uint8)], -1)
        im = Image.frombytes(mode, (W, H), data.tobytes())
        im.putpalette(palette.ravel().tolist())
        return im, palette[idx].astype(float), 0
    if mode in ("RGB", "RGBA", "RGBX", "RGBa"):
        rgb = u8(3)
        data = rgb if mode == "RGB" else np.concatenate([rgb, np.full((H, W, 1), 255, np.uint8)], -1)
        return Image.frombytes(mode, (W, H), data.tobytes()), rgb.astype(float), 0
    c = u8(4 if mode == "CMYK" else 3).astype(float)
    if mode == "LAB":  # colours inside the sRGB gamut: outside it, clipping in one space or another differs
        c = np.stack([RNG.integers(50, 200, (H, W)), *RNG.integers(-20, 21, (2, H, W)) % 256], -1).astype(float)
    im = Image.frombytes(mode, (W, H), c.astype(np.uint8).tobytes())
    if mode == "CMYK":
        return im, 255 * (1 - c[..., :3] / 255) * (1 - c[..., 3:] / 255), 1
    if mode == "YCbCr":  # JPEG's full-range YCbCr (ITU-R BT.601)
        y, cb, cr = c[..., 0], c[..., 1] - 128, c[..., 2] - 128
        rgb = np.stack([y + 1.402 * cr, y - 0.344136 * cb - 0.714136 * cr, y + 1.772 * cb], -1)
        return im, np.clip(rgb, 0, 255), 1
    if mode == "HSV":
        rgb = [colorsys.hsv_to_rgb(*(p / 255)) for p in c.reshape(-1, 3)]
        return im, np.array(rgb).reshape(H, W, 3) * 255, 1
    if mode == "LAB":
        return im, _srgb_from_lab(c), 3  # PIL goes through littleCMS's profiles: a few levels apart at most
    raise AssertionError(f"no case for PIL mode {mode}: add one")


def _modes() -> list[str]:
    return list(getattr(Image, "MODES", None) or Image._MODEINFO)


@pytest.mark.parametrize("mode", _modes())
def test_every_pil_mode_is_its_picture_scaled_not_clipped(mode: str) -> None:
    im, expected, tol = _case(mode)
    assert np.array_equal(picture(im)[0], decode_image(im.copy(), mode, "error")[0])  # the training path
    got, grey = picture(im)
    assert grey == (expected.ndim == 2)
    assert got.dtype == np.uint8 and got.shape == expected.shape
    assert np.abs(got.astype(float) - expected).max() <= tol, (mode, got, expected.round())
    channels = 1 if grey else 3  # the evaluation path: image_transform, unscaled, centre crop
    config = {
        "input_size": (channels, H, H),
        "mean": (0.0,) * channels,
        "std": (1.0,) * channels,
        "crop_pct": 1.0,
        "interpolation": "bilinear",
    }
    x = image_transform(config)(im).numpy().astype(float) * 255
    centre = expected[:, (W - H) // 2 : (W - H) // 2 + H]
    assert np.abs(x - (centre if grey else centre.transpose(2, 0, 1))).max() <= tol + 1e-3


def _png16(tmp: Path) -> tuple[Path, np.ndarray]:
    """A 16-bit greyscale PNG (what made white images) and its picture."""
    v = (np.linspace(0, 65535, H * W).reshape(H, W)).astype(np.uint16)
    path = tmp / "deep.png"
    Image.frombytes("I;16", (W, H), v.astype("<u2").tobytes()).save(path)
    assert Image.open(path).mode.startswith("I")  # PIL reads it back with its 16-bit samples
    return path, np.rint(v / 65535 * 255)


def test_a_16_bit_png_is_its_picture_on_the_training_and_the_evaluation_paths(tmp_path: Path) -> None:
    path, expected = _png16(tmp_path)
    for data in (path, path.read_bytes(), Image.open(path)):  # a folder's file, a streamed sample, a PIL image
        got, grey = decode_image(data, path, "error")
        assert grey and np.array_equal(got, expected.astype(np.uint8))
        assert (got == 255).mean() < 0.1  # not the white image PIL's convert("L") makes
    config = {"input_size": (1, H, H), "mean": (0.0,), "std": (1.0,), "crop_pct": 1.0, "interpolation": "bilinear"}
    x = image_transform(config)(Image.open(path))
    assert x.shape == (1, H, H) and torch.isfinite(x).all()
    centre = (expected[:, (W - H) // 2 : (W - H) // 2 + H] / 255).astype(np.float32)
    assert torch.allclose(x[0], torch.from_numpy(centre), atol=1e-6)


def test_samples_no_scale_fits_are_one_line(tmp_path: Path) -> None:
    for mode, v in (("F", np.float32([[0.5, 3.0]])), ("I", np.int32([[0, 70000]]))):
        im = Image.frombytes(mode, (2, 1), v.tobytes())
        with pytest.raises(ValueError, match=r"samples span .* save the image with 8- or 16-bit samples"):
            picture(im)
        buf = io.BytesIO()
        im.save(buf, format="TIFF")
        assert decode_image(buf.getvalue(), "x.tif", "skip") is None  # an unreadable image, by the one rule


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links")
def test_a_broken_link_among_images_is_an_unreadable_image_by_the_one_rule(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Skipped with the unreadable images (``--on-bad-image skip``) or refused in one line naming it (``error``),
    in memory and streamed: never a raw ``[Errno 2]`` from listing the folder."""
    from clitools import crate, one_line_error, warnings_shown

    data = tmp_path / "data"
    for c in "ab":
        (data / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(RNG.integers(0, 256, (8, 8), dtype=np.uint8)).save(data / c / f"{i}.png")
    os.symlink(tmp_path / "gone.png", data / "a" / "link.png")
    for mode in ("memory", "stream"):
        argv = [
            "train",
            "--data",
            data,
            "--data-mode",
            mode,
            "--workers",
            0,
            "--image-size",
            8,
            "--batch-size",
            4,
            "--max-steps",
            4,
            "--threads",
            1,
            "--no-progress",
            "--model-args",
            "dim=16",
            "depth=1",
            "heads=2",
            "patch_size=4",
        ]
        capsys.readouterr()
        with warnings_shown():
            assert crate(*argv, "--on-bad-image", "skip", "--out", tmp_path / f"s{mode}") == 0
        err = capsys.readouterr().err
        assert "link.png" in err, (mode, err)
        one_line_error(
            capsys,
            *argv,
            "--on-bad-image",
            "error",
            "--out",
            tmp_path / f"e{mode}",
            after_output=True,
            match=r"cannot read image .*link\.png.*--on-bad-image skip",
        )


@pytest.mark.parametrize(
    "key, value",
    [
        ("std", 0.0),
        ("std", float("nan")),
        ("std", float("inf")),
        ("std", -0.2),
        ("std", 2.0),
        ("mean", float("nan")),
        ("mean", float("-inf")),
        ("mean", -0.5),
        ("mean", 1.5),
    ],
)
def test_a_mean_or_std_that_makes_non_finite_inputs_is_refused_by_its_range(key: str, value: float) -> None:
    """``resolve_data_config`` bounds them by the one ``Range`` rule: never an ``image_transform`` that divides by 0
    or carries a NaN into every input."""
    import crate_transformer as ct

    model = ct.create_model("crate_mnist", image_size=8, patch_size=4, in_chans=1, dim=16, depth=1, heads=2)
    with pytest.raises(ValueError, match=rf"^{key} must be a finite number in .*got {value}"):
        ct.resolve_data_config(model, **{key: (value,)})
    x = image_transform(ct.resolve_data_config(model))(Image.new("L", (8, 8), 128))
    assert torch.isfinite(x).all()


# EXIF Orientation → how a viewer turns the stored pixels (the EXIF 2.3 table), as numpy does it: 3 half a turn,
# 6 a quarter turn clockwise, 8 a quarter turn anticlockwise, 2 / 4 mirrored left-right / top-bottom
_VIEWED = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: np.rot90(a, 2),
    4: lambda a: a[::-1],
    6: lambda a: np.rot90(a, -1),
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize("orientation", sorted(_VIEWED))
def test_a_jpeg_with_an_exif_orientation_is_decoded_upright(tmp_path: Path, orientation: int) -> None:
    stored = np.zeros((16, 32, 3), dtype=np.uint8)  # wide, and no two corners alike
    stored[:8, :16] = (250, 20, 20)
    stored[:8, 16:] = (20, 250, 20)
    stored[8:, :16] = (20, 20, 250)
    stored[8:, 16:] = (250, 250, 250)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / "photo.jpg"
    Image.fromarray(stored).save(path, quality=95, subsampling=0, exif=exif.tobytes())
    with Image.open(path) as im:
        assert im.getexif()[0x0112] == orientation and im.size == (32, 16)  # what the file holds
    decoded, grey = decode_image(path, "photo.jpg", "error")
    expected = _VIEWED[orientation](stored)
    assert not grey and decoded.shape == expected.shape

    def error(a: np.ndarray) -> float:
        return float(np.abs(decoded.astype(int) - a.astype(int)).mean())

    assert error(expected) < 4  # JPEG's error, at the colour edges
    others = [v(stored) for k, v in _VIEWED.items() if k != orientation and v(stored).shape == expected.shape]
    assert others and min(error(a) for a in others) > 50  # any other way of turning it is far off
