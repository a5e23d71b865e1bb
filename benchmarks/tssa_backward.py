"""TSSA's two backward paths, forward+backward on the CPU: ``memory_saving=True`` (the hand-derived backward of
``layers/_tssa_functions.py``, the default) against ``memory_saving=False`` (autograd of the operator as
``layers/tssa.py`` writes it), at the sizes people train ToST at (width 384, 6 heads, batch 8-32, 197-1024 tokens).

Each row times the two paths interleaved (``--repeats`` rounds of one step each, after a warm-up of each), so a
change of the machine's load falls on both; the table prints the median seconds of each and the median of the
rounds' ratios (saving / plain, each round's two steps side by side: below 1 the hand-derived backward is faster),
and the bytes autograd keeps between forward and backward for each (``bench_tost.saved_bytes``: the activation
memory, the same on any device) with their ratio.  The load (``uptime``) is printed before and after.
``python benchmarks/tssa_backward.py`` (defaults: the table in ``docs/speed.md``); ``--tiny`` one small row.
"""

from __future__ import annotations

import importlib.util
import statistics
import subprocess
import time
from pathlib import Path

import torch
from _common import POSITIVE, Arguments

from crate_transformer.layers import TSSA

ROWS = ((8, 197, False), (32, 197, False), (8, 1024, False), (32, 1024, False), (8, 256, True), (8, 1024, True))


def _saved_bytes():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("bench_tost", Path(__file__).with_name("bench_tost.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.saved_bytes


def step_seconds(op: TSSA, x: torch.Tensor, grad: torch.Tensor) -> float:
    """One forward and backward of ``op`` (training mode), in seconds."""
    start = time.perf_counter()
    op(x).backward(grad)
    return time.perf_counter() - start


def row(b: int, n: int, causal: bool, dim: int, heads: int, repeats: int) -> dict[str, float]:
    """Median seconds and kept bytes of both paths for one size, timed interleaved."""
    torch.manual_seed(0)
    op = TSSA(dim, heads, dim // heads, qkv_bias=True, causal=causal, block_size=n).train()
    x, grad = torch.randn(b, n, dim, requires_grad=True), torch.randn(b, n, dim)
    times: dict[bool, list[float]] = {True: [], False: []}
    kept = {}
    for saving in (True, False):  # warm-up, and the kept bytes
        op.memory_saving = saving
        step_seconds(op, x, grad)
        kept[saving] = _saved_bytes()(op, x)
    for _ in range(repeats):
        for saving in (True, False):
            op.memory_saving = saving
            times[saving].append(step_seconds(op, x, grad))
    # the ratio of each round's two steps, taken side by side: a change of load between rounds falls on both
    ratio = statistics.median(s / p for s, p in zip(times[True], times[False], strict=True))
    t_save, t_plain = statistics.median(times[True]), statistics.median(times[False])
    return {"saving_s": t_save, "plain_s": t_plain, "ratio": ratio, "saving_mib": kept[True] / 2**20,
            "plain_mib": kept[False] / 2**20}  # fmt: skip


def main() -> None:
    ap = Arguments(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, range=POSITIVE, default=384)
    ap.add_argument("--heads", type=int, range=POSITIVE, default=6)
    ap.add_argument("--repeats", type=int, range=POSITIVE, default=5)
    ap.add_argument("--tiny", action="store_true", help="one small row (batch 2, 64 tokens), 3 repeats")
    args = ap.parse_args()
    rows = ((2, 64, False),) if args.tiny else ROWS
    repeats = 3 if args.tiny else args.repeats
    print("load before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, width {args.dim}, {args.heads} heads")
    head = f"{'form':<7} {'b':>3} {'n':>5} {'saving s':>9} {'plain s':>9} {'time ratio':>10}"
    print(head + f" {'saving MiB':>10} {'plain MiB':>10} {'mem ratio':>9}")
    for b, n, causal in rows:
        r = row(b, n, causal, args.dim, args.heads, repeats)
        form = "causal" if causal else "global"
        line = f"{form:<7} {b:>3} {n:>5} {r['saving_s']:>9.3f} {r['plain_s']:>9.3f} {r['ratio']:>10.2f}"
        print(line + f" {r['saving_mib']:>10.1f} {r['plain_mib']:>10.1f} {r['saving_mib'] / r['plain_mib']:>9.2f}")
    print("load after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
