"""CRATE-MAE pretraining speed: this implementation vs the official formulation
(``tests/official/crate_ae.py``: conv patch embedding, gather/scatter masking, explicit attention
matrices, three-matmul ISTA), measured in the same run on the same weights and the same masks.

    python benchmarks/bench_mae.py            # MAE-S at 224/16 (batch 8) and the default digits model (batch 32)
    python benchmarks/bench_mae.py --quick    # fewer repeats, for a smoke check
    python benchmarks/bench_mae.py --threads 2
    python benchmarks/bench_mae.py --tiny     # both rows at d = 32, one layer, batch 4 (seconds; a test runs it)

Before timing, the two are checked to give the same loss and predictions (to 1e-5).  One pretraining
step = forward (masking, encoder, decoder, masked-patch loss) + backward + AdamW step.  Rows report
images/s (best of ``--rounds`` rounds) and ours/official.  The visible-only encoder (He et al.; not the
paper's) is timed as a third column for reference; it is a different computation, so it has no parity check.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from _common import POSITIVE, Arguments

import crate_transformer as ct
from crate_transformer.loading.official import mae_native_to_official

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the transcribed official code
from official.crate_ae import EncoderISTA, OfficialCRATEMAE

CONFIGS = {
    "MAE-S 224/16": ("crate_mae_small", {}, 8),
    "digits default (crate_mae_mnist)": ("crate_mae_mnist", {}, 32),  # the batch of `crate pretrain mae`
}
SMALL = dict(dim=32, depth=1, heads=2)
TINY = {  # --tiny: the same two models and code paths, shrunk (MAE-S at 32 px / 8 px patches)
    "MAE-S 32/8 (--tiny, d=32 L=1)": ("crate_mae_small", dict(image_size=32, patch_size=8, **SMALL), 4),
    "digits (--tiny, d=32 L=1)": ("crate_mae_mnist", SMALL, 4),
}


def pair(name: str, overrides: dict) -> tuple[ct.models.mae.CRATEMAE, OfficialCRATEMAE]:
    ours = ct.create_model(name, **overrides)
    c = ours.config
    official = OfficialCRATEMAE(img_size=c.image_size, patch_size=c.patch_size, in_chans=c.in_chans, embed_dim=c.dim,
                                depth=c.depth, num_heads=c.heads, lambd=c.lambd)  # fmt: skip
    official.load_state_dict(mae_native_to_official(ours.state_dict(), c.in_chans), strict=True)
    for m in official.modules():  # the official factories fix η = 0.1; crate_mae_mnist uses 0.5
        if isinstance(m, EncoderISTA):
            m.step_size = c.eta
    return ours, official


def check_parity(ours: torch.nn.Module, official: torch.nn.Module, x: torch.Tensor, noise: torch.Tensor) -> float:
    with torch.no_grad():
        lo, po, _ = official(x, ours.config.mask_ratio, noise)
        ln, pn, _ = ours(x, noise=noise)
    err = max(float((po - pn).abs().max()), float((lo - ln).abs()))
    assert err < 1e-5, f"outputs differ by {err:.2e}"
    return err


def step_fn(model: torch.nn.Module, x: torch.Tensor, noise: torch.Tensor, ratio: float, official: bool):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x, ratio, noise)[0] if official else model(x, noise=noise).loss
        loss.backward()
        opt.step()

    return step


def best_rate(fn, batch: int, rounds: int, seconds: float) -> float:
    """Images/s of the best of ``rounds`` rounds, each repeating ``fn`` for at least ``seconds`` (after warm-up)."""
    for _ in range(3):
        fn()  # warm-up: allocator, autograd graph, optimizer state
    best = float("inf")
    for _ in range(rounds):
        n, t = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t < seconds:
            fn()
            n += 1
        best = min(best, (time.perf_counter() - t) / n)
    return batch / best


def main() -> None:
    ap = Arguments(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, range=POSITIVE, default=1)
    ap.add_argument("--rounds", type=int, range=POSITIVE, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="d = 32, one layer, batch 4, one short round (seconds)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rounds, seconds = (2, 0.3) if args.quick else (args.rounds, 2.0)
    rounds, seconds = (1, 0.02) if args.tiny else (rounds, seconds)
    print(f"torch {torch.__version__}, {args.threads} thread(s), best of {rounds} rounds of >= {seconds} s of steps\n")
    rows = []
    for label, (name, overrides, batch) in (TINY if args.tiny else CONFIGS).items():
        torch.manual_seed(0)
        ours, official = pair(name, overrides)
        c = ours.config
        x = torch.randn(batch, c.in_chans, c.image_size, c.image_size)
        noise = torch.rand(batch, c.grid**2)
        err = check_parity(ours, official, x, noise)
        r_off = best_rate(step_fn(official, x, noise, c.mask_ratio, True), batch, rounds, seconds)
        r_ours = best_rate(step_fn(ours, x, noise, c.mask_ratio, False), batch, rounds, seconds)
        vis = ct.create_model(name, **overrides, visible_only=True)
        vis.load_state_dict(ours.state_dict())
        r_vis = best_rate(step_fn(vis, x, noise, c.mask_ratio, False), batch, rounds, seconds)
        rows.append((label, batch, err, r_off, r_ours, r_vis))
    head = f"{'model':<34} {'batch':>5} {'max |diff|':>10} {'official img/s':>15} {'ours img/s':>11} {'ratio':>6}"
    print(head + f" {'visible-only img/s':>19} {'ratio':>6}")
    for label, batch, err, r_off, r_ours, r_vis in rows:
        print(f"{label:<34} {batch:>5} {err:>10.1e} {r_off:>15.1f} {r_ours:>11.1f} {r_ours / r_off:>5.2f}x"
              f" {r_vis:>19.1f} {r_vis / r_off:>5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
