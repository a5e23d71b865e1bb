"""CRATE-DINO on the built-in digits: what self-supervision buys against a random encoder and raw pixels.

Runs (or reuses, ``--run RUN_DIR``) the default ``crate pretrain dino`` (the digits preset), then
measures on the fixed 1,000 held-out MNIST digits, with features of the 4,000 training digits:

* the DINO teacher backbone (the run's ``model/``, mean of patch tokens);
* the same architecture randomly initialised (same seed as the run: the teacher's starting point);
* raw pixels (the normalised 784-d images);

each by weighted k-NN (k = 10, 20, 100, 200; T = 0.07) and a linear probe (``crate_transformer.analysis.probe``).
Prints the table docs/dino.md quotes and writes ``dino_knn.png`` (k-NN accuracy against k).  Not a test.

    python benchmarks/bench_dino.py --threads 1                    # pre-train (default run), then measure
    python benchmarks/bench_dino.py --run runs/dino-mnist --figure docs/figures/dino_knn.png
    python benchmarks/bench_dino.py --tiny        # d = 32, one layer, 2 steps of batch 16 (seconds; a test runs it)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from _common import NON_NEGATIVE, Arguments

from crate_transformer.analysis.probe import KNN_KS, extract_features, knn_sweep, linear_probe
from crate_transformer.data import load_dataset, normalize
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.classifier import build_model
from crate_transformer.train import TrainConfig, load_training_state, train
from crate_transformer.train.dino import DINOTask
from crate_transformer.train.evaluation import save_figure, subplots


def _pixels(ds: object, mean: list[float], std: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for images, labels in ds.batches(1000, shuffle=False):
        xs.append(normalize(images.float() / 255, mean, std).flatten(1))
        ys.append(labels)
    return torch.cat(xs), torch.cat(ys)


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default=None, help="an existing DINO run directory (default: pre-train one now)")
    p.add_argument("--threads", type=int, range=NON_NEGATIVE, default=0, help="torch threads (0 = default)")
    p.add_argument("--out", default=None, help="run directory for the pre-training (default: a temp dir)")
    p.add_argument("--tiny", action="store_true", help="pre-train d = 32, one layer, 2 steps of batch 16 (seconds)")
    p.add_argument("--figure", default=None, help="where to write dino_knn.png (default: in the run directory)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    wall = None
    if args.run is None:
        run = Path(args.out or tempfile.mkdtemp(prefix="bench_dino_")) / "run"
        cfg = TrainConfig(**{**DINOTask.defaults, "task": "dino", "threads": args.threads, "progress": False})
        cfg = TrainConfig.from_dict({"out": str(run)}, cfg)
        if args.tiny:  # the same pre-training and measurements; a 32-d head (out_dim) keeps the step cheap
            tiny = {"max_steps": 2, "batch_size": 16, "eval_every": 0, "model_args": dict(dim=32, depth=1, heads=2)}
            cfg = TrainConfig.from_dict({**tiny, "task_args": dict(out_dim=32, hidden_dim=32, bottleneck_dim=16)}, cfg)
        t0 = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - t0
    run = Path(args.run) if args.run else run
    state = load_training_state(run)
    pool = state["train_config"]["task_args"].get("pool", "mean")
    teacher = load_model(run)
    spec = teacher.config.data
    train_ds, test_ds = load_dataset(spec.source, "train"), load_dataset(spec.source, "test")
    saved = state["train_config"]  # nested (system.seed) since the v2 layout; flat (seed) before it
    torch.manual_seed(saved["system"]["seed"] if "system" in saved else saved["seed"])  # the engine seeds first
    random = build_model(teacher.config)
    n_cls = len(spec.classes)
    rows = {}
    for name, model in (("DINO teacher", teacher), ("random init", random)):
        kw = dict(pool=pool, mean=spec.mean, std=spec.std, batch_size=500)
        tx, ty = extract_features(model, train_ds, **kw)
        ex, ey = extract_features(model, test_ds, **kw)
        rows[name] = (tx, ty, ex, ey)
    rows["raw pixels"] = (*_pixels(train_ds, spec.mean, spec.std), *_pixels(test_ds, spec.mean, spec.std))
    results = {}
    for name, (tx, ty, ex, ey) in rows.items():
        knn = knn_sweep(tx, ty, ex, ey, ks=KNN_KS, num_classes=n_cls)
        std = float(torch.nn.functional.normalize(ex, dim=-1).std(dim=0).mean())
        results[name] = (knn, linear_probe(tx, ty, ex, ey).acc, std)
    timing = f", pre-training wall time {wall:.0f} s (load average {os.getloadavg()[0]:.1f})" if wall else ""
    print(f"{spec.name}: {len(train_ds)} train / {len(test_ds)} test digits, {pool} features; run {run}{timing}")
    print(f"{'features':<14}" + "".join(f"  k={k:<5}" for k in KNN_KS) + "  probe    feature std")
    for name, (knn, probe, std) in results.items():
        print(f"{name:<14}" + "".join(f"  {100 * knn[k]:5.1f}%" for k in KNN_KS) + f"  {100 * probe:5.1f}%   {std:.3f}")
    fig, ax = subplots(figsize=(5.2, 3.6))
    for name, (knn, probe, _) in results.items():
        ax.plot(list(KNN_KS), [100 * knn[k] for k in KNN_KS], "o-", label=f"{name} (probe {100 * probe:.1f}%)")
    ax.axhline(97.7, color="gray", ls="--", lw=1, label="supervised crate train (97.7%)")
    ax.set(xscale="log", xlabel="k", ylabel="top-1 accuracy (%)", title="weighted k-NN on the 1,000 test digits")
    ax.set_xticks(list(KNN_KS), [str(k) for k in KNN_KS])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    print(f"figure: {save_figure(fig, args.figure or run / 'dino_knn.png')}")


if __name__ == "__main__":
    main()
