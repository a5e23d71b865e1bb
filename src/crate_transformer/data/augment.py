"""Batched image augmentations drawn and applied on the device, reading nothing back from it.

Every random quantity (a shift, a crop box, a flip, a colour factor, a blur width) is drawn per image with torch's
random functions on the batch's device, and every choice that depends on one ("the first crop that fits", "is this
image flipped") is a tensor operation, never a Python ``if`` on a device value: a GPU step never waits for its
augmentation (kornia's modules read their parameters back to the host, several times per batch).  They act on
float batches ``(b, C, H, W)`` in [0, 1], before :func:`~.transforms.normalize`, and follow torchvision's laws:

* :class:`RandomShift` — integer shifts of up to ``pad`` pixels with zero fill (``RandomCrop(size, padding)``);
* :class:`RandomResizedCropFlip` — ``RandomResizedCrop(size, scale, ratio)`` and a horizontal flip, one bilinear
  resampling of the crop box (JMLR App. C.1; DINO's global and local views);
* :class:`ColorJitter`, :class:`RandomGrayscale`, :class:`GaussianBlur`, :class:`Solarize` — DINO's colour
  pipeline (``DataAugmentationDINO``); on grey-scale batches the colour ops reduce to brightness and contrast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "RandomShift",
    "RandomResizedCropFlip",
    "ColorJitter",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_saturation",
    "adjust_hue",
    "RandomGrayscale",
    "GaussianBlur",
    "Solarize",
    "grey",
]


def _uniform(n: int, lo: float, hi: float, like: Tensor, *shape: int) -> Tensor:
    return torch.empty(n, *shape, device=like.device).uniform_(lo, hi)


def _chosen(p: float, like: Tensor) -> Tensor:
    """Per image, True with probability ``p`` (as a ``(b, 1, 1, 1)`` mask)."""
    return (torch.rand(like.shape[0], device=like.device) < p).view(-1, 1, 1, 1)


def grey(x: Tensor) -> Tensor:
    """ITU-R 601 luma ``0.299 R + 0.587 G + 0.114 B`` as one channel (a one-channel batch is its own)."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


class RandomShift(nn.Module):
    """Shift each image by a random integer offset in ``[-pad, pad]`` per axis, filling with 0 (the law of
    torchvision's / kornia's ``RandomCrop(size, padding=pad)`` on zero-padded images).  :attr:`last` holds the
    offsets of the last call into the padded image, ``(dy, dx)`` in ``[0, 2·pad]``."""

    def __init__(self, pad: int) -> None:
        super().__init__()
        self.pad = int(pad)
        self.last: tuple[Tensor, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        b, _, h, w = x.shape
        p = self.pad
        dy, dx = (torch.randint(0, 2 * p + 1, (b,), device=x.device) for _ in range(2))
        self.last = (dy, dx)
        padded = F.pad(x, (p, p, p, p))
        rows = (torch.arange(h, device=x.device) + dy[:, None])[:, None, :, None]  # (b, 1, h, 1)
        cols = (torch.arange(w, device=x.device) + dx[:, None])[:, None, None, :]  # (b, 1, 1, w)
        out = padded.gather(2, rows.expand(b, x.shape[1], h, w + 2 * p))
        return out.gather(3, cols.expand(b, x.shape[1], h, w))


class RandomResizedCropFlip(nn.Module):
    """torchvision's ``RandomResizedCrop(size, scale, ratio)`` then ``RandomHorizontalFlip(flip)``, per image.

    As torchvision, up to 10 boxes are drawn per image — area ``U(scale)·H·W``, aspect ratio log-uniform in
    ``ratio``, sides rounded — and the first that fits is taken, at a uniformly random position; an image none fits
    gets torchvision's fallback, the central crop of the whole image with its aspect ratio clamped to ``ratio``.
    The box is resampled to ``size × size`` by one bilinear ``grid_sample`` (the flip mirrors the sampling grid).
    :attr:`last` holds ``(top, left, height, width, flipped)`` of the last call.
    """

    def __init__(
        self,
        size: int,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        attempts: int = 10,
    ) -> None:
        super().__init__()
        self.size, self.scale, self.flip, self.attempts = int(size), tuple(scale), float(flip), attempts
        self.ratio, self.log_ratio = tuple(ratio), (math.log(ratio[0]), math.log(ratio[1]))
        self.last: tuple[Tensor, ...] | None = None

    def boxes(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(top, left, height, width)`` of one box per image (float tensors of whole pixels)."""
        b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
        area = _uniform(b, *self.scale, x, self.attempts) * (h * w)
        aspect = _uniform(b, *self.log_ratio, x, self.attempts).exp()
        bw, bh = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
        fits = (bw > 0) & (bw <= w) & (bh > 0) & (bh <= h)
        first = fits.to(torch.uint8).argmax(1, keepdim=True)
        found = fits.any(1)
        fh, fw = self._fallback(h, w)
        bh = torch.where(found, bh.gather(1, first)[:, 0], fh)
        bw = torch.where(found, bw.gather(1, first)[:, 0], fw)
        top = torch.where(found, (torch.rand(b, device=x.device) * (h - bh + 1)).floor(), (h - bh) // 2)
        left = torch.where(found, (torch.rand(b, device=x.device) * (w - bw + 1)).floor(), (w - bw) // 2)
        return top, left, bh, bw

    def _fallback(self, h: int, w: int) -> tuple[float, float]:
        """torchvision's central crop when no drawn box fits: the whole image, its aspect ratio clamped."""
        if w / h < self.ratio[0]:
            return float(round(w / self.ratio[0])), float(w)
        if w / h > self.ratio[1]:
            return float(h), float(round(h * self.ratio[1]))
        return float(h), float(w)

    def forward(self, x: Tensor) -> Tensor:
        b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
        top, left, bh, bw = self.boxes(x)
        flipped = torch.rand(b, device=x.device) < self.flip
        self.last = (top, left, bh, bw, flipped)
        # the output pixel centres of the box in grid_sample's [-1, 1] coordinates (align_corners=False)
        sx = torch.where(flipped, -bw / w, bw / w)
        theta = torch.zeros(b, 2, 3, device=x.device, dtype=x.dtype)
        theta[:, 0, 0], theta[:, 0, 2] = sx, (2 * left + bw) / w - 1
        theta[:, 1, 1], theta[:, 1, 2] = bh / h, (2 * top + bh) / h - 1
        grid = F.affine_grid(theta, [b, x.shape[1], self.size, self.size], align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _rgb_to_hsv(x: Tensor) -> Tensor:
    r, g, b = x.unbind(1)
    v, _ = x.max(1)
    c = v - x.min(1).values
    safe = torch.where(c > 0, c, torch.ones_like(c))
    h = torch.where(v == r, ((g - b) / safe) % 6, torch.where(v == g, (b - r) / safe + 2, (r - g) / safe + 4))
    h = torch.where(c > 0, h / 6, torch.zeros_like(h))
    s = torch.where(v > 0, c / torch.where(v > 0, v, torch.ones_like(v)), torch.zeros_like(v))
    return torch.stack([h, s, v], 1)


def _hsv_to_rgb(x: Tensor) -> Tensor:
    h, s, v = x.unbind(1)
    channels = []
    for n in (5.0, 3.0, 1.0):  # R, G, B: v − v·s·clamp(min(k, 4 − k), 0, 1) with k = (n + 6h) mod 6
        k = (n + 6 * h) % 6
        channels.append(v - v * s * torch.minimum(k, 4 - k).clamp(0, 1))
    return torch.stack(channels, 1)


def adjust_brightness(x: Tensor, factor: Tensor) -> Tensor:
    """``clamp(f·x)`` (torchvision's ``adjust_brightness``: a blend with black)."""
    return (x * factor).clamp(0, 1)


def adjust_contrast(x: Tensor, factor: Tensor) -> Tensor:
    """A blend with the image's mean luma: ``clamp(f·x + (1 − f)·mean(grey(x)))``."""
    return (factor * x + (1 - factor) * grey(x).mean((1, 2, 3), keepdim=True)).clamp(0, 1)


def adjust_saturation(x: Tensor, factor: Tensor) -> Tensor:
    """A blend with the luma: ``clamp(f·x + (1 − f)·grey(x))`` (no change to a grey-scale image)."""
    return (factor * x + (1 - factor) * grey(x)).clamp(0, 1)


def adjust_hue(x: Tensor, shift: Tensor) -> Tensor:
    """Rotate the hue by ``shift`` turns (HSV; no change to a grey-scale image)."""
    if x.shape[1] != 3:
        return x
    hsv = _rgb_to_hsv(x)
    return _hsv_to_rgb(torch.stack([(hsv[:, 0] + shift[:, 0]) % 1.0, hsv[:, 1], hsv[:, 2]], 1))


JITTERS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


class ColorJitter(nn.Module):
    """torchvision's ``ColorJitter(brightness, contrast, saturation, hue)`` with probability ``p`` per image:
    factors ``U(1 − a, 1 + a)`` per image (hue: a shift of ``U(−hue, hue)`` turns), the four adjustments
    (:data:`JITTERS`) applied in an order drawn per batch.  :attr:`last` holds ``(order, factors, chosen)``."""

    def __init__(self, brightness: float, contrast: float, saturation: float, hue: float, p: float = 1.0) -> None:
        super().__init__()
        self.amounts, self.p = (brightness, contrast, saturation, hue), p
        self.last: tuple | None = None

    def forward(self, x: Tensor) -> Tensor:
        b, out = x.shape[0], x
        factors = [_uniform(b, 1 - a, 1 + a, x, 1, 1, 1) for a in self.amounts[:3]]
        factors.append(_uniform(b, -self.amounts[3], self.amounts[3], x, 1, 1, 1))
        order = [i for i in torch.randperm(4).tolist() if self.amounts[i] > 0]  # drawn on the host
        for i in order:
            out = JITTERS[i](out, factors[i])
        chosen = _chosen(self.p, x)
        self.last = (order, factors, chosen)
        return torch.where(chosen, out, x)


class RandomGrayscale(nn.Module):
    """Each image to its luma, repeated over the channels, with probability ``p``."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return torch.where(_chosen(self.p, x), grey(x).expand_as(x), x)


class GaussianBlur(nn.Module):
    """A Gaussian blur of odd side ``kernel`` and width ``σ ~ U(sigma)`` per image, with probability ``p``
    (torchvision's ``GaussianBlur``: separable, reflect-padded)."""

    def __init__(self, kernel: int, sigma: Sequence[float] = (0.1, 2.0), p: float = 1.0) -> None:
        super().__init__()
        self.kernel, self.sigma, self.p = int(kernel), tuple(sigma), p
        self.last: tuple[Tensor, Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        k = self.kernel
        sigma = _uniform(b, *self.sigma, x, 1)
        t = torch.arange(k, device=x.device, dtype=x.dtype) - (k - 1) / 2
        weights = torch.softmax(-(t**2) / (2 * sigma.to(x.dtype) ** 2), dim=1)  # normalised exp(−t²/2σ²)
        weights = weights[:, None].expand(b, c, k).reshape(b * c, k)  # each image's kernel for each of its channels
        flat = F.pad(x.reshape(1, b * c, h, w), (k // 2, k // 2, k // 2, k // 2), mode="reflect")
        flat = F.conv2d(flat, weights.view(b * c, 1, k, 1), groups=b * c)
        flat = F.conv2d(flat, weights.view(b * c, 1, 1, k), groups=b * c)
        chosen = _chosen(self.p, x)
        self.last = (sigma, chosen)
        return torch.where(chosen, flat.view(b, c, h, w), x)


class Solarize(nn.Module):
    """Invert the values at or above ``threshold`` (PIL's ``ImageOps.solarize``, DINO's 128 of 255), with
    probability ``p`` per image."""

    def __init__(self, p: float, threshold: float = 0.5) -> None:
        super().__init__()
        self.p, self.threshold = p, threshold

    def forward(self, x: Tensor) -> Tensor:
        return torch.where(_chosen(self.p, x) & (x >= self.threshold), 1 - x, x)
