"""What every image encoder shares: its config's geometry (:class:`ImageEncoderGeometry`: the patch grid, the head
width and the checks of those sizes) and its input side (:class:`ImageInput`: input checks, timm's data config and
``forward_intermediates``; :func:`bicubic_matrix`, the resizing map of position tables for other image sizes), and
:func:`patchify` / :func:`unpatchify` in the official (p1, p2, c) order (Alg. 6, JMLR p.113).  The CRATE
classifier and ViT (:mod:`.classifier`), CRATE-MAE (:mod:`.mae`) and ToST (:mod:`.tost`) build on them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layers import DIM_HEAD
from ..layers.inference import traced_images
from ..objectives import autocast_on
from .base import take_indices
from .spec import DEFAULT_NORMALIZATION, IMAGENET_MEAN, IMAGENET_STD, DataSpec, fit_normalization

__all__ = ["ImageEncoderGeometry", "ImageInput", "patchify", "unpatchify", "bicubic_matrix"]


def _divisors_hint(n: int) -> str:
    return ", ".join(str(k) for k in range(1, n + 1) if n % k == 0 and k <= 32)


class ImageEncoderGeometry:
    """What every image-encoder config shares (:class:`ModelConfig`, CRATE-MAE's ``MAEConfig``): the head
    width, the patch grid, and the checks of those sizes and of the recorded data description."""

    image_size: int
    patch_size: int
    in_chans: int
    dim: int
    depth: int
    heads: int
    dim_head: int | None
    data: DataSpec | None

    @property
    def head_dim(self) -> int:
        return self.dim_head if self.dim_head is not None else self.dim // self.heads

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    def check_geometry(self, positive: tuple[str, ...] = ()) -> None:
        """One-line ValueErrors for bad sizes (``positive`` names further positive-integer fields)."""
        self.check_positive("image_size", "patch_size", "in_chans", *positive, "dim", "depth", "heads")
        if self.dim_head is not None:
            DIM_HEAD.check("dim_head", self.dim_head)
        if self.dim_head is None and self.dim % self.heads:
            raise ValueError(
                f"dim={self.dim} is not divisible by heads={self.heads}; "
                f"choose heads dividing dim (e.g. {_divisors_hint(self.dim)}) or set dim_head explicitly"
            )
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size={self.image_size} is not divisible by patch_size={self.patch_size}; "
                f"use an image size that is a multiple of {self.patch_size}"
            )

    def check_data(self) -> None:
        """``data`` is None or a :class:`DataSpec` whose normalisation fits ``in_chans``."""
        if self.data is None:
            return
        if not isinstance(self.data, DataSpec):
            raise ValueError(f"data must be a DataSpec, a mapping of its fields or None, got {self.data!r}")
        if self.data.mean and fit_normalization(self.data.mean, self.data.std, self.in_chans) is None:
            raise ValueError(
                f"data normalisation has {len(self.data.mean)} values, which cannot be adapted to "
                f"in_chans={self.in_chans}; record 1 or {self.in_chans} per-channel values"
            )


def patchify(x: Tensor, p: int) -> Tensor:
    """``(b, c, H, W)`` → ``(b, N, p·p·c)``, per-patch flatten in the official (p1, p2, c) order.

    The same order as CRATE's ``Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')`` and as MAE's
    ``patchify`` (``nchpwq->nhwpqc``), so one function serves the classifier and the MAE loss target.
    """
    b, ch, H, W = x.shape
    x = x.reshape(b, ch, H // p, p, W // p, p).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(b, (H // p) * (W // p), p * p * ch)


def unpatchify(x: Tensor, p: int, h: int, w: int) -> Tensor:
    """Inverse of :func:`patchify`: ``(b, h·w, p·p·c)`` → ``(b, c, h·p, w·p)`` for an ``h × w`` patch grid."""
    b, n, pd = x.shape
    c = pd // (p * p)
    return x.reshape(b, h, w, p, p, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, h * p, w * p)


class ImageInput:
    """Input checks, patchify and timm's ``forward_intermediates``, shared by the image models (a module with
    ``config.patch_size``/``in_chans``, ``embed(x)`` → the tokens its ``layers`` take, and ``finish_features``)."""

    # ---------------------------------------------------------------- how to feed it (timm's data config)
    def data_cfg(self) -> dict[str, Any]:
        """timm's data config of this model: ``input_size`` ``(C, H, W)``; ``mean`` / ``std`` — those the model was
        trained with (``config.data``, recorded by training), else those its released weights state (the zoo entry
        it was loaded from), else ImageNet's adapted to the channels; ``normalization`` says which; the
        evaluation crop (``crop_pct``: the share of the shorter side after an aspect-preserving resize,
        ``crop_mode="center"``) and ``interpolation`` of the released weights, else 1.0 and bilinear (how
        :mod:`crate_transformer.data` decodes images for training); ``num_classes``."""
        c, weights = self.config, getattr(self, "_weights_cfg", {})
        grey = fit_normalization(IMAGENET_MEAN, IMAGENET_STD, 1)  # any other channel count: the grey values
        stats = fit_normalization(IMAGENET_MEAN, IMAGENET_STD, c.in_chans) or fit_normalization(*grey, c.in_chans)
        source = DEFAULT_NORMALIZATION
        if weights.get("mean") and fit_normalization(weights["mean"], weights["std"], c.in_chans) is not None:
            stats, source = fit_normalization(weights["mean"], weights["std"], c.in_chans), "released weights"
        recorded = c.data.normalization(c.in_chans) if c.data is not None else None
        if recorded is not None:
            stats, source = recorded, "training data"
        return {
            "input_size": (c.in_chans, c.image_size, c.image_size),
            "mean": tuple(stats[0]),
            "std": tuple(stats[1]),
            "normalization": source,
            "crop_pct": float(weights.get("crop_pct") or 1.0),
            "crop_mode": "center",
            "interpolation": weights.get("interpolation") or "bilinear",
            "num_classes": getattr(c, "num_classes", 0),
        }

    # ---------------------------------------------------------------- timm's backbone interface
    def finish_features(self, z: Tensor) -> Tensor:
        """The last layer's tokens → ``forward_features``' output (the family's final blocks and norm; none here)."""
        return z

    def norm_tokens(self, z: Tensor) -> Tensor:
        """The family's final token normalisation, applied to intermediates with ``norm=True`` (none here: the
        classifier's LayerNorm follows the pooling, as timm's ``fc_norm``)."""
        return z

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | Sequence[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
        return_prefix_tokens: bool = False,
    ) -> list | tuple[Tensor, list]:
        """timm's ``forward_intermediates``: the tokens of the layers ``indices`` names (all: None; the last ``n``:
        an int; 0-based positions, negative from the end), as ``(b, d, h, w)`` maps of the patches (``"NCHW"``) or
        ``(b, N, d)`` tokens (``"NLC"``), with their prefix (class) tokens beside them when
        ``return_prefix_tokens`` (``(patches, prefix)`` pairs); then ``(forward_features(x), intermediates)``, or
        the intermediates alone.  ``stop_early`` skips the layers after the last one taken (only with
        ``intermediates_only``: the features need every layer)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take = take_indices(len(self.layers), indices)
        last = max(take) + 1 if stop_early and intermediates_only else len(self.layers)
        z, prefix, (h, w) = self.embed(x), self.trace_prefix_tokens, self.patch_grid(x)
        out = []
        for i in range(last):
            z = self.run_layers(z, self.layers[i : i + 1])
            if i in take:
                t = self.norm_tokens(z) if norm else z
                patches = t[:, prefix:]
                if output_fmt == "NCHW":
                    patches = patches.reshape(t.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()
                out.append((patches, t[:, :prefix]) if return_prefix_tokens else patches)
        return out if intermediates_only else (self.finish_features(z), out)

    def patch_grid(self, x: Tensor) -> tuple[int, int]:
        """The ``(h, w)`` patch grid of images ``x``."""
        p = self.config.patch_size
        return x.shape[-2] // p, x.shape[-1] // p

    # ---------------------------------------------------------------- input checks
    def model_images(self, x: Tensor) -> Tensor:
        """Images ``x`` checked (metadata only: :meth:`check_images`) and in the parameters' floating dtype, unless
        autocast is on for their device (it casts them); what each image model's embedding reads."""
        self.check_images(x, finite=False)
        dtype = self.cls_token.dtype
        if torch.compiler.is_exporting():  # the program casts and checks as the model does, whatever the traced dtype
            return traced_images(x, dtype)
        return x if x.dtype == dtype or autocast_on(x) else x.to(dtype)

    def check_images(self, x: Tensor, finite: bool = True) -> None:
        """Raise a one-line ValueError naming the problem (and the fix) for input the model cannot take.

        Checks type, rank, dtype, channels, patch divisibility and device (metadata only, no device
        sync; ``forward`` runs these) and, with ``finite`` (the default; for API boundaries such as
        the analysis entry points), that no value is NaN or Inf — a device→host sync.
        """
        c, p = self.config, self.config.patch_size
        if not isinstance(x, Tensor):
            raise ValueError(f"expected a torch.Tensor of images, got {type(x).__name__}")
        if x.dim() != 4:
            hint = "; add a batch dimension with x.unsqueeze(0)" if x.dim() == 3 else ""
            raise ValueError(
                f"expected images of shape (batch, channels, height, width), got shape {tuple(x.shape)}{hint}"
            )
        if not x.is_floating_point():
            raise ValueError(
                f"expected floating-point images, got dtype {x.dtype}; convert with x.float() / 255 and normalise"
            )
        if x.shape[1] != c.in_chans:
            raise ValueError(
                f"model expects {c.in_chans}-channel images (in_chans={c.in_chans}), got {x.shape[1]} channels; "
                "convert the images or create the model with in_chans matching your data"
            )
        h, w = x.shape[-2:]
        if h % p or w % p:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {p}; resize or crop to a multiple of {p} "
                f"(e.g. {max(p, h // p * p)}x{max(p, w // p * p)})"
            )
        device = next(self.parameters()).device
        if x.device != device and device.type != "meta":
            raise ValueError(f"images are on {x.device} but the model is on {device}; move them with x.to({device})")
        if finite:
            self.check_finite(x)

    @staticmethod
    def check_finite(x: Tensor) -> None:
        """Raise a one-line ValueError if ``x`` holds NaN or Inf (one device→host sync)."""
        if not bool(torch.isfinite(x).all()):
            raise ValueError("input images contain NaN or Inf values; clean the data before the forward pass")

    def patchify(self, x: Tensor) -> Tensor:
        """``(b, c, H, W)`` → ``(b, N, p·p·c)`` (:func:`patchify` with the model's patch size)."""
        return patchify(x, self.config.patch_size)


def bicubic_matrix(
    n_in: int,
    n_out: int,
    device: torch.device | str = "cpu",
    offset: float = 0.0,
    dtype: torch.dtype | None = None,
    antialias: bool = False,
) -> Tensor:
    """The ``(n_out, n_in)`` matrix of 1-D bicubic resizing as ``F.interpolate(mode="bicubic",
    align_corners=False)`` does it along one axis (its columns: the resized unit vectors).  ``offset`` > 0 resizes
    by the scale factor ``(n_out + offset) / n_in`` instead of to the size, as DINO's ``interpolate_pos_encoding``
    does (``offset=0.1``): the output still has ``n_out`` samples, placed by that scale.  ``antialias``: the
    antialiased kernel (``F.interpolate(..., antialias=True)``, DINOv2's ``interpolate_antialias``): PIL's cubic
    (a = −0.5, where plain bicubic's is −0.75), widened by the scale where the axis shrinks, so that each output
    averages the inputs it covers."""
    # antialiased, the kept axis is 2 wide: PyTorch's antialiased kernel mis-resizes an axis of length 1 (1 -> 1 is
    # not the identity there), while each of 2 columns is resized as the 1-D kernel does
    wide = 2 if antialias else 1
    eye = torch.eye(n_in, device=device, dtype=dtype).reshape(n_in, 1, n_in, 1).expand(n_in, 1, n_in, wide)
    how = dict(mode="bicubic", align_corners=False, antialias=antialias)
    if offset:
        return F.interpolate(eye, scale_factor=((n_out + offset) / n_in, 1.0), **how)[:, 0, :, 0].T
    return F.interpolate(eye, size=(n_out, wide), **how)[:, 0, :, 0].T
