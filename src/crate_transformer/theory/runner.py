"""The experiment registry (the ``crate theory`` command is in :mod:`crate_transformer.cli.theory`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config_utils import NON_NEGATIVE
from ..io import make_folder
from .approximation import run_approximation
from .denoising import run_denoising
from .diffusion import run_diffusion
from .ista import run_ista
from .tweedie import run_tweedie
from .unrolled import run_unrolled

__all__ = ["EXPERIMENTS", "QUICK", "run_experiment", "run_all"]

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
    if not NON_NEGATIVE.ok(seed):
        raise ValueError(NON_NEGATIVE.message("seed", seed))
    kwargs = {**(QUICK[name] if quick else {}), **overrides}
    if out_dir is not None:  # checked before the experiment runs, not after
        make_folder(out_dir, "theory results folder")
    return EXPERIMENTS[name](out_dir, seed=seed, progress_bar=progress_bar, **kwargs)


def run_all(
    out_dir: str | Path | None = None, *, seed: int = 0, quick: bool = False, progress_bar: bool = True
) -> dict[str, dict[str, Any]]:
    """Run every experiment in turn; returns ``{name: report}``."""
    return {
        name: run_experiment(name, out_dir, seed=seed, quick=quick, progress_bar=progress_bar) for name in EXPERIMENTS
    }
