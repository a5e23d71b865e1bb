"""Greedy decoding with the key-value cache at the sizes people use: CRATE-GPT (one cached tensor per layer, since
Q = K = V = U_kᵀz) against a GPT of the same width, depth, heads and vocabulary (cached K and V, a 4x GELU MLP).

    python benchmarks/bench_generate.py                  # crate_gpt_small, crate_gpt_base, crate_gpt_12l_pile's shape
    python benchmarks/bench_generate.py --models small --batches 1
    python benchmarks/bench_generate.py --uncached       # adds rows without the cache (the whole window each step)
    python benchmarks/bench_generate.py --tiny           # tiny models, seconds: keeps the script alive (a test runs it)

Each pair (CRATE-GPT, GPT) is built from the zoo entry's configuration with random weights (speed does not depend
on the values) and timed on the same prompt, batch 1 and 8, ``--prompt`` tokens then ``--new`` greedy tokens.
tokens/s counts generated tokens of every sequence in the batch; ms/token is the wall time of one decoding step
(the prompt's pass included, spread over the steps).  Every row is the median of ``--repeats`` rounds, the models
interleaved (alternating order), after a short warm-up generation each; the 1-minute load average is printed beside
it.  Benchmarks are not tests: the absolute numbers depend on the machine and its load, the ratios are measured
side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

import crate_transformer as ct
from crate_transformer.lm import LMConfig, build_lm, cache_nbytes

MODELS = {"small": "crate_gpt_small", "base": "crate_gpt_base", "pile": "crate_gpt_12l_pile"}
TINY = dict(dim=32, depth=2, heads=2, vocab_size=64, block_size=64)  # --tiny: every model at this size


def pair(name: str, tiny: bool) -> dict[str, torch.nn.Module]:
    """The zoo's CRATE-GPT and the GPT of its width, depth, heads, vocabulary and context (GPT-2's final norm)."""
    c = ct.model_config(name, **(TINY if tiny else {}))
    gpt = LMConfig(arch="gpt", final_norm=True, **{k: getattr(c, k) for k in ("dim", "depth", "heads", "vocab_size",
                                                                                "block_size")})  # fmt: skip
    torch.manual_seed(0)
    return {"CRATE-GPT": build_lm(dataclasses.replace(c, dropout=0.0)).eval(), "GPT": build_lm(gpt).eval()}


def cache_mib(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> float:
    """MiB of the cache once the prompt and ``new`` generated tokens are in it (what generation holds at the end)."""
    ids = torch.cat([prompt, torch.zeros(prompt.shape[0], new - 1, dtype=torch.long)], 1)
    cache = model.new_cache()
    with torch.no_grad():
        model(ids, cache)
    return cache_nbytes(cache) / 2**20


def timed(models: dict[str, torch.nn.Module], prompt: torch.Tensor, new: int, repeats: int, cached: bool) -> dict:
    """Median seconds of ``generate`` per model, interleaved in alternating order after a 2-token warm-up."""
    for m in models.values():
        m.generate(prompt, 2, temperature=0, use_cache=cached)
    times: dict[str, list[float]] = {k: [] for k in models}
    order = list(models)
    for r in range(repeats):
        for k in order if r % 2 == 0 else order[::-1]:
            t = time.perf_counter()
            models[k].generate(prompt, new, temperature=0, use_cache=cached)
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--new", type=int, default=64, help="generated tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--uncached", action="store_true", help="also time generation without the key-value cache")
    ap.add_argument("--tiny", action="store_true", help="d=32, 2 layers, V=64, 4 + 8 tokens, one repeat")
    args = ap.parse_args()
    if args.tiny:
        args.prompt, args.new, args.repeats = 4, 8, 1
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores, load average "
        f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())} (1 / 5 / 15 min); {args.prompt}-token prompt + "
        f"{args.new} greedy tokens, median of {args.repeats}"
    )
    header = (
        f"{'shape':20} {'model':10} {'params':>12} {'batch':>5} {'cache':>5} {'tokens/s':>9} {'ms/token':>9} "
        f"{'cache MiB':>9} {'CRATE/GPT':>9} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    for key in args.models:
        models = pair(MODELS[key], args.tiny)
        for batch in args.batches:
            prompt = torch.randint(0, models["GPT"].config.vocab_size, (batch, args.prompt))
            mem = {k: cache_mib(m, prompt, args.new) for k, m in models.items()}
            for cached in (True, False) if args.uncached else (True,):
                t = timed(models, prompt, args.new, args.repeats, cached)
                for k, m in models.items():
                    print(
                        f"{MODELS[key]:20} {k:10} {m.num_params():>12,} {batch:>5} {'yes' if cached else 'no':>5} "
                        f"{batch * args.new / t[k]:>9.1f} {1e3 * t[k] / args.new:>9.1f} "
                        f"{mem[k] if cached else float('nan'):>9.2f} {t['GPT'] / t['CRATE-GPT']:>8.2f}x "
                        f"{os.getloadavg()[0]:>5.1f}"
                    )


if __name__ == "__main__":
    main()
