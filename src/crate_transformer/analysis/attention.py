"""Class-token attention maps (JMLR §4.3, p.51 and App. C.10 eq. (437)-(438); Figs. 18, 20, 27).

For head k of layer ℓ the map is the class-token row of the layer's own attention matrix over the
N patch tokens (eq. (437) for CRATE, ``⟨U_kᵀz_i, U_kᵀz_cls⟩``; eq. (438) for ViT, ``⟨K_kᵀz_i, Q_kᵀz_cls⟩``),
with the model's ``p^{-1/2}`` score scale and renormalised over the patches after dropping the
class-token column (DINO-style; JMLR p.51 and eqs. (437)-(438), p.108).  It is reshaped to the patch grid of the input,
so any image size divisible by the patch size works (the position embedding is interpolated).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..models.classifier import ImageClassifier
from ._common import eval_trace, layer_index

__all__ = ["cls_attention", "summary_rows", "attention_entropy"]


def summary_rows(attention: Tensor, prefix: int) -> Tensor:
    """One map per head from a layer's ``(b, K, n, n)`` attention, over the content tokens: the class token's row
    when the layer has one (``prefix`` ≥ 1, the first row), else the mean of every token's row (for ToST's TSSA
    every row is the same, each head's memberships Π normalised over the tokens); ``(b, K, n − prefix)``."""
    rows = attention[:, :, 0] if prefix else attention.mean(2)
    return rows[:, :, prefix:]


@torch.no_grad()
def cls_attention(model: ImageClassifier, images: Tensor, layer: int = -1) -> Tensor:
    """Per-head class-token attention over the patches, ``(b, K, H/P, W/P)``; each map sums to 1.  For layers
    without a class token (``model.trace_prefix_tokens == 0``, ToST) the mean attention every patch receives
    (:func:`summary_rows`): for TSSA, the heads' memberships Π.

    ``images`` are model-ready (normalised) float images; ``layer`` is a Python index into
    ``model.layers`` (``-1`` = last, ``-2`` = penultimate as in Fig. 27).
    """
    li = layer_index(model, layer)
    images, trace = eval_trace(model, images, return_attention=True)
    a = summary_rows(trace.attention[li].float(), model.trace_prefix_tokens)  # (b, K, N) over the patches
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    p = model.config.patch_size
    return a.reshape(a.shape[0], a.shape[1], images.shape[-2] // p, images.shape[-1] // p).cpu()


def attention_entropy(maps: Tensor) -> Tensor:
    """Entropy (nats) of each attention map ``(..., h, w)``; low = focused, ``log(N)`` = uniform."""
    a = maps.flatten(-2).clamp_min(1e-30)
    return -(a * a.log()).sum(-1)
