"""``crate theory EXPERIMENT --out DIR``: the paper's claims checked on synthetic data."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import Config
from ..config_utils import NON_NEGATIVE, option
from .options import add_command_options


@dataclass
class TheoryOptions(Config):
    """The options of ``crate theory`` (the experiment is its positional argument)."""

    out: str = option("theory-results", "where <name>.png and <name>.json go", metavar="DIR", basic=True)
    seed: int = option(0, "random seed of the synthetic data", range=NON_NEGATIVE, basic=True)
    quick: bool = option(False, "reduced sizes (a few seconds in all)", basic=True)
    progress: bool = option(True, "show progress bars", basic=True)
    overwrite: bool = option(False, "replace the figure and JSON of an earlier run in `out`", basic=True)


def configure_theory(parser: argparse.ArgumentParser) -> None:
    from ..theory import EXPERIMENTS

    parser.add_argument("experiment", metavar="EXPERIMENT", help=f"one of: all, {', '.join(EXPERIMENTS)}")
    add_command_options(parser, TheoryOptions)


def run_theory(args: argparse.Namespace) -> int:
    """Run the requested experiment(s) and print which of the paper's claims hold."""
    from ..theory import EXPERIMENTS, run_experiment

    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    for name in names:
        if name not in EXPERIMENTS:
            raise ValueError(f"unknown experiment {name!r}; choose one of: all, {', '.join(EXPERIMENTS)}")
    earlier = [p for name in names for p in (Path(args.out) / f"{name}.png", Path(args.out) / f"{name}.json")]
    earlier = [p for p in earlier if p.exists()]
    if earlier and not args.overwrite:  # outputs are never replaced without asking
        raise ValueError(
            f"{earlier[0]} holds the result of an earlier crate theory run; pass --overwrite to replace it, or "
            "--out another folder"
        )
    start = time.perf_counter()
    for name in names:
        rep = run_experiment(name, args.out, seed=args.seed, quick=args.quick, progress_bar=args.progress)
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
