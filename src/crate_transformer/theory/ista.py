"""Experiment ``ista``: the sparsification block as a proximal-gradient method (JMLR §2.4, pp.24-25).

The non-negative LASSO (42) ``min_{Z≥0} λ‖Z‖_1 + ½‖X − DZ‖_F²`` has the proximal-gradient (ISTA)
step (44) ``Z⁺ = ReLU(Z − ηDᵀ(DZ − X) − ηλ)``; CRATE applies one such step warm-started at ``Z = X``.
With ``L = ‖D‖₂²`` the gradient's Lipschitz constant, the standard descent inequality
``F(Z⁺) ≤ F(Z) − (1/η − L/2)‖Z⁺ − Z‖²`` (Beck & Teboulle 2009) says one step never increases F for
``ηL < 2``; iterating with ``η = 1/L`` converges to the minimiser, which we compare with
scikit-learn's ``Lasso(positive=True)``.  sklearn minimises ``(1/(2 n_samples))‖y − Xw‖² + α‖w‖_1``
with ``n_samples = d`` (the rows of D), so ``α = λ/d`` gives the same minimiser.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Lasso
from torch import Tensor

from ..layers import ISTA, ista_reference
from ._report import check, finish, new_figure, progress, single_threaded, style_axis
from .steps import ista_step, nonneg_lasso_objective
from .synthetic import (
    DTYPE,
    check_positive,
    check_positive_int,
    check_positive_list,
    make_generator,
    normalize_tokens,
    random_subspaces,
    sample_subspace_mixture,
)

__all__ = ["sklearn_nonneg_lasso", "ista_solve", "run_ista"]


def sklearn_nonneg_lasso(X: Tensor, D: Tensor, lambd: float, *, tol: float = 1e-12) -> Tensor:
    """Solve (42) for row tokens ``X`` ``(n, d)`` with scikit-learn: ``Lasso(alpha=λ/d, positive=True)``."""
    d = D.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model = Lasso(alpha=lambd / d, positive=True, fit_intercept=False, tol=tol, max_iter=200_000)
        model.fit(D.cpu().numpy(), X.T.cpu().numpy())
    return torch.from_numpy(np.atleast_2d(model.coef_).copy()).to(X.dtype)


def ista_solve(X: Tensor, D: Tensor, lambd: float, steps: int, eta: float | None = None) -> list[Tensor]:
    """Iterate the ISTA step ``steps`` times (``η = 1/‖D‖²`` by default); returns all iterates.

    The start is CRATE's warm start ``Z_0 = ReLU(X)`` for a square D, and ``Z_0 = 0`` otherwise.
    """
    eta = 1.0 / float(torch.linalg.matrix_norm(D, ord=2)) ** 2 if eta is None else eta
    Z = torch.relu(X) if D.shape[0] == D.shape[1] else X.new_zeros(X.shape[0], D.shape[1])
    out = [Z]
    for _ in range(steps):
        Z = ista_step(Z, X, D, eta, lambd)
        out.append(Z)
    return out


@single_threaded
def run_ista(
    out_dir: str | Path | None = None,
    *,
    d: int = 32,
    n: int = 16,
    lambd: float = 0.1,
    step_multipliers: Sequence[float] = (0.25, 0.5, 1.0, 1.5, 1.9, 2.5, 3.0),
    trials: int = 200,
    iterations: int = 2000,
    seed: int = 0,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """One ISTA step vs the objective (42) for ``ηL`` in ``step_multipliers``, and iterated ISTA vs sklearn.

    ``D`` is a ``d × d`` kaiming-uniform matrix (CRATE's initialisation of the ISTA block); the data are
    ``n`` unit-norm tokens from the subspace mixture (``K = 4`` subspaces of dimension ``d/8``).
    Writes ``ista.{png,json}`` to ``out_dir`` if given.
    """
    start = time.perf_counter()
    check_positive_int(d=d, n=n, trials=trials, iterations=iterations)
    check_positive(lambd=lambd)
    mults = check_positive_list("step_multipliers", step_multipliers, "0.5, 1, 1.9, 2.5")
    r = _ista_compute(d, n, lambd, mults, trials, iterations, seed, progress_bar)
    checks = _ista_checks(r, mults, trials, iterations)
    fig = _ista_figure(r, mults, trials, title=f"d={d}, n={n}, λ={lambd}, D kaiming-uniform")
    config = {
        "d": d,
        "n": n,
        "lambd": lambd,
        "step_multipliers": mults,
        "trials": trials,
        "iterations": iterations,
        "seed": seed,
        "L": r["L"],
        "sklearn": "Lasso(alpha=lambd/d, positive=True, fit_intercept=False)",
    }
    F_sk, F_T = r["F"](r["Z_sk"]), r["F"](r["iterates"][-1])
    dist, gap = r["dist"], r["gap"]
    results = {
        "code_vs_math_max_abs": r["code_vs_math"],
        "crate_default_step": r["crate_step"],
        "increase_fraction": r["increases"],
        "min_decrease_ratio": r["min_ratio"],
        "guaranteed_decrease_ratio": r["guarantee"],
        "trajectory_increases": r["mono"],
        "distance_to_sklearn": dist[:: max(1, iterations // 200)],
        "final_distance_to_sklearn": dist[-1],
        "final_objective_gap": gap[-1],
        "sklearn_objective": F_sk,
        "ista_objective": F_T,
    }
    return finish("ista", config, results, checks, fig, start, out_dir)


def _ista_compute(
    d: int,
    n: int,
    lambd: float,
    mults: list[float],
    trials: int,
    iterations: int,
    seed: int,
    progress_bar: bool,
) -> dict[str, Any]:
    """The problem (D, X, L, objective F), the code-vs-math and sklearn comparisons, and the step sweep."""
    g = make_generator(seed)
    module = ISTA(d, eta=0.1, lambd=lambd).double()
    with torch.no_grad():
        torch.nn.init.kaiming_uniform_(module.weight, generator=g)  # CRATE's init of D, seeded
    D = module.weight.detach().clone()
    L = float(torch.linalg.matrix_norm(D, ord=2)) ** 2
    U = random_subspaces(d, min(4, d), max(1, d // 8), seed=g)
    X = normalize_tokens(sample_subspace_mixture(U, n, 0.1, seed=g).Z)
    F = lambda Z: nonneg_lasso_objective(Z, X, D, lambd)  # noqa: E731

    # (1) the code form of the block equals the math form (44)
    Xp = torch.relu(X)  # a non-negative input, e.g. the output of a previous block
    with torch.no_grad():
        code_out = module(Xp)
    code_vs_math = max(
        float((code_out - ista_step(Xp, Xp, D, 0.1, lambd)).abs().max()),
        float((ista_reference(Xp.T, D, 0.1, lambd).T - ista_step(Xp, Xp, D, 0.1, lambd)).abs().max()),
    )
    crate_step = {"eta_L": 0.1 * L, "decrease": F(Xp) - F(ista_step(Xp, Xp, D, 0.1, lambd))}

    sk = _ista_minimiser(X, D, F, lambd, iterations)
    sweep = _ista_step_sweep(X, D, F, L, lambd, sk["Z_sk"], mults, trials, iterations, g, progress_bar)
    r = {"L": L, "F": F, "code_vs_math": code_vs_math, "crate_step": crate_step, **sk, **sweep}
    return r


def _ista_minimiser(
    X: Tensor, D: Tensor, F: Callable[[Tensor], float], lambd: float, iterations: int
) -> dict[str, Any]:
    """The minimiser, by scikit-learn and by iterated ISTA (η = 1/L), and the distance/gap along the iterates."""
    Z_sk = sklearn_nonneg_lasso(X, D, lambd)
    F_star = min(F(Z_sk), math.inf)
    iterates = ista_solve(X, D, lambd, iterations)
    F_star = min(F_star, F(iterates[-1]))
    dist = np.array([float((Z - Z_sk).norm() / Z_sk.norm()) for Z in iterates])
    gap = np.array([F(Z) - F_star for Z in iterates])

    return {"Z_sk": Z_sk, "F_star": F_star, "iterates": iterates, "dist": dist, "gap": gap}


def _ista_step_sweep(
    X: Tensor,
    D: Tensor,
    F: Callable[[Tensor], float],
    L: float,
    lambd: float,
    Z_sk: Tensor,
    mults: list[float],
    trials: int,
    iterations: int,
    g: torch.Generator,
    progress_bar: bool,
) -> dict[str, Any]:
    """One step from many feasible points, and whole trajectories, for each ηL.

    The descent lemma F(Z⁺) ≤ F(Z) − (1/η − L/2)‖Z⁺ − Z‖² says the decrease per L‖Z⁺ − Z‖² is at least
    1/(ηL) − 1/2.
    """
    n, d = X.shape
    families = ("random start", "near the solution")
    increases: dict[str, list[float]] = {f: [] for f in families}
    min_ratio: dict[str, list[float]] = {f: [] for f in families}  # min over starts of (F₀ − F₁)/(L‖Z₁ − Z₀‖²)
    traj: dict[str, np.ndarray] = {}
    horizon = min(300, iterations)
    for c in progress(mults, "ista ηL", progress_bar):
        eta = c / L
        for family in families:
            count, r = 0, math.inf
            for _ in range(trials):
                if family == "random start":
                    Z0 = torch.relu(torch.randn(n, d, generator=g, dtype=DTYPE))
                else:  # a small perturbation within the solution's support (keeps Z0 ≥ 0)
                    Z0 = Z_sk * (1 + 0.01 * torch.randn(n, d, generator=g, dtype=DTYPE)).clamp_min(0)
                Z1 = ista_step(Z0, X, D, eta, lambd)
                f0, f1 = F(Z0), F(Z1)
                count += f1 > f0 + 1e-12 * abs(f0)
                r = min(r, (f0 - f1) / (L * float((Z1 - Z0).pow(2).sum())))
            increases[family].append(count / trials)
            min_ratio[family].append(r)
        Z, vals = torch.relu(X), [F(torch.relu(X))]
        for _ in range(horizon):
            Z = ista_step(Z, X, D, eta, lambd)
            vals.append(F(Z))
        traj[f"{c:g}"] = np.array(vals)
    mono = {k: int((np.diff(v) > 1e-12 * np.abs(v[:-1])).sum()) for k, v in traj.items()}
    guarantee = [1 / c - 0.5 for c in mults]

    return {
        "families": families,
        "increases": increases,
        "min_ratio": min_ratio,
        "traj": traj,
        "horizon": horizon,
        "mono": mono,
        "guarantee": guarantee,
    }


def _ista_checks(r: dict[str, Any], mults: list[float], trials: int, iterations: int) -> list[dict[str, Any]]:
    """Descent for ηL < 2, non-monotonicity beyond, CRATE's default step, sklearn agreement, code = math."""
    families, increases, min_ratio, guarantee = r["families"], r["increases"], r["min_ratio"], r["guarantee"]
    mono, horizon, crate_step, L = r["mono"], r["horizon"], r["crate_step"], r["L"]
    dist, gap, Z_sk, code_vs_math = r["dist"], r["gap"], r["Z_sk"], r["code_vs_math"]
    below = [i for i, c in enumerate(mults) if c < 2]
    above = [i for i, c in enumerate(mults) if c > 2]
    inc_below = max((increases[f][i] for f in families for i in below), default=0.0)
    margin = min((min_ratio[f][i] - guarantee[i] for f in families for i in below), default=math.nan)
    return [
        check(
            "one ISTA step never increases the non-negative LASSO objective (42) for ηL < 2, and lowers it by at "
            "least (1/η − L/2)‖Z⁺ − Z‖² (descent lemma)",
            bool(below) and inc_below == 0.0 and margin >= -1e-9 and all(mono[f"{mults[i]:g}"] == 0 for i in below),
            f"no increase in {trials} random and {trials} near-optimal starts per ηL in {[mults[i] for i in below]}; "
            f"smallest (measured − guaranteed) decrease per L‖ΔZ‖²: {margin:+.3g}; monotone {horizon}-step "
            "trajectories",
        ),
        check(
            "with ηL > 2 the iteration is no longer monotone (F increases along the trajectory)",
            bool(above) and any(mono[f"{mults[i]:g}"] > 0 for i in above),
            f"steps that increase F in the first {horizon} iterations: "
            + ", ".join(f"ηL={mults[i]:g}: {mono[f'{mults[i]:g}']}" for i in above)
            + "; single steps from our starts still decreased F (the lemma is sufficient, not necessary)",
        ),
        check(
            "CRATE's default η = 0.1 is a safe step for a kaiming-initialised D (ηL < 2) and its step from "
            "Z₀ = X ≥ 0 lowers (42)",
            crate_step["eta_L"] < 2 and crate_step["decrease"] > 0,
            f"ηL = {crate_step['eta_L']:.3f} (L = ‖D‖² = {L:.2f}); decrease {crate_step['decrease']:.4g}",
        ),
        check(
            "iterated ISTA (η = 1/L) converges to scikit-learn's Lasso(positive=True, α=λ/d) solution",
            bool(dist[-1] < 1e-6),
            f"‖Z_T − Z_sklearn‖/‖Z_sklearn‖ = {dist[-1]:.2e} after T={iterations}; objective gap "
            f"{max(gap[-1], 0.0):.2e}; solution non-zeros {float((Z_sk != 0).double().mean()):.3f}",
        ),
        check(
            "the ISTA module (code form, layers.ISTA) equals the math form (44)",
            code_vs_math < 1e-12,
            f"max |difference| = {code_vs_math:.2e}",
        ),
    ]


def _ista_figure(r: dict[str, Any], mults: list[float], trials: int, title: str) -> Figure:
    """Objective gap along ISTA per ηL, the one-step decrease vs the guarantee, and iterated ISTA vs sklearn."""
    traj, F_star, min_ratio, guarantee = r["traj"], r["F_star"], r["min_ratio"], r["guarantee"]
    dist, gap = r["dist"], r["gap"]
    fig, ax = new_figure(3, title=f"ISTA on the non-negative LASSO (42): {title}")
    a = ax[0, 0]
    for key, v in traj.items():
        a.plot(np.arange(len(v)), np.maximum(v - F_star, 1e-16), label=f"ηL = {key}")
    style_axis(a, "objective gap along ISTA", "iteration t", "F(Z_t) − F*", logy=True)
    a = ax[0, 1]
    for family, v in min_ratio.items():
        a.plot(mults, v, "o-", label=f"{family} (min over {trials})")
    a.plot(mults, guarantee, "k--", label="guarantee 1/(ηL) − 1/2")
    a.axvline(2.0, color="k", ls=":", lw=0.8)
    a.axhline(0.0, color="k", lw=0.8)
    style_axis(a, "one step: decrease of F per L‖Z⁺ − Z‖²", "η·‖D‖²", "(F(Z) − F(Z⁺)) / (L‖Z⁺ − Z‖²)")
    a = ax[0, 2]
    t = np.arange(len(dist))
    a.plot(t, np.maximum(dist, 1e-16), label="‖Z_t − Z_sklearn‖/‖Z_sklearn‖")
    a.plot(t, np.maximum(gap, 1e-16), label="F(Z_t) − F*")
    style_axis(a, "iterated ISTA (η = 1/L) vs scikit-learn", "iteration t", "error", logy=True)
    return fig
