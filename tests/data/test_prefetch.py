"""data/prefetch.py: the next batch's copy to the device behind the current step, the same batches in the same
order, page-locked buffers reused rather than allocated per batch; on a CPU nothing changes."""

from __future__ import annotations

import torch

from crate_transformer.data.prefetch import HostBuffers, prefetch


def _batches(n: int = 7, last: int = 3) -> list[tuple[torch.Tensor, dict]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        b = last if i == n - 1 else 4
        x = torch.randint(0, 256, (b, 3, 8, 8), generator=g, dtype=torch.uint8)
        out.append((x, {"y": torch.arange(b) + i, "tag": f"b{i}"}))
    return out


def test_on_a_cpu_the_prefetcher_yields_the_iterators_own_batches() -> None:
    batches = _batches()
    got = list(prefetch(iter(batches), "cpu"))
    assert len(got) == len(batches) and all(a is b for a, b in zip(got, batches, strict=True))


def test_on_meta_every_batch_is_staged_moved_and_in_order_with_two_buffers_per_tensor() -> None:
    batches, buffers = _batches(), HostBuffers(pin=False)
    staged: list[torch.Tensor] = []
    stage = buffers.stage

    def spy(t: torch.Tensor, position: int, slot: int) -> torch.Tensor:
        out = stage(t, position, slot)
        staged.append(out.clone())
        return out

    buffers.stage = spy  # type: ignore[method-assign]
    got = list(prefetch(iter(batches), "meta", buffers=buffers))
    assert [b[1]["tag"] for b in got] == [b[1]["tag"] for b in batches]
    assert all(b[0].device.type == "meta" and b[1]["y"].device.type == "meta" for b in got)
    assert [tuple(b[0].shape) for b in got] == [tuple(b[0].shape) for b in batches]
    # the staged host copies are the batches' values, in order: x, then y of each batch
    want = [t for x, d in batches for t in (x, d["y"])]
    assert len(staged) == len(want) and all(torch.equal(a, b) for a, b in zip(staged, want, strict=True))
    # two slots per tensor position for the 6 full batches, one new buffer per position for the short last one
    assert buffers.allocations == 2 * 2 + 2
