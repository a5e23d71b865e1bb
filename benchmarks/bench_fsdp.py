"""Per-process training memory of DDP vs FSDP (``--strategy ddp|fsdp``) with 2 gloo processes on the CPU.

For each model, two ``torchrun --nproc_per_node 2`` jobs (one per strategy) build it as ``crate train`` does (DDP:
a full replica per process; FSDP: ``fully_shard`` per transformer block, then the root, via
:func:`crate_transformer.train.sharding.shard`), take one AdamW step on a batch of one sample per process, and
report per process:

* the bytes of the local parameter, gradient and optimizer-state tensors (deterministic: for FSDP the local shards;
  DDP's gradient buckets, another copy of the gradients, are not counted here), and
* the peak resident set size of the process (``ru_maxrss``: everything, including activations, DDP's buckets,
  FSDP's all-gathered blocks and the Python runtime).

Models too large to train twice on the machine (``--formula``) are given by the formula the measured rows follow,
from their parameter count on the meta device: AdamW in fp32 holds 16 bytes per parameter (weights, gradient,
two moments), all of it on every DDP process and 1/N of it on each of N FSDP processes.  Not a test.

    python benchmarks/bench_fsdp.py           # crate_large, crate_mae_large measured; gpt2_large by formula
    python benchmarks/bench_fsdp.py --models crate_base --formula crate_large
    python benchmarks/bench_fsdp.py --tiny    # the digits models crate_mnist, crate_mae_mnist measured (a slow test)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys

import torch
from _common import Arguments

WORLD = 2


def _batch(model: torch.nn.Module) -> torch.Tensor:
    c = model.config
    if hasattr(c, "block_size"):  # a language model: a short random token sequence
        return torch.randint(0, c.vocab_size, (1, 64))
    return torch.randn(1, c.in_chans, c.image_size, c.image_size)


def _loss(out: object) -> torch.Tensor:
    out = getattr(out, "loss", out)  # MAE returns (loss, pred, mask)
    return out.float().pow(2).mean() if out.ndim else out


def _local_bytes(tensors: list[torch.Tensor]) -> int:
    from torch.distributed.tensor import DTensor

    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def worker(name: str, strategy: str) -> None:
    """One process of a 2-process job: build, shard or wrap, one AdamW step, print the measurements (rank 0)."""
    import torch.distributed as dist

    from crate_transformer.models.registry import create_model
    from crate_transformer.train.sharding import shard

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = create_model(name)
    n_params = sum(p.numel() for p in model.parameters())
    if strategy == "fsdp":
        model = shard(model)
        wrapped = model
    else:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _loss(wrapped(_batch(model))).backward()
    opt.step()
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    sizes = {"params": _local_bytes(params), "grads": _local_bytes([p.grad for p in params if p.grad is not None]),
             "optimizer": _local_bytes(state)}  # fmt: skip
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0])  # kB on Linux
    dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(json.dumps({"model": name, "strategy": strategy, "n_params": n_params, **sizes, "rss": rss.item()}))
    # DDP's Reducer freed after the group is destroyed aborts or hangs gloo's teardown (Runtime.close says why)
    del wrapped, model, opt, params, state
    gc.collect()
    dist.destroy_process_group()


def measure(name: str, strategy: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}", __file__,
           "--worker", name, strategy]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{name} {strategy} failed:\n{out.stderr[-3000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def formula(name: str, strategy: str) -> dict:
    from crate_transformer.models.registry import create_model

    with torch.device("meta"):
        n = sum(p.numel() for p in create_model(name).parameters())
    per = 4 * n if strategy == "ddp" else 4 * -(-n // WORLD)
    return {"model": name, "strategy": strategy, "n_params": n, "params": per, "grads": per, "optimizer": 2 * per,
            "rss": None}  # fmt: skip


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["crate_large", "crate_mae_large"], help="measured")
    p.add_argument("--formula", nargs="*", default=["gpt2_large"], help="computed from the parameter count")
    p.add_argument("--tiny", action="store_true", help="measure the small digits models (crate_mnist, crate_mae_mnist)")
    p.add_argument("--worker", nargs=2, metavar=("MODEL", "STRATEGY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(*args.worker)
    if args.tiny:  # the same launches, sharding and table: a language model by formula
        args.models = ["crate_mnist", "crate_mae_mnist"]
    rows = [measure(m, s) for m in args.models for s in ("ddp", "fsdp")]
    rows += [formula(m, s) for m in args.formula for s in ("ddp", "fsdp")]
    gb = 1e9
    print(f"{WORLD} gloo processes on the CPU, fp32 AdamW, torch {torch.__version__}; per process, GB (1e9 bytes)")
    print("| model | params | strategy | weights | gradients | optimizer | total | peak RSS |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        total = r["params"] + r["grads"] + r["optimizer"]
        rss = f"{r['rss'] / gb:.2f}" if r["rss"] is not None else "(formula)"
        print(f"| {r['model']} | {r['n_params'] / 1e6:.1f}M | {r['strategy']} | {r['params'] / gb:.3f} | "
              f"{r['grads'] / gb:.3f} | {r['optimizer'] / gb:.3f} | {total / gb:.3f} | {rss} |")  # fmt: skip


if __name__ == "__main__":
    main()
