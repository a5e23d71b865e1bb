"""Optimizers, parameter groups, the learning-rate schedule and weight EMA for the training recipes users bring.

* :class:`Optimization` — what a run steps: the optimizer built from the ``optim`` options (``--lr`` is read here),
  the per-iteration :class:`WarmupCosine` schedule, the fp16 grad scaler and gradient clipping.

* :func:`param_groups` — decoupled weight decay on the matrices only (the model's ``no_weight_decay()``),
  optionally with layer-wise learning-rate decay (LLRD: ELECTRA / BEiT / MAE's ``param_groups_lrd``): layer
  ``i`` of ``L`` gets the learning rate ``lr · decay^(L + 1 − id)``, with id 0 for the patch embedding, class
  token and position table, ``i + 1`` for encoder layer ``i``, and ``L + 1`` (scale 1) for everything after
  the layers (final norm, head).
* :class:`LARS` — MoCo v3 / MAE's LARS (the linear probe's optimizer), :class:`LAMB` — You et al. 2019,
  Algorithm 2; :func:`build_optimizer` picks them by name beside AdamW, Lion and SGD with momentum.
* :class:`ModelEma` — an exponential moving average of the weights (timm's ``ModelEmaV2``), updated by
  the same :func:`~crate_transformer.models.dino.ema_update` as the DINO teacher.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from ..config_utils import Range
from ..errors import OptionError
from ..models.base import BLOCKS, STEM
from ..models.dino import ema_update
from .config import OPTIMIZERS, OptimOptions
from .runtime import Runtime

__all__ = ["OPTIMIZERS", "param_groups", "layer_id", "build_optimizer", "LARS", "LAMB", "ModelEma", "WarmupCosine"]
__all__ += ["Optimization", "warmup_steps"]


def layer_id(name: str, num_layers: int) -> int:
    """The layer id of parameter ``name`` in a model with ``num_layers`` encoder layers ``layers.{i}``: 0 for
    the embedding (``cls_token``, ``pos_embed``, ``patch_embed.*``: :data:`~crate_transformer.models.base.STEM`),
    ``i + 1`` for ``layers.{i}.*`` (:data:`~crate_transformer.models.base.BLOCKS`), and ``num_layers + 1`` for the rest
    (MAE's ``get_layer_id_for_vit``, with ``blocks`` named ``layers`` here; the groups of
    :meth:`~crate_transformer.models.base.Model.group_matcher`)."""
    if re.match(STEM, name):
        return 0
    block = re.match(BLOCKS, name)
    return int(block.group(1)) + 1 if block else num_layers + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict[str, Any]]:
    """The optimizer's parameter groups: weight decay on every trainable matrix that ``model.no_weight_decay()``
    does not name (a model without the method: every vector is skipped), none on the rest.

    ``layer_decay == 1`` gives two groups, decayed first (the engine's layout, which DINO's weight-decay
    schedule relies on).  ``layer_decay < 1`` gives MAE's layer-wise groups, in the order MAE's
    ``param_groups_lrd`` creates them, each with ``lr_scale = layer_decay ** (L + 1 − layer_id)`` (``L`` =
    ``len(model.layers)``), which :func:`build_optimizer` multiplies into the group's learning rate.
    """
    Range(0, 1, lo_open=True).check("layer_decay", layer_decay, "e.g. 0.75 (MAE) or 1 (off)")
    skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else set()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if layer_decay == 1.0:
        decay = [p for n, p in named if not (p.ndim < 2 or n in skip)]
        rest = [p for n, p in named if p.ndim < 2 or n in skip]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise OptionError(
            f"layer-wise lr decay needs a model with encoder layers `layers`; {type(model).__name__} has none; use "
            "layer_decay=1"
        )
    num = len(layers)
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for n, p in named:
        no_decay = p.ndim < 2 or n in skip
        lid = layer_id(n, num)
        group = groups.setdefault(
            (lid, no_decay),
            {
                "params": [],
                "weight_decay": 0.0 if no_decay else weight_decay,
                "lr_scale": layer_decay ** (num + 1 - lid),
            },
        )
        group["params"].append(p)
    return list(groups.values())


def build_optimizer(
    name: str,
    groups: list[dict[str, Any]],
    lr: float,
    betas: Iterable[float] = (),
    momentum: float = 0.9,
) -> torch.optim.Optimizer:
    """Optimizer ``name`` (one of :data:`OPTIMIZERS`) on ``groups``; a group's ``lr_scale`` (LLRD) sets its lr.

    ``betas`` default to (0.9, 0.999) for AdamW and LAMB, (0.9, 0.99) for Lion; ``momentum`` is SGD's and
    LARS's.  SGD's weight decay is the classic L2 term added to the gradient; LARS adds it likewise (before
    its trust ratio); AdamW, Lion and LAMB decouple it.
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {OPTIMIZERS}")
    groups = [{**g, "lr": lr * g.get("lr_scale", 1.0)} for g in groups]
    betas = tuple(betas)
    if name == "lion":
        from lion_pytorch import Lion

        return Lion(groups, lr=lr, betas=betas or (0.9, 0.99))
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=momentum)
    if name == "lars":
        return LARS(groups, lr=lr, momentum=momentum)
    if name == "lamb":
        return LAMB(groups, lr=lr, betas=betas or (0.9, 0.999))
    return torch.optim.AdamW(groups, lr=lr, betas=betas or (0.9, 0.999))


class LARS(torch.optim.Optimizer):
    """LARS as in MoCo v3 / MAE (``util/lars.py``, the linear probe's optimizer): for each matrix ``p``
    (``ndim > 1``) the update ``g + wd·p`` is rescaled by the trust ratio ``η‖p‖ / ‖g + wd·p‖`` (1 when a
    norm is 0); vectors (norms, biases) take the plain gradient, without weight decay; then heavy-ball
    momentum ``μ ← m·μ + update`` and ``p ← p − lr·μ``."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.0,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        trust_coefficient: float = 0.001,
    ) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, trust_coefficient=trust_coefficient)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Tensor | None:
        loss = closure() if closure is not None else None
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                dp = p.grad
                if p.ndim > 1:
                    dp = dp.add(p, alpha=g["weight_decay"])
                    p_norm, u_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(dp)
                    ratio = g["trust_coefficient"] * p_norm / u_norm
                    dp = dp.mul(torch.where((p_norm > 0) & (u_norm > 0), ratio, torch.ones_like(ratio)))
                state = self.state[p]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(p)
                state["mu"].mul_(g["momentum"]).add_(dp)
                p.add_(state["mu"], alpha=-g["lr"])
        return loss


class LAMB(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2), per parameter tensor:

    ``m ← β1 m + (1 − β1) g``, ``v ← β2 v + (1 − β2) g²``, ``m̂ = m / (1 − β1^t)``, ``v̂ = v / (1 − β2^t)``,
    ``r = m̂ / (√v̂ + ε) + λ x`` and ``x ← x − lr · φ(‖x‖) / ‖r‖ · r`` with ``φ(z) = z`` (the trust ratio is 1
    when ``‖x‖`` or ``‖r‖`` is 0, e.g. for zero-initialised biases).  ``λ`` is the group's weight decay.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Tensor | None:
        loss = closure() if closure is not None else None
        for g in self.param_groups:
            (b1, b2), eps, wd = g["betas"], g["eps"], g["weight_decay"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                state["step"] += 1
                t, m, v = state["step"], state["m"], state["v"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                r = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt_().add_(eps))
                if wd:
                    r.add_(p, alpha=wd)
                x_norm, r_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(r)
                ratio = torch.where((x_norm > 0) & (r_norm > 0), x_norm / r_norm, torch.ones_like(x_norm))
                p.sub_(r * (ratio * g["lr"]))
        return loss


# the largest share of the initial weights a weight EMA may keep at the end of a run without a warning
EMA_KEPT_AT_MOST = 0.1


class WarmupCosine:
    """LR multiplier per iteration: linear warm-up from ~0 to 1, then cosine decay to ``min_ratio``.

    Stepped every iteration (paper: 5-epoch linear warm-up then cosine decay, JMLR App. C.1).  A
    class rather than a lambda so ``LambdaLR.state_dict()`` stores it.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float) -> None:
        self.warmup_steps, self.total_steps, self.min_ratio = int(warmup_steps), int(total_steps), float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))


def warmup_steps(optim: OptimOptions, steps_per_epoch: int, total: int) -> int:
    """The linear warm-up's length in optimizer steps: ``warmup_fraction`` of the run's ``total`` steps, else
    ``warmup_epochs`` epochs."""
    if optim.warmup_fraction > 0:
        return max(1, round(optim.warmup_fraction * total))
    return round(optim.warmup_epochs * steps_per_epoch)


class Optimization:
    """Optimizer (:func:`~crate_transformer.train.optim.build_optimizer`: AdamW, Lion, SGD, LARS or LAMB),
    per-iteration warm-up + cosine schedule, fp16 grad scaler and clipping.

    Weight decay is decoupled and skips what the model's ``no_weight_decay()`` names (norms, biases, class and
    mask tokens, position tables; a model without the method: every vector):
    param group 0 holds the decayed parameters, group 1 the others (``Task.before_optimizer_step`` relies on that
    order, as DINO's ``get_params_groups``, whose first group is the regularized one).  ``--layer-decay`` below 1
    splits them further by layer (:func:`~crate_transformer.train.optim.param_groups`, MAE's LLRD).
    """

    def __init__(self, model: nn.Module, optim: OptimOptions, steps_per_epoch: int, total: int, rt: Runtime) -> None:
        groups = param_groups(model, optim.weight_decay, optim.layer_decay)
        self.optimizer = build_optimizer(optim.optimizer, groups, optim.lr, optim.betas, optim.momentum)
        self.schedule = WarmupCosine(warmup_steps(optim, steps_per_epoch, total), total, optim.min_lr / optim.lr)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        self.scaler = torch.amp.GradScaler(rt.device.type, enabled=rt.amp_dtype == torch.float16)
        self.params, self.clip = [p for g in groups for p in g["params"]], optim.grad_clip

    @property
    def lr(self) -> float:
        """The scheduled learning rate (of the last layer's groups under layer-wise decay)."""
        group = self.optimizer.param_groups[0]
        return group["lr"] / group.get("lr_scale", 1.0)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self) -> None:
        if self.clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.params, self.clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scheduler.lr_lambdas[0] = self.schedule  # follows --epochs changes made on resume
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def _floor(x: float, digits: int = 4) -> str:
    """``x`` rounded down to ``digits`` decimals, as text (a suggested decay that does not overshoot)."""
    return f"{math.floor(x * 10**digits) / 10**digits:.{digits}f}".rstrip("0")


class ModelEma(nn.Module):
    """An exponential moving average of a model's weights (timm's ``ModelEmaV2``): a frozen copy ``module``
    in eval mode, updated after each optimizer step by ``θ_ema ← d·θ_ema + (1 − d)·θ`` for every parameter
    (:func:`~crate_transformer.models.dino.ema_update`, the DINO teacher's update) and a copy of every buffer.

    After ``n`` updates from the initial weights ``θ_0`` the average is ``d^n θ_0 + (1 − d) Σ_k d^(n−k) θ_k``.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        Range(0, 1, lo_open=True, hi_open=True).check("decay", decay, "e.g. 0.9999 (timm) or 0.99996 (DeiT)")
        self.decay = float(decay)
        self.module = copy.deepcopy(model).eval().requires_grad_(False)

    def warmup_warning(self, steps: int) -> str | None:
        """A warning when ``steps`` updates leave the average near the initial weights: their share ``d^steps``
        (the closed form above) above :data:`EMA_KEPT_AT_MOST`; None when the average can warm up."""
        kept = self.decay ** max(int(steps), 0)
        if kept <= EMA_KEPT_AT_MOST:
            return None
        enough = 0.01 ** (1 / max(int(steps), 1))  # the decay that keeps 1% of the initial weights
        return (
            f"the weight EMA (ema={self.decay:g}) keeps {100 * kept:.3g}% of the initial weights after the run's "
            f"{steps} steps, so the EMA model will be close to the untrained one; for a run this short use "
            f"ema={_floor(enough)} or lower, or ema=0 to turn it off"
        )

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        ema_update(self.module, model, self.decay)
        for mine, theirs in zip(self.module.buffers(), model.buffers()):
            mine.copy_(theirs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)
