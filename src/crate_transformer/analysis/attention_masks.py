"""Per-head attention masks: the Fig. 20 recipe (JMLR §4.3, p.51, Fig. 20; Yu et al., CPAL 2024, Fig. 1).

The recipe, as the emergence demo code runs it: a CRATE with 8×8 patches (``CRATE_base_demo`` /
``CRATE_small_21k`` in ``crate.py`` of LeslieTrue/crate-emergence-notebooks at commit
d62ec794a1935cdb0aef7377822675a68439d9e8, whose ``CRATEFeat.forward_attn`` interpolates the position
embedding to the image and returns ``get_last_selfattention``); per head the class token's row over the patches
(:func:`~.attention.cls_attention`, eq. (437)); each map thresholded to keep a fraction ``mass`` of its attention
mass and upsampled to pixels by nearest-neighbour repetition (``scale_factor = patch_size``).  The thresholding is
DINO's ``visualize_attention.py`` (facebookresearch/dino at commit 7c446df5b9f45747937fb0d72314eb9f7b66930a,
``--threshold``; the DINO paper's masks keep 60%): sort each head's weights, normalise, and keep the patches
whose cumulative sum exceeds ``1 − mass``.

The emergence notebooks' own threshold could not be checked, and this says why.  The stored copy of
LeslieTrue/crate-emergence-notebooks (every commit of its history, ee0dbb2 of 2023-08-30 to d62ec79 of
2024-03-29) holds no notebook (``.ipynb``): only ``crate.py``, ``crate_ae.py``, ``crate_encoder.py``,
``crate_decoder.py``, ``pos_embed.py``, ``pca_visualization.py``, ``shared_extractor.py`` and
images; the notebook that draws Fig. 20 is the Colab ``crate-emergence.ipynb`` the official
README links, which no stored repository holds.  The one threshold in that repository is
``pca_visualization.py``'s ``plot_pca_mask`` (commit d62ec79): a PCA component min-max scaled to [0, 1] and cut
at ``th`` (default 0.5; 0.4 hard-coded at a86d21f, with ``[0.15, 0.2, 0.3, 0.4, 0.5, 0.6]`` commented out) — a
mask of the PCA figure, not of the attention maps.  The demo code's ``get_last_selfattention`` is DINO's
interface, so DINO's keep-mass rule with DINO's 60% is used until the notebook can be read;
tests/official/dino_threshold.py holds the transcription the tests compare against.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import Tensor

from ..config_utils import Range
from ..models.classifier import ImageClassifier
from ._common import Normalization, model_device, normalize_images
from .attention import cls_attention

__all__ = ["MASS", "threshold_attention", "head_masks", "plot_head_masks"]

MASS = Range(0, 1, lo_open=True, note="the fraction of attention mass a mask keeps")


def threshold_attention(maps: Tensor, mass: float = 0.6) -> Tensor:
    """Keep-``mass`` masks of attention maps ``(..., h, w)`` (DINO ``visualize_attention.py``): per map, the
    smallest set of patches, taken from the largest weight down, whose weights hold at least ``mass`` of the
    map's total (ties broken by the sort order).  Returns a bool tensor of the same shape."""
    MASS.check("mass", mass)
    shape = maps.shape
    a = maps.reshape(-1, shape[-2] * shape[-1]).double()
    val, idx = torch.sort(a, dim=1)  # ascending, as DINO
    val = val / val.sum(1, keepdim=True).clamp_min(1e-300)
    keep_sorted = torch.cumsum(val, dim=1) > (1 - mass)
    keep = torch.zeros_like(keep_sorted)
    keep.scatter_(1, idx, keep_sorted)  # back to the patch order (DINO: th_attn[head][argsort(idx)])
    return keep.reshape(shape)


@torch.no_grad()
def head_masks(
    model: ImageClassifier,
    images: Tensor,
    layer: int = -1,
    mass: float = 0.6,
    normalization: Normalization | None = None,
) -> tuple[Tensor, Tensor]:
    """Fig. 20's per-head maps and masks of ``images`` (``[0, 1]``, ``(b, C, H, W)``, sides divisible by the patch).

    Returns ``(maps, masks)``, both ``(b, K, H, W)``: the class-token attention of each head at ``layer``
    upsampled to pixels by repetition (nearest, ``scale_factor = patch_size`` as DINO's script), and its
    keep-``mass`` mask (:func:`threshold_attention`, applied on the patch grid before the upsampling, as DINO).
    The paper's figures use a model with 8×8 patches; any patch size works here.
    """
    p = model.config.patch_size
    if images.dim() != 4 or images.shape[-1] % p or images.shape[-2] % p:
        raise ValueError(
            f"images must be (b, C, H, W) with H and W multiples of the patch size {p}, got {tuple(images.shape)}"
        )
    x = normalize_images(images.float().to(model_device(model)), normalization)
    maps = cls_attention(model, x, layer)  # (b, K, h, w), each sums to 1
    masks = threshold_attention(maps, mass)
    up = F.interpolate(maps, scale_factor=p, mode="nearest")
    return up, F.interpolate(masks.float(), scale_factor=p, mode="nearest").bool()


def plot_head_masks(image: Tensor, maps: Tensor, masks: Tensor, title: str = "") -> Figure:
    """One panel per head as in Fig. 20: the head's attention map over the image, its mask outlined; ``image``
    ``(C, H, W)`` in [0, 1], ``maps`` / ``masks`` ``(K, H, W)`` (one image of :func:`head_masks`)."""
    K = maps.shape[0]
    if masks.shape != maps.shape or maps.shape[-2:] != image.shape[-2:]:
        raise ValueError(
            f"maps {tuple(maps.shape)}, masks {tuple(masks.shape)} and image {tuple(image.shape)} disagree"
        )
    fig = Figure(figsize=(2.0 * K, 2.3))
    rgb = image.permute(1, 2, 0).float().numpy()
    rgb = np.repeat(rgb, 3, axis=2) if rgb.shape[2] == 1 else rgb[..., :3]
    for k, ax in enumerate(fig.subplots(1, K, squeeze=False)[0]):
        ax.imshow(rgb)
        ax.imshow(maps[k].numpy(), cmap="inferno", alpha=0.6)
        ax.contour(masks[k].numpy().astype(float), levels=[0.5], colors="cyan", linewidths=0.8)
        ax.set_title(f"head {k}", fontsize=8)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
