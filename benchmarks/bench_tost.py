"""ToST's attention (TSSA) against CRATE's (MSSA) and softmax attention as the sequence grows, and ToST against
CRATE on the bundled digits.  Not a test: a test runs ``--tiny`` to keep it alive.

**Attention.**  One attention operator of width d = 384 with 8 heads of 48 (ToST-S / CRATE widths), batch 1, no
gradient, at n = 256 … 16,384 tokens:

* ``tssa`` — :class:`~crate_transformer.layers.TSSA` (linear in n);
* ``mssa`` — :class:`~crate_transformer.layers.MSSA` as the library runs it (PyTorch's
  ``scaled_dot_product_attention``, whose CPU kernel never holds the n × n matrix);
* ``mssa-matrix`` — MSSA computing the n × n score matrix, as the authors' CRATE code and ``return_attention`` do
  (measured up to 4,096 tokens: at 8,192 its K·n² scores alone take 2 GiB);
* ``softmax`` — standard attention with separate Q, K, V (:class:`~crate_transformer.layers.MHSA`, SDPA);
* ``linear`` — one ``d → d`` linear layer, the control: nothing in it depends on n, so its slope is what the
  machine does to any per-token operator as its tensors outgrow the caches (and the memory allocator hands back
  and faults in fresh pages), the floor against which TSSA's slope is read.

Tokens/s is the fastest of ``--repeats`` forwards, every operator at every length once in each repeat (load that
drifts during the run hits all of them and all lengths alike).  The fastest, not the median: on a shared machine
a longer forward is more likely to be preempted by other processes, which bends a median's slope upward, and the
fastest run is the least disturbed (the advice of ``timeit``'s documentation); the slope of the medians is
printed beside it.  Memory is the peak resident-set growth of one forward in a fresh process (Linux's ``VmHWM``
after it, reset just before, minus the resident size before it, the operator and its input already allocated), so
allocator caches of other sizes do not blur it; the probes run side by side, one per CPU, each reading only its own
peak.  The log-log slope of time and memory against n is fitted over n ≥ 1,024 (below, the n-independent
projections dominate), and the table gives each operator's time and memory relative to TSSA at every n.  A
second table gives the bytes each operator keeps for its backward (:func:`saved_bytes`, training mode, at
``--saved-lengths``), against MSSA's.

**Digits.**  ``--digits`` trains ``tost_mnist`` and ``crate_mnist_p4`` with the same recipe (``crate train``'s
defaults: the 4,000 / 1,000 bundled MNIST digits at 24 px), one at a time, for each seed, and prints test accuracy,
parameters and wall time.

    python benchmarks/bench_tost.py --tiny                      # seconds: small widths and lengths
    nice python benchmarks/bench_tost.py --threads 1            # the attention table (minutes)
    nice python benchmarks/bench_tost.py --threads 1 --digits   # plus ToST vs CRATE on the digits, seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
from _common import NON_NEGATIVE, POSITIVE, Arguments

OPS = ("tssa", "mssa", "mssa-matrix", "softmax", "linear")
MATRIX_LIMIT = 4096  # mssa-matrix beyond this: K·n² float32 scores of 1 GiB and more


def build(op: str, dim: int, heads: int) -> torch.nn.Module:
    from crate_transformer.layers import MHSA, MSSA, TSSA

    p = dim // heads
    if op == "tssa":
        return TSSA(dim, heads, p, qkv_bias=True).eval()
    if op == "softmax":
        return MHSA(dim, heads, 0.0, p).eval()
    if op == "linear":
        return torch.nn.Linear(dim, dim).eval()
    return MSSA(dim, heads, p).eval()


def forward(op: str, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if op == "mssa-matrix":  # the explicit (b, K, n, n) attention matrix, not the fused kernel
        w = module.project(x)
        mixed = torch.softmax(w @ w.transpose(-1, -2) * module.scale, -1) @ w
        return module.proj(mixed.transpose(1, 2).flatten(2))
    return module(x)


def _load() -> str:
    return " / ".join(f"{v:.1f}" for v in os.getloadavg())


def peak_memory(op: str, n: int, dim: int, heads: int, threads: int) -> float:
    """MiB of resident memory one forward adds, measured in a fresh process (``--probe``)."""
    argv = [sys.executable, __file__, "--probe", op, str(n), "--dim", str(dim), "--heads", str(heads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([*argv, "--threads", str(threads)], capture_output=True, text=True, env=env, check=True)
    return max(float(done.stdout.strip().splitlines()[-1]), 0.0)


def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` memory field in KiB: ``VmRSS`` (resident now) or ``VmHWM`` (the peak since the last
    reset).  Not ``ru_maxrss``, which keeps the parent's peak across fork and exec."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _probe(op: str, n: int, dim: int, heads: int) -> float:
    """The peak resident growth (MiB) of one forward of ``op`` on ``n`` tokens: the peak resident size during it
    minus the resident size before it (the operator, its input and its kernels already loaded; the peak reset by
    writing 5 to ``/proc/self/clear_refs``, Linux)."""
    torch.manual_seed(0)
    module, x = build(op, dim, heads), torch.randn(1, n, dim)
    with torch.no_grad():
        forward(op, module, x[:, :8])  # kernels and their workspaces loaded before the baseline
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = _status_kib("VmRSS")
        forward(op, module, x)
    return (_status_kib("VmHWM") - base) / 1024


def saved_bytes(module: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes that autograd keeps for the backward of ``module(x)``: the distinct storages of its saved tensors,
    the module's parameters left out.  The activation memory a training step holds between forward and backward,
    the same on any device (a CPU measures what a GPU would hold), in the dtypes the current autocast gives."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    kept: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            kept[t.untyped_storage().data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(t.untyped_storage().nbytes() for t in kept.values())


def saved_table(args: argparse.Namespace) -> None:
    """MiB kept for the backward by each operator (batch 1, float32, training mode) at ``--saved-lengths``."""
    ops = [op for op in args.ops if op in ("tssa", "mssa", "softmax")]
    torch.manual_seed(0)
    print(f"\nkept for the backward: width {args.dim}, {args.heads} heads, batch 1, float32 (autograd's saved tensors)")
    print(f"{'operator':<12} {'n':>6} {'MiB':>8} {'KiB/token':>9} {'vs mssa':>8}")
    for n in args.saved_lengths:
        x = torch.randn(1, n, args.dim, requires_grad=True)
        mib = {op: saved_bytes(build(op, args.dim, args.heads).train(), x) / 2**20 for op in ops}
        for op in ops:
            versus = f"{mib[op] / mib['mssa']:.2f}x" if "mssa" in mib else "-"
            print(f"{op:<12} {n:>6} {mib[op]:>8.2f} {1024 * mib[op] / n:>9.2f} {versus:>8}")


def time_ops(
    pairs: list[tuple[str, int]], dim: int, heads: int, repeats: int
) -> dict[tuple[str, int], tuple[float, float]]:
    """The fastest and the median seconds per forward of each (operator, n), every pair once per repeat: load
    drifting during the run hits every length alike, so it does not bend the slopes."""
    torch.manual_seed(0)
    modules = {op: build(op, dim, heads) for op in dict.fromkeys(op for op, _ in pairs)}
    xs = {n: torch.randn(1, n, dim) for n in dict.fromkeys(n for _, n in pairs)}
    times: dict[tuple[str, int], list[float]] = {pair: [] for pair in pairs}
    with torch.no_grad():
        for op, n in pairs:  # warm-up
            forward(op, modules[op], xs[n])
        for r in range(repeats):
            for op, n in pairs:
                t0 = time.perf_counter()
                forward(op, modules[op], xs[n])
                times[op, n].append(time.perf_counter() - t0)
            print(f"  timing repeat {r + 1}/{repeats} done (load {_load()})", flush=True)
    return {pair: (min(v), statistics.median(v)) for pair, v in times.items()}


def slope(ns: list[int], values: list[float], start: int) -> float:
    """The log-log least-squares slope of ``values`` against ``ns`` over ``n ≥ start``."""
    pts = [(math.log(n), math.log(v)) for n, v in zip(ns, values) if n >= start and v > 0]
    if len(pts) < 2:
        return float("nan")
    x, y = np.array(pts).T
    return float(np.polyfit(x, y, 1)[0])


def attention_table(args: argparse.Namespace) -> None:
    pairs = [(op, n) for op in args.ops for n in args.lengths if op != "mssa-matrix" or n <= args.matrix_limit]
    # each probe is its own process and reads only its own peak, so they run side by side (one per CPU)
    with ThreadPoolExecutor(max(1, (os.cpu_count() or 1) // args.threads)) as pool:
        peaks = pool.map(lambda pair: peak_memory(*pair, args.dim, args.heads, args.threads), pairs)
        mib = dict(zip(pairs, peaks))
    print(f"  memory measured (load {_load()})", flush=True)
    secs = time_ops(pairs, args.dim, args.heads, args.repeats)
    rows: dict[str, dict[int, tuple[float, float, float]]] = {op: {} for op in args.ops}
    for op, n in pairs:
        rows[op][n] = (*secs[op, n], mib[op, n])
    threads = torch.get_num_threads()
    print(f"\nattention of width {args.dim}, {args.heads} heads, batch 1, no grad, {threads} thread(s), "
          f"torch {torch.__version__}; load average {_load()} (1 / 5 / 15 min)")  # fmt: skip
    head = f"{'operator':<12} {'n':>6} {'tokens/s':>11} {'ms':>9} {'MiB':>8} {'time/tssa':>10} {'mem/tssa':>9}"
    print(head)
    for op in args.ops:
        for n, (sec, _, mib) in rows[op].items():
            base_sec, _, base_mib = rows["tssa"][n]
            mem_ratio = f"{mib / base_mib:.2f}x" if base_mib > 0 else "-"
            print(f"{op:<12} {n:>6} {n / sec:>11,.0f} {1e3 * sec:>9.2f} {mib:>8.1f} {sec / base_sec:>9.3g}x "
                  f"{mem_ratio:>9}")  # fmt: skip
    start = 1024 if sum(n >= 1024 for n in args.lengths) >= 2 else min(args.lengths)
    print(f"\nlog-log slope over n >= {start} (1 = linear, 2 = quadratic)")
    print(f"{'operator':<12} {'time':>6} {'median':>7} {'memory':>7}   (time: of the fastest runs)")
    for op in args.ops:
        ns = list(rows[op])
        if len(ns) >= 2:
            fast, median, mem = (slope(ns, [rows[op][n][i] for n in ns], start) for i in range(3))
            print(f"{op:<12} {fast:>6.2f} {median:>7.2f} {mem:>7.2f}")


def digits(args: argparse.Namespace) -> None:
    from crate_transformer.train import TrainConfig, train

    out = Path(args.out or tempfile.mkdtemp(prefix="bench_tost_"))
    rows = []
    for seed in args.seeds:
        for name in ("tost_mnist", "crate_mnist_p4"):
            extra = {"max_steps": 1, "epochs": 1, "data": "digits"} if args.tiny else {}
            if args.epochs and not args.tiny:
                extra = {"epochs": args.epochs, "warmup_epochs": min(2.0, args.epochs / 20)}
            run = str(out / f"{name}_{seed}")
            cfg = TrainConfig(model=name, seed=seed, threads=args.threads, progress=False, out=run, **extra)
            load0, t0 = os.getloadavg()[0], time.perf_counter()
            r = train(cfg)
            rows.append((name, seed, r["test_acc"], r["params"], time.perf_counter() - t0, load0, os.getloadavg()[0]))
            print(f"  {name} seed {seed}: {100 * r['test_acc']:.2f}%", flush=True)
    recipe = f"{args.epochs} epochs" if args.epochs and not args.tiny else "the default epochs"
    print(f"\nthe bundled digits, crate train's default recipe with {recipe}, one run at a time")
    print(f"{'model':<15} {'seed':>4} {'test acc %':>10} {'params':>9} {'wall s':>7} {'load':>11}")
    for name, seed, acc, params, wall, l0, l1 in rows:
        print(f"{name:<15} {seed:>4} {100 * acc:>10.2f} {params:>9,} {wall:>7.0f} {l0:>5.1f}->{l1:<5.1f}")
    means = {m: statistics.mean(100 * r[2] for r in rows if r[0] == m) for m in ("tost_mnist", "crate_mnist_p4")}
    print(f"mean over seeds: tost_mnist {means['tost_mnist']:.2f}%, crate_mnist_p4 {means['crate_mnist_p4']:.2f}%, "
          f"difference {means['tost_mnist'] - means['crate_mnist_p4']:+.2f} points")  # fmt: skip
    (out / "digits.json").write_text(json.dumps(rows) + "\n")


def main() -> None:
    ap = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="width 32, 64 and 256 tokens, one repeat; digits: one "
                    "step on the small digits set, seed 0")  # fmt: skip
    ap.add_argument("--threads", type=int, range=POSITIVE, default=1)
    ap.add_argument("--dim", type=int, range=POSITIVE, default=384)
    ap.add_argument("--heads", type=int, range=POSITIVE, default=8)
    ap.add_argument("--lengths", type=int, range=POSITIVE, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--repeats", type=int, range=POSITIVE, default=5)
    ap.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="the operators to measure (with tssa: "
                    "the table's ratios are against it)")  # fmt: skip
    ap.add_argument("--saved-lengths", type=int, range=POSITIVE, nargs="+", default=[1024, 4096],
                    help="token counts of the table of bytes kept for the backward")  # fmt: skip
    ap.add_argument("--matrix-limit", type=int, range=POSITIVE, default=MATRIX_LIMIT, help="longest n of mssa-matrix")
    ap.add_argument("--digits", action="store_true", help="also train tost_mnist and crate_mnist_p4 on the digits")
    ap.add_argument("--seeds", type=int, range=NON_NEGATIVE, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, range=NON_NEGATIVE, default=0, help="digits: train this many epochs, the "
                    "warm-up scaled with them (default: crate train's 40, warm-up 2)")  # fmt: skip
    ap.add_argument("--no-attention", action="store_true", help="skip the attention table (digits only)")
    ap.add_argument("--out", default=None, help="keep the digits runs here (default: a temp dir)")
    ap.add_argument("--probe", nargs=2, metavar=("OP", "N"), help=argparse.SUPPRESS)  # one memory measurement
    ap.rule(lambda a: "tssa" in a.ops, "--ops must include tssa: the table's ratios are against it")
    args = ap.parse_args()
    if args.probe:
        torch.set_num_threads(args.threads)
        return print(_probe(args.probe[0], int(args.probe[1]), args.dim, args.heads))
    if args.tiny:
        args.dim, args.heads, args.lengths, args.repeats, args.seeds = 32, 4, [64, 256], 1, [0]
        args.saved_lengths = [64, 256]
    torch.set_num_threads(args.threads)
    print(f"bench_tost: load average {_load()} (1 / 5 / 15 min), peak RSS of this process "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")  # fmt: skip
    if not args.no_attention:
        attention_table(args)
        saved_table(args)
    if args.digits or args.tiny:
        digits(args)


if __name__ == "__main__":
    main()
