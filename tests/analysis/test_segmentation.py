"""Normalized cut, MaskCut (Alg. 1 with the polarity fix) and PCA colouring on planted regions."""

import numpy as np
import pytest
import torch

import crate_transformer as ct
from crate_transformer import analysis


def planted(h=16, w=16, D=32, sigma=0.6, seed=0):
    """Patch features on an h×w grid: background + a rectangle + a disc, each around its own prototype.

    The prototypes are orthogonal with norm √D (noise of std ``sigma`` per coordinate on top).
    """
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[:h, :w]
    rect = (yy >= 3) & (yy < 8) & (xx >= 2) & (xx < 9)
    disc = (yy - 11) ** 2 + (xx - 11) ** 2 <= 9
    label = np.zeros((h, w), int)
    label[rect], label[disc] = 1, 2
    protos = np.linalg.qr(g.standard_normal((D, 3)))[0].T * np.sqrt(D)
    feats = protos[label.ravel()] + sigma * g.standard_normal((h * w, D))
    return feats, rect, disc


def best_iou(masks, truth):
    return max((analysis.iou(m, truth) for m in masks), default=0.0)


@pytest.mark.parametrize("sigma,seed,tau", [(0.3, 0, 0.15), (0.6, 1, 0.15), (1.0, 2, 0.15), (1.0, 3, None)])
def test_maskcut_recovers_planted_objects_not_the_background(sigma, seed, tau):
    feats, rect, disc = planted(sigma=sigma, seed=seed)
    masks = analysis.maskcut(feats, (16, 16), n_masks=2, tau=tau)
    assert masks.shape[0] == 2 and masks.dtype == bool
    assert best_iou(masks, rect) >= 0.9 and best_iou(masks, disc) >= 0.9
    assert not (masks[0] & masks[1]).any()  # segmented patches are removed before the next cut


def test_alg1_as_printed_keeps_the_region_and_finds_nothing_new():
    """JMLR Alg. 1 as printed: with M ← M ⊙ mask the second cut splits the first object again (the slip)."""
    feats, rect, disc = planted(sigma=0.3)
    masks = analysis.maskcut(feats, (16, 16), n_masks=2)
    first = masks[0].ravel()
    W = analysis.cosine_affinity(feats)
    kept = W[np.ix_(first, first)]  # the printed polarity: only the found region survives
    part, _ = analysis.normalized_cut(kept)
    second = np.zeros(256, bool)
    second[np.flatnonzero(first)[part]] = True
    assert max(analysis.iou(second.reshape(16, 16), t) for t in (rect, disc)) < 0.9  # a fragment of object 1
    assert analysis.iou(masks[1], disc if analysis.iou(masks[0], rect) > 0.9 else rect) >= 0.9


def test_normalized_cut_bipartition_and_seed_side():
    feats, rect, _ = planted(sigma=0.3)
    two = np.where(rect.ravel()[:, None], feats[rect.ravel()][:1], feats[~rect.ravel()][:1])  # two clean groups
    two = two + 0.05 * np.random.default_rng(0).standard_normal(two.shape)
    part, y = analysis.normalized_cut(analysis.cosine_affinity(two))
    truth = rect.ravel()
    assert analysis.iou(part, truth) == 1.0 or analysis.iou(~part, truth) == 1.0
    assert part[np.argmax(np.abs(y - y.mean()))]  # the side holding the peak is returned as True
    with pytest.raises(ValueError, match="square"):
        analysis.normalized_cut(np.ones((3, 4)))
    with pytest.raises(ValueError, match="zero degree"):
        analysis.normalized_cut(np.zeros((3, 3)))


def striped_image(G=12, P=8, seed=0):
    """An RGB image with horizontal stripes and two planted regions of other textures (patch-aligned)."""
    S = G * P
    yy, xx = np.mgrid[:S, :S]
    img = np.repeat((0.5 + 0.4 * np.sin(yy * np.pi / 2))[None], 3, 0)
    a = np.zeros((G, G), bool)
    a[3:8, 2:7] = True
    b = np.zeros((G, G), bool)
    b[7:11, 8:11] = True
    A, B = (np.kron(m, np.ones((P, P))).astype(bool) for m in (a, b))
    img[:, A] = (0.5 + 0.4 * np.sin(xx * np.pi / 2))[A]
    img[0, B], img[1, B], img[2, B] = ((xx + yy) % 4 < 2)[B], 0.2, 0.8
    img += 0.05 * np.random.default_rng(seed).standard_normal(img.shape)
    return torch.tensor(img, dtype=torch.float32)[None], a, b


def test_segment_synthetic_image_through_the_model():
    """End to end: qkv patch features of a CRATE (no position embedding) on an image with planted regions."""
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=96, patch_size=8, dim=48, depth=2, heads=4, num_classes=3)
    with torch.no_grad():
        model.pos_embed.zero_()
    x, a, b = striped_image()
    masks = analysis.segment(model, x, layer=0, n_masks=2)[0]
    assert best_iou(masks, a) >= 0.9 and best_iou(masks, b) >= 0.9
    feats = analysis.patch_features(model, x, layer=0)
    assert feats.shape == (1, 144, 48)


def test_pca_rgb_colours_planted_regions_apart():
    feats, rect, disc = planted(sigma=0.2)
    rgb, ratio = analysis.pca_rgb(torch.tensor(feats)[None], (16, 16))
    assert rgb.shape == (1, 16, 16, 3) and rgb.min() >= 0 and rgb.max() <= 1
    assert ratio[0] > 0.2 and ratio.sum() <= 1 + 1e-9
    bg = ~(rect | disc)
    means = [rgb[0][m].mean(0) for m in (bg, rect, disc)]
    spread = max(rgb[0][m].std(0).max() for m in (bg, rect, disc))
    gaps = [np.abs(means[i] - means[j]).max() for i, j in ((0, 1), (0, 2), (1, 2))]
    assert min(gaps) > 3 * spread  # the three regions get clearly different colours
    with pytest.raises(ValueError, match="grid"):
        analysis.pca_rgb(torch.tensor(feats)[None], (8, 8))


def test_mask_png_and_iou(tmp_path):
    from PIL import Image

    m = np.zeros((2, 4, 4), bool)
    m[0, :2, :2] = True
    m[1, 3, 3] = True
    analysis.save_mask_png(m, (8, 8), tmp_path / "m.png")
    label = np.array(Image.open(tmp_path / "m.png"))
    assert label.shape == (8, 8) and (label[:4, :4] == 1).all() and (label[6:, 6:] == 2).all()
    assert (label == 0).sum() == 64 - 16 - 4
    assert analysis.iou(m[0], m[0]) == 1.0 and analysis.iou(m[0], m[1]) == 0.0
    with pytest.raises(ValueError, match="shapes differ"):
        analysis.iou(m[0], np.zeros((3, 3)))
