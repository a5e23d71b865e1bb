"""A Hugging Face ``datasets`` dataset saved with ``save_to_disk``, decoded per batch in DataLoader workers.

::

    ds.save_to_disk("/data/beans")          # a Dataset or a DatasetDict, once, anywhere
    train = HFImageDataset("/data/beans", "train", image_size=224)

Read offline with ``datasets.load_from_disk`` (memory-mapped Arrow files: nothing is downloaded and
only the rows of a batch are read).  Columns are found automatically: the image column is the one with
the ``Image`` feature (else one named ``image``/``img``/``pixel_values`` holding encoded bytes); the
label column the one with a ``ClassLabel`` feature (its names are the classes), else one named
``label``/``labels``/``target``/``cls``/``fine_label`` of integers (classes ``0..max``).  ``image_column`` /
``label_column`` (``--image-column`` / ``--label-column``) name them instead.

Splits: a ``DatasetDict``'s ``train`` and ``test`` (or ``validation``/``val``) splits; a single dataset (or
data file: ``x.parquet``) holds out every fifth row of each class as the test split, as image folders do,
and ``val_fraction`` carves the same stratified val split out of the rest.  Batching, resume, DDP sharding,
statistics and unreadable images work as for
:class:`~crate_transformer.data.streaming.StreamingImageFolder` (it shares their code).  Needs the optional
extra: ``pip install crate-transformer[hf]``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from ..errors import OptionError, short_repr
from .base import class_count
from .hub import require_datasets
from .memory import HF_MARKERS, holdout_every_fifth, split_members
from .streaming import MapStreamSource, check_stream_args

__all__ = ["HFImageDataset", "IMAGE_COLUMNS", "LABEL_COLUMNS"]

IMAGE_COLUMNS = ("image", "img", "pixel_values")
LABEL_COLUMNS = ("label", "labels", "target", "cls", "fine_label")


def _columns(ds: object, where: str, image: str = "", label: str = "") -> tuple[str, str, list[str] | None]:
    """(image column, label column, ClassLabel names or None) of a ``datasets.Dataset``; ``image`` / ``label``
    name them where the automatic choice (module docstring) does not find them."""
    datasets = require_datasets()
    feats = ds.features
    for given, option in ((image, "image_column"), (label, "label_column")):
        if given and given not in feats:
            raise OptionError(f"{where} has no column {given!r} (columns: {list(feats)}); fix {option}", option=option)
    image = image or next((c for c, f in feats.items() if isinstance(f, datasets.Image)), None)
    image = image or next((c for c in IMAGE_COLUMNS if c in feats), None)
    if image is None:
        raise OptionError(
            f"{where} has no image column (columns: {list(feats)}); name it with image_column", option="image_column"
        )
    label = label or next((c for c, f in feats.items() if isinstance(f, datasets.ClassLabel)), None)
    label = label or next((c for c in LABEL_COLUMNS if c in feats), None)
    if label is None:
        raise OptionError(
            f"{where} has no label column (columns: {list(feats)}); name it with label_column (a ClassLabel or "
            "integer column)",
            option="label_column",
        )
    twice = [c for c in (image, label) if f"{c}.1" in feats]  # pandas renames a repeated CSV column
    if twice:
        raise ValueError(
            f"{where} names the column {twice[0]!r} twice (the second read as '{twice[0]}.1'); give every column "
            "its own name"
        )
    _check_kinds(feats, image, label, where)
    names = list(feats[label].names) if isinstance(feats[label], datasets.ClassLabel) else None
    return image, label, names


def _holds_images(feature: object) -> bool:
    """Whether a column's feature can hold images: an ``Image``, encoded bytes, file paths, {bytes, path}."""
    datasets = require_datasets()
    if isinstance(feature, dict):
        return "bytes" in feature or "path" in feature
    return isinstance(feature, datasets.Image) or (
        isinstance(feature, datasets.Value) and feature.dtype in ("binary", "large_binary", "string", "large_string")
    )


def _check_kinds(feats: dict, image: str, label: str, where: str) -> None:
    """The image column holds images and the label column class labels (not images, not lists)."""
    datasets = require_datasets()
    columns = f"columns: {', '.join(f'{c} ({_kind(f)})' for c, f in feats.items())}"
    f = feats[label]
    numeric = isinstance(f, datasets.Value) and (f.dtype.startswith(("int", "uint", "float")) or "string" in f.dtype)
    if not (isinstance(f, datasets.ClassLabel) or numeric):
        raise OptionError(
            f"{where}: column {label!r} holds {_kind(f)}, not class labels; name the label column with label_column "
            f"(a ClassLabel or integer column; {columns})",
            option="label_column",
        )
    if not _holds_images(feats[image]):
        raise OptionError(
            f"{where}: column {image!r} holds {_kind(feats[image])}, not images (an Image feature, encoded bytes or "
            f"file paths); name the image column with image_column ({columns})",
            option="image_column",
        )
    if image == label:
        raise ValueError(f"{where}: {image!r} cannot be both the image and the label column; name the other one")


def _kind(feature: object) -> str:
    """A column's feature in a few words: ``int64``, ``images``, ``ClassLabel``, ``a list``, ``a struct``."""
    datasets = require_datasets()
    if _holds_images(feature) and not isinstance(feature, datasets.Value):
        return "images"
    if isinstance(feature, datasets.Value):
        return feature.dtype
    if isinstance(feature, dict):
        return "a struct"
    return type(feature).__name__ if not isinstance(feature, (list, datasets.Sequence)) else "a list"


def _int_labels(values: Sequence[object], where: str, column: str) -> list[int]:
    """The class indices of a label column; a missing or non-integer label is refused, naming its row."""
    out = []
    for i, y in enumerate(values):
        if isinstance(y, bool) or not (isinstance(y, int) or (isinstance(y, float) and y.is_integer())):
            fix = (
                f"fill in or drop the rows without one (ds.filter(lambda r: r[{column!r}] is not None))"
                if y is None
                else f"encode the names as classes: ds = ds.class_encode_column({column!r}), then save_to_disk again"
            )
            raise ValueError(f"row {i} of {where}: {column!r} is {short_repr(y)}, not a class index; {fix}")
        out.append(int(y))
    return out


def _open(path: str | os.PathLike) -> tuple[str, object]:
    """(name, ``Dataset``/``DatasetDict``) of a ``save_to_disk`` folder, local data files or a dataset id."""
    local = Path(path).expanduser()
    if any((local / m).is_file() for m in HF_MARKERS):
        return str(local.resolve()), require_datasets().load_from_disk(str(local.resolve()))
    from .hub import load_hub_dataset

    return (str(local.resolve()) if local.exists() else os.fspath(path)), load_hub_dataset(os.fspath(path))


def _splits(loaded: object, root: str) -> tuple[object, object | None]:
    """(training pool, test split or None) of a ``Dataset`` / ``DatasetDict``: its ``train`` and ``test`` (else
    ``validation`` / ``val``) splits; a dataset or dict with a ``train`` split only (one data file) has no test
    split of its own, so every fifth row of each class is held out."""
    if not isinstance(loaded, require_datasets().DatasetDict):
        return loaded, None
    if "train" not in loaded:
        if len(loaded) == 1:
            return next(iter(loaded.values())), None
        raise ValueError(
            f"{root} has the splits {list(loaded)} and no 'train' split; name the training split 'train' (data files "
            "train.parquet and test.parquet, or folders train/ and test/, name their splits)"
        )
    test_key = next((k for k in ("test", "validation", "val") if k in loaded), None)
    return loaded["train"], None if test_key is None else loaded[test_key]


class HFImageDataset(MapStreamSource):
    """One split of a ``save_to_disk`` dataset as an :class:`ImageSource` (see the module docstring)."""

    kind = "hf"

    def __init__(
        self,
        path: str | os.PathLike,
        split: str = "train",
        *,
        image_size: int,
        val_fraction: float = 0.0,
        seed: int = 0,
        on_bad_image: str = "skip",
        num_workers: int = -1,
        stats: tuple[Sequence[float], Sequence[float]] | None = None,
        image_column: str = "",
        label_column: str = "",
    ) -> None:
        check_stream_args("a Hugging Face dataset", split, val_fraction, on_bad_image, image_size)
        datasets = require_datasets()
        root, loaded = _open(path)
        pool_ds, test_ds = _splits(loaded, root)
        image_col, label_col, names = _columns(pool_ds, root, image_column, label_column)
        parts = {"train": pool_ds} if test_ds is None else {"train": pool_ds, "test": test_ds}
        part_y = {k: _int_labels(d[label_col], f"the {k} split of {root}", label_col) for k, d in parts.items()}
        pool_rows = [("train", i) for i in range(len(part_y["train"]))]
        test_rows = [("test", i) for i in range(len(part_y.get("test", [])))]
        if test_ds is None:  # no test split of its own: every fifth row of each class, as for image folders
            flags = holdout_every_fifth(part_y["train"])
            test_rows = [r for r, t in zip(pool_rows, flags) if t]
            pool_rows = [r for r, t in zip(pool_rows, flags) if not t]
        all_y = [y for ys in part_y.values() for y in ys]
        fix = f"number the classes 0..K-1 (datasets' ds.class_encode_column({label_col!r}) maps any labels to them)"
        self.classes = names or [str(i) for i in range(class_count(all_y, f"the {label_col!r} column of {root}", fix))]
        if any(not 0 <= y < len(self.classes) for y in all_y):
            raise ValueError(f"{root} has labels outside 0..{len(self.classes) - 1}; fix the '{label_col}' column")
        if split == "test":
            self.rows = test_rows
        else:
            pool_y = torch.tensor([part_y[k][i] for k, i in pool_rows], dtype=torch.int64)
            self.rows = [pool_rows[j] for j in split_members(pool_y, split, val_fraction, seed).tolist()]
        if not self.rows:
            raise ValueError(f"the {split} split of {root} is empty; use a larger val_fraction or add rows")
        # raw bytes: a corrupt image then fails in our decoder (under on_bad_image), not inside datasets
        self._parts = {k: d.cast_column(image_col, datasets.Image(decode=False)) for k, d in parts.items()}
        self._image_col = image_col
        self.labels = torch.tensor([part_y[k][i] for k, i in self.rows], dtype=torch.int64)
        self.name, self.split = root, split
        self.image_size, self.on_bad_image, self.num_workers = image_size, on_bad_image, num_workers
        self._finish(lambda j: self._encoded(*pool_rows[j]), len(pool_rows), seed, stats)

    def _encoded(self, part: str, i: int) -> bytes | str:
        cell = self._parts[part][i][self._image_col]
        if isinstance(cell, dict):  # {"bytes": …, "path": …}
            return cell.get("bytes") or cell.get("path")
        return cell

    def raw(self, i: int) -> tuple[object, str]:
        part, j = self.rows[i]
        return self._encoded(part, j), f"row {j} of the {part} split of {self.name}"
