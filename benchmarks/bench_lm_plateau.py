"""CRATE-GPT against a GPT of equal parameter count and against CRATE-GPT without ISTA, on three corpora.

Every run is ``crate train-lm``'s default recipe (the lm task's defaults, byte tokens, context 128) with the same
seed, so the same initialisation stream and data order, for three models:

* ``crate`` — ``crate_gpt_mini`` (CRATE-GPT, d = 128, 4 layers, 4 heads);
* ``no_ista`` — the same with ``ista_mode=none`` (the Table 16 ablation);
* ``gpt`` — a GPT-2 block model (``gpt_mini``: MHSA + 4x GELU MLP, final LayerNorm) of 4 layers and 4 heads whose
  width is chosen so that its parameter count is the closest to CRATE-GPT's (equal size, not equal width);
* ``crate_plain`` (only when asked for) — ``crate`` without the token prior: crate-lm's initialisation as it is.

Corpora: ``python-docs`` (built in) and the ``stdlib`` and ``english`` corpora of ``lm_corpora.py``.  Every
``--curve-every`` share of the steps the held-out loss of the first 128 held-out windows is measured; a run
"leaves the plateau" at the first of those steps where it is below ``(1 - margin)`` x the unigram entropy of the
training tokens (the lm task's plateau-check margin).  The final held-out loss is the task's (every held-out
token).  Prints one Markdown table (mean ± std over the seeds, the steps where each run left the plateau, seconds
per run) and whether the targets held; ``--json`` keeps every run.  Not a test (``--tiny`` is what a test runs).

    python benchmarks/bench_lm_plateau.py --seeds 0 1 2 --threads 1 --json lm_plateau.json
    python benchmarks/bench_lm_plateau.py --tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, POSITIVE, Arguments, Range

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lm_corpora  # noqa: E402

import crate_transformer as ct  # noqa: E402
from crate_transformer.data.text import TokenBlocks, load_tokens, split_tokens  # noqa: E402
from crate_transformer.models.tokenizer import Tokenizer  # noqa: E402
from crate_transformer.train import TrainConfig, train  # noqa: E402
from crate_transformer.train.lm import PLATEAU_MARGIN, LMOptions, LMTask  # noqa: E402

MODELS = ("crate", "no_ista", "gpt", "crate_plain")
CURVE_WINDOWS = 128
TINY_ARGS = dict(dim=16, depth=1, heads=2, block_size=16)


def gpt_width(target: int, args: dict) -> tuple[int, int]:
    """The width (a multiple of the heads) of the GPT with ``args`` whose parameter count is the closest to
    ``target``; with that count."""
    heads, best = args.get("heads", 4), None
    for dim in range(heads, 2 * args.get("dim", 128) + 1, heads):
        n = ct.create_model("gpt_mini", **{**args, "dim": dim}).num_params()
        if best is None or abs(n - target) < abs(best[1] - target):
            best = (dim, n)
    return best


def model_args(tiny: bool) -> dict[str, tuple[str, dict, dict]]:
    """Each benchmarked model as (registered name, model_args, options of its run over the recipe)."""
    base = dict(TINY_ARGS) if tiny else {}
    crate = ct.create_model("crate_gpt_mini", **base).num_params()
    dim, _ = gpt_width(crate, base)
    return {
        "crate": ("crate_gpt_mini", base, {}),
        "no_ista": ("crate_gpt_mini", {**base, "ista_mode": "none"}, {}),
        "gpt": ("gpt_mini", {**base, "dim": dim}, {}),
        "crate_plain": ("crate_gpt_mini", base, {"token_prior": False}),  # crate-lm's initialisation as it is
    }


@torch.no_grad()
def heldout_loss(model: torch.nn.Module, blocks: TokenBlocks) -> float:
    was = model.training
    model.eval()
    total = n = 0.0
    for b in blocks.batches(64, shuffle=False):
        logits = model(b[:, :-1]).float()
        total += float(F.cross_entropy(logits.flatten(0, 1), b[:, 1:].flatten(), reduction="sum"))
        n += b[:, 1:].numel()
    model.train(was)
    return total / n


def corpus_facts(source: str, block: int) -> tuple[TokenBlocks, float]:
    """The first held-out windows (the split the lm task makes) and the training tokens' unigram entropy."""
    tok = Tokenizer.byte_level()
    tokens = load_tokens(source, tok)
    cut = split_tokens(len(tokens), LMTask.defaults["val_fraction"], block)
    held = TokenBlocks(tokens, block, cut, min(len(tokens), cut + CURVE_WINDOWS * block + 1), "held", "held-out")
    counts = torch.from_numpy(TokenBlocks(tokens, block, 0, cut, "train", "train").token_counts(tok.vocab_size))
    p = counts[counts > 0].double() / counts.sum()
    return held, float(-(p * p.log()).sum())


def run_one(source: str, model: tuple[str, dict, dict], seed: int, opts: argparse.Namespace, out: Path) -> dict:
    name, args, options = model
    held, entropy = corpus_facts(source, args.get("block_size", 128))
    curve: list[tuple[int, float]] = []
    every = [1]

    def hook(ctx: Any) -> None:
        if ctx.step % every[0] == 0:
            curve.append((ctx.step, heldout_loss(ctx.model, held)))

    overrides = {**(opts.recipe or {}), **options}
    task_keys = {f.name for f in dataclasses.fields(LMOptions)}
    task_args = {"sample_tokens": 0, **{k: overrides.pop(k) for k in list(overrides) if k in task_keys}}
    if opts.tiny:
        overrides.update(epochs=1, batch_size=8)
    base = TrainConfig.from_dict({**LMTask.defaults, "task": "lm"})  # the task's defaults, then the recipe's options
    cfg = TrainConfig.from_dict({
        **overrides, "model": name, "model_args": args, "data": source, "seed": seed, "threads": opts.threads,
        "out": str(out), "progress": False, "task_args": task_args,
    }, base)  # fmt: skip
    blocks = TokenBlocks(held.tokens, held.block_size, 0, held.lo, "", "")
    total = blocks.steps_per_epoch(cfg.optim.batch_size) * cfg.optim.epochs
    every[0] = max(1, round(opts.curve_every * total))
    load0 = os.getloadavg()[0]
    t0 = time.time()
    result = train(cfg, hooks=[hook])
    if result.get("interrupted"):
        raise SystemExit(f"interrupted in {result['run_dir']}")
    left = next((s for s, loss in curve if loss < (1 - PLATEAU_MARGIN) * entropy), None)
    return {
        "loss": result["heldout_loss"], "params": result["params"], "steps": result["step"], "left": left,
        "entropy": entropy, "curve": curve, "seconds": time.time() - t0, "load": (load0, os.getloadavg()[0]),
    }  # fmt: skip


def corpus_source(name: str, opts: argparse.Namespace, where: Path) -> str:
    if opts.tiny:
        path = where / f"{name}.txt"
        text = {"python-docs": "def f(x):\n    return x + 1\n", "stdlib": "import os\nprint(os.sep)\n"}.get(
            name, "The licence grants the right to copy and to change the work. "
        )
        path.write_text(text * 60)
        return str(path)
    if name == "python-docs":
        return "python-docs"
    return str(lm_corpora.build(name, where, opts.chars))


def describe(name: str, args: dict, options: dict) -> str:
    """``name``, the model arguments that differ from its registered config and the run's own options
    (``gpt_mini dim=68``, ``crate_gpt_mini token_prior=False``)."""
    registered = ct.model_config(name)
    changed = [f"{k}={v}" for k, v in args.items() if getattr(registered, k, None) != v]
    return " ".join([name, *changed, *(f"{k}={v}" for k, v in options.items())])


def _mean_std(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"


def report(results: dict, models: dict) -> list[str]:
    """The Markdown table and the targets' verdicts."""
    lines = [
        "| corpus | model | parameters | held-out loss / token (mean ± std) | left the plateau at step (per seed) "
        "| of the steps | seconds per run |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for corpus, per_model in results.items():
        loss = {m: [r["loss"] for r in runs] for m, runs in per_model.items()}
        for m, runs in per_model.items():
            steps = runs[0]["steps"]
            left = [r["left"] for r in runs]
            share = max((x if x is not None else steps) / steps for x in left)
            lines.append(
                f"| {corpus} | {m} ({describe(*models[m])}) | {runs[0]['params']:,} | "
                f"{_mean_std(loss[m])} | {' / '.join('never' if x is None else str(x) for x in left)} | "
                f"≤ {share:.0%} of {steps} | {statistics.mean(r['seconds'] for r in runs):.0f} |"
            )
        crate = per_model.get("crate", [])
        if crate:
            ok = all(r["left"] is not None and r["left"] <= 0.2 * r["steps"] for r in crate)
            verdicts.append(f"{corpus}: CRATE-GPT leaves the plateau within 20% of the steps on every seed: {ok}")
        if "crate" in loss and "gpt" in loss:
            gap = statistics.mean(loss["crate"]) - statistics.mean(loss["gpt"])
            verdicts.append(
                f"{corpus}: CRATE-GPT − equal-size GPT = {gap:+.3f} nats/token (target ≤ 0.35): {gap <= 0.35}"
            )
        if "crate" in loss and "no_ista" in loss:
            d = statistics.mean(loss["no_ista"]) - statistics.mean(loss["crate"])
            verdicts.append(f"{corpus}: without ISTA − with ISTA = {d:+.3f} nats/token (ISTA helps: {d > 0})")
    return lines + [""] + verdicts


def main(argv: list[str] | None = None) -> int:
    p = Arguments(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpora", nargs="+", default=["python-docs", *lm_corpora.CORPORA])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS[:3]))
    p.add_argument("--seeds", nargs="+", type=int, range=NON_NEGATIVE, default=[0, 1, 2])
    p.add_argument("--threads", type=int, range=NON_NEGATIVE, default=1)
    p.add_argument(
        "--chars", type=int, range=POSITIVE, default=500_000, help="characters of the stdlib / english corpora"
    )
    p.add_argument(
        "--curve-every",
        type=float,
        range=Range(0, 1, lo_open=True),
        default=0.02,
        help="share of the steps between held-out points",
    )
    p.add_argument(
        "--recipe",
        type=json.loads,
        default=None,
        help='options over the defaults, e.g. {"lr": 1e-3, "token_prior": false}',
    )
    p.add_argument("--json", type=Path, default=None, help="write every run (with its held-out curve) here")
    p.add_argument("--tiny", action="store_true", help="tiny models, corpora and runs (what a test runs)")
    opts = p.parse_args(argv)
    models = {m: a for m, a in model_args(opts.tiny).items() if m in opts.models}
    print(f"torch {torch.__version__}, {opts.threads} thread(s), load {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        for corpus in opts.corpora:
            source = corpus_source(corpus, opts, where)
            results[corpus] = {m: [] for m in models}
            for seed in opts.seeds:  # the models of one seed back to back: a change in load hits them alike
                for m, model in models.items():
                    r = run_one(source, model, seed, opts, where / f"{corpus}-{m}-{seed}")
                    results[corpus][m].append(r)
                    load = f"load {r['load'][0]:.2f}-{r['load'][1]:.2f}"
                    print(f"{corpus} {m} seed {seed}: loss {r['loss']:.4f}, left the plateau at {r['left']} of "
                          f"{r['steps']}, {r['seconds']:.0f} s, {load}", flush=True)  # fmt: skip
    print("\n".join(report(results, models)))
    if opts.json:
        opts.json.write_text(json.dumps({"models": models, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
