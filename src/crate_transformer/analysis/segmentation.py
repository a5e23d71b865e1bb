"""Patch features, PCA colouring and unsupervised segmentation (JMLR §4.3, pp.50-53, App. C.10;
Fig. 19, Alg. 1 p.108).

* :func:`patch_features` — the qkv projections ``[U_1ᵀ; …; U_Kᵀ]·LN1(Z^ℓ)`` of the patch tokens of a
  layer (the "key" facet of the official ``pca_visualization.py``; for ViT the key projections).
* :func:`pca_rgb` — a joint PCA of the patch features of a set of images, the first three components
  min-max normalised per image and shown as RGB (official ``pca_visualization.py`` / Amir et al.).
* :func:`normalized_cut` — Shi & Malik's normalized cut of an affinity matrix: the second-smallest
  generalised eigenvector of ``(D − W) y = λ D y``, split at its mean (TokenCut / MaskCut).
* :func:`maskcut` — Alg. 1 iterated S times.  Alg. 1 as printed multiplies the affinity by the found
  mask (``M ← M ⊙ mask``), which keeps the segmented region; the intent (MaskCut, Wang et al. 2023)
  is to **remove** it, which is what this does: each round cuts only the
  patches no earlier mask took.  The affinity is MaskCut's: cosine similarity of the features,
  binarised at ``τ = 0.15`` (1 above, 1e-5 below).  Polarity: the foreground is the side holding the
  eigenvector's largest magnitude entry, flipped when it covers ≥ 3 image corners (MaskCut's
  object-centric prior), and only the connected component of that seed is kept.  No dense CRF.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage
from torch import Tensor

from ..config_utils import POSITIVE, Range
from ..models.classifier import ImageClassifier
from ._common import eval_trace, head_projections, layer_index

__all__ = [
    "patch_features",
    "pca_rgb",
    "cosine_affinity",
    "normalized_cut",
    "maskcut",
    "segment",
    "iou",
]


@torch.no_grad()
def patch_features(model: ImageClassifier, images: Tensor, layer: int = -1) -> Tensor:
    """The qkv projections of the patch tokens at ``layer``: ``(b, N, K·p)`` (a class token in the layers dropped).

    ``images`` are model-ready (normalised) float images of any size divisible by the patch size.
    """
    li = layer_index(model, layer)
    z = eval_trace(model, images)[1].tokens[li]  # Z^ℓ, the input of layer ℓ
    blk = model.layers[li]
    with torch.no_grad():
        P = head_projections(blk, blk.norm1(z))  # (b, K, n, p); eval or train mode: LN and qkv only
    return P[:, :, model.trace_prefix_tokens :].transpose(1, 2).flatten(2).float().cpu()


def pca_rgb(features: Tensor, grid: tuple[int, int], n_components: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Joint PCA of the patch features of all images, first components as RGB.

    ``features``: ``(b, N, D)`` with ``N = h·w``.  Returns ``(rgb, explained_variance_ratio)``:
    ``rgb`` is ``(b, h, w, 3)`` in [0, 1], each component min-max normalised per image; components
    beyond ``D`` are zero.  The sign of each component is fixed (largest-magnitude loading positive)
    so the colours are deterministic.
    """
    if features.dim() != 3:
        raise ValueError(f"features must be (batch, patches, dim), got shape {tuple(features.shape)}")
    b, N, D = features.shape
    h, w = grid
    if h * w != N:
        raise ValueError(f"grid {h}x{w} does not match {N} patches")
    X = features.reshape(b * N, D).double()
    X = X - X.mean(0, keepdim=True)
    _, S, Vh = torch.linalg.svd(X, full_matrices=False)
    k = min(n_components, Vh.shape[0])
    V = Vh[:k]
    sign = torch.sign(V.gather(1, V.abs().argmax(1, keepdim=True)))
    V = V * sign
    comps = (X @ V.T).reshape(b, N, k)
    lo, hi = comps.amin(1, keepdim=True), comps.amax(1, keepdim=True)
    comps = (comps - lo) / (hi - lo).clamp_min(1e-12)
    rgb = torch.zeros(b, N, 3, dtype=torch.float64)
    rgb[..., : min(k, 3)] = comps[..., :3]
    var = S**2
    ratio = (var[:k] / var.sum().clamp_min(1e-300)).numpy()
    return rgb.reshape(b, h, w, 3).numpy(), ratio


TAU = Range(-1, 1, lo_open=True, hi_open=True, note="a cosine-similarity threshold")  # MaskCut's tau


def cosine_affinity(features: Tensor | np.ndarray, tau: float | None = 0.15) -> np.ndarray:
    """Patch affinity ``(N, N)`` from features ``(N, D)``: cosine similarity, MaskCut-binarised at ``tau``.

    With ``tau=None`` the affinity is the cosine similarity clipped below at 1e-5 (continuous).
    """
    if tau is not None:
        TAU.check("tau", tau)
    f = torch.as_tensor(np.asarray(features), dtype=torch.float64)
    f = F.normalize(f, dim=-1)
    A = (f @ f.T).numpy()
    if tau is None:
        return np.maximum(A, 1e-5)
    return np.where(A > tau, 1.0, 1e-5)


def normalized_cut(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Normalized cut (Shi & Malik 2000) of a symmetric non-negative affinity ``W`` (N, N).

    Returns ``(partition, y)``: ``y`` is the second-smallest generalised eigenvector of
    ``(D − W) y = λ D y`` and ``partition = y > mean(y)`` (TokenCut/MaskCut split).  The side holding
    ``argmax |y|`` is returned as True (the "seed" side).
    """
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != W.shape[1]:
        raise ValueError(f"affinity must be a square matrix, got shape {W.shape}")
    N = W.shape[0]
    if N < 2:
        return np.ones(N, dtype=bool), np.zeros(N)
    W = 0.5 * (W + W.T)
    d = W.sum(1)
    if (d <= 0).any():
        raise ValueError("affinity has a node with zero degree; use positive affinities (e.g. a 1e-5 floor)")
    s = 1.0 / np.sqrt(d)
    L_sym = np.eye(N) - s[:, None] * W * s[None, :]
    _, vecs = torch.linalg.eigh(torch.from_numpy(L_sym))  # torch: honours torch.set_num_threads
    y = s * vecs[:, 1].numpy()  # generalised eigenvector D^{-1/2} v
    part = y > y.mean()
    seed = int(np.argmax(np.abs(y - y.mean())))
    if not part[seed]:
        part, y = ~part, -y
    return part, y


def _corners(mask: np.ndarray) -> int:
    return int(mask[0, 0]) + int(mask[0, -1]) + int(mask[-1, 0]) + int(mask[-1, -1])


def maskcut(
    features: Tensor | np.ndarray,
    grid: tuple[int, int],
    n_masks: int = 3,
    tau: float | None = 0.15,
    min_area: float = 0.01,
    keep_component: bool = True,
) -> np.ndarray:
    """MaskCut (JMLR Alg. 1, p.108, removing each found mask as MaskCut intends): up to ``n_masks`` masks ``(S, h, w)``.

    ``features``: ``(N, D)`` patch features of one image on an ``h × w`` grid.  Each round takes a
    normalized cut of the affinity restricted to the patches no earlier mask took, picks the
    foreground side (seed side, flipped if it covers ≥ 3 corners), keeps the 4-connected component
    holding the seed, and removes it.  Masks smaller than ``min_area`` of the grid end the loop.
    """
    h, w = grid
    feats = np.asarray(features, dtype=np.float64)
    if feats.ndim != 2 or feats.shape[0] != h * w:
        raise ValueError(f"features must be (h*w, D) = ({h * w}, D) for grid {h}x{w}, got shape {feats.shape}")
    POSITIVE.check("n_masks", n_masks)
    W_full = cosine_affinity(feats, tau)
    active = np.ones(h * w, dtype=bool)
    masks: list[np.ndarray] = []
    for _ in range(n_masks):
        idx = np.flatnonzero(active)
        if idx.size < 2:
            break
        part, y = normalized_cut(W_full[np.ix_(idx, idx)])
        fg = np.zeros(h * w, dtype=bool)
        fg[idx[part]] = True
        if _corners(fg.reshape(h, w)) >= 3:  # object-centric prior: the background holds the corners
            part, y = ~part, -y
            fg = np.zeros(h * w, dtype=bool)
            fg[idx[part]] = True
        if not part.any():
            break
        seed = idx[part][int(np.argmax(np.abs(y[part] - y.mean())))]
        mask = fg.reshape(h, w)
        if keep_component:
            labels, _ = ndimage.label(mask)
            mask = labels == labels.flat[seed]
        if mask.mean() < min_area:
            break
        masks.append(mask)
        active &= ~mask.ravel()
    return np.stack(masks) if masks else np.zeros((0, h, w), dtype=bool)


def segment(
    model: ImageClassifier,
    images: Tensor,
    layer: int = -1,
    n_masks: int = 3,
    tau: float | None = 0.15,
    min_area: float = 0.01,
) -> list[np.ndarray]:
    """MaskCut on the patch features of each image; returns one ``(S_i, h, w)`` bool array per image."""
    feats = patch_features(model, images, layer)
    p = model.config.patch_size
    grid = (images.shape[-2] // p, images.shape[-1] // p)
    return [maskcut(f, grid, n_masks, tau, min_area) for f in feats]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks (1.0 when both are empty)."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)
