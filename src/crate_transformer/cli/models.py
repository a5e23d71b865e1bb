"""``crate models``: the registry with parameter counts."""

from __future__ import annotations

import argparse


def configure_models(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style filter, e.g. 'crate_*'")


def run_models(args: argparse.Namespace) -> int:
    import torch

    from ..lm import LMConfig
    from ..registry import build, list_models, model_config

    names = list_models(args.pattern)
    if not names:
        raise ValueError(f"no registered model matches {args.pattern!r}; run `crate models` to list them all")
    rows = []
    for name in names:
        c = model_config(name)
        with torch.device("meta"):  # counts only: no memory, no initialisation
            model = build(c)
        params = f"{model.num_params():,}"
        if isinstance(c, LMConfig):
            kind = ("GPT " if c.causal else "BERT ") + f"ctx {c.block_size}, vocab {c.vocab_size:,}"
            rows.append((name, c.arch, "", c.dim, c.depth, c.heads, kind, params))
            continue
        if c.arch == "crate_mae":  # Table 9 counts the official layout (unused decoder_embed, both sin-cos tables)
            params += f" ({model.num_params(layout='official'):,} official)"
        blocks = "mhsa+mlp" if c.arch == "vit" else f"{getattr(c, 'attention', 'mssa')}+{getattr(c, 'mlp', 'ista')}"
        rows.append((name, c.arch, blocks, c.dim, c.depth, c.heads, f"image {c.image_size}/{c.patch_size}", params))
    header = ("name", "arch", "blocks", "dim", "depth", "heads", "input", "params")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths)))
    return 0
