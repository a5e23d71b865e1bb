"""Hook sites: where a layer's intermediate values are read and replaced (``model.run_with_cache``,
``model.intervene``; :mod:`crate_transformer.models.hooks`).

A **site** (:class:`Site`) names a value by the module that carries it: what the module returns (``"output"``) or
the first argument it is called with (``"input"``), seen through a ``read`` (e.g. a head axis put on the flat
projections ``U_kᵀ LN(Z)``) and written back through a ``write``.  Each layer class says which sites it has
(``hook_sites()``: :class:`~crate_transformer.layers.EncoderLayer`, :class:`~crate_transformer.layers.DecoderLayer`
and their attentions), so every family built of these layers gets the same names, read off its layers.

A value that no module returns gets a :class:`HookPoint`, an identity module called where the value is formed
(Z^{ℓ+1/2} in :class:`~crate_transformer.layers.EncoderLayer`; the attention pattern, formed only while hooked).
Hooks are PyTorch's own forward hooks (:func:`attach`): a site with nothing attached costs nothing beyond the
module call it already was, and other tools that address modules (nnsight, PyTorch hooks of one's own) see the
same modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from . import _hook_state

__all__ = ["HookPoint", "Site", "attach", "attention_sites", "heads_site", "code_site", "hooked"]

Edit = Callable[[Tensor], "Tensor | None"]


class HookPoint(nn.Module):
    """The identity, called at a value that no other module returns, so that hooks (and nnsight) can read and
    replace it there.  No parameters, no buffers: state dicts are unchanged."""

    def forward(self, x: Tensor) -> Tensor:
        return x


def hooked(module: nn.Module) -> bool:
    """Whether a hook session of this package is attached now and ``module`` has a forward hook: the attention
    forms its pattern only then.  Reads the hook key (:mod:`._hook_state`), so a compiled graph is guarded on it."""
    return _hook_state.key != 0 and bool(module._forward_hooks or module._forward_pre_hooks)


def _first(args: tuple, kwargs: dict, out: Any) -> Tensor:
    return args[0] if args else next(iter(kwargs.values()))


def _output(args: tuple, kwargs: dict, out: Any) -> Tensor:
    return out


def _replace(args: tuple, kwargs: dict, out: Any, new: Tensor) -> Tensor:
    return new


@dataclass(frozen=True)
class Site:
    """Where a named value is: ``module``'s output (``at="output"``) or its first argument (``at="input"``).

    ``read(args, kwargs, out)`` gives the value from the module's call (``out`` None for an input) and
    ``write(args, kwargs, out, new)`` what the module returns (or is called with) instead when the value is
    replaced by ``new``.  ``read_only``: why the value cannot be replaced ("" when it can)."""

    module: nn.Module
    at: str = "output"
    read: Callable[[tuple, dict, Any], Tensor] | None = None
    write: Callable[[tuple, dict, Any, Tensor], Tensor] = _replace
    read_only: str = ""

    def value(self, args: tuple, kwargs: dict, out: Any) -> Tensor:
        """The value at this site during one call of the module."""
        if self.read is not None:
            return self.read(args, kwargs, out)
        return _first(args, kwargs, out) if self.at == "input" else out


def heads_site(linear: nn.Module, heads: int, part: int = 0, parts: int = 1) -> Site:
    """The projections a ``linear`` map computes for every head, seen as ``(b, K, n, p)``: its output ``(b, n,
    parts·K·p)`` holds ``parts`` projections side by side (1: CRATE's ``U_kᵀ z``, query, key and value at once;
    3: a standard attention's ``q, k, v``), of which this site is number ``part``."""

    def split(out: Tensor) -> Tensor:
        b, n = out.shape[:2]
        return out.view(b, n, parts, heads, -1)[:, :, part].transpose(1, 2)

    def join(args: tuple, kwargs: dict, out: Tensor, new: Tensor) -> Tensor:
        b, n = out.shape[:2]
        flat = new.transpose(1, 2).reshape(b, n, -1)
        if parts == 1:
            return flat
        chunks = list(out.view(b, n, parts, -1).unbind(2))
        chunks[part] = flat
        return torch.stack(chunks, dim=2).reshape(b, n, -1)

    return Site(linear, "output", lambda args, kwargs, out: split(out), join)


def code_site(module: nn.Module, kind: str) -> Site:
    """A second block's units at its :meth:`~crate_transformer.layers.sparse.SecondBlock.code_site`: the module's
    output (ISTA's code, eq. (44); the MLP's GELU units), or for the overcomplete ISTA (``"odl"``,
    ``"ista_overcomplete"``) the code ``A2`` its ``code`` computes inside, read again from the block's input and,
    when replaced, decoded as the block does (``A2 D1ᵀ``, ``A2 Dᵀ`` when tied) — the block's own output is then
    not used."""
    if kind not in ("odl", "ista_overcomplete"):
        return Site(module)

    def decode(args: tuple, kwargs: dict, out: Tensor, new: Tensor) -> Tensor:
        return new @ (module.D if module.D1 is None else module.D1).T

    return Site(module, "output", lambda args, kwargs, out: module.code(_first(args, kwargs, out)), decode)


def attention_sites(attn: nn.Module) -> dict[str, Site]:
    """The sites of a layer's attention: its own ``hook_sites()`` (MSSA, MHSA), or for another attention (ToST's
    TSSA) its projections ``qkv`` with a head axis, its ``attention_map`` of what it reads (``pattern``, read
    only: computed beside the forward, which applies no such matrix) and its output (``out``)."""
    own = getattr(attn, "hook_sites", None)
    if callable(own):
        return own()
    sites = {}
    if isinstance(getattr(attn, "qkv", None), nn.Linear):
        sites["qkv"] = heads_site(attn.qkv, attn.heads)
    if callable(getattr(attn, "attention_map", None)):
        why = f"{type(attn).__name__} applies no n x n pattern (its forward reads token statistics); edit its qkv"
        sites["pattern"] = Site(attn, "input", lambda args, kwargs, out: _pattern(attn, args, kwargs), read_only=why)
    sites["out"] = Site(attn)
    return sites


def _pattern(attn: nn.Module, args: tuple, kwargs: dict) -> Tensor:
    if kwargs.get("cache") is not None:
        raise ValueError(
            f"the pattern of {type(attn).__name__} is read without a key-value cache; record it on a whole sequence"
        )
    return attn.attention_map(_first(args, kwargs, None))


def attach(site: Site, fn: Edit) -> RemovableHandle:
    """A forward hook on ``site.module`` calling ``fn(value)`` at every call; a tensor it returns replaces the value
    (written back through ``site.write``), None leaves it.  Removed by the handle's ``remove()``."""
    if site.at == "input":

        def pre(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            new = fn(site.value(args, kwargs, None))
            if new is None:
                return None
            return (site.write(args, kwargs, None, new), *args[1:]), kwargs

        return site.module.register_forward_pre_hook(pre, with_kwargs=True)

    def post(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> Any:
        new = fn(site.value(args, kwargs, out))
        return None if new is None else site.write(args, kwargs, out, new)

    return site.module.register_forward_hook(post, with_kwargs=True)
