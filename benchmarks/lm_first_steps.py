"""What a language model's layers do in the first steps of ``crate train-lm``'s default run (the evidence for the
unigram plateau in docs/language-models.md).

The default recipe is run for ``--steps`` steps (the schedule of the whole default run, cut there) and every
``--every`` steps, on the first 16 held-out windows, it measures:

* the held-out loss per token, against the unigram entropy of the training tokens;
* ``attn/x`` — each layer's MSSA (or attention) update over the tokens it is added to, ``‖Z½ − Z‖ / ‖Z‖``;
* ``R²`` — the share of the variance of each layer's output tokens that the current token's id explains
  (between-id variance / total variance): how much the layer still knows which token it is at;
* ``zero`` — the exact-zero share of each layer's output (the ISTA codes' sparsity; 0 for residual layers);
* ``‖∂L/∂Z‖`` — the mean per-token gradient of the loss with respect to the embedding and each layer's output
  (x 1000), and the gradient norms of the first and last layer's ``U`` (``attn.qkv``).

Models: ``crate`` (crate_gpt_mini with the token prior, the default), ``crate_plain`` (without: the initialisation of
crate-lm's crate.py), and the ``gpt`` of ``bench_lm_plateau.py`` (equal size).  Prints one Markdown table per model.

    python benchmarks/lm_first_steps.py --data english --threads 1
    python benchmarks/lm_first_steps.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, POSITIVE, Arguments

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_lm_plateau as plateau  # noqa: E402

from crate_transformer.cli.options import parse_model_args  # noqa: E402
from crate_transformer.data.text import TokenBlocks  # noqa: E402
from crate_transformer.layers import trace_layer  # noqa: E402
from crate_transformer.train import TrainConfig, train  # noqa: E402
from crate_transformer.train.lm import LMTask  # noqa: E402

WINDOWS = 16


def token_share(z: torch.Tensor, ids: torch.Tensor) -> float:
    """The share of the variance of the tokens ``z`` (…, d) explained by their ids ``ids`` (…)."""
    flat, ids = z.reshape(-1, z.shape[-1]).double(), ids.reshape(-1)
    centred = flat - flat.mean(0)
    sums = torch.zeros(int(ids.max()) + 1, flat.shape[1], dtype=flat.dtype).index_add_(0, ids, centred)
    counts = torch.bincount(ids).clamp_min(1)[:, None].double()
    between = ((sums / counts) ** 2 * counts).sum() / len(ids)
    return float(between / centred.pow(2).sum(-1).mean())


def measure(model: torch.nn.Module, blocks: torch.Tensor) -> dict[str, Any]:
    """One row of the table on the windows ``blocks`` (b, n + 1)."""
    x, y = blocks[:, :-1], blocks[:, 1:]
    was = model.training
    model.eval()
    zs = [model.embed(x).detach().requires_grad_(True)]
    halves = []
    z = zs[0]
    for layer in model.layers:
        z, half, _ = trace_layer(layer, z)
        z.retain_grad()
        zs.append(z)
        halves.append(half)
    loss = F.cross_entropy(model.forward_head(model.norm(z)).float().flatten(0, 1), y.flatten())
    model.zero_grad(set_to_none=True)
    loss.backward()
    row = {
        "loss": float(loss.detach()),
        "attn/x": [float((h - z0).norm(dim=-1).mean() / z0.norm(dim=-1).mean()) for h, z0 in zip(halves, zs)],
        "R2": [token_share(z.detach(), x) for z in zs],
        "zero": [float((z == 0).double().mean()) for z in zs[1:]],
        "grad_z": [1e3 * float(z.grad.norm(dim=-1).mean()) for z in zs],
        "grad_U": [float(model.layers[i].attn.qkv.weight.grad.norm()) for i in (0, -1)],
    }
    model.zero_grad(set_to_none=True)
    model.train(was)
    return row


def reinitialise(model: torch.nn.Module, changes: list[str]) -> None:
    """Initialisation variants before the first step: ``ista=normal`` (the ISTA dictionaries N(0, 0.02), as the
    Linear layers), ``ista=zero`` (D = 0: the ISTA step is ReLU(z − ηλ)), ``embed=STD`` (token and position tables
    N(0, STD²))."""
    with torch.no_grad():
        for change in changes:
            what, value = change.split("=")
            for name, p in model.named_parameters():
                if what == "ista" and name.endswith("ista.weight"):
                    p.normal_(0, 0.02) if value == "normal" else p.zero_()
                if what == "embed" and name in ("wte.weight", "wpe.weight"):
                    p.normal_(0, float(value))


def run(source: str, name: str, args: dict, prior: bool, opts: argparse.Namespace, out: Path) -> list[dict]:
    held, entropy = plateau.corpus_facts(source, args.get("block_size", 128))
    windows = next(
        iter(TokenBlocks(held.tokens, held.block_size, held.lo, held.hi, "", "").batches(WINDOWS, shuffle=False))
    )
    rows: list[dict] = []

    def hook(ctx: Any) -> None:
        if ctx.step == 0:
            reinitialise(ctx.model, opts.init)
        if ctx.step % opts.every == 0:
            rows.append({"step": ctx.step, **measure(ctx.model, windows)})

    extra = {"epochs": 1, "batch_size": 8} if opts.tiny else {}
    base = TrainConfig.from_dict({**LMTask.defaults, "task": "lm"})  # the task's defaults, then --recipe's options
    cfg = TrainConfig.from_dict({
        **extra, **(opts.recipe or {}), "model": name, "model_args": {**args, **opts.model_args}, "data": source,
        "seed": opts.seed, "threads": opts.threads, "out": str(out), "progress": False, "max_steps": opts.steps,
        "eval_every": 0, "task_args": {"sample_tokens": 0, "token_prior": prior},
    }, base)  # fmt: skip
    train(cfg, hooks=[hook])
    print(f"\n{name} {args or ''} token prior {'on' if prior else 'off'} (unigram entropy {entropy:.3f}), "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    layers = len(rows[0]["zero"])
    print("| step | held-out loss | attn/x, layers 1→L | R² embedding, layers 1→L | zero, layers 1→L "
          "| ‖∂L/∂Z‖ x1e3 embedding, layers 1→L | ‖∂L/∂U‖ layer 1, L |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cols = [" ".join(f"{v:.{d}f}" for v in r[k]) for k, d in (("attn/x", 1), ("R2", 2), ("zero", 2), ("grad_z", 2))]
        print(
            f"| {r['step']} | {r['loss']:.3f} | "
            + " | ".join(cols)
            + f" | {r['grad_U'][0]:.4f}, {r['grad_U'][1]:.4f} |"
        )
    assert layers == len(rows[-1]["zero"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Arguments(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="english", help="python-docs | stdlib | english (built by lm_corpora.py)")
    p.add_argument(
        "--models", nargs="+", choices=("crate", "crate_plain", "gpt"), default=["crate", "crate_plain", "gpt"]
    )
    p.add_argument("--steps", type=int, range=POSITIVE, default=120)
    p.add_argument("--every", type=int, range=POSITIVE, default=20)
    p.add_argument("--seed", type=int, range=NON_NEGATIVE, default=0)
    p.add_argument("--threads", type=int, range=NON_NEGATIVE, default=1)
    p.add_argument("--chars", type=int, range=POSITIVE, default=500_000)
    p.add_argument("--model-args", nargs="*", default=[], metavar="KEY=VALUE", help="e.g. lambd=0 final_norm=true")
    p.add_argument("--recipe", type=json.loads, default=None, help='options over the defaults, e.g. {"lr": 1e-3}')
    p.add_argument("--init", nargs="*", default=[], help="ista=normal | ista=zero | embed=STD (see reinitialise)")
    p.add_argument("--tiny", action="store_true", help="tiny models and corpus, a few steps (what a test runs)")
    opts = p.parse_args(argv)
    opts.model_args = parse_model_args(opts.model_args)
    if opts.tiny:
        opts.steps, opts.every = min(opts.steps, 4), min(opts.every, 2)
    models = plateau.model_args(opts.tiny)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        source = plateau.corpus_source(opts.data, argparse.Namespace(tiny=opts.tiny, chars=opts.chars), where)
        for m in opts.models:
            name, args, _ = models["gpt" if m == "gpt" else "crate"]
            run(source, name, args, m != "crate_plain", opts, where / m)
    return 0


if __name__ == "__main__":
    sys.exit(main())
