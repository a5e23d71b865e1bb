"""Weights into a built model: the strict load every loader ends with, and the checks around it.

* :func:`load_weights` — strict ``load_state_dict`` whose every failure (missing, unexpected or mis-shaped keys,
  tensors of the wrong kind, NaN / ±inf: :func:`check_values`) is one line;
* :func:`load_backbone` — the same, keeping a fresh classifier when the file's has another number of classes;
* :func:`check_sizes` — the sizes a stored ``config.json`` gives, bounded by the weights beside it before anything
  is allocated;
* :func:`keep_dtypes` — the loaded model in the floating dtypes it was saved in.

Nothing here knows a model family or the registry: the model is asked (``size_hint``, ``get_classifier``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ..io import WEIGHTS_NAME, CheckpointError
from ..models.contract import FamilyConfig
from .official import index_count

__all__ = ["load_weights", "check_values", "load_backbone", "check_sizes", "keep_dtypes"]

# what the loaders log to (a fresh head on a loaded backbone)
logger = logging.getLogger("crate_transformer")


def load_weights(model: nn.Module, state: Mapping[str, Tensor], source: str = "checkpoint") -> None:
    """Strictly load ``state`` into ``model``; any missing, unexpected or mis-shaped key is one clear error
    (with the model's :meth:`~crate_transformer.models.base.Model.size_hint`), and so is a tensor of the wrong kind or
    with NaN / inf values (:func:`check_values`): every loader goes through here."""
    state = _without_obsolete(model, state)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(
        f"{k}: checkpoint {list(state[k].shape)} vs model {list(own[k].shape)}"
        for k in set(own) & set(state)
        if tuple(state[k].shape) != tuple(own[k].shape)
    )
    if missing or unexpected or shapes:
        parts = []
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)):
            if items:
                parts.append(f"{label}: {_first(items)}")
        size_hint = getattr(model, "size_hint", None)
        hint = size_hint(state) if callable(size_hint) else ""
        raise CheckpointError(f"{source} does not fit the model ({'; '.join(parts)}){hint}")
    check_values(own, state, source)
    model.load_state_dict(state, strict=True)


def _without_obsolete(model: nn.Module, state: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
    """``state`` without the keys earlier versions saved for modules that no longer have them (each module says
    which: ``obsolete_keys()``, e.g. the unused ISTA of an ``ista_mode="none"`` layer)."""
    drop = {
        f"{name}.{key}" if name else key
        for name, module in model.named_modules()
        if callable(getattr(module, "obsolete_keys", None))
        for key in module.obsolete_keys()
    }
    return {k: v for k, v in state.items() if k not in drop} if drop & set(state) else state


def check_values(own: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str) -> None:
    """Refuse what ``load_state_dict`` would silently convert or keep: a tensor of another kind than the model's
    (integers or booleans for floating-point weights, and the reverse) and NaN or ±inf in floating-point weights.
    One line naming the tensors; float16/bfloat16/float64 weights are cast as usual."""
    kinds = [
        f"{k} ({state[k].dtype}; the model's is {own[k].dtype})"
        for k in own
        if state[k].is_floating_point() != own[k].is_floating_point() or state[k].is_complex() != own[k].is_complex()
    ]
    if kinds:
        raise CheckpointError(
            f"{source} holds tensors of the wrong kind: {_first(kinds)}; it is not this model's weights, or was "
            "converted wrongly — save the weights as floating-point tensors"
        )
    bad = [f"{k} ({n} of {state[k].numel()})" for k in own if (n := _non_finite(state[k]))]
    if bad:
        raise CheckpointError(
            f"{source} holds NaN or infinite weights: {_first(bad)}; the file is corrupt or the run that wrote it "
            "diverged — use an earlier checkpoint"
        )


def _non_finite(t: Tensor) -> int:
    """How many NaN / ±inf values ``t`` holds; one ``aminmax`` pass (NaN and ±inf reach its ends), counted only
    when it finds one (a count of every tensor costs 30 times more)."""
    if not (t.is_floating_point() or t.is_complex()) or not t.numel():
        return 0
    t = torch.view_as_real(t) if t.is_complex() else t
    lo, hi = torch.aminmax(t)
    return 0 if bool(torch.isfinite(lo) & torch.isfinite(hi)) else int((~torch.isfinite(t)).sum())


def check_sizes(
    target: Callable[[FamilyConfig], nn.Module], config: FamilyConfig, state: Mapping[str, Tensor], path: Path
) -> None:
    """The sizes ``path`` (a ``config.json``) gives, bounded by the weights beside it before anything is allocated
    (an edited file of a folder saved before its checksum was stored is read as it is): each count of numbered
    blocks (``config.BLOCK_COUNTS``, ``depth`` → ``layers.N``) is the number of blocks their keys number
    (:func:`~crate_transformer.loading.official.index_count`, the rule for a size read from key names); then the model
    built on the meta device (no memory) has the weights' shapes.  A size no stored tensor holds (the context of a
    sinusoidal position table, which is not saved) is not bounded here."""
    fix = "the file was edited, or is not the one saved with these weights: restore the file saved with them"
    for field, prefix in config.BLOCK_COUNTS.items():
        try:
            count = index_count(state, rf"{re.escape(prefix)}\.(\d+)\.")
        except ValueError as e:
            raise CheckpointError(f"{path.parent / WEIGHTS_NAME}: {e}") from None
        if getattr(config, field) != count:
            raise CheckpointError(
                f"{path}: {field}={getattr(config, field):,} does not fit the weights beside it: their keys number "
                f"{count} block{'s' * (count != 1)} {prefix}.N; {fix}"
            )
    widest = max((n for t in state.values() for n in t.shape), default=0)
    try:
        with torch.device("meta"):
            probe = target(config)
    except (RuntimeError, OverflowError):  # a tensor too large to describe ("storage size calculation overflowed")
        raise CheckpointError(f"{path}: {_named(config, widest)} not fit the weights beside it; {fix}") from None
    own = probe.state_dict()
    bad = [k for k, t in own.items() if k in state and state[k].shape != t.shape]  # missing keys: load_weights'
    if bad:
        key, shape, there = bad[0], list(own[bad[0]].shape), list(state[bad[0]].shape)
        raise CheckpointError(
            f"{path}: {_named(config, widest, shape, there)} not fit the weights beside it ({key}: {there} in "
            f"{WEIGHTS_NAME}, {shape} by {path.name}); {fix}"
        )


def _named(config: FamilyConfig, widest: int, shape: Sequence[int] = (), there: Sequence[int] = ()) -> str:
    """``dim=1,000,000 does``: the integer fields whose values are the offending sizes of ``shape`` (not of the
    weights' ``there``), else those larger than every size of the weights (``widest``); ``its sizes do``."""
    ints = {
        f.name: v
        for f in dataclasses.fields(config)
        if isinstance(v := getattr(config, f.name), int) and not isinstance(v, bool) and v > 1
    }
    sizes = [f"{n}={v:,}" for n, v in ints.items() if v in shape and v not in there]
    sizes = sizes or [f"{n}={v:,}" for n, v in ints.items() if v > widest]
    return f"{', '.join(sizes)} {'does' if len(sizes) == 1 else 'do'}" if sizes else "its sizes do"


def _first(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f", … (+{len(items) - n} more)" if len(items) > n else "")


def keep_dtypes(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    """Give ``model`` the floating dtypes of the weights it was loaded from (``load_state_dict`` casts to the
    model's float32): a model saved in float16 or bfloat16 comes back in it, non-persistent buffers included;
    weights saved in several dtypes keep each its own."""
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())
        return
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name in state and state[name].is_floating_point() and t.dtype != state[name].dtype:
            t.data = t.data.to(state[name].dtype)


def load_backbone(model: nn.Module, state: Mapping[str, Tensor], source: str) -> list[str]:
    """:func:`load_weights` of every weight but the classifier's (``model.get_classifier()``) when those do not
    fit (another number of classes): the model keeps its fresh classifier and a line is logged.  Returns the
    names of the classifier weights left fresh."""
    head = model.get_classifier()
    prefix = next((f"{name}." for name, m in model.named_modules() if head is not None and m is head and name), None)
    own = model.state_dict()
    if prefix is None:
        load_weights(model, state, source=source)
        return []
    mine = {k for k in own if k.startswith(prefix)}
    theirs = {k for k in state if k.startswith(prefix)}
    if mine == theirs and all(state[k].shape == own[k].shape for k in mine):
        load_weights(model, state, source=source)
        return []
    kept = {k: v for k, v in state.items() if not k.startswith(prefix)}
    load_weights(model, {**kept, **{k: own[k] for k in mine}}, source=source)
    weight = state.get(f"{prefix}weight")
    was = f"{weight.shape[0]} classes" if weight is not None and weight.dim() == 2 else "another classifier"
    classes = getattr(model.get_classifier(), "out_features", 0)
    now, then = (
        (f"a fresh {classes}-class", "train the new head before using its outputs")
        if classes
        else ("no", "the model returns its pooled features")
    )
    logger.warning(
        f"{source}: {now} classifier ({prefix.rstrip('.')}) instead of the file's ({was}); every other weight is "
        f"loaded from the file — {then}"
    )
    return sorted(mine)
