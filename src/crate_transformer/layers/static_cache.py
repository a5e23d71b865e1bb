"""A decoding cache of fixed size, for a decoding step that compiles once (``generate(..., compile=True)``).

The ordinary cache of a causal layer is a dict that grows by one token per step (``torch.cat``): every step has
new shapes, which a compiled step would recompile for.  A :class:`StaticCache` holds, per layer, buffers allocated
once for the whole generation and a position ``pos`` that is a 0-d tensor on the device, so one step's graph
serves every token:

* a layer whose cache is per token (CRATE's MSSA: ``"w"``; MHSA: ``"k"`` and ``"v"``) writes the new token's
  entry in place at ``pos`` (``index_copy_`` with a tensor index, :meth:`StaticLayerCache.append`) and attends
  over the whole buffer, with :attr:`StaticLayerCache.key_mask` hiding the positions not yet filled;
* a layer whose cache is a constant-size state (ToST's causal TSSA: running sums and a ``"length"`` count)
  reads its entries and writes them back in place; its ``"length"`` is ``pos``, which only the owner advances.

The layers keep their dict interface (``cache[key]``, ``key in cache``, ``cache.get``, ``cache[key] = value``),
so the same layer code runs with either cache.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import torch
from torch import Tensor

__all__ = ["StaticLayerCache", "StaticCache", "LENGTH"]

LENGTH = "length"  # a constant-size cache's count of the tokens it has seen (ToST's TSSA)


class StaticLayerCache:
    """One layer's buffers (see the module docstring).  ``per_token``: the buffers have a token axis (-2) of
    ``capacity`` positions, of which ``0 .. pos`` are filled; else they are a constant-size state."""

    def __init__(self, buffers: dict[str, Tensor], pos: Tensor, per_token: bool) -> None:
        self.buffers, self.pos, self.per_token = buffers, pos, per_token

    def append(self, key: str, new: Tensor) -> Tensor:
        """Write ``new`` (b, K, m, p) at positions ``pos .. pos + m − 1`` of buffer ``key``; the whole buffer."""
        buf = self.buffers[key]
        index = self.pos + torch.arange(new.shape[-2], device=buf.device)
        return buf.index_copy_(buf.dim() - 2, index, new.to(buf.dtype))

    @property
    def key_mask(self) -> Tensor | None:
        """``(1, capacity)``, True at the filled positions ``≤ pos`` (the new token's included), for the
        attention's ``key_mask``; None for a constant-size state, which attends to no buffer."""
        if not self.per_token:
            return None
        capacity = next(iter(self.buffers.values())).shape[-2]
        return (torch.arange(capacity, device=self.pos.device) <= self.pos)[None]

    def __getitem__(self, key: str) -> Tensor:
        return self.pos if key == LENGTH else self.buffers[key]

    def __contains__(self, key: str) -> bool:
        return key == LENGTH or key in self.buffers

    def get(self, key: str, default: object = None) -> object:
        return self[key] if key in self else default

    def __setitem__(self, key: str, value: Tensor) -> None:
        if key == LENGTH:  # the position is shared by every layer and advanced once per step by the owner
            return
        self.buffers[key].copy_(value)

    def values(self) -> Iterator[Tensor]:
        return iter(self.buffers.values())


class StaticCache(list):
    """One :class:`StaticLayerCache` per layer sharing the position ``pos`` (a 0-d int64 tensor)."""

    def __init__(self, layers: list[StaticLayerCache], pos: Tensor) -> None:
        super().__init__(layers)
        self.pos = pos

    @classmethod
    def from_dynamic(cls, cache: list[Mapping[str, object]], capacity: int) -> StaticCache:
        """Buffers of ``capacity`` positions holding what the growing dict ``cache`` holds (after a prompt's pass),
        with ``pos`` at the number of tokens it holds.  Every buffer is marked as a static address, so a CUDA graph
        writes into it in place."""
        tensors = [t for layer in cache for t in layer.values() if isinstance(t, Tensor)]
        pos = torch.zeros((), dtype=torch.long, device=tensors[0].device)
        layers = []
        for layer in cache:
            per_token = LENGTH not in layer
            buffers = {
                key: t.new_zeros(*t.shape[:-2], capacity, t.shape[-1]) if per_token else torch.zeros_like(t)
                for key, t in layer.items()
                if isinstance(t, Tensor)
            }
            for buf in (*buffers.values(), pos):
                torch._dynamo.mark_static_address(buf)
            layers.append(StaticLayerCache(buffers, pos, per_token))
        return cls(layers, pos).load(cache)

    @staticmethod
    def signature(cache: list[Mapping[str, object]], capacity: int) -> tuple:
        """What the buffers for ``cache`` look like (shapes but the token axis, dtypes, device): a cache of the
        same signature loads into the same buffers (:meth:`load`)."""
        return capacity, tuple(
            (key, t.shape[:-2] + t.shape[-1:] if LENGTH not in layer else t.shape, t.dtype, t.device)
            for layer in cache
            for key, t in layer.items()
            if isinstance(t, Tensor)
        )

    def load(self, cache: list[Mapping[str, object]]) -> StaticCache:
        """Copy what the growing dict ``cache`` holds into these buffers (same :meth:`signature`) and set ``pos``:
        the same addresses again, which a captured CUDA graph replays on without recording anew."""
        first = next(iter(cache[0].values()))
        self.pos.fill_(cache[0][LENGTH] if LENGTH in cache[0] else first.shape[-2])
        for static, layer in zip(self, cache):
            for key, t in layer.items():
                if isinstance(t, Tensor):
                    buf = static.buffers[key]
                    (buf[..., : t.shape[-2], :] if static.per_token else buf).copy_(t)
        return self

    def advance(self, n: int = 1) -> None:
        """Move the position past ``n`` tokens (in place: the same tensor, whatever a compiled step captured)."""
        self.pos.add_(n)
