"""The interactive explorer (analysis.explorer): its payload against attention recomputed from the formula in
float64, and what a headless Chromium draws when a layer / head is chosen, a patch or token is hovered and the
PCA / MaskCut overlays are toggled, with every request that leaves the file refused and counted."""

from __future__ import annotations

import base64
import fnmatch
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from browser import browser, open_page  # noqa: F401  (browser is a fixture)

import crate_transformer as ct
from crate_transformer import analysis
from crate_transformer.analysis.explorer import (
    explorer_section,
    image_payload,
    mask_labels,
    quantize_rows,
    text_payload,
    write_explorer,
)
from crate_transformer.data import load_dataset
from crate_transformer.models.lm import LMConfig, build_lm

TINY = dict(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=4)


def direct_attention(layer: torch.nn.Module, z: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(p^-1/2 (U_k^T LN(z))^T (U_k^T LN(z))) per head in float64 (MSSA scores, eq. (12) with the official
    p^-1/2 scale), written from the formula with the layer's own LayerNorm and U: (b, K, n, n)."""
    b, n, _ = z.shape
    K, p = layer.attn.heads, layer.attn.dim_head
    w = layer.attn.qkv(layer.norm1(z)).double().view(b, n, K, p).transpose(1, 2)
    s = w @ w.transpose(-1, -2) / p**0.5
    if causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1)


def unpack(payload: dict, key: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(base64.b64decode(payload[key]), dtype=np.uint8).reshape(shape)


@pytest.fixture(scope="module")
def images():
    test = load_dataset("digits", "test")
    return test.images[:3].float() / 255, (test.mean, test.std)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return ct.create_model("crate_tiny", **TINY).eval()


@pytest.fixture(scope="module")
def payload(model, images):
    return image_payload(model, images[0], images[1])


@pytest.fixture(scope="module")
def direct(model, images):
    """Every layer's attention of the images, recomputed from the formula: list of (b, K, 1 + N, 1 + N)."""
    x = analysis._common.normalize_images(images[0], images[1])
    with torch.no_grad():
        trace = model.forward_trace(x)
        return [direct_attention(model.layers[li], trace.tokens[li]) for li in range(len(model.layers))]


# --------------------------------------------------------------------------- payload
def test_quantize_rows_scales_each_row_to_its_maximum():
    a = np.array([[0.1, 0.4, 0.2], [0.0, 0.0, 0.0], [3.0, 1.5, 0.0]])
    q = quantize_rows(a)
    assert q.dtype == np.uint8
    assert q.tolist() == [[64, 255, 128], [0, 0, 0], [255, 128, 0]]  # round(255 * a / max) by hand


def test_mask_labels_number_masks_from_one_and_keep_the_first_on_overlap():
    m = np.zeros((2, 2, 3), dtype=bool)
    m[0, 0, :2] = True
    m[1, 0, 1:] = True
    assert mask_labels(m).tolist() == [[1, 1, 2], [0, 0, 0]]


def test_image_payload_matches_the_attention_formula_and_the_segmentation(model, images, payload, direct):
    b, K, L, (h, w) = 3, 4, 2, payload["grid"]
    N = h * w
    assert payload["layers"] == [1, 2] and (h, w) == (4, 4) and len(payload["images"]) == b
    att = unpack(payload, "attention", (b, L, K, N + 1, N)).astype(int)
    for li in range(L):
        want = quantize_rows(direct[li][..., 1:])  # class-token column dropped, each row to its own max
        assert np.abs(att[:, li] - want.astype(int)).max() <= 1  # float32 model vs float64 formula: one level
    # the class-token row is cls_attention's map (renormalised after dropping the class column: same ratios)
    x = analysis._common.normalize_images(images[0], images[1])
    cls = analysis.cls_attention(model, x, -1).flatten(-2)
    assert np.abs(att[:, -1, :, 0] - quantize_rows(cls).astype(int)).max() <= 1
    feats = analysis.patch_features(model, x, 0)
    rgb, _ = analysis.pca_rgb(feats, (h, w))
    np.testing.assert_array_equal(unpack(payload, "pca", (b, L, h, w, 3))[:, 0], (rgb * 255).round())
    labels = unpack(payload, "masks", (b, L, h, w))[:, 0]
    for i in range(b):
        np.testing.assert_array_equal(labels[i], mask_labels(analysis.maskcut(feats[i], (h, w), 3, 0.15)))


def test_image_payload_keeps_the_last_layer_within_the_byte_budget(model, images):
    per_layer = 3 * 4 * 17 * 16
    p = image_payload(model, images[0], images[1], max_bytes=per_layer)  # room for one layer
    assert p["layers"] == [2]
    assert image_payload(model, images[0], images[1], layers=[0])["layers"] == [1]


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda m, x: image_payload(m, x[0]), "non-empty"),
        (lambda m, x: image_payload(m, x, layers=[5]), "layer 5 does not exist"),
        (lambda m, x: image_payload(m, x, captions=["a"]), "one caption per image"),
        (lambda m, x: explorer_section({"kind": "video"}), "not an explorer payload"),
    ],
)
def test_bad_input_is_a_one_line_error(model, images, call, match):
    with pytest.raises(ValueError, match=match) as e:
        call(model, images[0])
    assert "\n" not in str(e.value)


def test_the_section_is_self_contained(payload):
    sec = explorer_section(payload)
    assert "<script src" not in sec and "http" not in sec.replace("http-equiv", "")
    assert "</script>" not in sec.split("id='xp-data'>")[1].split("</script>")[0]  # the JSON cannot end the tag


# --------------------------------------------------------------------------- the page in a browser
CELL_CENTERS = """([id, h, w]) => {
  const c = document.getElementById(id), g = c.getContext('2d'), out = [];
  for (let r = 0; r < h; r++) for (let q = 0; q < w; q++) {
    const d = g.getImageData(Math.floor((q + 0.5) * c.width / w), Math.floor((r + 0.5) * c.height / h), 1, 1).data;
    out.push([d[0], d[1], d[2]]);
  }
  return out;
}"""


def cells(page, canvas: str, grid) -> np.ndarray:
    return np.array(page.evaluate(CELL_CENTERS, [canvas, *grid]), dtype=int)


def hover_patch(page, q: int, grid) -> None:
    page.locator("#xp-attn").scroll_into_view_if_needed()  # the mouse only reaches what is in the viewport
    box = page.locator("#xp-attn").bounding_box()
    h, w = grid
    page.mouse.move(box["x"] + (q % w + 0.5) * box["width"] / w, box["y"] + (q // w + 0.5) * box["height"] / h)


@pytest.fixture(scope="module")
def image_page(browser, payload, tmp_path_factory):  # noqa: F811
    path = write_explorer(payload, tmp_path_factory.mktemp("explorer") / "explorer.html")
    page, blocked, errors = open_page(browser, path)
    yield page
    assert blocked == [] and errors == []  # nothing left the file, no JavaScript error
    page.close()


def test_hovering_a_patch_draws_its_attention_brightest_where_the_formula_peaks(image_page, payload, direct):
    page, grid, cmap = image_page, payload["grid"], np.array(payload["colormap"])
    page.select_option("#xp-item", "1")
    page.select_option("#xp-layer", "0")
    page.select_option("#xp-head", "2")
    page.fill("#xp-alpha", "100")  # opaque overlay: the canvas shows the colour map alone
    a = direct[0][1, 2, 1:, 1:].numpy()  # image 2, layer 1, head 3: patch queries over patch keys
    top2 = np.sort(a, 1)[:, -2:]
    q = int(np.argmax(top2[:, 1] / top2[:, 0]))  # the query whose peak is clearest
    assert top2[q, 1] / top2[q, 0] > 1.05
    hover_patch(page, q, grid)
    assert page.get_attribute("#xp-attn", "data-query") == str(q)
    px = cells(page, "xp-attn", grid)
    brightness = px @ np.array([0.299, 0.587, 0.114])
    assert int(np.argmax(brightness)) == int(np.argmax(a[q]))
    want = cmap[quantize_rows(a[q])]  # each cell is the colour map at the quantised attention
    assert np.abs(px - want).max() <= 20  # one quantisation level of the colour map at most
    assert page.get_attribute("#xp-attn", "data-peak") == str(int(np.argmax(a[q])))
    # hiding the query's own patch: the rest rescaled to its own maximum, brightest where the formula's second peaks
    rest = a.copy()
    np.fill_diagonal(rest, 0)
    top2 = np.sort(rest, 1)[:, -2:]
    q = int(np.argmax(top2[:, 1] / top2[:, 0]))
    page.check("#xp-noself")  # (a click: the mouse leaves the image, so hover after it)
    hover_patch(page, q, grid)
    brightness = cells(page, "xp-attn", grid) @ np.array([0.299, 0.587, 0.114])
    assert int(np.argmax(brightness)) == int(np.argmax(rest[q])) != q
    assert page.get_attribute("#xp-attn", "data-peak") == str(int(np.argmax(rest[q])))
    page.uncheck("#xp-noself")
    page.mouse.move(0, 0)  # leaving the image: the class token's row
    assert page.get_attribute("#xp-attn", "data-query") == "-1"
    cls_px = cells(page, "xp-attn", grid) @ np.array([0.299, 0.587, 0.114])
    assert int(np.argmax(cls_px)) == int(np.argmax(direct[0][1, 2, 0, 1:].numpy()))


def test_pca_and_maskcut_toggles_recolour_the_patches(image_page, payload):
    page, grid = image_page, payload["grid"]
    h, w = grid
    page.select_option("#xp-item", "0")
    page.select_option("#xp-layer", "1")
    plain = cells(page, "xp-seg", grid)
    page.check("#xp-pca")
    want = unpack(payload, "pca", (3, 2, h, w, 3))[0, 1].reshape(-1, 3)
    np.testing.assert_array_equal(cells(page, "xp-seg", grid), want)
    page.uncheck("#xp-pca")
    np.testing.assert_array_equal(cells(page, "xp-seg", grid), plain)
    page.check("#xp-masks")
    labels = unpack(payload, "masks", (3, 2, h, w))[0, 1].ravel()
    assert labels.any()
    colours = np.array(payload["mask_colors"])
    masked = cells(page, "xp-seg", grid)
    inside = labels > 0
    want = 0.45 * plain[inside] + 0.55 * colours[labels[inside] - 1]
    assert np.abs(masked[inside] - want).max() <= 2  # alpha blending in 8 bits
    np.testing.assert_array_equal(masked[~inside], plain[~inside])
    page.uncheck("#xp-masks")


# --------------------------------------------------------------------------- language models
def test_hovering_a_token_colours_the_tokens_it_attends_to(browser, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    lm = build_lm(LMConfig(vocab_size=262, block_size=16, dim=32, depth=2, heads=2)).eval()
    ids = torch.randint(0, 256, (2, 12))
    toks = [[f"t{int(i)}" for i in row] for row in ids]
    p = text_payload(lm, ids, toks)
    with torch.no_grad():
        z = lm.forward_trace(ids).tokens[1]
        a = direct_attention(lm.layers[1], z, causal=True)[1, 1].numpy()  # text 2, layer 2, head 2
    page, blocked, errors = open_page(browser, write_explorer(p, tmp_path / "text.html"))
    page.select_option("#xp-item", "1")
    page.select_option("#xp-layer", "1")
    page.select_option("#xp-head", "1")
    q = 7
    page.hover(f"#xp-tokens .xp-tok[data-i='{q}']")
    shown = [page.get_attribute(f".xp-tok[data-i='{j}']", "data-attn") for j in range(12)]
    assert np.abs(np.array(shown, dtype=int) - quantize_rows(a[q]).astype(int)).max() <= 1
    assert shown[q + 1 :] == ["0"] * (11 - q)  # causal: nothing after the query, drawn without a background
    style = "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).color]"
    assert page.eval_on_selector(f".xp-tok[data-i='{q + 1}']", style) == ["rgba(0, 0, 0, 0)", "rgb(170, 170, 170)"]
    peak = int(np.argmax(a[q]))
    bg = page.eval_on_selector(f".xp-tok[data-i='{peak}']", "e => getComputedStyle(e).backgroundColor")
    assert bg == "rgb({}, {}, {})".format(*p["colormap"][255])
    assert page.inner_text(f".xp-tok[data-i='{peak}']") in page.inner_text("#xp-status")
    assert blocked == [] and errors == []
    page.close()


# --------------------------------------------------------------------------- report.html
def test_report_html_embeds_the_explorer_of_its_images(browser, model, images, tmp_path):  # noqa: F811
    imgs, norm = images
    rep = analysis.analyze(model, tmp_path, {"test": imgs}, normalization=norm, num_vis=2, n_masks=2, progress=False)
    assert rep["explorer"] == {"layers": [1, 2], "images": 2}
    page, blocked, errors = open_page(browser, tmp_path / "report.html")
    assert page.locator("#xp-item option").count() == 2 and page.locator("#xp-layer option").count() == 2
    # the class-token attention drawn for the report's layer is the report's attention map (rep["attention"])
    page.fill("#xp-alpha", "100")
    px = cells(page, "xp-attn", (4, 4)) @ np.array([0.299, 0.587, 0.114])
    assert int(np.argmax(px)) == int(np.argmax(np.array(rep["attention"]["maps"])[0, 0]))
    hover_patch(page, 5, (4, 4))
    assert "patch (1, 1)" in page.inner_text("#xp-status")
    assert blocked == [] and errors == []
    page.close()


def test_the_javascript_and_css_ship_with_the_package():
    """pyproject's package-data names every non-Python file of the package (the explorer's JavaScript and CSS
    among them), so `pip install .` installs them."""
    root = Path(__file__).resolve().parents[2]
    table = (root / "pyproject.toml").read_text().split("[tool.setuptools.package-data]")[1]
    globs = json.loads(re.search(r"^crate_transformer = (\[.*\])$", table, re.M).group(1))
    pkg = root / "src" / "crate_transformer"
    assets = [
        p.relative_to(pkg).as_posix()
        for p in pkg.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    assert {"analysis/explorer.css", "analysis/explorer.js"} <= set(assets)
    for a in assets:
        assert any(fnmatch.fnmatch(a, g) for g in globs), f"{a} is not in pyproject's package-data"


def test_language_model_report_holds_a_token_explorer(browser, tmp_path):  # noqa: F811
    from crate_transformer.analysis.language import analyze_text, token_attention

    torch.manual_seed(1)
    lm = build_lm(LMConfig(vocab_size=262, block_size=16, dim=32, depth=2, heads=2)).eval()
    blocks = torch.randint(0, 256, (6, 16))
    rep = analyze_text(lm, tmp_path, blocks, attn_tokens=10, explorer_texts=3)
    assert rep["explorer"] == {"texts": 3, "layers": [1, 2]}
    page_text = (tmp_path / "report.html").read_text()
    payload = json.loads(re.search(r"id='xp-data'>(.*?)</script>", page_text).group(1).replace("<\\/", "</"))
    assert payload["tokens"] == [[str(int(i)) for i in b[:10]] for b in blocks[:3]]  # no tokenizer: the ids
    att = unpack(payload, "attention", (3, 2, 2, 10, 10)).astype(int)
    want = quantize_rows(token_attention(lm, blocks[2, :10], layer=0))
    assert np.abs(att[2, 0] - want.astype(int)).max() <= 1
    page, blocked, errors = open_page(browser, tmp_path / "report.html")
    page.select_option("#xp-item", "2")
    page.hover("#xp-tokens .xp-tok[data-i='4']")
    assert page.get_attribute(".xp-tok[data-i='4']", "class") == "xp-tok xp-query"
    assert page.locator("#xp-tokens .xp-tok").count() == 10
    assert blocked == [] and errors == []
    page.close()


def outline_pixels(labels: np.ndarray) -> int:
    """The outline of instance label maps as the explorer draws it: an instance pixel with a 4-neighbour of another
    label or on the image border."""
    padded = np.pad(labels.astype(int), 1, constant_values=-1)
    centre = padded[1:-1, 1:-1]
    nb = [padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]]
    return int(((centre > 0) & np.any([n != centre for n in nb], axis=0)).sum())


def test_report_explorer_draws_the_ground_truth_outline_beside_the_predicted_mask(browser, model, images, tmp_path):  # noqa: F811
    """Issue 51 §5: with ground truth, the explorer's segmentation panel draws the truth's outline (yellow) over
    MaskCut's mask: exactly the outline pixels of the labels, scaled to the canvas; unticking hides it."""
    imgs, norm = images
    truth = torch.zeros(len(imgs), *imgs.shape[-2:], dtype=torch.uint8)
    truth[:, 1:5, 2:6] = 1  # one square object per image (8 x 8 digits), and a second one in the first image
    truth[0, 6:8, 0:3] = 2
    rep = analysis.analyze(
        model, tmp_path, {"test": imgs}, normalization=norm, num_vis=2, n_masks=2, progress=False, truth=truth
    )
    assert rep["explorer"]["ground_truth"] is True
    page, blocked, errors = open_page(browser, tmp_path / "report.html")
    page.check("#xp-masks")
    shown = [0, len(imgs) - 1]  # the two evenly spaced images the report shows
    for item, i in enumerate(shown):
        page.select_option("#xp-item", str(item))
        assert int(page.get_attribute("#xp-seg", "data-truth")) == outline_pixels(truth[i].numpy())
    page.select_option("#xp-item", "0")
    c = page.evaluate("""() => { const c = document.getElementById('xp-seg'); return [c.width, c.height]; }""")
    x, y = int((2 + 0.5) * c[0] / imgs.shape[-1]), int((3 + 0.5) * c[1] / imgs.shape[-2])  # left edge of the square
    px = page.evaluate("([x, y]) => Array.from(document.getElementById('xp-seg').getContext('2d')"
                       ".getImageData(x, y, 1, 1).data)", [x, y])  # fmt: skip
    assert px[:3] == [255, 235, 59]  # the outline's yellow, drawn over the mask
    page.uncheck("#xp-truth")
    assert page.get_attribute("#xp-seg", "data-truth") == "0"
    assert blocked == [] and errors == []
    page.close()
