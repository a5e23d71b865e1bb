"""The device-side augmentations (``data/augment.py``), on the device under test, against independent references:
torchvision's laws transcribed in plain Python, ``F.interpolate``, ``colorsys``, kornia's Gaussian blur; and the
shapes and ranges the training tasks rely on.  That they never read a value back from the device is checked by
tests/test_device_hygiene.py."""

from __future__ import annotations

import colorsys
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tolerances import tol

from crate_transformer.data import augment as A


def test_shift_is_a_zero_filled_integer_shift_of_at_most_pad_pixels(device) -> None:
    x = torch.rand(16, 2, 12, 10).to(device)
    shift = A.RandomShift(2)
    torch.manual_seed(0)
    y = shift(x)
    dy, dx = (t.cpu() for t in shift.last)
    padded = F.pad(x, (2, 2, 2, 2))
    for i in range(16):
        assert torch.equal(y[i], padded[i, :, dy[i] : dy[i] + 12, dx[i] : dx[i] + 10])
    assert 0 <= dy.min() and dy.max() <= 4 and len(set(zip(dy.tolist(), dx.tolist()))) > 5
    torch.manual_seed(0)
    assert torch.equal(shift(x), y)  # torch's RNG: a resumed run draws the same shifts


def _torchvision_box(h: int, w: int, scale, ratio) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (transcribed), with Python's RNG."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            return random.randint(0, h - ch), random.randint(0, w - cw), ch, cw
    in_ratio = w / h
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


@pytest.mark.parametrize(("h", "w", "scale"), [(32, 32, (0.08, 1.0)), (20, 36, (0.4, 1.0)), (16, 16, (0.05, 0.4))])
def test_crop_boxes_follow_torchvisions_law(h: int, w: int, scale: tuple[float, float], device) -> None:
    """The boxes' area fraction, aspect ratio and position have torchvision's distribution (4000 draws each, compared
    by mean and quartiles), and every box lies inside the image."""
    random.seed(0)
    torch.manual_seed(0)
    ratio = (3 / 4, 4 / 3)
    ref = np.array([_torchvision_box(h, w, scale, ratio) for _ in range(4000)], dtype=float)
    boxes = A.RandomResizedCropFlip(8, scale, ratio).boxes(torch.zeros(4000, 1, h, w, device=device))
    top, left, bh, bw = (t.cpu().numpy() for t in boxes)
    ours = np.stack([top, left, bh, bw], 1)
    assert (ours[:, 0] >= 0).all() and (ours[:, 0] + ours[:, 2] <= h).all() and (ours[:, 2] >= 1).all()
    assert (ours[:, 1] >= 0).all() and (ours[:, 1] + ours[:, 3] <= w).all() and (ours[:, 3] >= 1).all()
    for stat in (lambda b: b[:, 2] * b[:, 3] / (h * w), lambda b: np.log(b[:, 3] / b[:, 2]), lambda b: b[:, 0] / h):
        a, r = stat(ours), stat(ref)
        assert a.mean() == pytest.approx(r.mean(), abs=0.02)
        np.testing.assert_allclose(np.quantile(a, [0.25, 0.5, 0.75]), np.quantile(r, [0.25, 0.5, 0.75]), atol=0.05)


def test_no_fitting_box_falls_back_to_torchvisions_central_crop(device) -> None:
    random.seed(0)
    for h, w in ((10, 30), (30, 10), (12, 12)):
        crop = A.RandomResizedCropFlip(6, scale=(2.0, 3.0))  # larger than the image: nothing fits
        boxes = torch.stack(crop.boxes(torch.zeros(3, 1, h, w, device=device)), 1)
        assert boxes.tolist() == [list(map(float, _torchvision_box(h, w, (2.0, 3.0), (3 / 4, 4 / 3))))] * 3


def test_a_crop_is_the_bilinear_resize_of_its_box_flipped_or_not(device) -> None:
    torch.manual_seed(0)
    x = torch.rand(12, 3, 16, 16, dtype=torch.float64).to(device)
    whole = A.RandomResizedCropFlip(24, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    y, flipped = whole(x), whole.last[4]
    want = F.interpolate(x, size=(24, 24), mode="bilinear", align_corners=False)
    assert 0 < flipped.sum() < 12
    torch.testing.assert_close(y, torch.where(flipped.view(-1, 1, 1, 1), want.flip(-1), want), **tol(x.dtype, device))
    crop = A.RandomResizedCropFlip(20, scale=(0.1, 0.5), flip=0.0)
    y = crop(x)
    top, left, bh, bw, _ = (t.long().cpu() for t in crop.last)
    for i in range(12):
        box = x[i : i + 1, :, top[i] : top[i] + bh[i], left[i] : left[i] + bw[i]]
        want = F.interpolate(box, size=(20, 20), mode="bilinear", align_corners=False)[0]
        # inside the box's own border F.interpolate clamps to the box, the crop reads the pixels around it
        rows = (torch.arange(20) + 0.5) * bh[i] / 20 - 0.5
        cols = (torch.arange(20) + 0.5) * bw[i] / 20 - 0.5
        keep_r, keep_c = (rows >= 0) & (rows <= bh[i] - 1), (cols >= 0) & (cols <= bw[i] - 1)
        got, want = y[i].cpu(), want.cpu()
        torch.testing.assert_close(got[:, keep_r][:, :, keep_c], want[:, keep_r][:, :, keep_c], **tol(x.dtype, device))


def _rgb(n: int = 6, h: int = 5, w: int = 4) -> torch.Tensor:
    return torch.rand(n, 3, h, w, dtype=torch.float64)


def test_colour_adjustments_are_torchvisions_blends(device) -> None:
    x = _rgb().to(device)
    f = torch.tensor([0.6, 0.9, 1.0, 1.2, 1.4, 0.75], dtype=torch.float64).view(-1, 1, 1, 1).to(device)
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    torch.testing.assert_close(A.adjust_brightness(x, f), (x * f).clamp(0, 1))
    mean = luma.mean((1, 2)).view(-1, 1, 1, 1)
    torch.testing.assert_close(A.adjust_contrast(x, f), (f * x + (1 - f) * mean).clamp(0, 1))
    torch.testing.assert_close(A.adjust_saturation(x, f), (f * x + (1 - f) * luma[:, None]).clamp(0, 1))
    g = x[:, :1]
    torch.testing.assert_close(A.adjust_saturation(g, f), g)  # grey stays grey
    shift = torch.linspace(-0.1, 0.1, 6, dtype=torch.float64).view(-1, 1, 1, 1)
    out, x = A.adjust_hue(x, shift.to(device)).cpu(), x.cpu()
    for i in range(6):
        for r, c in ((0, 0), (2, 3), (4, 1)):
            h, s, v = colorsys.rgb_to_hsv(*x[i, :, r, c].tolist())
            want = colorsys.hsv_to_rgb((h + shift[i].item()) % 1.0, s, v)
            np.testing.assert_allclose(out[i, :, r, c].numpy(), want, atol=1e-12)


def test_colour_jitter_applies_its_recorded_factors_in_its_recorded_order(device) -> None:
    torch.manual_seed(3)
    x = _rgb(16).float().to(device)
    jitter = A.ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8)
    y = jitter(x)
    order, factors, chosen = jitter.last
    assert sorted(order) == [0, 1, 2, 3] and 0 < chosen.sum() < 16
    assert all(((1 - a) <= f).all() and (f <= 1 + a).all() for a, f in zip((0.4, 0.4, 0.2), factors))
    want = x
    for i in order:
        want = A.JITTERS[i](want, factors[i])
    torch.testing.assert_close(y, torch.where(chosen, want, x), **tol(torch.float32, device))
    assert 0 <= y.min() and y.max() <= 1


def test_blur_is_kornias_gaussian_blur_with_the_drawn_width(device) -> None:
    from kornia.filters import gaussian_blur2d

    torch.manual_seed(0)
    x = torch.rand(5, 3, 12, 12, dtype=torch.float64)
    blur = A.GaussianBlur(5, (0.1, 2.0), p=1.0)
    y = blur(x.to(device)).cpu()
    sigma = blur.last[0][:, 0].cpu()
    for i in range(5):
        s = sigma[i].item()
        want = gaussian_blur2d(x[i : i + 1], (5, 5), (s, s), border_type="reflect")
        torch.testing.assert_close(y[i : i + 1], want, rtol=1e-6, atol=1e-6)


def test_grayscale_and_solarize(device) -> None:
    torch.manual_seed(0)
    x = _rgb(64).float().to(device)
    grey = A.RandomGrayscale(0.5)(x)
    is_grey = (grey[:, 0] == grey[:, 1]).all(-1).all(-1)
    assert 15 < is_grey.sum() < 50
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    torch.testing.assert_close(grey[is_grey][:, 1], luma[is_grey])
    torch.testing.assert_close(grey[~is_grey], x[~is_grey])
    sol = A.Solarize(1.0)(x)
    torch.testing.assert_close(sol, torch.where(x >= 0.5, 1 - x, x))
    assert torch.equal(A.Solarize(0.0)(x), x)
