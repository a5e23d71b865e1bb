"""CRATE-DINO: self-distillation with no labels (Caron et al., "Emerging Properties in Self-Supervised
Vision Transformers", ICCV 2021) on a CRATE backbone, as in JMLR §4.1.3 (pp. 41–43, eq. (74)–(80)),
Table 4 and App. C.3.

The JMLR text gives the objective — the cross-entropy between the teacher's distribution on global
views and the student's on every other view, eq. (76)–(77) — the student update (78), the EMA teacher
(79), and the recipe (AdamW, base lr 0.001, weight decay 0.005, 100 epochs); everything else "follows
the official DINO" (App. C.3, p.97; facebookresearch/dino, ``main_dino.py``).  This module implements those DINO pieces,
each configurable:

* :class:`DINOHead` — 3-layer GELU MLP (hidden 2048, bottleneck 256), ℓ2-normalisation, and a
  weight-normalised last layer (65,536 outputs, its norm fixed to 1) — ``dino_head.py`` of DINO;
* :class:`DINOLoss` — teacher centering (centre EMA 0.9), sharpening with the teacher temperature
  (linear warm-up over whole epochs, :func:`teacher_temperature`), student temperature 0.1, all pairs
  of distinct views;
* :func:`ema_update` with the cosine momentum schedule 0.996 → 1 (:func:`cosine_schedule`), and the
  cosine weight-decay schedule 0.04 → 0.4 of the same form;
* :func:`cancel_gradients_last_layer` — no gradient (``None``) for the head's last layer during the
  first ``freeze_last_layer`` epochs;
* :class:`MultiCropAugmentation` — 2 global + N local views (on the device): random resized crops, flips,
  colour jitter, grey-scale, Gaussian blur and solarisation with DINO's per-view probabilities;
* :class:`DINOModel` — backbone + head over a list of views (DINO's ``MultiCropWrapper``).

:data:`PRESETS` ``"paper"`` is DINO's ``main_dino.py`` defaults (which C.3 says it matches);
``"digits"`` is a small recipe for the built-in 28×28 digits on 2 CPU cores.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .base import POOLS, pool_tokens
from .config import Config
from .config_utils import Range, option

__all__ = [
    "DINOConfig",
    "PRESETS",
    "DINOHead",
    "DINOModel",
    "DINOLoss",
    "MultiCropAugmentation",
    "ema_update",
    "cosine_schedule",
    "teacher_temperature",
    "cancel_gradients_last_layer",
]


POS, UNIT = Range(0, lo_open=True), Range(0, 1)  # temperatures; momenta and probabilities
AREA = Range(0, 1, lo_open=True, note="each of the two area fractions LO HI")  # crop areas


@dataclass
class DINOConfig(Config):
    """DINO's hyper-parameters (names as in DINO's ``main_dino.py``); defaults = the ``digits`` preset.

    Use :meth:`preset` to start from ``"paper"`` (DINO's defaults, JMLR App. C.3) or ``"digits"``.
    """

    RULES = {"weight_decay_end": Range(0, note="or none: constant weight decay")}

    preset: str = option("digits", "start from this preset: digits (28 px, 2 CPU cores) | paper (DINO's defaults)")
    # head (DINO's dino_head.py)
    out_dim: int = option(1024, "prototypes K: outputs of the weight-normalised last layer (DINO: 65536)", fixed=True)
    hidden_dim: int = option(256, "hidden width of the head's 3-layer MLP (DINO: 2048)", fixed=True)
    bottleneck_dim: int = option(64, "bottleneck before l2-normalisation (DINO: 256)", fixed=True)
    head_layers: int = option(3, "MLP layers of the head (DINO: 3)", fixed=True)
    use_bn_in_head: bool = option(True, "BatchNorm in the head's MLP (DINO: off for ViTs; digits: on)", fixed=True)
    norm_last_layer: bool = option(True, "fix the weight norm of the last layer to 1 (DINO: on)", fixed=True)
    pool: str = option(
        "avg",
        "backbone feature for the head and k-NN: cls token | avg of the patch tokens | mean of all tokens",
        choices=POOLS,
    )
    # temperatures and centre
    student_temp: float = option(0.1, "student temperature tau_s", range=POS)
    teacher_temp: float = option(0.04, "teacher temperature tau_t after the warm-up", range=POS)
    warmup_teacher_temp: float = option(0.04, "teacher temperature at the start of the warm-up", range=POS)
    warmup_teacher_temp_epochs: int = option(
        0, "epochs of linear teacher-temperature warm-up (per epoch, reaching --teacher-temp in the last one)"
    )
    center_momentum: float = option(0.9, "EMA momentum of the teacher centre", range=UNIT)
    # teacher EMA and the student's first epoch
    momentum_teacher: float = option(
        0.99, "teacher EMA momentum at the start; cosine schedule to 1 (DINO: 0.996)", range=UNIT
    )
    freeze_last_layer: int = option(1, "epochs during which the head's last layer gets no gradient (nor AdamW step)")
    weight_decay_end: float | None = option(
        0.4, "cosine weight-decay schedule per step from --weight-decay to this value (none = constant)"
    )
    # multi-crop (sizes as fractions of the input side when <= 1, else pixels)
    global_crop_size: int = option(0, "side of the 2 global views in pixels (0 = the model's image size)")
    local_crop_size: int = option(0, "side of the local views in pixels (0 = 96/224 of the global side)")
    local_crops_number: int = option(0, "number of local views (DINO: 8)")
    global_crops_scale: list[float] = option(
        [0.6, 1.0], "area fraction range of the global crops, LO HI (DINO: 0.4 1.0)", range=AREA
    )
    local_crops_scale: list[float] = option(
        [0.05, 0.4], "area fraction range of the local crops, LO HI (DINO: 0.05 0.4)", range=AREA
    )
    flip: float = option(
        0.0, "probability of a horizontal flip (DINO: 0.5; digits: 0, a flip changes the digit)", range=UNIT
    )
    color_jitter: float = option(
        0.8, "probability of colour jitter (brightness, contrast 0.4, saturation 0.2, hue 0.1)", range=UNIT
    )
    grayscale: float = option(0.2, "probability of grey-scale conversion (RGB data only)", range=UNIT)
    blur: list[float] = option(
        [0.5, 0.1, 0.5], "Gaussian-blur probability: global views 1, 2 and local views (DINO: 1 0.1 0.5)", range=UNIT
    )
    solarize: float = option(0.2, "probability of solarisation of the second global view", range=UNIT)

    def validate(self) -> None:
        """Raise a one-line ValueError for an inconsistent setting (after :class:`Config`'s coercion and
        finiteness check)."""
        if self.preset not in PRESETS:
            raise ValueError(f"unknown DINO preset {self.preset!r}; choose one of {sorted(PRESETS)}")
        for name in ("out_dim", "hidden_dim", "bottleneck_dim", "head_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.pool not in POOLS:
            raise ValueError(f"unknown pool {self.pool!r}; choose one of {POOLS}")
        if min(self.local_crops_number, self.global_crop_size, self.local_crop_size) < 0:
            raise ValueError("local_crops_number, global_crop_size and local_crop_size must be >= 0")
        for name in ("warmup_teacher_temp_epochs", "freeze_last_layer"):  # whole epochs (ints), as in DINO
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be a whole number of epochs >= 0, got {getattr(self, name)!r}")
        for name in ("global_crops_scale", "local_crops_scale"):
            if len(getattr(self, name)) != 2:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name} takes two area fractions LO HI, got {getattr(self, name)}; e.g. {flag} 0.4 1")
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi <= 1.0:
                raise ValueError(f"{name} must be two area fractions 0 < lo <= hi <= 1, got {getattr(self, name)}")
        if len(self.blur) != 3:
            raise ValueError(f"blur takes 3 probabilities (global 1, global 2, local), got {self.blur}")

    @classmethod
    def from_preset(cls, name: str = "digits", **overrides: Any) -> DINOConfig:
        """The preset ``name`` with ``overrides`` (fields of this class) applied."""
        if name not in PRESETS:
            raise ValueError(f"unknown DINO preset {name!r}; choose one of {sorted(PRESETS)}")
        known = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"unknown DINO option(s) {bad}; valid options: {sorted(known)}")
        return cls(**{**PRESETS[name], **overrides, "preset": name})


# DINO main_dino.py defaults (ViT-S/16 column of its README except the teacher-temperature warm-up, which
# main_dino.py leaves at 0.04 → 0.04); JMLR App. C.3 states CRATE-DINO matches them.  TrainConfig side of the
# recipe (C.3): --optimizer adamw --lr 0.001 --weight-decay 0.005 --epochs 100 --warmup-epochs 10 --grad-clip 3.
# C.3 sets DINO's --weight_decay (the start of its cosine weight-decay schedule) and leaves --weight_decay_end
# at DINO's default 0.4, so the schedule stays on: 0.005 → 0.4.
PAPER: dict[str, Any] = dict(
    out_dim=65536, hidden_dim=2048, bottleneck_dim=256, head_layers=3, use_bn_in_head=False, norm_last_layer=True,
    pool="cls", student_temp=0.1, teacher_temp=0.04, warmup_teacher_temp=0.04, warmup_teacher_temp_epochs=0,
    center_momentum=0.9, momentum_teacher=0.996, freeze_last_layer=1, weight_decay_end=0.4, global_crop_size=0,
    local_crop_size=0, local_crops_number=8, global_crops_scale=[0.4, 1.0], local_crops_scale=[0.05, 0.4], flip=0.5,
    color_jitter=0.8, grayscale=0.2, blur=[1.0, 0.1, 0.5], solarize=0.2,
)  # fmt: skip
# The built-in 28x28 digits on 2 CPU cores: a small head with BatchNorm (without it the small CRATE's teacher
# drifted to the uniform collapse on the digits: entropy -> log K; with it the teacher stays sharp), mean-pooled
# features, no local crops (a 14-px crop of a digit rarely shows which digit it is), no flips, milder crops,
# and teacher momentum 0.99: the run has ~310 steps (DINO ~125,000), over which a 0.996 teacher lags the
# student too long (k-NN after 5 epochs: 84.3% with 0.996 in a 12-epoch run, 86.7% with 0.99 in a 10-epoch one).
DIGITS: dict[str, Any] = {
    **PAPER,
    **dict(out_dim=1024, hidden_dim=256, bottleneck_dim=64, use_bn_in_head=True, pool="avg", local_crops_number=0,
           global_crops_scale=[0.6, 1.0], flip=0.0, blur=[0.5, 0.1, 0.5], momentum_teacher=0.99),
}  # fmt: skip
PRESETS: dict[str, dict[str, Any]] = {"digits": DIGITS, "paper": PAPER}


# --------------------------------------------------------------------------- schedules
def cosine_schedule(start: float, end: float, step: int, total: int) -> float:
    """Cosine interpolation from ``start`` (step 0) towards ``end`` (step ``total``), as DINO's ``cosine_scheduler``
    without warm-up (its value at iteration ``step`` of ``total``).

    DINO's teacher momentum: ``m(t) = 1 − (1 − m₀)(cos(πt/T) + 1)/2`` = ``cosine_schedule(m₀, 1, t, T)``; its
    weight decay: ``cosine_schedule(weight_decay, weight_decay_end, t, T)``.
    """
    t = min(max(step, 0), total) / max(total, 1)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * t))


def teacher_temperature(cfg: DINOConfig, epoch: int) -> float:
    """τ_t during (0-based, whole) ``epoch``: DINO's ``DINOLoss.teacher_temp_schedule[epoch]``.

    DINO's table is ``np.linspace(warmup_teacher_temp, teacher_temp, W)`` followed by ``teacher_temp``: linear
    over epochs ``0 … W−1``, reaching ``teacher_temp`` in epoch ``W−1`` (``W = 1``: epoch 0 keeps the warm-up
    value), constant within an epoch and ``teacher_temp`` from epoch ``W`` on.
    """
    if isinstance(epoch, bool) or not float(epoch).is_integer() or epoch < 0:
        raise ValueError(f"epoch must be a whole epoch index >= 0 (the schedule is per epoch), got {epoch!r}")
    w, start, end = cfg.warmup_teacher_temp_epochs, cfg.warmup_teacher_temp, cfg.teacher_temp
    if epoch >= w:
        return end
    if w == 1:
        return start  # np.linspace(start, end, 1) == [start]
    if epoch == w - 1:
        return end  # np.linspace ends exactly on its stop value
    return start + epoch * ((end - start) / (w - 1))  # np.linspace's i·step + start (w ≥ 2 here)


def cancel_gradients_last_layer(head: DINOHead, epoch: int, freeze_last_layer: int) -> None:
    """DINO's ``cancel_gradients_last_layer``: during epochs ``< freeze_last_layer`` the head's last layer
    gets no gradient (``p.grad = None``), so the optimizer skips it — no AdamW moments, step count or weight
    decay for it until the first step of epoch ``freeze_last_layer``, exactly as in DINO."""
    if epoch >= freeze_last_layer:
        return
    for p in head.last_layer.parameters():
        p.grad = None


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, momentum: float) -> None:
    """θ_t ← m θ_t + (1 − m) θ_s for every parameter, in order (JMLR eq. (79)).

    Parameters only, as in DINO: buffers (BatchNorm statistics of a ``use_bn_in_head`` head) are the
    teacher's own, updated by its forward passes in train mode.
    """
    t_params, s_params = list(teacher.parameters()), list(student.parameters())
    if len(t_params) != len(s_params):
        raise ValueError("teacher and student have different parameters; build the teacher as a copy of the student")
    torch._foreach_mul_(t_params, momentum)
    torch._foreach_add_(t_params, [p.detach() for p in s_params], alpha=1.0 - momentum)


# --------------------------------------------------------------------------- head and model
class DINOHead(nn.Module):
    """DINO's projection head: MLP (GELU, optional BatchNorm) → bottleneck → ℓ2-normalise → weight-normalised
    linear layer to ``out_dim`` prototypes (norm fixed to 1 when ``norm_last_layer``).

    JMLR eq. (75) writes the head as a 3-layer ReLU MLP of width d; C.3 defers to DINO, whose head this is.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        *,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        nlayers: int = 3,
        use_bn: bool = False,
        norm_last_layer: bool = True,
    ) -> None:
        super().__init__()
        nlayers = max(nlayers, 1)
        layers: list[nn.Module] = []
        dims = [in_dim] + [hidden_dim] * (nlayers - 1) + [bottleneck_dim]
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(nn.Linear(a, b))
            if i < nlayers - 1:
                layers += [nn.BatchNorm1d(b)] if use_bn else []
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        last = nn.Linear(bottleneck_dim, out_dim, bias=False)
        self.last_layer = nn.utils.parametrizations.weight_norm(last)
        g = self.last_layer.parametrizations.weight.original0
        with torch.no_grad():
            g.fill_(1.0)
        g.requires_grad_(not norm_last_layer)

    def last_layer_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters of the last layer (frozen during the first ``freeze_last_layer`` epochs)."""
        return [p for p in self.last_layer.parameters() if p.requires_grad]

    def forward(self, x: Tensor) -> Tensor:
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return self.last_layer(x)


class DINOModel(nn.Module):
    """Backbone (an :class:`~crate_transformer.model.ImageClassifier`; its classifier head is frozen and unused)
    and :class:`DINOHead` applied to a list of views, views of one size batched together (DINO's
    ``MultiCropWrapper``).  ``config`` is the backbone's, so the engine records the backbone's architecture."""

    def __init__(self, backbone: nn.Module, head: DINOHead, pool: str = "cls") -> None:
        super().__init__()
        if pool not in POOLS:
            raise ValueError(f"unknown pool {pool!r}; choose one of {POOLS}")
        self.backbone, self.head, self.pool = backbone, head, pool
        self.backbone.head.requires_grad_(False)  # the classifier head is not part of DINO (kept for saving)

    @property
    def config(self) -> Any:
        return self.backbone.config

    def features(self, x: Tensor) -> Tensor:
        """The backbone feature of each image: class token (JMLR eq. (80)) or a mean of tokens
        (:func:`~crate_transformer.base.pool_tokens`, the feature ``crate eval --knn --pool`` reads)."""
        return pool_tokens(self.backbone.forward_features(x), self.pool)

    def no_weight_decay(self) -> set[str]:
        """DINO's rule (``utils.get_params_groups``): weight decay skips the biases and vectors only, so the
        backbone's position table and class token (tensors of 2+ dimensions) are decayed, as in DINO's
        training, unlike the backbone's own rule for supervised training (``Model.no_weight_decay``)."""
        return {n for n, p in self.named_parameters() if n.endswith(".bias") or p.ndim < 2}

    def forward(self, views: Tensor | Sequence[Tensor]) -> Tensor:
        """Head outputs of every view, concatenated in the order given: ``(len(views) · b, out_dim)``."""
        if isinstance(views, Tensor):
            views = [views]
        out, i = [], 0
        while i < len(views):  # consecutive views of one resolution go through the backbone together
            j = i
            while j < len(views) and views[j].shape[-2:] == views[i].shape[-2:]:
                j += 1
            out.append(self.features(torch.cat(list(views[i:j]))))
            i = j
        return self.head(torch.cat(out))


# --------------------------------------------------------------------------- loss
class DINOLoss(nn.Module):
    """Cross-entropy between the centred, sharpened teacher distribution on the global views and the
    student distribution on every other view (JMLR eq. (76)–(77); DINO's ``DINOLoss``).

    ``loss(student_out, teacher_out, teacher_temp, n_global=2)`` with ``student_out`` ``(V·b, K)`` (global views first)
    and ``teacher_out`` ``(G·b, K)``; the centre ``c`` then moves to ``m c + (1 − m) mean(teacher_out)``
    (averaged over processes under torch.distributed).
    """

    center: Tensor

    def __init__(self, out_dim: int, *, student_temp: float = 0.1, center_momentum: float = 0.9) -> None:
        super().__init__()
        self.student_temp, self.center_momentum = student_temp, center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))

    def forward(
        self, student_out: Tensor, teacher_out: Tensor, teacher_temp: float, *, n_global: int = 2, update: bool = True
    ) -> Tensor:
        b = teacher_out.shape[0] // n_global
        student = (student_out.float() / self.student_temp).chunk(student_out.shape[0] // b)
        teacher = F.softmax((teacher_out.float() - self.center) / teacher_temp, dim=-1).detach().chunk(n_global)
        total, pairs = student_out.new_zeros((), dtype=torch.float32), 0
        for iq, q in enumerate(teacher):
            for v, s in enumerate(student):
                if v == iq:
                    continue  # the teacher and student never see the same view
                total = total + torch.sum(-q * F.log_softmax(s, dim=-1), dim=-1).mean()
                pairs += 1
        if update:
            self.update_center(teacher_out)
        return total / max(pairs, 1)

    @torch.no_grad()
    def update_center(self, teacher_out: Tensor) -> None:
        """``c ← m c + (1 − m) · mean over the batch (and processes) of the teacher outputs``."""
        batch_center = teacher_out.float().sum(dim=0, keepdim=True)
        count = torch.full((), len(teacher_out), dtype=torch.float32, device=teacher_out.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(batch_center)
            torch.distributed.all_reduce(count)
        self.center.mul_(self.center_momentum).add_(batch_center / count, alpha=1.0 - self.center_momentum)


# --------------------------------------------------------------------------- multi-crop
class MultiCropAugmentation(nn.Module):
    """DINO's ``DataAugmentationDINO`` as batched ops on the device (:mod:`~crate_transformer.data.augment`) on float
    images in [0, 1]: two global views (RandomResizedCrop ``global_crops_scale``; view 1 always blurred, view 2
    blurred with p 0.1 and solarised with p 0.2) and ``local_crops_number`` local views (``local_crops_scale``,
    blur p 0.5), each with a flip, colour jitter (p 0.8) and grey-scale (p 0.2).  On grey-scale images the colour
    jitter is brightness and contrast, and grey-scale conversion is skipped.

    The default local side is 96/224 of the global side rounded to a ``multiple`` (the patch size).
    ``views`` holds one module per view, ``sizes`` their sides; ``forward(x)`` returns the list of views.
    """

    def __init__(self, cfg: DINOConfig, global_size: int, channels: int, multiple: int = 1) -> None:
        super().__init__()
        from .data import augment as A

        g = cfg.global_crop_size or global_size
        loc = cfg.local_crop_size or max(multiple, round(g * 96 / 224 / multiple) * multiple)

        def view(size: int, scale: Sequence[float], blur: float, solarize: float) -> nn.Module:
            ops: list[nn.Module] = [A.RandomResizedCropFlip(size, tuple(float(s) for s in scale), flip=cfg.flip)]
            if cfg.color_jitter > 0:
                ops.append(A.ColorJitter(0.4, 0.4, 0.2, 0.1, p=cfg.color_jitter))
            if cfg.grayscale > 0 and channels == 3:
                ops.append(A.RandomGrayscale(cfg.grayscale))
            if blur > 0:
                k = max(3, (size // 10) | 1)  # odd kernel, ~10% of the side as in BYOL/DINO
                ops.append(A.GaussianBlur(k, (0.1, 2.0), p=blur))
            if solarize > 0:
                ops.append(A.Solarize(solarize))
            return nn.Sequential(*ops)

        b1, b2, bl = (float(p) for p in cfg.blur)
        mods = [view(g, cfg.global_crops_scale, b1, 0.0), view(g, cfg.global_crops_scale, b2, cfg.solarize)]
        mods += [view(loc, cfg.local_crops_scale, bl, 0.0) for _ in range(cfg.local_crops_number)]
        self.views = nn.ModuleList(mods)
        self.sizes = [g, g] + [loc] * cfg.local_crops_number

    def forward(self, x: Tensor) -> list[Tensor]:
        return [v(x) for v in self.views]
