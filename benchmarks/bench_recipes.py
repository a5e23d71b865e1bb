"""What each training-recipe piece costs per step, against the plain step (AdamW, hard-label cross-entropy).

One training step = (batch-level augmentation) → forward → loss → backward → optimizer step (→ EMA update),
on a CRATE classifier (default: d = 192, 4 layers, 32 px images in 4-px patches, batch 32), median of ``--steps``
timed steps after ``--warmup`` untimed ones, the rows timed round-robin; on the CPU the process's CPU time is
measured (what the step costs, whatever else the machine runs).  Each row changes one thing:

* mixup / cutmix (``train.mix.MixupCutmix``, soft-target cross-entropy); random erasing (p = 0.25);
* drop path 0.1 (stochastic depth); layer-wise lr decay 0.75 (param groups only);
* weight EMA (one ``ModelEma.update`` per step);
* the optimizers SGD, LARS, LAMB, Lion instead of AdamW.

Prints a Markdown table (docs/recipes.md quotes it).  Not a test.

    python benchmarks/bench_recipes.py --threads 1
    python benchmarks/bench_recipes.py --tiny          # d = 32, two layers, batch 4, 2 steps (seconds; a test runs it)
    python benchmarks/bench_recipes.py --device cuda --batch 256 --image-size 224 --patch-size 16
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, POSITIVE, Arguments

from crate_transformer.models.classifier import ModelConfig, build_model
from crate_transformer.train.mix import MixupCutmix, random_erasing, soft_target_cross_entropy
from crate_transformer.train.optim import ModelEma, build_optimizer, param_groups


def _setup(args: argparse.Namespace, drop_path: float = 0.0, optimizer: str = "adamw", layer_decay: float = 1.0):
    torch.manual_seed(0)
    cfg = ModelConfig(image_size=args.image_size, patch_size=args.patch_size, num_classes=10, dim=args.dim,
                      depth=args.depth, heads=args.heads, drop_path=drop_path)  # fmt: skip
    model = build_model(cfg).to(args.device).train()
    lr = {"lion": 1e-4, "sgd": 0.1, "lars": 0.1}.get(optimizer, 1e-3)
    opt = build_optimizer(optimizer, param_groups(model, 0.05, layer_decay), lr=lr)
    return model, opt


def _time_rounds(args: argparse.Namespace, steps: dict[str, Callable[[], None]]) -> dict[str, float]:
    """Median seconds per step of each variant, timed round-robin (one step of each per round) so that a change
    in the machine's load hits every row alike; on the CPU the process's CPU time (other processes' work on a
    shared machine does not count), on CUDA synchronised wall time."""
    cuda = args.device.startswith("cuda")
    clock = time.perf_counter if cuda else time.process_time
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in steps.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = clock()
            step()
            if cuda:
                torch.cuda.synchronize()
            times[name].append(clock() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def _variant(args: argparse.Namespace, name: str) -> Callable[[], None]:
    """The step function of row ``name``."""
    kw = {"drop path 0.1": dict(drop_path=0.1), "LLRD 0.75": dict(layer_decay=0.75)}.get(name, {})
    opt_name = name.split()[0].lower() if name.split()[0].lower() in ("sgd", "lars", "lamb", "lion") else "adamw"
    model, opt = _setup(args, optimizer=opt_name, **kw)
    x = torch.rand(args.batch, 3, args.image_size, args.image_size, device=args.device)
    y = torch.randint(0, 10, (args.batch,), device=args.device)
    mix = MixupCutmix(10, 0.8, 1.0, switch_prob=0.0 if name == "mixup" else 1.0).to(args.device)
    erase = random_erasing(0.25).to(args.device)
    ema = ModelEma(model, 0.9999) if name == "EMA" else None

    def step() -> None:
        xb, target = x, None
        if name in ("mixup", "cutmix"):
            xb, target = mix(x, y)
        elif name == "random erasing":
            xb = erase(x)
        logits = model(xb)
        loss = soft_target_cross_entropy(logits, target) if target is not None else F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if ema is not None:
            ema.update(model)

    return step


ROWS = ["plain (AdamW)", "mixup", "cutmix", "random erasing", "drop path 0.1", "LLRD 0.75", "EMA",
        "SGD momentum", "LARS", "LAMB", "Lion"]  # fmt: skip


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, range=NON_NEGATIVE, default=0, help="torch threads (0 = default)")
    p.add_argument("--batch", type=int, range=POSITIVE, default=32)
    p.add_argument("--image-size", type=int, range=POSITIVE, default=32)
    p.add_argument("--patch-size", type=int, range=POSITIVE, default=4)
    p.add_argument("--dim", type=int, range=POSITIVE, default=192)
    p.add_argument("--depth", type=int, range=POSITIVE, default=4)
    p.add_argument("--heads", type=int, range=POSITIVE, default=3)
    p.add_argument("--steps", type=int, range=POSITIVE, default=15)
    p.add_argument("--warmup", type=int, range=NON_NEGATIVE, default=3)
    p.add_argument(
        "--tiny", action="store_true", help="d = 32, two layers (drop path has one to drop), 16 px, batch 4, 2 steps"
    )
    args = p.parse_args()
    if args.tiny:
        args.dim, args.depth, args.heads, args.image_size, args.batch, args.steps, args.warmup = 32, 2, 2, 16, 4, 2, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    seconds = _time_rounds(args, {name: _variant(args, name) for name in ROWS})
    base = seconds[ROWS[0]]
    where = f"{args.device}, {torch.get_num_threads()} thread(s), torch {torch.__version__}, {platform.machine()}"
    print(f"CRATE d={args.dim} L={args.depth} {args.image_size}px/{args.patch_size}, batch {args.batch}, {where}")
    unit = "ms / step (wall)" if args.device.startswith("cuda") else "CPU ms / step"
    print(f"\n| piece | {unit} | × plain step |\n|---|---:|---:|")
    for name in ROWS:
        print(f"| {name} | {1000 * seconds[name]:.1f} | {seconds[name] / base:.2f} |")


if __name__ == "__main__":
    main()
