"""Experiment ``diffusion``: structured denoising, then structured diffusion, on the same subspaces.

Structured denoising ODE (55), JMLR p.33 (= (51), (53)) and structured diffusion ODE (61), p.34 (= (52), (54)):

    dZ(t) = −1/(2(T − t)) ∇R^c(Z(t)|U_[K]) dt,        dZ̃(t) = 1/(2t) ∇R^c(Z̃(t)|U_[K]) dt.

With the subspaces held fixed these are the same gradient flow of ``R^c`` in log-time, run in opposite
directions (``dZ/d log(1/(T−t)) = −½∇R^c`` and ``dZ̃/d log t = +½∇R^c``), so the second inverts the first.
App. B.4, p.94, discretises them on exponentially spaced times, ``t_{ℓ+1} = (1 + 2κ) t_ℓ`` (436), which
turns (61) into the constant-step iteration ``Z̃^{ℓ+1} = Z̃^ℓ + κ∇R^c`` (434)-(435) — the decoder layer (62)
— and (55) into ``Z^{ℓ+1} = Z^ℓ − κ'∇R^c`` on ``T − t_{ℓ+1} = (1 − 2κ')(T − t_ℓ)`` — the encoder step (56).

We encode noisy tokens from ``T = σ²`` down to ``t_1 = σ_min²`` (the ODE is singular at t = T) in S
steps, decode back over the same span in S steps, and measure the reconstruction error against S, with a
fine RK4 integration of the log-time flow as the exact reference.  With L = S + 1 grid points,
``T = (1 + 2κ)^{L−1} t_1``; the paper prints ``(1 + 2κ)^L t_1`` (an off-by-one).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

from ..objectives import subspace_coding_rate, subspace_coding_rate_grad
from ._report import check, finish, loglog_slope, new_figure, problem_size, progress, single_threaded, style_axis
from .steps import eps_from_beta
from .synthetic import (
    check_orthogonal_fit,
    check_positive,
    check_positive_int,
    make_generator,
    off_subspace_energy,
    random_subspaces,
    relative_error,
    sample_subspace_mixture,
)

__all__ = ["diffusion_grid", "structured_denoise", "structured_diffuse", "log_time_flow", "run_diffusion"]


def diffusion_grid(T: float, t1: float, steps: int) -> tuple[np.ndarray, float]:
    """The exponential grid (436) ``t_1 < … < t_L = T`` with ``L = steps + 1`` points and its κ (435)."""
    check_positive_int(steps=steps)
    check_positive(T=T, t1=t1)
    if not t1 < T:
        raise ValueError(f"need t1 < T (the flows run from t1 = σ_min² to T = σ²), got t1={t1}, T={T}")
    kappa = ((T / t1) ** (1 / steps) - 1) / 2
    return t1 * (1 + 2 * kappa) ** np.arange(steps + 1), kappa


def structured_denoise(Z: Tensor, U: Tensor, eps: float, T: float, t1: float, steps: int) -> list[Tensor]:
    """Euler discretisation of the structured denoising ODE (55) from t = 0 to t = T − t1 (encoder, (56)).

    The remaining noise ``T − t`` decays geometrically from T to t1, so every step is
    ``Z ← Z − κ'∇R^c(Z|U)`` with ``κ' = (1 − (t1/T)^{1/S})/2``.  Returns all iterates.
    """
    check_positive_int(steps=steps)
    check_positive(T=T, t1=t1)
    kappa = (1 - (t1 / T) ** (1 / steps)) / 2
    out = [Z]
    for _ in range(steps):
        out.append(out[-1] - kappa * subspace_coding_rate_grad(out[-1], U, eps))
    return out


def structured_diffuse(Z: Tensor, U: Tensor, eps: float, T: float, t1: float, steps: int) -> list[Tensor]:
    """Euler discretisation (434) of the structured diffusion ODE (61) from t1 to T (decoder, (62)):
    ``Z̃ ← Z̃ + κ∇R^c(Z̃|U)`` on the grid (436).  Returns all iterates."""
    _, kappa = diffusion_grid(T, t1, steps)
    out = [Z]
    for _ in range(steps):
        out.append(out[-1] + kappa * subspace_coding_rate_grad(out[-1], U, eps))
    return out


def log_time_flow(Z: Tensor, U: Tensor, eps: float, log_span: float, direction: float, steps: int = 200) -> Tensor:
    """Reference solution: RK4 on ``dZ/du = direction · ½∇R^c(Z|U)`` for ``u ∈ [0, log_span]``.

    ``direction = −1`` is the denoising ODE (55) and ``+1`` the diffusion ODE (61) in log-time.
    """
    h = log_span / steps

    def f(Y: Tensor) -> Tensor:
        return 0.5 * direction * subspace_coding_rate_grad(Y, U, eps)

    for _ in range(steps):
        k1 = f(Z)
        k2 = f(Z + h / 2 * k1)
        k3 = f(Z + h / 2 * k2)
        k4 = f(Z + h * k3)
        Z = Z + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return Z


@single_threaded
def run_diffusion(
    out_dir: str | Path | None = None,
    *,
    d: int = 64,
    K: int = 4,
    p: int = 16,
    n: int = 64,
    sigma: float = 0.3,
    sigma_min: float = 0.03,
    beta: float = 1.0,
    steps: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
    reference_steps: int = 200,
    trajectory_steps: int = 16,
    seed: int = 0,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Encode (55) → decode (61) noisy subspace tokens; reconstruction and discretisation error vs steps.

    ``T = σ²`` (the tokens' noise level, model (231)) and ``t_1 = σ_min²``; ``β = p/(nε²)`` sets ε.
    Writes ``diffusion.{png,json}`` to ``out_dir`` if given.
    """
    start = time.perf_counter()
    check_positive_int(d=d, K=K, p=p, n=n, reference_steps=reference_steps, trajectory_steps=trajectory_steps)
    check_orthogonal_fit(d, K, p)
    check_positive(sigma=sigma, sigma_min=sigma_min, beta=beta)
    steps = _check_steps(sigma, sigma_min, steps)
    r = _diffusion_compute(
        d, K, p, n, sigma, sigma_min, beta, steps, reference_steps, trajectory_steps, seed, progress_bar
    )
    Z0, T, t1, eps, rc, off, enc_ref = r["Z0"], r["T"], r["t1"], r["eps"], r["rc"], r["off"], r["enc_ref"]
    checks = _diffusion_checks(r, steps)
    fig = _diffusion_figure(r, steps, trajectory_steps, title=f"(d={d}, K={K}, p={p}, n={n}, σ={sigma}→{sigma_min})")
    config = {
        **problem_size(d, K, p, n),
        "sigma": sigma,
        "sigma_min": sigma_min,
        "T": T,
        "t1": t1,
        "beta": beta,
        "eps": eps,
        "steps": steps,
        "reference_steps": reference_steps,
        "trajectory_steps": trajectory_steps,
        "seed": seed,
    }
    results = {
        "steps": steps,
        **r["t"],
        "exact_round_trip_error": r["round_trip_ref"],
        "rc_input": rc(Z0),
        "rc_encoded_exact": rc(enc_ref),
        "off_subspace_fraction_input": off(Z0),
        "off_subspace_fraction_encoded_exact": off(enc_ref),
        "trajectory": r["trajectory"],
        "grid": r["grid"],
    }
    return finish("diffusion", config, results, checks, fig, start, out_dir)


def _check_steps(sigma: float, sigma_min: float, steps: Sequence[int]) -> list[int]:
    """The noise range and step counts of :func:`run_diffusion`, checked; returns the sorted distinct counts."""
    if not sigma_min < sigma:
        raise ValueError(
            f"sigma_min must be below sigma (the flows run from σ² down to σ_min²), got {sigma_min} >= {sigma}"
        )
    if not steps:
        raise ValueError("steps must be a non-empty list of step counts, e.g. 1 2 4 8 16")
    for s in steps:
        check_positive_int(steps=s)
    return sorted(set(int(s) for s in steps))


def _diffusion_compute(
    d: int,
    K: int,
    p: int,
    n: int,
    sigma: float,
    sigma_min: float,
    beta: float,
    steps: list[int],
    reference_steps: int,
    trajectory_steps: int,
    seed: int,
    progress_bar: bool,
) -> dict[str, Any]:
    """The exact (RK4) flows, the discretised round trips per step count, one trajectory and the time grid."""
    g = make_generator(seed)
    U = random_subspaces(d, K, p, seed=g)
    S = sample_subspace_mixture(U, n, sigma, seed=g)
    Z0, eps, T, t1 = S.Z, eps_from_beta(p, n, beta), sigma**2, sigma_min**2
    span = math.log(T / t1)
    rc = lambda Z: float(subspace_coding_rate(Z, U, eps))  # noqa: E731
    off = lambda Z: float(off_subspace_energy(Z, U, S.labels).sum() / Z.pow(2).sum())  # noqa: E731

    enc_ref = log_time_flow(Z0, U, eps, span, -1.0, reference_steps)
    round_trip_ref = relative_error(log_time_flow(enc_ref, U, eps, span, +1.0, reference_steps), Z0)
    t = _diffusion_rows(Z0, U, eps, T, t1, steps, enc_ref, rc, off, progress_bar)
    r = {"Z0": Z0, "U": U, "eps": eps, "T": T, "t1": t1, "span": span, "rc": rc, "off": off}
    r |= {"enc_ref": enc_ref, "round_trip_ref": round_trip_ref, "t": t}
    return r | _diffusion_trajectory(Z0, U, eps, T, t1, trajectory_steps, rc, off)


def _diffusion_rows(
    Z0: Tensor,
    U: Tensor,
    eps: float,
    T: float,
    t1: float,
    steps: list[int],
    enc_ref: Tensor,
    rc: Callable[[Tensor], float],
    off: Callable[[Tensor], float],
    progress_bar: bool,
) -> dict[str, np.ndarray]:
    """Encode then decode with ``s`` steps per flow for each ``s`` in ``steps``; errors and rates per ``s``."""
    rows: dict[str, list[float]] = {}
    for s in progress(steps, "diffusion steps", progress_bar):
        enc = structured_denoise(Z0, U, eps, T, t1, s)[-1]
        dec = structured_diffuse(enc, U, eps, T, t1, s)[-1]
        row = {
            "kappa_encoder": (1 - (t1 / T) ** (1 / s)) / 2,
            "kappa_decoder": diffusion_grid(T, t1, s)[1],
            "reconstruction_error": relative_error(dec, Z0),
            "encoder_error_vs_ode": relative_error(enc, enc_ref),
            "decoder_error_vs_ode": relative_error(structured_diffuse(enc_ref, U, eps, T, t1, s)[-1], Z0),
            "rc_encoded": rc(enc),
            "rc_decoded": rc(dec),
            "off_subspace_fraction_encoded": off(enc),
        }
        for k, v in row.items():
            rows.setdefault(k, []).append(v)
    return {k: np.array(v) for k, v in rows.items()}


def _diffusion_trajectory(
    Z0: Tensor,
    U: Tensor,
    eps: float,
    T: float,
    t1: float,
    trajectory_steps: int,
    rc: Callable[[Tensor], float],
    off: Callable[[Tensor], float],
) -> dict[str, Any]:
    """A trajectory through encoder and decoder, and the endpoints of the time grid (436)."""
    path = structured_denoise(Z0, U, eps, T, t1, trajectory_steps)
    path += structured_diffuse(path[-1], U, eps, T, t1, trajectory_steps)[1:]
    trajectory = {
        "rc": [rc(Z) for Z in path],
        "off_subspace_fraction": [off(Z) for Z in path],
        "norm_ratio": [float(Z.norm() / Z0.norm()) for Z in path],
    }

    times, kappa = diffusion_grid(T, t1, trajectory_steps)
    L = len(times)
    grid = {
        "L_points": L,
        "kappa": kappa,
        "t_L": times[-1],
        "T": T,
        "(1+2κ)^(L-1) t_1": (1 + 2 * kappa) ** (L - 1) * t1,
        "(1+2κ)^L t_1 (as printed)": (1 + 2 * kappa) ** L * t1,
    }
    return {"path": path, "trajectory": trajectory, "grid": grid, "L": L}


def _diffusion_checks(r: dict[str, Any], steps: list[int]) -> list[dict[str, Any]]:
    """Round trip and first-order convergence, compression by denoising, R^c restored, App. B.4's endpoint."""
    t, rc, off, Z0, enc_ref = r["t"], r["rc"], r["off"], r["Z0"], r["enc_ref"]
    round_trip_ref, span, grid, T, L = r["round_trip_ref"], r["span"], r["grid"], r["T"], r["L"]
    big = np.array(steps) >= 8
    slope_rec = loglog_slope(np.array(steps)[big], t["reconstruction_error"][big]) if big.sum() > 1 else math.nan
    slope_enc = loglog_slope(np.array(steps)[big], t["encoder_error_vs_ode"][big]) if big.sum() > 1 else math.nan
    fmt = lambda a: ", ".join(f"{x:.3g}" for x in a)  # noqa: E731
    rc_err = np.abs(t["rc_decoded"] / rc(Z0) - 1)
    return [
        check(
            "decoding (61) inverts encoding (55): the reconstruction error falls with the number of steps",
            bool((np.diff(t["reconstruction_error"]) < 0).all()),
            f"relative error {fmt(t['reconstruction_error'])} for S = {steps}; log-log slope {slope_rec:.2f} for "
            f"S ≥ 8 (first order: −1); exact flows round-trip to {round_trip_ref:.1e}",
        ),
        check(
            "the discretised encoder (56) converges to the denoising ODE (55) at first order",
            bool((np.diff(t["encoder_error_vs_ode"]) < 0).all() and -1.3 < slope_enc < -0.7),
            f"error vs RK4 reference {fmt(t['encoder_error_vs_ode'])}; slope {slope_enc:.2f}",
        ),
        check(
            "structured denoising compresses and denoises: R^c and the off-subspace energy fraction fall",
            rc(enc_ref) < rc(Z0) and off(enc_ref) < off(Z0),
            f"R^c {rc(Z0):.2f} → {rc(enc_ref):.2f}, off-subspace fraction {off(Z0):.4f} → {off(enc_ref):.4f}, "
            f"token norm × {float(enc_ref.norm() / Z0.norm()):.3f} (exact flow over log(T/t₁) = {span:.2f})",
        ),
        check(
            "structured diffusion restores R^c (the round-trip R^c error falls with S, < 5% at the finest)",
            bool((np.diff(rc_err) < 0).all() and rc_err[-1] < 0.05),
            f"|R^c(decoded)/R^c(input) − 1| = {fmt(rc_err)}; R^c {rc(Z0):.3f} → {t['rc_decoded'][-1]:.3f} at "
            f"S = {steps[-1]}, {t['rc_decoded'][0]:.1f} at S = {steps[0]} (κ_dec = {t['kappa_decoder'][0]:.3g})",
        ),
        check(
            "App. B.4's endpoint T = t_L = (1+2κ)^L t₁ as printed",
            abs(grid["(1+2κ)^L t_1 (as printed)"] / T - 1) < 1e-9,
            f"with L = {L} grid points (436) gives t_L = (1+2κ)^(L−1) t₁ = {grid['(1+2κ)^(L-1) t_1']:.6g} = T; "
            f"(1+2κ)^L t₁ = {grid['(1+2κ)^L t_1 (as printed)']:.6g} overshoots by 1+2κ",
        ),
    ]


def _diffusion_figure(r: dict[str, Any], steps: list[int], trajectory_steps: int, title: str) -> Figure:
    """Discretisation error vs steps, and R^c, off-subspace energy and norm along one trajectory."""
    t, path, trajectory = r["t"], r["path"], r["trajectory"]
    fig, ax = new_figure(
        2,
        title=f"Structured denoising (55) then diffusion (61) on the same subspaces {title}",
        width=5.4,
    )
    a = ax[0, 0]
    x = np.array(steps)
    a.plot(x, t["reconstruction_error"], "o-", label="‖decode(encode(Z)) − Z‖/‖Z‖")
    a.plot(x, t["encoder_error_vs_ode"], "s-", label="encoder vs exact ODE (55)")
    a.plot(x, t["decoder_error_vs_ode"], "^-", label="decoder vs exact ODE (61)")
    a.plot(x, t["reconstruction_error"][-1] * x[-1] / x, "k:", label="∝ 1/S")
    style_axis(
        a, "discretisation: error vs number of steps", "steps S per flow", "relative error", logx=True, logy=True
    )
    a = ax[0, 1]
    pos = np.arange(len(path))
    r0 = trajectory["rc"][0]
    a.plot(pos, np.array(trajectory["rc"]) / r0, "o-", ms=3, label="R^c / R^c(input)")
    a.plot(
        pos,
        np.array(trajectory["off_subspace_fraction"]) / trajectory["off_subspace_fraction"][0],
        "s-",
        ms=3,
        label="off-subspace energy fraction (rel.)",
    )
    a.plot(pos, trajectory["norm_ratio"], "^-", ms=3, label="‖Z‖ / ‖Z(input)‖")
    a.axvline(trajectory_steps, color="k", ls=":", lw=0.8, label="encoder | decoder")
    style_axis(a, f"path through encoder and decoder (S = {trajectory_steps})", "step", "relative to the input")
    return fig
