"""Batch-level regularisation of the training recipes: mixup / cutmix with mixed labels, random erasing, and
the soft-target cross-entropy they need.

:class:`MixupCutmix` follows timm's ``Mixup`` in batch mode (DeiT, MAE fine-tuning): with probability
``prob`` a batch is mixed, by cutmix with probability ``switch_prob`` when both are on (else by mixup), with
one ``λ ~ Beta(α, α)`` for the whole batch; each image is paired with another of the batch (one random
permutation), and the targets are the same mixture of the smoothed one-hot labels (timm's ``mixup_target``):

* mixup: ``x̃_i = λ x_i + (1 − λ) x_j`` and ``ỹ_i = λ y_i + (1 − λ) y_j``;
* cutmix: a box of ``x_j`` of side ``⌊√(1 − λ)·side⌋`` pasted into ``x_i`` at a uniformly random position, and
  ``ỹ_i`` weighs ``y_j`` by the box's exact area fraction (timm's ``correct_lam``).

λ, the box and its area are drawn on the host and the images are mixed on the device, so no value is read back
from the device (a GPU would wait for it every step).  :func:`random_erasing` draws its boxes on the device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config_utils import Range

PROBABILITY = Range(0, 1)

__all__ = ["MixupCutmix", "smooth_one_hot", "soft_target_cross_entropy", "random_erasing", "RandomErasing"]


def smooth_one_hot(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """One-hot rows with label smoothing: ``1 − s + s/C`` on the label, ``s/C`` elsewhere (timm's
    ``one_hot(..., on_value, off_value)``; the same targets as ``F.cross_entropy(label_smoothing=s)``)."""
    off = smoothing / num_classes
    out = torch.full((len(labels), num_classes), off, device=labels.device)
    return out.scatter_(1, labels.long().view(-1, 1), 1.0 - smoothing + off)


def soft_target_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """``mean_i Σ_c −t_ic log softmax(z_i)_c`` (timm's ``SoftTargetCrossEntropy``): the cross-entropy of
    mixed or smoothed targets; equal to ``F.cross_entropy`` for one-hot (or label-smoothed) rows."""
    return torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean()


class MixupCutmix(nn.Module):
    """Mix a batch ``(x, y)`` into ``(x̃, soft targets)`` (see the module docstring).

    ``mixup_alpha`` / ``cutmix_alpha``: the Beta concentrations (0 = that kind is off); ``prob``: the
    probability that a batch is mixed at all; ``switch_prob``: the probability of cutmix when both are on;
    ``smoothing``: label smoothing of the targets.  :attr:`last` records ``(kind, λ, pairs)`` of the last call
    (``kind`` "mixup", "cutmix" or "none"; ``λ`` the weight of the image's own label).
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.8,
        cutmix_alpha: float = 1.0,
        prob: float = 1.0,
        switch_prob: float = 0.5,
        smoothing: float = 0.1,
    ) -> None:
        super().__init__()
        if mixup_alpha < 0 or cutmix_alpha < 0 or not (mixup_alpha > 0 or cutmix_alpha > 0):
            raise ValueError(f"need mixup_alpha >= 0, cutmix_alpha >= 0, one > 0; got {mixup_alpha}, {cutmix_alpha}")
        for name, p in (("prob", prob), ("switch_prob", switch_prob), ("smoothing", smoothing)):
            PROBABILITY.check(name, p)
        self.num_classes, self.smoothing = num_classes, smoothing
        self.mixup_alpha, self.cutmix_alpha, self.prob, self.switch_prob = mixup_alpha, cutmix_alpha, prob, switch_prob
        self.last: tuple[str, float, Tensor | None] = ("none", 1.0, None)

    def choose(self) -> tuple[str, float]:
        """The kind of mixing of the next batch and ``λ`` (timm's ``_params_per_batch``)."""
        if float(torch.rand(())) >= self.prob:
            return "none", 1.0
        use_cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha <= 0 or float(torch.rand(())) < self.switch_prob)
        alpha = self.cutmix_alpha if use_cutmix else self.mixup_alpha
        lam = float(torch.distributions.Beta(alpha, alpha).sample())
        return ("cutmix" if use_cutmix else "mixup"), lam

    def forward(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        kind, lam = self.choose()
        targets = smooth_one_hot(y, self.num_classes, self.smoothing).to(x.device)
        if kind == "none":
            self.last = ("none", 1.0, None)
            return x, targets
        pairs = torch.randperm(len(x), device=x.device)
        if kind == "mixup":
            out, own = x * lam + x[pairs] * (1.0 - lam), lam
        else:
            out, own = _cutmix(x, pairs, lam)
        self.last = (kind, own, pairs)
        return out, own * targets + (1.0 - own) * targets[pairs]


def _cutmix(x: Tensor, pairs: Tensor, lam: float) -> tuple[Tensor, float]:
    """Paste one box of each partner ``x[pairs]`` into ``x`` (timm's batch mode): side ``⌊√(1 − λ)·side⌋``, at a
    uniformly random position inside the image; returns the images and the own label's weight, 1 − box area."""
    h, w = x.shape[-2:]
    rate = (1.0 - lam) ** 0.5
    ch, cw = int(rate * h), int(rate * w)
    y0 = int(torch.randint(0, h - ch + 1, ()))
    x0 = int(torch.randint(0, w - cw + 1, ()))
    out = x.clone()
    out[..., y0 : y0 + ch, x0 : x0 + cw] = x[pairs][..., y0 : y0 + ch, x0 : x0 + cw]
    return out, 1.0 - ch * cw / (h * w)


def random_erasing(p: float, value: float = 0.0) -> nn.Module:
    """timm / DeiT's random erasing (area fraction in [0.02, 1/3], aspect ratio in [0.3, 3.3]), applied per image
    with probability ``p`` to **normalised** images, filling ``value`` (0: the data mean; timm's ``mode="const"`` —
    timm's default "pixel" mode fills normal noise instead)."""
    PROBABILITY.check("p", p, "p is the probability of erasing a box")
    return RandomErasing(p, value)


class RandomErasing(nn.Module):
    """One box per image, erased with probability ``p``; timm's law (``RandomErasing``) drawn on the device.

    As timm, up to ``attempts`` boxes are drawn per image — area ``U(scale)·H·W``, aspect ratio log-uniform in
    ``ratio``, sides rounded — and the first that fits inside the image (both sides smaller) is erased at a uniformly
    random position; an image none fits is left as it is.  The attempts are drawn together, so nothing is read
    back from the device.
    """

    def __init__(
        self, p: float, value: float = 0.0, scale: tuple = (0.02, 1 / 3), ratio: tuple = (0.3, 3.3), attempts: int = 10
    ) -> None:
        super().__init__()
        self.p, self.value, self.scale, self.attempts = p, value, scale, attempts
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))

    def forward(self, x: Tensor) -> Tensor:
        b, h, w, dev = x.shape[0], x.shape[-2], x.shape[-1], x.device
        area = torch.empty(b, self.attempts, device=dev).uniform_(*self.scale) * (h * w)
        aspect = torch.empty(b, self.attempts, device=dev).uniform_(*self.log_ratio).exp()
        bh, bw = (area * aspect).sqrt().round(), (area / aspect).sqrt().round()
        fits = (bh < h) & (bw < w)
        first = fits.to(torch.uint8).argmax(1, keepdim=True)  # the first attempt that fits
        bh, bw = bh.gather(1, first)[:, 0], bw.gather(1, first)[:, 0]
        erase = fits.any(1) & (torch.rand(b, device=dev) < self.p)
        top = (torch.rand(b, device=dev) * (h - bh + 1)).floor()
        left = (torch.rand(b, device=dev) * (w - bw + 1)).floor()
        rows, cols = torch.arange(h, device=dev), torch.arange(w, device=dev)
        inside_rows = (rows >= top[:, None]) & (rows < (top + bh)[:, None])
        inside_cols = (cols >= left[:, None]) & (cols < (left + bw)[:, None])
        box = inside_rows[:, :, None] & inside_cols[:, None, :] & erase[:, None, None]
        return x.masked_fill(box.unsqueeze(1), self.value)
