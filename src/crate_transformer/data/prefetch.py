"""The next batch on its way to the device while the current step runs.

:func:`prefetch` wraps a batch iterator (tensors, or tuples/lists/dicts of them, on the host).  On a GPU it copies
batch ``i + 1`` into page-locked host buffers that are reused from batch to batch (no page-locked allocation per
batch), then onto the device on a side CUDA stream with ``non_blocking`` copies, while the step of batch ``i`` is
queued on the main stream; the step waits for its batch's copy (``wait_event``) and each device tensor is marked as
used by the main stream (``record_stream``), so the caching allocator does not hand its memory out before the step is
done.
The batches are the same values in the same order as the iterator's; nothing random is drawn, so a resumed run is
unchanged.  On a CPU it yields the iterator's own batches (nothing changes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

__all__ = ["HostBuffers", "prefetch"]


def _map(batch: Any, fn: Callable[[Tensor, int], Tensor], counter: list[int]) -> Any:
    """``batch`` with ``fn(tensor, position)`` for each tensor leaf (positions numbered depth first)."""
    if isinstance(batch, Tensor):
        counter[0] += 1
        return fn(batch, counter[0] - 1)
    if isinstance(batch, tuple | list):
        return type(batch)(_map(b, fn, counter) for b in batch)
    if isinstance(batch, dict):
        return {k: _map(v, fn, counter) for k, v in batch.items()}
    return batch


class HostBuffers:
    """``slots`` staging buffers per tensor position of a batch, page-locked when ``pin``, reused while the shape and
    dtype stay the same; ``allocations`` counts the buffers made.  Before a slot is refilled the copy that last read
    it must be finished: its ``done`` event is waited for (a copy two batches old, long finished on a busy GPU)."""

    def __init__(self, pin: bool, slots: int = 2) -> None:
        self.pin, self.slots, self.allocations = pin, slots, 0
        self.buffers: dict[tuple[int, int], Tensor] = {}
        self.done: list[Any] = [None] * slots

    def stage(self, t: Tensor, position: int, slot: int) -> Tensor:
        """``t`` copied into the buffer of (``position``, ``slot``)."""
        buf = self.buffers.get((position, slot))
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin)
            self.buffers[(position, slot)] = buf
            self.allocations += 1
        return buf.copy_(t)

    def wait(self, slot: int) -> None:
        if self.done[slot] is not None:
            self.done[slot].synchronize()


def prefetch(
    batches: Iterable[Any], device: torch.device | str, *, buffers: HostBuffers | None = None
) -> Iterator[Any]:
    """``batches`` on ``device``, each copied while the previous one is in use (module docstring).  A CPU device
    yields the iterator's own batches; any other device gets the staged copies (``meta`` exercises the path without
    a GPU: no streams, unpinned buffers)."""
    device = torch.device(device)
    if device.type == "cpu":
        yield from batches
        return
    cuda = device.type == "cuda"
    buffers = buffers if buffers is not None else HostBuffers(pin=cuda)
    side = torch.cuda.Stream(device) if cuda else None
    pending, slot = None, 0
    for batch in batches:
        buffers.wait(slot)
        with torch.cuda.stream(side) if cuda else nullcontext():
            moved = _map(batch, lambda t, i, s=slot: _copy(t, i, s, buffers, device), [0])
            event = side.record_event() if cuda else None
            buffers.done[slot] = event
        if pending is not None:
            yield _ready(*pending)
        pending, slot = (moved, event), (slot + 1) % buffers.slots
    if pending is not None:
        yield _ready(*pending)


def _copy(t: Tensor, position: int, slot: int, buffers: HostBuffers, device: torch.device) -> Tensor:
    if t.device.type != "cpu":
        return t
    return buffers.stage(t, position, slot).to(device, non_blocking=True)


def _ready(batch: Any, copied: Any) -> Any:
    """The main stream waits for this batch's copies (the event ``copied`` on the side stream, not the next batch's
    copy queued after it); each tensor is marked as used by the main stream."""
    if copied is None:
        return batch
    main = torch.cuda.current_stream()
    main.wait_event(copied)

    def mark(t: Tensor, _: int) -> Tensor:
        t.record_stream(main)
        return t

    return _map(batch, mark, [0])
