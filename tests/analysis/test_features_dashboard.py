"""The features.html dashboard of `crate features` in a headless Chromium: choosing a layer and an atom (a unit of
the sparse code) shows that unit's statistics and top-activating patches, checked against the ISTA output
recomputed by a plain forward pass; every request that leaves the file is refused and counted."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from browser import browser, open_page  # noqa: F401  (browser is a fixture)

import crate_transformer as ct
from crate_transformer.analysis import features as F
from crate_transformer.analysis._common import normalize_images
from crate_transformer.data import load_dataset

TINY = dict(image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=32, depth=2, heads=4)
READY = "body[data-atom]"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", **TINY).eval()
    test = load_dataset("digits", "test")
    images, labels = test.images[:40].float() / 255, test.labels[:40]
    norm = (test.mean, test.std)
    report, assets = F.image_features(model, images, labels, normalization=norm, k=4)
    path = tmp_path_factory.mktemp("features") / "features.html"
    path.write_text(F.render_dashboard({**report, **assets, "description": "digits, 40 test images"}))
    with torch.no_grad():  # the ISTA outputs Z^(l+1) of every layer, patch tokens only: (layers, images, N, d)
        tokens = model.forward_trace(normalize_images(images, norm)).tokens[1:]
    codes = torch.stack([t[:, 1:] for t in tokens]).numpy()
    return path, report, codes


def test_choosing_a_layer_and_an_atom_shows_its_top_patches(browser, setup):  # noqa: F811
    path, report, codes = setup
    page, blocked, errors = open_page(browser, path, ready=READY)
    page.select_option("#layer-select", "2")
    assert page.get_attribute("body", "data-layer") == "2" and page.get_attribute("body", "data-atom") == "0"
    layer = codes[1].reshape(-1, codes.shape[-1])  # (images * N, d), sample-major as the dashboard numbers them
    freq = (layer > 0).mean(0)
    u = int(np.argmax(np.where(freq < 0.9, layer.max(0), -1)))  # a selective unit with the strongest response
    page.click(f"#atom-list button.atom[data-atom='{u}']")
    assert page.get_attribute("body", "data-atom") == str(u)
    assert "selected" in page.get_attribute(f"button.atom[data-atom='{u}']", "class")
    stat = page.inner_text("[data-stat='frequency']")
    assert float(stat.split(":")[1]) == pytest.approx(freq[u], abs=1e-4)
    examples = page.locator("#atom-examples .example")
    assert examples.count() == 4
    n = codes.shape[2]
    best = np.argsort(-layer[:, u], kind="stable")[:4]  # the plain forward pass's top-4 tokens of unit u
    shown = [(int(examples.nth(i).get_attribute("data-sample")), int(examples.nth(i).get_attribute("data-position")))
             for i in range(4)]  # fmt: skip
    assert shown == [(int(t // n), int(t % n)) for t in best]
    # the whole-image canvas outlines the patch in red (#e53935) around the top token's position
    page.wait_for_function("() => document.querySelector('#atom-examples canvas.whole').getContext('2d')"
                           ".getImageData(0, 0, 1, 1).data[3] > 0")  # fmt: skip
    side, (r, c) = 4, divmod(shown[0][1], 4)
    px = page.evaluate(
        """([r, c, side]) => { const cv = document.querySelector('#atom-examples canvas.whole');
        const s = cv.width / side; return Array.from(cv.getContext('2d').getImageData(
        Math.floor(c * s + 1), Math.floor((r + 0.5) * s), 1, 1).data).slice(0, 3); }""",
        [r, c, side],
    )
    assert np.abs(np.array(px) - [229, 57, 53]).max() <= 3
    page.select_option("#sort-select", "frequency")
    first = int(page.get_attribute("#atom-list button.atom >> nth=0", "data-atom"))
    assert freq[first] == pytest.approx(freq.max())
    assert blocked == [] and errors == []
    page.close()


def test_effects_scatter_and_stats(browser, setup, tmp_path):  # noqa: F811
    """With the effects (crate features --effects) the page shows a purity-vs-flip scatter of the layer's scored
    units, the chosen atom's effect with its interval, and orders the atoms by effect."""
    from crate_transformer.analysis import effects as E

    _, report, _ = setup
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", **TINY).eval()
    test = load_dataset("digits", "test")
    images, labels = test.images[:40].float() / 255, test.labels[:40]
    found = E.image_effects(model, images[:12], labels[:12], normalization=(test.mean, test.std), n_boot=200)
    data = E.attach_effects(json.loads(json.dumps(report)), found, 12, n_boot=200)
    _, assets = F.image_features(model, images, labels, normalization=(test.mean, test.std), k=4)
    path = tmp_path / "features.html"
    path.write_text(F.render_dashboard({**data, **assets, "description": "with effects"}))
    page, blocked, errors = open_page(browser, path, ready=READY)
    page.select_option("#layer-select", "2")
    units = data["layers"][1]["units"]
    scored = [u["unit"] for u in units if u["class_purity"] is not None]
    dots = page.locator("#effect-scatter .dot")
    assert dots.count() == len(scored) > 0
    u = scored[-1]
    page.dispatch_event(f"#effect-scatter .dot[data-atom='{u}']", "click")  # dots of equal values overlap
    assert page.get_attribute("body", "data-atom") == str(u)
    assert "selected" in page.get_attribute(f"#effect-scatter .dot[data-atom='{u}']", "class")
    shown = page.inner_text("[data-stat='effect_flip']").split(":", 1)[1]
    assert float(shown.split("[")[0]) == pytest.approx(units[u]["effect_flip"], abs=1e-4)
    lo, hi = (float(v) for v in shown.split("[")[1].rstrip("]").split(","))
    assert lo == pytest.approx(units[u]["effect_flip_lo"], abs=1e-4) and hi >= lo
    header = page.inner_text("#summary-table")
    assert "flip (ablated)" in header and "ρ(class purity, flip)" in header
    page.select_option("#sort-select", "effect")
    first = int(page.get_attribute("#atom-list button.atom >> nth=0", "data-atom"))
    assert units[first]["effect_flip"] == pytest.approx(max(v["effect_flip"] for v in units))
    assert blocked == [] and errors == []
    page.close()
