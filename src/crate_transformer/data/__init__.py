"""Image data for training and analysis: sources, the batching contract, transforms, and the data
description saved with a model.

::

    from crate_transformer.data import load_dataset, build_augmentation, normalize
    train = load_dataset("mnist", "train")             # 4,000 digits, in memory
    for images, labels in train.batches(128, epoch=0):  # uint8 (b, C, H, W), int64 (b,)
        x = normalize(aug(images.float() / 255), train.mean, train.std)

* :mod:`.base` — :class:`ImageSource` (the engine's contract) and the epoch order.
* :mod:`.memory` — the built-in digits, CIFAR folders and image folders held in memory.
* :mod:`.transforms` — normalisation, channel conversion and kornia augmentation.
* :mod:`.spec` — :class:`DataSpec`, what a model records about its training data.
"""

from .base import ImageSource, epoch_permutation, global_batches, rank_slice
from .memory import IMAGE_EXTENSIONS, SPLITS, ImageDataset, load_dataset, load_image_folder, resolve_source
from .spec import DataSpec, fit_normalization, resolve_normalization
from .transforms import (
    AUGMENTATIONS,
    BUILTIN_DATASETS,
    build_augmentation,
    default_augmentation,
    match_channels,
    normalize,
)

__all__ = [
    "BUILTIN_DATASETS",
    "SPLITS",
    "AUGMENTATIONS",
    "IMAGE_EXTENSIONS",
    "ImageSource",
    "ImageDataset",
    "DataSpec",
    "epoch_permutation",
    "global_batches",
    "rank_slice",
    "load_dataset",
    "resolve_source",
    "load_image_folder",
    "normalize",
    "fit_normalization",
    "resolve_normalization",
    "match_channels",
    "build_augmentation",
    "default_augmentation",
]
