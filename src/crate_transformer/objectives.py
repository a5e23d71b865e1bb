"""Coding-rate objectives of CRATE (JMLR §2.1, pp.14-20; NeurIPS §2).

Conventions
-----------
* Tokens are **rows**: ``Z`` has shape ``(..., n, d)`` (n tokens of dimension d), the PyTorch
  convention.  The paper writes tokens as columns (``Z ∈ R^{d×n}``); every formula below is the
  paper's with ``Z_paper = Z.transpose(-1, -2)``.  Leading dimensions are batch dimensions and
  every function returns one value per batch element.
* ``eps`` is the quantisation precision **ε** of the paper, *not* ε².  The official measurement
  code (``vis_utils/coding_rate.py``) passes ``eps=0.01``, which is ε² — the same thing is
  ``eps=0.1`` here.
* Subspaces ``U`` have shape ``(K, d, p)``: ``U[k]`` is the d×p basis ``U_k``.  For a trained
  model, :func:`subspaces_from_qkv` turns an MSSA projection weight (``(K·p, d)``) into this form.
* Log-determinants are computed on the smaller of the two Gram matrices (n×n or d×d, which have
  the same determinant by Sylvester's identity) with a Cholesky factorisation of the SPD matrix
  ``I + c·G``.  Pass ``dtype=torch.float64`` for a float64 computation; the result is returned
  in that dtype.
* The linear algebra never runs in half precision: float16 / bfloat16 tokens are computed (and returned) in
  float32 — Cholesky and slogdet have no half kernels, and a bf16 Gram matrix loses the log-determinant — and
  autocast is off inside these functions, so a Gram matrix of float32 tokens is float32 under
  ``torch.autocast`` too (a bf16 training step's measurements).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

__all__ = [
    "coding_rate",
    "coding_rate_grad",
    "covariance_coding_rate",
    "effective_rank",
    "membership_coding_rate",
    "subspace_coding_rate",
    "subspace_coding_rate_grad",
    "variational_coding_rate",
    "rate_reduction",
    "sparse_rate_reduction",
    "sparsity",
    "l1_per_entry",
    "subspaces_from_qkv",
]


def _check_tokens(Z: Tensor) -> None:
    if not isinstance(Z, Tensor) or Z.dim() < 2:
        raise ValueError(
            "Z must be a tensor of shape (..., n, d) with tokens as rows; "
            f"got {type(Z).__name__} with shape {tuple(getattr(Z, 'shape', ()))}"
        )
    if not Z.is_floating_point():
        raise ValueError(f"Z must be a floating-point tensor, got dtype {Z.dtype}; call Z.float() first")


def _check_eps(eps: float) -> None:
    if not eps > 0:
        raise ValueError(f"eps (the precision ε, not ε²) must be positive, got {eps}")


def _check_subspaces(U: Tensor, d: int) -> None:
    if U.dim() != 3 or U.shape[1] != d:
        raise ValueError(
            f"U must have shape (K, d, p) with d={d}, got {tuple(U.shape)}; "
            "use subspaces_from_qkv(weight, heads) for a model's (K*p, d) projection"
        )


def _logdet_i_plus(Z: Tensor, c: float | Tensor) -> Tensor:
    """log det(I + c·ZᵀZ) for row tokens Z of shape (..., n, d), via the smaller Gram matrix."""
    n, d = Z.shape[-2], Z.shape[-1]
    G = Z @ Z.transpose(-1, -2) if n <= d else Z.transpose(-1, -2) @ Z
    m = G.shape[-1]
    c = torch.as_tensor(c, dtype=Z.dtype, device=Z.device)
    A = torch.eye(m, dtype=Z.dtype, device=Z.device) + c[..., None, None] * G
    L, info = torch.linalg.cholesky_ex(A)
    if bool((info != 0).any()):
        # Not SPD to working precision (huge c or non-finite input): fall back to slogdet.
        return torch.linalg.slogdet(A).logabsdet
    return 2.0 * torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)


def at_least_float32(Z: Tensor) -> Tensor:
    """``Z`` in float32 when it is a half type (float16, bfloat16), else as it is: the precision statistics of
    tokens run in (these functions, TSSA's token statistics)."""
    return Z.float() if Z.dtype in (torch.float16, torch.bfloat16) else Z


def _cast(Z: Tensor, dtype: torch.dtype | None) -> Tensor:
    """``Z`` in the dtype its linear algebra runs in: ``dtype`` when given, else :func:`at_least_float32`."""
    return Z.to(dtype) if dtype is not None else at_least_float32(Z)


_Fn = TypeVar("_Fn", bound=Callable[..., Tensor])


def autocast_on(x: object) -> bool:
    """Whether autocast is on for the device of the tensor ``x`` (``cpu`` for anything else); False on a device
    that has no autocast, such as ``meta``, where asking raises."""
    device = x.device.type if isinstance(x, Tensor) else "cpu"
    return torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)


def full_precision(x: object) -> contextlib.AbstractContextManager[object]:
    """Autocast off on the device of the tensor ``x`` where it is on, for statistics whose dtype the caller chose
    (float32 for half tokens: :func:`at_least_float32`); a no-op elsewhere."""
    if autocast_on(x):
        return torch.autocast(x.device.type if isinstance(x, Tensor) else "cpu", enabled=False)
    return contextlib.nullcontext()


def _without_autocast(fn: _Fn) -> _Fn:
    """Run ``fn`` with autocast off on the tokens' device (its matmuls in the dtype :func:`_cast` chose)."""

    @functools.wraps(fn)
    def run(Z: Tensor, *args: object, **kwargs: object) -> Tensor:
        with full_precision(Z):
            return fn(Z, *args, **kwargs)

    return run  # type: ignore[return-value]


@_without_autocast
def coding_rate(Z: Tensor, eps: float = 0.1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Lossy coding rate of a token set, eq. (8), JMLR p.16 (NeurIPS eq. (7)).

    ``R(Z) = ½ logdet(I + α ZᵀZ)`` with ``α = d / (n ε²)``.
    """
    _check_tokens(Z)
    _check_eps(eps)
    Z = _cast(Z, dtype)
    n, d = Z.shape[-2], Z.shape[-1]
    return 0.5 * _logdet_i_plus(Z, d / (n * eps**2))


@_without_autocast
def coding_rate_grad(Z: Tensor, eps: float = 0.1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Closed-form gradient of :func:`coding_rate`, eq. (109), JMLR p.60 (Lemma 10, eq. (125)).

    ``∇R(Z) = α Z (I + α ZᵀZ)⁻¹`` in the paper's column form; for row tokens this is
    ``α (I_n + α Z Zᵀ)⁻¹ Z = α Z (I_d + α ZᵀZ)⁻¹`` (push-through identity; the smaller system is solved).
    """
    _check_tokens(Z)
    _check_eps(eps)
    Z = _cast(Z, dtype)
    n, d = Z.shape[-2], Z.shape[-1]
    a = d / (n * eps**2)
    if n <= d:
        A = torch.eye(n, dtype=Z.dtype, device=Z.device) + a * (Z @ Z.transpose(-1, -2))
        return a * torch.linalg.solve(A, Z)
    A = torch.eye(d, dtype=Z.dtype, device=Z.device) + a * (Z.transpose(-1, -2) @ Z)
    # Z A⁻¹ = (A⁻¹ Zᵀ)ᵀ since A is symmetric.
    return a * torch.linalg.solve(A, Z.transpose(-1, -2)).transpose(-1, -2)


def covariance_coding_rate(G: Tensor, n: Tensor | float, eps: float) -> Tensor:
    """Coding rate eq. (8) from a token set's d×d Gram ``G = ZᵀZ`` and its size ``n``: ``½ logdet(I + d/(nε²) G)``,
    in float64 whatever ``G``'s dtype and the autocast (returned in float64).

    The form in which a coding rate is summed over processes: each holds the Gram of its own tokens, their sum is
    the Gram of all of them (SimDINO's expansion term, :class:`~crate_transformer.models.dino.SimDINOLoss`).
    The log-determinant is a Cholesky factorisation without jitter: ``I + cG`` of a finite Gram is positive definite
    with eigenvalues >= 1, so it succeeds in float64 for any c > 0; a non-finite ``G`` or a failed factorisation
    raises a one-line ``FloatingPointError`` naming ε, n and d (never a NaN loss).
    """
    _check_eps(eps)
    if G.dim() < 2 or G.shape[-1] != G.shape[-2]:
        raise ValueError(f"G must be a (..., d, d) Gram matrix, got shape {tuple(G.shape)}")
    d = G.shape[-1]
    with full_precision(G):
        G = G.to(torch.float64)
        n = torch.as_tensor(n, dtype=torch.float64, device=G.device)
        A = torch.eye(d, dtype=torch.float64, device=G.device) + (d / (n * eps**2))[..., None, None] * G
        L, info = torch.linalg.cholesky_ex(A)
        if not bool(torch.isfinite(G).all()) or bool((info != 0).any()):
            what = (
                "has non-finite entries (the features are inf or NaN)"
                if not torch.isfinite(G).all()
                else ("is not positive definite in float64")
            )
            raise FloatingPointError(
                f"the coding-rate matrix I + d/(n eps^2) Z^T Z {what} (eps={eps:g}, batch n={float(n.max()):g}, "
                f"d={d}): lower the learning rate or raise eps"
            )
        return torch.log(torch.diagonal(L, dim1=-2, dim2=-1)).sum(-1)  # ½ logdet(A) = Σ log L_ii


@_without_autocast
def effective_rank(Z: Tensor) -> Tensor:
    """Effective rank (Roy & Vetterli 2007) of a set of features, rows of ``Z`` ``(..., n, d)``: ``exp H(σ / Σσ)``,
    the exponential of the entropy of the normalised singular values, between 1 (all features on one line: a
    collapse) and ``min(n, d)``.  Computed in float64 on the rows as given (not centred)."""
    _check_tokens(Z)
    s = torch.linalg.svdvals(Z.to(torch.float64))
    p = s / s.sum(-1, keepdim=True).clamp_min(1e-300)
    return torch.exp(-(p * p.clamp_min(1e-300).log()).sum(-1))


@_without_autocast
def membership_coding_rate(
    Z: Tensor, labels: Tensor, num_classes: int | None = None, eps: float = 0.1, *, dtype: torch.dtype | None = None
) -> Tensor:
    """Coding rate with known memberships (original MCR²), eq. (9), JMLR p.16.

    ``R^c(Z|Π) = ½ Σ_k logdet(I + γ_k Z Π_k Zᵀ)`` with ``γ_k = d / (n_k ε²)``; ``labels`` has
    shape ``(..., n)`` with values in ``[0, num_classes)``.  Empty classes contribute 0.
    """
    _check_tokens(Z)
    _check_eps(eps)
    Z = _cast(Z, dtype)
    d = Z.shape[-1]
    if labels.shape != Z.shape[:-1]:
        raise ValueError(f"labels must have shape {tuple(Z.shape[:-1])} (one per token), got {tuple(labels.shape)}")
    present = labels.unique()  # empty classes add logdet(I) = 0: no loop over labels that never occur
    if len(present) and (present[0] < 0 or (num_classes is not None and present[-1] >= num_classes)):
        bad = int(present[0]) if present[0] < 0 else int(present[-1])
        raise ValueError(f"label {bad} is not a class index in [0, {num_classes or 'num_classes'})")
    total = torch.zeros(Z.shape[:-2], dtype=Z.dtype, device=Z.device)
    for k in present.tolist():
        mask = (labels == k).to(Z.dtype)
        n_k = mask.sum(-1)
        gamma = d / (n_k.clamp(min=1) * eps**2)
        # Z Π_k Zᵀ is the Gram of the masked tokens; an empty class gives logdet(I) = 0.
        total = total + 0.5 * _logdet_i_plus(Z * mask[..., None], gamma)
    return total


@_without_autocast
def subspace_coding_rate(Z: Tensor, U: Tensor, eps: float = 0.1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Compact coding rate against subspaces, eqs. (12)-(13), JMLR p.17 (NeurIPS eq. (8)).

    ``R^c(Z|U_[K]) = ½ Σ_k logdet(I + β (U_kᵀZ)ᵀ(U_kᵀZ))`` with ``β = p / (n ε²)``.
    """
    _check_tokens(Z)
    _check_eps(eps)
    _check_subspaces(U, Z.shape[-1])
    Z = _cast(Z, dtype)
    U = U.to(Z.dtype)
    n, p = Z.shape[-2], U.shape[-1]
    proj = Z.unsqueeze(-3) @ U  # (..., K, n, p): row k holds (U_kᵀ Z)ᵀ
    return 0.5 * _logdet_i_plus(proj, p / (n * eps**2)).sum(-1)


@_without_autocast
def subspace_coding_rate_grad(Z: Tensor, U: Tensor, eps: float = 0.1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Closed-form gradient of :func:`subspace_coding_rate`, eq. (31), JMLR p.22 (eq. (96), p.57).

    ``∇R^c = β Σ_k U_k (U_kᵀZ)(I + β (U_kᵀZ)ᵀ(U_kᵀZ))⁻¹``; in row form each term is
    ``β (I_n + β P_k P_kᵀ)⁻¹ P_k U_kᵀ`` with ``P_k = Z U_k``.
    """
    _check_tokens(Z)
    _check_eps(eps)
    _check_subspaces(U, Z.shape[-1])
    Z = _cast(Z, dtype)
    U = U.to(Z.dtype)
    n, p = Z.shape[-2], U.shape[-1]
    beta = p / (n * eps**2)
    P = Z.unsqueeze(-3) @ U  # (..., K, n, p)
    A = torch.eye(n, dtype=Z.dtype, device=Z.device) + beta * (P @ P.transpose(-1, -2))
    return (beta * torch.linalg.solve(A, P) @ U.transpose(-1, -2)).sum(-3)


@_without_autocast
def variational_coding_rate(
    Z: Tensor, U: Tensor | None, Pi: Tensor, eps: float = 0.1, *, dtype: torch.dtype | None = None
) -> Tensor:
    """The variational compression term that ToST's attention (TSSA) descends (Wu et al., "Token Statistics
    Transformer: Linear-Time Attention via Variational Rate Reduction", ICLR 2025, §3), with soft memberships Π::

        R_c^var(Z, Π | U_[K]) = ½ Σ_k (n_k / n) Σ_i log(1 + (p/ε²) · Σ_j Π_jk (U_kᵀz_j)_i² / n_k),   n_k = Σ_j Π_jk

    Each head's logdet of ``R^c`` (eq. (13)) is replaced by the sum of ``log(1 + ·)`` over the diagonal of its
    Π-weighted second-moment matrix ``M_k = (p/(n_k ε²)) Σ_j Π_jk w_kj w_kjᵀ``: since the eigenvalues of ``M_k``
    majorise its diagonal and ``log(1 + x)`` is concave, ``Σ_i log(1 + (M_k)_ii) ≥ logdet(I + M_k)``, with
    equality when ``M_k`` is diagonal, so this bounds the Π-weighted ``R^c`` from above and needs only ``p``
    numbers per head: its cost is linear in ``n``.  TSSA's output before its projection,
    ``−Π_jk w_kj / (1 + m_kj)``, is ``−n`` times the gradient of this function in ``w_kj`` at ``p/ε² = 1`` with Π
    held fixed (the authors' code absorbs the scale into the learned projection; ``tests/layers/test_tssa.py``).

    ``Z`` is ``(..., n, d)`` row tokens and ``U`` is ``(K, d, p)``; or ``U=None`` and ``Z`` already holds each
    head's projections ``(..., K, n, p)`` (a layer's own, bias included).  ``Pi`` is ``(..., n, K)``, each token's
    memberships (non-negative; TSSA's rows sum to 1).  One value per batch element.
    """
    _check_eps(eps)
    if U is not None:
        _check_tokens(Z)
        _check_subspaces(U, Z.shape[-1])
        Z = _cast(Z, dtype)
        P = Z.unsqueeze(-3) @ U.to(Z.dtype)
    else:
        if not isinstance(Z, Tensor) or Z.dim() < 3 or not Z.is_floating_point():
            raise ValueError(f"with U=None, Z must be float projections (..., K, n, p), got {tuple(Z.shape)}")
        P = _cast(Z, dtype)
    K, n, p = P.shape[-3:]
    if Pi.shape[-2:] != (n, K):
        raise ValueError(f"Pi must be (..., n={n}, K={K}), one membership per token and head, got {tuple(Pi.shape)}")
    weights = Pi.to(P.dtype).transpose(-1, -2)  # (..., K, n)
    mass = weights.sum(-1)  # n_k
    moment = (weights.unsqueeze(-2) @ P.square()).squeeze(-2) / mass.clamp_min(torch.finfo(P.dtype).tiny)[..., None]
    per_head = torch.log1p(p / eps**2 * moment).sum(-1)
    return 0.5 * (mass / n * per_head).sum(-1)


@_without_autocast
def rate_reduction(Z: Tensor, U: Tensor, eps: float = 0.1, *, dtype: torch.dtype | None = None) -> Tensor:
    """Rate reduction against subspaces, eq. (14), JMLR p.17: ``ΔR = R(Z) − R^c(Z|U_[K])``."""
    return coding_rate(Z, eps, dtype=dtype) - subspace_coding_rate(Z, U, eps, dtype=dtype)


@_without_autocast
def sparse_rate_reduction(
    Z: Tensor, U: Tensor, lambd: float = 0.1, eps: float = 0.1, norm: str = "l1", *, dtype: torch.dtype | None = None
) -> Tensor:
    """Sparse rate reduction, eq. (16) (``norm="l0"``) and its ℓ1 relaxation eq. (17), JMLR p.18.

    ``R(Z) − R^c(Z|U_[K]) − λ‖Z‖``, with ``‖Z‖_1`` the entry-wise ℓ1 norm or ``‖Z‖_0`` the count of
    non-zeros.  This is the quantity every CRATE layer ascends; larger is better.
    """
    if norm not in ("l1", "l0"):
        raise ValueError(f"norm must be 'l1' or 'l0', got {norm!r}")
    Zc = _cast(Z, dtype)
    penalty = Zc.abs().sum((-2, -1)) if norm == "l1" else (Zc != 0).sum((-2, -1)).to(Zc.dtype)
    return rate_reduction(Zc, U, eps) - lambd * penalty


def sparsity(Z: Tensor) -> Tensor:
    """Fraction of exactly-zero entries per token set (the official sparsity measure, JMLR Fig. 14)."""
    _check_tokens(Z)
    return (Z == 0).to(Z.dtype).mean((-2, -1))


def l1_per_entry(Z: Tensor) -> Tensor:
    """Mean absolute value per entry, ``‖Z‖_1 / (n d)``, per token set."""
    _check_tokens(Z)
    return Z.abs().mean((-2, -1))


def subspaces_from_qkv(weight: Tensor, heads: int) -> Tensor:
    """Turn an MSSA projection weight ``(K·p, d)`` (rows ``[U_1ᵀ; …; U_Kᵀ]``) into ``U`` of shape ``(K, d, p)``."""
    if weight.dim() != 2 or weight.shape[0] % heads:
        raise ValueError(f"weight must be (K*p, d) with K={heads} dividing its rows, got {tuple(weight.shape)}")
    Kp, d = weight.shape
    return weight.reshape(heads, Kp // heads, d).transpose(1, 2)
