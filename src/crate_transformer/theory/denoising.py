"""Experiment ``denoising``: Theorem 16 and Remark 17 (compression = denoising) at CRATE-Base scale.

Signal model (231)-(232), JMLR pp.73-74: ``z_i = U_{s_i} α_i + δ_i``, ``α_i ~ N(0, I_p/p)``,
``δ_i ~ N(0, σ²/d I)``, mutually orthogonal ``U_k`` with ``Kp = d`` (Assumption 15), at the sizes of
CRATE-Base: d=768, n=196, K=12, p=64.  One gradient step on ``R^c`` (236),

    Z⁺ = Z_o − η ∇R^c(Z_o|U_[K]),

with Remark 17's choices ``ε² = σd / (nK √(σ + √(n/d)))`` (243) and ``η = β⁻¹`` should give (237)/(239)

    Z⁺ ≈ Δ − P_U[K](ΔΠ*)Π + X_♮ / (1 + β⁻¹),

where ``P_k = Σ_{k'≠k} U_{k'} (I − A_{k'}(β⁻¹I + A_{k'}*A_{k'})⁻¹A_{k'}*) U_{k'}*`` (313)-(314), p.83:
the noise is projected off the subspaces (except onto the span of the other classes' tokens, (249))
and the signal is shrunk by ``1/(1 + β⁻¹)``; asymptotically ``1/(1 + √σ)`` (247), p.76.
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

from ..objectives import subspace_coding_rate_grad
from ._report import check, finish, loglog_slope, new_figure, problem_size, progress, single_threaded, style_axis
from .steps import beta_from_eps
from .synthetic import (
    SubspaceSample,
    check_orthogonal_fit,
    check_positive,
    check_positive_int,
    check_positive_list,
    make_generator,
    off_subspace_energy,
    random_subspaces,
    sample_subspace_mixture,
)

__all__ = ["remark17_eps", "theorem16_nominal", "denoising_measurements", "run_denoising"]


def remark17_eps(sigma: float, d: int, n: int, K: int) -> float:
    """The precision ε of Remark 17, ``ε² = σ d / (n K √(σ + √(n/d)))``, eq. (243), JMLR p.75."""
    check_positive(sigma=sigma)
    return math.sqrt(sigma * d / (n * K * math.sqrt(sigma + math.sqrt(n / d))))


def theorem16_nominal(sample: SubspaceSample, beta: float, eta: float | None = None) -> Tensor:
    """The nominal value of ``Z⁺`` in Theorem 16, eq. (237), JMLR p.75 (row tokens):

    ``Δ − η P_U[K](βΔΠ*)Π + (1 + β⁻¹ − η)/(1 + β⁻¹) X_♮``; a token of class k gets ``η β P_k δ_i``
    subtracted, with ``P_k`` of eq. (313) built from the noise-free codes ``A_{k'}`` of each class.
    ``eta=None`` is Remark 17's ``η = β⁻¹`` (eq. (239)).
    """
    eta = 1.0 / beta if eta is None else eta
    U, labels, X, noise = sample.U, sample.labels, sample.signal, sample.noise
    K, d, p = U.shape
    eye = torch.eye(p, dtype=X.dtype)
    codes = noise @ U.transpose(0, 1).reshape(d, K * p)  # (n, K·p): U_k'ᵀ δ_i for every k'
    codes = codes.view(-1, K, p).clone()
    for k in range(K):
        A = U[k].T @ X[labels == k].T  # p × n_k: the class-k signal codes
        M = eye - A @ torch.linalg.solve(torch.eye(A.shape[1], dtype=X.dtype) / beta + A.T @ A, A.T)
        codes[:, k] = codes[:, k] @ M.T
    codes[torch.arange(codes.shape[0]), labels] = 0.0  # P_k sums over k' ≠ k only
    P_delta = codes.reshape(-1, K * p) @ U.transpose(0, 1).reshape(d, K * p).T
    return noise - eta * beta * P_delta + (1 + 1 / beta - eta) / (1 + 1 / beta) * X


def denoising_measurements(sample: SubspaceSample, eps: float, eta: float | None = None) -> dict[str, float]:
    """One compression step ``Z⁺ = Z_o − η∇R^c`` (236) on ``sample`` and what Theorem 16 says of it.

    Keys: ``off_energy_ratio`` (energy off each token's own subspace after / before; before it is all
    noise), ``off_energy_ratio_nominal`` (the same for the nominal value (239)), ``off_energy_ratio_limit``
    (the σ→0 limit (249): the noise survives only on the other classes' token spans, a fraction
    ``Σ_{k'≠k} rank A_{k'} / (d − p)``), ``shrink`` (regression coefficient ``⟨Z⁺, X_♮⟩/‖X_♮‖²``),
    ``shrink_predicted`` = 1/(1+β⁻¹), ``shrink_asymptotic`` = 1/(1+√σ) (247), ``residual_op`` and
    ``residual_rel`` (spectral norm, and Frobenius norm relative to ‖Z⁺‖, of ``Z⁺ −`` nominal),
    ``bound_scale`` (Remark 17's rate Kσ(√(Kσ) + √(σ+√(n/d))) (244), without its unknown constant).
    """
    U, labels, X = sample.U, sample.labels, sample.signal
    K, d, p = U.shape
    n, sigma = sample.n, sample.sigma
    beta = beta_from_eps(p, n, eps)
    eta = 1.0 / beta if eta is None else eta
    Zp = sample.Z - eta * subspace_coding_rate_grad(sample.Z, U, eps)
    nominal = theorem16_nominal(sample, beta, eta)
    off0 = float(off_subspace_energy(sample.Z, U, labels).sum())
    counts = torch.bincount(labels, minlength=K).clamp(max=p).to(X.dtype)  # rank A_k = min(n_k, p)
    limit = float(((counts.sum() - counts[labels]) / (d - p)).mean())
    res = Zp - nominal
    return {
        "beta_inv": 1 / beta,
        "beta_sigma": beta * sigma,
        "off_energy_ratio": float(off_subspace_energy(Zp, U, labels).sum()) / off0,
        "off_energy_ratio_nominal": float(off_subspace_energy(nominal, U, labels).sum()) / off0,
        "off_energy_ratio_limit": limit,
        "shrink": float((Zp * X).sum() / (X * X).sum()),
        "shrink_predicted": 1 / (1 + 1 / beta),
        "shrink_asymptotic": 1 / (1 + math.sqrt(sigma)),
        "residual_op": float(torch.linalg.matrix_norm(res, ord=2)),
        "residual_rel": float(res.norm() / Zp.norm()),
        "bound_scale": K * sigma * (math.sqrt(K * sigma) + math.sqrt(sigma + math.sqrt(n / d))),
    }


@single_threaded
def run_denoising(
    out_dir: str | Path | None = None,
    *,
    d: int = 768,
    n: int = 196,
    K: int = 12,
    p: int = 64,
    sigmas: Sequence[float] = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0),
    trials: int = 4,
    seed: int = 0,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Theorem 16 / Remark 17 over σ: noise suppression, signal shrinkage and the residual to (239).

    Orthogonal bases need ``K·p ≤ d``; the theorem assumes ``Kp = d`` and ``d ≥ n ≥ p ≥ K ≥ 2``.
    Writes ``denoising.{png,json}`` to ``out_dir`` if given.
    """
    start = time.perf_counter()
    check_positive_int(d=d, n=n, K=K, p=p, trials=trials)
    check_orthogonal_fit(d, K, p)
    sigmas = check_positive_list("sigmas", sigmas, "0.01, 0.1")
    eps_list, t = _denoising_compute(d, n, K, p, sigmas, trials, seed, progress_bar)
    results = {"sigma": sigmas, "eps": eps_list, **t}
    checks = _denoising_checks(t, np.array(sigmas), n, d)
    fig = _denoising_figure(t, np.array(sigmas), title=f"at d={d}, n={n}, K={K}, p={p}")
    config = {
        **problem_size(d, K, p, n),
        "sigmas": sigmas,
        "trials": trials,
        "seed": seed,
        "eps": "eq. (243)",
        "eta": "1/beta (Remark 17)",
    }
    return finish("denoising", config, results, checks, fig, start, out_dir)


def _denoising_compute(
    d: int, n: int, K: int, p: int, sigmas: list[float], trials: int, seed: int, progress_bar: bool
) -> tuple[list[float], dict[str, np.ndarray]]:
    """ε of (243) per σ and the :func:`denoising_measurements` averaged over ``trials`` samples."""
    g = make_generator(seed)
    U = random_subspaces(d, K, p, seed=g)
    table: dict[str, list[float]] = {}
    eps_list = []
    for sigma in progress(sigmas, "denoising σ", progress_bar):
        eps = remark17_eps(sigma, d, n, K)
        eps_list.append(eps)
        rows = [denoising_measurements(sample_subspace_mixture(U, n, sigma, seed=g), eps) for _ in range(trials)]
        for k in rows[0]:
            table.setdefault(k, []).append(float(np.mean([r[k] for r in rows])))
    return eps_list, {k: np.array(v) for k, v in table.items()}


def _denoising_checks(t: dict[str, np.ndarray], s: np.ndarray, n: int, d: int) -> list[dict[str, Any]]:
    """Theorem 16 (a)-(c) against the measurements ``t`` at the noise levels ``s``."""
    small = s <= 0.1
    off_err = np.abs(t["off_energy_ratio"] / t["off_energy_ratio_nominal"] - 1)
    shrink_err = np.abs(t["shrink"] - t["shrink_predicted"])
    fmt = lambda a, f=".3f": ", ".join(f"{x:{f}}" for x in a)  # noqa: E731
    return [
        check(
            "(a) one step removes most of the noise off the subspaces (energy after/before < 0.5)",
            bool((t["off_energy_ratio"] < 0.5).all()),
            f"ratio {fmt(t['off_energy_ratio'])} at σ = {fmt(s, 'g')}; not 0: the σ→0 limit (249) keeps the "
            f"noise on the other classes' token spans, a fraction ≈ {t['off_energy_ratio_limit'][0]:.3f}",
        ),
        check(
            "(a) the nominal value (239) predicts the remaining off-subspace energy within 10% for σ ≤ 0.1",
            bool(small.any() and (off_err[small] < 0.1).all()),
            f"measured/nominal − 1 = {fmt(off_err, '.3f')}; βσ = {fmt(t['beta_sigma'], '.2f')} "
            "(the theorem needs C₁βσ ≤ ½)",
        ),
        check(
            "(b) the signal is shrunk by 1/(1 + β⁻¹) (within 0.01) for σ ≤ 0.1",
            bool(small.any() and (shrink_err[small] < 0.01).all()),
            f"measured {fmt(t['shrink'], '.4f')} vs predicted {fmt(t['shrink_predicted'], '.4f')}",
        ),
        check(
            "(b) the asymptotic shrink 1/(1 + √σ) of (247) applies at d=768, n=196 (within 0.02)",
            bool((np.abs(t["shrink"] - t["shrink_asymptotic"]) < 0.02).all()),
            f"1/(1+√σ) = {fmt(t['shrink_asymptotic'], '.4f')}; (247) needs n/d → 0, here n/d = {n / d:.3f}",
        ),
        check(
            "(c) the residual to the nominal value (239) vanishes as σ → 0 (monotone, < 1% of ‖Z⁺‖ at the smallest σ)",
            bool((np.diff(t["residual_rel"]) > 0).all() and t["residual_rel"][0] < 0.01),
            f"relative residual {fmt(t['residual_rel'], '.4f')}; log-log slope of ‖·‖₂ in σ "
            f"{loglog_slope(s, t['residual_op']) if len(s) > 1 else float('nan'):.2f} (Remark 17's rate ~ σ for "
            "small σ)",
        ),
    ]


def _denoising_figure(t: dict[str, np.ndarray], s: np.ndarray, title: str) -> Figure:
    """Off-subspace noise energy, signal shrink factor and residual of Theorem 16 over σ."""
    fig, ax = new_figure(3, title=f"Theorem 16 / Remark 17: one step Z⁺ = Z − β⁻¹∇R^c {title}")
    a = ax[0, 0]
    a.plot(s, t["off_energy_ratio"], "o-", label="measured")
    a.plot(s, t["off_energy_ratio_nominal"], "s--", label="nominal value (239)")
    a.plot(s, t["off_energy_ratio_limit"], "k:", label="σ→0 limit (249)")
    style_axis(a, "(a) noise energy off the subspaces, after / before", "noise level σ", "energy ratio", logx=True)
    a.set_ylim(0, max(0.5, float(t["off_energy_ratio"].max()) * 1.1))
    a = ax[0, 1]
    a.plot(s, t["shrink"], "o-", label="measured ⟨Z⁺, X♮⟩/‖X♮‖²")
    a.plot(s, t["shrink_predicted"], "s--", label="1/(1+β⁻¹) (239)")
    a.plot(s, t["shrink_asymptotic"], "k:", label="1/(1+√σ) (247), n/d→0")
    style_axis(a, "(b) signal shrink factor", "noise level σ", "shrink factor", logx=True)
    a = ax[0, 2]
    a.plot(s, t["residual_op"], "o-", label="‖Z⁺ − nominal (239)‖₂")
    a.plot(s, t["residual_rel"], "s-", label="‖Z⁺ − nominal‖_F / ‖Z⁺‖_F")
    a.plot(s, t["bound_scale"], "k:", label="rate of bound (244), no constant")
    style_axis(a, "(c) residual of Theorem 16", "noise level σ", "residual", logx=True, logy=True)
    return fig
