"""Do the purest atoms matter most?  CRATE's ISTA atoms against the ViT's MLP units of equal width on the digits.

The experiment of docs/features.md ("Purity against causal effect").  For each seed, a CRATE (``crate_mnist``) and a
ViT (``vit_mnist``, ``mlp_ratio=1``: as many MLP units as CRATE has atoms) are trained with ``crate train`` on the
built-in 8×8 digits, and an untrained model of each (the same architecture, initialised with the seed) is measured
beside them.  On the test digits, per layer:

* purity ``P_u`` of every unit (``crate features``' class purity, top-k = 16 patches);
* the causal effect of every unit: the fraction of test predictions that change when it alone is zeroed
  (:func:`crate_transformer.analysis.effects.atom_effects`);
* (a) the flip rate of ablating the ``k`` purest units together against that of ``k`` random units (``--draws``
  random sets): is the purest set's effect above the 95th percentile of the random sets'?
* (b) Spearman's ρ of purity and single-unit flip rate (and of purity and Δloss) over the scored units.

``--task text``: CRATE-GPT (``crate_gpt_mini``) against the GPT (``gpt_mini``, ``mlp_ratio=1``) of equal width,
``crate train-lm`` for 300 steps on Python's documentation (byte tokens, context 32), measured on its 64
held-out blocks, purity against the next token and the effects on the next-token predictions.

Prints a Markdown table (mean ± sample std over the seeds) and writes ``effects-TASK.json`` under ``--out``.  Not a
test.

    python benchmarks/bench_effects.py --out runs/effects
    python benchmarks/bench_effects.py --task text --out runs/effects
    python benchmarks/bench_effects.py --tiny     # 2 training steps, seeds 0 1, k = 4, 5 draws, a temp dir (seconds)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import NON_NEGATIVE, POSITIVE, Arguments

import crate_transformer as ct
from crate_transformer import cli
from crate_transformer.analysis import effects as E
from crate_transformer.analysis import features as F
from crate_transformer.analysis._common import normalize_images
from crate_transformer.data import load_dataset
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.spec import resolve_normalization

SHAPE = dict(image_size=8, patch_size=2, dim=32, depth=2, heads=4)
MODELS = {"CRATE (ISTA atoms)": ("crate_mnist", {}), "ViT (MLP units)": ("vit_mnist", {"mlp_ratio": 1})}
BUDGET = ["--epochs", "30", "--augment", "none"]  # translate (the digits default) costs ~15 points of accuracy here
TEXT_SHAPE = dict(dim=32, depth=2, heads=2, block_size=32)
TEXT_MODELS = {"CRATE-GPT (ISTA atoms)": ("crate_gpt_mini", {}), "GPT (MLP units)": ("gpt_mini", {"mlp_ratio": 1})}
TEXT_BUDGET = [
    "--epochs",
    "1",
    "--max-steps",
    "300",
    "--eval-every",
    "0",
    "--eval-blocks",
    "16",
    "--sample-tokens",
    "0",
]
TEXT_BLOCKS = 64  # held-out blocks measured
TINY_STEPS = ["--max-steps", "2"]  # --tiny: the same models and measurements after two training steps


def _train(task: str, arch: str, extra: dict, seed: int, out: Path, tiny: bool = False) -> Path:
    """One ``crate train`` run on the digits or ``crate train-lm`` run on Python's documentation (reused when its
    folder holds a model)."""
    run = out / f"{arch}-s{seed}"
    if not (run / "model" / "config.json").is_file():
        if task == "images":
            margs = [f"{k}={v}" for k, v in {**SHAPE, **extra}.items() if k != "image_size"]
            args = ["train", "--model", arch, "--data", "digits", "--image-size", "8", *BUDGET, "--measure-every", "0"]
        else:
            margs = [f"{k}={v}" for k, v in {**TEXT_SHAPE, **extra}.items()]
            args = ["train-lm", "--model", arch, *TEXT_BUDGET]
        args += ["--model-args", *margs, "--seed", str(seed), "--threads", "1", "--no-progress", "--out", str(run)]
        args += TINY_STEPS if tiny else []  # the last --max-steps given wins
        assert cli.main(args) == 0
    return run


def _layer(model, purity: np.ndarray, inputs, targets, layer: int, k: int, draws: int, rng) -> dict:
    """Single-unit effects and the purest-k / random-k group ablations of one layer, against its units' purity."""
    p = purity
    single = E.atom_effects(model, inputs, targets, layer)
    flip, dloss = single.flip.mean(1), single.delta_loss.mean(1)
    m = len(p)
    purest = np.argsort(np.where(np.isnan(p), -np.inf, -p), kind="stable")[:k]
    groups = [purest.tolist()] + [rng.choice(m, k, replace=False).tolist() for _ in range(draws)]
    grouped = E.group_effects(model, inputs, targets, layer, groups).summary(n_boot=1000)
    rand = grouped["flip"][1:]
    return {
        "purity": float(np.nanmean(p)),
        "flip": float(flip.mean()),
        "rho_flip": E.spearman(p, flip),
        "rho_loss": E.spearman(p, dloss),
        "purest_flip": float(grouped["flip"][0]),
        "purest_flip_ci": [float(grouped["flip_lo"][0]), float(grouped["flip_hi"][0])],
        "random_flip": float(rand.mean()),
        "random_q95": float(np.percentile(rand, 95)),
        "purest_above_q95": bool(grouped["flip"][0] > np.percentile(rand, 95)),
    }


def _purities(report: dict, kind: str) -> list[np.ndarray]:
    """Each layer's units' purity against label ``kind`` (NaN: not scored)."""
    return [
        np.array([np.nan if u[f"{kind}_purity"] is None else u[f"{kind}_purity"] for u in layer["units"]])
        for layer in report["layers"]
    ]


def _measure(model, norm, seed: int, k: int, draws: int) -> dict:
    """The test accuracy and every layer's measurements (:func:`_layer`) of ``model`` on the test digits."""
    test = load_dataset("digits", "test")
    x, y = test.images.float() / 255, test.labels.long()
    xn = normalize_images(x, norm)
    model = model.eval()
    with torch.no_grad():
        acc = float((model(xn).argmax(-1) == y).float().mean())
    rng = np.random.default_rng(seed)
    layers = []
    for i in range(len(model.layers)):
        (p,) = _purities(F.image_features(model, x, y, normalization=norm, k=16, layers=[i])[0], "class")
        layers.append(_layer(model, p, xn, y, i, k, draws, rng))
    return {"accuracy": acc, "layers": layers}


def _held_out(run: Path, tokenizer) -> torch.Tensor:
    """The run's held-out blocks (the tail ``crate train-lm`` kept out of training), at most ``TEXT_BLOCKS``,
    ``(N, n + 1)`` ids."""
    from crate_transformer.cli.reports import held_out_corpus
    from crate_transformer.data.text import TokenBlocks, load_tokens, split_tokens

    data, val_fraction, columns = held_out_corpus(run, None)
    tokens, block = load_tokens(data, tokenizer, columns), TEXT_SHAPE["block_size"]
    tail = TokenBlocks(tokens, block, split_tokens(len(tokens), val_fraction, block), len(tokens), data, "held-out")
    return tail.get(torch.arange(min(TEXT_BLOCKS, len(tail))))


def _measure_text(model, blocks: torch.Tensor, seed: int, k: int, draws: int) -> dict:
    """Next-token accuracy and every layer's measurements against next-token purity, on held-out ``blocks``."""
    model = model.eval()
    x, y = blocks[:, :-1], blocks[:, 1:]
    with torch.no_grad():
        acc = float((model(x).argmax(-1) == y).float().mean())
    rng = np.random.default_rng(seed)
    purity = _purities(F.text_features(model, blocks, k=16)[0], "next_token")
    return {"accuracy": acc, "layers": [_layer(model, p, x, y, i, k, draws, rng) for i, p in enumerate(purity)]}


def _run_task(task: str, seeds: list[int], k: int, draws: int, out: Path, tiny: bool = False) -> dict:
    """``{"model, trained|untrained": [per-seed measurements]}`` of the task's two models."""
    results = {}
    for label, (arch, extra) in (MODELS if task == "images" else TEXT_MODELS).items():
        for state in ("trained", "untrained"):
            runs = []
            for seed in seeds:
                run = _train(task, arch, extra, seed, out, tiny)
                model = load_model(str(run))
                if task == "images":
                    norm = resolve_normalization(model, load_dataset("digits", "test"))  # the trained one's, for both
                    if state == "untrained":
                        torch.manual_seed(seed)
                        model = ct.create_model(arch, in_chans=1, num_classes=10, **SHAPE, **extra)
                    runs.append(_measure(model, norm, seed, k, draws))
                else:
                    blocks = _held_out(run, model.tokenizer)
                    if state == "untrained":
                        torch.manual_seed(seed)
                        model = ct.create_model(arch, **TEXT_SHAPE, **extra)
                    runs.append(_measure_text(model, blocks, seed, k, draws))
            results[f"{label}, {state}"] = runs
    return results


def _row(label: str, runs: list[dict], layer: int) -> str:
    def ms(key: str, digits: int = 3) -> str:
        v = np.array([r["layers"][layer][key] for r in runs], dtype=float)
        v, seeds = v[np.isfinite(v)], len(v)
        if not len(v):  # a Spearman ρ against a constant column (no unit flips any prediction) is undefined
            return "undefined"
        cell = f"{v.mean():.{digits}f} ± {v.std(ddof=1) if len(v) > 1 else 0:.{digits}f}"
        return cell if len(v) == seeds else f"{cell} ({len(v)} of {seeds} seeds)"

    acc = np.array([r["accuracy"] for r in runs])
    above = sum(r["layers"][layer]["purest_above_q95"] for r in runs)
    cells = [label, str(layer + 1), f"{100 * acc.mean():.1f}", ms("purity"), ms("flip", 4), ms("purest_flip")]
    cells += [ms("random_flip"), ms("random_q95"), f"{above}/{len(runs)}", ms("rho_flip", 2), ms("rho_loss", 2)]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["images", "text"], default="images")
    p.add_argument("--seeds", type=int, range=NON_NEGATIVE, nargs="+", default=[0, 1, 2])
    p.add_argument("--k", type=int, range=POSITIVE, default=8, help="units ablated together in (a), at most 32")
    p.add_argument("--draws", type=int, range=POSITIVE, default=50, help="random sets of k units in (a)")
    p.add_argument("--out", default="runs/effects", help="run directories (reused when present) and effects-TASK.json")
    p.add_argument("--tiny", action="store_true", help="2 training steps, seeds 0 1, k = 4, 5 draws, in a temp dir")
    p.rule(lambda a: a.k <= SHAPE["dim"], f"--k: at most the {SHAPE['dim']} units of a layer; e.g. --k 8")
    args = p.parse_args()
    if args.tiny:  # never reuses (or leaves) full-size runs
        args.seeds, args.k, args.draws, args.out = [0, 1], 4, 5, tempfile.mkdtemp(prefix="bench_effects_")
    torch.set_num_threads(1)
    out = Path(args.out)
    results = _run_task(args.task, args.seeds, args.k, args.draws, out, args.tiny)
    (out / f"effects-{args.task}.json").write_text(json.dumps(results, indent=1))
    head = "| model | layer | test acc % |" if args.task == "images" else "| model | layer | next-token acc % |"
    head += " purity | flip (one unit) | flip (k purest) | flip (k random) "
    head += "| random 95th pct | purest > 95th | ρ(purity, flip) | ρ(purity, Δloss) |"
    print(f"k = {args.k}, {args.draws} random sets, seeds {args.seeds}; mean ± sample std over the seeds")
    print(head + "\n|" + "---|" * 11)
    for label, runs in results.items():
        for layer in range(len(runs[0]["layers"])):
            print(_row(label, runs, layer))
    print("undefined: ρ has no value where every unit gives the same flip (or Δloss), e.g. none flips a prediction")


if __name__ == "__main__":
    main()
