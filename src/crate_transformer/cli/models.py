"""``crate models``: the registry with parameter counts."""

from __future__ import annotations

import argparse


def configure_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'crate_*'")


def run_models(args: argparse.Namespace) -> int:
    from ..model import build_model
    from ..registry import list_models, model_config

    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no registered model matches {args.pattern!r}; run `crate models` to list them all")
    rows = []
    for name in names:
        c = model_config(name)
        params = build_model(c).num_params()
        blocks = f"{c.attention}+{c.mlp}" if c.arch == "crate" else "mhsa+mlp"
        rows.append((name, c.arch, blocks, c.dim, c.depth, c.heads, f"{c.image_size}/{c.patch_size}", f"{params:,}"))
    header = ("name", "arch", "blocks", "dim", "depth", "heads", "img/patch", "params")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    return 0
