"""The one resolver every command uses: ``--data`` (+ ``--data-mode``, ``--workers``) → an :class:`ImageSource`.

=========================================  ==========================================================
``--data``                                 source
=========================================  ==========================================================
``mnist``, ``digits``, a CIFAR folder      :class:`.memory.ImageDataset` (always in memory)
``digit-scenes``                           the same, of :mod:`.digit_scenes` (64 px scenes of 1-3 digits,
                                           labelled by the largest; written once into a cache folder)
an image folder (one subfolder per class)  in memory, or :class:`.streaming.StreamingImageFolder` with
                                           ``mode="stream"`` (``"auto"``: above :data:`STREAM_ABOVE` images)
a folder / glob of WebDataset ``.tar``     :class:`.shards.WebDatasetShards` (always streamed)
a ``save_to_disk`` folder (datasets)       :class:`.hf.HFImageDataset` (always streamed)
=========================================  ==========================================================

:func:`.memory.resolve_source` decides the kind; the split rules (own train/test splits, else every
fifth sample of each class; a stratified, seeded val split) are the in-memory loader's, for every kind.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..errors import OptionError
from .base import ImageSource
from .digit_scenes import NAME as DIGIT_SCENES
from .memory import check_load_args, list_image_folder, load_dataset, resolve_source
from .streaming import NUM_WORKERS

__all__ = ["DATA_MODES", "STREAM_ABOVE", "open_source"]

DATA_MODES = ("auto", "memory", "stream")
STREAM_ABOVE = 20_000  # images; an image folder larger than this streams under mode="auto"


def _check_open_args(
    split: str, mode: str, val_fraction: float, on_bad_image: str, image_size: int | None, num_workers: int
) -> None:
    """:func:`open_source`'s arguments that do not depend on the source, each a one-line error."""
    if mode not in DATA_MODES:
        raise OptionError(f"unknown data mode {mode!r}; choose one of {DATA_MODES} (data_mode)", option="data_mode")
    check_load_args(split, val_fraction, on_bad_image, image_size)
    if not NUM_WORKERS.ok(num_workers):
        raise OptionError(f"num_workers{NUM_WORKERS.requirement(num_workers)} (workers)", option="workers")


def open_source(
    name_or_path: str | os.PathLike,
    split: str = "train",
    *,
    image_size: int | None = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    on_bad_image: str = "skip",
    mode: str = "auto",
    num_workers: int = -1,
    stats: tuple[Sequence[float], Sequence[float]] | None = None,
    image_column: str = "",
    label_column: str = "",
) -> ImageSource:
    """Open ``split`` (train | val | test) of a built-in dataset, CIFAR folder, image folder, shards or HF dataset.

    ``image_size``: the side images of files are decoded to (image folders, shards, HF datasets; required
    when streaming); built-in and CIFAR tensors keep their native size (the engine resizes each batch).
    ``mode``: ``"memory"`` | ``"stream"`` | ``"auto"`` for image folders (see the module docstring).
    ``num_workers``: DataLoader worker processes for streamed sources (-1: :func:`~.streaming.resolve_workers`).
    ``stats``: a known ``(mean, std)`` (a model's, when evaluating): streamed sources then skip estimating it.
    ``image_column`` / ``label_column``: a Hugging Face dataset's columns, where they are not found automatically.
    Bad input is a one-line ValueError naming the problem and the fix.
    """
    _check_open_args(split, mode, val_fraction, on_bad_image, image_size, num_workers)
    if os.fspath(name_or_path).lower() == DIGIT_SCENES:
        from .digit_scenes import load_digit_scenes

        return load_digit_scenes(split, val_fraction=val_fraction, seed=seed)
    kind, source = resolve_source(name_or_path)
    if (image_column or label_column) and kind != "hf":
        option = "image_column" if image_column else "label_column"
        message = f"{option} names a Hugging Face dataset's column and {name_or_path} is not one; drop it"
        raise OptionError(message, option=option)
    common = dict(val_fraction=val_fraction, seed=seed, on_bad_image=on_bad_image)
    streamed = dict(image_size=image_size, num_workers=num_workers, stats=stats, **common)
    if kind in ("shards", "hf"):
        if mode == "memory":
            what = "WebDataset shards" if kind == "shards" else "a Hugging Face dataset"
            raise OptionError(f"{name_or_path} is {what}, which is always streamed; pass data_mode='stream'")
        if image_size is None:
            raise OptionError(f"{name_or_path} is streamed: pass image_size to resize its images", option="image_size")
        if kind == "shards":
            from .shards import WebDatasetShards

            return WebDatasetShards(source, split, **streamed)
        from .hf import HFImageDataset

        return HFImageDataset(source, split, **streamed, image_column=image_column, label_column=label_column)
    if kind == "folder" and mode != "memory":
        listing = list_image_folder(source)
        if mode == "stream" or len(listing.train) + len(listing.test) > STREAM_ABOVE:
            from .streaming import StreamingImageFolder

            if image_size is None:
                raise OptionError(
                    f"streaming {name_or_path} needs image_size to resize its images", option="image_size"
                )
            return StreamingImageFolder.open(source, split, listing=listing, **streamed)
    return load_dataset(source, split, image_size=image_size if kind == "folder" else None, **common)
