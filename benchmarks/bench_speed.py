"""Speed of this implementation vs the official formulation (explicit attention matrix, three-matmul
ISTA; ``tests/official/crate.py``), measured in the same run on the same weights.

    python benchmarks/bench_speed.py            # CRATE-T and CRATE-S at 224/16 and 32/4
    python benchmarks/bench_speed.py --compile  # adds torch.compile rows (first compile ~30 s each)
    python benchmarks/bench_speed.py --quick    # fewer repeats, for a smoke check

Prints images/s for forward (inference) and forward+backward, the ratio ours/official, and the
achieved GFLOP/s of each against a GEMM peak measured at the start.  FLOPs are the model's matmul
FLOPs in our (minimal) formulation; forward+backward counts 3x forward.  "FLOP ratio" is the official
formulation's matmul FLOPs over ours: the speedup that equal hardware efficiency would give.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import crate_transformer as ct
from crate_transformer.official import native_to_official

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the transcribed official code
from official.crate import OfficialCRATE


def gemm_peak(sizes=(1024, 2048), repeats: int = 5) -> float:
    best = 0.0
    for s in sizes:
        a, b = torch.randn(s, s), torch.randn(s, s)
        a @ b
        t = time.perf_counter()
        for _ in range(repeats):
            a @ b
        best = max(best, 2 * s**3 * repeats / (time.perf_counter() - t) / 1e9)
    return best


def model_flops(c: ct.ModelConfig, ista_matmuls: int = 1) -> float:
    """Forward matmul FLOPs per image: patch embed, per layer U, attention (2 n² Kp ×2), W, ISTA, head.

    ISTA is one d×d matmul per token in our formulation and three in the official one.
    """
    n, d, inner = c.grid**2 + 1, c.dim, c.heads * c.head_dim
    per_layer = 2 * n * d * inner * 2 + 2 * 2 * n * n * inner + 2 * n * d * d * ista_matmuls
    return 2 * (n - 1) * c.in_chans * c.patch_size**2 * d + c.depth * per_layer + 2 * d * c.num_classes


def step_fns(model: torch.nn.Module, x: torch.Tensor):
    def fwd():
        with torch.inference_mode():
            model(x)

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    return fwd, fwd_bwd


def best_times(impls: list[tuple[str, torch.nn.Module]], x: torch.Tensor, rounds: int) -> dict[str, list[float]]:
    """Min over ``rounds`` of each step, implementations interleaved so background load hits all alike."""
    fns = {label: step_fns(model, x) for label, model in impls}
    for fwd, fwd_bwd in fns.values():  # warm-up (and compilation)
        fwd(), fwd_bwd()
    best = {label: [float("inf"), float("inf")] for label in fns}
    for _ in range(rounds):
        for label, pair in fns.items():
            for i, fn in enumerate(pair):
                t = time.perf_counter()
                fn()
                best[label][i] = min(best[label][i], time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(ours)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    repeats = 2 if args.quick else 6
    peak = gemm_peak()
    print(f"torch {torch.__version__}, {args.threads} threads, measured fp32 GEMM peak {peak:.0f} GFLOP/s\n")
    setups = [
        ("crate_tiny", 224, 16, 16),
        ("crate_small", 224, 16, 16),
        ("crate_tiny", 32, 4, 128),
        ("crate_small", 32, 4, 128),
    ]
    header = (
        f"{'model':12} {'img/p':>6} {'batch':>5} {'impl':10} {'fwd img/s':>10} {'fwd+bwd img/s':>14} "
        f"{'GFLOP/s f':>10} {'GFLOP/s fb':>11} {'%peak fb':>8} {'speedup f':>9} {'speedup fb':>10} {'FLOP ratio':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, size, patch, batch in setups:
        torch.manual_seed(0)
        ours = ct.create_model(name, image_size=size, patch_size=patch).train()
        c = ours.config
        off = OfficialCRATE(
            image_size=size, patch_size=patch, num_classes=c.num_classes, dim=c.dim, depth=c.depth, heads=c.heads
        ).train()
        off.load_state_dict(native_to_official(ours.state_dict()))
        x = torch.randn(batch, 3, size, size)
        flops = model_flops(c) * batch
        impls = [("official", off), ("ours", ours)]
        if args.compile:
            impls.append(("ours+comp", torch.compile(ours)))
        ceiling = model_flops(c, ista_matmuls=3) / model_flops(c)
        times = best_times(impls, x, repeats)
        base = times["official"]
        for label, (tf, tfb) in times.items():
            gf, gfb = flops / tf / 1e9, 3 * flops / tfb / 1e9
            print(
                f"{name:12} {f'{size}/{patch}':>6} {batch:>5} {label:10} {batch / tf:>10.1f} {batch / tfb:>14.1f} "
                f"{gf:>10.1f} {gfb:>11.1f} {100 * gfb / peak:>7.0f}% {base[0] / tf:>8.2f}x {base[1] / tfb:>9.2f}x "
                f"{ceiling:>9.2f}x"
            )
        print()


if __name__ == "__main__":
    main()
