"""Did the paper's claims hold?  One :class:`Verdict` per claim, decided by a stated rule on measured numbers.

The white-box report measures; this module decides.  Each rule compares a per-sample quantity at the first
and at the last layer (or, for the CRATE-MAE decoder, a layer-wise inverse against a do-nothing baseline) and
asks whether the change exceeds its noise, and whether it exceeds what **an untrained network of the same
architecture** does (a :class:`Baseline`: built from the checkpoint's config with a stated seed and measured on
the same samples, whatever the checkpoint's origin — trained from scratch, fine-tuned, pre-trained by MAE or
DINO, loaded from the authors' files): a random network can already "compress" or "sparsify" with depth, and
only the change beyond that is what training (the paper's objective) did.  A fine-tuned run also says how each
claim moved from its **starting checkpoint** (measured on the same samples when its file still loads, else the
run's own step-0 records), labelled as such; that
comparison is reported, not part of the rule.  A single run gives no seeds to
compare, so the noise is the spread of the mean over **bootstrap resamples of the evaluated samples** (images
or token blocks): the paired per-sample differences are resampled with replacement ``n_boot`` times (seeded,
so the report is reproducible) and the noise is twice the standard deviation of the resampled means (≈ 2
standard errors).

* **compression** (JMLR §4.2, Figs. 14-15; ``R^c`` of eq. (13)): ``R^c`` of the MSSA input falls from
  layer 1 to layer L by more than its noise, and by more than in the untrained network (beyond the joint noise
  ``√(noise² + noise₀²)``);
* **sparsity** (Figs. 14-15, ``‖Z^{ℓ+1}‖₀/(d·n)``): the same rule for the non-zero fraction of the ISTA
  output (only where the layers end with ISTA: other outputs have no exact zeros);
* both name the layers where the curve goes up instead of down (a rise from layer ℓ to ℓ+1 beyond its noise),
  which the first-to-last rule alone would hide;
* **incoherence** (§4.2, pp.49-50, Fig. 17): at every layer, the mean block coherence between different
  heads' subspaces is below that of random subspaces of the same sizes by more than twice its spread over
  seeded random draws (the initial model's coherence is shown beside it);
* **decoder** (§3.5, eqs. (62)-(64)): the output of decoder layer ``L-ℓ`` (chained from the encoder's output) is
  closer to the encoder's ``Z^ℓ`` than that decoder layer's input is (linear CKA of the image's tokens, which does
  not depend on the decoder's basis) by more than its noise, at every layer.

A verdict is ``holds``, ``fails`` or ``not applicable at this scale`` (fewer than :data:`MIN_SAMPLES`
samples or fewer than 2 layers: nothing to compare or no noise estimate).  :func:`rate_reduction_note`
explains, with the formula, why the rate reduction ``ΔR`` of eq. (14) is negative when it is.

Every verdict says its direction in words ("training reduced the drop by 0.202; the untrained network already
gets sparser"), names its reference (:attr:`Verdict.reference`) and has a one-line :attr:`Verdict.summary` with
the figures, which the report and ``crate analyze`` print first (the rule one click away).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .measure import LayerTable

__all__ = [
    "HOLDS",
    "FAILS",
    "NOT_APPLICABLE",
    "MIN_SAMPLES",
    "Verdict",
    "paired_drop",
    "compression_verdict",
    "layer_claims",
    "sparsity_verdict",
    "decoder_verdict",
    "incoherence_verdict",
    "random_coherence",
    "Baseline",
    "baseline_from_table",
    "baseline_from_cka",
    "baseline_from_records",
    "rate_reduction_note",
    "format_verdicts",
]

HOLDS, FAILS, NOT_APPLICABLE = "holds", "fails", "not applicable at this scale"
MIN_SAMPLES = 4  # below this the bootstrap spread says nothing about the noise
N_BOOT = 2000

COMPRESSION_CLAIM = (
    "each layer compresses the tokens against its subspaces: R^c (eq. (13)) decreases with depth (Figs. 14-15)"
)
VARIATIONAL_CLAIM = (
    "each TSSA layer compresses the tokens: the variational compression term R^c_var that TSSA descends decreases "
    "with depth (ToST, Wu et al., ICLR 2025)"
)
SPARSITY_CLAIM = "the ISTA outputs get sparser with depth: ||Z^(l+1)||_0/(d n) decreases (Figs. 14-15, eq. (17))"
DECODER_CLAIM = "decoder layer L-l undoes encoder layer l (§3.5, eqs. (62)-(64))"
INCOHERENCE_CLAIM = "the subspaces U_k of different heads are incoherent, close to orthogonal (Fig. 17, eqs. (10)-(11))"
RANDOM_DRAWS = 200
CLAIM_NAMES = {
    COMPRESSION_CLAIM: "compression",
    VARIATIONAL_CLAIM: "variational compression",
    SPARSITY_CLAIM: "sparsity",
    DECODER_CLAIM: "decoder as inverse",
    INCOHERENCE_CLAIM: "incoherence",
}
NOISE_WORDS = f"noise = 2 x the std of the mean over {N_BOOT} bootstrap resamples of the samples (seed 0)"


@dataclass(frozen=True)
class Verdict:
    """One claim of the paper, the numbers measured for it and whether it held (``verdict``) by ``rule``.

    ``name``: the claim in one word ("compression"); ``summary``: one line with the figures (what the report and
    ``crate analyze`` show first); ``reference``: what the claim was compared with, in words (the untrained network
    of the same architecture, with its seed)."""

    section: str
    claim: str
    verdict: str
    rule: str
    explanation: str
    measured: dict = field(default_factory=dict)
    name: str = ""
    summary: str = ""
    reference: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in (HOLDS, FAILS, NOT_APPLICABLE):
            raise ValueError(f"verdict must be {HOLDS!r}, {FAILS!r} or {NOT_APPLICABLE!r}, got {self.verdict!r}")

    @property
    def tag(self) -> str:
        """``[holds]`` / ``[FAILS]`` / ``[n/a]``, as the theory lab prints its checks."""
        return {HOLDS: "[holds]", FAILS: "[FAILS]"}.get(self.verdict, "[n/a]")

    def line(self) -> str:
        """One line: the tag, the model and the claim's name, then its figures (the full claim without a summary)."""
        if self.summary:
            return f"{self.tag} {self.section}, {self.name or 'claim'}: {self.summary}"
        return f"{self.tag} {self.section}: {self.claim}. {self.explanation}"

    def to_dict(self) -> dict:
        return asdict(self)


def format_verdicts(verdicts: Sequence[Verdict], notes: Sequence[str] = ()) -> str:
    """The verdicts (and notes) as printed by ``crate analyze``: one line each."""
    return "\n".join([*(v.line() for v in verdicts), *(f"note: {n}" for n in notes)])


def paired_drop(before: np.ndarray, after: np.ndarray, n_boot: int = N_BOOT, seed: int = 0) -> tuple[float, float]:
    """Mean of ``before − after`` over samples and its noise (2 × the bootstrap std of that mean)."""
    diff = np.asarray(before, dtype=np.float64) - np.asarray(after, dtype=np.float64)
    mean = math.fsum(diff) / len(diff)
    idx = np.random.default_rng(seed).integers(0, len(diff), size=(n_boot, len(diff)))
    return mean, 2.0 * float(diff[idx].mean(1).std(ddof=1))


@dataclass(frozen=True)
class Baseline:
    """The same measurement on a reference network, per metric: the per-layer means and the first-to-last drop with
    its noise.  ``source`` says where it comes from, in words; ``label`` names it in a sentence ("the untrained
    network"), ``by`` what turned it into the measured model ("training", "fine-tuning").

    ``kind``: :data:`UNTRAINED` — an untrained network of the same architecture, the reference every verdict's rule
    compares with — or :data:`START` — a fine-tuned run's starting checkpoint (its step 0), which a verdict reports
    beside it without deciding by it."""

    source: str
    per_layer: dict[str, list[float]]
    drop: dict[str, tuple[float, float]]
    label: str = "the untrained network"
    by: str = "training"
    kind: str = "untrained"


UNTRAINED, START = "untrained", "start"
START_LABEL = "the starting checkpoint"
BASELINE_METRICS = ("rc_in", "rvar_in", "nonzero")  # what the verdicts compare with the reference


def baseline_from_table(
    table: LayerTable,
    source: str,
    metrics: Sequence[str] = BASELINE_METRICS,
    *,
    start: bool = False,
    by: str = "fine-tuning",
) -> Baseline:
    """From per-sample measurements (an untrained network, or a fine-tuned run's starting checkpoint, on the
    report's own samples): the drop and its noise exactly as for the measured model (:func:`paired_drop`).
    ``start``: the table is a starting checkpoint's (:data:`START`, reported beside the verdict), and ``by`` what
    turned it into the measured model ("fine-tuning", "continued pre-training")."""
    present = [m for m in metrics if m in table.values]
    per_layer = {m: [float(v) for v in table.mean(m)] for m in present}
    drop = {m: paired_drop(table.values[m][:, 0], table.values[m][:, -1]) for m in present}
    if start:
        return Baseline(source, per_layer, drop, START_LABEL, by, START)
    return Baseline(source, per_layer, drop)


def baseline_from_cka(
    cka_out: np.ndarray, cka_in: np.ndarray, source: str, *, start: bool = False, by: str = "fine-tuning"
) -> Baseline:
    """The decoder claim's measurement on a reference network (per-image CKA of each decoder layer's output and
    input with the encoder's ``Z^l``, (N, L) as :func:`decoder_verdict` takes them): per layer the mean CKA gain
    over the do-nothing baseline (``per_layer["cka_gain"]``) and, as its ``drop``, the gain averaged over the
    layers with its noise.  ``start``: as in :func:`baseline_from_table`."""
    out, inp = np.asarray(cka_out, dtype=np.float64), np.asarray(cka_in, dtype=np.float64)
    gains = [paired_drop(out[:, j], inp[:, j]) for j in range(out.shape[1])]
    mean = paired_drop(out.mean(1), inp.mean(1)) if out.shape[0] >= MIN_SAMPLES else (float("nan"),) * 2
    per_layer, drop = {"cka_gain": [m for m, _ in gains]}, {"cka_gain": mean}
    if start:
        return Baseline(source, per_layer, drop, START_LABEL, by, START)
    return Baseline(source, per_layer, drop)


def baseline_from_records(
    records: Sequence[dict],
    source: str,
    metrics: Sequence[str] = BASELINE_METRICS,
    *,
    start: bool = False,
    by: str = "fine-tuning",
) -> Baseline:
    """From one logged measurement (per-layer mean, std and sample count, e.g. a run's step-0 records in
    ``metrics.jsonl``): the per-sample pairs are gone, so the noise of the drop is that of two independent means,
    ``2·√((s₁² + s_L²)/n)`` (an upper bound when the layers are positively correlated, as they are).
    ``start``: the records are a fine-tuned run's starting checkpoint (:data:`START`), reported beside the verdict
    (``by``: as in :func:`baseline_from_table`)."""
    recs = sorted(records, key=lambda r: r["layer"])
    present = [m for m in metrics if recs and m in recs[0]]
    n = max(int(recs[0].get("n_samples", 1)), 1) if recs else 1
    drop = {}
    for m in present:
        first, last = recs[0], recs[-1]
        noise = 2.0 * math.sqrt((first.get(f"{m}_std", 0.0) ** 2 + last.get(f"{m}_std", 0.0) ** 2) / n)
        drop[m] = (float(first[m]) - float(last[m]), noise)
    per_layer = {m: [float(r[m]) for r in recs] for m in present}
    if start:
        return Baseline(source, per_layer, drop, START_LABEL, by, START)
    return Baseline(source, per_layer, drop)


@dataclass(frozen=True)
class Words:
    """How a verdict speaks of one metric: its name, and what a fall and a rise of it mean."""

    name: str
    short: str
    down: str
    up: str


RC_WORDS = Words("R^c (rc_in)", "R^c", "compresses", "decompresses")
RVAR_WORDS = Words("R^c_var (rvar_in)", "R^c_var", "compresses", "decompresses")
NONZERO_WORDS = Words("the non-zero fraction", "non-zero fraction", "gets sparser", "gets denser")


def _rises(values: np.ndarray) -> list[tuple[int, float, float]]:
    """The steps ℓ → ℓ+1 (1-based ℓ) where the per-sample values rise by more than the noise of that step."""
    out = []
    for j in range(values.shape[1] - 1):
        drop, noise = paired_drop(values[:, j], values[:, j + 1])
        if -drop > noise:
            out.append((j + 1, -drop, noise))
    return out


def _too_small(values: np.ndarray) -> str | None:
    n, layers = values.shape
    if layers < 2:
        return f"the model has {layers} layer: there is no first-to-last change to measure"
    if n < MIN_SAMPLES:
        return f"{n} sample(s) measured: at least {MIN_SAMPLES} are needed to estimate the noise"
    return None


def _trend(words: Words, drop: float, noise: float) -> str:
    """What a first-to-last drop says, in words: the metric falls, rises or stays (within its noise)."""
    if drop > noise:
        return words.down
    return words.up if -drop > noise else "stays flat within its noise"


def _versus(by: str, drop: float, ref: tuple[float, float], noise: float) -> tuple[str, float, float]:
    """``("training reduced the drop by 0.202, beyond the joint noise 0.0023", delta, joint)``: how the measured
    drop compares with a reference's drop, the direction in words (never a signed number)."""
    delta, joint = drop - ref[0], math.hypot(noise, ref[1])
    verb = "increased" if delta > 0 else "reduced"
    where = "beyond" if abs(delta) > joint else "within"
    return f"{by} {verb} the drop by {abs(delta):.3g}, {where} the joint noise {joint:.2g}", delta, joint


def _change(drop: float, of: str = "") -> str:
    """``"drop 0.12"`` or ``"rise 0.0067"``: a first-to-last change in words, never a signed number."""
    return f"drop{of} {drop:.3g}" if drop >= 0 else f"rise{of} {-drop:.3g}"


def _span(per_layer: Sequence[float]) -> str:
    return f"{per_layer[0]:.4g} -> {per_layer[-1]:.4g}"


def _compared(base: Baseline, metric: str, drop: float, noise: float, words: Words) -> tuple[str, str, dict, float]:
    """The sentence of the explanation, the clause of the summary, the ``measured`` entry and the change beyond the
    joint noise (> 0: the measured drop exceeds the reference's) for one reference."""
    layers, ref = base.per_layer[metric], base.drop[metric]
    text, delta, joint = _versus(base.by, drop, ref, noise)
    trend = _trend(words, *ref)
    if base.kind == UNTRAINED and ref[0] > ref[1]:  # the claim's direction without any training
        trend = f"already {trend}"
    sentence = (
        f"{'Reference,' if base.kind == UNTRAINED else 'From'} {base.source}: {_span(layers)} ({_change(ref[0])}, "
        f"noise {ref[1]:.2g}): {base.label} {trend}; {text}"
    )
    short = "untrained" if base.kind == UNTRAINED else "starting checkpoint"
    clause = f"{short} {_span(layers)} ({trend}): {text}"
    entry = {"per_layer_mean": layers, "drop": ref[0], "noise": ref[1], "source": base.source, "change": delta}
    return sentence, clause, entry, delta - joint


def _drop_verdict(
    section: str,
    claim: str,
    values: np.ndarray,
    words: Words,
    rule: str,
    refs: tuple[tuple[Baseline | None, Baseline | None], str] = ((None, None), ""),
) -> Verdict:
    """``holds`` when the per-sample ``values`` (N, L) fall from layer 1 to layer L by more than their noise and,
    given the untrained reference, by more than it falls there beyond the joint noise.  ``refs``: ((untrained
    reference, starting checkpoint), metric); the starting checkpoint is reported, not decided by."""
    (base, start), metric = refs
    values, name = np.asarray(values, dtype=np.float64), words.name
    reason = _too_small(values)
    per_layer = [round(math.fsum(values[:, j]) / len(values), 6) for j in range(values.shape[1])]
    measured: dict = {"per_layer_mean": per_layer, "samples": int(values.shape[0])}
    ref_words = "; beside it ".join(r.source for r in (base, start) if r is not None) or "none"
    if reason:
        return Verdict(section, claim, NOT_APPLICABLE, rule, reason + ".", measured, _name(claim), reason, ref_words)
    drop, noise = paired_drop(values[:, 0], values[:, -1])
    rises = _rises(values)
    measured.update(first=per_layer[0], last=per_layer[-1], drop=drop, noise=noise, rises=[r[0] for r in rises])
    L, span = values.shape[1], _span(per_layer)
    if drop > noise:
        why = f"{name} falls {span} from layer 1 to {L} (drop {drop:.3g} > noise {noise:.3g})"
    elif -drop > noise:
        why = f"{name} rises {span} from layer 1 to {L} (by {-drop:.3g}, noise {noise:.3g}): the opposite of the claim"
    else:
        why = f"{name} changes {span} from layer 1 to {L}: a {_change(drop, ' of')}, within the noise {noise:.3g}"
    summary = f"{words.short} {span} ({_trend(words, drop, noise)}; {_change(drop)} ± {noise:.2g})"
    if rises and len(rises) < values.shape[1] - 1:  # some steps up, some down (all up: said above)
        steps = ", ".join(f"{j} -> {j + 1} (+{r:.3g}, noise {n:.2g})" for j, r, n in rises)
        why += f"; not monotone: it rises from layer {steps}"
        summary += f", rising at layer {', '.join(f'{j} -> {j + 1}' for j, _, _ in rises)}"
    holds = drop > noise
    for ref in (base, start):
        if ref is not None:
            sentence, clause, entry, beyond = _compared(ref, metric, drop, noise, words)
            why, summary = f"{why}. {sentence}", f"{summary}; {clause}"
            measured["initialisation" if ref.kind == UNTRAINED else "starting_checkpoint"] = entry
            holds = holds and (beyond > 0 or ref.kind != UNTRAINED)
    verdict = HOLDS if holds else FAILS
    return Verdict(section, claim, verdict, rule, why + ".", measured, _name(claim), summary, ref_words)


def _name(claim: str) -> str:
    """The claim in a word or two, as the one-line summary names it."""
    return CLAIM_NAMES.get(claim, "claim")


def _rule(what: str, with_base: bool) -> str:
    rule = (
        f"holds if the mean over samples of {what} at layer 1 minus that at layer L exceeds its noise ({NOISE_WORDS})"
    )
    if with_base:
        rule += (
            " and exceeds the same drop of an untrained network of the same architecture (built from the "
            "checkpoint's config with the stated seed, measured on the same samples) by more than the joint noise "
            "sqrt(noise^2 + noise_ref^2); a fine-tuned run's starting checkpoint is reported beside it, "
            "not decided by"
        )
    return rule + "; fails otherwise. Layers where it rises beyond the noise of that step are named"


def compression_verdict(
    table: LayerTable,
    section: str,
    metric: str = "rc_in",
    baseline: Baseline | None = None,
    start: Baseline | None = None,
) -> Verdict:
    """Compression (Figs. 14-15): the per-sample ``R^c`` (eq. (13); default the MSSA input, as the official
    measurement code and the report's plots) falls from the first to the last layer by more than its noise and,
    given a ``baseline`` (the untrained network), by more than there; ``start``: a fine-tuned run's starting
    checkpoint, whose drop is stated beside.  ``metric="rvar_in"``: ToST's claim, the same rule on the variational
    term its TSSA layers descend."""
    base, begin = _base(baseline, metric), _base(start, metric)
    words = RVAR_WORDS if metric.startswith("rvar") else RC_WORDS
    if metric not in ("rc_in", "rvar_in"):
        words = Words(f"{words.short} ({metric})", words.short, words.down, words.up)
    claim = VARIATIONAL_CLAIM if metric.startswith("rvar") else COMPRESSION_CLAIM
    rule = _rule(words.name, base is not None)
    return _drop_verdict(section, claim, table.values[metric], words, rule, ((base, begin), metric))


def layer_claims(
    table: LayerTable, section: str, baseline: Baseline | None = None, start: Baseline | None = None
) -> list[Verdict]:
    """The layer-wise verdicts of one measured split: compression (``R^c``), ToST's variational compression where
    it was measured (``rvar_in``), sparsity; each against ``baseline`` (the untrained network) and, for a
    fine-tuned run, with the move from ``start`` (its starting checkpoint)."""
    out = [compression_verdict(table, section, baseline=baseline, start=start)]
    if "rvar_in" in table.values:
        out.append(compression_verdict(table, section, "rvar_in", baseline, start))
    return out + [sparsity_verdict(table, section, baseline=baseline, start=start)]


def sparsity_verdict(
    table: LayerTable, section: str, baseline: Baseline | None = None, start: Baseline | None = None
) -> Verdict:
    """Sparsity (Figs. 14-15): the non-zero fraction of the ISTA output falls from the first to the last layer by
    more than its noise (and, given a ``baseline``, by more than in the untrained network).  Not applicable where
    the layers do not end with ISTA (no exact zeros to count)."""
    base, begin = _base(baseline, "nonzero"), _base(start, "nonzero")
    rule = _rule(NONZERO_WORDS.name, base is not None)
    values = table.values["nonzero"]
    if not table.meta.get("ista_output", False) and float(np.min(values)) >= 1.0:
        why = "these layers do not end with an ISTA block, so their outputs have no exact zeros to count."
        ref = base.source if base is not None else "none"
        measured = {"samples": int(values.shape[0])}
        return Verdict(section, SPARSITY_CLAIM, NOT_APPLICABLE, rule, why, measured, "sparsity", why, ref)
    return _drop_verdict(section, SPARSITY_CLAIM, values, NONZERO_WORDS, rule, ((base, begin), "nonzero"))


def _base(baseline: Baseline | None, metric: str) -> Baseline | None:
    return baseline if baseline is not None and metric in baseline.drop else None


def random_coherence(
    heads: int, dim: int, dim_head: int, draws: int = RANDOM_DRAWS, seed: int = 0
) -> tuple[float, float]:
    """Mean and std, over ``draws`` seeded draws, of the mean block coherence ``‖Q_iᵀQ_j‖_F/√p`` (i ≠ j) of
    ``heads`` independent uniformly random ``dim_head``-dimensional subspaces of ``R^dim`` (≈ ``√(p/d)``)."""
    g = torch.Generator().manual_seed(seed)
    Q = torch.linalg.qr(torch.randn(draws, heads, dim, dim_head, generator=g, dtype=torch.float64)).Q
    C = torch.einsum("bidp,bjdq->bijpq", Q, Q).flatten(3).norm(dim=-1) / math.sqrt(dim_head)
    off = ~torch.eye(heads, dtype=torch.bool)
    means = C[:, off].mean(-1)
    return float(means.mean()), float(means.std())


def incoherence_verdict(
    rows: Sequence[dict],
    section: str,
    initial: Sequence[dict] | None = None,
    draws: int = RANDOM_DRAWS,
    initial_words: str = "the untrained network",
    start: tuple[str, Sequence[dict]] | None = None,
    start_by: str = "fine-tuning",
) -> Verdict:
    """Incoherence (Fig. 17): at every layer the mean cross-head block coherence (rows of
    :func:`~crate_transformer.analysis.subspaces.incoherence`) is below that of random subspaces of the same
    sizes by more than twice its spread over ``draws`` seeded draws (the reference).  ``initial``: the same rows for
    an untrained network of the same architecture (``initial_words`` names it), stated beside it; ``start``: (words,
    rows) of a fine-tuned run's starting checkpoint, stated beside too, with how ``start_by`` (what turned it into
    the measured model: "fine-tuning") moved the mean coherence."""
    rule = (
        "holds if at every layer the mean block coherence ||Q_i^T Q_j||_F/sqrt(p) between different heads is below "
        f"the mean for random subspaces of the same sizes by more than 2 x its std over {draws} seeded draws; "
        "fails otherwise"
    )
    first = rows[0]
    K, d, p = first["heads"], first["dim"], first["dim_head"]
    measured: dict = {"per_layer": [r["mean_cross_coherence"] for r in rows]}
    reference = f"random subspaces of the same sizes ({draws} seeded draws)"
    if initial:
        measured["initialisation"] = [r["mean_cross_coherence"] for r in initial]
        reference += f"; beside it {initial_words}"
    if start:
        reference += f"; beside it {start[0]}"
    named = {"name": "incoherence", "reference": reference}
    if K < 2:
        why = "one head: no pair of subspaces."
        return Verdict(section, INCOHERENCE_CLAIM, NOT_APPLICABLE, rule, why, measured, summary=why, **named)
    mean, std = random_coherence(K, d, p, draws)
    measured.update(random_mean=mean, random_std=std)
    threshold = mean - 2 * std
    coherent = [r["layer"] for r in rows if not r["mean_cross_coherence"] < threshold]
    values = ", ".join(f"{r['mean_cross_coherence']:.3f}" for r in rows)
    why = f"mean cross-head coherence per layer {values}; random subspaces {mean:.3f} ± {std:.2g}"
    why += f" (K = {K}, p = {p}, d = {d})"
    summary = f"coherence {values} per layer, random subspaces {mean:.3f} ± {std:.2g}"
    if initial:
        init = ", ".join(f"{r['mean_cross_coherence']:.3f}" for r in initial)
        why += f"; {initial_words} {init}"
        summary += f", untrained {init}"
    if start:
        words, rows0 = start
        begin = ", ".join(f"{r['mean_cross_coherence']:.3f}" for r in rows0)
        measured["starting_checkpoint"] = {"source": words, "per_layer": [r["mean_cross_coherence"] for r in rows0]}
        moved = np.mean([r["mean_cross_coherence"] for r in rows]) - np.mean([r["mean_cross_coherence"] for r in rows0])
        how = f"{start_by} {'raised' if moved > 0 else 'lowered'} the mean coherence by {abs(moved):.3g}"
        why += f"; {words} {begin} ({how})"
        summary += f", starting checkpoint {begin} ({how})"
    if not coherent:
        tail = ": below chance at every layer"
        return Verdict(
            section, INCOHERENCE_CLAIM, HOLDS, rule, why + tail + ".", measured, summary=summary + tail, **named
        )
    tail = f": not below chance by 2 std at layer(s) {', '.join(map(str, coherent))}"
    return Verdict(section, INCOHERENCE_CLAIM, FAILS, rule, why + tail + ".", measured, summary=summary + tail, **named)


def decoder_verdict(
    sim_out: np.ndarray, sim_in: np.ndarray, section: str = "CRATE-MAE decoder", beside: Sequence[Baseline] = ()
) -> Verdict:
    """Decoder as inverse (§3.5, eqs. (62)-(64)): at **every** layer, CKA(decoder layer L-ℓ's output, ``Z^ℓ``)
    exceeds CKA(that layer's input, ``Z^ℓ``) — the do-nothing baseline — by more than its noise.

    Inputs: per-image similarities (N, L), column ℓ for encoder layer ℓ (:func:`~.decoder.decoder_inversion` with
    ``per_image=True``).  Linear CKA is used because nothing ties the decoder's coordinates to the encoder's
    (Remark 7): it does not change when either basis is rotated or rescaled.  ``beside``: the same measurement
    on reference networks (:func:`baseline_from_cka`: the untrained network, a run's starting checkpoint), each
    stated with how the mean CKA gain moved from it; the rule does not use them."""
    rule = (
        "at every layer l, the mean over images of CKA(output of decoder layer L-l, Z^l) - CKA(input of decoder layer "
        "L-l, Z^l) (linear CKA over the image's tokens: unchanged by rotating or rescaling either basis; the layer's "
        f"input is the do-nothing baseline) exceeds its noise ({NOISE_WORDS}); fails otherwise"
    )
    out, inp = np.asarray(sim_out, dtype=np.float64), np.asarray(sim_in, dtype=np.float64)
    measured: dict = {
        "cka_out_per_layer": [round(float(v), 6) for v in out.mean(0)],
        "cka_in_per_layer": [round(float(v), 6) for v in inp.mean(0)],
        "samples": int(out.shape[0]),
    }
    reference = "; beside it ".join(["the do-nothing baseline (each decoder layer's own input)"] + [
        b.source for b in beside])  # fmt: skip
    named = {"name": "decoder as inverse", "reference": reference}
    if out.shape[0] < MIN_SAMPLES:
        why = f"{out.shape[0]} image(s): at least {MIN_SAMPLES} are needed to estimate the noise."
        return Verdict(section, DECODER_CLAIM, NOT_APPLICABLE, rule, why, measured, summary=why, **named)
    per_layer = [paired_drop(out[:, j], inp[:, j]) for j in range(out.shape[1])]
    measured.update(margin_per_layer=[m for m, _ in per_layer], noise_per_layer=[n for _, n in per_layer])
    closer = [j + 1 for j, (m, n) in enumerate(per_layer) if m > n]
    margins = ", ".join(f"{m:+.3g} (noise {n:.2g})" for m, n in per_layer)
    summary = f"CKA gain over the do-nothing baseline per encoder layer {margins}"
    if len(closer) == len(per_layer):
        why = f"every decoder layer moves its input toward the encoder's Z^l; CKA gain per encoder layer: {margins}"
    else:
        where = f"only at encoder layer(s) {', '.join(map(str, closer))}" if closer else "at no layer"
        why = (
            f"the decoder layers bring their input closer to the encoder's Z^l beyond the noise {where}; CKA gain "
            f"per encoder layer: {margins}"
        )
        summary += f": closer {where}"
    gain = paired_drop(out.mean(1), inp.mean(1))  # the gain averaged over the layers, per image
    for base in beside:
        sentence, clause, entry = _decoder_beside(base, gain)
        why, summary = f"{why}. {sentence}", f"{summary}; {clause}"
        measured["initialisation" if base.kind == UNTRAINED else "starting_checkpoint"] = entry
    verdict = HOLDS if len(closer) == len(per_layer) else FAILS
    return Verdict(section, DECODER_CLAIM, verdict, rule, why + ".", measured, summary=summary, **named)


def _decoder_beside(base: Baseline, gain: tuple[float, float]) -> tuple[str, str, dict]:
    """The sentence, summary clause and ``measured`` entry of one reference of the decoder claim: its CKA gain
    per layer and how the measured mean gain moved from it, in words (never a signed number)."""
    layers, ref = base.per_layer["cka_gain"], base.drop["cka_gain"]
    delta, joint = gain[0] - ref[0], math.hypot(gain[1], ref[1])
    verb = "raised" if delta > 0 else "lowered"
    moved = f"{base.by} {verb} the mean CKA gain by {abs(delta):.3g}, "
    moved += f"{'beyond' if abs(delta) > joint else 'within'} the joint noise {joint:.2g}"
    values = ", ".join(f"{m:+.3g}" for m in layers)
    lead = "Beside it," if base.kind == UNTRAINED else "From"
    sentence = f"{lead} {base.source}: CKA gain per encoder layer {values}; {moved}"
    short = "untrained" if base.kind == UNTRAINED else "starting checkpoint"
    entry = {"source": base.source, "margin_per_layer": layers, "mean_gain": ref[0], "noise": ref[1], "change": delta}
    return sentence, f"{short} {values}: {moved}", entry


def rate_reduction_note(
    tables: LayerTable | Mapping[str, LayerTable], dim: int, heads: int, dim_head: int
) -> str | None:
    """One sentence on why the rate reduction ΔR (eq. (14)) is negative, or None when it is not negative;
    ``tables``: one table, or one per split (``{"train": ..., "test": ...}``), named in the one sentence.

    ``R(Z) = ½ logdet(I + d/(nε²) ZᵀZ)`` (eq. (8)) counts each direction of the tokens once;
    ``R^c(Z|U) = ½ Σ_k logdet(I + p/(nε²) (U_kᵀZ)ᵀ(U_kᵀZ))`` (eq. (13)) counts it again in every head whose
    subspace it is not orthogonal to.  When every token lies in one ``U_k`` of mutually orthogonal orthonormal
    subspaces (the union-of-subspaces model, eqs. (10)-(11)), ``ZZᵀ`` is block-diagonal in the basis
    ``[U_1 … U_K]``, so ``R(Z) = Σ_k ½ logdet(I + d/(nε²) U_kᵀZZᵀU_k) ≥ R^c`` (``d ≥ p``): ΔR ≥ 0.  Tokens whose
    directions straddle several subspaces are counted by several heads, and ΔR can be negative; that is a
    property of the token set, not a numerical error.
    """
    named = tables.items() if isinstance(tables, Mapping) else [("", tables)]
    where = [(name, _negative_layers(t)) for name, t in named]
    where = [f"{layers}{f' on {name}' if name else ''}" for name, layers in where if layers]
    if not where:
        return None
    return (
        f"ΔR = R(Z) - R^c(Z|U) (eq. (14)) is negative at {', and at '.join(where)} "
        "because R(Z) = 1/2 logdet(I + d/(n eps^2) Z^T Z) (eq. (8)) counts each direction of the unit tokens once "
        "while R^c = 1/2 sum_k logdet(I + p/(n eps^2) (U_k^T Z)^T (U_k^T Z)) (eq. (13)) counts it again in each of "
        f"the K = {heads} heads (p = {dim_head}, d = {dim}) whose subspace it is not orthogonal to: ΔR >= 0 is "
        "guaranteed when every token lies in a single U_k of mutually orthogonal orthonormal subspaces (eqs. "
        "(10)-(11)); a negative ΔR says these tokens straddle several heads' subspaces (or the U_k are far from "
        "orthonormal), so "
        "the per-head rates sum to more than the full rate."
    )


def _negative_layers(table: LayerTable) -> str:
    """``"layer(s) 1, 2 (min -3)"`` where the mean ΔR of ``table`` is negative, else ``""``."""
    rr = table.mean("rate_reduction")
    neg = [j + 1 for j in range(len(rr)) if rr[j] < 0]
    return f"layer(s) {', '.join(map(str, neg))} (min {rr.min():.3g})" if neg else ""
