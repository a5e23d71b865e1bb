"""Reach inside a model: hook points named after the paper's variables, ``run_with_cache`` and ``intervene``.

Every model of the package (:class:`~crate_transformer.models.base.Model`) gets from :class:`Hooked`:

* ``model.hook_names()`` — the named values, read off the model's layers (each layer class's ``hook_sites()``,
  :mod:`crate_transformer.layers.hooks`): ``embed``, then ``layers.{i}.z_in``, ``layers.{i}.attn.qkv`` (or
  ``attn.q/k/v``), ``layers.{i}.attn.pattern``, ``layers.{i}.attn.out``, ``layers.{i}.z_half``,
  ``layers.{i}.code`` (or ``layers.{i}.mlp.hidden``), ``layers.{i}.z_out`` for every layer (and
  ``decoder_layers.{i}.*`` for CRATE-MAE's decoder), then ``head``; ``docs/hooks.md`` has the equation of each;
* ``model.run_with_cache(x, names=None)`` → ``(output, cache)``: the output of ``model(x)`` and the named values
  (all when ``names`` is None) recorded during it — only those named are kept;
* ``with model.intervene({name: edit, ...}):`` — every forward inside (``model(x)``, ``generate``, the analysis)
  runs with each named value replaced by ``edit(value)`` or ``edit(value, hook)``; the ready-made edits are
  :func:`ablate`, :func:`scale`, :func:`multiply`, :func:`set_value`, :func:`patch` and :func:`steer`.

The hooks are PyTorch's forward hooks on the layers' own modules, attached for the call or the block only and
removed however it ends (an exception included).  Compiled code sees them: each layer's forward reads the hook key
of :mod:`crate_transformer.layers._hook_state`, on which a compiled graph is guarded.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..layers import _hook_state
from ..layers.hooks import Site, attach

__all__ = [
    "Hooked",
    "Hook",
    "ActivationCache",
    "ablate",
    "scale",
    "multiply",
    "set_value",
    "patch",
    "steer",
]

Names = str | Iterable[str] | Callable[[str], bool] | None


@dataclass(frozen=True)
class Hook:
    """What a two-argument edit ``edit(value, hook)`` is told: the hook's ``name`` (``"layers.1.code"``) and its
    ``layer`` (1; None for ``embed`` and ``head``)."""

    name: str
    layer: int | None = None


class ActivationCache(dict):
    """``{hook name: tensor}`` recorded by :meth:`Hooked.run_with_cache`; a name not recorded is a one-line
    ``KeyError`` naming the recorded ones."""

    def __missing__(self, name: str) -> Tensor:
        near = difflib.get_close_matches(name, list(self), n=3, cutoff=0.0)
        raise KeyError(f"{name!r} was not recorded; nearest recorded: {', '.join(near) or 'none'} (pass names=...)")


# ----------------------------------------------------------------------------------------------- the mixin
class Hooked:
    """``hook_names``, ``hook_sites``, ``run_with_cache`` and ``intervene`` for a model whose layers say where
    their values are (the module docstring)."""

    def hook_sites(self) -> dict[str, Site]:
        """``{name: site}`` in the order the values are formed: ``embed`` (the first layer's input, ``f_pre(X)``),
        every layer list's layers (``layers.{i}.*``, ``decoder_layers.{i}.*``: each layer's ``hook_sites()``),
        ``head`` (what ``forward_head`` returns: logits, predicted patches).  Layers without ``hook_sites`` (ToST's
        class-attention blocks) have none."""
        sites: dict[str, Site] = {}
        for list_name, child in self.named_children():
            if not isinstance(child, nn.ModuleList):
                continue
            for i, layer in enumerate(child):
                own = getattr(layer, "hook_sites", None)
                if not callable(own):
                    continue
                if not sites:
                    sites["embed"] = Site(layer, "input")
                sites.update({f"{list_name}.{i}.{name}": site for name, site in own().items()})
        sites["head"] = Site(self, "method")
        return sites

    def hook_names(self) -> list[str]:
        """Every hook point's name, in the order the values are formed in a forward (``docs/hooks.md``)."""
        return list(self.hook_sites())

    def run_with_cache(
        self, *args: Any, names: Names = None, detach: bool = True, method: str = "forward", **kwargs: Any
    ) -> tuple:
        """``(self(*args, **kwargs), cache)``: the output and an :class:`ActivationCache` of the values named by
        ``names`` — a name, a list of names, a predicate on names, or None for all — recorded during that one
        forward (only those: memory grows with ``names``).  ``method`` runs another of the model's methods instead
        (``"forward_features"``: CRATE-MAE's encoder on the unmasked image; ``"classify"``).  Values are detached
        unless ``detach=False``; inside :meth:`intervene` they are the edited values.  A value formed more than
        once in the call keeps the last."""
        sites = self.hook_sites()
        chosen = self._choose(sites, names)
        cache = ActivationCache()

        def keep(name: str) -> Callable[[Tensor], None]:
            def record(value: Tensor) -> None:
                cache[name] = value.detach() if detach else value

            return record

        with self._attached({name: keep(name) for name in chosen}, sites):
            out = self(*args, **kwargs) if method == "forward" else getattr(self, method)(*args, **kwargs)
        return out, cache

    @contextmanager
    def intervene(self, edits: Mapping[str, Callable[..., Tensor | None]]) -> Iterator[Any]:
        """Within the block every forward of the model runs with each named value replaced by ``edit(value)`` (or
        ``edit(value, hook)``, :class:`Hook`): a tensor of the value's shape and dtype, or None (the value kept,
        e.g. after an in-place change).  Works in ``generate`` (every decoded token, with the key-value cache and
        ``compile=True``), inside ``frozen_weights`` / ``evaluating`` and under autocast; on exit, however the block
        ends, no hook is left.  Unknown names and read-only values are refused before anything is attached."""
        sites = self.hook_sites()
        self._choose(sites, list(edits))
        for name in edits:
            if sites[name].read_only:
                raise ValueError(f"{name} can be read (run_with_cache), not replaced: {sites[name].read_only}")
        with self._attached({name: _checked(name, fn) for name, fn in edits.items()}, sites):
            yield self

    # ---------------------------------------------------------------- internals
    def _choose(self, sites: Mapping[str, Site], names: Names) -> list[str]:
        """The names ``names`` selects, in the model's order; an unknown one is a one-line error with the nearest."""
        if names is None:
            return list(sites)
        if callable(names):
            return [n for n in sites if names(n)]
        wanted = [names] if isinstance(names, str) else list(names)
        for name in wanted:
            if name not in sites:
                near = difflib.get_close_matches(name, list(sites), n=3, cutoff=0.0)
                raise ValueError(
                    f"no hook point {name!r} in this {type(self).__name__}; nearest: {', '.join(near)} "
                    "(model.hook_names() lists them all)"
                )
        return [n for n in sites if n in set(wanted)]

    @contextmanager
    def _attached(self, fns: Mapping[str, Callable[[Tensor], Tensor | None]], sites: Mapping[str, Site]) -> Iterator:
        """``fns`` attached at their sites for the block (the hook key armed, :mod:`..layers._hook_state`), and
        removed on exit whatever happens, the key restored."""
        with _hook_state.armed(), ExitStack() as stack:
            for name, fn in fns.items():
                site = sites[name]
                handle = _attach_method(self, fn) if site.at == "method" else attach(site, fn)
                stack.callback(handle.remove)
            yield


# ----------------------------------------------------------------------------------------------- the head
class _MethodHandle:
    def __init__(self, model: nn.Module, fn: Callable) -> None:
        self.model, self.fn = model, fn

    def remove(self) -> None:
        fns = self.model.__dict__.get("_head_hooks", [])
        if self.fn in fns:
            fns.remove(self.fn)
        if not fns:
            self.model.__dict__.pop("_head_hooks", None)
            self.model.__dict__.pop("forward_head", None)  # the class's forward_head again


def _attach_method(model: nn.Module, fn: Callable[[Tensor], Tensor | None]) -> _MethodHandle:
    """``fn`` on what ``model.forward_head`` returns (not with ``pre_logits``): the method wrapped on the instance
    while any such hook is attached (the ``forward_head`` of every family, whatever calls it: ``forward``,
    ``generate``'s decoding step)."""
    fns = model.__dict__.setdefault("_head_hooks", [])
    if "forward_head" not in model.__dict__:
        plain = type(model).forward_head.__get__(model)

        def forward_head(z: Tensor, pre_logits: bool = False) -> Tensor:
            out = plain(z, pre_logits)
            if pre_logits:
                return out
            for hook in list(model.__dict__.get("_head_hooks", ())):
                new = hook(out)
                out = out if new is None else new
            return out

        model.__dict__["forward_head"] = forward_head
    fns.append(fn)
    return _MethodHandle(model, fn)


# ----------------------------------------------------------------------------------------------- edits
def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def _arity(fn: Callable) -> int:
    """1 or 2: whether ``fn`` takes the hook besides the value."""
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
    except (TypeError, ValueError):  # a builtin without a signature: one argument
        return 1
    return 2 if len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params) else 1


def _checked(name: str, edit: Callable[..., Tensor | None]) -> Callable[[Tensor], Tensor | None]:
    """``edit`` called with the value (and the :class:`Hook`), its result checked: None, or a tensor of the value's
    shape and dtype (one line naming the hook and both otherwise)."""
    if not callable(edit):
        raise ValueError(f"the edit of {name} is a {type(edit).__name__}, not a function; pass e.g. ablate([3])")
    hook, two = Hook(name, _layer_of(name)), _arity(edit) == 2

    def run(value: Tensor) -> Tensor | None:
        new = edit(value, hook) if two else edit(value)
        if new is None:
            return None
        if not isinstance(new, Tensor) or new.shape != value.shape or new.dtype != value.dtype:
            got = f"{tuple(new.shape)} {new.dtype}" if isinstance(new, Tensor) else type(new).__name__
            raise ValueError(
                f"the edit of {name} returned {got}, but the value there is {tuple(value.shape)} {value.dtype}; "
                "return a tensor of the value's shape and dtype"
            )
        return new

    return run


def _index_mask(value: Tensor, index: int | Sequence[int] | Tensor, axis: int) -> Tensor:
    """A ``value``-broadcastable boolean mask, True at ``index`` along ``axis`` (checked against its size when
    given as numbers: a tensor index is not read back from the device)."""
    axis = axis % value.ndim
    size = value.shape[axis]
    if not isinstance(index, Tensor):
        index = [index] if isinstance(index, int) else [int(i) for i in index]
        if not all(-size <= i < size for i in index):
            raise ValueError(f"index {index} is outside axis {axis} of size {size}; pass 0..{size - 1}")
        index = [i % size for i in index]
    idx = torch.as_tensor(index, device=value.device, dtype=torch.long).reshape(-1)
    mask = torch.zeros(size, dtype=torch.bool, device=value.device).index_fill(0, idx, True)
    return mask.view([size if d == axis else 1 for d in range(value.ndim)])


def ablate(index: int | Sequence[int] | Tensor, *, axis: int = -1) -> Callable[[Tensor], Tensor]:
    """Zero the entries ``index`` along ``axis``: atoms of a ``code``, units of ``mlp.hidden`` (the last axis,
    the default), heads of ``attn.qkv`` / ``attn.pattern`` (``axis=1``)."""
    return scale(index, 0.0, axis=axis)


def scale(index: int | Sequence[int] | Tensor, factor: float, *, axis: int = -1) -> Callable[[Tensor], Tensor]:
    """Multiply the entries ``index`` along ``axis`` by ``factor`` (the others unchanged)."""

    def edit(value: Tensor) -> Tensor:
        mask = _index_mask(value, index, axis)
        return torch.where(mask, value * factor, value)

    return edit


def multiply(factor: Tensor) -> Callable[[Tensor], Tensor]:
    """Multiply the value by ``factor``, broadcast against it: per-sample ablations in one batch (``factor`` of
    shape ``(b, 1, m)`` with a 0 at the atom each sample ablates)."""

    def edit(value: Tensor) -> Tensor:
        return value * factor.to(value.device, value.dtype)

    return edit


def set_value(new: Tensor | float) -> Callable[[Tensor], Tensor]:
    """Replace the value by ``new`` (a number or a tensor broadcast to the value's shape, cast to its dtype)."""

    def edit(value: Tensor) -> Tensor:
        return torch.as_tensor(new, device=value.device, dtype=value.dtype).expand_as(value).clone()

    return edit


def patch(cache: Mapping[str, Tensor], name: str | None = None) -> Callable[[Tensor, Hook], Tensor]:
    """Activation patching: replace the value by the same hook's value in ``cache`` (another input's
    :meth:`Hooked.run_with_cache`), or by ``cache[name]``; cast to the value's dtype, its shape must match."""

    def edit(value: Tensor, hook: Hook) -> Tensor:
        source = cache[name or hook.name]
        if source.shape != value.shape:
            raise ValueError(
                f"the patch for {hook.name} has shape {tuple(source.shape)}, the value {tuple(value.shape)}; "
                "record the cache on inputs of the same shape"
            )
        return source.to(value.device, value.dtype)

    return edit


def steer(direction: Tensor, alpha: float = 1.0, *, positions: Sequence[int] | None = None) -> Callable:
    """Steering: add ``alpha · direction`` (the last axis's length, e.g. a dictionary atom ``D[:, j]``) to every
    token, or to the token positions ``positions`` (axis −2) only."""

    def edit(value: Tensor) -> Tensor:
        add = (alpha * direction).to(value.device, value.dtype)
        if positions is None:
            return value + add
        return value + _index_mask(value, positions, -2) * add

    return edit
