"""Experiment ``tweedie``: denoising against the subspace Gaussian mixture (JMLR §3.1, pp.29-30; App. B.2).

Model (Prop. 14, JMLR pp.70-71): ``x = U_s α + σ w`` with ``s ~ π``, ``α ~ N(0, Λ)``, ``w ~ N(0, I_d)``;
``Σ_k = U_k Λ U_k*`` and ``M_k = (Σ_k + σ²I)^{-1/2}``.

* Exact score, eq. (215)/(225), p.71: ``∇log q(x) = −Σ_k w_k(x) M_kM_k* x`` with
  ``w(x) = softmax_k(−½‖M_k*x‖² + log π_k + log det M_k)`` (the last two terms are equal across k
  under the normalisation (213), which is how (215) is written).
* Tweedie's formula (46), p.29: ``E[z|x] = x + σ² ∇log q(x)``.
* Attention-form approximation (47) = (210), pp.30, 70:
  ``E[z|x] ≈ Σ_k softmax_k(‖U_k*x‖² / (2σ²)) U_kU_k* x``, which tends to the projection onto the
  best subspace as σ → 0 (Remark 13).

Independent references: ``log q`` written with ``torch.distributions.MultivariateNormal`` and
differentiated by autograd, and the posterior mean from Bayes' rule, ``Σ_k P(s=k|x) Σ_k(Σ_k+σ²I)⁻¹x``.
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

from ._report import check, finish, loglog_slope, new_figure, problem_size, progress, single_threaded, style_axis
from .synthetic import (
    SubspaceSample,
    check_orthogonal_fit,
    check_positive_int,
    check_positive_list,
    make_generator,
    random_subspaces,
    relative_error,
    sample_subspace_mixture,
    subspace_codes,
)

__all__ = [
    "gmm_log_density",
    "gmm_score",
    "gmm_posterior_mean",
    "tweedie_denoiser",
    "attention_denoiser",
    "nearest_subspace_projection",
    "run_tweedie",
]


def _weights(U: Tensor, weights: Tensor | None) -> Tensor:
    K = U.shape[0]
    return torch.full((K,), 1.0 / K, dtype=U.dtype) if weights is None else torch.as_tensor(weights, dtype=U.dtype)


def _noisy_covariances(U: Tensor, sigma: float, coef_var: float) -> Tensor:
    """``Σ_k + σ²I = coef_var·U_kU_k* + σ²I``, shape ``(K, d, d)``."""
    d = U.shape[1]
    return coef_var * U @ U.transpose(1, 2) + sigma**2 * torch.eye(d, dtype=U.dtype)


def gmm_log_density(
    x: Tensor, U: Tensor, sigma: float, *, weights: Tensor | None = None, coef_var: float = 1.0
) -> Tensor:
    """``log q(x)`` of the noisy mixture for row tokens ``x`` ``(n, d)``, via ``MultivariateNormal`` (eq. (219))."""
    cov = _noisy_covariances(U, sigma, coef_var)
    mvn = torch.distributions.MultivariateNormal(torch.zeros(U.shape[1], dtype=U.dtype), covariance_matrix=cov)
    return torch.logsumexp(mvn.log_prob(x.unsqueeze(-2)) + _weights(U, weights).log(), dim=-1)


def gmm_score(x: Tensor, U: Tensor, sigma: float, *, weights: Tensor | None = None, coef_var: float = 1.0) -> Tensor:
    """The exact score ``∇_x log q(x)`` of eq. (215)/(225), JMLR p.71, for row tokens ``x`` ``(n, d)``."""
    evals, V = torch.linalg.eigh(_noisy_covariances(U, sigma, coef_var))
    M = V @ torch.diag_embed(evals.rsqrt()) @ V.transpose(1, 2)  # M_k = (Σ_k + σ²I)^{-1/2}, symmetric
    Mx = torch.einsum("kde,nd->nke", M, x)  # M_k* x
    logits = -0.5 * Mx.pow(2).sum(-1) + _weights(U, weights).log() - 0.5 * evals.log().sum(-1)
    return -torch.einsum("kde,nke,nk->nd", M, Mx, torch.softmax(logits, dim=-1))


def gmm_posterior_mean(
    x: Tensor, U: Tensor, sigma: float, *, weights: Tensor | None = None, coef_var: float = 1.0
) -> Tensor:
    """``E[z|x]`` by Bayes' rule: ``Σ_k P(s=k|x) Σ_k(Σ_k + σ²I)⁻¹ x`` (the exact MMSE denoiser)."""
    cov = _noisy_covariances(U, sigma, coef_var)
    mvn = torch.distributions.MultivariateNormal(torch.zeros(U.shape[1], dtype=U.dtype), covariance_matrix=cov)
    post = torch.softmax(mvn.log_prob(x.unsqueeze(-2)) + _weights(U, weights).log(), dim=-1)
    gain = coef_var * U @ U.transpose(1, 2) @ torch.linalg.inv(cov)  # Σ_k (Σ_k + σ²I)⁻¹
    return torch.einsum("kde,ne,nk->nd", gain, x, post)


def tweedie_denoiser(x: Tensor, U: Tensor, sigma: float, **kw: Any) -> Tensor:
    """Tweedie's formula (46), JMLR p.29: ``x + σ² ∇log q(x)`` with the score of eq. (215)."""
    return x + sigma**2 * gmm_score(x, U, sigma, **kw)


def attention_denoiser(x: Tensor, U: Tensor, sigma: float) -> Tensor:
    """The attention-form approximation (47), JMLR p.30: ``Σ_k softmax_k(‖U_k*x‖²/(2σ²)) U_kU_k* x``."""
    codes = subspace_codes(x, U)
    w = torch.softmax(codes.pow(2).sum(-1) / (2 * sigma**2), dim=-1)
    return torch.einsum("kdp,nkp,nk->nd", U, codes, w)


def nearest_subspace_projection(x: Tensor, U: Tensor) -> Tensor:
    """Projection of each token onto the subspace that captures most of its energy (the σ → 0 limit of (47))."""
    codes = subspace_codes(x, U)
    best = codes.pow(2).sum(-1).argmax(-1)
    return torch.einsum("ndp,np->nd", U[best], codes[torch.arange(x.shape[0]), best])


@single_threaded
def run_tweedie(
    out_dir: str | Path | None = None,
    *,
    d: int = 32,
    K: int = 4,
    p: int = 4,
    n: int = 1024,
    sigmas: Sequence[float] = tuple(float(s) for s in np.logspace(-2, 0, 9)),
    seed: int = 0,
    progress_bar: bool = True,
) -> dict[str, Any]:
    """Score (215) vs autograd, Tweedie (46) vs Bayes, and the attention form (47) vs the exact posterior mean.

    Orthogonal subspaces, ``Λ = I_p`` and uniform π, so the normalisation (213) holds.  Writes
    ``tweedie.{png,json}`` to ``out_dir`` if given.
    """
    start = time.perf_counter()
    check_positive_int(d=d, K=K, p=p, n=n)
    check_orthogonal_fit(d, K, p)
    sigmas = check_positive_list("sigmas", sigmas, "0.01, 0.1, 1")
    t = _tweedie_compute(d, K, p, n, sigmas, seed, progress_bar)
    checks = _tweedie_checks(t, np.array(sigmas))
    fig = _tweedie_figure(t, np.array(sigmas), title=f"(d={d}, K={K}, p={p}, Λ=I)")
    config = {
        **problem_size(d, K, p, n),
        "sigmas": sigmas,
        "seed": seed,
        "model": "x = U_s α + σ w, α ~ N(0, I_p), uniform π (normalisation (213) holds)",
    }
    return finish("tweedie", config, t | {"sigma": sigmas}, checks, fig, start, out_dir)


def _tweedie_row(S: SubspaceSample, U: Tensor, sigma: float) -> dict[str, float]:
    """Score, Tweedie, attention form and their errors on one isotropic-noise sample at noise level σ."""
    x = S.Z.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(gmm_log_density(x, U, sigma).sum(), x)
    score = gmm_score(S.Z, U, sigma)
    bayes = gmm_posterior_mean(S.Z, U, sigma)
    tweedie = S.Z + sigma**2 * score
    att = attention_denoiser(S.Z, U, sigma)
    proj = nearest_subspace_projection(S.Z, U)
    codes = subspace_codes(S.Z, U).pow(2).sum(-1)
    w = torch.softmax(codes / (2 * sigma**2), dim=-1)
    return {
        "score_vs_autograd": relative_error(score, auto),
        "tweedie_vs_bayes": relative_error(tweedie, bayes),
        "attention_vs_posterior": relative_error(att, bayes),
        "attention_vs_projection": relative_error(att, proj),
        "attention_max_weight": float(w.max(-1).values.mean()),
        "argmax_accuracy": float((codes.argmax(-1) == S.labels).double().mean()),
        "mse_noisy": float((S.Z - S.signal).pow(2).sum(-1).mean()),
        "mse_posterior_mean": float((bayes - S.signal).pow(2).sum(-1).mean()),
        "mse_attention": float((att - S.signal).pow(2).sum(-1).mean()),
    }


def _tweedie_compute(
    d: int, K: int, p: int, n: int, sigmas: list[float], seed: int, progress_bar: bool
) -> dict[str, np.ndarray]:
    """The measurements of :func:`_tweedie_row` per σ, as arrays over ``sigmas``."""
    g = make_generator(seed)
    U = random_subspaces(d, K, p, seed=g)
    cols: dict[str, list[float]] = {}

    for sigma in progress(sigmas, "tweedie σ", progress_bar):
        row = _tweedie_row(sample_subspace_mixture(U, n, sigma, convention="isotropic", seed=g), U, sigma)
        for k, v in row.items():
            cols.setdefault(k, []).append(v)
    return {k: np.array(v) for k, v in cols.items()}


def _tweedie_checks(t: dict[str, np.ndarray], s: np.ndarray) -> list[dict[str, Any]]:
    """Exactness of (215) and (46), and the σ → 0 limits of the attention form (47)."""
    slope = (
        loglog_slope(s[: max(2, len(s) // 2)], t["attention_vs_posterior"][: max(2, len(s) // 2)])
        if len(s) > 1
        else math.nan
    )
    return [
        check(
            "the exact score (215) equals autograd of log q (relative error < 1e-8)",
            bool(t["score_vs_autograd"].max() < 1e-8),
            f"max relative error {t['score_vs_autograd'].max():.2e}",
        ),
        check(
            "Tweedie's formula (46) with the score (215) equals the Bayes posterior mean (< 1e-8)",
            bool(t["tweedie_vs_bayes"].max() < 1e-8),
            f"max relative error {t['tweedie_vs_bayes'].max():.2e}",
        ),
        check(
            "the attention form (47) → the posterior mean as σ → 0 (gap grows with σ; < 1e-3 at the smallest σ)",
            bool((np.diff(t["attention_vs_posterior"]) > 0).all() and t["attention_vs_posterior"][0] < 1e-3),
            f"relative gap {t['attention_vs_posterior'][0]:.2e} at σ={s[0]:g} … {t['attention_vs_posterior'][-1]:.3g} "
            f"at σ={s[-1]:g}; small-σ log-log slope {slope:.2f} (the 1/(1+σ²) shrink of the exact mean gives 2)",
        ),
        check(
            "as σ → 0, (47) becomes the projection onto the best subspace (gap < 1e-6 at the smallest σ)",
            bool(t["attention_vs_projection"][0] < 1e-6),
            f"gap {t['attention_vs_projection'][0]:.2e}; mean top softmax weight {t['attention_max_weight'][0]:.4f}, "
            f"best subspace = true one for {100 * t['argmax_accuracy'][0]:.1f}% of tokens",
        ),
        check(
            "the posterior mean denoises (MSE below that of the noisy tokens at every σ)",
            bool((t["mse_posterior_mean"] < t["mse_noisy"]).all()),
            f"MSE ratio posterior/noisy {', '.join(f'{x:.3f}' for x in t['mse_posterior_mean'] / t['mse_noisy'])}",
        ),
    ]


def _tweedie_figure(t: dict[str, np.ndarray], s: np.ndarray, title: str) -> Figure:
    """Exact-formula errors, the attention form's gap and the denoising MSE over σ."""
    fig, ax = new_figure(3, title=f"Tweedie denoising for a subspace Gaussian mixture {title}")
    a = ax[0, 0]
    a.plot(s, np.maximum(t["score_vs_autograd"], 1e-17), "o-", label="score (215) vs autograd ∇log q")
    a.plot(s, np.maximum(t["tweedie_vs_bayes"], 1e-17), "s-", label="Tweedie (46) vs Bayes E[z|x]")
    style_axis(a, "exact formulas (float64)", "noise level σ", "relative error", logx=True, logy=True)
    a = ax[0, 1]
    a.plot(s, t["attention_vs_posterior"], "o-", label="(47) vs exact E[z|x]")
    a.plot(s, np.maximum(t["attention_vs_projection"], 1e-17), "s-", label="(47) vs nearest-subspace projection")
    a.plot(s, s**2, "k:", label="σ²")
    style_axis(a, "attention-form denoiser (47)", "noise level σ", "relative gap", logx=True, logy=True)
    a = ax[0, 2]
    a.plot(s, t["mse_noisy"], "k:", label="noisy x")
    a.plot(s, t["mse_posterior_mean"], "o-", label="exact E[z|x]")
    a.plot(s, t["mse_attention"], "s--", label="attention form (47)")
    style_axis(a, "denoising error E‖ẑ − z‖²", "noise level σ", "mean squared error", logx=True, logy=True)
    return fig
