"""End-to-end training throughput of ``crate train`` (data loading, augmentation and logging included).

For each configuration the script runs the real training loop for a few steps and, in the same process,
two baselines on the same model and batch size:

* compute only — forward + backward + optimizer step on one pre-made batch (no data, no logging);
* data only    — indexing the in-memory dataset + augmentation + normalisation, no model.

``e2e / compute`` near 1.0 means data loading and logging are not the bottleneck.  Not a test.

    python benchmarks/bench_train_throughput.py            # default job + CRATE-T (224 px, synthetic CIFAR)
    python benchmarks/bench_train_throughput.py --quick    # fewer steps
    python benchmarks/bench_train_throughput.py --tiny     # one-layer models, 3 steps (seconds; a test runs it)
"""

from __future__ import annotations

import argparse
import json
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, Arguments

from crate_transformer.data import build_augmentation, load_dataset
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.registry import create_model
from crate_transformer.train import TrainConfig, prepare_batch, train


def _synthetic_cifar(root: Path, n: int = 1000) -> Path:
    """A CIFAR-10-format folder of random images (the pipeline, not the content, is being timed)."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for f in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = {b"data": rng.integers(0, 256, (n // 5, 3072), dtype=np.uint8), b"labels": list(np.arange(n // 5) % 10)}
        (d / f).write_bytes(pickle.dumps(data))
    return d


def _rate_from_log(run: Path, batch: int, skip: int) -> float:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_r = [r for r in recs if r["split"] == "train"]
    a, b = train_r[skip - 1], train_r[-1]  # time between two logged steps, after warm-up steps
    return (b["step"] - a["step"]) * batch / (b["time"] - a["time"])


def _compute_only(cfg: TrainConfig, steps: int) -> float:
    """Images/s of forward + backward + clip + AdamW step on one real, pre-made batch (median of 3 chunks)."""
    ds = load_dataset(cfg.data.source, "train")
    model = create_model(cfg.model, num_classes=ds.num_classes, in_chans=ds.channels, **cfg.model_args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    size = model.config.image_size
    x = prepare_batch(ds.images[: cfg.optim.batch_size], device=torch.device("cpu"), image_size=size,
                      channels=ds.channels, mean=ds.mean, std=ds.std)  # fmt: skip
    y = ds.labels[: cfg.optim.batch_size]

    def step() -> None:
        loss = F.cross_entropy(model(x), y, label_smoothing=cfg.optim.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step()
    rates = []
    for _ in range(3):
        n = max(1, steps // 3)
        t = time.perf_counter()
        for _ in range(n):
            step()
        rates.append(n * cfg.optim.batch_size / (time.perf_counter() - t))
    return sorted(rates)[1]


def _data_only(cfg: TrainConfig, kind: str, steps: int) -> float:
    ds = load_dataset(cfg.data.source, "train")
    size = create_model(cfg.model, **cfg.model_args).config.image_size
    aug = build_augmentation(kind, size, translate=round(cfg.augmentation.translate * ds.image_size))
    g = torch.Generator().manual_seed(0)
    t = time.perf_counter()
    for _ in range(steps):
        idx = torch.randint(0, len(ds), (cfg.optim.batch_size,), generator=g)
        prepare_batch(ds.images[idx], device=torch.device("cpu"), image_size=size, channels=ds.channels,
                      mean=ds.mean, std=ds.std, augment=aug)  # fmt: skip
        _ = ds.labels[idx]
    return steps * cfg.optim.batch_size / (time.perf_counter() - t)


def _tiny(configs: list[tuple]) -> list[tuple]:
    """``--tiny``: the same two loops, data and augmentations, with one-layer d=32 models (crate_tiny at 32 px),
    batch 8, 3 timed steps."""
    small = dict(dim=32, depth=1, heads=2)
    sizes = ({}, dict(image_size=32, patch_size=8))
    return [
        (name.replace("224px", "32px"), TrainConfig.from_dict({"batch_size": 8, "model_args": {**small, **size}}, cfg),
         kind, 3)
        for (name, cfg, kind, _), size in zip(configs, sizes)
    ]  # fmt: skip


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer steps")
    p.add_argument("--tiny", action="store_true", help="one-layer d=32 models, 3 steps, batch 8 (seconds)")
    p.add_argument("--threads", type=int, range=NON_NEGATIVE, default=0, help="torch threads (0 = default)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="bench_tp_"))
    cifar = _synthetic_cifar(tmp / "data")
    q = args.quick
    configs = [
        # name, config, augmentation, steps
        ("default (crate_mnist, mnist 28px)", TrainConfig(), "translate", 15 if q else 60),
        ("CRATE-T (crate_tiny, 224px, crop-flip)",
         TrainConfig(model="crate_tiny", data=str(cifar), batch_size=32, augment="crop-flip"),
         "crop-flip", 3 if q else 6),
    ]  # fmt: skip
    if args.tiny:
        configs = _tiny(configs)
    rows = []
    for name, cfg, kind, steps in configs:
        cfg = TrainConfig.from_dict(
            {"epochs": 100, "max_steps": steps + 2, "log_every": 1, "eval_every": 0, "progress": False,
             "out": str(tmp / f"run{len(rows)}"), "threads": args.threads},
            cfg,
        )  # fmt: skip
        t0 = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - t0
        e2e = _rate_from_log(Path(cfg.logging.out), cfg.optim.batch_size, skip=2)
        comp = _compute_only(cfg, steps)
        data = _data_only(cfg, kind, steps)
        params = load_model(cfg.logging.out).num_params()
        rows.append((name, f"{params / 1e6:.2f}M", cfg.optim.batch_size, f"{e2e:,.0f}", f"{comp:,.0f}", f"{data:,.0f}",
                     f"{e2e / comp:.2f}", f"{wall:.0f}"))  # fmt: skip
    header = ("config", "params", "batch", "e2e img/s", "compute-only img/s", "data-only img/s", "e2e/compute",
              "run wall s")  # fmt: skip
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for r in [header, *rows]:
        print("  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    print("e2e/compute ~ 1.0: the loop adds little on top of the model; data-only >> e2e: loading is not a bottleneck")


if __name__ == "__main__":
    main()
