"""The measurement sections of the white-box report (:func:`~crate_transformer.analysis.report.analyze`).

Each section takes the shared :class:`_Context` (the model, the output folder, the measured splits and the shown
images) and returns a :class:`Part`: its figures with titles and captions, its ``report.json`` entries, its
verdicts and notes.  :mod:`.report` calls them in order and writes the files; :mod:`.report_html` renders the page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from ..data import match_channels
from ..layers.inference import evaluating
from ..models.classifier import ImageClassifier
from ._common import (
    Normalization,
    dataset_images01,
    layer_subspaces,
    model_device,
    normalize_images,
)
from .attention import attention_entropy, cls_attention
from .decoder import decoder_inversion, is_autoencoder
from .explorer import image_payload
from .measure import VARIATIONAL, LayerTable, measure
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
from .verdicts import (
    START,
    UNTRAINED,
    Baseline,
    Verdict,
    baseline_from_cka,
    baseline_from_records,
    baseline_from_table,
    decoder_verdict,
    incoherence_verdict,
    layer_claims,
    rate_reduction_note,
)

Figure3 = tuple[str, str, str]  # (file, title, caption)
T = TypeVar("T")


@dataclass
class Part:
    """What one report section produced: figures ``(file, title, caption)``, ``report.json`` entries, verdicts,
    notes, and ``page`` data that only ``report.html`` shows (the explorer's)."""

    figures: list[Figure3] = field(default_factory=list)
    json: dict = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    page: dict = field(default_factory=dict)  # what only report.html uses (not written to report.json)


@dataclass(frozen=True)
class Reference:
    """What the verdicts compare with besides the rule's noise: the seed of the untrained network of the same
    architecture (``seed_words``: whose seed it is, e.g. "seed 3, the run's seed"), and a fine-tuned run's starting
    checkpoint (``start_path``: config.yaml's ``init_from``), stated beside the verdicts: the model when its file
    still loads (``start_model``, measured on the same samples as the model), else the run's step-0 measurement
    records (``start``, as :func:`~.measure.load_measure_records` reads them); ``start_missing`` says why the
    file did not load, ``start_by`` what turned it into the model ("fine-tuning", "continued pre-training")."""

    seed: int = 0
    seed_words: str | None = None
    start: Sequence[Mapping] | None = None
    start_model: torch.nn.Module | None = None
    start_path: str | None = None
    start_missing: str | None = None
    start_by: str = "fine-tuning"


@dataclass(frozen=True)
class RefNet:
    """A network every claim is measured on exactly as the model (same samples, same function, same noise): the
    untrained network of the same architecture (``kind`` :data:`~.verdicts.UNTRAINED`, the verdicts' reference) or
    a fine-tuned run's starting checkpoint (:data:`~.verdicts.START`, reported beside).  ``name``: it in words;
    ``curve``: the label of its curves after the split's name; ``by``: what turned it into the model."""

    kind: str
    model: torch.nn.Module
    name: str
    curve: str
    by: str = "training"

    def on(self, n: int, samples: str = "images") -> str:
        """How a verdict names it, with what it was measured on."""
        if self.kind == UNTRAINED:
            return f"{self.name} on the same {samples}"
        return f"{self.name}, measured on the same {n} {samples}"


@dataclass
class _Context:
    """Everything the sections share: the model, where figures go, the measured splits and the shown images."""

    model: ImageClassifier
    out: Path
    splits: Mapping[str, object]
    normalization: Normalization | None
    eps: float
    batch_size: int
    section: str
    initial: ImageClassifier | None = None  # an untrained network of the same architecture: the reference
    initial_words: str = "seed 0"  # how it was built (its seed), as the verdicts name it
    references: list[RefNet] = field(default_factory=list)  # what every claim is also measured on
    start: Reference = field(default_factory=Reference)  # a fine-tuned run's starting checkpoint, as given
    truth: Tensor | None = None  # ground-truth labels (N, H, W) of the last split's images, for the explorer
    vis_truth: Tensor | None = None  # those of the shown images
    tables: dict[str, LayerTable] = field(default_factory=dict)
    vis_images: Tensor | None = None
    x: Tensor | None = None
    grid: tuple[int, int] = (0, 0)

    @property
    def fig_dir(self) -> Path:
        return self.out / "figures"

    @property
    def depth(self) -> int:
        return len(self.model.layers)


def default_section(model: ImageClassifier) -> str:
    """The name of the verdict section of an image model: its encoder for a CRATE-MAE, else the classifier."""
    if is_autoencoder(model):
        return "CRATE-MAE encoder"
    return "classifier" if model.config.white_box else "ViT classifier"


def layer_verdicts(
    tables: Mapping[str, LayerTable],
    section: str,
    baselines: Mapping[str, Baseline] | None = None,
    start: Mapping[str, Baseline] | None = None,
) -> list[Verdict]:
    """Compression and sparsity verdicts (JMLR Figs. 14-15) for every measured split, each against that split's
    :class:`~.verdicts.Baseline` (an untrained network of the same architecture) when given, and with the move
    from that split's ``start`` (a fine-tuned run's starting checkpoint) stated beside."""
    multi, baselines, start = len(tables) > 1, baselines or {}, start or {}
    out = []
    for name, t in tables.items():
        out += layer_claims(t, f"{section} ({name})" if multi else section, baselines.get(name), start.get(name))
    return out


def initial_model(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """An untrained network of the same architecture (built from ``model.config`` with ``seed``; the global RNG is
    left as it was), in eval mode on the model's device: the reference of every verdict."""
    from ..models.registry import build

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = build(model.config)
    return fresh.to(model_device(model)).eval()


INITIAL = "untrained"  # the curves of the untrained network: "test untrained"
START_NAME = "starting checkpoint"  # those of a fine-tuned run's starting checkpoint: "test starting checkpoint"
START_CURVE = "starting checkpoint (the run's step-0 records)"  # its curve when only its records are left


def untrained_words(seed_words: str, samples: str = "images") -> str:
    """How the verdicts name their reference: ``an untrained network of the same architecture (seed 0, the run's
    seed) on the same images``."""
    return f"an untrained network of the same architecture ({seed_words}) on the same {samples}"


def reference_networks(model: torch.nn.Module, initial: str | None, reference: Reference) -> list[RefNet]:
    """The networks every claim is also measured on: an untrained network of the same architecture built with
    ``reference.seed`` (unless ``initial`` is None), then a fine-tuned run's starting checkpoint when it loaded."""
    out = []
    if initial is not None:
        seed_words = reference.seed_words or f"seed {reference.seed}"
        name = f"an untrained network of the same architecture ({seed_words})"
        out.append(RefNet(UNTRAINED, initial_model(model, reference.seed), name, INITIAL))
    if reference.start_model is not None:
        name = f"the starting checkpoint ({reference.start_path or 'init_from'})"
        start = reference.start_model.to(model_device(model)).eval()
        out.append(RefNet(START, start, name, START_NAME, reference.start_by))
    return out


def _on_references(ctx: _Context, measure_one: Callable[[torch.nn.Module], T]) -> dict[str, tuple[RefNet, T]]:
    """``{kind: (reference, measure_one(its model))}`` for every reference network: the one path by which each
    claim measures the untrained network and the starting checkpoint as it measures the model."""
    return {ref.kind: (ref, measure_one(ref.model)) for ref in ctx.references}


def _initial_measurements(ctx: _Context, progress: bool) -> tuple[dict[str, dict[str, Baseline]], dict[str, object]]:
    """Per kind of reference and split, the reference's :class:`~.verdicts.Baseline` on the same images (the
    untrained network; the starting checkpoint, or when its file is gone its step-0 records for every split), and
    what the figures draw for them."""
    baselines: dict[str, dict[str, Baseline]] = {}
    curves: dict[str, object] = {}
    for name, imgs in ctx.splits.items():
        one = partial(_measure_split, ctx, imgs=imgs, desc=f"{name} (references)", progress=progress)
        for kind, (ref, t) in _on_references(ctx, one).items():
            words = ref.on(t.num_samples)
            baselines.setdefault(kind, {})[name] = baseline_from_table(t, words, start=kind == START, by=ref.by)
            curves[f"{name} {ref.curve}"] = t
    records = ctx.start.start
    if START not in baselines and records:
        words = f"the starting checkpoint ({ctx.start.start_path}), from the run's step-0 records"
        words += f" ({records[0].get('n_samples', '?')} of its training images, not the images measured here)"
        b = baseline_from_records(records, words, start=True, by=ctx.start.start_by)
        baselines[START] = dict.fromkeys(ctx.splits, b)
        curves[START_CURVE] = list(records)
    return baselines, curves


def start_note(reference: Reference) -> list[str]:
    """One line when a fine-tuned run's starting checkpoint did not load: why (the path in ``init_from``), and
    whether the run's step-0 records stand in for the layer claims."""
    if reference.start_model is not None or not reference.start_path:
        return []
    why = f"{reference.start_path} (config.yaml's init_from) does not load: {reference.start_missing or 'unknown'}"
    if reference.start:
        return [f"starting checkpoint: {why}; compression and sparsity state their move from the run's step-0 "
                "records (other images); incoherence and a decoder are not compared with it"]  # fmt: skip
    return [f"starting checkpoint unavailable: {why}, and the run logged no step-0 records (measure_every 0), "
            "so no claim states its move from it"]  # fmt: skip


def _measure_split(ctx: _Context, model: torch.nn.Module, imgs: Tensor, desc: str, progress: bool) -> LayerTable:
    """One split's layer-by-layer measurement under the report's protocol (ε, batch size, normalisation)."""
    return measure(
        model, imgs, eps=ctx.eps, batch_size=ctx.batch_size, normalize=ctx.normalization, progress=progress, desc=desc
    )


def rate_notes(model: torch.nn.Module, tables: Mapping[str, LayerTable]) -> list[str]:
    """Why ΔR (eq. (14)) is negative: one note naming every split where it is (the reason is the same)."""
    U = layer_subspaces(model.layers[0])
    K, d, p = U.shape
    note = rate_reduction_note(tables if len(tables) > 1 else next(iter(tables.values())), d, K, p)
    return [note] if note else []


# --------------------------------------------------------------------------- measurement sections
def _layerwise_section(ctx: _Context, progress: bool) -> Part:
    for name, imgs in ctx.splits.items():
        ctx.tables[name] = _measure_split(ctx, ctx.model, imgs, name, progress)
    tables, fig_dir = ctx.tables, ctx.fig_dir
    baselines, curves = _initial_measurements(ctx, progress)
    _plot_layerwise_figures(tables, fig_dir, curves)
    against = (
        f" Dashed: the reference of the verdicts, an untrained network of the same architecture "
        f"({ctx.initial_words}) on the same images."
        if UNTRAINED in baselines
        else ""
    )
    start = next(iter(baselines.get(START, {}).values()), None)
    if start is not None:
        labels = [START_CURVE] if START_CURVE in curves else [f"{k} {START_NAME}" for k in tables]
        against += f" Dashed and labelled {', '.join(map(repr, labels))}: {start.source}, reported beside the verdicts."
    figures = _layerwise_captions(tables, ctx.eps, against)
    figures += variational_figure(tables, curves, fig_dir, against)
    json = {"measure": {k: t.to_dict(per_sample=True) for k, t in tables.items()}}
    json["initialisation"] = {f"{k} {INITIAL}": b for k, b in _curve_records(curves, INITIAL, tables).items()}
    if start is not None:
        json["starting_checkpoint"] = _start_json(ctx, curves, baselines[START])
    verdicts = layer_verdicts(tables, ctx.section, baselines.get(UNTRAINED), baselines.get(START))
    return Part(figures, json, verdicts, rate_notes(ctx.model, tables) + start_note(ctx.start))


def _curve_records(curves: Mapping[str, object], label: str, tables: Mapping[str, LayerTable]) -> dict[str, list]:
    """``{split: per-layer records}`` of the measured curves of one reference network (``label``: its curves')."""
    return {k: curves[f"{k} {label}"].to_records() for k in tables if f"{k} {label}" in curves}


def _start_json(ctx: _Context, curves: Mapping[str, object], start: Mapping[str, Baseline]) -> dict:
    """``report.json["starting_checkpoint"]``: where it comes from, how it was measured and its per-layer numbers
    (per split when measured here; the step-0 records otherwise)."""
    out = {"path": ctx.start.start_path, "source": {k: b.source for k, b in start.items()}}
    if START_CURVE in curves:
        return {**out, "measured_on": "the run's step-0 records", "layers": list(curves[START_CURVE])}
    return {**out, "measured_on": "the same images", "measure": _curve_records(curves, START_NAME, ctx.tables)}


# the report's layer-wise figures: file, metrics, title (None: plot_layerwise's own)
LAYERWISE_FIGURES = (
    ("layerwise.png", ("rc_in", "nonzero"), None),
    (
        "layerwise_all.png",
        ("rc_in", "rc_half", "rc_out"),
        "R^c at the MSSA input, the MSSA output and the layer output",
    ),
    (
        "layerwise_rate.png",
        ("l1", "rate", "rate_reduction"),
        "l1 norm, coding rate and rate reduction of the layer outputs",
    ),
)


def _plot_layerwise_figures(tables: dict[str, LayerTable], fig_dir: Path, initial: dict[str, object]) -> None:
    for name, metrics, title in LAYERWISE_FIGURES:
        plot_layerwise(tables, fig_dir / name, metrics=metrics, title=title, references=initial)


def _layerwise_captions(tables: dict[str, LayerTable], eps: float, against: str) -> list[tuple[str, str, str]]:
    split_names = " vs ".join(tables)
    return [
        (
            "layerwise.png",
            "Compression and sparsity versus layer (JMLR Fig. 14; Fig. 21, Fig. 26 for ViT)",
            f"Left: the compression term R^c of each layer's MSSA input against that layer's learned subspaces "
            f"U^l (official protocol: per-head projections, unit-normalised tokens, eps^2 = {eps**2:g}); lower = "
            f"more compressed. Right: the fraction of non-zero entries of the ISTA output Z^(l+1); lower = sparser. "
            f"Mean over {', '.join(f'{t.num_samples} {k}' for k, t in tables.items())} images ({split_names}), "
            f"band = 1 std. A trained CRATE should decrease in both with depth.{against}",
        ),
        (
            "layerwise_all.png",
            "R^c at three points of each layer (JMLR Figs. 14-15; the official vis_utils hook the MSSA input)",
            "The paper's text measures R^c on the MSSA output Z^(l+1/2) while the official code measures the MSSA "
            "input; both are shown, plus the layer output Z^(l+1), each against the same layer's U^l and protocol."
            + against,
        ),
        (
            "layerwise_rate.png",
            "Sparse rate reduction terms per layer (eqs. (8), (14), (17))",
            "Mean |entry| of the ISTA output (the l1 term of eq. (17)); the coding rate R(Z^(l+1)) of eq. (8) and the "
            "rate reduction R - R^c(Z^(l+1)|U^l) of eq. (14), both on unit-normalised tokens with the same eps."
            + against,
        ),
    ]


def variational_figure(
    tables: Mapping[str, LayerTable], initial: Mapping[str, object], fig_dir: Path, against: str = ""
) -> list[Figure3]:
    """ToST's measurement (``rvar_*``, where the layers' attention has memberships): the variational compression
    term at the TSSA input, after TSSA and at the layer output, per layer; no figure for other models."""
    if not all("rvar_in" in t.values for t in tables.values()):
        return []
    refs = {k: v for k, v in initial.items() if isinstance(v, LayerTable) or (v and "rvar_in" in v[0])}
    plot_layerwise(
        tables,
        fig_dir / "layerwise_variational.png",
        metrics=VARIATIONAL,
        references=refs,
        title="Variational compression term R^c_var at the TSSA input, after TSSA and at the layer output",
    )
    caption = (
        "The variational compression term that ToST's attention descends (Wu et al., ICLR 2025; "
        "objectives.variational_coding_rate) of each layer's input Z^l, of Z^(l+1/2) after its TSSA step and of its "
        "output Z^(l+1), each through that layer's LayerNorm, projection (bias included) and memberships Pi, with "
        "the report's eps. A TSSA step should lower it (middle below left), and a trained ToST should lower it with "
        "depth." + against
    )
    return [("layerwise_variational.png", "Variational compression per layer (ToST)", caption)]


def _pick_vis_images(ctx: _Context, vis_images: Tensor | None, num_vis: int) -> Part:
    """The images of the visual figures (default: ``num_vis`` evenly spaced images of the last split)."""
    if vis_images is None:
        last = list(ctx.splits.values())[-1]
        n_last = last.shape[0] if isinstance(last, Tensor) else len(last)
        idx = np.unique(np.linspace(0, n_last - 1, min(num_vis, n_last)).round().astype(int)).tolist()
        if ctx.truth is not None:
            ctx.vis_truth = ctx.truth[idx][:num_vis]
        if isinstance(last, Tensor):
            vis_images = last[idx]
        else:  # a dataset: grey/RGB converted to the model's channels, as measure() does
            vis_images = match_channels(dataset_images01(last, idx), ctx.model.config.in_chans)
    ctx.vis_images = vis_images[:num_vis].float()
    ctx.x = normalize_images(ctx.vis_images, ctx.normalization).to(model_device(ctx.model))
    p = ctx.model.config.patch_size
    ctx.grid = (ctx.x.shape[-2] // p, ctx.x.shape[-1] // p)
    return Part(
        json={
            "visual": {"num_images": int(ctx.x.shape[0]), "image_size": list(ctx.x.shape[-2:]), "grid": list(ctx.grid)}
        }
    )


def _attention_section(ctx: _Context, attn_li: int) -> Part:
    maps = cls_attention(ctx.model, ctx.x, attn_li)
    L = ctx.depth
    plot_attention(
        ctx.vis_images,
        maps,
        ctx.fig_dir / "attention.png",
        title=f"{'Class-token attention' if ctx.model.trace_prefix_tokens else 'Memberships'} per head, layer "
        f"{attn_li + 1} of {L}",
    )
    ent = attention_entropy(maps)
    fig = ("attention.png", *_attention_words(ctx.model.trace_prefix_tokens, attn_li + 1, L))
    return Part(
        [fig],
        {
            "attention": {
                "layer": attn_li + 1,
                "entropy_per_head": ent.mean(0).tolist(),
                "entropy_uniform": float(np.log(ctx.grid[0] * ctx.grid[1])),
                "maps": maps.tolist(),
            }
        },
    )


def _attention_words(prefix: int, layer: int, depth: int) -> tuple[str, str]:
    """Title and caption of the attention figure: the class token's row, or (layers without a class token, ToST)
    the mean row, which for TSSA is each head's memberships Π."""
    if not prefix:
        return (
            f"Attention maps (memberships), layer {layer} of {depth} (ToST, Wu et al. 2025)",
            "The layers hold no class token: for each head k = 1..K, the mean over the tokens of their attention "
            "rows over the patches; for TSSA every row is the same, Pi_ik / sum_i Pi_ik, the head's memberships Pi "
            "(eq. (10) of the ToST paper) normalised over the patches. Upsampled and overlaid on the input; 'mean' "
            "averages the heads.",
        )
    return (
        f"Class-token attention maps, layer {layer} of {depth} (JMLR Figs. 18, 20, 27; eq. (437))",
        "For each head k = 1..K: the softmax of <U_k^T z_i, U_k^T z_cls> over the patches i (eq. (437); ViT: eq. "
        "(438)), taken from the model's own attention (with its p^-1/2 scale, class-token column dropped, "
        "renormalised), upsampled and overlaid on the input; 'mean' averages the heads. The paper shows the "
        "penultimate layer for CRATE (attn_layer=-2).",
    )


def _segmentation_section(ctx: _Context, seg_li: int, n_masks: int, tau: float | None) -> Part:
    vis, grid, fig_dir = ctx.vis_images, ctx.grid, ctx.fig_dir
    feats = patch_features(ctx.model, ctx.x, seg_li)
    rgb, ratio = pca_rgb(feats, grid)
    plot_pca(vis, rgb, fig_dir / "pca.png", title=f"PCA of layer-{seg_li + 1} patch features (RGB = PC1-3)")
    masks = [maskcut(f, grid, n_masks, tau) for f in feats]
    plot_masks(vis, masks, fig_dir / "maskcut.png", title=f"MaskCut on layer-{seg_li + 1} features")
    files = [
        str(save_mask_png(m, tuple(vis.shape[-2:]), ctx.out / "masks" / f"image_{i:03d}.png").relative_to(ctx.out))
        for i, m in enumerate(masks)
    ]
    figures = [
        (
            "pca.png",
            f"PCA of patch features, layer {seg_li + 1} (JMLR §4.3, Fig. 19 style; official pca_visualization.py)",
            "The qkv projections [U_1^T; ...; U_K^T] LN(Z^l) of every patch of these images, jointly projected onto "
            "their first three principal components and shown as RGB (each component min-max scaled per image). "
            "Patches of the same part get the same colour when the features are semantic.",
        ),
        (
            "maskcut.png",
            f"Unsupervised segmentation by MaskCut, layer {seg_li + 1} (JMLR Fig. 19, Alg. 1)",
            f"Normalized cuts of the patch affinity (cosine similarity of the qkv features, binarised at tau = {tau}), "
            f"iterated up to {n_masks} times; each round removes the patches already segmented (MaskCut's intent; "
            "JMLR Alg. 1 as printed keeps them) and keeps the connected component of the eigenvector's peak. "
            "No CRF. Label PNGs (0 = background, s = mask s) are in masks/.",
        ),
    ]
    seg = {
        "layer": seg_li + 1,
        "tau": tau,
        "n_masks": n_masks,
        "pca_explained_variance_ratio": ratio.tolist(),
        "masks": [
            {"image": i, "file": files[i], "areas": [float(mm.mean()) for mm in m], "patch_masks": m.tolist()}
            for i, m in enumerate(masks)
        ],
    }
    return Part(figures, {"segmentation": seg})


def _explorer_section(ctx: _Context, n_masks: int, tau: float | None) -> Part:
    """The interactive explorer of the shown images (:mod:`.explorer`): every layer's attention per head, PCA
    colours and MaskCut masks (with the ground truth's outline when the report has annotations); its data goes into
    report.html only, report.json lists the layers it holds."""
    payload = image_payload(ctx.model, ctx.vis_images, ctx.normalization, n_masks=n_masks, tau=tau, truth=ctx.vis_truth)
    summary = {"layers": payload["layers"], "images": len(payload["images"])}
    if "truth" in payload:
        summary["ground_truth"] = True
    return Part(json={"explorer": summary}, page={"explorer_payload": payload})


def _subspace_section(ctx: _Context, directions: int | None) -> Part:
    model = ctx.model
    p_head = layer_subspaces(model.layers[0]).shape[-1]
    directions = None if directions is None else min(directions, p_head)
    grams = [subspace_gram(model, li, directions=directions) for li in range(ctx.depth)]
    plot_subspace_grams(grams, ctx.fig_dir / "subspaces.png", block=directions or p_head)
    dir_text = f"{directions} random" if directions else "all"
    fig = (
        "subspaces.png",
        "Subspace incoherence per layer (JMLR Fig. 17, pp.49-50)",
        f"|[U_1 ... U_K]^T [U_1 ... U_K]| with unit-norm columns ({dir_text} directions per head; "
        "white lines separate heads). The signal model (eqs. (10)-(11)) has orthogonal "
        "subspaces: off-diagonal blocks near 0. report.json gives the block coherence ||Q_i^T Q_j||_F/sqrt(p) per "
        "head pair against the random-subspace baseline sqrt(p/d).",
    )
    rows, refs = incoherence(model), _on_references(ctx, incoherence)
    initial = refs[UNTRAINED][1] if UNTRAINED in refs else None
    start, by = None, ctx.start.start_by
    if START in refs:
        start = (refs[START][0].name, refs[START][1])
    words = f"the untrained network ({ctx.initial_words})"
    verdict = incoherence_verdict(rows, ctx.section, initial, initial_words=words, start=start, start_by=by)
    return Part([fig], {"subspaces": rows, "subspaces_initialisation": initial}, [verdict])


# tokens and features drawn per layer in the Fig. 16 heat maps (at most)
HEATMAP_SIZE = 50


def _token_heatmap_section(ctx: _Context) -> Part:
    model = ctx.model
    with torch.no_grad(), evaluating(model):
        trace = model.forward_trace(ctx.x[:1])
    tokens = [t[0].cpu() for t in trace.tokens[1:]]
    plot_token_heatmaps(tokens, ctx.fig_dir / "token_heatmaps.png", size=HEATMAP_SIZE)
    n, d = tokens[0].shape
    rows, cols = min(HEATMAP_SIZE, n), min(HEATMAP_SIZE, d)
    shown = " x ".join(
        f"all {total} {what}" if k == total else f"{k} random {what} of {total}"
        for k, total, what in ((rows, n, "tokens"), (cols, d, "features"))
    )
    fig = (
        "token_heatmaps.png",
        "ISTA outputs per layer (JMLR Fig. 16, p.49)",
        f"|Z^(l+1)| of the first image: {shown}, the same at every layer (colour 0-2). "
        "Deeper CRATE layers should look sparser and more structured.",
    )
    return Part([fig])


def _decoder_section(ctx: _Context) -> Part:
    """CRATE-MAE only: decoder layers against the encoder layers they should invert (§3.5)."""
    name, imgs = next(reversed(list(ctx.splits.items())))
    bs = ctx.batch_size
    xs = imgs if isinstance(imgs, Tensor) else dataset_images01(imgs, range(min(len(imgs), bs)))
    xs = normalize_images(match_channels(xs[:bs].float(), ctx.model.config.in_chans), ctx.normalization)
    xs = xs.to(model_device(ctx.model))
    rows = decoder_inversion(ctx.model, xs, per_image=True)
    cka_out, cka_in = _per_image_cka(rows)
    beside = []  # the untrained network and the starting checkpoint on the same images, by the same function
    for kind, (ref, ref_rows) in _on_references(ctx, partial(decoder_inversion, images=xs, per_image=True)).items():
        words = ref.on(xs.shape[0], f"{name} images")
        beside.append(baseline_from_cka(*_per_image_cka(ref_rows), words, start=kind == START, by=ref.by))
    plot_decoder_inversion(rows, ctx.fig_dir / "decoder_inversion.png")
    fig = (
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
    inv = {"images": f"{xs.shape[0]} {name} images (unmasked)", "layers": rows}
    return Part([fig], {"decoder_inversion": inv}, [decoder_verdict(cka_out, cka_in, beside=beside)])


def _per_image_cka(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(images, layers) arrays of the per-image CKA of the decoder layers' outputs and inputs, taken out of the
    rows of :func:`~.decoder.decoder_inversion` (``per_image=True``), which keep their per-layer means."""
    return tuple(np.array([r.pop(f"cka_{k}_per_image") for r in rows]).T for k in ("out", "in"))


def _segmentation_scores_section(ctx: _Context, data: object, seg_li: int, n_masks: int, tau: float | None) -> Part:
    """``crate analyze --annotations``: MaskCut's masks of every annotated image scored against the ground truth
    (:func:`~.segment_eval.evaluate_segmentation`: COCO mask / box AP through pycocotools, CorLoc and Jaccard)."""
    from .segment_eval import evaluate_segmentation

    scores = evaluate_segmentation(
        ctx.model,
        data,
        "maskcut",
        out=ctx.out / "segment_eval",
        layer=seg_li,
        n_masks=n_masks,
        tau=tau,
        normalization=ctx.normalization,
    )
    return Part(json={"segmentation_scores": {**scores, "layer": seg_li + 1, "tau": tau, "n_masks": n_masks}})
