"""The interactive explorer of ``report.html``: attention per layer and head, PCA colours and MaskCut masks.

One self-contained HTML fragment (inline CSS, plain JavaScript drawing on ``<canvas>``, no framework, no
network): pick an image (or a text for a language model), a layer and a head; hover a patch (token) to see
where it attends; toggle the PCA colouring and the MaskCut masks of the chosen layer.

* :func:`image_payload` — the compact data of an image model: the input images as PNG data URLs, every layer's
  ``(K, n, N)`` attention (queries: the class token then the N patches; keys: the patches, the class-token
  column dropped as in :func:`~.attention.cls_attention`), the PCA colours
  (:func:`~.segmentation.pca_rgb`) and the MaskCut labels (:func:`~.segmentation.maskcut`) of every layer.
* :func:`text_payload` — the same for a language model: tokens and every layer's ``(K, n, n)`` attention.
* :func:`explorer_section` — the HTML fragment for a payload; :func:`write_explorer` — a whole page.

Attention rows are stored as uint8, each row scaled to its own maximum (``round(255·a/max a)``): the explorer
shows each query's attention relative to its peak, as :func:`~.plots.plot_attention` scales each map, and the
file stays small (one byte per query-key pair).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from torch import Tensor

from ..io import make_folder
from ..layers.inference import evaluating
from ..models.classifier import ImageClassifier
from ._common import Normalization, eval_trace, layer_index, normalize_images
from .attention import summary_rows
from .plots import MASK_COLORS
from .segmentation import maskcut, patch_features, pca_rgb

__all__ = ["image_payload", "text_payload", "explorer_section", "write_explorer", "quantize_rows", "mask_labels"]

MAX_BYTES = 6_000_000  # attention bytes of the default payload (about 8 MB once base64-encoded in the page)


def quantize_rows(a: Tensor | np.ndarray) -> np.ndarray:
    """``round(255·a / max(a))`` along the last axis as uint8 (an all-zero row stays zero)."""
    a = torch.as_tensor(np.asarray(a), dtype=torch.float64)
    peak = a.amax(-1, keepdim=True).clamp_min(1e-30)
    return (a / peak * 255.0).round().clamp(0, 255).to(torch.uint8).numpy()


def mask_labels(masks: np.ndarray) -> np.ndarray:
    """MaskCut masks ``(S, h, w)`` as one label map ``(h, w)`` uint8: 0 = background, s = mask s (1-based)."""
    masks = np.asarray(masks, dtype=bool)
    label = np.zeros(masks.shape[1:], dtype=np.uint8)
    for s, m in enumerate(masks):
        label[m & (label == 0)] = s + 1
    return label


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=np.uint8).tobytes()).decode("ascii")


def _png_data_url(img: Tensor) -> str:
    """A ``(C, H, W)`` image in [0, 1] as a PNG data URL (grey for 1 or 2 channels, else the first 3 as RGB)."""
    from PIL import Image

    a = (img.detach().float().clamp(0, 1).cpu() * 255).round().to(torch.uint8)
    arr = a[0].numpy() if a.shape[0] < 3 else a[:3].permute(1, 2, 0).numpy()
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _colormap(name: str = "inferno") -> list[list[int]]:
    """256 RGB entries of a matplotlib colormap (the one :func:`~.plots.plot_attention` uses)."""
    return (colormaps[name](np.linspace(0, 1, 256))[:, :3] * 255).round().astype(int).tolist()


def _pick_layers(model: torch.nn.Module, layers: Sequence[int] | None, per_layer: int, max_bytes: int) -> list[int]:
    """Layer indices to include: those asked for, else all of them or, past ``max_bytes``, evenly spaced ones
    that always include the last layer."""
    depth = len(model.layers)
    if layers is not None:
        chosen = sorted({layer_index(model, li) for li in layers})
        if not chosen:
            raise ValueError("layers is empty: pass at least one layer index (e.g. -1 for the last)")
        return chosen
    n = max(1, min(depth, max_bytes // max(per_layer, 1)))
    return sorted({int(i) for i in np.linspace(depth - 1, 0, n).round()})


def _segmentation(
    model: ImageClassifier, x: Tensor, li: int, grid: tuple[int, int], n_masks: int, tau: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """PCA colours ``(b, h, w, 3)`` uint8 and MaskCut labels ``(b, h, w)`` of layer ``li``'s patch features."""
    feats = patch_features(model, x, li)
    rgb, _ = pca_rgb(feats, grid)
    labels = np.stack([mask_labels(maskcut(f, grid, n_masks, tau)) for f in feats])
    return (rgb * 255).round().astype(np.uint8), labels


def _summary_first(attention: Tensor, prefix: int) -> Tensor:
    """``(b, K, 1 + N, N)``: the summary row (:func:`~.attention.summary_rows`), then every patch's row, over the
    patch keys; a class token's own row is the summary when the layers have one."""
    rows = attention[:, :, :, prefix:]
    return rows if prefix else torch.cat([summary_rows(attention, 0).unsqueeze(2), rows], dim=2)


@torch.no_grad()
def image_payload(
    model: ImageClassifier,
    images: Tensor,
    normalization: Normalization | None = None,
    *,
    layers: Sequence[int] | None = None,
    n_masks: int = 3,
    tau: float | None = 0.15,
    max_bytes: int = MAX_BYTES,
    captions: Sequence[str] | None = None,
    truth: Tensor | None = None,
) -> dict:
    """The explorer's data for an image model and a few ``images`` ``(b, C, H, W)`` in [0, 1].

    ``normalization`` (mean, std) turns the images into model inputs.  ``layers`` are Python indices into
    ``model.layers`` (default: every layer, or evenly spaced ones when the attention would exceed
    ``max_bytes``).  ``n_masks`` and ``tau`` are MaskCut's (:func:`~.segmentation.maskcut`).  ``truth``: ground-truth
    instance labels ``(b, H, W)`` uint8 of the images (0 = background; :func:`~.segment_data.truth_labels`), whose
    outlines the explorer draws over the predicted masks.
    """
    if images.dim() != 4 or not len(images):
        raise ValueError(f"images must be a non-empty (b, C, H, W) batch in [0, 1], got shape {tuple(images.shape)}")
    if captions is not None and len(captions) != len(images):
        raise ValueError(f"{len(captions)} captions for {len(images)} images: give one caption per image")
    x = normalize_images(images.float(), normalization)
    x, trace = eval_trace(model, x, return_attention=True)
    c = model.config
    grid = (x.shape[-2] // c.patch_size, x.shape[-1] // c.patch_size)
    b, K, n = trace.attention[0].shape[:3]
    N, prefix = grid[0] * grid[1], model.trace_prefix_tokens
    if n != N + prefix or prefix > 1:
        raise ValueError(f"the explorer needs at most one class token and {N} patch tokens, but the model has {n}")
    chosen = _pick_layers(model, layers, b * K * (N + 1) * N, max_bytes)
    attn = np.stack([quantize_rows(_summary_first(trace.attention[li].float(), prefix).cpu()) for li in chosen], 1)
    segs = [_segmentation(model, x, li, grid, n_masks, tau) for li in chosen]
    if truth is not None and tuple(truth.shape) != (b, *images.shape[-2:]):
        raise ValueError(f"truth must be (b, H, W) = {(b, *images.shape[-2:])} labels, got {tuple(truth.shape)}")
    extra = {} if truth is None else {"truth": _b64(truth.cpu().numpy()), "truth_size": list(images.shape[-2:])}
    return {
        **extra,
        "kind": "image",
        "grid": list(grid),
        "heads": K,
        "layers": [li + 1 for li in chosen],
        "depth": len(model.layers),
        "images": [_png_data_url(im) for im in images],
        "captions": list(captions) if captions is not None else [f"image {i + 1}" for i in range(b)],
        "attention": _b64(attn),  # (b, layers, K, 1 + N queries, N patch keys)
        "summary": "class token" if prefix else "all patches (mean)",  # what query row 0 is
        "pca": _b64(np.stack([s[0] for s in segs], 1)),  # (b, layers, h, w, 3)
        "masks": _b64(np.stack([s[1] for s in segs], 1)),  # (b, layers, h, w), 0 = background
        "mask_colors": MASK_COLORS[1:].astype(int).tolist(),
        "colormap": _colormap(),
        "maskcut": {"n_masks": n_masks, "tau": tau},
    }


@torch.no_grad()
def text_payload(
    model: torch.nn.Module,
    blocks: Tensor,
    tokens: Sequence[Sequence[str]],
    *,
    layers: Sequence[int] | None = None,
    max_bytes: int = MAX_BYTES,
) -> dict:
    """The explorer's data for a language model: ``blocks`` ``(T, n)`` token ids and their token strings.

    Each block is traced once; ``attention[t, layer, k, i, j]`` is how much token i attends to token j (zero
    after i for a causal model).  ``layers`` as in :func:`image_payload`.
    """
    if blocks.dim() != 2 or not blocks.numel():
        raise ValueError(f"blocks must be a non-empty (texts, tokens) tensor of token ids, got {tuple(blocks.shape)}")
    if len(tokens) != len(blocks) or any(len(t) != blocks.shape[1] for t in tokens):
        raise ValueError(f"tokens must give {blocks.shape[1]} strings for each of the {len(blocks)} blocks")
    with evaluating(model):
        trace = model.forward_trace(blocks.to(model.wte.weight.device), return_attention=True)
    T, K, n = trace.attention[0].shape[:3]
    chosen = _pick_layers(model, layers, T * K * n * n, max_bytes)
    attn = np.stack([quantize_rows(trace.attention[li].float().cpu()) for li in chosen], 1)
    return {
        "kind": "text",
        "heads": K,
        "layers": [li + 1 for li in chosen],
        "depth": len(model.layers),
        "causal": bool(getattr(model.config, "causal", False)),
        "tokens": [[str(s) for s in t] for t in tokens],
        "captions": [f"text {i + 1}" for i in range(T)],
        "attention": _b64(attn),  # (T, layers, K, n queries, n keys)
        "colormap": _colormap(),
    }


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def explorer_section(payload: dict) -> str:
    """The explorer as an HTML fragment (a ``<section id="xp-explorer">`` with inline CSS and JavaScript).

    Element ids (stable, for scripts and tests): ``xp-item`` (image / text), ``xp-layer``, ``xp-head``,
    ``xp-alpha`` (overlay opacity, 0-100), ``xp-noself`` (rescale without the query's own patch), ``xp-pca``,
    ``xp-masks`` (checkboxes), canvases ``xp-attn`` and
    ``xp-seg``, the token list ``xp-tokens`` and the status line ``xp-status``.
    """
    if payload.get("kind") not in ("image", "text"):
        raise ValueError(f"not an explorer payload (kind {payload.get('kind')!r}): build it with image_payload()")
    data = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    kind = payload["kind"]
    hint = (
        "Hover a patch: the left panel shows where it attends (leave the image: the class token's attention)."
        if kind == "image"
        else "Hover a token: the tokens are coloured by how much it attends to each of them."
    )
    return (
        f"<section id='xp-explorer' data-kind='{kind}' data-ready='0'><h2>Explorer</h2>"
        f"<p class='xp-hint'>{html.escape(hint)} Attention of each query is scaled to its own maximum.</p>"
        f"<style>{_asset('explorer.css')}</style>"
        f"<script type='application/json' id='xp-data'>{data}</script>"
        f"<div id='xp-root'></div><script>{_asset('explorer.js')}</script></section>"
    )


def write_explorer(payload: dict, path: str | Path, title: str = "CRATE explorer") -> Path:
    """A standalone HTML page holding only the explorer of ``payload``; returns its path."""
    path = Path(path)
    make_folder(path.parent)
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head>"
        f"<body style='font-family:sans-serif'>{explorer_section(payload)}</body></html>\n"
    )
    path.write_text(page, encoding="utf-8")
    return path
