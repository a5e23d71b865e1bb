"""``crate theory EXPERIMENT --out DIR``: the paper's claims checked on synthetic data."""

from __future__ import annotations

import argparse
import time


def configure_theory(parser: argparse.ArgumentParser) -> None:
    from ..theory import EXPERIMENTS

    parser.add_argument("experiment", metavar="EXPERIMENT", help=f"one of: all, {', '.join(EXPERIMENTS)}")
    parser.add_argument("--out", default="theory-results", metavar="DIR", help="where <name>.png and <name>.json go")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the synthetic data")
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a few seconds in all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_theory(args: argparse.Namespace) -> int:
    """Run the requested experiment(s) and print which of the paper's claims hold."""
    from ..theory import EXPERIMENTS, run_experiment

    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    for name in names:
        if name not in EXPERIMENTS:
            raise ValueError(f"unknown experiment {name!r}; choose one of: all, {', '.join(EXPERIMENTS)}")
    start = time.perf_counter()
    for name in names:
        rep = run_experiment(name, args.out, seed=args.seed, quick=args.quick, progress_bar=not args.no_progress)
        held = sum(c["holds"] for c in rep["checks"])
        print(
            f"{name}: {held}/{len(rep['checks'])} claims hold ({rep['runtime_s']:.1f} s) -> "
            f"{rep['files']['figure']}, {rep['files']['json']}"
        )
        for c in rep["checks"]:
            print(f"  [{'holds' if c['holds'] else 'FAILS'}] {c['claim']}")
    if len(names) > 1:
        print(f"all experiments: {time.perf_counter() - start:.1f} s")
    return 0
