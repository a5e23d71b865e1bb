"""Shared helpers of the analysis toolkit: layer indexing, per-head projections, input batches.

Nothing here re-implements the model: projections are computed by the layer's own modules
(``layer.norm1``, ``layer.attn.qkv``) and the learned subspaces come from ``MSSA.subspaces()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from ..config_utils import POSITIVE
from ..data import fit_normalization, match_channels, normalize
from ..layers.inference import evaluating
from ..models.classifier import ImageClassifier, Trace
from ..models.spec import resolve_normalization  # noqa: F401  (the one resolver; re-exported for the analysis modules)
from ..objectives import subspaces_from_qkv

Normalization = tuple[Sequence[float], Sequence[float]]


def layer_index(model: ImageClassifier, layer: int) -> int:
    """Resolve a Python-style layer index (``-1`` = last) or raise a one-line ValueError."""
    depth = len(model.layers)
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise ValueError(f"layer must be an integer index, got {layer!r}")
    if not -depth <= layer < depth:
        raise ValueError(
            f"layer {layer} does not exist: the model has {depth} layers (valid indices {-depth}..{depth - 1}, "
            "-1 = last)"
        )
    return layer % depth


def head_projections(layer: nn.Module, h: Tensor) -> Tensor:
    """The per-head projections of already-normalised tokens ``h`` (b, n, d) → (b, K, n, p).

    CRATE: ``U_kᵀ·LN1(Z)`` (the output of ``attn.qkv``, shared query = key = value).
    ViT: the **key** facet of ``attn.qkv`` (eq. (438) uses keys for the patch tokens).
    """
    b, n, _ = h.shape
    out = layer.attn.qkv(h)
    if hasattr(layer.attn, "subspaces"):  # MSSA
        K, p = layer.attn.heads, layer.attn.dim_head
        return out.view(b, n, K, p).transpose(1, 2)
    K = layer.attn.heads
    return out.view(b, n, 3, K, -1)[:, :, 1].transpose(1, 2)


def layer_subspaces(layer: nn.Module) -> Tensor:
    """The layer's learned bases ``U`` as (K, d, p): MSSA's ``U_k``; for standard attention (ViT,
    CRATE-MHSA) the key projections."""
    if hasattr(layer.attn, "subspaces"):
        return layer.attn.subspaces()
    w = layer.attn.qkv.weight
    inner = w.shape[0] // 3
    return subspaces_from_qkv(w[inner : 2 * inner], layer.attn.heads)


@torch.no_grad()
def eval_trace(model: ImageClassifier, images: Tensor, return_attention: bool = False) -> tuple[Tensor, Trace]:
    """Check a batch (or one image), trace it in eval mode and restore the model's mode.

    Returns the batch as traced (batched, on the model's device) and its
    :class:`~crate_transformer.models.classifier.Trace`.
    """
    if isinstance(images, Tensor):
        images = (images.unsqueeze(0) if images.dim() == 3 else images).to(model_device(model))
    model.check_images(images)  # shape, channels and NaN/Inf, with a one-line error
    with evaluating(model):
        return images, model.forward_trace(images, return_attention=return_attention)


def model_device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def normalize_images(x: Tensor, normalization: Normalization | None) -> Tensor:
    """``(x − mean) / std`` per channel; identity when ``normalization`` is None."""
    if normalization is None:
        return x
    c = x.shape[1]
    fit = fit_normalization(*normalization, c) if len(np.ravel(normalization[0])) in (1, c) else None
    if fit is None:
        raise ValueError(f"normalisation has {len(np.ravel(normalization[0]))} values but the images have {c} channels")
    return normalize(x, *fit)


def is_image_dataset(obj: object) -> bool:
    """Duck-typed ``data.ImageDataset``: a uint8 ``images`` tensor (N, C, H, W)."""
    imgs = getattr(obj, "images", None)
    return isinstance(imgs, Tensor) and imgs.dim() == 4 and not isinstance(obj, Tensor)


def dataset_images01(dataset: object, indices: Sequence[int] | None = None) -> Tensor:
    """[0, 1] float images (N, C, H, W) of a dataset, without any augmentation."""
    if is_image_dataset(dataset):
        imgs = dataset.images if indices is None else dataset.images[torch.as_tensor(list(indices), dtype=torch.long)]
        return imgs.float() / 255.0 if imgs.dtype == torch.uint8 else imgs.float()
    idx = range(len(dataset)) if indices is None else indices
    items = [dataset[i] for i in idx]
    return torch.stack([it[0] if isinstance(it, (tuple, list)) else it for it in items]).float()


def count_images(images: object) -> int | None:
    """Number of images in a tensor or dataset; None for a loader / plain iterable."""
    if isinstance(images, Tensor):
        return images.shape[0] if images.dim() == 4 else 1
    if _is_map_dataset(images):
        return len(images)  # type: ignore[arg-type]
    return None


def _is_map_dataset(obj: object) -> bool:
    return (
        not isinstance(obj, (Tensor, torch.utils.data.DataLoader))
        and hasattr(obj, "__getitem__")
        and hasattr(obj, "__len__")
    )


def iter_batches(
    images: Tensor | Iterable, batch_size: int, normalization: Normalization | None, channels: int | None = None
) -> Iterator[Tensor]:
    """Yield model-ready float batches from a tensor, an ImageDataset, a map-style dataset or a loader.

    A float tensor or loader is taken as model-ready unless ``normalization`` is given (a uint8 tensor
    is divided by 255 first); a dataset gives [0, 1] images, which are converted to ``channels``
    channels (grey ↔ RGB, as training does) and normalised with ``normalization``.
    """
    POSITIVE.check("batch_size", batch_size)
    if isinstance(images, Tensor):
        if images.dim() == 3:
            images = images.unsqueeze(0)
        for i in range(0, images.shape[0], batch_size):
            x = images[i : i + batch_size]
            yield normalize_images(x.float() / 255.0 if x.dtype == torch.uint8 else x, normalization)
        return
    if _is_map_dataset(images):
        n = len(images)  # type: ignore[arg-type]
        for i in range(0, n, batch_size):
            x = dataset_images01(images, range(i, min(n, i + batch_size)))
            yield normalize_images(x if channels is None else match_channels(x, channels), normalization)
        return
    for item in images:
        x = item[0] if isinstance(item, (tuple, list)) else item
        if not isinstance(x, Tensor):
            raise ValueError(f"expected batches of image tensors, got {type(x).__name__}")
        yield normalize_images(x, normalization)


# written first into a report folder and removed after its last file: a folder that holds it is a report killed
# midway, which `crate analyze` replaces (a plain rerun and --overwrite alike) instead of refusing
PARTIAL_MARKER = ".crate-analyze-incomplete"


def mark_partial(out: Path) -> None:
    """Mark ``out`` as a report being written (:data:`PARTIAL_MARKER`)."""
    (out / PARTIAL_MARKER).write_text(
        "this report was being written and did not finish; analysing again into this folder replaces it\n"
    )


def finish_partial(out: Path) -> None:
    """The report in ``out`` is complete: remove its :data:`PARTIAL_MARKER`."""
    (out / PARTIAL_MARKER).unlink(missing_ok=True)


def is_partial(out: Path) -> bool:
    """Whether ``out`` holds a report that was killed before its last file."""
    return (Path(out) / PARTIAL_MARKER).is_file()
