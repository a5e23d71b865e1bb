"""Sparse codes as features: per-unit statistics, top-activating inputs and an interpretability score.

CRATE's sparsification step is one non-negative ISTA step on the LASSO (42) over a learned dictionary
``D^ℓ`` (eq. (44), JMLR p.25): ``Z^{ℓ+1} = ReLU(Z + η Dᵀ(Z − D Z) − ηλ)``.  Its output is a sparse,
non-negative code of each token with one coordinate per atom — the object sparse autoencoders are trained to
find inside black-box models.  Here every coordinate is a *unit*:

* CRATE (``mlp="ista"``): the ISTA output, ``d`` units per layer (eq. (44));
* CRATE-α / crate-lm (``mlp="odl"`` / ``"ista_overcomplete"``): the overcomplete code ``A2`` of
  :meth:`~crate_transformer.layers.OvercompleteISTA.code`, ``odl_ratio·d`` units;
* ViT, GPT-2, CRATE-MLP (``mlp="mlp"``): the GELU hidden units of the MLP, ``mlp_ratio·d`` units.

Codes are captured with forward hooks on those modules; no model module is changed.  With ``a_{t,u}`` the
activation of unit ``u`` on token ``t`` of an evaluation set of ``T`` tokens (image models: the patch tokens,
the class token excluded; language models: every position):

* active: ``a_{t,u} > 0`` (a ReLU code is non-zero; a GELU unit has a positive pre-activation);
* frequency ``f_u = (1/T) Σ_t 1[a_{t,u} > 0]``; mean ``μ_u = (1/T) Σ_t a_{t,u}``; max ``max_t a_{t,u}``;
* top-k: the ``k`` active tokens of largest activation, in decreasing order;
* purity ``P_u = max_c (1/k) Σ_{i≤k} 1[y(t_i) = c]`` over the top-k tokens ``t_i`` of a unit active on at
  least ``k`` tokens (a *scored* unit), where ``y`` is the image's class, the token or the next token;
  normalised entropy ``H_u = −Σ_c p_c log p_c / log min(C, k)`` of the same ``p_c``;
* dead: ``f_u = 0``; always-on: ``f_u > 0.9``.

:func:`collect` gathers the statistics in one streaming pass; :func:`purity` scores them; :func:`layer_summary`
reduces a layer to the table row that ``crate features`` prints; :func:`render_dashboard` writes the HTML page.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import torch
from torch import Tensor, nn

from ..config_utils import POSITIVE
from ..layers.inference import evaluating

__all__ = [
    "ALWAYS_ON",
    "UnitStats",
    "code_sites",
    "prefix_tokens",
    "collect",
    "purity",
    "chance_purity",
    "dead_fraction",
    "always_on_fraction",
    "layer_summary",
    "unit_records",
    "png_data_url",
    "render_dashboard",
    "image_features",
    "text_features",
    "summary_table",
]

ALWAYS_ON = 0.9  # a unit active on more than this fraction of the tokens is "always on"


@dataclass
class UnitStats:
    """One layer's statistics over ``n_tokens`` tokens: per unit (``m`` of them) the active count, the sum and
    max of the activations, and the top-k activations with their token indices (``(k, m)``, decreasing; −1
    where fewer than k tokens were active).  Token ``t`` is position ``t % tokens_per_sample`` of sample
    ``t // tokens_per_sample`` (after the prefix tokens)."""

    kind: str
    tokens_per_sample: int
    k: int
    n_tokens: int = 0
    count: np.ndarray = field(default_factory=lambda: np.zeros(0))
    total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    max: np.ndarray = field(default_factory=lambda: np.zeros(0))
    top_val: Tensor | None = None
    top_idx: Tensor | None = None

    @property
    def width(self) -> int:
        return len(self.count)

    @property
    def frequency(self) -> np.ndarray:
        """``f_u``: the fraction of the tokens on which each unit is active."""
        return self.count / max(self.n_tokens, 1)

    @property
    def mean(self) -> np.ndarray:
        """``μ_u``: each unit's mean activation over every token (inactive ones included)."""
        return self.total / max(self.n_tokens, 1)

    def top(self) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, values)`` of the top-k active tokens as ``(m, k)`` arrays; index −1 = none."""
        idx, val = self.top_idx.T.numpy().copy(), self.top_val.T.double().numpy().copy()
        idx[~(val > 0)] = -1
        return idx, val

    def add(self, codes: Tensor) -> None:
        """Fold ``(tokens, m)`` activations (the next tokens of the evaluation set) into the statistics."""
        codes = codes.detach().float().cpu()
        if self.top_val is None:
            m = codes.shape[1]
            self.count, self.total, self.max = np.zeros(m), np.zeros(m), np.full(m, -np.inf)
            self.top_val, self.top_idx = codes.new_empty(0, m), torch.empty(0, m, dtype=torch.long)
        self.count += (codes > 0).sum(0).double().numpy()
        self.total += codes.double().sum(0).numpy()
        self.max = np.maximum(self.max, codes.max(0).values.double().numpy())
        idx = torch.arange(self.n_tokens, self.n_tokens + len(codes)).unsqueeze(1).expand_as(codes)
        vals, ids = torch.cat([self.top_val, codes]), torch.cat([self.top_idx, idx])
        # ties are broken towards the earlier token, so the result does not depend on the batch size
        order = torch.sort(ids, dim=0, stable=True).indices
        vals, ids = vals.gather(0, order), ids.gather(0, order)
        best = torch.sort(vals, dim=0, descending=True, stable=True).indices[: self.k]
        self.top_val, self.top_idx = vals.gather(0, best), ids.gather(0, best)
        self.n_tokens += len(codes)


def code_sites(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """Per layer, the module whose forward pass holds the units, and their kind (``ista``, ``mlp``, ``odl``,
    ``ista_overcomplete``): what the model says (:meth:`~crate_transformer.models.base.Model.code_sites`)."""
    return model.code_sites()


def prefix_tokens(model: nn.Module) -> int:
    """Tokens before the patches in the layers' sequences, where the codes are read (the class token of the image
    models; none in ToST's TSSA blocks): they are not features of a patch."""
    return model.trace_prefix_tokens


def _hook(module: nn.Module, kind: str, store: list[Tensor]) -> torch.utils.hooks.RemovableHandle:
    if kind in ("odl", "ista_overcomplete"):
        return module.register_forward_pre_hook(lambda m, inp: store.append(m.code(inp[0])))
    return module.register_forward_hook(lambda m, inp, out: store.append(out))


@torch.no_grad()
def collect(
    model: nn.Module, batches: Iterable[Tensor], k: int = 16, layers: Iterable[int] | None = None
) -> dict[int, UnitStats]:
    """One streaming pass over ``batches`` (model inputs, in evaluation-set order) → ``{layer: UnitStats}``
    (0-based layers, default all), codes read by forward hooks during ``model.forward_features``."""
    POSITIVE.check("k", k, "k counts the top-activating inputs kept per unit")
    sites = code_sites(model)
    chosen = sorted(set(range(len(sites)) if layers is None else layers))
    skip = prefix_tokens(model)
    stores: dict[int, list[Tensor]] = {i: [] for i in chosen}
    handles = [_hook(sites[i][0], sites[i][1], stores[i]) for i in chosen]
    stats: dict[int, UnitStats] = {}
    try:
        with evaluating(model):
            for x in batches:
                model.forward_features(x)
                for i in chosen:
                    code = stores[i].pop()[:, skip:]
                    st = stats.setdefault(i, UnitStats(sites[i][1], code.shape[1], k))
                    st.add(code.reshape(-1, code.shape[-1]))
    finally:
        for h in handles:
            h.remove()
    if not stats:
        raise ValueError("no inputs to measure: the evaluation set is empty")
    return stats


def purity(top_labels: np.ndarray, top_idx: np.ndarray, num_classes: int) -> dict[str, np.ndarray]:
    """Purity ``P_u``, normalised entropy ``H_u`` and majority label of each unit's top-k labels ``(m, k)``;
    NaN (majority −1) for a unit with fewer than ``k`` active tokens (``top_idx`` −1), which is not scored."""
    m, k = top_labels.shape
    scored = (top_idx >= 0).all(1)
    out = {"purity": np.full(m, np.nan), "entropy": np.full(m, np.nan), "majority": np.full(m, -1)}
    norm = np.log(min(num_classes, k)) if min(num_classes, k) > 1 else 1.0
    for u in np.flatnonzero(scored):
        values, counts = np.unique(top_labels[u], return_counts=True)
        p = counts / k
        out["purity"][u] = p.max()
        out["entropy"][u] = float(-(p * np.log(p)).sum() / norm)
        out["majority"][u] = values[np.argmax(counts)]  # np.unique sorts: ties go to the smaller label
    return out


def chance_purity(labels: np.ndarray, k: int, draws: int = 256, seed: int = 0) -> float:
    """The mean purity of ``k`` tokens drawn uniformly (without replacement) from the evaluation set: the
    score of a unit blind to its input, against which ``P_u`` is read."""
    if len(labels) < k:
        return float("nan")
    rng = np.random.default_rng(seed)
    picks = np.stack([labels[rng.choice(len(labels), k, replace=False)] for _ in range(draws)])
    return float(np.mean([np.unique(row, return_counts=True)[1].max() / k for row in picks]))


def dead_fraction(frequency: np.ndarray) -> float:
    """The fraction of units never active on the evaluation set (``f_u = 0``)."""
    return float(np.mean(np.asarray(frequency) == 0))


def always_on_fraction(frequency: np.ndarray, threshold: float = ALWAYS_ON) -> float:
    """The fraction of units active on more than ``threshold`` of the tokens (``f_u > 0.9``)."""
    return float(np.mean(np.asarray(frequency) > threshold))


def layer_summary(st: UnitStats, scores: dict[str, dict[str, np.ndarray]], chance: dict[str, float]) -> dict:
    """A layer's table row: width, dead and always-on fractions, mean frequency, and per label kind (``scores``
    from :func:`purity`) the mean purity and entropy over the scored units, with the chance purity."""
    f = st.frequency
    row = {
        "kind": st.kind,
        "width": st.width,
        "dead": dead_fraction(f),
        "always_on": always_on_fraction(f),
        "mean_frequency": float(f.mean()),
    }
    for name, s in scores.items():
        ok = ~np.isnan(s["purity"])
        row[f"{name}_scored"] = int(ok.sum())
        row[f"{name}_purity"] = float(s["purity"][ok].mean()) if ok.any() else None
        row[f"{name}_entropy"] = float(s["entropy"][ok].mean()) if ok.any() else None
        row[f"{name}_chance"] = None if np.isnan(chance[name]) else chance[name]
    return row


def unit_records(
    st: UnitStats, scores: dict[str, dict[str, np.ndarray]], label_names: dict[str, Callable[[int], str]]
) -> list[dict]:
    """Every unit of a layer as a JSON-ready record: frequency, mean, max, its scores, and its top-k tokens
    as ``[sample, position, activation]`` (position counted after the prefix tokens)."""
    idx, val = st.top()
    n = st.tokens_per_sample
    records = []
    for u in range(st.width):
        rec = {"unit": u, "frequency": float(st.frequency[u]), "mean": float(st.mean[u]), "max": float(st.max[u])}
        for name, s in scores.items():
            p = s["purity"][u]
            rec[f"{name}_purity"] = None if np.isnan(p) else float(p)
            rec[f"{name}_entropy"] = None if np.isnan(p) else float(s["entropy"][u])
            rec[f"{name}_majority"] = None if s["majority"][u] < 0 else label_names[name](int(s["majority"][u]))
        rec["top"] = [[int(t // n), int(t % n), round(float(v), 5)] for t, v in zip(idx[u], val[u]) if t >= 0]
        records.append(rec)
    return records


def png_data_url(image: Tensor) -> str:
    """A ``(C, H, W)`` image in [0, 1] (1 or 3 channels) as a ``data:image/png;base64`` URL."""
    from PIL import Image

    arr = (image.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    pil = Image.fromarray(arr[..., 0] if arr.shape[-1] == 1 else arr[..., :3])
    buf = io.BytesIO()
    pil.save(buf, format="PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def render_dashboard(data: dict, title: str = "CRATE features") -> str:
    """The self-contained ``features.html`` (inline CSS/JS, images as data URLs, no network) showing ``data``:
    the report of ``crate features`` plus ``images`` (data URLs) or ``contexts`` for the top tokens."""
    template = resources.files(__package__).joinpath("features_template.html").read_text(encoding="utf-8")
    payload = json.dumps(data, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    return template.replace("__TITLE__", html.escape(title)).replace("__DATA__", payload)


def _layer_reports(
    stats: dict[int, UnitStats],
    labels: dict[str, np.ndarray],
    num_classes: dict[str, int],
    names: dict[str, Callable[[int], str]],
    seed: int,
) -> list[dict]:
    """Score every collected layer against each kind of per-token label (``labels[kind]`` indexed by token)."""
    out = []
    for i, st in sorted(stats.items()):
        idx, _ = st.top()
        scores = {kind: purity(y[np.maximum(idx, 0)], idx, num_classes[kind]) for kind, y in labels.items()}
        chance = {kind: chance_purity(y, st.k, seed=seed) for kind, y in labels.items()}
        out.append(
            {"layer": i + 1, "summary": layer_summary(st, scores, chance), "units": unit_records(st, scores, names)}
        )
    return out


def _report(model: nn.Module, stats: dict[int, UnitStats], kinds: list[str], n_samples: int) -> dict:
    st = next(iter(stats.values()))
    return {
        "model": {"arch": model.config.arch, "depth": len(model.layers), "params": model.num_params()},
        "k": st.k,
        "always_on": ALWAYS_ON,
        "label_kinds": kinds,
        "n_samples": n_samples,
        "tokens_per_sample": st.tokens_per_sample,
        "n_tokens": st.n_tokens,
    }


def image_features(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    classes: list[str] | None = None,
    normalization: tuple | None = None,
    k: int = 16,
    batch_size: int = 128,
    layers: Iterable[int] | None = None,
    seed: int = 0,
) -> tuple[dict, dict]:
    """Features of an image classifier on ``images`` ((N, C, H, W) in [0, 1]) labelled ``labels`` (N,):
    ``(report, assets)``, the report JSON-ready (per layer: the summary row and every unit's record, purity
    against the image's class), the assets what the dashboard shows (the top images as PNG data URLs)."""
    from ..data.base import class_count
    from ._common import model_device, normalize_images

    if images.dim() != 4 or len(images) != len(labels):
        raise ValueError(f"expected (N, C, H, W) images and N labels, got {tuple(images.shape)}, {tuple(labels.shape)}")
    device = model_device(model)
    batches = (normalize_images(x, normalization).to(device) for x in images.split(batch_size))
    stats = collect(model, batches, k=k, layers=layers)
    st = next(iter(stats.values()))
    y = labels.cpu().numpy().astype(np.int64)
    token_labels = np.repeat(y, st.tokens_per_sample)
    if not classes:
        classes = [str(c) for c in range(class_count(y, "the labels", "pass class indices or name the classes"))]
    elif (bad := next((int(c) for c in y if not 0 <= c < len(classes)), None)) is not None:
        raise ValueError(f"label {bad} is not one of the {len(classes)} classes {classes[:5]}; check the labels")
    report = _report(model, stats, ["class"], len(images))
    report["layers"] = _layer_reports(
        stats, {"class": token_labels}, {"class": len(classes)}, {"class": lambda c: classes[c]}, seed
    )
    used = sorted({t[0] for layer in report["layers"] for u in layer["units"] for t in u["top"]})
    p = model.config.patch_size
    assets = {
        "images": {str(s): png_data_url(images[s]) for s in used},
        "labels": {str(s): classes[int(y[s])] for s in used},
        "patch": p,
        "grid": [images.shape[-2] // p, images.shape[-1] // p],
    }
    return report, assets


def text_features(
    model: nn.Module,
    blocks: Tensor,
    *,
    tokenizer: object | None = None,
    k: int = 16,
    batch_size: int = 32,
    layers: Iterable[int] | None = None,
    context: int = 12,
    seed: int = 0,
) -> tuple[dict, dict]:
    """Features of a language model on ``blocks`` ((N, n + 1) token ids: each row is ``n`` inputs and the token
    that follows them): ``(report, assets)`` as :func:`image_features`, purity against the token itself and
    against the next token, the assets each top token in ``context`` tokens either side of it."""
    if blocks.dim() != 2 or blocks.shape[1] < 2:
        raise ValueError(f"expected (N, n + 1) token ids with n >= 1, got shape {tuple(blocks.shape)}")
    device = next(model.parameters()).device
    inputs, nxt = blocks[:, :-1], blocks[:, 1:]
    stats = collect(model, (x.to(device) for x in inputs.split(batch_size)), k=k, layers=layers)
    vocab = model.config.vocab_size
    strings = tokenizer.token_strings if tokenizer is not None else (lambda ids: [f"<{i}>" for i in ids])
    name = lambda i: strings([i])[0]  # noqa: E731
    labels = {"token": inputs.reshape(-1).numpy(), "next_token": nxt.reshape(-1).numpy()}
    report = _report(model, stats, ["token", "next_token"], len(blocks))
    report["layers"] = _layer_reports(
        stats, labels, {"token": vocab, "next_token": vocab}, {"token": name, "next_token": name}, seed
    )
    n = inputs.shape[1]
    contexts = {}
    for layer in report["layers"]:
        for u in layer["units"]:
            for s, pos, _ in u["top"]:
                if f"{s}:{pos}" not in contexts:
                    row = inputs[s].tolist()
                    left, right = row[max(0, pos - context) : pos], row[pos + 1 : min(n, pos + 1 + context)]
                    contexts[f"{s}:{pos}"] = ["".join(strings(left)), strings([row[pos]])[0], "".join(strings(right))]
    return report, {"contexts": contexts}


def summary_table(report: dict) -> str:
    """The per-layer table of a :func:`image_features` / :func:`text_features` report as aligned text; with the
    effects (:func:`~crate_transformer.analysis.effects.attach_effects`) the layer's mean prediction flip and Δloss
    when one unit is ablated, and Spearman's ρ of purity and flip over the scored units."""
    kinds = report["label_kinds"]
    effects = "effects" in report  # crate features --effects: the mean effect and its rank agreement with purity
    head = ["layer", "units", "width", "dead", "always-on", "mean freq"]
    for kind in kinds:
        head += [f"{kind} purity", "chance", "scored"]
    head += ["flip", "Δloss", *[f"{kind} purity~flip" for kind in kinds]] if effects else []
    rows = [head]
    for layer in report["layers"]:
        s = layer["summary"]
        row = [str(layer["layer"]), s["kind"], str(s["width"]), f"{s['dead']:.3f}", f"{s['always_on']:.3f}"]
        row.append(f"{s['mean_frequency']:.3f}")
        for kind in kinds:
            p, c = s[f"{kind}_purity"], s[f"{kind}_chance"]
            row += ["-" if p is None else f"{p:.3f}", "-" if c is None else f"{c:.3f}", str(s[f"{kind}_scored"])]
        if effects:
            rho = [s.get(f"{kind}_purity_vs_flip") for kind in kinds]
            row += [
                f"{s['effect_flip']:.4f}",
                f"{s['effect_loss']:+.4f}",
                *["-" if r is None else f"{r:+.2f}" for r in rho],
            ]
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)
