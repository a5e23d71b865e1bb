"""Figures of the analysis toolkit (PNG, matplotlib's object API, no pyplot state).

Every function returns the :class:`matplotlib.figure.Figure` and writes a PNG when ``path`` is given.

* :func:`plot_layerwise` — compression and sparsity versus layer, one line per split or checkpoint
  (JMLR Fig. 14 / Fig. 21 / Fig. 26 style).
* :func:`plot_measure_history` — the same across training steps or epochs from logged records
  (Fig. 15 style: random init → epoch 1 → … ; darker = later).
* :func:`plot_attention` — per-head class-token attention overlaid on the inputs (Figs. 18, 20, 27).
* :func:`plot_pca` — PCA of patch features as RGB; :func:`plot_masks` — MaskCut masks (Fig. 19);
  :func:`save_mask_png` — one label PNG per image.
* :func:`plot_subspace_grams` — ``|Uᵀ U|`` per layer (Fig. 17); :func:`plot_token_heatmaps` — random
  sub-matrices of the ISTA outputs per layer (JMLR Fig. 16, p.49).
* :func:`plot_reconstructions` — CRATE-MAE original / masked / reconstruction rows (Fig. 11);
  :func:`plot_decoder_inversion` — how far each decoder layer inverts its encoder counterpart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib import colormaps
from matplotlib.figure import Figure
from torch import Tensor

from ..io import make_folder
from .figures import InlineFigure
from .measure import METRICS, LayerTable

__all__ = [
    "METRIC_LABELS",
    "plot_layerwise",
    "plot_measure_history",
    "plot_attention",
    "plot_pca",
    "plot_masks",
    "save_mask_png",
    "plot_subspace_grams",
    "plot_token_heatmaps",
    "plot_reconstructions",
    "plot_decoder_inversion",
]

METRIC_LABELS: dict[str, str] = {
    "rc_in": r"$R^c(Z^{\ell}\,|\,U^{\ell}_{[K]})$ at MSSA input",
    "rc_half": r"$R^c(Z^{\ell+1/2}\,|\,U^{\ell}_{[K]})$",
    "rc_out": r"$R^c(Z^{\ell+1}\,|\,U^{\ell}_{[K]})$",
    "sparsity": r"fraction of zeros of $Z^{\ell+1}$",
    "nonzero": r"fraction of non-zeros $\|Z^{\ell+1}\|_0/(d\cdot n)$",
    "l1": r"$\|Z^{\ell+1}\|_1/(d\cdot n)$",
    "rate": r"$R(Z^{\ell+1})$",
    "rate_reduction": r"$\Delta R(Z^{\ell+1}\,|\,U^{\ell}_{[K]})$",
    "rvar_in": r"$R^c_{var}(Z^{\ell}, \Pi\,|\,U^{\ell}_{[K]})$ at TSSA input",
    "rvar_half": r"$R^c_{var}(Z^{\ell+1/2}, \Pi\,|\,U^{\ell}_{[K]})$",
    "rvar_out": r"$R^c_{var}(Z^{\ell+1}, \Pi\,|\,U^{\ell}_{[K]})$",
}

# the colours of the masks in the MaskCut figures, the label PNGs and the explorer (0: background)
MASK_COLORS = np.array(
    [
        [0, 0, 0],
        [230, 25, 75],
        [60, 180, 75],
        [0, 130, 200],
        [255, 225, 25],
        [145, 30, 180],
        [70, 240, 240],
        [240, 50, 230],
        [245, 130, 48],
    ],
    dtype=np.uint8,
)


def save_figure(fig: Figure, path: str | Path | None, dpi: int = 100) -> Figure:
    """Write ``fig`` as a PNG at ``path`` (when given; folders created) and return it."""
    if path is not None:
        make_folder(Path(path).parent)
        fig.savefig(path, dpi=dpi, bbox_inches="tight")
    return fig


def _label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def _series(table: LayerTable | Sequence[Mapping], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layers, mean, std) from a LayerTable or a list of per-layer records."""
    if isinstance(table, LayerTable):
        return np.array(table.layers), table.mean(metric), table.std(metric)
    recs = sorted(table, key=lambda r: r["layer"])
    if not recs or metric not in recs[0]:
        raise ValueError(f"records have no metric {metric!r}; available: {sorted(recs[0]) if recs else []}")
    return (
        np.array([r["layer"] for r in recs]),
        np.array([r[metric] for r in recs], dtype=float),
        np.array([r.get(f"{metric}_std", 0.0) for r in recs], dtype=float),
    )


def plot_layerwise(
    tables: Mapping[str, LayerTable | Sequence[Mapping]] | LayerTable,
    path: str | Path | None = None,
    *,
    metrics: Sequence[str] = ("rc_in", "nonzero"),
    title: str | None = None,
    band: bool = True,
    references: Mapping[str, LayerTable | Sequence[Mapping]] | None = None,
) -> Figure:
    """Metrics versus layer, one line per entry of ``tables`` (e.g. ``{"train": t1, "val": t2}``) — Fig. 14.

    The shaded band is ± one standard deviation over samples.  ``references`` (e.g. the same architecture at
    initialisation) are drawn dashed, without bands, in the colours of the tables they go with (in order).
    """
    if isinstance(tables, LayerTable):
        tables = {"": tables}
    if not tables:
        raise ValueError("nothing to plot: pass at least one table")
    references = dict(references or {})
    for m in metrics:
        if m not in METRIC_LABELS and all(isinstance(t, LayerTable) and m not in t.values for t in tables.values()):
            raise ValueError(f"unknown metric {m!r}; available: {', '.join(METRICS)}")
    ncol = len(metrics)
    fig = InlineFigure(figsize=(4.2 * ncol, 3.4), layout="constrained")
    axes = fig.subplots(1, ncol, squeeze=False)[0]
    colors = colormaps["tab10"]
    for ax, m in zip(axes, metrics):
        for i, (name, t) in enumerate(tables.items()):
            x, mu, sd = _series(t, m)
            ax.plot(x, mu, "o-", color=colors(i % 10), label=name or None, ms=4)
            if band and np.any(sd > 0):
                ax.fill_between(x, mu - sd, mu + sd, color=colors(i % 10), alpha=0.2, lw=0)
        for name, t in references.items():
            x, mu, _ = _series(t, m)
            fmt, color = _reference_style(name, list(tables), references)
            ax.plot(x, mu, fmt, color=color, label=name, ms=3, alpha=0.7, lw=1.2)
        ax.set_xlabel(r"layer index $\ell$")
        ax.set_ylabel(_label(m))
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
        if any(tables) or references:
            ax.legend(fontsize=8)
    fig.suptitle(title or "Layer-wise compression and sparsity (cf. JMLR Fig. 14)")
    return save_figure(fig, path)


REFERENCE_STYLES = ("s--", "^:", "v-.", "D--")  # one per kind of reference ("untrained", "starting checkpoint")


def _reference_style(name: str, tables: list[str], references: Mapping[str, object]) -> tuple[str, object]:
    """A reference's line: the colour of the table it goes with (the longest table name it starts with; grey
    when none, e.g. records of the run's step 0), a marker and dash per kind of reference (its name after the
    table's), so an untrained network's and a starting checkpoint's curves of one split differ only in dash."""

    def split(ref: str) -> tuple[int | None, str]:
        owners = [i for i, t in enumerate(tables) if t and ref.startswith(t)]
        i = max(owners, key=lambda j: len(tables[j]), default=None)
        return i, ref[len(tables[i]) :].strip() if i is not None else ref

    kinds = list(dict.fromkeys(split(r)[1] for r in references))
    i, kind = split(name)
    if i is None and len(tables) == 1 and not tables[0]:  # a single unnamed table: every reference is its
        i = 0
    color = colormaps["tab10"](i % 10) if i is not None else "0.45"
    return REFERENCE_STYLES[kinds.index(kind) % len(REFERENCE_STYLES)], color


def _group_history(records: Iterable[Mapping] | Mapping, step_key: str) -> dict[object, list[Mapping]]:
    if isinstance(records, Mapping):
        return {k: (v.to_records() if isinstance(v, LayerTable) else list(v)) for k, v in records.items()}
    groups: dict[object, list[Mapping]] = {}
    for r in records:
        if step_key not in r or "layer" not in r:
            raise ValueError(f"each record needs 'layer' and {step_key!r} keys, got keys {sorted(r)}")
        groups.setdefault(r[step_key], []).append(r)
    return groups


def plot_measure_history(
    records: Iterable[Mapping] | Mapping[object, LayerTable | Sequence[Mapping]],
    path: str | Path | None = None,
    *,
    step_key: str = "epoch",
    metrics: Sequence[str] = ("rc_in", "nonzero"),
    title: str | None = None,
    max_lines: int = 12,
) -> Figure:
    """Metrics versus layer across training (Fig. 15): one line per step/epoch, darker = later.

    ``records``: the flat per-layer records logged during training, each ``measure(...).to_records()``
    row plus ``step_key`` (e.g. ``{"epoch": 3, "layer": 2, "rc_in": ..., ...}``); or a mapping
    ``{label: LayerTable or records}`` (e.g. checkpoints).  With more than ``max_lines`` steps an evenly
    spaced subset (always including the first and last) is drawn.
    """
    groups = _group_history(records, step_key)
    if not groups:
        raise ValueError("no measurement records to plot")
    keys = list(groups)
    if not isinstance(records, Mapping):
        keys = sorted(keys, key=lambda k: (float(k) if isinstance(k, (int, float)) else 0.0, str(k)))
    if len(keys) > max_lines:
        keys = [keys[i] for i in np.unique(np.linspace(0, len(keys) - 1, max_lines).round().astype(int))]
    cmap = colormaps["viridis"]
    ncol = len(metrics)
    fig = InlineFigure(figsize=(4.2 * ncol + 0.8, 3.4), layout="constrained")
    axes = fig.subplots(1, ncol, squeeze=False)[0]
    for ax, m in zip(axes, metrics):
        for i, k in enumerate(keys):
            x, mu, _ = _series(groups[k], m)
            c = cmap(0.9 * i / max(1, len(keys) - 1))
            if isinstance(records, Mapping):
                label = str(k)
            else:
                label = f"{step_key} {k:.3g}" if isinstance(k, float) else f"{step_key} {k}"
            ax.plot(x, mu, "o-", color=c, ms=3, label=label)
        ax.set_xlabel(r"layer index $\ell$")
        ax.set_ylabel(_label(m))
        ax.set_xticks(x)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(title or "Compression and sparsity across training (cf. JMLR Fig. 15)")
    return save_figure(fig, path)


def _hwc(img: Tensor) -> tuple[np.ndarray, str | None]:
    """(C, H, W) [0, 1] → displayable array and colormap."""
    a = img.detach().float().clamp(0, 1).cpu()
    if a.shape[0] == 1:
        return a[0].numpy(), "gray"
    if a.shape[0] >= 3:
        return a[:3].permute(1, 2, 0).numpy(), None
    return a.mean(0).numpy(), "gray"


def _upsample(maps: Tensor, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    m = maps.float().unsqueeze(0) if maps.dim() == 3 else maps.float()
    kw = {"align_corners": False} if mode == "bilinear" else {}
    return F.interpolate(m, size=size, mode=mode, **kw).squeeze(0).numpy()


# panels per row of the attention figure: 12 heads wrap onto two rows of 7 so that each map stays large enough to
# read where report.html shows the figure (at most ~1070 px wide)
ATTENTION_ROW = 8


def plot_attention(
    images: Tensor,
    maps: Tensor,
    path: str | Path | None = None,
    *,
    title: str | None = None,
    alpha: float = 0.6,
    show_mean: bool = True,
) -> Figure:
    """Each image, then its K head maps (heads 1..K) upsampled and overlaid, then their mean (Figs. 18, 20, 27);
    an image whose panels exceed :data:`ATTENTION_ROW` wraps onto several even rows, every panel titled.

    ``images``: ``(b, C, H, W)`` in [0, 1] (for display); ``maps``: ``(b, K, h, w)`` from
    :func:`~crate_transformer.analysis.attention.cls_attention`.  Each map is scaled to its own max.
    """
    if images.shape[0] != maps.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {maps.shape[0]} attention maps")
    b, K = maps.shape[:2]
    per_image = 1 + K + int(show_mean)
    rows = -(-per_image // ATTENTION_ROW)  # rows per image
    cols = -(-per_image // rows)
    fig = InlineFigure(figsize=(1.6 * cols, 1.7 * b * rows + 0.4), layout="constrained")
    grid = fig.subplots(b * rows, cols, squeeze=False)
    H, W = images.shape[-2:]
    for i in range(b):
        img, cmap = _hwc(images[i])
        up = _upsample(maps[i], (H, W))
        block = grid[i * rows : (i + 1) * rows].ravel()
        named = i == 0 or rows > 1  # heads numbered 1..K, as U_1..U_K in the paper
        block[0].imshow(img, cmap=cmap)
        block[0].set_title("input" if named else "", fontsize=8)
        for j, a in enumerate([*up, up.mean(0)] if show_mean else list(up)):
            ax = block[j + 1]
            ax.imshow(img, cmap=cmap)
            im = ax.imshow(a / max(float(a.max()), 1e-12), cmap="inferno", alpha=alpha, vmin=0, vmax=1)
            ax.set_title((f"head {j + 1}" if j < K else "mean") if named else "", fontsize=8)
        for ax in block[per_image:]:
            ax.axis("off")
    for ax in grid.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=grid, shrink=0.8, label="attention / its max over the image")
    fig.suptitle(title or "Class-token attention per head (cf. JMLR Figs. 18, 27)", fontsize=10)
    return save_figure(fig, path)


def plot_pca(images: Tensor, rgb: np.ndarray, path: str | Path | None = None, *, title: str | None = None) -> Figure:
    """Inputs (top) and the RGB of the first three PCA components of their patch features (bottom)."""
    b = images.shape[0]
    fig = InlineFigure(figsize=(1.8 * b, 3.9), layout="constrained")
    axes = fig.subplots(2, b, squeeze=False)
    for i in range(b):
        img, cmap = _hwc(images[i])
        axes[0, i].imshow(img, cmap=cmap)
        axes[1, i].imshow(rgb[i], interpolation="nearest")
        for ax in axes[:, i]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0, 0].set_ylabel("input", fontsize=8)
    axes[1, 0].set_ylabel("PCA (RGB = PC1-3)", fontsize=8)
    fig.suptitle(title or "PCA of patch features (cf. JMLR Fig. 19; official pca_visualization.py)", fontsize=10)
    return save_figure(fig, path)


def _mask_overlay(img: np.ndarray, masks: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    base = img if img.ndim == 3 else np.repeat(img[..., None], 3, axis=-1)
    out = base.copy()
    for s, m in enumerate(masks):
        up = _upsample(torch.from_numpy(m[None].astype(np.float32)), size, mode="nearest")[0] > 0.5
        color = MASK_COLORS[1 + s % (len(MASK_COLORS) - 1)] / 255.0
        out[up] = 0.45 * out[up] + 0.55 * color
    return out


def plot_masks(
    images: Tensor, masks: Sequence[np.ndarray], path: str | Path | None = None, *, title: str | None = None
) -> Figure:
    """Inputs (top) and their MaskCut masks overlaid, one colour per mask (bottom) — Fig. 19 style."""
    b = images.shape[0]
    H, W = images.shape[-2:]
    fig = InlineFigure(figsize=(1.8 * b, 3.9), layout="constrained")
    axes = fig.subplots(2, b, squeeze=False)
    for i in range(b):
        img, cmap = _hwc(images[i])
        axes[0, i].imshow(img, cmap=cmap)
        axes[1, i].imshow(_mask_overlay(img, masks[i], (H, W)))
        axes[1, i].set_title(f"{len(masks[i])} mask(s)", fontsize=8)
        for ax in axes[:, i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(title or "MaskCut segmentation (cf. JMLR Fig. 19, Alg. 1)", fontsize=10)
    return save_figure(fig, path)


def save_mask_png(masks: np.ndarray, size: tuple[int, int], path: str | Path) -> Path:
    """A palette PNG of the masks at image resolution: 0 = background, s = mask s (1-based)."""
    from PIL import Image

    h, w = size
    label = np.zeros((h, w), dtype=np.uint8)
    for s, m in enumerate(masks):
        up = _upsample(torch.from_numpy(m[None].astype(np.float32)), (h, w), mode="nearest")[0] > 0.5
        label[up & (label == 0)] = s + 1
    im = Image.fromarray(label, mode="P")
    palette = np.zeros((256, 3), dtype=np.uint8)
    palette[: len(MASK_COLORS)] = MASK_COLORS
    im.putpalette(palette.ravel().tolist())
    make_folder(Path(path).parent)
    im.save(path)
    return Path(path)


def _layer_grid(L: int, w: float, h: float) -> tuple[Figure, np.ndarray, list]:
    """A figure with one tick-less panel per layer (at most 6 per row); unused panels are hidden."""
    cols = min(L, 6)
    rows = (L + cols - 1) // cols
    fig = InlineFigure(figsize=(w * cols + 0.6, h * rows + 0.4), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if i >= L:
            ax.axis("off")
    return fig, axes, list(axes.flat)[:L]


def plot_subspace_grams(
    grams: Sequence[np.ndarray],
    path: str | Path | None = None,
    *,
    block: int | None = None,
    layers: Sequence[int] | None = None,
    title: str | None = None,
) -> Figure:
    """``|Uᵀ U|`` per layer as heatmaps (Fig. 17; colour scale 0-1); ``block`` draws head boundaries."""
    fig, axes, panels = _layer_grid(len(grams), 2.3, 2.4)
    im = None
    for i, ax in enumerate(panels):
        g = grams[i]
        im = ax.imshow(g, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        if block:
            for t in range(block, g.shape[0], block):
                ax.axhline(t - 0.5, color="w", lw=0.5)
                ax.axvline(t - 0.5, color="w", lw=0.5)
        ax.set_title(f"layer {layers[i] if layers else i + 1}", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label=r"$|U_i^\top U_j|$ (unit columns)")
    fig.suptitle(title or "Subspace incoherence: Gram of the learned bases (cf. JMLR Fig. 17)", fontsize=10)
    return save_figure(fig, path)


def plot_token_heatmaps(
    tokens: Sequence[Tensor | np.ndarray],
    path: str | Path | None = None,
    *,
    size: int = 50,
    seed: int = 0,
    vmax: float = 2.0,
    title: str | None = None,
) -> Figure:
    """Random ``size × size`` sub-matrices of each layer's output ``|Z^{ℓ+1}|`` (Fig. 16; colour 0-``vmax``).

    ``tokens[ℓ]`` is one sample's ``(n, d)`` ISTA output of layer ℓ+1.  The same rows/columns are used
    for every layer.
    """
    L = len(tokens)
    n, d = np.asarray(tokens[0]).shape
    g = np.random.default_rng(seed)
    r = np.sort(g.choice(n, min(size, n), replace=False))
    c = np.sort(g.choice(d, min(size, d), replace=False))
    fig, axes, panels = _layer_grid(L, 2.2, 2.3)
    im = None
    for i, ax in enumerate(panels):
        z = np.abs(np.asarray(tokens[i], dtype=np.float64))[np.ix_(r, c)]
        im = ax.imshow(z, cmap="magma", vmin=0, vmax=vmax, interpolation="nearest", aspect="auto")
        ax.set_title(f"layer {i + 1}", fontsize=8)
    if im is not None:
        fig.colorbar(im, ax=axes, shrink=0.8, label=r"$|Z^{\ell+1}|$")
    fig.suptitle(title or f"ISTA outputs, random {len(r)}x{len(c)} tokens x features (cf. JMLR Fig. 16)", fontsize=10)
    return save_figure(fig, path)


def plot_reconstructions(
    images: Tensor, masked: Tensor, recon: Tensor, path: str | Path | None = None, *, title: str | None = None,
    losses: Sequence[float] | None = None,
) -> Figure:  # fmt: skip
    """CRATE-MAE reconstructions in the style of JMLR Fig. 11 (p.39): one column per image, rows
    original / masked input (masked patches grey) / reconstruction.  Images are ``(b, C, H, W)`` in [0, 1]."""
    b = images.shape[0]
    fig = InlineFigure(figsize=(1.25 * b + 0.6, 4.2), layout="constrained")
    axes = fig.subplots(3, b, squeeze=False)
    for i in range(b):
        for row, img in enumerate((images[i], masked[i], recon[i])):
            arr, cmap = _hwc(img.clamp(0, 1))
            axes[row, i].imshow(arr, cmap=cmap, vmin=0, vmax=1, interpolation="nearest")
            axes[row, i].set_xticks([])
            axes[row, i].set_yticks([])
        if losses is not None:
            axes[2, i].set_xlabel(f"{losses[i]:.3f}", fontsize=7)
    for row, label in enumerate(("original", "masked", "reconstruction")):
        axes[row, 0].set_ylabel(label, fontsize=8)
    fig.suptitle(title or "CRATE-MAE reconstructions (cf. JMLR Fig. 11)", fontsize=9)
    return save_figure(fig, path)


def plot_decoder_inversion(
    rows: Sequence[Mapping], path: str | Path | None = None, *, title: str | None = None
) -> Figure:
    """Per encoder layer ℓ: cosine similarity of the decoder's reconstruction of ``Z^ℓ`` to ``Z^ℓ``
    (chained through the decoder, and one decoder layer applied to the encoder's ``Z^{ℓ+1}``), against
    the do-nothing baseline ``cos(Z^{ℓ+1}, Z^ℓ)`` (see :func:`.decoder.decoder_inversion`)."""
    fig = InlineFigure(figsize=(5.2, 3.4), layout="constrained")
    ax = fig.subplots()
    layers = [r["layer"] for r in rows]
    for key, label, style in (
        ("cos_chain", "decoder chain  cos(Ẑ^ℓ, Z^ℓ)", "o-"),
        ("cos_local", "one decoder layer  cos(g(Z^{ℓ+1}), Z^ℓ)", "s-"),
        ("cos_identity", "baseline  cos(Z^{ℓ+1}, Z^ℓ)", "x--"),
    ):
        ax.plot(layers, [r[key] for r in rows], style, label=label, ms=4)
    ax.set(xlabel="encoder layer (1..L; inverted by decoder layer L+1−layer)", ylabel="mean token cosine similarity")
    ax.set_xticks(layers)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title or "decoder as the structured inverse of the encoder (JMLR §3.5)", fontsize=9)
    return save_figure(fig, path)
