"""Runtime.close frees a DDP module that is no longer in use before it destroys the process group (issue 52: freed
after, its C++ Reducer is the gloo group's last owner and destroys it holding the GIL, which can deadlock)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from crate_transformer.train.runtime import Runtime


def _dropped_ddp() -> weakref.ref:
    """A weak reference to the Reducer of a DDP module that has been used once, then dropped in a reference cycle
    (the first DDP module a process builds sits in one, through a closure; so may its owners)."""
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3))
    ddp(torch.randn(2, 3)).sum().backward()
    ddp.cycle = [ddp]  # made explicit here: whether DDP's own closure holds it depends on what ran before
    return weakref.ref(ddp.reducer)


def test_close_frees_an_unused_ddp_before_it_destroys_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    destroy = torch.distributed.destroy_process_group
    reducer_alive_at_destroy = []

    def recording_destroy(*args: object, **kwargs: object) -> None:
        reducer_alive_at_destroy.append(reducer() is not None)
        destroy(*args, **kwargs)

    monkeypatch.setattr(torch.distributed, "destroy_process_group", recording_destroy)
    gc.disable()  # the collector runs only when close() runs it
    try:
        reducer = _dropped_ddp()
        assert reducer() is not None  # in a cycle: dropping it does not free it
        Runtime(rank=0, world=2).close()  # world 2: close() acts as under torchrun (this group has 1 process)
    finally:
        gc.enable()
        if torch.distributed.is_initialized():
            destroy()
    assert reducer_alive_at_destroy == [False]
