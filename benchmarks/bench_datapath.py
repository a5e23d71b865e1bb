"""Is the loader's time hidden behind the step in ``crate train``'s data path?  The CPU evidence (issue 42, item 2).

Each row runs the real training loop (:func:`crate_transformer.train.train`, what ``crate train`` calls, default
logging every 10 steps) with a hook (:class:`Pairing`) that, after each of the loop's steps, runs one step of the
same model alone and one batch of the loader alone, so the three are timed side by side under the same load:

* ``e2e``    — the loop's time per step between two calls of the hook: taking the source's batch (through the
  device prefetcher, a pass-through on a CPU), the recipe's augmentation, normalisation, forward, backward, clipping,
  the optimizer step and schedule, the loop's own per-step work (statistics, logging);
* ``model``  — the same step (same architecture, optimizer, loss, clipping, batch) on one pre-made batch of inputs;
* ``loader`` — one batch of the source through the same augmentation and normalisation, no model.

Rates are images/s of the median step; ``e2e/model`` is the median of the steps' ratios (``(mean)``: the ratio of
the summed times, which counts every logging step); ``>= 0.95`` is the target.  ``loader/model``: how many times
faster the loader is than the step.  The rows: the default model (``crate_mnist_p4``) on the bundled offline
digits, batch 128, ``translate`` (two epochs; the step after an epoch's end, its checkpoint, is not timed); a
``crate_tiny``-sized model (d = 384, 12 layers, 64 tokens) on a generated folder of PNGs decoded into memory at
32 and 64 px, batch 32, ``crop-flip``; ``--rows stream`` adds the 64 px folder streamed (decoded per batch in
DataLoader worker processes).  Threads: ``crate train``'s auto choice unless ``--threads``.  Not a test.

    python benchmarks/bench_datapath.py                     # about a minute on 2 cores
    python benchmarks/bench_datapath.py --rows digits stream --threads 2
    python benchmarks/bench_datapath.py --tiny              # what tests/test_benchmarks.py runs
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, POSITIVE, Arguments

from crate_transformer.data import Position
from crate_transformer.models.registry import create_model
from crate_transformer.train import TrainConfig, train
from crate_transformer.train.images import ImageData
from crate_transformer.train.optim import build_optimizer, param_groups
from crate_transformer.train.task import StepContext
from crate_transformer.train.threads import resolve_threads

WARM = 2  # steps of the loop (and of the baselines) before the timed ones


@dataclass
class Row:
    """One comparison: ``train(cfg)`` for ``WARM + steps`` steps, and the baselines."""

    name: str
    model: str
    data: str  # "digits", or the side of a generated folder's images
    batch: int
    augment: str
    steps: int
    model_args: dict = field(default_factory=dict)
    data_mode: str = "memory"  # "stream": decoded per batch in DataLoader worker processes (--workers auto)
    default: bool = True  # run without --rows


def rows(tiny: bool) -> list[Row]:
    if tiny:
        small = dict(dim=32, depth=1, heads=2)
        return [
            Row("digits", "crate_mnist_p4", "digits", 32, "translate", 6, small),
            Row("folder 32px", "crate_tiny", "32", 8, "crop-flip", 4, dict(image_size=32, patch_size=8, **small)),
            Row(
                "stream 32px",
                "crate_tiny",
                "32",
                8,
                "crop-flip",
                4,
                dict(image_size=32, patch_size=8, **small),
                data_mode="stream",
                default=False,
            ),
        ]
    tiny32 = dict(image_size=32, patch_size=4)
    tiny64 = dict(image_size=64, patch_size=8)
    return [
        Row("digits", "crate_mnist_p4", "digits", 128, "translate", 16),
        Row("folder 32px", "crate_tiny", "32", 32, "crop-flip", 4, tiny32),
        Row("folder 64px", "crate_tiny", "64", 32, "crop-flip", 4, tiny64),
        Row("stream 64px", "crate_tiny", "64", 32, "crop-flip", 4, tiny64, data_mode="stream", default=False),
    ]


def make_folder(root: Path, train: int, side: int, classes: int = 4, seed: int = 0) -> Path:
    """``train`` PNGs of smooth random content, ``side`` x ``side`` RGB, in ``classes`` class folders under
    ``root/train``, and two per class under ``root/test`` (the run's final evaluation, not timed, stays short)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split, n in (("train", train), ("test", 2 * classes)):
        for i in range(n):
            d = root / split / f"class{i % classes}"
            d.mkdir(parents=True, exist_ok=True)
            coarse = rng.integers(0, 256, (max(1, side // 4), max(1, side // 4), 3), dtype=np.uint8)
            Image.fromarray(coarse).resize((side, side), Image.BILINEAR).save(d / f"{i:05d}.png")
    return root


def config(row: Row, source: str, out: Path, threads: int) -> TrainConfig:
    return TrainConfig(
        model=row.model,
        data=source,
        batch_size=row.batch,
        augment=row.augment,
        model_args=row.model_args,
        epochs=100,
        max_steps=WARM + row.steps,
        eval_every=0,
        measure_every=0,
        progress=False,
        threads=threads,
        data_mode=row.data_mode,
        out=str(out),
    )


class Baselines:
    """The model alone on pre-made inputs and the loader alone, built as the training task builds them."""

    def __init__(self, cfg: TrainConfig) -> None:
        torch.manual_seed(cfg.system.seed)
        probe = create_model(cfg.model, **cfg.model_args)
        self.data = ImageData(cfg, probe.config.image_size, torch.device("cpu"))
        self.model = create_model(
            cfg.model, num_classes=len(self.data.classes), in_chans=self.data.train.channels, **cfg.model_args
        ).train()
        self.data.fit(self.model)
        self.augment = self.data.augmentation(cfg.augmentation.augment)
        self.cfg, o = cfg, cfg.optim
        groups = param_groups(self.model, o.weight_decay, o.layer_decay)
        self.opt = build_optimizer(o.optimizer, groups, o.lr, o.betas, o.momentum)
        images, self.y = next(iter(self.data.train.batches(o.batch_size, at=Position(seed=1))))
        self.x = self.data.inputs(images, self.augment)
        self.batches = self._batches()

    def _batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for epoch in itertools.count():
            yield from self.data.train.batches(self.cfg.optim.batch_size, at=Position(seed=2, epoch=epoch))

    def model_step(self) -> float:
        """Seconds of one step on the pre-made batch: forward, loss, backward, clipping, the optimizer."""
        t, o = time.perf_counter(), self.cfg.optim
        loss = F.cross_entropy(self.model(self.x).float(), self.y, label_smoothing=o.label_smoothing)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if o.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), o.grad_clip)
        self.opt.step()
        return time.perf_counter() - t

    def loader_step(self) -> float:
        """Seconds of one batch of the source through the augmentation and normalisation."""
        t = time.perf_counter()
        images, _labels = next(self.batches)
        self.data.inputs(images, self.augment)
        return time.perf_counter() - t


class Pairing:
    """A hook of the real loop: after each of its steps, one model step and one loader batch.  The loop's time per
    step is the interval between the end of one call of the hook and the start of the next, so the hook's own work
    is not in it.  Steps up to ``WARM`` and an interval holding an epoch's end (its checkpoint) are not timed."""

    def __init__(self, base: Baselines, steps_per_epoch: int) -> None:
        self.base, self.steps_per_epoch = base, steps_per_epoch
        self.loop: list[float] = []
        self.model: list[float] = []
        self.loader: list[float] = []
        self.left = 0.0

    def __call__(self, ctx: StepContext) -> None:
        arrived = time.perf_counter()
        if ctx.step > WARM and (ctx.step - 1) % self.steps_per_epoch:
            self.loop.append(arrived - self.left)
            self.model.append(self.base.model_step())
            self.loader.append(self.base.loader_step())
        else:
            self.base.model_step()  # warms the baseline up with the loop
        self.left = time.perf_counter()


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def measure(row: Row, source: str, tmp: Path, threads: int) -> dict:
    """One run of the real loop with the baselines interleaved step by step (:class:`Pairing`)."""
    cfg = config(row, source, tmp / "run", threads)
    base = Baselines(cfg)
    pairing = Pairing(base, base.data.train.steps_per_epoch(row.batch))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train(cfg, hooks=[pairing])
    loop, model, loader = pairing.loop, pairing.model, pairing.loader
    med = statistics.median
    return dict(
        row=row.name,
        model=row.model,
        batch=row.batch,
        augment=row.augment,
        steps=len(loop),
        e2e=row.batch / med(loop),
        alone=row.batch / med(model),
        loader=row.batch / med(loader),
        ratio=med(m / e for m, e in zip(model, loop)),
        ratio_mean=sum(model) / sum(loop),
    )


HEAD = (
    f"{'row':12} {'model':15} {'batch':>5} {'augment':9} {'steps':>5} {'e2e img/s':>10} {'model img/s':>11} "
    f"{'loader img/s':>12} {'e2e/model':>9} {'(mean)':>7} {'loader/model':>12}"
)


def main(argv: list[str] | None = None) -> list[dict]:
    p = Arguments(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="one-layer models, a few steps (seconds)")
    p.add_argument(
        "--rows", nargs="*", help="rows by their first word: digits, folder, stream (default: digits folder)"
    )
    p.add_argument("--steps", type=int, range=POSITIVE, help="timed steps per row (default: the row's)")
    p.add_argument(
        "--threads",
        type=int,
        range=NON_NEGATIVE,
        default=0,
        help="torch threads for every part (0: crate train's auto)",
    )
    args = p.parse_args(argv)
    threads = resolve_threads(args.threads)
    torch.set_num_threads(threads)  # train() keeps it for its run
    chosen = [r for r in rows(args.tiny) if (r.name.split()[0] in args.rows if args.rows else r.default)]
    if args.steps:
        chosen = [dataclasses.replace(r, steps=args.steps) for r in chosen]
    print(f"torch {torch.__version__}, {threads} thread(s); loop, model and loader interleaved step by step")
    print(f"start: {uptime()}")
    print(HEAD + "\n" + "-" * len(HEAD))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, row in enumerate(chosen):
            where = Path(tmp) / f"row{i}"
            source = row.data
            if row.data != "digits":
                source = str(make_folder(where / "images", row.batch * (WARM + row.steps + 1), int(row.data)))
            m = measure(row, source, where, threads)
            results.append(m)
            print(
                f"{m['row']:12} {m['model']:15} {m['batch']:5d} {m['augment']:9} {m['steps']:5d} {m['e2e']:10,.0f} "
                f"{m['alone']:11,.0f} {m['loader']:12,.0f} {m['ratio']:8.2f}x {m['ratio_mean']:6.2f}x "
                f"{m['loader'] / m['alone']:11.0f}x",
                flush=True,
            )
    print(f"end: {uptime()}")
    return results


if __name__ == "__main__":
    main()
