"""Batch-level regularisation of the training recipes: mixup / cutmix with mixed labels, random erasing, and
the soft-target cross-entropy they need.

:class:`MixupCutmix` follows timm's ``Mixup`` in batch mode (DeiT, MAE fine-tuning): with probability
``prob`` a batch is mixed, by cutmix with probability ``switch_prob`` when both are on (else by mixup), with
one ``λ ~ Beta(α, α)`` for the whole batch; each image is paired with another of the batch.  The images are
mixed by kornia's ``RandomMixUpV2`` / ``RandomCutMixV2`` (given timm's λ and one random pairing), and the
targets are the same mixture of the smoothed one-hot labels (timm's ``mixup_target``):

* mixup: ``x̃_i = λ x_i + (1 − λ) x_j`` and ``ỹ_i = λ y_i + (1 − λ) y_j``;
* cutmix: a box of ``x_j`` pasted into ``x_i`` (kornia's box of side ``⌊√(1 − λ)·side⌋``), and ``ỹ_i``
  weighs ``y_j`` by the box's exact area fraction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MixupCutmix", "smooth_one_hot", "soft_target_cross_entropy", "random_erasing"]


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
        import kornia.augmentation as K

        if mixup_alpha < 0 or cutmix_alpha < 0 or not (mixup_alpha > 0 or cutmix_alpha > 0):
            raise ValueError(f"need mixup_alpha >= 0, cutmix_alpha >= 0, one > 0; got {mixup_alpha}, {cutmix_alpha}")
        for name, p in (("prob", prob), ("switch_prob", switch_prob), ("smoothing", smoothing)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {p}")
        self.num_classes, self.smoothing = num_classes, smoothing
        self.mixup_alpha, self.cutmix_alpha, self.prob, self.switch_prob = mixup_alpha, cutmix_alpha, prob, switch_prob
        self.mixup = K.RandomMixUpV2(p=1.0, data_keys=["input", "class"])
        self.cutmix = K.RandomCutMixV2(p=1.0, data_keys=["input", "class"], use_correct_lambda=True)
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
        b = len(x)
        pairs = torch.randperm(b, device=x.device)
        every = torch.ones(b, dtype=torch.bool, device=x.device)  # kornia's per-image gate: all mixed
        if kind == "mixup":  # kornia's output: x·(1 − l) + x[pairs]·l, so l = 1 − λ
            lams = torch.full((b,), 1.0 - lam, device=x.device)
            params = {"mixup_pairs": pairs, "mixup_lambdas": lams, "batch_prob": every}
            out, lab = self.mixup(x, y, params=params)
            weight = lab[:, 2]  # kornia's mixup label: the partner's weight
        else:
            shape = torch.tensor(x.shape[-2:], device=x.device, dtype=x.dtype)
            box = _cutmix_box(x.shape, lam, x.device)
            params = {"mix_pairs": pairs.view(1, b), "crop_src": box, "image_shape": shape, "batch_prob": every}
            out, lab = self.cutmix(x, y, params=params)
            weight = 1.0 - lab[0, :, 2]  # kornia's corrected cutmix label: 1 − box area = the own label's weight
        weight = weight.to(targets.dtype).view(-1, 1)
        self.last = (kind, float(1.0 - weight[0]), pairs)
        return out, (1.0 - weight) * targets + weight * targets[pairs]


def _cutmix_box(shape: torch.Size, lam: float, device: torch.device) -> Tensor:
    """One box for the whole batch (timm's batch mode) in kornia's ``crop_src`` layout ``(1, b, 4, 2)``:
    side ``⌊√(1 − λ)·side⌋`` (kornia's rule), at a uniformly random position inside the image."""
    from kornia.geometry.bbox import bbox_generator

    b, h, w = shape[0], shape[-2], shape[-1]
    rate = (1.0 - lam) ** 0.5
    ch, cw = int(rate * h), int(rate * w)
    y0 = int(torch.randint(0, h - ch + 1, ()))
    x0 = int(torch.randint(0, w - cw + 1, ()))
    t = lambda v: torch.full((b,), float(v), device=device)  # noqa: E731
    box = bbox_generator(t(x0), t(y0), t(cw), t(ch))
    return box.view(1, b, 4, 2)


def random_erasing(p: float, value: float = 0.0) -> nn.Module:
    """kornia's ``RandomErasing`` with timm / DeiT's box law (area fraction in [0.02, 1/3], aspect ratio in
    [0.3, 3.3]), applied per image with probability ``p`` to **normalised** images, filling ``value`` (0: the
    data mean; timm's ``mode="const"`` — timm's default "pixel" mode fills normal noise instead)."""
    import kornia.augmentation as K

    if not 0.0 <= p <= 1.0:
        raise ValueError(f"random erasing probability must be in [0, 1], got {p}")
    return K.RandomErasing(scale=(0.02, 1 / 3), ratio=(0.3, 3.3), value=value, p=p)
