"""Experiment ``unrolled``: a training-free CRATE built from the ground truth.

Each layer ℓ is the alternating step (24)-(25), JMLR p.21, with no learned parameter:

1. normalise the tokens to unit norm (the role of the pre-LayerNorm; Approximation 9 assumes unit-norm
   tokens, JMLR p.57 and footnote 18, p.59);
2. compression ``Z^{ℓ+1/2}`` = one step on ``R^c(·|U^ℓ)``: the exact gradient step (26), the MSSA
   step (34), or the implemented residual step ``Z + κβ MSSA`` (45);
3. sparsification ``Z^{ℓ+1} = ISTA(Z^{ℓ+1/2}|D^ℓ)`` (43)-(44) with an orthogonal dictionary ``D^ℓ``
   and the step ``η = 1/‖D‖² = 1``, which makes one ISTA step the exact non-negative LASSO solution
   ``ReLU(D^{ℓ*} Z^{ℓ+1/2} − λ)`` (cf. eq. (123), JMLR p.62); the subspaces are carried along,
   ``U^{ℓ+1} = D^{ℓ*} U^ℓ``.

``dictionary="subspaces"`` uses ``D^ℓ = [U^ℓ_1, …, U^ℓ_K]`` (completed to an orthonormal basis), the
dictionary in which subspace tokens are block-sparse; ``"random"`` uses a Haar-random rotation.
We track per half-layer ``R^c`` and ``R`` (of unit-normalised tokens, eqs. (8), (13)), the distance of
each token to its own subspace, and the fraction of non-zeros after each ISTA step (JMLR Fig. 14's
measures, p.48).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from ..objectives import coding_rate, subspace_coding_rate
from ._report import check, finish, new_figure, problem_size, progress, single_threaded, style_axis
from .steps import STEP_KINDS, compression_step, eps_from_beta, ista_step
from .synthetic import (
    DTYPE,
    SubspaceSample,
    check_orthogonal_fit,
    check_positive,
    check_positive_int,
    make_generator,
    normalize_tokens,
    random_subspaces,
    relative_distance_to_subspaces,
    sample_subspace_mixture,
)

__all__ = ["DICTIONARIES", "orthogonal_dictionary", "unrolled_crate", "run_unrolled"]

DICTIONARIES = ("subspaces", "random")
VARIANTS = (("exact", "subspaces"), ("mssa", "subspaces"), ("skip", "subspaces"), ("exact", "random"))


def orthogonal_dictionary(U: Tensor, kind: str = "subspaces", seed: int | torch.Generator | None = 0) -> Tensor:
    """A d×d orthogonal dictionary: ``[U_1 … U_K]`` completed to a basis (``"subspaces"``) or Haar-random."""
    K, d, p = U.shape
    g = make_generator(seed)
    if kind == "subspaces":
        B = U.transpose(0, 1).reshape(d, K * p)
        if K * p == d:
            return B.clone()
        Q, _ = torch.linalg.qr(torch.cat([B, torch.randn(d, d - K * p, generator=g, dtype=U.dtype)], 1))
        return torch.cat([B, Q[:, K * p :]], 1)  # the first K·p columns are exactly the bases
    if kind == "random":
        Q, R = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=U.dtype))
        return Q * torch.sign(torch.diagonal(R))  # Haar measure
    raise ValueError(f"unknown dictionary {kind!r}; choose one of {DICTIONARIES}")


def _check_unrolled_args(layers: int, eps: float, kappa_beta: float, lambd: float, step: str, dictionary: str) -> None:
    check_positive_int(layers=layers)
    check_positive(eps=eps, kappa_beta=kappa_beta)
    check_positive(allow_zero=True, lambd=lambd)
    if step not in STEP_KINDS:
        raise ValueError(f"unknown compression step {step!r}; choose one of {STEP_KINDS}")
    if dictionary not in DICTIONARIES:
        raise ValueError(f"unknown dictionary {dictionary!r}; choose one of {DICTIONARIES}")


def unrolled_crate(
    sample: SubspaceSample,
    *,
    layers: int = 12,
    eps: float = 0.35,
    kappa_beta: float = 0.5,
    lambd: float = 0.05,
    step: str = "exact",
    dictionary: str = "subspaces",
    seed: int | torch.Generator | None = 0,
) -> dict[str, np.ndarray]:
    """Run ``layers`` training-free CRATE layers on ``sample`` and measure every half-layer.

    Returns arrays indexed by the positions ``0, ½, 1, …, L`` (``"position"``): ``"rc"`` and ``"R"``
    (coding rates of the unit-normalised tokens against the current ``U^ℓ``), ``"distance"`` (mean sine
    of the angle of a token to its own subspace), ``"nonzero_fraction"`` (1 at the input, then after each
    ISTA step; NaN at half positions), and per layer ``"rc_step_change"``, the change of the *raw*
    ``R^c`` made by the compression step from the unit-norm input, and ``"zero_tokens"``, the number of
    tokens the ISTA step set entirely to zero (their distance counts as 0).
    """
    _check_unrolled_args(layers, eps, kappa_beta, lambd, step, dictionary)
    g = make_generator(seed)
    U, labels = sample.U.to(DTYPE), sample.labels
    n, p = sample.n, U.shape[-1]
    kappa = kappa_beta * n * eps**2 / p  # κ = (κβ)/β
    Z = sample.Z.to(DTYPE)
    rc, R, dist, nnz, rc_step, zero_tokens = [], [], [], [1.0], [], []

    def measure(Zm: Tensor, Um: Tensor) -> None:
        Zn = normalize_tokens(Zm)
        rc.append(float(subspace_coding_rate(Zn, Um, eps)))
        R.append(float(coding_rate(Zn, eps)))
        dist.append(float(relative_distance_to_subspaces(Zm, Um, labels).mean()))

    measure(Z, U)
    for _ in range(layers):
        Zin = normalize_tokens(Z)
        half = compression_step(Zin, U, eps, kappa, step)  # type: ignore[arg-type]
        rc_step.append(float(subspace_coding_rate(half, U, eps) - subspace_coding_rate(Zin, U, eps)))
        measure(half, U)
        D = orthogonal_dictionary(U, dictionary, g)
        Z = ista_step(half, half, D, 1.0, lambd)  # = ReLU(half D − λ): eq. (44) with η = 1
        U = D.T @ U
        measure(Z, U)
        nnz += [float("nan"), float((Z != 0).to(DTYPE).mean())]
        zero_tokens.append(int((Z == 0).all(-1).sum()))
    return {
        "position": np.arange(2 * layers + 1) / 2,
        "rc": np.array(rc),
        "R": np.array(R),
        "distance": np.array(dist),
        "nonzero_fraction": np.array(nnz),
        "rc_step_change": np.array(rc_step),
        "zero_tokens": np.array(zero_tokens),
    }


def _all_decreasing(x: np.ndarray) -> bool:
    return bool((np.diff(x) < 0).all())


@single_threaded
def run_unrolled(
    out_dir: str | Path | None = None,
    *,
    d: int = 64,
    K: int = 4,
    p: int = 16,
    n: int = 128,
    sigma: float = 0.2,
    layers: int = 12,
    beta: float = 1.0,
    kappa_beta: float = 0.5,
    lambd: float = 0.05,
    seed: int = 0,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """The training-free CRATE of :func:`unrolled_crate` in four variants on one noisy sample.

    Variants: exact / MSSA / residual compression step with the subspace dictionary, and the exact
    step with a random orthogonal dictionary.  ``β = p/(nε²)`` sets ε; ``κβ`` the compression step.
    Writes ``unrolled.{png,json}`` to ``out_dir`` if given.
    """
    start = time.perf_counter()
    check_positive_int(d=d, K=K, p=p, n=n, layers=layers)
    check_orthogonal_fit(d, K, p)
    check_positive(beta=beta, kappa_beta=kappa_beta)
    check_positive(allow_zero=True, sigma=sigma, lambd=lambd)
    eps = eps_from_beta(p, n, beta)
    runs = _unrolled_compute(d, K, p, n, sigma, layers, eps, kappa_beta, lambd, seed, progress_bar)
    rand_dist_floor = float(np.sqrt(1 - p / d))
    checks = _unrolled_exact_checks(runs, layers) + _unrolled_variant_checks(runs, rand_dist_floor)
    title = f"(d={d}, K={K}, p={p}, n={n}, σ={sigma}, β={beta}, κβ={kappa_beta}, λ={lambd})"
    fig = _unrolled_figure(runs, rand_dist_floor, title)
    config = {
        **problem_size(d, K, p, n),
        "sigma": sigma,
        "layers": layers,
        "beta": beta,
        "eps": eps,
        "kappa_beta": kappa_beta,
        "lambd": lambd,
        "eta": 1.0,
        "seed": seed,
        "variants": [f"{s}/{dd}" for s, dd in VARIANTS],
    }
    return finish("unrolled", config, {"runs": runs}, checks, fig, start, out_dir)


def _unrolled_compute(
    d: int,
    K: int,
    p: int,
    n: int,
    sigma: float,
    layers: int,
    eps: float,
    kappa_beta: float,
    lambd: float,
    seed: int,
    progress_bar: bool,
) -> dict[str, dict[str, np.ndarray]]:
    """The measurements of :func:`unrolled_crate` for each of the four variants, on one sample."""
    g = make_generator(seed)
    U = random_subspaces(d, K, p, seed=g)
    sample = sample_subspace_mixture(U, n, sigma, seed=g)
    runs: dict[str, dict[str, np.ndarray]] = {}
    for step, dic in progress(VARIANTS, "unrolled", progress_bar):
        runs[f"{step}/{dic}"] = unrolled_crate(
            sample, layers=layers, eps=eps, kappa_beta=kappa_beta, lambd=lambd, step=step, dictionary=dic, seed=g
        )
    return runs


_FULL = slice(0, None, 2)  # layer outputs Z^1, …, Z^{L+1} (and the input)


def _arr(x: np.ndarray, precision: int = 2) -> str:
    return np.array2string(x, precision=precision, max_line_width=1000)


def _step_drop(run: dict[str, np.ndarray], key: str) -> np.ndarray:
    return run[key][1::2] - run[key][0:-1:2]  # compression half-step: position ℓ+½ minus ℓ


def _unrolled_exact_checks(runs: dict[str, dict[str, np.ndarray]], layers: int) -> list[dict[str, Any]]:
    """The claims on the exact step with the subspace dictionary: R^c, sparsity, distance and ΔR with depth."""
    ex = runs["exact/subspaces"]
    nz = ex["nonzero_fraction"][_FULL][1:]
    delta_r = ex["R"][_FULL] - ex["rc"][_FULL]
    return [
        check(
            "exact compression step lowers R^c at every layer",
            bool((_step_drop(ex, "rc") < 0).all()),
            f"R^c changes {_arr(_step_drop(ex, 'rc'))}",
        ),
        check(
            "R^c of the layer outputs decreases with depth (exact step, subspace dictionary)",
            _all_decreasing(ex["rc"][_FULL]),
            f"R^c {ex['rc'][0]:.2f} (input) → {ex['rc'][-1]:.2f} (layer {layers})",
        ),
        check(
            "the fraction of non-zeros decreases with depth (ISTA sparsifies, subspace dictionary)",
            _all_decreasing(nz),
            f"non-zeros {nz[0]:.3f} (layer 1) → {nz[-1]:.3f} (layer {layers})",
        ),
        check(
            "tokens move towards their subspaces (distance at the output < at the input)",
            bool(ex["distance"][-1] < ex["distance"][0]),
            f"mean sine to own subspace {ex['distance'][0]:.3f} → {ex['distance'][-1]:.3g}; the first exact "
            f"compression step alone: {ex['distance'][0]:.3f} → {ex['distance'][1]:.3f}; "
            f"{int(ex['zero_tokens'].max())} tokens zeroed by ISTA",
        ),
        check(
            "the rate reduction ΔR = R − R^c grows with depth (exact step, subspace dictionary)",
            bool(delta_r[-1] > delta_r[0]),
            f"ΔR {delta_r[0]:.2f} → {delta_r[-1]:.2f}: R falls from {ex['R'][0]:.2f} to {ex['R'][-1]:.2f} "
            "(thresholding and ReLU shrink the whole token set, not only each subspace)",
        ),
    ]


def _unrolled_variant_checks(runs: dict[str, dict[str, np.ndarray]], rand_dist_floor: float) -> list[dict[str, Any]]:
    """The claims on the MSSA and residual steps and on a random dictionary."""
    ms, sk, rd = runs["mssa/subspaces"], runs["skip/subspaces"], runs["exact/random"]
    return [
        check(
            "the MSSA step (1−κβ)Z + κβ·MSSA lowers R^c (of the renormalised tokens) at every layer",
            bool((_step_drop(ms, "rc") < 0).all()),
            f"changes {_arr(_step_drop(ms, 'rc'))}",
        ),
        check(
            "the MSSA step moves tokens towards their subspaces at every layer",
            bool((_step_drop(ms, "distance") < 0).all()),
            f"distance change per MSSA step {_arr(_step_drop(ms, 'distance'), 3)}"
            ": near-uniform softmax weights average over all tokens, which after a ReLU share a large mean",
        ),
        check(
            "the residual step Z + κβ·MSSA (eq. (45)) lowers the raw R^c at every layer",
            bool((sk["rc_step_change"] < 0).all()),
            f"raw R^c change per step {_arr(sk['rc_step_change'])}",
        ),
        check(
            "with a random orthogonal dictionary, tokens stay near their (rotated) subspaces",
            bool(rd["distance"][-1] < 0.5 * rand_dist_floor),
            f"distance {rd['distance'][0]:.3f} → {rd['distance'][-1]:.3f} vs {rand_dist_floor:.3f} for a random "
            "direction: a ReLU in a basis not aligned with the subspaces destroys the structure",
        ),
    ]


def _unrolled_figure(runs: dict[str, dict[str, np.ndarray]], rand_dist_floor: float, title: str) -> Figure:
    """R^c, R, distance to the own subspace and sparsity along the layers, for each variant."""
    fig, ax = new_figure(
        2,
        2,
        title=f"Training-free CRATE with ground-truth U {title}",
        width=5.2,
        height=3.6,
    )
    styles = {"exact/subspaces": "o-", "mssa/subspaces": "s-", "skip/subspaces": "^-", "exact/random": "x--"}
    for name, run in runs.items():
        pos = run["position"]
        ax[0, 0].plot(pos, run["rc"], styles[name], ms=3, label=name)
        ax[0, 1].plot(pos, run["R"], styles[name], ms=3, label=name)
        ax[1, 0].plot(pos, run["distance"], styles[name], ms=3, label=name)
        ax[1, 1].plot(pos[_FULL], run["nonzero_fraction"][_FULL], styles[name], ms=3, label=name)
    ax[1, 0].axhline(rand_dist_floor, color="grey", lw=0.8, ls=":", label="random direction")
    xl = "layer (x.5 = after compression, integer = after ISTA)"
    style_axis(ax[0, 0], "compression R^c(Z|U^ℓ) of unit-norm tokens", xl, "R^c (nats)")
    style_axis(ax[0, 1], "coding rate R(Z) of unit-norm tokens", xl, "R (nats)")
    style_axis(ax[1, 0], "distance to own subspace", xl, "mean sine of the angle to U_s")
    style_axis(ax[1, 1], "sparsity after ISTA", "layer", "fraction of non-zeros", logy=True)
    return fig
