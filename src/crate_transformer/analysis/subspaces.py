"""Incoherence of the learned subspaces ``U^ℓ_[K]`` (JMLR §4.2, pp.49-50, Fig. 17).

The signal model (eqs. (10)-(11)) assumes K mutually orthogonal p-dimensional subspaces.  For the
learned codebook of each layer this module gives

* :func:`subspace_gram` — Fig. 17's matrix ``|[U_1 … U_K]ᵀ[U_1 … U_K]|`` with every column
  normalised (optionally ``directions`` random columns per subspace, Fig. 17 shows 4);
* :func:`incoherence` — per layer, the K×K block coherence ``‖Q_iᵀQ_j‖_F / √p`` (``Q_i`` an
  orthonormal basis of span ``U_i``; 1 on the diagonal, 0 for orthogonal subspaces), its mean off
  the diagonal, the largest principal-angle cosine between two different subspaces, and the value
  expected for independent random subspaces of the same sizes (``√(p/d)``) for comparison.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..models.classifier import ImageClassifier
from ._common import layer_index, layer_subspaces

__all__ = ["subspace_gram", "incoherence"]


@torch.no_grad()
def subspace_gram(model: ImageClassifier, layer: int = -1, directions: int | None = None, seed: int = 0) -> np.ndarray:
    """``|Ûᵀ Û|`` for the column-normalised bases of ``layer`` (Fig. 17): ``(K·m, K·m)``, block (i, j) = heads i, j.

    ``directions`` picks that many random columns of each ``U_k`` (seeded); ``None`` keeps all p.
    """
    U = layer_subspaces(model.layers[layer_index(model, layer)]).detach().double().cpu()  # (K, d, p)
    K, d, p = U.shape
    if directions is not None:
        if not 1 <= directions <= p:
            raise ValueError(f"directions must be in 1..{p} (the subspace dimension), got {directions}")
        g = torch.Generator().manual_seed(seed)
        cols = torch.stack([torch.randperm(p, generator=g)[:directions].sort().values for _ in range(K)])
        U = torch.stack([U[k][:, cols[k]] for k in range(K)])
    B = F.normalize(U.transpose(1, 2).reshape(-1, d), dim=-1)  # rows = columns of [U_1 … U_K]
    return (B @ B.T).abs().numpy()


@torch.no_grad()
def incoherence(model: ImageClassifier) -> list[dict]:
    """Per-layer subspace coherence summary (JSON-serialisable); layers numbered 1..L."""
    out = []
    for li, layer in enumerate(model.layers):
        U = layer_subspaces(layer).detach().double().cpu()
        K, d, p = U.shape
        Q = torch.linalg.qr(U).Q  # (K, d, p) orthonormal bases (U_k has full column rank generically)
        C = torch.einsum("idp,jdq->ijpq", Q, Q)  # principal-angle matrices Q_iᵀQ_j
        block = (C.flatten(2).norm(dim=-1) / math.sqrt(p)).numpy()
        off = ~np.eye(K, dtype=bool)
        max_cos = max(
            (float(torch.linalg.matrix_norm(C[i, j], ord=2)) for i in range(K) for j in range(K) if i != j), default=0.0
        )
        out.append(
            {
                "layer": li + 1,
                "heads": K,
                "dim_head": p,
                "dim": d,
                "block_coherence": block.tolist(),
                "mean_cross_coherence": float(block[off].mean()) if K > 1 else 0.0,
                "max_principal_cos": max_cos,
                "random_baseline": math.sqrt(p / d),
            }
        )
    return out
