"""Tensor transforms on image batches: normalisation, channel conversion, resizing and augmentation.

Augmentations are batched kornia modules that run on the training device, after decoding and before
:func:`normalize` (JMLR App. C.1: random resized crop + flip for pre-training, RandAugment(2, 14) for
fine-tuning).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models.spec import fit_normalization  # noqa: F401  (re-exported)

BUILTIN_DATASETS = ("mnist", "digits")
AUGMENTATIONS = ("none", "translate", "crop-flip", "randaugment")


# --------------------------------------------------------------------------- tensor helpers
def normalize(x: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(x − mean) / std`` per channel for a float batch ``(b, C, H, W)`` or image ``(C, H, W)``."""
    if len(mean) != x.shape[-3] or len(std) != x.shape[-3]:
        raise ValueError(f"normalisation has {len(mean)} channel(s) but the images have {x.shape[-3]}")
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        m, s = (torch.as_tensor(v, dtype=x.dtype, device=x.device).view(-1, 1, 1) for v in (mean, std))
    else:
        m, s = _channel_stats(tuple(map(float, mean)), tuple(map(float, std)), x.device, x.dtype)
    return (x - m) / s


@functools.lru_cache(maxsize=32)
def _channel_stats(
    mean: tuple[float, ...], std: tuple[float, ...], device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """Mean and std as ``(C, 1, 1)`` tensors on ``device``, made once: a copy to a GPU per batch waits for it."""
    return tuple(torch.tensor(v, dtype=dtype).view(-1, 1, 1).to(device) for v in (mean, std))


def to_device(t: Tensor, device: torch.device | str) -> Tensor:
    """A batch from host memory on ``device`` without waiting: to a GPU through page-locked (pinned) memory, from
    which the copy runs asynchronously, behind the computation (a copy from ordinary memory makes the host wait for
    it, and for what the device was doing)."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu" and not t.is_pinned():
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def match_channels(x: Tensor, channels: int) -> Tensor:
    """Convert a ``(…, C, H, W)`` batch to ``channels`` channels (grey → RGB by repetition, RGB → grey by luma)."""
    c = x.shape[-3]
    if c == channels:
        return x
    if c == 1:
        return x.expand(*x.shape[:-3], channels, *x.shape[-2:]).contiguous()
    if c == 3 and channels == 1:
        r, g, b = x.float().unbind(-3)
        grey = (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(-3)  # luma, with no tensor copied to the device
        return grey.round().clamp(0, 255).to(torch.uint8) if x.dtype == torch.uint8 else grey.to(x.dtype)
    raise ValueError(f"cannot convert {c}-channel images to {channels} channels; use 1- or 3-channel data")


def resize_tensor(images: Tensor, size: int) -> Tensor:
    """Antialiased bilinear resize of a uint8 ``N×C×H×W`` tensor to ``size × size`` (in chunks)."""
    if images.shape[-2:] == (size, size):
        return images
    out = []
    for chunk in images.split(4096):
        y = F.interpolate(chunk.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(y.round().clamp(0, 255).to(torch.uint8))
    return torch.cat(out)


# --------------------------------------------------------------------------- augmentation
def default_augmentation(dataset_name: str, finetune: bool = False) -> str:
    """The recipe's default: ±2-pixel translations for digits, RandomResizedCrop + flip otherwise
    (JMLR App. C.1), plus RandAugment(2, 14) when fine-tuning (C.1, transfer)."""
    if dataset_name in BUILTIN_DATASETS:
        return "translate"
    return "randaugment" if finetune else "crop-flip"


def build_augmentation(
    kind: str,
    image_size: int,
    *,
    translate: int = 2,
    crop_scale: tuple[float, float] = (0.08, 1.0),
    hflip: bool = True,
    randaugment_n: int = 2,
    randaugment_m: int = 14,
) -> nn.Module:
    """A batched augmentation for float images in [0, 1] (apply *before* :func:`normalize`), drawn and applied on
    the batch's device (:mod:`.augment`; RandAugment: kornia's).

    * ``none`` — identity.
    * ``translate`` — random integer shifts of up to ``translate`` pixels with zero fill (``RandomCrop(size,
      padding=translate)``) at the images' own size (before any resizing to ``image_size``); the digits recipe (no
      flips: they would change digit identity).
    * ``crop-flip`` — ``RandomResizedCrop(image_size, scale=crop_scale)`` + horizontal flip, the paper's
      pre-training augmentation (JMLR App. C.1).
    * ``randaugment`` — ``crop-flip`` then kornia's ``RandAugment(n, m)`` (n=2, m=14 as in the official
      fine-tuning script).  The one augmentation that reads values back from the device (kornia's ops do).
    """
    from .augment import RandomResizedCropFlip, RandomShift

    if kind not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {kind!r}; choose one of {AUGMENTATIONS}")
    if kind == "none":
        return nn.Identity()
    if kind == "translate":
        return RandomShift(translate) if translate else nn.Identity()
    crop = RandomResizedCropFlip(image_size, scale=crop_scale, flip=0.5 if hflip else 0.0)
    if kind == "randaugment":
        from kornia.augmentation.auto import RandAugment

        return nn.Sequential(crop, AsRGB(RandAugment(n=randaugment_n, m=randaugment_m)))
    return crop


class AsRGB(nn.Module):
    """Run an RGB-only augmentation (RandAugment's colour ops) on greyscale batches via 3 identical channels."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] != 1:
            return self.inner(x)
        return self.inner(x.expand(-1, 3, -1, -1).contiguous()).mean(dim=1, keepdim=True)
