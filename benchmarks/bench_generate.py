"""Greedy decoding with the key-value cache at the sizes people use: CRATE-GPT (one cached tensor per layer, since
Q = K = V = U_kᵀz) against a GPT of the same width, depth, heads and vocabulary (cached K and V, a 4x GELU MLP).

    python benchmarks/bench_generate.py                  # crate_gpt_small, crate_gpt_base, crate_gpt_12l_pile's shape
    python benchmarks/bench_generate.py --models small --batches 1
    python benchmarks/bench_generate.py --uncached       # adds rows without the cache (the whole window each step)
    python benchmarks/bench_generate.py --tiny           # tiny models, seconds: keeps the script alive (a test runs it)
    python benchmarks/bench_generate.py --compile        # adds compiled static-cache rows (generate(compile=True))
    python benchmarks/bench_generate.py --kernels        # operators / kernels per token, eager vs compiled (profiler)

Each pair (CRATE-GPT, GPT) is built from the zoo entry's configuration with random weights (speed does not depend
on the values) and timed on the same prompt, batch 1 and 8, ``--prompt`` tokens then ``--new`` greedy tokens.
tokens/s counts generated tokens of every sequence in the batch; ms/token is the wall time of one decoding step
(the prompt's pass included, spread over the steps).  Every row is the median of ``--repeats`` rounds, the models
interleaved (alternating order), after a short warm-up generation each (which compiles the step for ``--compile``
rows; ``compiled/eager`` is the ratio of a model's compiled to its eager tokens/s, timed in the same rounds); the
1-minute load average is printed beside it.  ``--kernels`` counts, with ``torch.profiler``, the kernels of one
decoding step averaged over the steps of a generation: inductor's fused kernels, and the outermost aten calls
that do work (a matmul, a copy; not views or allocations).  Benchmarks are not tests: the absolute numbers depend
on the machine and its load, the ratios are measured side by side.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
from _common import POSITIVE, Arguments

import crate_transformer as ct
from crate_transformer.models.lm import LMConfig, build_lm, cache_nbytes

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


def timed(models: dict[str, torch.nn.Module], prompt: torch.Tensor, new: int, repeats: int, how: dict) -> dict:
    """Median seconds of ``generate`` per (model, mode), interleaved in alternating order after a warm-up (``how``:
    mode → generate's keyword arguments)."""
    runs = {(k, mode): (m, kw) for k, m in models.items() for mode, kw in how.items()}
    for m, kw in runs.values():
        m.generate(prompt, new if kw.get("compile") else 2, temperature=0, **kw)
    times: dict[tuple, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for r in range(repeats):
        for key in order if r % 2 == 0 else order[::-1]:
            m, kw = runs[key]
            t = time.perf_counter()
            m.generate(prompt, new, temperature=0, **kw)
            times[key].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


NO_WORK = ("aten::empty", "aten::as_strided", "aten::view", "aten::resolve_conj", "aten::_unsafe_view", "aten::alias",
           "aten::reshape", "aten::expand", "aten::transpose", "aten::t", "aten::unsqueeze", "aten::slice",
           "aten::select", "aten::detach", "aten::lift_fresh", "aten::_reshape_alias", "aten::permute")  # fmt: skip


def _is_kernel(e: object) -> bool:
    """An inductor kernel, or an outermost aten call that does work (its own kernel eager, or an extern call)."""
    if "cpp_fused" in e.name or e.name.startswith("triton_"):
        return True
    parent = e.cpu_parent
    outermost = parent is None or not parent.name.startswith("aten::")
    return e.name.startswith("aten::") and outermost and not e.name.startswith(NO_WORK)


def kernels_per_token(model: torch.nn.Module, prompt: torch.Tensor, new: int, compile: bool) -> float:
    """Leaf profiler events (kernels) per generated token after the prompt: (a generation of ``new`` tokens minus
    one of 1 token) / (new - 1), after a warm-up generation (the compilation)."""
    from torch.profiler import ProfilerActivity, profile

    def count(tokens: int) -> int:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model.generate(prompt, tokens, temperature=0, compile=compile)
        return sum(1 for e in prof.events() if _is_kernel(e))

    model.generate(prompt, new, temperature=0, compile=compile)
    return (count(new) - count(1)) / (new - 1)


def main() -> None:
    ap = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--batches", nargs="+", type=int, range=POSITIVE, default=[1, 8])
    ap.add_argument("--prompt", type=int, range=POSITIVE, default=32, help="prompt tokens")
    ap.add_argument("--new", type=int, range=POSITIVE, default=64, help="generated tokens")
    ap.add_argument("--repeats", type=int, range=POSITIVE, default=3)
    ap.add_argument("--threads", type=int, range=POSITIVE, default=1)
    ap.add_argument("--uncached", action="store_true", help="also time generation without the key-value cache")
    ap.add_argument("--compile", action="store_true", help="also time compiled static-cache decoding")
    ap.add_argument("--kernels", action="store_true", help="count kernels per token, eager vs compiled, and stop")
    ap.add_argument("--tiny", action="store_true", help="d=32, 2 layers, V=64, 4 + 8 tokens, one repeat")
    args = ap.parse_args()
    if args.tiny:
        args.prompt, args.new, args.repeats = 4, 8, 1
    torch.set_num_threads(args.threads)
    if args.kernels:
        import torch._inductor.config as inductor

        inductor.cpp.enable_kernel_profile = True  # inductor's C++ kernels appear in the profiler's table
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} cores, load average "
        f"{' / '.join(f'{v:.1f}' for v in os.getloadavg())} (1 / 5 / 15 min); {args.prompt}-token prompt + "
        f"{args.new} greedy tokens, median of {args.repeats}"
    )
    if args.kernels:
        return print_kernels(args)
    header = (
        f"{'shape':20} {'model':10} {'params':>12} {'batch':>5} {'mode':>8} {'tokens/s':>9} {'ms/token':>9} "
        f"{'cache MiB':>9} {'CRATE/GPT':>9} {'compiled/eager':>14} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    how = {"cached": {}}
    how.update({"compiled": {"compile": True}} if args.compile else {})
    how.update({"uncached": {"use_cache": False}} if args.uncached else {})
    for key in args.models:
        models = pair(MODELS[key], args.tiny)
        for batch in args.batches:
            prompt = torch.randint(0, models["GPT"].config.vocab_size, (batch, args.prompt))
            mem = {k: cache_mib(m, prompt, args.new) for k, m in models.items()}
            t = timed(models, prompt, args.new, args.repeats, how)
            for mode in how:
                for k, m in models.items():
                    vs = f"{t[k, 'cached'] / t[k, mode]:.2f}x" if mode == "compiled" else ""
                    print(
                        f"{MODELS[key]:20} {k:10} {m.num_params():>12,} {batch:>5} {mode:>8} "
                        f"{batch * args.new / t[k, mode]:>9.1f} {1e3 * t[k, mode] / args.new:>9.1f} "
                        f"{mem[k] if mode != 'uncached' else float('nan'):>9.2f} "
                        f"{t['GPT', mode] / t['CRATE-GPT', mode]:>8.2f}x {vs:>14} {os.getloadavg()[0]:>5.1f}"
                    )


def print_kernels(args: argparse.Namespace) -> None:
    """Kernels per token of each model of each shape, eager and compiled (batch: the first of ``--batches``)."""
    print(f"{'shape':20} {'model':10} {'eager':>8} {'compiled':>9}  kernels per token (profiler)")
    for key in args.models:
        models = pair(MODELS[key], args.tiny)
        prompt = torch.randint(0, models["GPT"].config.vocab_size, (args.batches[0], args.prompt))
        for k, m in models.items():
            counts = [kernels_per_token(m, prompt, args.new, c) for c in (False, True)]
            print(f"{MODELS[key]:20} {k:10} {counts[0]:>8.1f} {counts[1]:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
