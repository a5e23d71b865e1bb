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


@pytest.fixture
def small_source(tmp_path, monkeypatch):
    """The ``digit-scenes`` source with 24 training and 10 test scenes, cached under ``tmp_path``."""
    monkeypatch.setenv("CRATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(digit_scenes, "SPLITS", {"train": (24, 0, "train"), "test": (10, 1, "test")})
    return tmp_path / "cache" / "digit-scenes"


def test_the_source_labels_each_scene_by_its_largest_digit(small_source):
    from crate_transformer.data import open_source

    train, test = open_source("digit-scenes", "train"), open_source("Digit-Scenes", "test")
    assert (len(train), len(test)) == (24, 10) and train.images.shape[1:] == (3, 64, 64) and train.num_classes == 10
    for ds, split in ((train, "train"), (test, "test")):
        folder = digit_scenes.scenes_folder(split)
        assert folder.parent == small_source
        gt = read_coco(folder / "instances.json", folder / "images")  # class-agnostic: the digits are in the file
        digit = {
            a["id"]: a["category_id"] - 1 for a in json.loads((folder / "instances.json").read_text())["annotations"]
        }
        for k, i in enumerate(gt.image_ids):
            anns = gt.annotations(i)
            areas = [mask_api.decode(a["segmentation"]).sum() for a in anns]  # independent of the stored area
            assert ds.labels[k] == digit[anns[int(np.argmax(areas))]["id"]]
            pixels = np.asarray(Image.open(gt.files[i]).convert("RGB")).transpose(2, 0, 1)
            assert np.array_equal(ds.images[k].numpy(), pixels)
    assert train.mean == test.mean and abs(train.mean[0] - train.images.float().mean().item() / 255) < 0.01
    val = open_source("digit-scenes", "val", val_fraction=0.25)
    rest = open_source("digit-scenes", "train", val_fraction=0.25)
    assert len(val) + len(rest) == 24 and len(val) >= 4


def test_the_source_is_written_once_and_test_scenes_use_held_out_digits(small_source):
    folder = digit_scenes.scenes_folder("test")
    stamp = (folder / "instances.json").stat().st_mtime_ns
    assert digit_scenes.scenes_folder("test") == folder and (folder / "instances.json").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in small_source.iterdir()) == [folder.name]  # no temporary folder left behind
    a, _ = digit_scenes._digit_pool("train")
    b, _ = digit_scenes._digit_pool("test")
    assert (len(a), len(b)) == (4000, 1000)
    every, _ = digit_scenes._digit_pool("all")
    assert np.array_equal(b, every[4::5]) and np.array_equal(a[:4], every[:4])
    with pytest.raises(ValueError, match="splits"):
        digit_scenes.scenes_folder("val")
    with pytest.raises(ValueError, match="digit pool"):
        digit_scenes.write_digit_scenes(small_source / "x", n=1, pool="some")


def test_largest_labels_takes_the_first_on_a_tie():
    anns = [dict(image_id=1, area=5, category_id=3), dict(image_id=1, area=5, category_id=8),
            dict(image_id=2, area=1, category_id=1), dict(image_id=2, area=9, category_id=10)]  # fmt: skip
    assert digit_scenes.largest_labels({"annotations": anns}) == {1: 2, 2: 9}


def test_segment_eval_reads_the_source_test_scenes(small_source, tmp_path, capsys):
    import torch
    from clitools import crate, one_line_error

    import crate_transformer as ct
    from crate_transformer.analysis import evaluate_segmentation

    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=10)
    model.save_pretrained(tmp_path / "saved")
    out = tmp_path / "ev"
    assert crate("segment-eval", tmp_path / "saved", "--data", "digit-scenes", "--out", out, "--threads", 1) == 0
    assert "10 images (0 without annotations)" in capsys.readouterr().out
    folder = digit_scenes.scenes_folder("test")
    direct = evaluate_segmentation(model, read_coco(folder / "instances.json", folder / "images"), "maskcut")
    assert json.loads((out / "segment_eval_maskcut.json").read_text())["coco"] == direct["coco"]
    one_line_error(capsys, "segment-eval", tmp_path / "saved", "--data", "digit-scenes", "--images", tmp_path,
                   match="brings its own images")  # fmt: skip
