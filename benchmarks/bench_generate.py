"""Generation with a key-value cache: CRATE-GPT (one cached tensor per layer, since Q = K = V = U_kᵀz) against
a standard GPT of the same width, depth and heads (cached K and V), each also without a cache.

    python benchmarks/bench_generate.py             # d=256, 4 layers, 4 heads, V=8,192, 32-token prompt + 224 new
    python benchmarks/bench_generate.py --quick     # smaller and shorter, a smoke check

All four are measured in the same run, interleaved over ``--rounds`` rounds (best round kept), on one thread,
from the same prompt with greedy decoding (so every variant does the same number of steps).  Prints tokens/s,
the cache size at the end of generation, and the ratios.  Benchmarks are not tests: the numbers depend on the
machine and its load (printed).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from crate_transformer.lm import LMConfig, build_lm, cache_nbytes


def timed_generate(model: torch.nn.Module, prompt: torch.Tensor, new: int, use_cache: bool) -> float:
    t = time.perf_counter()
    model.generate(prompt, new, temperature=0, use_cache=use_cache)
    return time.perf_counter() - t


def cache_size(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> int:
    """Bytes of the cache once ``prompt`` and ``new`` generated tokens are in it (what generation holds at the end)."""
    ids = torch.cat([prompt, torch.zeros(prompt.shape[0], new - 1, dtype=torch.long)], 1)
    cache = model.new_cache()
    with torch.no_grad():
        model(ids, cache)
    return cache_nbytes(cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--new", type=int, default=224, help="generated tokens")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="d=128, 2 layers, 32 + 96 tokens, 1 round")
    args = ap.parse_args()
    if args.quick:
        args.dim, args.depth, args.heads, args.vocab, args.prompt, args.new, args.rounds = 128, 2, 4, 4096, 32, 96, 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    size = dict(
        dim=args.dim, depth=args.depth, heads=args.heads, vocab_size=args.vocab, block_size=args.prompt + args.new
    )
    models = {
        "CRATE-GPT": build_lm(LMConfig(arch="crate_lm", **size)).eval(),
        "GPT": build_lm(LMConfig(arch="gpt", final_norm=True, **size)).eval(),
    }
    prompt = torch.randint(0, args.vocab, (args.batch, args.prompt))
    variants = [(name, use_cache) for name in models for use_cache in (True, False)]
    best = {v: float("inf") for v in variants}
    for _ in range(args.rounds):
        for name, use_cache in variants:
            best[(name, use_cache)] = min(
                best[(name, use_cache)], timed_generate(models[name], prompt, args.new, use_cache)
            )
    tps = {v: args.batch * args.new / t for v, t in best.items()}
    mem = {name: cache_size(m, prompt, args.new) for name, m in models.items()}
    params = {name: m.num_params() for name, m in models.items()}

    print(
        f"d={args.dim}, {args.depth} layers, {args.heads} heads, V={args.vocab:,}; batch {args.batch}, "
        f"{args.prompt}-token prompt + {args.new} generated (greedy); {args.threads} thread(s), best of "
        f"{args.rounds}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print(f"{'model':10} {'params':>12} {'cache':>7} {'tokens/s':>9} {'cache MiB':>10} {'cache/token/layer':>18}")
    for name, use_cache in variants:
        per = mem[name] / (args.batch * (args.prompt + args.new - 1) * args.depth)
        cache_txt = f"{mem[name] / 2**20:10.2f} {per:14.0f} B" if use_cache else f"{'-':>10} {'-':>16}"
        print(
            f"{name:10} {params[name]:12,} {'yes' if use_cache else 'no':>7} {tps[(name, use_cache)]:9.1f} {cache_txt}"
        )
    print("ratios (same run):")
    print(f"  cache memory, CRATE-GPT / GPT:            {mem['CRATE-GPT'] / mem['GPT']:.3f}")
    print(f"  tokens/s with cache, CRATE-GPT / GPT:     {tps[('CRATE-GPT', True)] / tps[('GPT', True)]:.2f}")
    print(f"  tokens/s, cache / no cache, CRATE-GPT:    {tps[('CRATE-GPT', True)] / tps[('CRATE-GPT', False)]:.2f}")
    print(f"  tokens/s, cache / no cache, GPT:          {tps[('GPT', True)] / tps[('GPT', False)]:.2f}")
    print(f"  parameters, CRATE-GPT / GPT:              {params['CRATE-GPT'] / params['GPT']:.3f}")


if __name__ == "__main__":
    main()
