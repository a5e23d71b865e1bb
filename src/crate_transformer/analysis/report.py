"""One report of everything: :func:`analyze` (the ``crate analyze`` command is in :mod:`crate_transformer.cli.analyze`).

:func:`analyze` runs every measurement of the toolkit on a model and writes ``report.html`` (all
figures with captions naming what each measures and the paper figure it corresponds to),
``report.json`` (every number) and ``figures/*.png`` + ``masks/*.png`` into the output folder.
"""

from __future__ import annotations

import html
import json
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .. import __version__
from ..data import match_channels
from ..model import ImageClassifier
from ._common import (
    Normalization,
    dataset_images01,
    layer_index,
    layer_subspaces,
    model_device,
    normalize_images,
)
from .attention import attention_entropy, cls_attention
from .decoder import decoder_inversion, is_autoencoder
from .explorer import explorer_section, image_payload
from .measure import METRICS, LayerTable, measure
from .plots import (
    plot_attention,
    plot_decoder_inversion,
    plot_layerwise,
    plot_masks,
    plot_pca,
    plot_subspace_grams,
    plot_token_heatmaps,
    save_mask_png,
)
from .segmentation import maskcut, patch_features, pca_rgb
from .subspaces import incoherence, subspace_gram

__all__ = ["analyze"]


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def analyze(
    model: ImageClassifier,
    out: str | Path,
    splits: Mapping[str, Tensor | object],
    *,
    vis_images: Tensor | None = None,
    normalization: Normalization | None = None,
    eps: float = 0.1,
    batch_size: int = 64,
    attn_layer: int = -1,
    seg_layer: int = -1,
    n_masks: int = 3,
    tau: float | None = 0.15,
    num_vis: int = 4,
    directions: int | None = 4,
    progress: bool = True,
    source: Mapping | None = None,
) -> dict:
    """Write the full white-box report for ``model`` into ``out``; returns the ``report.json`` dict.

    ``splits``: ``{name: images}`` measured layer-wise (e.g. ``{"train": ..., "test": ...}``), each a
    ``[0, 1]`` float tensor ``(N, C, H, W)`` or a ``data.ImageDataset``; ``normalization`` (mean, std)
    turns them into model inputs.  ``vis_images`` (``[0, 1]``) are shown in the attention / PCA /
    segmentation figures (default: the first ``num_vis`` images of the last split).
    """
    if not splits:
        raise ValueError("no images to analyse: pass at least one split of images")
    attn_li, seg_li = layer_index(model, attn_layer), layer_index(model, seg_layer)
    out = Path(out)
    fig_dir, mask_dir = out / "figures", out / "masks"
    fig_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    L, c = len(model.layers), model.config
    report: dict = {
        "crate_transformer_version": __version__,
        "model": {"config": c.to_dict(), "num_params": model.num_params()},
        "source": dict(source or {}),
        "normalization": None if normalization is None else [list(map(float, s)) for s in normalization],
        "protocol": {
            "eps": eps,
            "eps_squared": eps**2,
            "metrics": METRICS,
            "layers": "numbered 1..L as in the paper (layer l = model.layers[l-1])",
            "rc": "official vis_utils CodingRate: per-head projections, each token unit-normalised, "
            f"1/2 sum_k logdet(I + p/(n eps^2) G_k) with eps^2 = {eps**2:g}; per sample, then mean/std",
        },
        "figures": {},
    }
    figures: list[tuple[str, str, str]] = []  # (file, title, caption)

    # ---------------------------------------------------------------- 1. layer-wise measurement
    tables: dict[str, LayerTable] = {}
    for name, imgs in splits.items():
        tables[name] = measure(
            model, imgs, eps=eps, batch_size=batch_size, normalize=normalization, progress=progress, desc=name
        )
    report["measure"] = {k: t.to_dict(per_sample=True) for k, t in tables.items()}
    split_names = " vs ".join(tables)
    plot_layerwise(tables, fig_dir / "layerwise.png", metrics=("rc_in", "nonzero"))
    figures.append(
        (
            "layerwise.png",
            "Compression and sparsity versus layer (JMLR Fig. 14; Fig. 21, Fig. 26 for ViT)",
            f"Left: the compression term R^c of each layer's MSSA input against that layer's learned subspaces "
            f"U^l (official protocol: per-head projections, unit-normalised tokens, eps^2 = {eps**2:g}); lower = "
            f"more compressed. Right: the fraction of non-zero entries of the ISTA output Z^(l+1); lower = sparser. "
            f"Mean over {', '.join(f'{t.num_samples} {k}' for k, t in tables.items())} images ({split_names}), "
            "band = 1 std. A trained CRATE should decrease in both with depth.",
        )
    )
    plot_layerwise(
        tables,
        fig_dir / "layerwise_all.png",
        metrics=("rc_in", "rc_half", "rc_out"),
        title="R^c at the MSSA input, the MSSA output and the layer output",
    )
    figures.append(
        (
            "layerwise_all.png",
            "R^c at three points of each layer (JMLR Figs. 14-15; the official vis_utils hook the MSSA input)",
            "The paper's text measures R^c on the MSSA output Z^(l+1/2) while the official code measures the MSSA "
            "input; both are shown, plus the layer output Z^(l+1), each against the same layer's U^l and protocol.",
        )
    )
    plot_layerwise(
        tables,
        fig_dir / "layerwise_rate.png",
        metrics=("l1", "rate", "rate_reduction"),
        title="l1 norm, coding rate and rate reduction of the layer outputs",
    )
    figures.append(
        (
            "layerwise_rate.png",
            "Sparse rate reduction terms per layer (eqs. (8), (14), (17))",
            "Mean |entry| of the ISTA output (the l1 term of eq. (17)); the coding rate R(Z^(l+1)) of eq. (8) and the "
            "rate reduction R - R^c(Z^(l+1)|U^l) of eq. (14), both on unit-normalised tokens with the same eps.",
        )
    )

    # ---------------------------------------------------------------- images for the visual figures
    if vis_images is None:
        last = list(splits.values())[-1]
        n_last = last.shape[0] if isinstance(last, Tensor) else len(last)
        idx = np.unique(np.linspace(0, n_last - 1, min(num_vis, n_last)).round().astype(int)).tolist()
        if isinstance(last, Tensor):
            vis_images = last[idx]
        else:  # a dataset: grey/RGB converted to the model's channels, as measure() does
            vis_images = match_channels(dataset_images01(last, idx), c.in_chans)
    vis_images = vis_images[:num_vis].float()
    x = normalize_images(vis_images, normalization).to(model_device(model))
    p = c.patch_size
    grid = (x.shape[-2] // p, x.shape[-1] // p)
    report["visual"] = {"num_images": int(x.shape[0]), "image_size": list(x.shape[-2:]), "grid": list(grid)}

    # ---------------------------------------------------------------- 2. attention maps
    maps = cls_attention(model, x, attn_li)
    plot_attention(
        vis_images,
        maps,
        fig_dir / "attention.png",
        title=f"Class-token attention per head, layer {attn_li + 1} of {L}",
    )
    ent = attention_entropy(maps)
    report["attention"] = {
        "layer": attn_li + 1,
        "entropy_per_head": ent.mean(0).tolist(),
        "entropy_uniform": float(np.log(grid[0] * grid[1])),
        "maps": maps.tolist(),
    }
    figures.append(
        (
            "attention.png",
            f"Class-token attention maps, layer {attn_li + 1} of {L} (JMLR Figs. 18, 20, 27; eq. (437))",
            "For each head k: the softmax of <U_k^T z_i, U_k^T z_cls> over the patches i (eq. (437); ViT: eq. (438)), "
            "taken from the model's own attention (with its p^-1/2 scale, class-token column dropped, renormalised), "
            "upsampled and overlaid on the input; 'mean' averages the heads. The paper shows the penultimate layer "
            "for CRATE (--attn-layer -2).",
        )
    )

    # ---------------------------------------------------------------- 3. PCA + MaskCut
    feats = patch_features(model, x, seg_li)
    rgb, ratio = pca_rgb(feats, grid)
    plot_pca(vis_images, rgb, fig_dir / "pca.png", title=f"PCA of layer-{seg_li + 1} patch features (RGB = PC1-3)")
    figures.append(
        (
            "pca.png",
            f"PCA of patch features, layer {seg_li + 1} (JMLR §4.3, Fig. 19 style; official pca_visualization.py)",
            "The qkv projections [U_1^T; ...; U_K^T] LN(Z^l) of every patch of these images, jointly projected onto "
            "their first three principal components and shown as RGB (each component min-max scaled per image). "
            "Patches of the same part get the same colour when the features are semantic.",
        )
    )
    masks = [maskcut(f, grid, n_masks, tau) for f in feats]
    plot_masks(vis_images, masks, fig_dir / "maskcut.png", title=f"MaskCut on layer-{seg_li + 1} features")
    mask_files = []
    for i, m in enumerate(masks):
        f = save_mask_png(m, tuple(vis_images.shape[-2:]), mask_dir / f"image_{i:03d}.png")
        mask_files.append(str(f.relative_to(out)))
    report["segmentation"] = {
        "layer": seg_li + 1,
        "tau": tau,
        "n_masks": n_masks,
        "pca_explained_variance_ratio": ratio.tolist(),
        "masks": [
            {"image": i, "file": mask_files[i], "areas": [float(mm.mean()) for mm in m], "patch_masks": m.tolist()}
            for i, m in enumerate(masks)
        ],
    }
    figures.append(
        (
            "maskcut.png",
            f"Unsupervised segmentation by MaskCut, layer {seg_li + 1} (JMLR Fig. 19, Alg. 1)",
            f"Normalized cuts of the patch affinity (cosine similarity of the qkv features, binarised at tau = {tau}), "
            f"iterated up to {n_masks} times; each round removes the patches already segmented (MaskCut's intent; "
            "JMLR Alg. 1 as printed keeps them) and keeps the connected component of the eigenvector's peak. "
            "No CRF. Label PNGs (0 = background, s = mask s) are in masks/.",
        )
    )

    # ---------------------------------------------------------------- 4. subspace incoherence
    p_head = layer_subspaces(model.layers[0]).shape[-1]
    directions = None if directions is None else min(directions, p_head)
    grams = [subspace_gram(model, li, directions=directions) for li in range(L)]
    kblock = directions or p_head
    plot_subspace_grams(grams, fig_dir / "subspaces.png", block=kblock)
    report["subspaces"] = incoherence(model)
    dir_text = f"{directions} random" if directions else "all"
    figures.append(
        (
            "subspaces.png",
            "Subspace incoherence per layer (JMLR Fig. 17, pp.49-50)",
            f"|[U_1 ... U_K]^T [U_1 ... U_K]| with unit-norm columns ({dir_text} directions per head; "
            "white lines separate heads). The signal model (eqs. (10)-(11)) has orthogonal "
            "subspaces: off-diagonal blocks near 0. report.json gives the block coherence ||Q_i^T Q_j||_F/sqrt(p) per "
            "head pair against the random-subspace baseline sqrt(p/d).",
        )
    )

    # ---------------------------------------------------------------- 5. token heatmaps
    with torch.no_grad():
        was = model.training
        model.eval()
        trace = model.forward_trace(x[:1])
        model.train(was)
    plot_token_heatmaps([t[0].cpu() for t in trace.tokens[1:]], fig_dir / "token_heatmaps.png")
    figures.append(
        (
            "token_heatmaps.png",
            "ISTA outputs per layer (JMLR Fig. 16, p.49)",
            "|Z^(l+1)| of the first image, the same random 50 tokens x 50 features at every layer (colour 0-2). "
            "Deeper CRATE layers should look sparser and more structured.",
        )
    )

    # ---------------------------------------------------------------- 6. CRATE-MAE: decoder vs encoder
    if is_autoencoder(model):
        name, imgs = next(reversed(list(splits.items())))
        xs = imgs if isinstance(imgs, Tensor) else dataset_images01(imgs, range(min(len(imgs), batch_size)))
        xs = normalize_images(match_channels(xs[:batch_size].float(), c.in_chans), normalization)
        rows = decoder_inversion(model, xs.to(model_device(model)))
        report["decoder_inversion"] = {"images": f"{xs.shape[0]} {name} images (unmasked)", "layers": rows}
        plot_decoder_inversion(rows, fig_dir / "decoder_inversion.png")
        figures.append(
            (
                "decoder_inversion.png",
                "Decoder layers as structured inverses of the encoder layers (JMLR §3.5, eqs. (62)-(64), Remark 7)",
                "Decoder layer L-1-l is derived to undo encoder layer l (E undoes ISTA, the subtracted MSSA undoes "
                "compression). Mean token cosine similarity to the encoder's Z^l of: the decoder's chained "
                "reconstruction from the encoder output (circles); one decoder layer applied to the true Z^(l+1) "
                "(squares); and the do-nothing baseline Z^(l+1) (crosses). Squares above crosses = that decoder layer "
                "maps back toward the encoder layer's input in the encoder's own coordinates. Since nothing ties the "
                "decoder's basis to the encoder's, report.json also gives r2_chain / r2_identity: the held-out R^2 "
                "of a linear map from the decoder's reconstruction (resp. Z^(l+1)) to Z^l. "
                f"{xs.shape[0]} unmasked {name} images.",
            )
        )

    # ---------------------------------------------------------------- 7. the interactive explorer (report.html only)
    explorer = image_payload(model, vis_images, normalization, n_masks=n_masks, tau=tau)
    report["explorer"] = {"layers": explorer["layers"], "images": len(explorer["images"])}

    report["figures"] = {f: {"title": t, "caption": cap} for f, t, cap in figures}
    report["wall_time_s"] = round(time.perf_counter() - t0, 2)
    report["environment"] = {"python": platform.python_version(), "torch": torch.__version__}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "report.html").write_text(_html(report, tables, figures, explorer_section(explorer)))
    return report


# --------------------------------------------------------------------------- HTML
def _table_html(t: LayerTable, metrics: Sequence[str]) -> str:
    head = "".join(f"<th title='{html.escape(METRICS.get(m, m))}'>{m}</th>" for m in metrics)
    rows = []
    means, stds = {m: t.mean(m) for m in metrics}, {m: t.std(m) for m in metrics}
    for j in range(t.num_layers):
        cells = "".join(f"<td>{_fmt(means[m][j])} <small>± {stds[m][j]:.2g}</small></td>" for m in metrics)
        rows.append(f"<tr><td>{j + 1}</td>{cells}</tr>")
    return f"<table><tr><th>layer</th>{head}</tr>{''.join(rows)}</table>"


def _html(
    report: dict, tables: Mapping[str, LayerTable], figures: Sequence[tuple[str, str, str]], explorer: str = ""
) -> str:
    c = report["model"]["config"]
    src = report["source"]
    esc = html.escape
    info = [
        ("checkpoint", src.get("checkpoint", "-")),
        ("data", src.get("data", "-")),
        (
            "model",
            f"{c['arch']} dim={c['dim']} depth={c['depth']} heads={c['heads']} patch={c['patch_size']} "
            f"image={c['image_size']} ({report['model']['num_params']:,} parameters)",
        ),
        ("normalisation", str(report["normalization"])),
        (
            "eps",
            f"{report['protocol']['eps']} (eps^2 = {report['protocol']['eps_squared']:g}; "
            "the official vis_utils uses eps^2 = 0.01)",
        ),
        ("wall time", f"{report['wall_time_s']} s"),
    ]
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>CRATE white-box report</title><style>"
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;font-size:13px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;"
        "text-align:right}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}"
        "figcaption{font-size:14px;color:#444}h3{margin-bottom:.2em}</style></head><body>",
        "<h1>CRATE white-box report</h1>",
        "<table>"
        + "".join(f"<tr><th>{esc(k)}</th><td style='text-align:left'>{esc(str(v))}</td></tr>" for k, v in info)
        + "</table>",
        "<p>Every number below is also in <a href='report.json'>report.json</a>. Layers are numbered 1..L as in the "
        "paper (JMLR, Yu et al. 2024). Hover a column name for its definition.</p>",
        "<h2>Layer-wise measurements</h2>",
    ]
    metrics = [m for m in ("rc_in", "rc_half", "rc_out", "nonzero", "l1", "rate", "rate_reduction")]
    for name, t in tables.items():
        parts.append(f"<h3>{esc(name)} ({t.num_samples} images)</h3>{_table_html(t, metrics)}")
    parts.append(explorer)
    parts.append("<h2>Figures</h2>")
    for f, title, cap in figures:
        parts.append(
            f"<figure><h3>{esc(title)}</h3><a href='figures/{f}'><img src='figures/{f}' alt='{esc(title)}'></a>"
            f"<figcaption>{esc(cap)}</figcaption></figure>"
        )
    sub = report["subspaces"]
    parts.append(
        "<h2>Subspace coherence per layer</h2><table><tr><th>layer</th><th>mean cross-head coherence</th>"
        "<th>max principal cosine</th><th>random baseline sqrt(p/d)</th></tr>"
        + "".join(
            f"<tr><td>{s['layer']}</td><td>{_fmt(s['mean_cross_coherence'])}</td><td>{_fmt(s['max_principal_cos'])}"
            f"</td><td>{_fmt(s['random_baseline'])}</td></tr>"
            for s in sub
        )
        + "</table>"
    )
    att = report["attention"]
    parts.append(
        f"<h2>Attention entropy, layer {att['layer']}</h2><p>Per head (nats; uniform = "
        f"{_fmt(att['entropy_uniform'])}): " + ", ".join(_fmt(e) for e in att["entropy_per_head"]) + "</p>"
    )
    parts.append("</body></html>\n")
    return "\n".join(parts)
