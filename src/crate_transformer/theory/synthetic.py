"""The paper's own data model: tokens drawn from a mixture of low-dimensional Gaussians on subspaces.

* Noiseless model, eq. (10), JMLR p.16: ``z_i = U_{s_i} α_i`` with a random subspace index ``s_i``.
* Noisy model, eq. (11), JMLR p.17: ``z_i = U_{s_i} α_i + σ w_i`` with ``w_i ~ N(0, I_d)``.
* Normalised model of Theorem 16, eq. (231), JMLR p.73-74: ``α_i ~ N(0, I_p / p)`` and
  ``δ_i ~ N(0, (σ²/d) I_d)``, so that a token's signal and noise have expected energies 1 and σ².

Tokens are **rows** (``Z`` is ``(n, d)``) like in the rest of the library; the bases ``U`` are a
``(K, d, p)`` tensor, ``U[k]`` being the ``d × p`` orthonormal basis ``U_k``.  Everything is float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ..config_utils import POSITIVE, Range

__all__ = [
    "SubspaceSample",
    "make_generator",
    "random_subspaces",
    "subspace_coherence",
    "sample_subspace_mixture",
    "normalize_tokens",
    "off_subspace_energy",
    "relative_distance_to_subspaces",
    "subspace_codes",
    "relative_error",
    "check_positive_int",
    "check_positive",
    "check_positive_list",
    "check_orthogonal_fit",
]

DTYPE = torch.float64
Convention = Literal["normalized", "isotropic"]


# --------------------------------------------------------------------------- argument checks
def check_positive_int(**values: int) -> None:
    """Raise a one-line ``ValueError`` unless every keyword value is an integer ≥ 1 (the package's one range rule,
    :data:`~crate_transformer.config_utils.POSITIVE`; a float such as ``8.0`` is refused too: these are sizes)."""
    for name, v in values.items():
        if not POSITIVE.ok(v):
            raise ValueError(f"{POSITIVE.message(name, v)}; pass e.g. {name}=8")


def check_positive(allow_zero: bool = False, **values: float) -> None:
    """Raise a one-line ``ValueError`` unless every keyword value is a finite number > 0 (≥ 0 if allowed), by the
    package's one range rule (:class:`~crate_transformer.config_utils.Range`)."""
    rule = Range(0, lo_open=not allow_zero)
    for name, v in values.items():
        if not rule.ok(v):
            raise ValueError(f"{rule.message(name, v)}; pass e.g. {name}=0.1")


def check_positive_list(name: str, values: Sequence[float], example: str) -> list[float]:
    """Validate a non-empty list of positive numbers (one-line ``ValueError`` otherwise); returns it sorted."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise ValueError(f"{name} must be a non-empty list of positive numbers, e.g. {name}=({example})")
    for v in values:
        check_positive(**{name.rstrip("s"): v})
    return sorted(float(v) for v in values)


def check_orthogonal_fit(d: int, K: int, p: int) -> None:
    """One-line ``ValueError`` unless K mutually orthogonal p-dimensional subspaces fit in R^d (``K·p ≤ d``)."""
    check_positive_int(d=d, K=K, p=p)
    if K * p > d:
        raise ValueError(
            f"K*p = {K}*{p} = {K * p} exceeds d = {d}, but this experiment needs K mutually orthogonal "
            "p-dimensional subspaces; reduce K or p, or increase d"
        )


def make_generator(seed: int | torch.Generator | None) -> torch.Generator:
    """A CPU ``torch.Generator`` from an integer seed (``None`` → 0); a generator is returned as is."""
    if isinstance(seed, torch.Generator):
        return seed
    g = torch.Generator()
    g.manual_seed(0 if seed is None else int(seed))
    return g


# --------------------------------------------------------------------------- subspaces
def random_subspaces(
    d: int, K: int, p: int, *, orthogonal: bool = True, seed: int | torch.Generator | None = 0
) -> Tensor:
    """K random p-dimensional subspaces of R^d as a ``(K, d, p)`` float64 tensor of orthonormal bases.

    ``orthogonal=True``: the column blocks of one random orthogonal matrix, so ``U_kᵀU_k' = 1_{k=k'} I``
    (Assumption 15, JMLR p.73); needs ``K·p ≤ d``.  ``orthogonal=False``: each basis is drawn
    independently (QR of a Gaussian d×p matrix), so the subspaces are only *incoherent*
    (``‖U_kᵀU_k'‖ ≈ 2√(p/d)``, Approximation 9, JMLR p.57) and ``K·p`` may exceed ``d``.
    """
    check_positive_int(d=d, K=K, p=p)
    if p > d:
        raise ValueError(f"subspace dimension p={p} exceeds the ambient dimension d={d}; choose p <= d")
    g = make_generator(seed)
    if orthogonal:
        if K * p > d:
            raise ValueError(
                f"K*p = {K}*{p} = {K * p} exceeds d = {d}, so the subspaces cannot be mutually orthogonal; "
                "reduce K or p, or pass orthogonal=False for merely incoherent bases"
            )
        Q, _ = torch.linalg.qr(torch.randn(d, K * p, generator=g, dtype=DTYPE))
        return Q.reshape(d, K, p).transpose(0, 1).contiguous()
    Q, _ = torch.linalg.qr(torch.randn(K, d, p, generator=g, dtype=DTYPE))
    return Q


def subspace_coherence(U: Tensor) -> float:
    """Largest cosine of a principal angle between two different subspaces, ``max_{k≠k'} ‖U_kᵀU_k'‖_2``."""
    K = U.shape[0]
    if K < 2:
        return 0.0
    G = torch.linalg.matrix_norm(U.transpose(1, 2).unsqueeze(1) @ U.unsqueeze(0), ord=2)  # (K, K)
    G.fill_diagonal_(0.0)
    return float(G.max())


# --------------------------------------------------------------------------- sampling
@dataclass
class SubspaceSample:
    """Tokens from the subspace mixture (rows are tokens).

    ``Z = signal + noise``; ``signal[i] = U[labels[i]] @ coefficients[i]`` is ``X_♮`` (eq. (232)).
    """

    Z: Tensor
    signal: Tensor
    noise: Tensor
    labels: Tensor
    coefficients: Tensor
    U: Tensor
    sigma: float

    @property
    def n(self) -> int:
        return self.Z.shape[0]

    @property
    def d(self) -> int:
        return self.Z.shape[1]


def sample_subspace_mixture(
    U: Tensor,
    n: int,
    sigma: float = 0.0,
    *,
    convention: Convention = "normalized",
    weights: Tensor | None = None,
    seed: int | torch.Generator | None = 0,
) -> SubspaceSample:
    """Draw ``n`` tokens from the (noisy) subspace mixture with bases ``U`` of shape ``(K, d, p)``.

    Memberships ``s_i`` are i.i.d. with probabilities ``weights`` (uniform by default, as in
    App. B.3, JMLR p.72), and returned as ``labels``.

    * ``convention="normalized"`` — eq. (231), JMLR p.74: ``α_i ~ N(0, I_p/p)``, ``δ_i ~ N(0, σ²/d I_d)``
      (expected signal energy 1, noise energy σ²); the setting of Theorem 16.
    * ``convention="isotropic"`` — eqs. (10)-(11), JMLR pp.16-17 with ``Λ = I_p`` as in Prop. 14:
      ``α_i ~ N(0, I_p)``, noise ``σ w_i`` with ``w_i ~ N(0, I_d)``; the setting of Tweedie's formula.
    """
    if U.dim() != 3:
        raise ValueError(f"U must have shape (K, d, p), got {tuple(U.shape)}; build it with random_subspaces(d, K, p)")
    check_positive_int(n=n)
    check_positive(allow_zero=True, sigma=sigma)
    if convention not in ("normalized", "isotropic"):
        raise ValueError(
            f"unknown convention {convention!r}; choose 'normalized' (eq. (231)) or 'isotropic' (eq. (11))"
        )
    K, d, p = U.shape
    g = make_generator(seed)
    U = U.to(DTYPE)
    w = torch.full((K,), 1.0 / K, dtype=DTYPE) if weights is None else torch.as_tensor(weights, dtype=DTYPE)
    if w.shape != (K,) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be {K} non-negative numbers with a positive sum, got {w.tolist()}")
    labels = torch.multinomial(w / w.sum(), n, replacement=True, generator=g)
    coef_std, noise_std = (p**-0.5, sigma * d**-0.5) if convention == "normalized" else (1.0, sigma)
    coefficients = coef_std * torch.randn(n, p, generator=g, dtype=DTYPE)
    codes = torch.zeros(n, K, p, dtype=DTYPE)
    codes[torch.arange(n), labels] = coefficients  # token i's code sits in block s_i
    signal = codes.reshape(n, K * p) @ U.transpose(0, 1).reshape(d, K * p).T
    noise = noise_std * torch.randn(n, d, generator=g, dtype=DTYPE)
    return SubspaceSample(signal + noise, signal, noise, labels, coefficients, U, float(sigma))


# --------------------------------------------------------------------------- geometry
def subspace_codes(Z: Tensor, U: Tensor) -> Tensor:
    """All subspace coordinates ``U_kᵀ z_i`` of row tokens, shape ``(n, K, p)``."""
    return torch.einsum("kdp,nd->nkp", U.to(Z.dtype), Z)


def relative_error(A: Tensor, B: Tensor) -> float:
    """``‖A − B‖_F / ‖B‖_F`` (B is the reference)."""
    return float((A - B).norm() / B.norm().clamp_min(1e-300))


def normalize_tokens(Z: Tensor) -> Tensor:
    """Unit-ℓ2-norm rows (the unit-norm-token assumption of Approximation 9, JMLR p.57)."""
    return Z / Z.norm(dim=-1, keepdim=True).clamp_min(1e-300)


def off_subspace_energy(Z: Tensor, U: Tensor, labels: Tensor) -> Tensor:
    """Per-token energy outside the token's own subspace, ``‖(I − U_{s_i}U_{s_i}ᵀ) z_i‖²``, shape ``(n,)``."""
    inside = subspace_codes(Z, U).pow(2).sum(-1)  # (n, K): ‖U_kᵀ z_i‖²
    return (Z.pow(2).sum(-1) - inside.gather(1, labels.view(-1, 1)).squeeze(1)).clamp_min(0.0)


def relative_distance_to_subspaces(Z: Tensor, U: Tensor, labels: Tensor | None = None) -> Tensor:
    """Per-token sine of the angle to its own subspace (or to the nearest one if ``labels`` is None), ``(n,)``.

    Scale-free, so it isolates *where* tokens point from how long they are.
    """
    sq = Z.pow(2).sum(-1).clamp_min(1e-300)
    if labels is not None:
        return (off_subspace_energy(Z, U, labels) / sq).sqrt()
    inside = subspace_codes(Z, U).pow(2).sum(-1).max(-1).values
    return ((sq - inside).clamp_min(0.0) / sq).sqrt()
