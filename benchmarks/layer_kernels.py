"""Kernels per layer of a training step, CRATE against a ViT of the same width, eager and compiled, on the CPU.

Inductor decides what to fuse before it knows the device, so what a compiled step is made of can be counted here
(issue 42: CRATE-B's compiled MFU on an H200 was 25.5% against the ViT's 46.7%).  For each model (CRATE-B and
ViT-B at 224/16 by default, batch 4, bf16 autocast as a GPU run trains) built at two depths, the difference is
one layer's share:

* eager: the aten operators one forward+backward dispatches (``attention_kernels.eager_ops``);
* compiled: the kernel calls of inductor's forward and backward modules (``attention_kernels.compiled_calls``):
  fused kernels it wrote, extern kernels (the GEMMs) and aten fallbacks (the attention kernels).

    python benchmarks/layer_kernels.py               # about five minutes on two cores (four inductor builds)
    python benchmarks/layer_kernels.py --models crate_base --depths 1 2 --batch 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from _common import POSITIVE, Arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attention_kernels import _commit, compiled_calls, eager_ops  # noqa: E402

TINY = dict(image_size=32, patch_size=8, dim=32, heads=4)


def counts(name: str, depth: int, batch: int, amp: torch.dtype | None, **shape: int) -> dict[str, Counter]:
    """Eager aten operators and compiled kernel calls (forward and backward modules apart) of one training step of
    ``name`` at ``depth`` layers (``shape``: other overrides of the model's configuration)."""
    import torch.nn.functional as F

    import crate_transformer as ct

    torch.manual_seed(0)
    model = ct.create_model(name, depth=depth, num_classes=10, **shape).train()
    x = torch.randn(batch, 3, model.config.image_size, model.config.image_size)
    y = torch.randint(0, 10, (batch,))

    class Loss(torch.nn.Module):  # attention_kernels' step differentiates the module's output
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(self.model(images).float(), y)

    loss, one = Loss(), torch.tensor(1.0)
    calls = compiled_calls(loss, x, one, amp)[0]
    return {"eager": eager_ops(loss, x, one, amp), "forward": calls[0], "backward": sum(calls[1:], Counter())}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["crate_base", "vit_base"])
    ap.add_argument(
        "--depths", nargs=2, type=int, range=POSITIVE, default=[3, 4], help="two depths; their difference is a layer"
    )
    ap.add_argument(
        "--batch",
        type=int,
        range=POSITIVE,
        default=4,
        help="images per step (CRATE's ISTA takes its fused product from as many token rows as the width on)",
    )
    ap.add_argument("--amp", default="bf16", choices=("bf16", "none"))
    ap.add_argument("--tiny", action="store_true", help="32 px, patch 8, width 32 (what the tests run)")
    ap.rule(
        lambda a: a.depths[0] < a.depths[1],
        "--depths: the second depth must be larger than the first (a layer is their difference); e.g. --depths 3 4",
    )
    args = ap.parse_args(argv)
    amp = torch.bfloat16 if args.amp == "bf16" else None
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M')} commit {_commit()}; torch {torch.__version__}; load {load}")
    print(f"per layer (depth {args.depths[1]} minus depth {args.depths[0]}), batch {args.batch}, amp {args.amp}")
    rows = []
    for name in args.models:
        low, high = (counts(name, d, args.batch, amp, **(TINY if args.tiny else {})) for d in args.depths)
        layer = {part: high[part] - low[part] for part in high}
        row = dict(
            model=name, eager=sum(layer["eager"].values()), **{p: dict(layer[p]) for p in ("forward", "backward")}
        )
        rows.append(row)
        print(
            f"{name:12s} eager {row['eager']:4d} aten ops; compiled forward {row['forward']}, "
            f"backward {row['backward']}",
            flush=True,
        )
    return rows


if __name__ == "__main__":
    main()
