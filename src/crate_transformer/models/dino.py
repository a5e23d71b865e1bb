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
* :class:`DINOModel` — backbone + head over a list of views (DINO's ``MultiCropWrapper``), the head configured by
  :class:`DINOHeadConfig`.

The training side — the task's options (temperatures, momenta, the multi-crop augmentation: 2 global + N local
views with DINO's per-view probabilities) and its presets (``"paper"``: DINO's ``main_dino.py`` defaults, which
C.3 says it matches; ``"digits"``: the built-in 28×28 digits on 2 CPU cores) — is the ``dino`` task's,
:mod:`crate_transformer.train.dino`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import Config
from ..config_utils import POSITIVE, option
from ..objectives import at_least_float32, covariance_coding_rate, effective_rank, full_precision
from .base import POOLS, pool_tokens

__all__ = [
    "DINOHeadConfig",
    "DINOHead",
    "DINOModel",
    "DINOLoss",
    "SimDINOLoss",
    "global_coding_rate",
    "feature_health",
    "COLLAPSE_RANK",
    "collapse_words",
    "ema_update",
    "cosine_schedule",
    "teacher_temperature",
    "cancel_gradients_last_layer",
]


OBJECTIVES = ("dino", "simdino")  # DINO's cross-entropy on prototypes; SimDINO's coding rate (Wu et al. 2025)
DINO_ONLY: dict[str, tuple[str, ...]] = {"objective": ("dino",)}  # options read by DINO's objective only
SIMDINO_ONLY: dict[str, tuple[str, ...]] = {"objective": ("simdino",)}  # options read by SimDINO's only


@dataclass
class DINOHeadConfig(Config):
    """The DINO model's own settings (names as in DINO's ``main_dino.py``): the projection head on the backbone and
    the backbone feature it reads.  The training options (temperatures, momenta, multi-crop augmentation, presets)
    are the ``dino`` task's, :class:`crate_transformer.train.dino.DINOOptions`, which extends this class."""

    APPLIES = "always"  # every field without an objective's ``applies`` is read by the head's build or the task

    objective: str = option(
        "dino",
        "the self-distillation objective: dino (prototypes, centring, cross-entropy) | simdino (coding rate; its "
        "head has no prototype layer)",
        choices=OBJECTIVES,
        fixed=True,
    )
    out_dim: int = option(
        1024,
        "prototypes K: outputs of the weight-normalised last layer (DINO: 65536)",
        range=POSITIVE,
        fixed=True,
        applies=DINO_ONLY,
    )
    hidden_dim: int = option(256, "hidden width of the head's 3-layer MLP (DINO: 2048)", range=POSITIVE, fixed=True)
    bottleneck_dim: int = option(64, "bottleneck before l2-normalisation (DINO: 256)", range=POSITIVE, fixed=True)
    head_layers: int = option(3, "MLP layers of the head (DINO: 3)", range=POSITIVE, fixed=True)
    use_bn_in_head: bool = option(True, "BatchNorm in the head's MLP (DINO: off for ViTs; digits: on)", fixed=True)
    norm_last_layer: bool = option(
        True, "fix the weight norm of the last layer to 1 (DINO: on)", fixed=True, applies=DINO_ONLY
    )
    pool: str = option(
        "avg",
        "backbone feature for the head and k-NN: cls token | avg of the patch tokens | mean of all tokens",
        choices=POOLS,
    )


# --------------------------------------------------------------------------- schedules
def cosine_schedule(start: float, end: float, step: int, total: int) -> float:
    """Cosine interpolation from ``start`` (step 0) towards ``end`` (step ``total``), as DINO's ``cosine_scheduler``
    without warm-up (its value at iteration ``step`` of ``total``).

    DINO's teacher momentum: ``m(t) = 1 − (1 − m₀)(cos(πt/T) + 1)/2`` = ``cosine_schedule(m₀, 1, t, T)``; its
    weight decay: ``cosine_schedule(weight_decay, weight_decay_end, t, T)``.
    """
    t = min(max(step, 0), total) / max(total, 1)
    return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * t))


def teacher_temperature(cfg: Any, epoch: int) -> float:
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
    if epoch >= freeze_last_layer or head.last_layer is None:  # SimDINO's head has no last layer
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
        out_dim: int | None,
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
        self.last_layer: nn.Module | None = None
        if out_dim is None:  # SimDINO's head: its prototype layer is commented out (vision_transformer.py)
            return
        last = nn.Linear(bottleneck_dim, out_dim, bias=False)
        self.last_layer = nn.utils.parametrizations.weight_norm(last)
        g = self.last_layer.parametrizations.weight.original0
        with torch.no_grad():
            g.fill_(1.0)
        g.requires_grad_(not norm_last_layer)

    @classmethod
    def from_config(cls, in_dim: int, config: DINOHeadConfig) -> DINOHead:
        """The head :class:`DINOHeadConfig` describes, on ``in_dim``-dimensional backbone features (no prototype
        layer for ``objective="simdino"``: its features are the ℓ2-normalised bottleneck)."""
        out_dim = config.out_dim if config.objective == "dino" else None
        return cls(
            in_dim, out_dim, hidden_dim=config.hidden_dim, bottleneck_dim=config.bottleneck_dim,
            nlayers=config.head_layers, use_bn=config.use_bn_in_head, norm_last_layer=config.norm_last_layer,
        )  # fmt: skip

    def last_layer_parameters(self) -> list[nn.Parameter]:
        """The trainable parameters of the last layer (frozen during the first ``freeze_last_layer`` epochs)."""
        if self.last_layer is None:
            return []
        return [p for p in self.last_layer.parameters() if p.requires_grad]

    def forward(self, x: Tensor) -> Tensor:
        x = F.normalize(self.mlp(x), dim=-1, p=2)
        return x if self.last_layer is None else self.last_layer(x)


class DINOModel(nn.Module):
    """Backbone (an :class:`~crate_transformer.models.classifier.ImageClassifier`; its classifier head is frozen and
    unused)
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
        (:func:`~crate_transformer.models.base.pool_tokens`, the feature ``crate eval --knn --pool`` reads)."""
        return pool_tokens(self.backbone.forward_features(x), self.pool, self.backbone.num_prefix_tokens)

    def no_weight_decay(self) -> set[str]:
        """DINO's rule (``utils.get_params_groups``): weight decay skips the biases and vectors only, so the
        backbone's position table and class token (tensors of 2+ dimensions) are decayed, as in DINO's
        training, unlike the backbone's own rule for supervised training (``Model.no_weight_decay``)."""
        return {n for n, p in self.named_parameters() if n.endswith(".bias") or p.ndim < 2}

    def forward(self, views: Tensor | Sequence[Tensor], *, patch_views: int = 0) -> Any:
        """Head outputs of every view, concatenated in the order given: ``(len(views) · b, out_dim)``; with
        ``patch_views=k`` also the backbone's patch tokens ``(k · b, N, d)`` of the first ``k`` views (of one
        resolution; the global views, for SimDINO's patch-token coding rate), as ``(out, patches)``."""
        if isinstance(views, Tensor):
            views = [views]
        out, patches, i = [], None, 0
        while i < len(views):  # consecutive views of one resolution go through the backbone together
            j = i
            while j < len(views) and views[j].shape[-2:] == views[i].shape[-2:]:
                j += 1
            tokens = self.backbone.forward_features(torch.cat(list(views[i:j])))
            if i == 0 and patch_views:
                if patch_views > j:
                    raise ValueError(f"patch_views={patch_views} but only {j} leading views share a resolution")
                patches = tokens[: patch_views * len(views[0]), self.backbone.num_prefix_tokens :]
            out.append(pool_tokens(tokens, self.pool, self.backbone.num_prefix_tokens))
            i = j
        head = self.head(torch.cat(out))
        return (head, patches) if patch_views else head


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


# --------------------------------------------------------------------------- SimDINO's loss
def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def global_coding_rate(Z: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(R, n)``: the coding rate ``R = ½ logdet(I + d/(nε²) G)`` (JMLR eq. (8)) of the rows of ``Z`` ``(b, d)``
    of every process together, ``G = Σ_p Z_pᵀZ_p`` their Gram, and ``n``, their number, in float64.

    Each of the W processes adds its Gram ``G_p`` and its ``b``; the sums are all-reduced as plain values (one
    all-reduce of the Gram, none in the backward), so ``R`` is the rate of the whole global batch on every
    process.  The gradient flows through the process's own Gram, scaled by W: ``G = G_all.detach() + W (G_p −
    G_p.detach())`` has the value ``G_all`` and ``∂R/∂G_p = W ∂R/∂G``.  DDP and FSDP average the gradients over the
    processes, so the step's gradient is ``(1/W) Σ_p W (∂R/∂G)(∂G_p/∂θ) = (∂R/∂G)(∂G/∂θ)``, that of the global
    rate: 1 process with 2b rows and 2 with b each give the same loss and gradients (SimDINO's ``--reduce_cov 1``,
    whose ``torch.distributed.nn`` all-reduce sums the W equal ``∂R/∂G`` in its backward to the same ``W ∂R/∂G``,
    made the only way; with ``--reduce_cov 0`` the authors' rate is of the per-process batch, RobinWu218/SimDINO#48).
    """
    if Z.dim() != 2:
        raise ValueError(f"Z must be (batch, dim) features, got shape {tuple(Z.shape)}")
    with full_precision(Z):  # the Gram in float64 under a bf16 / fp16 autocast too
        Z = Z.to(torch.float64)
        G = Z.transpose(0, 1) @ Z
    n = torch.full((), Z.shape[0], dtype=torch.float64, device=Z.device)
    if _distributed():
        G_all = G.detach().clone()  # a copy: the in-place all-reduce must leave the local Gram, G's gradient path
        torch.distributed.all_reduce(G_all)
        torch.distributed.all_reduce(n)
        G = G_all + torch.distributed.get_world_size() * (G - G.detach())
    if n < 2:
        raise ValueError(
            f"SimDINO's coding rate needs at least 2 images in the global batch, got {int(n)}; raise batch_size"
        )
    return covariance_coding_rate(G, n, eps), n


class SimDINOLoss(nn.Module):
    """SimDINO's objective (Wu et al. 2025, "Simplifying DINO via Coding Rate Regularization";
    RobinWu218/SimDINO ``main_dino.py``, ``MCRLoss``), on the ℓ2-normalised head features of every view:

    ``loss = − coeff · compression − expansion``, where ``compression`` is the mean cosine similarity between the
    teacher's feature of each global view and the student's of every other view (all pairs of distinct views), and
    ``expansion = γ · mean_v R(Z_v)`` over the global views, ``Z_v = (student_v + teacher_v)/2`` (the authors'
    ``expa_type 1``; ``smooth=False``: the student's alone, ``expa_type 0``), ``R`` the coding rate of the whole
    global batch (:func:`global_coding_rate`) with ε² the authors' ``--eps``, and ``γ = (d + n)/(d n)`` their
    balancing factor.  ``forward`` returns ``(loss, {"compression": ..., "expansion": ...})``, the terms detached.
    """

    def __init__(self, *, eps: float, coeff: float = 1.0, smooth: bool = True) -> None:
        super().__init__()
        if not eps > 0:
            raise ValueError(
                f"SimDINO needs a positive eps (the precision ε of the coding rate), got {eps}; e.g. 0.7071"
            )
        self.eps, self.coeff, self.smooth = float(eps), float(coeff), smooth

    def compression(self, student: Sequence[Tensor], teacher: Sequence[Tensor]) -> Tensor:
        """Mean over pairs of distinct views (teacher's global view i, student's view v != i) of the batch mean of
        their cosine similarity (the authors' ``calc_compression``)."""
        total, pairs = student[0].new_zeros(()), 0
        for i, t in enumerate(teacher):
            for v, s in enumerate(student):
                if v != i:
                    total, pairs = total + F.cosine_similarity(t, s, dim=-1).mean(), pairs + 1
        return total / max(pairs, 1)

    def expansion(self, views: Sequence[Tensor]) -> Tensor:
        """``γ · mean_v R(Z_v)`` with ``R`` over the global batch and ``γ = (d + n)/(d n)`` (``calc_expansion``)."""
        rates = [global_coding_rate(z, self.eps) for z in views]
        d, n = views[0].shape[-1], rates[0][1]
        return torch.stack([r for r, _ in rates]).mean() * ((d + n) / (d * n))

    def forward(
        self, student_out: Tensor, teacher_out: Tensor, *, n_global: int = 2
    ) -> tuple[Tensor, dict[str, Tensor]]:
        b = teacher_out.shape[0] // n_global
        student = at_least_float32(student_out).chunk(student_out.shape[0] // b)  # float64 stays float64
        teacher = at_least_float32(teacher_out).detach().chunk(n_global)
        comp = self.compression(student, teacher)
        views = [(s + t) / 2 for s, t in zip(student, teacher)] if self.smooth else list(student[:n_global])
        expa = self.expansion(views)
        loss = -self.coeff * comp - expa.to(comp.dtype)
        return loss, {"compression": comp.detach(), "expansion": expa.detach().to(comp.dtype)}


# --------------------------------------------------------------------------- telling a healthy run from a collapse
COLLAPSE_RANK = 0.1  # collapsing: effective rank below this fraction of min(n, d) (1 / min(n, d): a single direction)


@torch.no_grad()
def feature_health(features: Tensor, eps: float) -> dict[str, Tensor]:
    """Collapse monitors of a batch of backbone features ``(n, d)``, ℓ2-normalised: the mean per-dimension std
    (→ 0 at a collapse), the effective rank (:func:`~crate_transformer.objectives.effective_rank`; collapsing below
    :data:`COLLAPSE_RANK` · min(n, d)) and the coding rate ``R`` of eq. (8) at ``eps`` (down to ½ log(1 + d/ε²), its
    least for unit features, at a collapse to one point).
    Of the process's own batch: monitors, not the loss."""
    z = F.normalize(features.float(), dim=-1)
    n, d = z.shape
    with full_precision(z):  # no host sync (a monitor of every step): the Cholesky's status is not read
        G = z @ z.T if n <= d else z.T @ z
        L = torch.linalg.cholesky_ex(torch.eye(len(G), device=z.device) + d / (n * eps**2) * G)[0]
        rate = torch.log(torch.diagonal(L)).sum()  # ½ logdet, eq. (8)
    return {"feature_std": z.std(dim=0).mean(), "effective_rank": effective_rank(z).float(), "coding_rate": rate}


def collapse_words(rank: float, n: int, d: int) -> str:
    """``"effective rank 12.3 of 32 (collapse below 3.2)"``, with ``COLLAPSING`` appended below the threshold."""
    top = min(n, d)
    limit = COLLAPSE_RANK * top
    return f"effective rank {rank:.1f} of {top} (collapse below {limit:.1f})" + (" COLLAPSING" if rank < limit else "")
