"""The causal effect of every sparse atom: what the output loses when one atom of the code is ablated.

CRATE's sparse code ``Z^{ℓ+1}`` (one non-negative ISTA step on the LASSO (42), eq. (44)) has one coordinate per
atom of the dictionary ``D^ℓ``; the baselines' MLPs have hidden units in the same place (``mlp.hidden``).  The
*effect* of atom ``u`` of layer ``ℓ`` on example ``e`` is measured by ablating it — the code's coordinate ``u``
set to 0 on every token of the example (``model.intervene({"layers.ℓ.code": ...})``,
:mod:`crate_transformer.models.hooks`) — and reading the output again:

* ``Δloss_{u,e} = L(f_{−u}(x_e), y_e) − L(f(x_e), y_e)``, ``L`` the cross-entropy (a language model's averaged
  over the block's positions, the next token as target);
* ``flip_{u,e}``: the fraction of the example's predictions (the class; each position's next token) whose
  argmax changes.

The effect of an atom is the mean over the ``E`` evaluation examples, with a percentile bootstrap interval over
the examples (:func:`bootstrap`: the same resamples for every atom, so intervals of two atoms are comparable).

Batched (:func:`ablation_effects`): a batch of ``b`` examples is repeated ``c`` times, replica ``r`` multiplied by
a keep-mask with a 0 at atom ``r`` of the chunk (:func:`~crate_transformer.models.hooks.multiply` on the code), so
``c`` atoms cost one forward of ``c·b`` examples instead of ``c`` forwards; the same masks ablate groups of atoms
at once (:func:`group_effects`).  ``tests/analysis/test_effects.py`` checks it against one forward per atom.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config_utils import POSITIVE
from ..layers.inference import evaluating
from ..models.hooks import multiply

__all__ = [
    "Effects",
    "code_hook",
    "ablation_effects",
    "atom_effects",
    "group_effects",
    "bootstrap",
    "spearman",
    "image_effects",
    "text_effects",
    "attach_effects",
]


@dataclass
class Effects:
    """Per-example effects of ``g`` ablations (one atom each, or a group) at hook ``hook``: ``delta_loss`` and
    ``flip`` are ``(g, E)``, ``base_loss`` ``(E,)`` the unablated loss of each example."""

    hook: str
    delta_loss: np.ndarray
    flip: np.ndarray
    base_loss: np.ndarray

    def summary(self, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> dict[str, np.ndarray]:
        """Means and bootstrap intervals: ``{"loss", "loss_lo", "loss_hi", "flip", "flip_lo", "flip_hi"}``, each
        ``(g,)``."""
        out = {}
        for key, values in (("loss", self.delta_loss), ("flip", self.flip)):
            out[key], out[f"{key}_lo"], out[f"{key}_hi"] = bootstrap(values, n_boot, level, seed)
        return out


def code_hook(model: nn.Module, layer: int) -> str:
    """The hook name of layer ``layer``'s units (0-based): ``layers.{ℓ}.code`` (ISTA's code, CRATE-α's ``A2``) or
    ``layers.{ℓ}.mlp.hidden`` (a baseline's GELU units); a one-line error for a layer without either."""
    names = model.hook_names()
    for name in (f"layers.{layer}.code", f"layers.{layer}.mlp.hidden"):
        if name in names:
            return name
    depth = len(model.layers)
    if not 0 <= layer < depth:
        raise ValueError(
            f"layer {layer} is outside 0..{depth - 1} of this {type(model).__name__}; pass a 0-based layer"
        )
    raise ValueError(f"layer {layer} of this {type(model).__name__} has no sparse code nor MLP units to ablate")


def _scores(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Per example: the cross-entropy averaged over its positions, and the argmax predictions ``(B, ...)``."""
    loss = F.cross_entropy(logits.flatten(0, -2), targets.flatten(), reduction="none").view(targets.shape)
    return loss.reshape(len(targets), -1).mean(1), logits.argmax(-1)


@torch.no_grad()
def ablation_effects(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    hook: str,
    keep: Tensor,
    *,
    batch_size: int = 64,
    max_batch: int = 1024,
) -> Effects:
    """Ablations given as keep-masks ``keep`` ``(g, m)`` (1 keeps a unit, 0 ablates it) of the units at ``hook``,
    on ``inputs`` (model inputs, ``E`` of them) with ``targets`` (class ``(E,)`` or next tokens ``(E, n)``).
    Each forward holds at most ``max_batch`` examples: ``max_batch // b`` masks of a batch of ``b`` at once."""
    POSITIVE.check("batch_size", batch_size, "batch_size counts the examples per forward")
    POSITIVE.check("max_batch", max_batch, "max_batch bounds the replicas of one forward")
    if len(inputs) != len(targets) or len(inputs) == 0:
        raise ValueError(f"expected E >= 1 inputs and E targets, got {len(inputs)} and {len(targets)}")
    device = next(model.parameters()).device
    dl, fl, base = [], [], []
    with evaluating(model):
        for x, y in zip(inputs.split(batch_size), targets.split(batch_size)):
            x, y = x.to(device), y.to(device)
            b = len(x)
            loss0, pred0 = _scores(model(x), y)
            chunk = max(1, max_batch // b)
            rows_l, rows_f = [], []
            for masks in keep.split(chunk):
                c = len(masks)
                factor = masks.to(device).repeat_interleave(b, 0).unsqueeze(1)  # replica r·b + i: mask r, example i
                with model.intervene({hook: multiply(factor)}):
                    logits = model(x.repeat(c, *([1] * (x.dim() - 1))))
                loss, pred = _scores(logits, y.repeat(c, *([1] * (y.dim() - 1))))
                rows_l.append((loss.view(c, b) - loss0).double().cpu())
                rows_f.append(
                    (pred != pred0.repeat(c, *([1] * (pred0.dim() - 1)))).view(c, b, -1).double().mean(2).cpu()
                )
            dl.append(torch.cat(rows_l)), fl.append(torch.cat(rows_f)), base.append(loss0.double().cpu())
    return Effects(hook, torch.cat(dl, 1).numpy(), torch.cat(fl, 1).numpy(), torch.cat(base).numpy())


def _width(model: nn.Module, inputs: Tensor, hook: str) -> int:
    """The number of units at ``hook`` (read off one example's forward)."""
    device = next(model.parameters()).device
    with torch.no_grad(), evaluating(model):
        _, cache = model.run_with_cache(inputs[:1].to(device), names=[hook])
    return cache[hook].shape[-1]


def atom_effects(
    model: nn.Module,
    inputs: Tensor,
    targets: Tensor,
    layer: int,
    units: Sequence[int] | None = None,
    **kwargs: int,
) -> Effects:
    """The effect of ablating each unit of layer ``layer`` (0-based) alone, every unit or those in ``units``: row
    ``r`` of the result is unit ``units[r]`` (``kwargs``: :func:`ablation_effects`'s batch sizes)."""
    hook = code_hook(model, layer)
    m = _width(model, inputs, hook)
    units = list(range(m)) if units is None else [int(u) for u in units]
    keep = torch.ones(len(units), m)
    keep[torch.arange(len(units)), torch.tensor(units, dtype=torch.long)] = 0.0
    return ablation_effects(model, inputs, targets, hook, keep, **kwargs)


def group_effects(
    model: nn.Module, inputs: Tensor, targets: Tensor, layer: int, groups: Sequence[Sequence[int]], **kwargs: int
) -> Effects:
    """The effect of ablating each group of units of layer ``layer`` together (row ``r``: ``groups[r]``)."""
    hook = code_hook(model, layer)
    m = _width(model, inputs, hook)
    keep = torch.ones(len(groups), m)
    for r, group in enumerate(groups):
        keep[r, torch.tensor([int(u) for u in group], dtype=torch.long)] = 0.0
    return ablation_effects(model, inputs, targets, hook, keep, **kwargs)


def bootstrap(
    values: np.ndarray, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, lo, hi)`` over the last axis of ``values`` ``(g, E)``: the mean over the ``E`` examples and its
    percentile bootstrap interval at ``level`` (``n_boot`` resamples of the examples with replacement, seeded,
    shared by every row)."""
    values = np.asarray(values, dtype=np.float64)
    e = values.shape[-1]
    counts = np.random.default_rng(seed).multinomial(e, np.full(e, 1.0 / e), size=n_boot)  # (n_boot, E)
    means = values @ counts.T / e  # (g, n_boot): each resample's mean
    tail = 100 * (1 - level) / 2
    return values.mean(-1), np.percentile(means, tail, axis=-1), np.percentile(means, 100 - tail, axis=-1)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` over the entries where both are finite (ties: average
    ranks); NaN with fewer than 3 such entries or a constant one."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return float("nan")
    return float(spearmanr(a[ok], b[ok]).statistic)


def _each_layer(
    model: nn.Module, inputs: Tensor, targets: Tensor, layers: Sequence[int] | None, n_boot: int, seed: int, **kw: int
) -> dict[int, dict]:
    """``{layer: summary}`` (:meth:`Effects.summary`) of every unit of each layer, plus the base loss."""
    chosen = range(len(model.layers)) if layers is None else layers
    out = {}
    for layer in chosen:
        eff = atom_effects(model, inputs, targets, layer, **kw)
        out[layer] = {**eff.summary(n_boot, seed=seed), "hook": eff.hook, "base_loss": float(eff.base_loss.mean())}
    return out


def image_effects(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    normalization: tuple | None = None,
    layers: Sequence[int] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    **kwargs: int,
) -> dict[int, dict]:
    """Every unit's effect on an image classifier's loss and predicted class, on ``images`` ((N, C, H, W) in
    [0, 1], normalised as :func:`~crate_transformer.analysis.features.image_features` does) labelled ``labels``."""
    from ._common import normalize_images

    x = normalize_images(images, normalization)
    return _each_layer(model, x, labels.long(), layers, n_boot, seed, **kwargs)


def text_effects(
    model: nn.Module,
    blocks: Tensor,
    *,
    layers: Sequence[int] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    **kwargs: int,
) -> dict[int, dict]:
    """Every unit's effect on a language model's next-token loss and predictions, on ``blocks`` ((N, n + 1) ids:
    ``n`` inputs and the tokens that follow them)."""
    if blocks.dim() != 2 or blocks.shape[1] < 2:
        raise ValueError(f"expected (N, n + 1) token ids with n >= 1, got shape {tuple(blocks.shape)}")
    return _each_layer(model, blocks[:, :-1], blocks[:, 1:], layers, n_boot, seed, **kwargs)


def attach_effects(report: dict, effects: dict[int, dict], n_examples: int, n_boot: int) -> dict:
    """``report`` (of ``image_features`` / ``text_features``) with each unit's effect beside its purity
    (``effect_flip``, ``effect_loss`` and their ``_lo`` / ``_hi`` bounds) and per layer the mean effects and the
    Spearman correlation of purity and effect (``{kind}_purity_vs_flip``) over the scored units."""
    kinds = report["label_kinds"]
    for layer in report["layers"]:
        eff = effects.get(layer["layer"] - 1)
        if eff is None:
            continue
        for u, rec in enumerate(layer["units"]):
            for key in ("flip", "loss"):
                for end in ("", "_lo", "_hi"):
                    rec[f"effect_{key}{end}"] = float(eff[key + end][u])
        s = layer["summary"]
        s["effect_hook"], s["effect_base_loss"] = eff["hook"], eff["base_loss"]
        s["effect_flip"], s["effect_loss"] = float(eff["flip"].mean()), float(eff["loss"].mean())
        for kind in kinds:
            p = np.array([np.nan if r[f"{kind}_purity"] is None else r[f"{kind}_purity"] for r in layer["units"]])
            rho = spearman(p, eff["flip"])
            s[f"{kind}_purity_vs_flip"] = None if np.isnan(rho) else rho
    report["effects"] = {"n_examples": n_examples, "n_boot": n_boot, "level": 0.95, "ablation": "zero"}
    return report
