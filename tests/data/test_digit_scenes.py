"""Digit scenes: deterministic canvases whose COCO masks are exactly the pasted digits' strokes."""

import hashlib
import json

import numpy as np
import pytest
from PIL import Image

from crate_transformer.analysis import read_coco
from crate_transformer.data import digit_scenes

pytest.importorskip("pycocotools")
from pycocotools import mask as mask_api  # noqa: E402


def digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_arguments_write_the_same_files_and_another_seed_does_not(tmp_path):
    a = digit_scenes.write_digit_scenes(tmp_path / "a", n=6, size=64, seed=3)
    b = digit_scenes.write_digit_scenes(tmp_path / "b", n=6, size=64, seed=3)
    c = digit_scenes.write_digit_scenes(tmp_path / "c", n=6, size=64, seed=4)
    assert digest(a.parent) == digest(b.parent) != digest(c.parent)


def test_masks_are_exact_and_read_back_through_coco(tmp_path):
    path = digit_scenes.write_digit_scenes(tmp_path, n=12, size=80, seed=0)
    raw = json.loads(path.read_text())
    gt = read_coco(path, tmp_path / "images")
    assert len(gt.image_ids) == 12 and gt.unannotated == []
    per_image = [len(gt.annotations(i)) for i in gt.image_ids]
    assert 1 <= min(per_image) and max(per_image) <= 3 and sum(per_image) > 12  # some scenes hold several digits
    for a_raw, a in zip(raw["annotations"], gt.dataset["annotations"]):
        m = mask_api.decode(a["segmentation"]).astype(bool)
        assert m.sum() == a_raw["area"] and 1 <= a_raw["category_id"] <= 10
        ys, xs = np.nonzero(m)
        assert a_raw["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
    for i in gt.image_ids:
        masks = gt.masks(i)
        assert not (masks.sum(0) > 1).any()  # instances never overlap
        img = np.asarray(Image.open(gt.files[i]), dtype=np.float64) / 255
        fg = masks.any(0)
        # a stroke pixel is (1 - a)·clutter + a·colour with a >= 0.5 and colour >= 0.75: at least 0.375 everywhere
        assert img[fg].min() >= 0.375 - 1 / 255 and img[fg].mean() > img[~fg].mean() + 0.2


def test_a_bar_digit_keeps_its_shape_in_the_mask():
    """digit_scene's mask is the resized digit's a >= 0.5: a bar digit gives a solid, tall, thin rectangle."""
    digits = np.zeros((1, 28, 28), np.uint8)
    digits[0, 6:22, 12:16] = 255  # a "1": a bar
    rng = np.random.default_rng(5)
    img, objects = digit_scenes.digit_scene(rng, digits, np.array([1]), size=64, max_digits=1)
    ((label, mask),) = objects
    assert label == 1 and img.shape == (64, 64, 3) and img.dtype == np.uint8
    ys, xs = np.nonzero(mask)
    side_h, side_w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    assert side_h > 2 * side_w  # the bar stays a bar, tall and thin
    assert mask.sum() == side_h * side_w  # the bilinear-resized bar thresholded at 0.5 is a solid rectangle


def test_bad_arguments_name_the_option(tmp_path):
    with pytest.raises(ValueError, match="max_digits"):
        digit_scenes.write_digit_scenes(tmp_path, n=2, max_digits=4)
    with pytest.raises(ValueError, match="size"):
        digit_scenes.write_digit_scenes(tmp_path, n=2, size=8)
