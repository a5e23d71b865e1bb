"""White-box analysis of language models (JMLR §4.1.4 models, §4.2 measurements on token representations).

The image measurements apply unchanged to token representations: :func:`measure_text` runs
:func:`~crate_transformer.analysis.measure.measure_batch` (per-layer ``R^c`` of eq. (13) by the official protocol,
sparsity, ℓ1, ``R`` and ``ΔR``) on batches of held-out token blocks, each block one sample; every token of the
block is in the token set (there is no class token).  :func:`token_attention` returns one block's attention
maps and :func:`plot_token_attention` draws them with the tokens as axis labels (heads numbered 1..K, as in the
image report).  :func:`analyze_text` writes ``report.json`` and ``report.html``, whose first table says whether
the compression and sparsity claims (Figs. 14-15) held on the token representations.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from ..io import make_folder, write_json
from ..layers.inference import evaluating
from ._common import finish_partial, mark_partial
from .explorer import explorer_section, text_payload
from .figures import InlineFigure
from .measure import LayerTable, measure_batch
from .plots import plot_layerwise, save_figure

__all__ = ["measure_text", "token_attention", "plot_token_attention", "analyze_text"]


@torch.no_grad()
def measure_text(model: torch.nn.Module, blocks: Tensor, *, eps: float = 0.1, batch_size: int = 32) -> LayerTable:
    """Per-layer compression and sparsity of the token representations of ``blocks`` (N, n) token ids."""
    if not eps > 0:
        raise ValueError(f"eps (the precision ε, not ε²) must be positive, got {eps}")
    if blocks.dim() != 2 or not len(blocks):
        raise ValueError(f"expected a non-empty (blocks, tokens) tensor of token ids, got shape {tuple(blocks.shape)}")
    device = model.wte.weight.device
    with evaluating(model):
        chunks = [measure_batch(model, x.to(device), eps=eps) for x in blocks.split(batch_size)]
    values = {k: torch.cat([c[k] for c in chunks]).numpy() for k in chunks[0]}
    meta = {
        "eps": eps,
        "eps_squared": eps**2,
        "include_cls": False,
        "arch": model.config.arch,
        "n_samples": len(blocks),
        "n_layers": len(model.layers),
        "tokens_per_sample": blocks.shape[1],
        "unit": "token blocks",
        "protocol": "each sample is one held-out block of tokens; R^c per official vis_utils (per-head unit-normalised "
        "projections, eps^2 = eps**2); layers numbered 1..L",
    }
    return LayerTable(values, meta)


@torch.no_grad()
def token_attention(model: torch.nn.Module, ids: Tensor, layer: int = -1) -> Tensor:
    """The ``(K, n, n)`` attention of one block ``ids`` (n,) at ``layer`` (row = query token, row-softmax)."""
    from ._common import layer_index

    layer = layer_index(model, layer)
    with evaluating(model):
        trace = model.forward_trace(ids.reshape(1, -1).to(model.wte.weight.device), return_attention=True)
    return trace.attention[layer][0].float().cpu()


MAX_TICK_LABELS = 32  # more token labels than this on an axis overlap at any readable font size


def _token_ticks(ax: object, labels: Sequence[str]) -> None:
    """Token strings as tick labels, every ``s``-th token when there are more than :data:`MAX_TICK_LABELS`."""
    step = -(-len(labels) // MAX_TICK_LABELS)
    pos = list(range(0, len(labels), step))
    shown = [labels[i] for i in pos]
    ax.set_xticks(pos, shown, rotation=90, fontsize=7, family="monospace")
    ax.set_yticks(pos, shown, fontsize=7, family="monospace")


def plot_token_attention(
    attn: Tensor, tokens: Sequence[str], path: str | Path | None = None, *, title: str = ""
) -> Figure:
    """One heat map per head of ``attn`` (K, n, n), heads numbered 1..K as in the paper, with the tokens on both
    axes (queries down, keys across; at most :data:`MAX_TICK_LABELS` labels per axis) and one shared colour bar."""
    K, n = attn.shape[0], attn.shape[-1]
    cols = min(K, 4)
    rows = -(-K // cols)
    side = max(3.2, 0.13 * min(n, MAX_TICK_LABELS * 2))
    fig = InlineFigure(figsize=(side * cols + 0.8, side * rows + 0.6), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    labels = [repr(t)[1:-1].replace(" ", "␣") for t in tokens]  # spaces, newlines and tabs visible
    vmax = max(float(attn.max()), 1e-12)
    for k, ax in enumerate(axes):
        if k >= K:
            ax.axis("off")
            continue
        im = ax.imshow(attn[k].numpy(), cmap="viridis", vmin=0, vmax=vmax)
        ax.set_title(f"head {k + 1}", fontsize=9)
        _token_ticks(ax, labels)
    fig.colorbar(im, ax=axes, shrink=0.8, label="attention weight (row-softmax)")
    fig.suptitle(title or "attention over tokens (row: query, column: key)")
    return save_figure(fig, path)


LM_SECTION = "language model"


def _lm_figures(table: LayerTable, attn: Sequence[tuple[str, int]], n_tokens: int) -> dict[str, dict[str, str]]:
    """Titles and captions of the language-model figures (``report.json["captions"]``, the HTML page)."""
    caps = {
        "layerwise.png": {
            "title": "Compression, sparsity and rate reduction versus layer (JMLR Figs. 14-15 on token blocks)",
            "caption": f"R^c of each layer's MSSA input against its subspaces U^l (official protocol, eps^2 = "
            f"{table.meta['eps'] ** 2:g}), the non-zero fraction of the ISTA output and the rate reduction R - R^c "
            f"(eq. (14)) of the layer output; mean over {table.num_samples} held-out token blocks, band = 1 std. "
            "Dashed: the reference of the verdicts, an untrained network of the same architecture on the same blocks.",
        }
    }
    for f, ell in attn:
        caps[f] = {
            "title": f"Attention over tokens, layer {ell} (heads 1..K)",
            "caption": f"Each head's attention matrix over the first {n_tokens} tokens of the first held-out block "
            "(row: query, column: key; each row sums to 1: a softmax, or for ToST's TSSA the weights Pi_ik / sum Pi "
            "of the tokens whose statistics the query reads); token strings on the axes (spaces shown as ␣, newlines "
            "and tabs escaped), every s-th token when there are many.",
        }
    return caps


def _token_strings(model: torch.nn.Module, ids: Tensor) -> list[str]:
    """Readable tokens of ``ids`` by the model's tokenizer (the ids themselves without one)."""
    tok = getattr(model, "tokenizer", None)
    return tok.token_strings(ids.tolist()) if tok is not None else [str(i) for i in ids.tolist()]


def analyze_text(
    model: torch.nn.Module,
    out_dir: str | Path,
    blocks: Tensor,
    *,
    eps: float = 0.1,
    batch_size: int = 32,
    attn_layers: Sequence[int] = (0, -1),
    attn_tokens: int = 48,
    source: dict | None = None,
    explorer_texts: int = 4,
    seed: int = 0,
    seed_words: str | None = None,
    start: tuple[torch.nn.Module | None, str | None, str | None] = (None, None, None),
) -> dict:
    """Measure ``blocks`` (held-out token ids), plot layer-wise compression / sparsity and the attention of the
    first ``attn_tokens`` tokens of the first block; decide the compression and sparsity claims
    (:mod:`~crate_transformer.analysis.verdicts`); writes ``report.json``, ``report.html``, ``layerwise.png`` and
    ``attention_layer{ℓ}.png`` to ``out_dir`` and returns the report; ``report.html`` holds the explorer of the
    first ``explorer_texts`` blocks (hover a token to see its attention, :mod:`.explorer`).  The verdicts' reference:
    an untrained network of the same architecture built with ``seed`` (``seed_words`` says whose) on the same blocks;
    ``start`` = (model, path, why it did not load) of a fine-tuned run's starting checkpoint (config.yaml's
    ``init_from``): measured on the same blocks and reported beside each verdict, or a note saying why not; the
    folder holds :data:`~._common.PARTIAL_MARKER` until ``report.html`` is written."""
    from .report_sections import INITIAL, START_NAME, rate_notes
    from .verdicts import layer_claims

    t0, LM = time.time(), LM_SECTION
    out = make_folder(out_dir, "report folder")
    mark_partial(out)
    table = measure_text(model, blocks, eps=eps, batch_size=batch_size)
    initial, base = _initial_text(model, blocks, (eps, batch_size), seed, seed_words or f"seed {seed}")
    begun, begin, notes = _start_text(start, blocks, (eps, batch_size))
    curves = {f"held-out text {INITIAL}": initial, **({f"held-out text {START_NAME}": begun} if begun else {})}
    extra, attn, ids = _text_figures(model, table, curves, blocks[0, :attn_tokens], attn_layers, out)
    c = model.config
    shown = blocks[:explorer_texts, :attn_tokens]
    explorer = text_payload(model, shown, [_token_strings(model, b) for b in shown])
    report = {
        "model": {"arch": c.arch, "causal": c.causal, "params": model.num_params()},
        "source": source or {},
        "explorer": {"texts": len(shown), "layers": explorer["layers"]},
        "measure": {"held-out text": table.to_dict()},
        "figures": ["layerwise.png", *(f for f, _, _ in extra), *(f for f, _ in attn)],
        "initialisation": {f"held-out text {INITIAL}": initial.to_records()},
        "verdicts": [v.to_dict() for v in layer_claims(table, LM, base, begin)],
        "notes": notes + rate_notes(model, {"held-out text": table}),
        "captions": {**_lm_figures(table, attn, len(ids)), **{f: {"title": t, "caption": c} for f, t, c in extra}},
        "model_config": c.to_dict(),
        "wall_time_s": round(time.time() - t0, 1),
    }
    if begin is not None:
        report["starting_checkpoint"] = {"path": start[1], "source": begin.source, "measure": begun.to_records()}
    report = json.loads(json.dumps(report, default=float))
    write_json(out / "report.json", report)
    (out / "report.html").write_text(lm_html(report, explorer))
    finish_partial(out)
    return report


def _text_figures(
    model: torch.nn.Module, table: LayerTable, curves: dict, ids: Tensor, attn_layers: Sequence[int], out: Path
) -> tuple[list, list[tuple[str, int]], Tensor]:
    """The report's figures: the layer-wise curves with the reference ``curves`` beside, ToST's variational
    figure where measured, and the attention of the tokens ``ids`` in each of ``attn_layers``."""
    from .report_sections import variational_figure

    plot_layerwise(
        {"held-out text": table}, out / "layerwise.png", metrics=("rc_in", "nonzero", "rate_reduction"),
        references=curves,
    )  # fmt: skip
    extra = variational_figure({"held-out text": table}, curves, out)
    return extra, _attention_figures(model, ids, attn_layers, out), ids


def _attention_figures(model: torch.nn.Module, ids: Tensor, layers: Sequence[int], out: Path) -> list[tuple[str, int]]:
    """``attention_layer{ℓ}.png`` of the tokens ``ids`` for each distinct layer of ``layers``: (file, ℓ) each."""
    from ._common import layer_index

    tokens, attn = _token_strings(model, ids), []
    for layer in dict.fromkeys(layers):
        ell = layer_index(model, layer) + 1
        path = out / f"attention_layer{ell}.png"
        plot_token_attention(token_attention(model, ids, layer), tokens, path, title=f"layer {ell} attention")
        attn.append((path.name, ell))
    return attn


def _start_text(
    start: tuple[torch.nn.Module | None, str | None, str | None], blocks: Tensor, protocol: tuple[float, int]
) -> tuple[LayerTable | None, object | None, list[str]]:
    """A fine-tuned run's starting checkpoint (``start`` as :func:`analyze_text` takes it) measured on the same
    blocks as the model (its table and the verdicts' :class:`~.verdicts.Baseline` of it), or a note saying why
    there is none."""
    from .verdicts import baseline_from_table

    model, path, why = start
    if model is None:
        missing = f"starting checkpoint unavailable: {path} (config.yaml's init_from) does not load: {why or 'unknown'}"
        return None, None, [f"{missing}; no claim states its move from it"] if path else []
    table = measure_text(model, blocks, eps=protocol[0], batch_size=protocol[1])
    words = f"the starting checkpoint ({path}), measured on the same {blocks.shape[0]} held-out blocks"
    return table, baseline_from_table(table, words, start=True), []


def _initial_text(
    model: torch.nn.Module, blocks: Tensor, protocol: tuple[float, int], seed: int, seed_words: str
) -> tuple[LayerTable, object]:
    """The reference of the verdicts: an untrained network of the same architecture (``seed``), measured on the same
    blocks under the report's ``protocol`` (eps, batch size)."""
    from .report_sections import initial_model, untrained_words
    from .verdicts import baseline_from_table

    eps, batch_size = protocol
    initial = measure_text(initial_model(model, seed), blocks, eps=eps, batch_size=batch_size)
    return initial, baseline_from_table(initial, untrained_words(seed_words, "held-out blocks"))


def _lm_info(report: dict) -> str:
    import html

    c, src = report["model_config"], report["source"]
    info = [
        ("checkpoint", src.get("checkpoint", "-")),
        ("data", src.get("data", "-")),
        ("model", f"{c['arch']} dim={c['dim']} depth={c['depth']} heads={c['heads']} block={c['block_size']} "
                  f"({report['model']['params']:,} parameters)"),
        ("eps", str(report["measure"]["held-out text"]["meta"]["eps"])),
        ("wall time", f"{report['wall_time_s']} s"),
    ]  # fmt: skip
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td class='l'>{html.escape(str(v))}</td></tr>" for k, v in info)
    return (
        f"<table>{rows}</table><p>Every number is also in <a href='report.json'>report.json</a>. Layers are numbered "
        "1..L and heads 1..K as in the paper (JMLR, Yu et al. 2024); each sample is one held-out block of tokens.</p>"
    )


def lm_html(report: dict, explorer: dict | None = None) -> str:
    """``report.html`` of a language model: verdicts, model, layer table, figures (PNGs beside the page)."""
    from .report_html import html_figures, html_layer_tables, html_verdicts, render_html

    page = {**report, "figures": report["captions"], "figure_folder": ""}
    sections = [html_verdicts, _lm_info, html_layer_tables]
    if explorer is not None:  # hover a token: its attention over the tokens (.explorer)
        sections.append(lambda r: explorer_section(explorer))
    sections.append(lambda r: html_figures(r, folder=""))
    return render_html(page, sections, title="CRATE white-box report: language model")
