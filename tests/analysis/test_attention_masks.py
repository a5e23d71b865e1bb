"""The Fig. 20 recipe: keep-mass thresholding against DINO's transcribed code, per-head masks of a tiny 8×8-patch
CRATE, one panel per head."""

import matplotlib
import numpy as np
import pytest
import torch
from official import dino_threshold

import crate_transformer as ct
from crate_transformer.analysis import attention_masks as am
from crate_transformer.analysis import cls_attention

matplotlib.use("Agg")


@pytest.mark.parametrize("mass", [0.1, 0.6, 0.9, 1.0])
def test_threshold_equals_dino_and_keeps_the_smallest_set_holding_the_mass(mass):
    g = torch.Generator().manual_seed(0)
    maps = torch.rand(3, 5, 6, generator=g) ** 4  # peaked, no ties
    got = am.threshold_attention(maps, mass)
    official = dino_threshold.threshold(maps.reshape(3, -1).clone(), mass, 5, 6, 1)
    assert (got.numpy() == official.astype(bool)).all()
    for m, k in zip(maps.reshape(3, -1), got.reshape(3, -1)):
        p = m.double() / m.double().sum()
        assert p[k].sum() >= mass - 1e-12  # holds the mass ...
        assert p[k].min() >= p[~k].max() if (~k).any() else True  # ... with the largest weights ...
        assert p[k].sum() - p[k].min() < mass  # ... and no fewer patches would


def test_head_masks_of_a_tiny_patch8_crate_equal_the_transcription():
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5).eval()
    x = torch.rand(2, 3, 32, 32)
    maps, masks = am.head_masks(model, x, layer=-1, mass=0.6)
    assert maps.shape == masks.shape == (2, 4, 32, 32) and masks.dtype == torch.bool
    grid = cls_attention(model, x, -1)  # (2, 4, 4, 4)
    for b in range(2):
        official = dino_threshold.threshold(grid[b].reshape(4, -1).clone(), 0.6, 4, 4, 8)
        assert (masks[b].numpy() == official.astype(bool)).all()
        assert torch.equal(maps[b], grid[b].repeat_interleave(8, -2).repeat_interleave(8, -1))
    fig = am.plot_head_masks(x[0], maps[0], masks[0], title="tiny")
    assert len(fig.axes) == 4 and [a.get_title() for a in fig.axes] == [f"head {k}" for k in range(4)]


def test_head_masks_bad_input():
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)
    with pytest.raises(ValueError, match="multiples of the patch size 8"):
        am.head_masks(model, torch.rand(1, 3, 30, 32))
    with pytest.raises(ValueError, match="mass"):
        am.threshold_attention(torch.rand(2, 4, 4), 0.0)
    with pytest.raises(ValueError, match="disagree"):
        am.plot_head_masks(torch.rand(3, 8, 8), torch.rand(2, 8, 8), torch.zeros(2, 4, 4, dtype=torch.bool))
    assert np.isfinite(am.threshold_attention(torch.zeros(1, 2, 2), 0.5).numpy()).all()
