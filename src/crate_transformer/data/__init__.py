"""Image data for training and analysis: sources, the batching contract, transforms, and the data
description saved with a model.

::

    from crate_transformer.data import Position, load_dataset, build_augmentation, normalize
    train = load_dataset("mnist", "train")                           # 4,000 digits, in memory
    for images, labels in train.batches(128, at=Position(epoch=0)):  # uint8 (b, C, H, W), int64 (b,)
        x = normalize(aug(images.float() / 255), train.mean, train.std)

* :mod:`.base` — :class:`ImageSource` (the engine's contract), :class:`Position` and the epoch order.
* :mod:`.memory` — the built-in digits, CIFAR folders and image folders held in memory.
* :mod:`.streaming` — image folders decoded per batch in DataLoader workers (data that does not fit).
* :mod:`.shards` — WebDataset ``.tar`` shards; :mod:`.hf` — Hugging Face datasets saved to disk.
* :mod:`.sources` — :func:`open_source`, the one resolver of ``--data`` every command uses.
* :mod:`.transforms` — normalisation, channel conversion and kornia augmentation.
* :mod:`.spec` — :class:`DataSpec`, what a model records about its training data.
"""

from ..models.spec import DataSpec, fit_normalization, resolve_normalization
from .base import ImageSource, Position, epoch_permutation, global_batches, rank_slice
from .memory import (
    IMAGE_EXTENSIONS,
    SPLITS,
    ImageDataset,
    canonical_source,
    image_transform,
    list_image_folder,
    load_dataset,
    load_image_folder,
    resolve_source,
)
from .sources import DATA_MODES, STREAM_ABOVE, open_source
from .streaming import StreamingImageFolder
from .transforms import (
    AUGMENTATIONS,
    BUILTIN_DATASETS,
    build_augmentation,
    default_augmentation,
    match_channels,
    normalize,
    to_device,
)

__all__ = [
    "to_device",
    "BUILTIN_DATASETS",
    "SPLITS",
    "AUGMENTATIONS",
    "IMAGE_EXTENSIONS",
    "ImageSource",
    "Position",
    "ImageDataset",
    "DataSpec",
    "epoch_permutation",
    "global_batches",
    "rank_slice",
    "load_dataset",
    "open_source",
    "list_image_folder",
    "StreamingImageFolder",
    "WebDatasetShards",
    "HFImageDataset",
    "DATA_MODES",
    "STREAM_ABOVE",
    "resolve_source",
    "canonical_source",
    "load_image_folder",
    "image_transform",
    "normalize",
    "fit_normalization",
    "resolve_normalization",
    "match_channels",
    "build_augmentation",
    "default_augmentation",
]


def __getattr__(name: str) -> object:
    # the shard and HF readers import webdataset / datasets: load them only when asked for
    if name == "WebDatasetShards":
        from .shards import WebDatasetShards

        return WebDatasetShards
    if name == "HFImageDataset":
        from .hf import HFImageDataset

        return HFImageDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
