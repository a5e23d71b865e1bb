"""CRATE's ISTA codes vs a baseline's MLP units as features: the per-layer table of docs/features.md.

Trains (or reuses) several seeds of a CRATE model and of its baseline at equal width (the baseline's
``mlp_ratio=1``, so its MLP has ``d`` hidden units like CRATE's ``d × d`` dictionary), runs ``crate features``
on each and prints one Markdown table of mean ± std over the seeds.  Not a test.

    python benchmarks/bench_features.py --task images --out runs/features   # crate_mnist vs vit_mnist on MNIST
    python benchmarks/bench_features.py --task text --out runs/features     # crate_gpt_mini vs gpt_mini
    python benchmarks/bench_features.py --tiny      # d = 16, one layer, 2 steps, seeds 0 1, in a temp dir (seconds)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from _common import NON_NEGATIVE, Arguments

from crate_transformer import cli

WIDTH = ["dim=64", "depth=2", "heads=4"]
TINY_WIDTH = ["dim=16", "depth=1", "heads=2"]  # --tiny: with TINY_BUDGET, the same runs in seconds
TINY_STEPS = ["--epochs", "1", "--max-steps", "2", "--eval-every", "0"]
TINY_BUDGET = {"train": TINY_STEPS, "train-lm": [*TINY_STEPS, "--sample-tokens", "0"]}
TASKS = {
    "images": {
        "command": "train",
        "budget": ["--epochs", "20"],
        "models": {"CRATE (ISTA code)": ("crate_mnist", []), "ViT (MLP units)": ("vit_mnist", ["mlp_ratio=1"])},
        "columns": ["dead", "always_on", "mean_frequency", "class_purity", "class_chance"],
    },
    "text": {
        "command": "train-lm",
        "budget": ["--epochs", "10"],
        "models": {"CRATE-GPT (ISTA code)": ("crate_gpt_mini", []), "GPT (MLP units)": ("gpt_mini", ["mlp_ratio=1"])},
        "columns": ["dead", "always_on", "mean_frequency", "token_purity", "next_token_purity", "token_chance"],
    },
}


def _run(task: dict, name: str, extra: list[str], seed: int, out: Path, tiny: bool = False) -> dict:
    """Train one seed unless its run directory is there, then ``crate features`` on it; its report."""
    run = out / f"{name}-s{seed}"
    if not (run / "model" / "config.json").is_file():
        width, budget = (TINY_WIDTH, TINY_BUDGET[task["command"]]) if tiny else (WIDTH, task["budget"])
        args = [task["command"], "--model", name, "--model-args", *width, *extra, *budget]
        assert cli.main([*args, "--seed", str(seed), "--threads", "1", "--no-progress", "--out", str(run)]) == 0
    report = run / "features" / "features.json"  # where ``crate features RUN`` writes it
    if not report.is_file():
        assert cli.main(["features", str(run), "--threads", "1"]) == 0
    return json.loads(report.read_text())


def _table(reports: dict[str, list[dict]], columns: list[str]) -> str:
    lines = ["| model | layer | width | " + " | ".join(columns) + " |", "|" + "---|" * (len(columns) + 3)]
    for label, runs in reports.items():
        for i, layer in enumerate(runs[0]["layers"]):
            cells = []
            for c in columns:
                v = np.array([r["layers"][i]["summary"][c] for r in runs], dtype=float)
                cells.append(f"{v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0:.3f}")
            lines.append(f"| {label} | {layer['layer']} | {layer['summary']['width']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=sorted(TASKS), default="images")
    p.add_argument("--seeds", type=int, range=NON_NEGATIVE, nargs="+", default=[0, 1, 2])
    p.add_argument("--out", default="runs/features", help="run directories (reused when present)")
    p.add_argument("--tiny", action="store_true", help="d = 16, one layer, 2 steps, seeds 0 1, in a new temp dir")
    args = p.parse_args()
    if args.tiny:  # never reuses (or leaves) full-size runs
        args.seeds, args.out = [0, 1], tempfile.mkdtemp(prefix="bench_features_")
    task = TASKS[args.task]
    reports = {
        label: [_run(task, name, extra, s, Path(args.out), args.tiny) for s in args.seeds]
        for label, (name, extra) in task["models"].items()
    }
    print(f"mean ± std (sample std) over seeds {args.seeds}; k = {next(iter(reports.values()))[0]['k']}")
    print(_table(reports, task["columns"]))


if __name__ == "__main__":
    main()
