"""The CIFAR-10/100 python files read into uint8 tensors: a numpy-only unpickler (no code execution) and the
validation of every file, each bad file a one-line error naming it and the fix.

``memory.load_dataset`` calls :func:`cifar_arrays` for a CIFAR folder; nothing else here is public.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .base import class_count

__all__ = ["cifar_arrays"]


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler for the CIFAR python files that refuses anything but numpy arrays (no code execution)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR file")


def _read_cifar_file(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            raw = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except Exception as e:  # truncated, not a pickle, disallowed global
        raise ValueError(f"cannot read CIFAR file {path} ({type(e).__name__}: {e}); re-extract the archive") from None
    if not isinstance(raw, dict):
        raise ValueError(
            f"CIFAR file {path} holds a {type(raw).__name__}, not a dict of arrays; re-extract the archive"
        )
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}


_CIFAR_PIXELS = 3 * 32 * 32


def _cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch → uint8 images (n, 3, 32, 32) and int64 labels (n,), validated.

    A missing ``data``/label entry, a pixel count that is not a whole number of 32×32×3 images,
    pixel values outside 0..255, non-integer labels or a label count that differs from the image
    count is a one-line ValueError naming the file.
    """
    d = _read_cifar_file(path)
    fix = "re-extract the archive (the file is damaged or not part of this CIFAR version)"
    missing = [k for k in ("data", label_key) if k not in d]
    if missing:
        raise ValueError(
            f"CIFAR file {path} has no {' or '.join(repr(k) for k in missing)} entry (found {sorted(map(str, d))}); "
            f"{fix}"
        )
    data = np.asarray(d["data"])
    if data.dtype.kind not in "iu" or data.size % _CIFAR_PIXELS:
        what = f"dtype {data.dtype}" if data.dtype.kind not in "iu" else f"{data.size} values"
        raise ValueError(
            f"CIFAR file {path}: 'data' has {what}, not whole 32x32x3 uint8 images ({_CIFAR_PIXELS} values each); {fix}"
        )
    if data.dtype != np.uint8 and data.size and (data.min() < 0 or data.max() > 255):
        raise ValueError(f"CIFAR file {path}: pixel values outside 0..255; {fix}")
    images = data.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32)
    labels = np.asarray(d[label_key])
    if labels.ndim != 1 or (labels.size and labels.dtype.kind not in "iu"):
        raise ValueError(f"CIFAR file {path}: '{label_key}' is not a flat list of integer labels; {fix}")
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"CIFAR file {path} has {images.shape[0]} images but {labels.shape[0]} labels in '{label_key}'; {fix}"
        )
    return images, labels.astype(np.int64)


def cifar_arrays(root: Path, kind: str) -> tuple[list[str], Tensor, Tensor, Tensor, Tensor]:
    if kind == "cifar10":
        train_files, test_files, meta_file = [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "batches.meta"
        label_key, names_key = "labels", "label_names"
    else:
        train_files, test_files, meta_file = ["train"], ["test"], "meta"
        label_key, names_key = "fine_labels", "fine_label_names"

    def read(files: list[str]) -> list[tuple[Path, np.ndarray, np.ndarray]]:
        out = []
        for f in files:
            if not (root / f).is_file():
                raise ValueError(f"CIFAR folder {root} is missing {f}; re-extract the full archive")
            out.append((root / f, *_cifar_batch(root / f, label_key)))
        return out

    train, test = read(train_files), read(test_files)
    meta_path = root / meta_file
    if meta_path.is_file():
        meta = _read_cifar_file(meta_path)
        names = meta.get(names_key)
        if not names:
            raise ValueError(f"CIFAR meta file {meta_path} has no '{names_key}' list; re-extract the archive")
        classes = [c.decode() if isinstance(c, bytes) else str(c) for c in names]
        source = f"the {len(classes)} class names in {meta_path}"
    else:  # no meta file: the training labels define the classes
        fix = f"add the archive's {meta_file} (the class names) or re-extract the archive"
        n = class_count(np.concatenate([y for _, _, y in train]), f"the training files of {root}", fix)
        classes = [str(i) for i in range(n)]
        source = f"the {n} classes of the training files (no {meta_file} in {root})"
    for path, _, y in train + test:
        if y.size and (int(y.min()) < 0 or int(y.max()) >= len(classes)):
            bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
            raise ValueError(
                f"CIFAR file {path} has label {bad}, outside 0..{len(classes) - 1} ({source}); the file does not "
                "belong to this CIFAR folder — re-extract the archive"
            )

    def cat(parts: list[tuple[Path, np.ndarray, np.ndarray]]) -> tuple[Tensor, Tensor]:
        return torch.from_numpy(np.concatenate([x for _, x, _ in parts])), torch.from_numpy(
            np.concatenate([y for _, _, y in parts])
        )

    train_x, train_y = cat(train)
    test_x, test_y = cat(test)
    return classes, train_x, train_y, test_x, test_y
