"""Sharded data parallelism (``--strategy fsdp``): PyTorch's ``fully_shard`` (FSDP2) for models too large to
replicate on every process.

Every transformer block (each element of every ``nn.ModuleList``: the encoder layers, an MAE's decoder layers)
becomes one FSDP unit and the root (embeddings, norms, head) another: each of N processes keeps 1/N of every
parameter, gradient and optimizer state (as ``DTensor`` shards) and all-gathers one block's weights just before
its forward and backward (ZeRO stage 3).  The engine (:mod:`.loop`) uses this module in four places:

* start: the checkpoint's weights are loaded into the *unsharded* model, then :func:`shard`, then the optimizer
  is built from the sharded parameters and given the checkpoint's optimizer state (:func:`load_optimizer_state`);
* accumulation: :func:`no_sync` skips the gradient reduce-scatter on all but the last chunk;
* checkpoints: :func:`full_state_dict` and :func:`full_optimizer_state` gather full weights and the full,
  parameter-name-keyed optimizer state (collectives on every process; rank 0 writes), so a checkpoint does not
  depend on the number of processes and loads in one process like any other;
* evaluation, per-step hooks and the final save run on a :class:`Replica`: a plain, unsharded copy of the
  model filled from the gathered weights on every process and dropped afterwards.  Its forward has no
  collectives, so processes that evaluate different numbers of batches cannot deadlock; the price is one full
  copy of the weights per process (4 bytes a parameter in fp32) while it exists.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import OptionError

__all__ = [
    "STRATEGIES",
    "check_strategy",
    "shard",
    "is_sharded",
    "no_sync",
    "all_finite",
    "full_state_dict",
    "full_optimizer_state",
    "load_optimizer_state",
    "Replica",
]

STRATEGIES = ("ddp", "fsdp")


def check_strategy(strategy: str, world: int, task_name: str, shardable: bool = True) -> None:
    """A one-line error for ``--strategy fsdp`` where it cannot shard: one process, or a task that trains more
    than its model (DINO's teacher follows the student's full weights)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if strategy != "fsdp":
        return
    if world < 2:
        raise OptionError(
            "strategy='fsdp' shards the model over processes and this is one process; start it with torchrun (one "
            "process per GPU), or use strategy='ddp' (also to resume an FSDP run in one process: its checkpoint "
            "holds the full weights)"
        )
    if not shardable:
        raise OptionError(f"task={task_name!r} cannot train with strategy='fsdp'; use strategy='ddp'")


def shard(model: nn.Module, *, methods: Iterable[str] = (), amp_dtype: torch.dtype | None = None) -> nn.Module:
    """Apply ``fully_shard`` to each element of every ``nn.ModuleList`` of ``model``, then to ``model`` itself (in
    place; the module is returned).  Parameter names are unchanged.

    ``methods``: the model's methods besides ``forward`` that a loss calls (e.g. ``classify``): FSDP gathers the
    root's weights for them too.  ``amp_dtype`` (the run's mixed precision): the gathered weights are cast to it
    for the computation, so the all-gathers carry half as many bytes, while the gradients are reduced and the
    shards kept in float32 (FSDP2's ``MixedPrecisionPolicy``; autocast still runs the ops it keeps in float32).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    policy = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32 if amp_dtype else None)
    for module in reversed(list(model.modules())):  # inner units before the ones holding them, as FSDP needs
        if isinstance(module, nn.ModuleList):
            for block in module:
                fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    for name in methods:
        register_fsdp_forward_method(model, name)
    return model


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Accumulate gradients locally (no all-reduce / reduce-scatter) inside the block: DDP's ``no_sync`` or FSDP's
    ``set_requires_gradient_sync(False)`` (``model``: the DDP module, or the sharded model itself).  With FSDP the
    accumulated gradients are unsharded until the last chunk reduces them."""
    model = getattr(model, "_orig_mod", model)  # under torch.compile
    if not is_sharded(model):
        with model.no_sync():
            yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def _local(t: Tensor) -> Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def all_finite(params: Iterable[Tensor], rt: Any) -> bool:
    """True on every process when every parameter is finite: each process checks its own shards and the verdict
    is all-reduced (``rt``: the :class:`~.runtime.Runtime`)."""
    bad = not all(torch.isfinite(_local(p)).all() for p in params)
    return not rt.any(bad)


def _options(everywhere: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # cpu_offload=True gathers onto rank 0 only (others get {}): what a checkpoint needs, and no full copy elsewhere
    return StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)


def full_state_dict(model: nn.Module, everywhere: bool = False) -> dict[str, Tensor]:
    """The full (unsharded) weights of a sharded ``model``, keyed as the unsharded model's ``state_dict``.

    A collective: every process calls it.  ``everywhere=False``: on rank 0, on the CPU ({} elsewhere);
    ``everywhere=True``: on every process, on the model's device.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(everywhere))


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's full state keyed by parameter name (``{"state": {name: ...}, "param_groups": [...]}``), on
    rank 0 and on the CPU ({} elsewhere): independent of the number of processes.  A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options(False))


def load_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """Give the optimizer of the sharded ``model`` its slice of a full ``state`` (every process passes the whole of
    it): keyed by parameter name, or by index as a ``--strategy ddp`` run saves it.  Returns
    ``optimizer.state_dict()``, this process's shards in the optimizer's own format."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if any(not isinstance(k, str) for g in state["param_groups"] for k in g["params"]):
        state = _by_name(model, optimizer, state)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=state, options=StateDictOptions(full_state_dict=True))
    return optimizer.state_dict()


def _by_name(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """An index-keyed optimizer state dict keyed by parameter name instead: index i is the i-th parameter of the
    optimizer's groups, which the engine builds in the same order whatever the strategy."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    if sum(len(g["params"]) for g in state["param_groups"]) != len(order):
        raise ValueError("the checkpoint's optimizer state does not match this model's parameters; resume it as saved")
    return {
        "state": {order[i]: v for i, v in state["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
    }


class Replica:
    """Plain, unsharded copies of a model on demand: :meth:`of` a sharded model gathers its full weights on every
    process into a fresh copy of the skeleton taken here (before sharding) with parameters on the ``meta`` device,
    so the skeleton itself holds no weights (only the buffers)."""

    def __init__(self, model: nn.Module) -> None:
        memo = {id(p): nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) for p in model.parameters()}
        self.skeleton = copy.deepcopy(model, memo)  # the memo maps each parameter (tied ones once) to a meta one

    def of(self, sharded: nn.Module) -> nn.Module:
        """A plain module with ``sharded``'s current weights and train/eval mode (a collective)."""
        module = copy.deepcopy(self.skeleton)
        module.load_state_dict(full_state_dict(sharded, everywhere=True), assign=True)
        return module.train(sharded.training)

    @contextmanager
    def swapped_in(self, owner: Any, sharded: nn.Module) -> Iterator[nn.Module]:
        """``owner.model`` is a replica of ``sharded`` inside the block (a task evaluates or saves it)."""
        replica = self.of(sharded)
        saved, owner.model = owner.model, replica
        try:
            yield replica
        finally:
            owner.model = saved
