"""One report of everything: :func:`analyze` (the ``crate analyze`` command is in :mod:`crate_transformer.cli.analyze`).

:func:`analyze` runs every measurement of the toolkit on a model and writes ``report.html`` (the verdicts on the
paper's claims first, then all figures with captions naming what each measures and the paper figure it
corresponds to), ``report.json`` (every number) and ``figures/*.png`` + ``masks/*.png`` into the output folder.

The report is assembled from section functions: each measurement section (:mod:`.report_sections`) takes the
shared :class:`~.report_sections._Context` and returns a :class:`~.report_sections.Part` (figures with titles and
captions, ``report.json`` entries, verdicts); each HTML section function takes the finished report and returns
its HTML.  A new section is one more entry in :data:`~crate_transformer.analysis.report_html.HTML_SECTIONS` (or
one more call in :func:`analyze`).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor

from .._version import __version__
from ..io import make_folder
from ..models.classifier import ImageClassifier
from ._common import Normalization, finish_partial, layer_index, mark_partial
from .decoder import is_autoencoder
from .measure import METRICS
from .report_html import HTML_SECTIONS, render_html

# every `X as X` import: a name that moved to .report_sections, importable from here as before
from .report_sections import HEATMAP_SIZE as HEATMAP_SIZE
from .report_sections import INITIAL as INITIAL
from .report_sections import Figure3 as Figure3
from .report_sections import (
    Part,
    Reference,
    _attention_section,
    _Context,
    _decoder_section,
    _explorer_section,
    _layerwise_section,
    _pick_vis_images,
    _segmentation_scores_section,
    _segmentation_section,
    _subspace_section,
    _token_heatmap_section,
    default_section,
    reference_networks,
)
from .report_sections import initial_model as initial_model
from .report_sections import layer_verdicts as layer_verdicts
from .report_sections import rate_notes as rate_notes
from .report_sections import variational_figure as variational_figure
from .verdicts import UNTRAINED

__all__ = ["analyze", "Part", "HTML_SECTIONS", "Reference"]


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
    section: str | None = None,
    initial: str | None = "fresh",
    reference: Reference | None = None,
    ground_truth: object | None = None,
    truth: Tensor | None = None,
) -> dict:
    """Write the full white-box report for ``model`` into ``out``; returns the ``report.json`` dict.

    ``splits``: ``{name: images}`` measured layer-wise (e.g. ``{"train": ..., "test": ...}``), each a
    ``[0, 1]`` float tensor ``(N, C, H, W)`` or a ``data.ImageDataset``; ``normalization`` (mean, std)
    turns them into model inputs.  ``vis_images`` (``[0, 1]``) are shown in the attention / PCA /
    segmentation figures (default: the first ``num_vis`` images of the last split).  ``section`` names the
    model in the verdict table (default: "classifier", "ViT classifier" or "CRATE-MAE encoder"; the CLI passes
    "DINO backbone" for a DINO run).  ``report["verdicts"]`` says whether the paper's claims held, each against
    an untrained network of the same architecture, whatever the checkpoint's origin (``initial="fresh"``; None:
    no reference), built with ``reference.seed`` (a :class:`~.report_sections.Reference`, which also carries a
    fine-tuned run's starting checkpoint: measured like the model on the same images for every claim when its
    model is given, else its step-0 records for the layer claims, stated beside).  ``ground_truth``
    (:func:`~.segment_data.read_coco`): MaskCut's masks scored by :func:`~.segment_eval.evaluate_segmentation` into
    ``report["segmentation_scores"]``; ``truth``: instance labels ``(N, H, W)`` of the last split's images
    (:func:`~.segment_data.truth_labels`), outlined in the explorer.  Until ``report.html`` is written the folder
    holds :data:`~._common.PARTIAL_MARKER`.
    """
    attn_li, seg_li = layer_index(model, attn_layer), layer_index(model, seg_layer)
    t0 = time.perf_counter()
    ctx = _context(model, out, splits, (normalization, eps, batch_size), section, initial, reference or Reference())
    ctx.truth = truth
    report = _header(model, source, normalization, eps)
    parts = [
        _layerwise_section(ctx, progress),
        _pick_vis_images(ctx, vis_images, num_vis),
        _attention_section(ctx, attn_li),
        _segmentation_section(ctx, seg_li, n_masks, tau),
        _explorer_section(ctx, n_masks, tau),
        _subspace_section(ctx, directions),
        _token_heatmap_section(ctx),
    ]
    if is_autoencoder(model):
        parts.append(_decoder_section(ctx))
    if ground_truth is not None:
        parts.append(_segmentation_scores_section(ctx, ground_truth, seg_li, n_masks, tau))
    return _finish(report, parts, ctx.out, t0)


def _context(
    model: ImageClassifier,
    out: str | Path,
    splits: Mapping[str, object],
    protocol: tuple[Normalization | None, float, int],
    section: str | None,
    initial: str | None,
    reference: Reference,
) -> _Context:
    """The sections' shared context, after the checks: the folder made (and marked partial), the networks every
    claim is also measured on (the untrained one built with the reference's seed, a fine-tuned run's starting
    checkpoint when it loaded) and what is known of that starting checkpoint otherwise."""
    if not splits:
        raise ValueError("no images to analyse: pass at least one split of images")
    if initial not in ("fresh", None):
        raise ValueError(
            f"initial must be 'fresh' or None, got {initial!r}; pass a fine-tuned run's step-0 records as "
            "reference=Reference(start=...)"
        )
    out = make_folder(out, "report folder")  # the target first
    mark_partial(out)
    ctx = _Context(model, out, splits, *protocol, section or default_section(model))
    ctx.references, ctx.start = reference_networks(model, initial, reference), reference
    ctx.initial = next((r.model for r in ctx.references if r.kind == UNTRAINED), None)
    ctx.initial_words = reference.seed_words or f"seed {reference.seed}"
    make_folder(ctx.fig_dir, "figure folder")
    return ctx


def _header(model: ImageClassifier, source: Mapping | None, normalization: Normalization | None, eps: float) -> dict:
    return {
        "crate_transformer_version": __version__,
        "model": {"config": model.config.to_dict(), "num_params": model.num_params()},
        "source": dict(source or {}),
        "normalization": None if normalization is None else [list(map(float, s)) for s in normalization],
        "protocol": {
            "eps": eps,
            "eps_squared": eps**2,
            "metrics": METRICS,
            "layers": "numbered 1..L as in the paper (layer l = model.layers[l-1])",
            "heads": "numbered 1..K as in the paper (head k = U_k)",
            "rc": "official vis_utils CodingRate: per-head projections, each token unit-normalised, "
            f"1/2 sum_k logdet(I + p/(n eps^2) G_k) with eps^2 = {eps**2:g}; per sample, then mean/std",
        },
        "figures": {},
    }


def _finish(report: dict, parts: Sequence[Part], out: Path, t0: float) -> dict:
    """Merge the sections' parts into ``report`` and write ``report.json`` and ``report.html``."""
    figures = [f for p in parts for f in p.figures]
    for p in parts:
        report.update(p.json)
    report["verdicts"] = [v.to_dict() for p in parts for v in p.verdicts]
    report["notes"] = [n for p in parts for n in p.notes]
    report["figures"] = {f: {"title": t, "caption": cap} for f, t, cap in figures}
    report["wall_time_s"] = round(time.perf_counter() - t0, 2)
    report["environment"] = {"python": platform.python_version(), "torch": torch.__version__}
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    page = {**report, **{k: v for p in parts for k, v in p.page.items()}}
    (out / "report.html").write_text(render_html(page, HTML_SECTIONS))
    finish_partial(out)
    return report
