"""Speed of this implementation against the official formulation (explicit attention matrix, three-matmul ISTA;
``tests/official/crate.py``), measured in the same run on the same weights, interleaved.

    python benchmarks/bench_speed.py                   # inference sweep and training rows (about 15 min, 1 thread)
    python benchmarks/bench_speed.py --part inference  # CRATE-T/S/B at 224/16, batch 1, 2, 8, 32, 128, eval mode
    python benchmarks/bench_speed.py --part training   # forward+backward, CRATE-T/S 224/16 batch 8, CRATE-T 32/4
    python benchmarks/bench_speed.py --compile         # adds torch.compile rows to the training part
    python benchmarks/bench_speed.py --quick           # fewer repeats and batches, a smoke check
    python benchmarks/bench_speed.py --tiny            # tiny models, seconds: keeps the script alive (a test runs it)

Inference: the classifier's forward in eval mode under ``torch.inference_mode()``, milliseconds per batch.  Three
implementations: the official formulation; ours as the package's inference runs it (inside
``layers.frozen_weights``: the ISTA step matrix ``A = I + η(D − DᵀD)`` is computed once, on entry); ours "plain"
(a bare call outside the context: every forward chooses its ISTA formulation by FLOPs).  Training: forward +
backward on a train-mode model.

Every row is the median of ``--repeats`` rounds after one warm-up call each, the implementations interleaved
(alternating order), with the 1-minute load average beside it: benchmarks are not tests, the absolute numbers
depend on the machine and its load, the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from _common import POSITIVE, Arguments

import crate_transformer as ct
from crate_transformer.layers import frozen_weights
from crate_transformer.loading.official import native_to_official

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the transcribed official code
from official.crate import OfficialCRATE

SIZES = {"crate_tiny": "CRATE-T", "crate_small": "CRATE-S", "crate_base": "CRATE-B"}
TINY = dict(dim=32, depth=1, heads=2, num_classes=10)  # --tiny: every model at this size, 32 px / 8 px patches


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: bool = True) -> dict[str, float]:
    """Median seconds of each function over ``repeats`` rounds, after one warm-up call each; the order alternates
    between rounds so that a drift in the machine's load hits every function alike."""
    for fn in fns.values() if warmup else ():
        fn()
    times: dict[str, list[float]] = {label: [] for label in fns}
    order = list(fns)
    for r in range(repeats):
        for label in order if r % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            fns[label]()
            times[label].append(time.perf_counter() - t)
    return {label: statistics.median(ts) for label, ts in times.items()}


def pair(name: str, size: int, patch: int, tiny: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Ours and the official formulation with the same weights."""
    torch.manual_seed(0)
    ours = ct.create_model(name, image_size=size, patch_size=patch, **(TINY if tiny else {}))
    c = ours.config
    off = OfficialCRATE(
        image_size=size, patch_size=patch, num_classes=c.num_classes, dim=c.dim, depth=c.depth, heads=c.heads
    )
    off.load_state_dict(native_to_official(ours.state_dict()))
    return ours, off


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def inference(names: list[str], batches: list[int], size: int, patch: int, repeats: int, tiny: bool) -> None:
    print(
        f"\nInference, eval mode, {size}/{patch}: ms per batch (median of {repeats}, of {(repeats + 1) // 2} from "
        "batch 32), ratios official / ours; 'plain' (outside frozen_weights) up to batch 8"
    )
    header = (
        f"{'model':8} {'batch':>5} {'official':>10} {'ours':>10} {'ours plain':>12} {'img/s ours':>10} "
        f"{'speedup':>8} {'plain':>7} {'max|diff|':>9} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        ours, off = pair(name, size, patch, tiny)
        ours.eval(), off.eval()
        held = copy.deepcopy(ours)
        for batch in batches:
            x = torch.randn(batch, 3, size, size)
            impls = {"official": off, "ours": held, "frozen": ours} if batch <= 8 else {"official": off, "ours": held}
            with torch.inference_mode(), frozen_weights(held):
                diff = (held(x) - off(x)).abs().max().item()  # and the warm-up of both
                fns = {k: partial(m, x) for k, m in impls.items()}
                t = interleaved(fns, repeats if batch < 32 else (repeats + 1) // 2, warmup=batch == batches[0])
            frozen_ms, frozen_x = (
                (f"{1e3 * t['frozen']:>12.1f}", f"{t['official'] / t['frozen']:>6.2f}x")
                if "frozen" in t
                else ("-", "-")
            )
            print(
                f"{SIZES.get(name, name):8} {batch:>5} {1e3 * t['official']:>10.1f} {1e3 * t['ours']:>10.1f} "
                f"{frozen_ms:>12} {batch / t['ours']:>10.1f} {t['official'] / t['ours']:>7.2f}x "
                f"{frozen_x:>7} {diff:>9.1e} {load():>5}"
            )


def train_step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def training(setups: list[tuple[str, int, int, int]], repeats: int, tiny: bool, compile_: bool) -> None:
    print(f"\nTraining step (forward + backward), train mode: ms per batch (median of {repeats}), official / ours")
    header = f"{'model':8} {'img/p':>6} {'batch':>5} {'impl':10} {'ms':>9} {'img/s':>8} {'speedup':>8} {'load':>5}"
    print(header)
    print("-" * len(header))
    for name, size, patch, batch in setups:
        ours, off = pair(name, size, patch, tiny)
        impls = {"official": off.train(), "ours": ours.train()}
        if compile_:
            impls["ours+comp"] = torch.compile(ours)
        x = torch.randn(batch, 3, size, size)
        t = interleaved({label: partial(train_step, m, x) for label, m in impls.items()}, repeats)
        for label, s in t.items():
            print(
                f"{SIZES.get(name, name):8} {f'{size}/{patch}':>6} {batch:>5} {label:10} {1e3 * s:>9.1f} "
                f"{batch / s:>8.1f} {t['official'] / s:>7.2f}x {load():>5}"
            )


def main() -> None:
    ap = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("inference", "training", "both"), default="both")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(ours) in the training part")
    ap.add_argument("--quick", action="store_true", help="3 repeats, batches 1 and 8, CRATE-T and CRATE-S")
    ap.add_argument("--tiny", action="store_true", help="tiny models (d=32, one layer, 32 px), one repeat")
    ap.add_argument("--repeats", type=int, range=POSITIVE, default=5)
    ap.add_argument("--threads", type=int, range=POSITIVE, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    names, batches, repeats = list(SIZES), [1, 2, 8, 32, 128], args.repeats
    size, patch = (32, 8) if args.tiny else (224, 16)
    setups = [("crate_tiny", 224, 16, 8), ("crate_small", 224, 16, 8), ("crate_tiny", 32, 4, 128)]
    if args.quick:
        names, batches, repeats, setups = names[:2], [1, 8], 3, setups[:1]
    if args.tiny:
        names, batches, repeats, setups = names[:1], [1, 2], 1, [("crate_tiny", 32, 8, 2)]
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores, load average "
        f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())} (1 / 5 / 15 min)"
    )
    if args.part in ("inference", "both"):
        inference(names, batches, size, patch, repeats, args.tiny)
    if args.part in ("training", "both"):
        training(setups, repeats, args.tiny, args.compile)


if __name__ == "__main__":
    main()
