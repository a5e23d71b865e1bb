"""Layer-wise measurement of compression and sparsity (JMLR §4.2, pp.47-49, Figs. 14-15, 21, 26).

For every layer ℓ = 1..L and every sample, :func:`measure` computes

* ``rc_in``  — the compression term ``R^c`` of the **MSSA input** against the layer's own subspaces
  ``U^ℓ`` by the official protocol (``vis_utils/coding_rate.py``): the per-head projections
  ``U^ℓ_kᵀ·LN1(Z^ℓ)`` (the output of ``attn.qkv``), each projected token unit-normalised within its
  head, then ``½ Σ_k logdet(I + p/(n ε²) G_k)``.  The official code passes ``eps=0.01`` meaning
  ε² = 0.01, i.e. **ε = 0.1** here (the default).  This is the quantity of Figs. 14-15.
* ``rc_half`` — the same protocol on ``U^ℓ_kᵀ Z^{ℓ+1/2}`` (the MSSA output, which the paper's text
  names; text and code disagree, so both are reported).
* ``rc_out`` — the same protocol on ``U^ℓ_kᵀ Z^{ℓ+1}`` (the layer output).
* ``sparsity`` — the fraction of exact zeros of the ISTA output ``Z^{ℓ+1}`` (official
  ``cal_sparsity``); ``nonzero = 1 − sparsity`` is the paper's plotted ``‖Z^{ℓ+1}‖_0/(d·n)``.
* ``l1`` — ``‖Z^{ℓ+1}‖_1/(d·n)``, the mean absolute entry.
* ``rate`` — the coding rate ``R(Ẑ^{ℓ+1})`` of eq. (8) and ``rate_reduction`` — ``ΔR(Ẑ^{ℓ+1}|U^ℓ)``
  of eq. (14), on the layer output with every token unit-normalised (the MCR² convention, so that
  the numbers do not depend on the token scale), with the same ε.
* optional ``below_<τ>`` — the fraction of entries with ``|z| < τ`` (Fig. 26's threshold sparsity,
  informative for ViT, whose outputs have no exact zeros).
* for layers whose attention has memberships (ToST's TSSA: ``attn.memberships``), ``rvar_in`` / ``rvar_half`` /
  ``rvar_out`` — the variational compression term TSSA descends
  (:func:`~crate_transformer.objectives.variational_coding_rate`, Wu et al., ICLR 2025) of the layer's input
  ``Z^ℓ``, its TSSA output ``Z^{ℓ+1/2}`` and its output ``Z^{ℓ+1}``, each through the layer's own LN1, projection
  (bias included) and memberships Π, with the same ε; over every token the layer sees.

For the ViT baseline (Fig. 26) the "subspaces" are the key projections of each head, the "MSSA
output" is the attention-block output and the "ISTA output" the MLP-block output.  The CRATE hybrids
(JMLR Table 17) are measured the same way, block by block: CRATE-MHSA's ``rc_*`` use its key
projections (it has no shared ``U_k``) and its sparsity is the ISTA output's; CRATE-MLP's ``rc_*`` use
the MSSA subspaces and its "sparsity" is that of the residual MLP-block output (no exact zeros
expected); CRATE-α's likewise is the residual ODL-block output, not its internal sparse code.
``meta["ista_output"]`` says whether the measured output is an ISTA output.

Every value is computed per sample in float64 (reusing :mod:`crate_transformer.objectives`) and
averaged over samples with an exactly-rounded sum, so the result is deterministic and does not
depend on the order of the samples.  :class:`LayerTable` holds the per-sample values and gives
means/stds, records and JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..config_utils import POSITIVE
from ..errors import OptionError
from ..io import read_side_file, write_json
from ..layers.inference import evaluating
from ..models.classifier import ImageClassifier
from ..objectives import (
    coding_rate,
    full_precision,
    l1_per_entry,
    rate_reduction,
    sparsity,
    variational_coding_rate,
)
from ..progress import progress_bar
from ._common import (
    Normalization,
    count_images,
    head_projections,
    is_image_dataset,
    iter_batches,
    layer_subspaces,
    model_device,
    resolve_normalization,
)

__all__ = [
    "METRICS",
    "VARIATIONAL",
    "variational_rate",
    "LayerTable",
    "measure",
    "official_rc",
    "measure_batch",
    "measure_hook",
    "load_measure_records",
]

METRICS: dict[str, str] = {
    "rc_in": "R^c of the MSSA input U_k^T LN1(Z^l), per-head unit-normalised tokens (official protocol, Figs. 14-15)",
    "rc_half": "R^c of the MSSA output Z^{l+1/2} against U^l, same protocol (the paper text's definition)",
    "rc_out": "R^c of the layer output Z^{l+1} against U^l, same protocol",
    "sparsity": "fraction of exact zeros of the ISTA output Z^{l+1}",
    "nonzero": "fraction of non-zeros of Z^{l+1}, ||Z||_0/(d n) as plotted in Figs. 14-15",
    "l1": "mean absolute entry ||Z^{l+1}||_1/(d n)",
    "rate": "coding rate R(Z^{l+1}) of eq. (8), tokens unit-normalised",
    "rate_reduction": "rate reduction R - R^c(Z^{l+1}|U^l) of eq. (14), tokens unit-normalised",
    "rvar_in": "variational R^c (ToST) of the TSSA input: the layer's projections of LN1(Z^l) and memberships Pi",
    "rvar_half": "variational R^c of Z^{l+1/2} (after TSSA), through the same layer's LN1, projection and Pi",
    "rvar_out": "variational R^c of the layer output Z^{l+1}, through the same layer's LN1, projection and Pi",
}
VARIATIONAL = ("rvar_in", "rvar_half", "rvar_out")  # measured where the layers' attention has memberships


def official_rc(projections: Tensor, eps: float = 0.1) -> Tensor:
    """The official ``CodingRate`` of per-head projections ``(..., K, n, p)`` → one value per sample.

    Each projected token is ℓ2-normalised within its head, then ``½ Σ_k logdet(I + p/(n ε²) G_k)``
    (``vis_utils/coding_rate.py`` with its ``eps = ε²``).  Because the projections are p-dimensional,
    this is ``Σ_k coding_rate(P̂_k, ε)`` of eq. (8), i.e. eq. (13) on normalised codes.  Float64.
    """
    P = F.normalize(projections.to(torch.float64), dim=-1)
    return coding_rate(P, eps).sum(-1)


def _project(Z: Tensor, U: Tensor) -> Tensor:
    """Row tokens (b, n, d) → per-head codes (b, K, n, p) = ``(U_kᵀ Z)ᵀ``."""
    return Z.to(torch.float64).unsqueeze(1) @ U.to(torch.float64)


@torch.no_grad()
def measure_batch(
    model: ImageClassifier,
    x: Tensor,
    *,
    eps: float = 0.1,
    include_cls: bool = True,
    thresholds: Sequence[float] = (),
) -> dict[str, Tensor]:
    """Per-sample, per-layer values for one model-ready batch: ``{metric: (b, L) float64 tensor}``.

    The model must already be in eval mode (``measure`` takes care of that).  Autocast is off here: the trace
    runs in the model's own dtype and the rates in float64, also when called inside a mixed-precision step.
    """
    with full_precision(x):
        return _measure_batch(model, x, eps, include_cls, thresholds)


def _measure_batch(
    model: ImageClassifier, x: Tensor, eps: float, include_cls: bool, thresholds: Sequence[float]
) -> dict[str, Tensor]:
    trace = model.forward_trace(x)
    start = 0 if include_cls else model.trace_prefix_tokens
    variational = all(callable(getattr(layer.attn, "memberships", None)) for layer in model.layers)
    out: dict[str, list[Tensor]] = {k: [] for k in METRICS if variational or k not in VARIATIONAL}
    for t in thresholds:
        out[f"below_{t:g}"] = []
    for l, layer in enumerate(model.layers):
        z_in, z_half, z_out = trace.tokens[l], trace.half[l], trace.tokens[l + 1]
        U = layer_subspaces(layer)
        P_in = head_projections(layer, layer.norm1(z_in))[:, :, start:]
        out["rc_in"].append(official_rc(P_in, eps))
        out["rc_half"].append(official_rc(_project(z_half[:, start:], U), eps))
        out["rc_out"].append(official_rc(_project(z_out[:, start:], U), eps))
        z = z_out[:, start:].to(torch.float64)
        s = sparsity(z)
        out["sparsity"].append(s)
        out["nonzero"].append(1.0 - s)
        out["l1"].append(l1_per_entry(z))
        zn = F.normalize(z, dim=-1)
        out["rate"].append(coding_rate(zn, eps))
        out["rate_reduction"].append(rate_reduction(zn, U.to(torch.float64), eps))
        for t in thresholds:
            out[f"below_{t:g}"].append((z.abs() < t).to(torch.float64).mean((-2, -1)))
        if variational:
            for name, tokens in zip(VARIATIONAL, (z_in, z_half, z_out)):
                out[name].append(variational_rate(layer, tokens, eps))
    return {k: torch.stack(v, dim=1).cpu() for k, v in out.items()}


def variational_rate(layer: torch.nn.Module, z: Tensor, eps: float) -> Tensor:
    """:func:`~crate_transformer.objectives.variational_coding_rate` of tokens ``z`` (b, n, d) through ``layer``'s
    LN1, attention projection (bias included) and memberships Π, in float64; one value per sample."""
    h = layer.norm1(z)
    return variational_coding_rate(layer.attn.project(h), None, layer.attn.memberships(h), eps, dtype=torch.float64)


@dataclass
class LayerTable:
    """Per-layer measurements: per-sample values plus the protocol.

    ``values[metric]`` is an ``(N, L)`` float64 array (sample × layer); layers are numbered
    ``1..L`` as in the paper (``layer`` ℓ ↔ ``model.layers[ℓ-1]``).
    """

    values: dict[str, np.ndarray]
    meta: dict = field(default_factory=dict)

    @property
    def metrics(self) -> list[str]:
        return list(self.values)

    @property
    def num_layers(self) -> int:
        return next(iter(self.values.values())).shape[1]

    @property
    def num_samples(self) -> int:
        return next(iter(self.values.values())).shape[0]

    @property
    def layers(self) -> list[int]:
        return list(range(1, self.num_layers + 1))

    def _check(self, metric: str) -> np.ndarray:
        if metric not in self.values:
            raise ValueError(f"unknown metric {metric!r}; available: {', '.join(self.values)}")
        return self.values[metric]

    def mean(self, metric: str) -> np.ndarray:
        """Mean over samples per layer (exactly rounded sum: independent of the sample order)."""
        v = self._check(metric)
        return np.array([math.fsum(v[:, j]) / v.shape[0] for j in range(v.shape[1])])

    def std(self, metric: str) -> np.ndarray:
        """Sample standard deviation (ddof=1, as ``torch.std`` in the official code); 0 for one sample."""
        v = self._check(metric)
        if v.shape[0] < 2:
            return np.zeros(v.shape[1])
        m = self.mean(metric)
        return np.array([math.sqrt(math.fsum((v[:, j] - m[j]) ** 2) / (v.shape[0] - 1)) for j in range(v.shape[1])])

    def to_records(self) -> list[dict]:
        """One JSON-serialisable dict per layer: ``{"layer", "n_samples", <metric>, <metric>_std, ...}``."""
        means = {k: self.mean(k) for k in self.values}
        stds = {k: self.std(k) for k in self.values}
        records = []
        for j in range(self.num_layers):
            r: dict = {"layer": j + 1, "n_samples": self.num_samples}
            for k in self.values:
                r[k] = float(means[k][j])
                r[f"{k}_std"] = float(stds[k][j])
            records.append(r)
        return records

    def to_dict(self, per_sample: bool = False) -> dict:
        d = {
            "meta": dict(self.meta),
            "metrics": {k: METRICS.get(k, k) for k in self.values},
            "layers": self.to_records(),
        }
        if per_sample:
            d["per_sample"] = {k: v.tolist() for k, v in self.values.items()}
        return d

    def to_json(self, path: str | Path | None = None, per_sample: bool = False) -> str:
        text = json.dumps(self.to_dict(per_sample), indent=2)
        if path is not None:
            write_json(path, self.to_dict(per_sample))
        return text

    @classmethod
    def from_dict(cls, d: Mapping) -> LayerTable:
        """Rebuild from :meth:`to_dict` output (needs ``per_sample=True`` for exact std; else means only)."""
        if "per_sample" in d:
            values = {k: np.asarray(v, dtype=np.float64) for k, v in d["per_sample"].items()}
        else:
            recs = d["layers"]
            keys = [k for k in recs[0] if k not in ("layer", "n_samples") and not k.endswith("_std")]
            values = {k: np.array([[r[k] for r in recs]], dtype=np.float64) for k in keys}
        return cls(values, dict(d.get("meta", {})))

    def format(self, metrics: Sequence[str] | None = None) -> str:
        """A plain-text table of the means (± std)."""
        metrics = list(
            metrics
            or [
                k for k in ("rc_in", "rc_out", "rvar_in", "nonzero", "l1", "rate", "rate_reduction") if k in self.values
            ]
        )
        rows = [["layer", *metrics]]
        means, stds = {k: self.mean(k) for k in metrics}, {k: self.std(k) for k in metrics}
        for j in range(self.num_layers):
            rows.append([str(j + 1), *(f"{means[k][j]:.4g} ± {stds[k][j]:.2g}" for k in metrics)])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)

    def __str__(self) -> str:
        return self.format()


def measure(
    model: ImageClassifier,
    images: Tensor | Iterable,
    *,
    eps: float = 0.1,
    batch_size: int = 64,
    include_cls: bool = True,
    thresholds: Sequence[float] = (),
    normalize: Normalization | str | None = "auto",
    progress: bool = True,
    desc: str = "measure",
) -> LayerTable:
    """Measure compression and sparsity at every layer (JMLR §4.2, pp.47-49, Figs. 14-15).

    ``images``: a model-ready float tensor ``(N, C, H, W)`` (already normalised), a ``data.ImageDataset``
    (or any map-style dataset of ``(image in [0, 1], label)``; grey/RGB converted to the model's
    channels as in training), or a loader / iterable of model-ready batches.

    ``normalize``: ``"auto"`` normalises dataset images with the normalisation recorded in
    ``model.config.data`` (see :func:`crate_transformer.models.spec.resolve_normalization`), falling back
    to the dataset's statistics, and leaves tensors / loaders untouched; pass ``(mean, std)`` to force
    a normalisation or ``None`` for none.  Every batch is checked (shape, channels, NaN/Inf) before use.

    ``eps`` is ε (the official ``eps=0.01`` is ε², i.e. ``eps=0.1`` here).  ``include_cls`` keeps the
    class token in the token set (official: yes).  The model is run in eval mode under
    ``torch.no_grad`` and its training mode is restored afterwards, so this can be called from a
    training loop on a fixed batch: ``measure(model, batch, progress=False).to_records()``.
    """
    if not eps > 0:
        raise ValueError(f"eps (the precision ε, not ε²) must be positive, got {eps}")
    normalization = _normalization(model, images, normalize)
    total = count_images(images)
    if total == 0:
        raise ValueError("no images to measure (empty tensor or dataset)")
    device = model_device(model)
    chunks: list[dict[str, Tensor]] = []
    with evaluating(model):
        bar = progress_bar(total=total, desc=desc, unit="img", enabled=progress, leave=False)
        for x in iter_batches(images, batch_size, normalization, model.config.in_chans):
            x = x.to(device)
            model.check_images(x)  # an API boundary: user tensors are checked for NaN/Inf here, not in forward
            chunks.append(measure_batch(model, x, eps=eps, include_cls=include_cls, thresholds=thresholds))
            bar.update(x.shape[0])
        bar.close()
    if not chunks:
        raise ValueError("no images to measure (the iterable yielded no batches)")
    values = {k: torch.cat([c[k] for c in chunks]).numpy() for k in chunks[0]}
    return LayerTable(values, _meta(model, values, eps, include_cls, normalization))


def _normalization(model: ImageClassifier, images: object, normalize: object) -> Normalization | None:
    """``measure``'s ``normalize`` argument resolved: "auto" normalises datasets only (see :func:`measure`)."""
    if normalize == "auto":
        is_dataset = is_image_dataset(images) or (not isinstance(images, Tensor) and count_images(images) is not None)
        return resolve_normalization(model, images) if is_dataset else None
    if isinstance(normalize, str):
        raise ValueError(f"normalize must be 'auto', None or (mean, std), got {normalize!r}")
    return normalize


def _meta(
    model: ImageClassifier, values: dict, eps: float, include_cls: bool, normalization: Normalization | None
) -> dict:
    """The protocol of one measurement, stored with its table."""
    return {
        "eps": eps,
        "eps_squared": eps**2,
        "include_cls": include_cls,
        "n_samples": int(values["rc_in"].shape[0]),
        "n_layers": int(values["rc_in"].shape[1]),
        "arch": model.config.arch,
        "attention": model.config.layer_blocks[0],
        "mlp": model.config.layer_blocks[1],
        "ista_output": model.config.sparse_output,
        "normalization": None
        if normalization is None
        else [list(map(float, torch.as_tensor(s).flatten())) for s in normalization],
        "protocol": "per-sample values averaged over samples; R^c per official vis_utils (per-head unit-normalised "
        "projections, eps^2 = eps**2); layers numbered 1..L",
    }


MEASURE_SPLIT = "measure"


def measure_hook(
    every: int, *, eps: float = 0.1, include_cls: bool = True, split: str = MEASURE_SPLIT
) -> Callable[[object], list[dict] | None]:
    """A per-step training hook for ``--measure-every N`` (Fig. 15 across training).

    The returned callable takes the training loop's step context (anything with ``model``, ``step``,
    ``epoch`` and ``fixed_batch`` = a model-ready tensor or an ``(images, labels)`` pair) and, every
    ``every`` steps (and at step 0), returns one JSON-serialisable record per layer::

        {"split": "measure", "step": 500, "epoch": 2, "layer": 1, "rc_in": ..., "rc_in_std": ..., "nonzero": ..., ...}

    which the loop appends to its metrics log; :func:`load_measure_records` reads them back and
    :func:`~crate_transformer.analysis.plots.plot_measure_history` plots them.
    """
    if not POSITIVE.ok(every):
        requirement = dataclasses.replace(POSITIVE, note="steps").requirement(every)
        raise OptionError(f"measure_every{requirement}", option="measure_every")

    def hook(ctx: object) -> list[dict] | None:
        step = int(ctx.step)
        if step % every:
            return None
        batch = ctx.fixed_batch
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        table = measure(ctx.model, x, eps=eps, include_cls=include_cls, normalize=None, progress=False)
        head = {"split": split, "step": step, "epoch": getattr(ctx, "epoch", None)}
        return [{**head, **r} for r in table.to_records()]

    return hook


def load_measure_records(path: str | Path, split: str | None = MEASURE_SPLIT) -> list[dict]:
    """The per-layer measurement records of a metrics log (JSON lines), e.g. a run's ``metrics.jsonl``.

    Keeps the records that have ``layer`` and ``rc_in`` (and ``split == split`` unless ``split`` is None).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"metrics log not found: {path}")
    fix = "restore it, or delete it (the measurements it held are lost)"
    return [
        r
        for r in read_side_file(path, fix, form="jsonl")
        if "layer" in r and "rc_in" in r and (split is None or r.get("split") == split)
    ]
