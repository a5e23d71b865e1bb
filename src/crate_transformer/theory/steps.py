"""The elementary steps the experiments iterate, in the library's row-token form (``Z`` is ``(n, d)``).

Compression (JMLR §2.3, pp.22-23; App. A.1, pp.57-58):

* exact gradient step ``Z − κ∇R^c(Z|U)``, eqs. (26), (31);
* first-order Neumann gradient, eqs. (32)-(33) / (98)-(99);
* MSSA form ``(1 − κβ)Z + κβ MSSA(Z|U)``, eqs. (27), (34), (91), with ``∇R^c ≈ βZ − β MSSA(Z|U)`` (106);
* the implemented residual form ``Z + κβ MSSA(Z|U)`` (eq. (45) drops the ``(1 − κβ)`` shrink).

Sparsification (JMLR §2.4, pp.24-25): the non-negative LASSO (42) and its proximal-gradient (ISTA)
step (44).  ``β = p / (n ε²)`` (eq. (12)); ``eps`` is ε, as in :mod:`crate_transformer.objectives`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch.nn.functional as F
from torch import Tensor

from ..layers import mssa_reference
from ..objectives import subspace_coding_rate_grad

__all__ = [
    "beta_from_eps",
    "eps_from_beta",
    "exact_compression_step",
    "neumann_gradient",
    "mssa_gradient",
    "mssa_compression_step",
    "compression_step",
    "STEP_KINDS",
    "nonneg_lasso_objective",
    "ista_step",
]

StepKind = Literal["exact", "mssa", "skip"]
STEP_KINDS: tuple[str, ...] = ("exact", "mssa", "skip")


def beta_from_eps(p: int, n: int, eps: float) -> float:
    """``β = p / (n ε²)``, eq. (12), JMLR p.17."""
    return p / (n * eps**2)


def eps_from_beta(p: int, n: int, beta: float) -> float:
    """The precision ε that gives ``β = p / (n ε²)``."""
    return math.sqrt(p / (n * beta))


def exact_compression_step(Z: Tensor, U: Tensor, eps: float, kappa: float) -> Tensor:
    """``Z − κ∇R^c(Z|U_[K])``, eq. (26) with the closed-form gradient (31), JMLR p.22."""
    return Z - kappa * subspace_coding_rate_grad(Z, U, eps)


def neumann_gradient(Z: Tensor, U: Tensor, eps: float) -> Tensor:
    """First-order Neumann approximation of ∇R^c, eq. (32)/(98), JMLR pp.23, 58.

    Column form ``β Σ_k U_k A_k (I − β A_kᵀA_k)`` with ``A_k = U_kᵀZ``; in row form
    ``β Σ_k (I − β P_kP_kᵀ) P_k U_kᵀ`` with ``P_k = Z U_k``.
    """
    n, p = Z.shape[-2], U.shape[-1]
    beta = beta_from_eps(p, n, eps)
    P = Z.unsqueeze(-3) @ U  # (K, n, p)
    G = P @ P.transpose(-1, -2)
    return (beta * (P - beta * G @ P) @ U.transpose(-1, -2)).sum(-3)


def _mssa_rows(Z: Tensor, U: Tensor, beta: float) -> Tensor:
    """``MSSA(Z|U)`` of eq. (36) (with its factor β, unscaled softmax) for row tokens."""
    return mssa_reference(Z.T, U, beta=beta).T


def mssa_gradient(Z: Tensor, U: Tensor, eps: float) -> Tensor:
    """The MSSA surrogate of the gradient, ``∇R^c ≈ βZ − β MSSA(Z|U)``, eq. (106), JMLR p.58."""
    n, p = Z.shape[-2], U.shape[-1]
    beta = beta_from_eps(p, n, eps)
    return beta * Z - beta * _mssa_rows(Z, U, beta)


def mssa_compression_step(Z: Tensor, U: Tensor, eps: float, kappa: float, *, skip: bool = False) -> Tensor:
    """``(1 − κβ)Z + κβ MSSA(Z|U)`` (eq. (34)/(91), JMLR pp.23, 57), or with ``skip=True`` the
    implemented residual form ``Z + κβ MSSA(Z|U)`` (eq. (45) keeps the coefficient 1 on Z)."""
    n, p = Z.shape[-2], U.shape[-1]
    beta = beta_from_eps(p, n, eps)
    m = _mssa_rows(Z, U, beta)
    return (Z if skip else (1 - kappa * beta) * Z) + kappa * beta * m


def compression_step(Z: Tensor, U: Tensor, eps: float, kappa: float, kind: StepKind = "exact") -> Tensor:
    """Dispatch to the ``"exact"``, ``"mssa"`` or ``"skip"`` compression step."""
    if kind == "exact":
        return exact_compression_step(Z, U, eps, kappa)
    if kind in ("mssa", "skip"):
        return mssa_compression_step(Z, U, eps, kappa, skip=kind == "skip")
    raise ValueError(f"unknown compression step {kind!r}; choose one of {STEP_KINDS}")


def nonneg_lasso_objective(Z: Tensor, X: Tensor, D: Tensor, lambd: float) -> float:
    """The non-negative LASSO objective (42), JMLR p.25, for row tokens: ``λ‖Z‖_1 + ½‖X − Z Dᵀ‖_F²`` on
    ``Z ≥ 0`` (``+inf`` outside; ``X`` is ``(n, d)``, ``Z`` is ``(n, m)``, ``D`` is ``d × m``)."""
    if bool((Z < 0).any()):
        return math.inf
    return float(lambd * Z.sum() + 0.5 * (X - Z @ D.T).pow(2).sum())


def ista_step(Z: Tensor, X: Tensor, D: Tensor, eta: float, lambd: float) -> Tensor:
    """One proximal-gradient step on (42): ``ReLU(Z − η(Z Dᵀ − X)D − ηλ)`` (row form of eq. (44)).

    With ``Z = X`` (the warm start of CRATE's ISTA block) this is eq. (44), JMLR p.25.
    """
    return F.relu(Z - eta * (Z @ D.T - X) @ D - eta * lambd)
