"""The paper's equations as plain functions, column form as written: SSA/MSSA (eqs. (35)-(36)), the ISTA
step (eq. (44)), CRATE-α's overcomplete block and ToST's TSSA.  The modules' fast paths are tested against these;
the theory lab uses them directly."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


# --------------------------------------------------------------------------- reference forms
def ssa_reference(Z: Tensor, U_k: Tensor, scale: float = 1.0) -> Tensor:
    """Subspace self-attention, eq. (35), JMLR p.23, written in the paper's column form.

    ``SSA(Z|U_k) = (U_kᵀZ) softmax((U_kᵀZ)ᵀ(U_kᵀZ))`` with the softmax over each **column**
    (eqs. (94)-(95)).  ``Z`` is ``(d, n)`` (columns are tokens) and the result is ``(p, n)``.
    ``scale`` multiplies the scores (the official code uses ``p^{-1/2}``; the paper 1).
    """
    A = U_k.T @ Z  # p × n
    return A @ torch.softmax(scale * (A.T @ A), dim=0)


def mssa_reference(Z: Tensor, U: Tensor, beta: float = 1.0, scale: float = 1.0) -> Tensor:
    """Multi-head subspace self-attention, eq. (36), JMLR p.23: ``β [U_1…U_K] [SSA_1; …; SSA_K]``.

    Column form: ``Z`` is ``(d, n)``, ``U`` is ``(K, d, p)``; returns ``(d, n)``.
    """
    return beta * sum(U[k] @ ssa_reference(Z, U[k], scale) for k in range(U.shape[0]))


def ista_reference(Z: Tensor, D: Tensor, eta: float = 0.1, lambd: float = 0.1) -> Tensor:
    """One non-negative ISTA step, eq. (44), JMLR p.25, three matmuls as written.

    ``ISTA(Z|D) = ReLU(Z − η Dᵀ(D Z − Z) − ηλ 1)``; column form, ``Z`` is ``(d, n)``.
    """
    return F.relu(Z - eta * D.T @ (D @ Z - Z) - eta * lambd)


def odl_reference(Z: Tensor, D: Tensor, D1: Tensor, eta: float = 0.1, lambd: float = 0.1) -> Tensor:
    """CRATE-α's overcomplete sparse-coding block (Yang et al. 2024, arXiv 2405.20299, §3), column form.

    ``D`` (encoder dictionary) and ``D1`` (decoder dictionary) are ``d × m`` with ``m = ratio·d``.  Two
    non-negative ISTA steps from ``A = 0`` on ``min_{A≥0} λ‖A‖_1 + ½‖Z − D A‖²``, then decode with ``D1``::

        A1 = ReLU(η Dᵀ Z − ηλ);   A2 = ReLU(A1 − η Dᵀ(D A1 − Z) − ηλ);   return D1 A2

    ``Z`` is ``(d, n)``; the result is ``(d, n)`` (the residual ``Z +`` is the layer's, not this block's).
    """
    A1 = F.relu(eta * D.T @ Z - eta * lambd)
    A2 = F.relu(A1 - eta * D.T @ (D @ A1 - Z) - eta * lambd)
    return D1 @ A2


# --------------------------------------------------------------------------- TSSA (ToST)
# Where the authors' code adds 1e-8 to the Π-mass of a head, and floors a coordinate's energy (tost_vision/tost.py's
# F.normalize floors its norm at 1e-12; tost_lang/model_TSSA.py floors the squared prefix sum at 1e-12).
_TSSA_MASS_EPS = 1e-8
_TSSA_ENERGY_FLOOR = 1e-12


def tssa_reference(
    W: Tensor, temp: Tensor, *, causal: bool = False, denom_bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Token statistics self-attention before its output projection (Wu et al., "Token Statistics Transformer:
    Linear-Time Attention via Variational Rate Reduction", ICLR 2025, §3 and App. E Algs. 1-2), written token by
    token from the authors' code (``tost_vision/tost.py`` ``AttentionTSSA``, ``tost_lang/model_TSSA.py``
    ``CausalSelfAttention_TSSA``).

    ``W`` holds each head's projections ``w_kj = U_kᵀz_j (+ b_k)`` as ``(K, n, p)``; ``temp`` the heads'
    temperatures ``(K,)``; ``denom_bias`` the causal form's learned per-position offsets ``(K, n)``.  Token ``j``
    reads the tokens ``S_j`` (all of them, or ``j' ≤ j`` when ``causal``):

    * its membership in each head (Π of the paper's eq. (10), a softmax over the heads):
      ``Π_jk ∝ exp(temp_k Σ_i (w_kji² / Σ_{j'∈S_j} w_kj'i² + denom_bias_kj))``;
    * per head and coordinate, the Π-weighted second moment of the tokens it reads (the "token statistics"):
      ``m_kji = Σ_{j'∈S_j} Π_j'k w_kj'i² / Σ_{j'∈S_j} Π_j'k``;
    * its output ``−Π_jk w_kji / (1 + m_kji)``: each coordinate shrunk by ``1/(1 + m)``.

    Non-causally every token reads the same statistics, so the cost is linear in ``n``; this reference loops over
    tokens (quadratic, for the tests).  Returns ``(out (K, n, p), Π (n, K))``.
    """
    K, n, p = W.shape
    scores = W.new_zeros(n, K)
    for j in range(n):
        seen = W[:, : j + 1] if causal else W
        energy = (seen**2).sum(1)
        energy = energy.clamp_min(_TSSA_ENERGY_FLOOR) if causal else energy.sqrt().clamp_min(_TSSA_ENERGY_FLOOR) ** 2
        share = (W[:, j] ** 2 / energy).sum(-1) + (0 if denom_bias is None else p * denom_bias[:, j])
        scores[j] = temp * share
    Pi = torch.softmax(scores, dim=-1)
    out = torch.empty_like(W)
    for j in range(n):
        m = j + 1 if causal else n
        weights = Pi[:m].T  # (K, m)
        moment = (weights[..., None] * W[:, :m] ** 2).sum(1) / (weights.sum(-1, keepdim=True) + _TSSA_MASS_EPS)
        out[:, j] = -Pi[j][:, None] * W[:, j] / (1 + moment)
    return out, Pi
