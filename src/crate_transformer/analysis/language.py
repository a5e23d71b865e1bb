"""White-box analysis of language models (JMLR §4.1.4 models, §4.2 measurements on token representations).

The image measurements apply unchanged to token representations: :func:`measure_text` runs
:func:`~crate_transformer.analysis.measure.measure_batch` (per-layer ``R^c`` of eq. (13) by the official protocol,
sparsity, ℓ1, ``R`` and ``ΔR``) on batches of held-out token blocks, each block one sample; every token of the
block is in the token set (there is no class token).  :func:`token_attention` returns one block's attention
maps and :func:`plot_token_attention` draws them with the tokens as axis labels.
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

from ..io import write_json
from .explorer import text_payload, write_explorer
from .measure import LayerTable, measure_batch
from .plots import _save, plot_layerwise

__all__ = ["measure_text", "token_attention", "plot_token_attention", "analyze_text"]


@torch.no_grad()
def measure_text(model: torch.nn.Module, blocks: Tensor, *, eps: float = 0.1, batch_size: int = 32) -> LayerTable:
    """Per-layer compression and sparsity of the token representations of ``blocks`` (N, n) token ids."""
    if not eps > 0:
        raise ValueError(f"eps (the precision ε, not ε²) must be positive, got {eps}")
    if blocks.dim() != 2 or not len(blocks):
        raise ValueError(f"expected a non-empty (blocks, tokens) tensor of token ids, got shape {tuple(blocks.shape)}")
    device = model.wte.weight.device
    was = model.training
    model.eval()
    try:
        chunks = [measure_batch(model, x.to(device), eps=eps) for x in blocks.split(batch_size)]
    finally:
        model.train(was)
    values = {k: torch.cat([c[k] for c in chunks]).numpy() for k in chunks[0]}
    meta = {
        "eps": eps,
        "eps_squared": eps**2,
        "include_cls": False,
        "arch": model.config.arch,
        "n_samples": len(blocks),
        "n_layers": len(model.layers),
        "tokens_per_sample": blocks.shape[1],
        "protocol": "each sample is one held-out block of tokens; R^c per official vis_utils (per-head unit-normalised "
        "projections, eps^2 = eps**2); layers numbered 1..L",
    }
    return LayerTable(values, meta)


@torch.no_grad()
def token_attention(model: torch.nn.Module, ids: Tensor, layer: int = -1) -> Tensor:
    """The ``(K, n, n)`` attention of one block ``ids`` (n,) at ``layer`` (row = query token, row-softmax)."""
    from ._common import layer_index

    layer = layer_index(model, layer)
    was = model.training
    model.eval()
    try:
        trace = model.forward_trace(ids.reshape(1, -1).to(model.wte.weight.device), return_attention=True)
    finally:
        model.train(was)
    return trace.attention[layer][0].float().cpu()


def plot_token_attention(
    attn: Tensor, tokens: Sequence[str], path: str | Path | None = None, *, title: str = ""
) -> Figure:
    """One heat map per head of ``attn`` (K, n, n) with the tokens on both axes (queries down, keys across)."""
    K, n = attn.shape[0], attn.shape[-1]
    cols = min(K, 4)
    rows = -(-K // cols)
    side = max(3.0, 0.16 * n)
    fig = Figure(figsize=(side * cols, side * rows + 0.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    labels = [repr(t)[1:-1] for t in tokens]  # newlines and tabs visible
    for k, ax in enumerate(axes):
        if k >= K:
            ax.axis("off")
            continue
        ax.imshow(attn[k].numpy(), cmap="viridis", vmin=0)
        ax.set_title(f"head {k + 1}", fontsize=9)
        ax.set_xticks(range(n), labels, rotation=90, fontsize=6, family="monospace")
        ax.set_yticks(range(n), labels, fontsize=6, family="monospace")
    fig.suptitle(title or "attention over tokens (row: query, column: key)")
    return _save(fig, path)


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
) -> dict:
    """Measure ``blocks`` (held-out token ids), plot layer-wise compression / sparsity and the attention of the
    first ``attn_tokens`` tokens of the first block; writes ``report.json``, ``layerwise.png``,
    ``attention_layer{ℓ}.png`` and ``explorer.html`` (hover a token of the first ``explorer_texts`` blocks to see
    its attention, :mod:`.explorer`) to ``out_dir`` and returns the report."""
    t0 = time.time()
    out = Path(out_dir)
    table = measure_text(model, blocks, eps=eps, batch_size=batch_size)
    plot_layerwise({"held-out text": table}, out / "layerwise.png", metrics=("rc_in", "nonzero", "rate_reduction"))
    ids = blocks[0, :attn_tokens]
    tokens = _token_strings(model, ids)
    figures = []
    for layer in dict.fromkeys(attn_layers):
        from ._common import layer_index

        ell = layer_index(model, layer) + 1
        path = out / f"attention_layer{ell}.png"
        plot_token_attention(token_attention(model, ids, layer), tokens, path, title=f"layer {ell} attention")
        figures.append(path.name)
    shown = blocks[:explorer_texts, :attn_tokens]
    payload = text_payload(model, shown, [_token_strings(model, b) for b in shown])
    write_explorer(payload, out / "explorer.html", title="CRATE explorer: attention over tokens")
    report = {
        "model": {"arch": model.config.arch, "causal": model.config.causal, "params": model.num_params()},
        "explorer": {"file": "explorer.html", "texts": len(shown), "layers": payload["layers"]},
        "source": source or {},
        "measure": {"held-out text": table.to_dict()},
        "figures": ["layerwise.png", *figures],
        "wall_time_s": round(time.time() - t0, 1),
    }
    write_json(out / "report.json", json.loads(json.dumps(report, default=float)))
    return report
