"""Experiment ``approximation``: how good is Approximation 9 (MSSA ≈ a gradient step on R^c)?

Approximation 9, eq. (91), JMLR p.57 (main text eqs. (27), (32)-(36), pp.22-23) claims

    Z − κ∇R^c(Z|U_[K]) ≈ (1 − κβ) Z + κβ MSSA(Z|U_[K]),     β = p / (n ε²),

through (i) a first-order Neumann series of ``(I + βA_kᵀA_k)⁻¹`` (98), (ii) replacing the Gram matrix
``A_kᵀA_k`` by its column softmax (100)→(101), and (iii) ``Σ_k U_kU_kᵀ ≈ I`` (104)→(105).  Here each
step is measured separately on unit-norm tokens of the subspace mixture, across β, and we check
which of the steps lower ``R^c``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from ..objectives import subspace_coding_rate, subspace_coding_rate_grad
from ._report import check, finish, new_figure, problem_size, progress, single_threaded, style_axis
from .steps import STEP_KINDS, beta_from_eps, compression_step, eps_from_beta, mssa_gradient, neumann_gradient
from .synthetic import (
    check_positive,
    check_positive_int,
    check_positive_list,
    make_generator,
    normalize_tokens,
    random_subspaces,
    relative_error,
    sample_subspace_mixture,
    subspace_coherence,
)

__all__ = ["approximation_errors", "rc_change", "run_approximation"]

KAPPA_BETA_DESCENT = 8 / 9  # κ ≤ 2/L with L = 9β/4 (Lemma 11, JMLR p.63, for R(U_kᵀZ) with α → β)


def approximation_errors(Z: Tensor, U: Tensor, eps: float) -> dict[str, float]:
    """Relative errors of the stages of Approximation 9 at row tokens ``Z`` ``(n, d)``.

    Returns ``rho = β max_k ‖A_kᵀA_k‖`` (the Neumann series (98) converges iff ρ < 1),
    ``neumann`` = ‖∇_Neumann − ∇R^c‖/‖∇R^c‖ (for which ρ² is an upper bound: per singular direction
    of A_k the relative error is exactly (βs²)²), ``mssa`` = ‖(βZ − β MSSA) − ∇R^c‖/‖∇R^c‖ — equal to
    the relative error of the MSSA *step* against the exact step's update, for any κ — and
    ``second_order`` / ``second_order_cosine`` comparing the softmax term ``−β MSSA`` with the exact
    beyond-first-order part ``∇R^c − β Σ_k U_kU_kᵀZ`` (the step (100)→(101)).
    """
    n, p = Z.shape[-2], U.shape[-1]
    beta = beta_from_eps(p, n, eps)
    g = subspace_coding_rate_grad(Z, U, eps)
    P = Z.unsqueeze(0) @ U
    rho = beta * float(torch.linalg.matrix_norm(P @ P.transpose(-1, -2), ord=2).max())
    first = beta * (P @ U.transpose(-1, -2)).sum(0)  # β Σ U_kU_kᵀ Z, the first-order term of (33)
    gm = mssa_gradient(Z, U, eps)
    exact2, mssa2 = g - first, gm - beta * Z  # beyond-first-order parts (the latter is −β MSSA)
    cos = float((exact2 * mssa2).sum() / (exact2.norm() * mssa2.norm()).clamp_min(1e-300))
    return {
        "beta": beta,
        "rho": rho,
        "neumann": relative_error(neumann_gradient(Z, U, eps), g),
        "mssa": relative_error(gm, g),
        "second_order": relative_error(mssa2, exact2),
        "second_order_cosine": cos,
    }


def rc_change(Z: Tensor, U: Tensor, eps: float, kappa: float, kind: str, *, renormalize: bool = False) -> float:
    """Relative change ``(R^c(Z⁺) − R^c(Z)) / R^c(Z)`` of one compression step (negative = compresses).

    ``renormalize=True`` measures ``R^c`` of the unit-normalised ``Z⁺`` (what a LayerNorm would pass on),
    separating the change of direction from the change of scale.
    """
    Zp = compression_step(Z, U, eps, kappa, kind)  # type: ignore[arg-type]
    if renormalize:
        Zp = normalize_tokens(Zp)
    r0 = float(subspace_coding_rate(Z, U, eps))
    return (float(subspace_coding_rate(Zp, U, eps)) - r0) / r0


@single_threaded
def run_approximation(
    out_dir: str | Path | None = None,
    *,
    d: int = 64,
    K: int = 4,
    p: int = 16,
    n: int = 64,
    sigma: float = 0.1,
    betas: Sequence[float] = tuple(float(b) for b in np.logspace(-2, 1, 13)),
    kappa_betas: Sequence[float] = (0.1, 0.5, 1.0),
    trials: int = 8,
    seed: int = 0,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Approximation 9 across β (default 0.01-10) on ``trials`` draws of ``n`` unit-norm tokens.

    For each β: the stage errors of :func:`approximation_errors` with orthogonal bases (and the MSSA
    error with merely incoherent bases), and for each ``κβ`` in ``kappa_betas`` the relative change
    of ``R^c`` made by the exact step, the MSSA step and the residual (skip) step, raw and after
    renormalising the tokens.  Writes ``approximation.{png,json}`` to ``out_dir`` if given.
    """
    start = time.perf_counter()
    check_positive_int(d=d, K=K, p=p, n=n, trials=trials)
    check_positive(allow_zero=True, sigma=sigma)
    betas = check_positive_list("betas", betas, "0.01, 0.1, 1")
    kappa_betas = check_positive_list("kappa_betas", kappa_betas, "0.1, 0.5")
    if K * p > d:
        raise ValueError(f"K*p = {K * p} exceeds d = {d}; Approximation 9 needs K*p = d (step (104)→(105))")
    data = _approximation_compute(d, K, p, n, sigma, betas, kappa_betas, trials, seed, progress_bar)
    checks = _approximation_error_checks(data, betas) + _approximation_descent_checks(data, kappa_betas)
    fig = _approximation_figure(data, betas, kappa_betas, title=f"(d={d}, K={K}, p={p}, n={n})")
    config = {
        **problem_size(d, K, p, n),
        "sigma": sigma,
        "betas": betas,
        "kappa_betas": kappa_betas,
        "trials": trials,
        "seed": seed,
        "tokens": "unit-normalised, eq. (231) model",
    }
    return finish(
        "approximation", config, _approximation_results(data, betas, kappa_betas), checks, fig, start, out_dir
    )


def _approximation_compute(
    d: int,
    K: int,
    p: int,
    n: int,
    sigma: float,
    betas: list[float],
    kappa_betas: list[float],
    trials: int,
    seed: int,
    progress_bar: bool,
) -> dict[str, Any]:
    """The per-(trial, β) stage errors and per-(trial, β, κβ) changes of R^c behind every check and plot."""
    g = make_generator(seed)
    nb, nk = len(betas), len(kappa_betas)
    keys = ("rho", "neumann", "mssa", "second_order", "second_order_cosine")
    err = {k: np.zeros((trials, nb)) for k in keys}
    err_incoherent = np.zeros((trials, nb))
    change = {(kind, ren): np.zeros((trials, nb, nk)) for kind in STEP_KINDS for ren in (False, True)}
    coherence = []
    for t in progress(range(trials), "approximation", progress_bar):
        U = random_subspaces(d, K, p, seed=g)
        Ui = random_subspaces(d, K, p, orthogonal=False, seed=g)
        coherence.append(subspace_coherence(Ui))
        Z = normalize_tokens(sample_subspace_mixture(U, n, sigma, seed=g).Z)
        Zi = normalize_tokens(sample_subspace_mixture(Ui, n, sigma, seed=g).Z)
        for i, beta in enumerate(betas):
            eps = eps_from_beta(p, n, beta)
            e = approximation_errors(Z, U, eps)
            for k in keys:
                err[k][t, i] = e[k]
            err_incoherent[t, i] = approximation_errors(Zi, Ui, eps)["mssa"]
            for j, kb in enumerate(kappa_betas):
                for kind in STEP_KINDS:
                    for ren in (False, True):
                        change[kind, ren][t, i, j] = rc_change(Z, U, eps, kb / beta, kind, renormalize=ren)
    mean = {k: v.mean(0) for k, v in err.items()}
    return {"err": err, "mean": mean, "inc": err_incoherent.mean(0), "change": change, "coherence": coherence}


def _approximation_results(data: dict[str, Any], betas: list[float], kappa_betas: list[float]) -> dict[str, Any]:
    mean, change = data["mean"], data["change"]
    return {
        "beta": betas,
        "rho_mean": mean["rho"],
        "rel_error_neumann": mean["neumann"],
        "rel_error_mssa": mean["mssa"],
        "rel_error_mssa_incoherent": data["inc"],
        "rel_error_second_order_softmax": mean["second_order"],
        "cosine_second_order_softmax": mean["second_order_cosine"],
        "incoherent_bases_coherence": float(np.mean(data["coherence"])),
        "kappa_beta": kappa_betas,
        "rc_relative_change": {
            f"{kind}{'_renormalized' if ren else ''}": {
                "mean": v.mean(0),
                "fraction_decreasing": (v < 0).mean(0),
            }
            for (kind, ren), v in change.items()
        },
    }


def _approximation_error_checks(data: dict[str, Any], betas: list[float]) -> list[dict[str, Any]]:
    """The claims on the stages of Approximation 9: Neumann (98), softmax (100)→(101), Σ_k U_kU_kᵀ ≈ I (104)."""
    err, mean, inc, coherence = data["err"], data["mean"], data["inc"], data["coherence"]
    rho, mssa_err = mean["rho"], mean["mssa"]
    checks = []
    neumann_ok = bool((err["neumann"] <= err["rho"] ** 2 * (1 + 1e-9) + 1e-14).all())
    checks.append(
        check(
            "Neumann step (98): relative gradient error ≤ ρ² (exact per singular direction), ρ = β·max‖A_k‖²",
            neumann_ok,
            f"max error/ρ² = {float((err['neumann'] / err['rho'] ** 2).max()):.3f} over all β and trials",
        )
    )
    small = rho < 1
    ratio = float((err["mssa"] / err["rho"])[:, small].max()) if small.any() else math.nan
    checks.append(
        check(
            "Approximation 9 where the Neumann series converges (ρ < 1): MSSA step error < ρ",
            bool(small.any() and ratio < 1),
            f"max (relative error / ρ) over β with ρ < 1: {ratio:.3f}; error {mssa_err[0]:.3g} at β={betas[0]:.3g} "
            f"(ρ={rho[0]:.3g})"
            + (f", {mssa_err[small][-1]:.3g} at β={np.array(betas)[small][-1]:.3g}" if small.any() else ""),
        )
    )
    good = [b for b, e in zip(betas, mssa_err) if e < 0.1]
    checks.append(
        check(
            f"Approximation 9 across β ∈ [{betas[0]:.3g}, {betas[-1]:.3g}] (MSSA step relative error < 10%)",
            bool((mssa_err < 0.1).all()),
            (f"< 10% only for β ≤ {max(good):.3g}; " if good else "never < 10%; ")
            + f"error {mssa_err[-1]:.3g} at β={betas[-1]:.3g} (ρ={rho[-1]:.3g}): the Neumann series diverges",
        )
    )
    so, cs = mean["second_order"], mean["second_order_cosine"]
    checks.append(
        check(
            "softmax step (100)→(101): −β·MSSA reproduces the beyond-first-order part of ∇R^c",
            bool(float(np.median(so)) < 0.5),
            f"relative error {float(np.min(so)):.2f}-{float(np.max(so)):.2f}, cosine {float(np.min(cs)):.2f}-"
            f"{float(np.max(cs)):.2f}: MSSA matches the gradient only through the shared first-order term βZ",
        )
    )
    checks.append(
        check(
            "Σ_k U_kU_kᵀ ≈ I (104)→(105) with merely incoherent random bases: MSSA error → 0 as β → 0",
            bool(inc[0] < 0.1),
            f"MSSA error {inc[0]:.3g} at β={betas[0]:.3g} with independent random bases "
            f"(coherence max‖U_kᵀU_k'‖ = {np.mean(coherence):.2f}) vs {mssa_err[0]:.3g} with orthogonal ones",
        )
    )
    return checks


def _approximation_descent_checks(data: dict[str, Any], kappa_betas: list[float]) -> list[dict[str, Any]]:
    """Which of the exact, MSSA and residual steps lower R^c (descent lemma: κβ ≤ 8/9)."""
    change, nk = data["change"], len(kappa_betas)
    checks = []
    safe = [j for j, kb in enumerate(kappa_betas) if kb <= KAPPA_BETA_DESCENT]
    for kind, claim in (
        ("exact", "the exact gradient step lowers R^c for κβ ≤ 8/9 (descent lemma, L = 9β/4)"),
        ("mssa", "the MSSA step (1−κβ)Z + κβ·MSSA(Z|U) lowers R^c"),
        ("mssa_renormalized", "the MSSA step lowers R^c also after renormalising (by direction, not only scale)"),
        ("skip", "the implemented residual step Z + κβ·MSSA(Z|U) (eq. (45)) lowers R^c"),
        ("skip_renormalized", "the residual step lowers R^c once tokens are renormalised (as by LayerNorm)"),
    ):
        base, ren = kind.split("_")[0], kind.endswith("renormalized")
        v = change[base, ren] if kind != "exact" else change["exact", False][:, :, safe]
        frac = float((v < 0).mean())
        checks.append(
            check(
                claim,
                frac == 1.0,
                f"R^c decreased in {100 * frac:.1f}% of (trial, β, κβ) cases; "
                f"mean relative change {float(v.mean()):+.3g}",
            )
        )
    if any(kb > KAPPA_BETA_DESCENT for kb in kappa_betas):
        v = change["exact", False][:, :, [j for j in range(nk) if j not in safe]]
        checks.append(
            check(
                "beyond the guarantee (κβ > 8/9) the exact step still lowers R^c",
                bool((v < 0).all()),
                f"decreased in {100 * float((v < 0).mean()):.1f}% of cases",
            )
        )

    return checks


def _approximation_figure(data: dict[str, Any], betas: list[float], kappa_betas: list[float], title: str) -> Figure:
    """Stage errors across β, and ΔR^c of one step on raw and renormalised tokens."""
    mean, inc, change, nk = data["mean"], data["inc"], data["change"], len(kappa_betas)
    rho, mssa_err, so = mean["rho"], mean["mssa"], mean["second_order"]
    fig, ax = new_figure(3, title=f"Approximation 9: MSSA vs exact gradient step on R^c {title}")
    a = ax[0, 0]
    a.plot(betas, mean["neumann"], "o-", label="Neumann series (98)")
    a.plot(betas, rho**2, "k:", label="bound ρ² for (98)")
    a.plot(betas, mssa_err, "s-", label="MSSA step (91), orthogonal U")
    a.plot(betas, inc, "^--", label="MSSA step, incoherent U")
    a.plot(betas, so, "d-.", label="softmax term vs exact 2nd-order")
    a.axhline(0.1, color="grey", lw=0.8)
    if (rho >= 1).any():
        a.axvline(betas[int(np.argmax(rho >= 1))], color="red", lw=0.8, ls="--", label="ρ = β‖A_k‖² ≥ 1")
    style_axis(a, "relative error of the gradient / step update", "β = p/(nε²)", "relative error", logx=True, logy=True)
    jj = nk // 2
    for col, ren, label in ((1, False, "raw tokens"), (2, True, "renormalised tokens")):
        a = ax[0, col]
        ys = [100 * change[kind, ren][:, :, jj].mean(0) for kind in STEP_KINDS]
        for kind, mk, y in zip(STEP_KINDS, "os^", ys):
            a.plot(betas, y, mk + "-", label=f"{kind} step")
        a.axhline(0, color="k", lw=0.8)
        a.set_yscale("symlog", linthresh=0.1)
        lo, hi = min(float(y.min()) for y in ys), max(float(y.max()) for y in ys)
        a.set_ylim(min(lo * 2, -0.1), max(hi * 2, 0.1))
        style_axis(
            a,
            f"ΔR^c of one step (κβ={kappa_betas[jj]:g}), {label}",
            "β = p/(nε²)",
            "ΔR^c / R^c (%)",
            logx=True,
        )
    return fig
