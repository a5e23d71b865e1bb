"""The experiment registry and the ``crate theory EXPERIMENT --out DIR`` command."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .approximation import run_approximation
from .denoising import run_denoising
from .diffusion import run_diffusion
from .ista import run_ista
from .tweedie import run_tweedie
from .unrolled import run_unrolled

__all__ = ["EXPERIMENTS", "QUICK", "run_experiment", "run_all", "configure_theory", "run_theory"]

EXPERIMENTS: dict[str, Callable[..., dict[str, Any]]] = {
    "approximation": run_approximation,
    "unrolled": run_unrolled,
    "denoising": run_denoising,
    "tweedie": run_tweedie,
    "ista": run_ista,
    "diffusion": run_diffusion,
}

# Reduced settings for a fast smoke run (``--quick``) and the tests; the claims are the same.
QUICK: dict[str, dict[str, Any]] = {
    "approximation": {"trials": 1, "betas": (0.01, 0.03, 0.1, 0.3, 1.0, 10.0)},
    "unrolled": {"n": 64, "layers": 4},
    "denoising": {"sigmas": (0.01, 0.1), "trials": 1},
    "tweedie": {"n": 128, "sigmas": (0.01, 0.03, 0.1, 0.3, 1.0)},
    "ista": {"trials": 20, "iterations": 1000},
    "diffusion": {"steps": (4, 8, 16, 32), "reference_steps": 100, "trajectory_steps": 8},
}


def _check_name(name: str) -> None:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of: all, {', '.join(EXPERIMENTS)}")


def run_experiment(
    name: str,
    out_dir: str | Path | None = None,
    *,
    seed: int = 0,
    quick: bool = False,
    progress_bar: bool = True,
    **overrides: Any,
) -> dict[str, Any]:
    """Run one experiment by name (``quick`` applies :data:`QUICK`; ``overrides`` win over both)."""
    _check_name(name)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    kwargs = {**(QUICK[name] if quick else {}), **overrides}
    return EXPERIMENTS[name](out_dir, seed=seed, progress_bar=progress_bar, **kwargs)


def run_all(
    out_dir: str | Path | None = None, *, seed: int = 0, quick: bool = False, progress_bar: bool = True
) -> dict[str, dict[str, Any]]:
    """Run every experiment in turn; returns ``{name: report}``."""
    return {
        name: run_experiment(name, out_dir, seed=seed, quick=quick, progress_bar=progress_bar) for name in EXPERIMENTS
    }


def configure_theory(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``crate theory``."""
    parser.add_argument(
        "experiment",
        metavar="EXPERIMENT",
        help=f"one of: all, {', '.join(EXPERIMENTS)}",
    )
    parser.add_argument("--out", default="theory-results", metavar="DIR", help="where <name>.png and <name>.json go")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the synthetic data")
    parser.add_argument("--quick", action="store_true", help="reduced sizes (a few seconds in all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_theory(args: argparse.Namespace) -> int:
    """Run the requested experiment(s) and print which of the paper's claims hold."""
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    for name in names:
        _check_name(name)
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
