"""Training-step throughput on a GPU: CRATE-T/S/B/L at 224/16 in bf16 autocast, eager and torch.compile, against
the official formulation (``tests/official/crate.py``, the same weights) and a ViT of equal width and depth (ours;
timm's ``vit_base_patch16_224`` beside CRATE-B where timm imports), interleaved in one run; then ``crate train`` end
to end against the model alone (the data path's share); then greedy decoding, CRATE-GPT against a GPT of the same
width, depth, heads and vocabulary (``benchmarks/bench_generate.py``'s pairs), batch 1 and 8, eager and compiled
(``generate(compile=True)``: static cache, one CUDA graph per token), fp32 and bf16 autocast.  The attention rows
time TSSA / MSSA / softmax attention alone (1k-64k tokens), and TSSA and MSSA compiled (``tssa-compiled``,
``mssa-compiled``: inductor's fused kernels against eager's launches) at the lengths up to 4,096 only, where TSSA
lost to MSSA eager: their compilations (one per length, printed apart from the timing) run last, after the compiled
training rows, so a stage's time limit that cuts them costs no other row.

    python benchmarks/bench_gpu.py                      # on a GPU: the full table (about 4 minutes on an H100)
    python benchmarks/bench_gpu.py --sizes B --compile B  # one size
    python benchmarks/bench_gpu.py --tiny                # CPU, tiny shapes: keeps the script alive (the tests run it)
    python benchmarks/bench_gpu.py --sizes --compile --e2e none --decode base   # decoding rows only
    python benchmarks/bench_gpu.py --profile B          # where one training step's time goes, kernel by kernel
    python benchmarks/bench_gpu.py --sizes --compile --e2e none --decode --attention-tokens 1024 4096  # attention only

Each row: one optimizer step (forward + backward + AdamW) on a batch already on the device; images/s is the median
over interleaved rounds, TFLOP/s counts the step's FLOPs with ``torch.utils.flop_counter`` (each model's own
formulation), MFU divides by a bf16 GEMM peak measured at the start of the same run.  ``crate train``'s images/s
is the median ``samples_per_s`` of its logged windows (after the first) on in-memory synthetic images resized and
augmented on the device, against the same model's compute alone (fwd + bwd + clip + AdamW, same batch and amp).

Targets (issue 28, on a GPU): CRATE-B/16 bf16 ≥ 1.3x the official formulation's images/s and ≥ 1.8x a ViT-B/16's;
compiled MFU ≥ 35%; data path ≥ 0.9 of the model alone.  Decoding (issue 42): crate_gpt_base compiled ≥ 2,000
tokens/s at batch 1 and ≥ 10,000 at batch 8, bf16 no slower than fp32, ≥ 1.3x the GPT.  Printed beside the numbers,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _common import NON_NEGATIVE, POSITIVE, Arguments
from torch.utils.flop_counter import FlopCounterMode

import crate_transformer as ct
from crate_transformer.loading.official import native_to_official

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the transcribed official code
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_generate's pairs
from bench_generate import MODELS as DECODE_MODELS  # noqa: E402
from bench_generate import pair  # noqa: E402
from official.crate import OfficialCRATE  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_tost's operator builder

SIZES = {"T": "crate_tiny", "S": "crate_small", "B": "crate_base", "L": "crate_large"}
BATCH = {"T": 256, "S": 256, "B": 128, "L": 64}  # per optimizer step, on one GPU


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_peak(device: torch.device, n: int, repeats: int) -> float:
    """The bf16 matmul rate of this device in FLOP/s (the best of three timings of ``repeats`` n×n×n products)."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    best = float("inf")
    for _ in range(4):
        sync(device)
        t = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 * repeats / best


def models_of(size: str, shape: dict, timm_ok: bool) -> dict[str, torch.nn.Module]:
    """Ours, the official formulation with our weights, our ViT of the same width/depth/heads (and timm's ViT-B)."""
    torch.manual_seed(0)
    ours = ct.create_model(SIZES[size], **shape)
    c = ours.config
    official = OfficialCRATE(image_size=c.image_size, patch_size=c.patch_size, num_classes=c.num_classes, dim=c.dim,
                             depth=c.depth, heads=c.heads)  # fmt: skip
    official.load_state_dict(native_to_official(ours.state_dict()))
    vit = ct.create_model(
        "vit_base", dim=c.dim, depth=c.depth, heads=c.heads, image_size=c.image_size, patch_size=c.patch_size
    )
    out = {f"CRATE-{size}": ours, f"official CRATE-{size}": official, f"ViT d={c.dim}": vit}
    if timm_ok and size == "B" and not shape:
        import timm

        out["timm vit_base_patch16_224"] = timm.create_model("vit_base_patch16_224", pretrained=False)
    return out


def train_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, amp: torch.dtype | None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, foreach=True)

    def step() -> None:
        with torch.autocast(x.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = F.cross_entropy(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def step_flops(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, amp: torch.dtype | None) -> float:
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(x.device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def throughput(size: str, mode: str, args: argparse.Namespace, shape: dict, device: torch.device) -> list[dict]:
    """One row per model of one size, eager or compiled, the models timed in interleaved rounds."""
    models = {k: m.to(device).train() for k, m in models_of(size, shape, args.timm).items()}
    c = next(iter(models.values())).config
    batch = args.batch or BATCH[size]
    x = torch.randn(batch, 3, c.image_size, c.image_size, device=device)
    y = torch.randint(0, c.num_classes, (batch,), device=device)
    flops = {name: step_flops(model, x, y, args.amp) for name, model in models.items()}
    compiled = mode == "compiled"
    steps = {name: train_step(torch.compile(m, backend=args.backend) if compiled else m, x, y, args.amp)
             for name, m in models.items()}  # fmt: skip
    first = {}
    for name, step in steps.items():  # warm-up: compilation, cuBLAS plans, the optimizer's state
        t = time.perf_counter()
        for _ in range(3):
            step()
        sync(device)
        first[name] = time.perf_counter() - t
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            sync(device)
            t = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync(device)
            times[name].append((time.perf_counter() - t) / args.steps)
    rows = []
    for name, ts in times.items():
        dt = statistics.median(ts)
        rows.append(dict(size=size, model=name, mode=mode, batch=batch, ms=1e3 * dt, img_s=batch / dt,
                         tflops=flops[name] / dt / 1e12, mfu=flops[name] / dt / args.peak,
                         gflop_img=flops[name] / batch / 1e9, warmup_s=first[name]))  # fmt: skip
    return rows


HEAD = (f"{'model':26} {'mode':9} {'batch':>5} {'ms/step':>8} {'img/s':>9} {'GFLOP/img':>9} {'TFLOP/s':>8} "
        f"{'MFU':>6} {'vs official':>11} {'vs ViT':>7} {'warm-up s':>9}")  # fmt: skip


def print_rows(rows: list[dict]) -> None:
    """The rows of one size and mode, with ours against the official formulation and the ViT of the same rows."""
    same = {q["model"]: q for q in rows}
    for r in rows:
        base = same.get(f"official CRATE-{r['size']}")
        vit = next((q for k, q in same.items() if k.startswith("ViT")), None)
        ours = r["model"] == f"CRATE-{r['size']}"
        vs_off = f"{r['img_s'] / base['img_s']:.2f}x" if ours and base else ""
        vs_vit = f"{r['img_s'] / vit['img_s']:.2f}x" if ours and vit else ""
        print(
            f"{r['model']:26} {r['mode']:9} {r['batch']:>5} {r['ms']:8.2f} {r['img_s']:9.1f} {r['gflop_img']:9.2f} "
            f"{r['tflops']:8.2f} {100 * r['mfu']:5.1f}% {vs_off:>11} {vs_vit:>7} {r['warmup_s']:9.1f}",
            flush=True,
        )


def synthetic_cifar(root: Path, images: int) -> Path:
    """A CIFAR-10-format folder of random images (read into memory, resized to the model's size per batch)."""
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per = max(10, images // 5)
    for name, n in [(f"data_batch_{i}", per) for i in range(1, 6)] + [("test_batch", 100)]:
        data = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"labels": [i % 10 for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(data))
    return folder


def data_path(args: argparse.Namespace, shape: dict, device: torch.device, compiled: bool = False) -> dict:
    """``crate train`` (the library's ``train``) end to end against the model's compute alone, same batch and amp,
    both eager or both compiled (``--compile``)."""
    from crate_transformer.train import TrainConfig, train

    size, batch = args.e2e, args.batch or BATCH[args.e2e]
    steps = max(8, 4 * args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_cifar(Path(tmp), batch * (steps + 2))
        cfg = TrainConfig(model=SIZES[size], data=str(data), batch_size=batch, epochs=1, max_steps=steps,
                          log_every=max(1, steps // 4), eval_every=0, measure_every=0, device=str(device),
                          amp="bf16" if args.amp else "none", progress=False, out=str(Path(tmp) / "run"),
                          model_args=shape, threads=args.threads, warmup_epochs=0, compile=compiled)  # fmt: skip
        t = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - t
        records = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    rates = [r["samples_per_s"] for r in records if r.get("split") == "train"][1:]  # the first window warms up
    model = ct.create_model(SIZES[size], num_classes=10, **shape).to(device).train()
    c = model.config
    x = torch.randn(batch, 3, c.image_size, c.image_size, device=device)
    step = train_step(
        torch.compile(model, backend=args.backend) if compiled else model,
        x,
        torch.randint(0, 10, (batch,), device=device),
        args.amp,
    )
    for _ in range(3):
        step()
    times = []
    for _ in range(args.rounds):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync(device)
        times.append((time.perf_counter() - t0) / args.steps)
    alone = batch / statistics.median(times)
    e2e = statistics.median(rates) if rates else float("nan")
    return dict(
        size=size,
        batch=batch,
        mode="compiled" if compiled else "eager",
        e2e_img_s=e2e,
        model_img_s=alone,
        ratio=e2e / alone,
        run_wall_s=wall,
    )


EAGER_ATTENTION = ("tssa", "mssa", "softmax")
ATTENTION = (*EAGER_ATTENTION, "tssa-compiled", "mssa-compiled")
COMPILED_ATTENTION_MAX = 4096  # the lengths at which TSSA lost to MSSA eager (kernel launches; issue 42)


def best_and_peak(run: object, x: torch.Tensor, device: torch.device, repeats: int) -> tuple[float, float]:
    """The fastest of ``repeats`` calls of ``run`` in ms, and the peak device memory above what was allocated
    before them in MiB (NaN off a GPU)."""
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    times = []
    for _ in range(repeats):
        x.grad = None
        sync(device)
        t0 = time.perf_counter()
        run()
        sync(device)
        times.append(time.perf_counter() - t0)
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if device.type == "cuda" else float("nan")
    return 1e3 * min(times), peak


def attention_rows(
    args: argparse.Namespace, device: torch.device, ops: tuple[str, ...], lengths: list[int]
) -> list[dict]:
    """Attention operators alone (d=384, 8 heads, batch 8; ``bench_tost.build``), forward+backward under the run's
    autocast at each of ``lengths``: best of ``--attention-repeats``, the peak memory above the input and the bytes
    kept for the backward (``bench_tost.saved_bytes``).  An op ``…-compiled`` is the operator under
    ``torch.compile(fullgraph=True, dynamic=False)`` (``--backend``): its first call, which compiles, is the warm-up,
    timed apart (``compile_s``), one compilation per length."""
    from bench_tost import build, saved_bytes

    rows = []
    for n in lengths:
        for op in ops:
            module = build(op.removesuffix("-compiled"), 384, 8).to(device).train()
            if op.endswith("-compiled"):
                torch._dynamo.reset()  # each length its own compilation, never the recompile limit's eager fallback
                module = torch.compile(module, fullgraph=True, dynamic=False, backend=args.backend)
            x = torch.randn(args.attention_batch, n, 384, device=device, requires_grad=True)

            def run(module: torch.nn.Module = module, x: torch.Tensor = x) -> None:
                with torch.autocast(device.type, dtype=args.amp, enabled=args.amp is not None):
                    out = module(x)
                out.float().sum().backward()

            start = time.perf_counter()
            run()
            sync(device)
            compile_s = time.perf_counter() - start if op.endswith("-compiled") else 0.0
            with torch.autocast(device.type, dtype=args.amp, enabled=args.amp is not None):
                saved = saved_bytes(module, x) / 2**20
            ms, peak = best_and_peak(run, x, device, args.attention_repeats)
            row = dict(op=op, tokens=n, batch=args.attention_batch, ms=ms, peak_mib=peak, saved_mib=saved)
            rows.append({**row, "compile_s": compile_s})
            print(
                f"attention fwd+bwd {op:13s} b={args.attention_batch} n={n:6d}: {ms:9.2f} ms, peak +{peak:8.1f} MiB, "
                f"kept for the backward {saved:8.1f} MiB" + (f" (compiled in {compile_s:.1f} s)" if compile_s else ""),
                flush=True,
            )
            del module, x
    return rows


def decode_once(model: torch.nn.Module, prompt: torch.Tensor, new: int, dtype: str, mode: str) -> None:
    """``new`` greedy tokens, in bf16 autocast or fp32, eager or compiled."""
    with torch.autocast(prompt.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
        model.generate(prompt, new, temperature=0, compile=mode == "compiled")


def decode_times(models: dict, prompt: torch.Tensor, dtype: str, args: argparse.Namespace) -> dict[tuple, float]:
    """Median seconds per (model, mode) of one batch and dtype, interleaved in alternating order after a warm-up
    generation each (which compiles a compiled mode's step)."""
    runs = [(name, mode) for name in models for mode in args.decode_modes]
    for name, mode in runs:
        decode_once(models[name], prompt, args.decode_new, dtype, mode)
    times: dict[tuple, list[float]] = {k: [] for k in runs}
    for r in range(args.rounds):
        for name, mode in runs if r % 2 == 0 else runs[::-1]:
            sync(prompt.device)
            t = time.perf_counter()
            decode_once(models[name], prompt, args.decode_new, dtype, mode)
            sync(prompt.device)
            times[name, mode].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def decoding(key: str, args: argparse.Namespace, device: torch.device) -> list[dict]:
    """Greedy decoding tokens/s of the CRATE-GPT / GPT pair of ``key``: every batch x dtype x mode."""
    models = {k: m.to(device) for k, m in pair(DECODE_MODELS[key], args.tiny).items()}
    rows = []
    for batch in args.decode_batches:
        prompt = torch.randint(0, models["GPT"].config.vocab_size, (batch, args.decode_prompt), device=device)
        for dtype in ("fp32", "bf16"):
            for (name, mode), dt in decode_times(models, prompt, dtype, args).items():
                row = dict(shape=DECODE_MODELS[key], model=name, batch=batch, dtype=dtype, mode=mode)
                rows.append(dict(row, tok_s=batch * args.decode_new / dt, ms_token=1e3 * dt / args.decode_new))
    return rows


def print_decoding(rows: list[dict]) -> None:
    """The rows with CRATE-GPT / GPT (same batch, dtype, mode) and compiled / eager (same model)."""
    by = {(r["model"], r["batch"], r["dtype"], r["mode"]): r["tok_s"] for r in rows}
    for r in rows:
        gpt = by.get(("GPT", r["batch"], r["dtype"], r["mode"]))
        eager = by.get((r["model"], r["batch"], r["dtype"], "eager"))
        vs_gpt = f"{r['tok_s'] / gpt:.2f}x" if r["model"] != "GPT" and gpt else ""
        vs_eager = f"{r['tok_s'] / eager:.2f}x" if r["mode"] != "eager" and eager else ""
        print(
            f"{r['shape']:16} {r['model']:10} {r['batch']:>5} {r['dtype']:>5} {r['mode']:>9} {r['tok_s']:>10.1f} "
            f"{r['ms_token']:>9.3f} {vs_gpt:>9} {vs_eager:>14}",
            flush=True,
        )


DECODE_HEAD = f"{'decoding':16} {'model':10} {'batch':>5} {'dtype':>5} {'mode':>9} {'tokens/s':>10} {'ms/token':>9} "
DECODE_HEAD += f"{'CRATE/GPT':>9} {'compiled/eager':>14}"


# kernel (CUDA) or operator (CPU) names by what they do: the step's time between its GEMMs is the rest
KINDS = (
    ("GEMM", ("gemm", "cutlass", "xmma", "sm90_", "sm80_", "aten::mm", "aten::addmm", "aten::bmm", "mkldnn", "_mm_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_sdp")),
    ("norm", ("layer_norm", "layernorm", "native_layer_norm")),
    ("optimizer", ("foreach", "multi_tensor", "adam")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KINDS if any(k in low for k in keys)), "elementwise / other")


def profile_step(size: str, args: argparse.Namespace, shape: dict, device: torch.device, report) -> list[dict]:
    """One optimizer step of CRATE and of the ViT of the same size, eager and compiled, under torch.profiler (after
    three warm-up steps): per model and mode, the kernels (CUDA) or operators that do work (CPU) with their self
    time, grouped into GEMM / attention / norm / optimizer / the rest, the kernels per step and the heaviest
    kernels by name.  Both eager rows come first, each handed to ``report`` as soon as it is measured: a stage's
    time limit that cuts the compilations keeps them."""
    from torch.profiler import ProfilerActivity, profile

    models = models_of(size, shape, False)
    names = (f"CRATE-{size}", next(k for k in models if k.startswith("ViT")))
    batch = args.batch or BATCH[size]
    on_gpu = device.type == "cuda"
    rows = []
    for mode in ("eager", "compiled"):
        for name in names:
            model = models[name].to(device).train()
            c = model.config
            x = torch.randn(batch, 3, c.image_size, c.image_size, device=device)
            y = torch.randint(0, c.num_classes, (batch,), device=device)
            step = train_step(
                torch.compile(model, backend=args.backend) if mode == "compiled" else model, x, y, args.amp
            )
            for _ in range(3):
                step()
            sync(device)
            with profile(activities=[ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]) as prof:
                step()
                sync(device)
            rows.append(dict(model=name, mode=mode, batch=batch, **kernel_table(prof, on_gpu)))
            report(rows[-1])
    return rows


def kernel_table(prof: object, on_gpu: bool, top: int = 8) -> dict:
    """Self time per kernel kind (ms), the kernels per step and the ``top`` heaviest kernels (name, ms, calls),
    from one profiled step."""
    times: dict[str, float] = {}
    heavy = []
    count = 0
    for e in prof.key_averages():
        us = e.self_device_time_total if on_gpu else e.self_cpu_time_total
        if us <= 0 or (not on_gpu and not e.key.startswith(("aten::", "graph_", "cpp_fused", "mkldnn"))):
            continue
        kind = kind_of(e.key)
        times[kind] = times.get(kind, 0.0) + us / 1e3
        heavy.append((e.key, us / 1e3, e.count))
        count += e.count
    total = sum(times.values()) or 1.0
    heavy = sorted(heavy, key=lambda h: -h[1])[:top]
    return {"ms": total, "kernels": count, "share": {k: v / total for k, v in sorted(times.items())}, "top": heavy}


PROFILE_KINDS = [k for k, _ in KINDS] + ["elementwise / other"]


def print_profile_row(r: dict, head: bool = False) -> None:
    """One profiled step: its kernels, time and shares by kind, then its heaviest kernels."""
    if head:
        line = f"{'model':18} {'mode':9} {'kernels':>8} {'ms':>9} " + " ".join(f"{k:>20}" for k in PROFILE_KINDS)
        print(line + "\n" + "-" * len(line))
    shares = " ".join(f"{100 * r['share'].get(k, 0.0):>19.1f}%" for k in PROFILE_KINDS)
    print(f"{r['model']:18} {r['mode']:9} {r['kernels']:>8} {r['ms']:>9.1f} {shares}")
    for name, ms, calls in r["top"]:
        print(f"    {ms:9.2f} ms {calls:5d}x  {kind_of(name):20} {name[:90]}")
    print(flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="CPU-sized shapes (32 px, patch 8, depth 1), few steps")
    ap.add_argument("--profile", default="", choices=["", *SIZES], help="profile one step of this size, then stop")
    ap.add_argument("--device", default="auto", help="auto (cuda when present) | cpu | cuda | cuda:N")
    ap.add_argument("--sizes", nargs="*", default=None, choices=list(SIZES), help="CRATE sizes (default T S B L)")
    ap.add_argument("--compile", nargs="*", default=None, choices=list(SIZES), help="sizes also timed compiled")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (aot_eager: no code generation)")
    ap.add_argument("--batch", type=int, range=NON_NEGATIVE, default=0, help="batch per step (default: by size)")
    ap.add_argument("--steps", type=int, range=POSITIVE, default=10, help="steps per timing")
    ap.add_argument(
        "--rounds", type=int, range=POSITIVE, default=3, help="interleaved timing rounds (the median is reported)"
    )
    ap.add_argument("--amp", default="bf16", choices=("bf16", "none"), help="autocast dtype")
    ap.add_argument("--e2e", default="B", choices=[*SIZES, "none"], help="the size of the crate-train comparison")
    ap.add_argument("--e2e-compile", action="store_true", help="also time the crate-train comparison compiled")
    ap.add_argument(
        "--attention-tokens",
        type=int,
        range=POSITIVE,
        nargs="*",
        default=[1024, 4096, 16384, 65536],
        help="token counts of the attention rows (none: no attention rows)",
    )
    ap.add_argument(
        "--attention-compiled-tokens",
        type=int,
        range=POSITIVE,
        nargs="*",
        default=None,
        help=f"token counts of the compiled attention rows (default: those of --attention-tokens up to "
        f"{COMPILED_ATTENTION_MAX}; --tiny: none; none: no compiled rows)",
    )
    ap.add_argument("--attention-batch", type=int, range=POSITIVE, default=8, help="batch of the attention rows")
    ap.add_argument(
        "--attention-repeats", type=int, range=POSITIVE, default=5, help="timings per attention row (the best is kept)"
    )
    ap.add_argument("--threads", type=int, range=NON_NEGATIVE, default=0, help="CPU threads (0 = auto)")
    ap.add_argument("--json", default="", help="also write the numbers to this file")
    ap.add_argument(
        "--decode",
        nargs="*",
        default=None,
        choices=list(DECODE_MODELS),
        help="decoding pairs (default: base; none: no decoding rows)",
    )
    ap.add_argument(
        "--decode-modes",
        nargs="+",
        default=None,
        choices=("eager", "compiled"),
        help="decoding modes (default: eager compiled; --tiny: eager)",
    )
    ap.add_argument(
        "--decode-batches", nargs="+", type=int, range=POSITIVE, default=[1, 8], help="decoding batch sizes"
    )
    ap.add_argument("--decode-prompt", type=int, range=POSITIVE, default=32, help="decoding prompt tokens")
    ap.add_argument("--decode-new", type=int, range=POSITIVE, default=128, help="greedy tokens generated per timing")
    args = ap.parse_args(argv)
    args.amp = torch.bfloat16 if args.amp == "bf16" else None
    if args.tiny:
        args.sizes = ["T"] if args.sizes is None else args.sizes
        args.compile = [] if args.compile is None else args.compile
        args.batch, args.steps, args.rounds = args.batch or 8, min(args.steps, 2), min(args.rounds, 2)
        args.e2e = "T" if args.e2e == "B" else args.e2e
        args.attention_tokens, args.attention_batch, args.attention_repeats = [64, 128], 2, 2
        args.attention_compiled_tokens = args.attention_compiled_tokens or []  # inductor's C++ build: minutes here
        args.decode = ["small"] if args.decode is None else args.decode
        args.decode_modes = args.decode_modes or ["eager"]  # a compiled step costs inductor's C++ build here
        args.decode_prompt, args.decode_new = min(args.decode_prompt, 4), min(args.decode_new, 8)
    args.decode = ["base"] if args.decode is None else args.decode  # each pair compiles 8 steps (batch x dtype)
    args.decode_modes = args.decode_modes or ["eager", "compiled"]
    args.sizes = list(SIZES) if args.sizes is None else args.sizes  # --sizes alone: no training rows
    if args.attention_compiled_tokens is None:
        args.attention_compiled_tokens = [n for n in args.attention_tokens if n <= COMPILED_ATTENTION_MAX]
    args.compile = ["B"] if args.compile is None else args.compile
    try:
        import timm  # noqa: F401

        args.timm = True
    except ImportError:
        args.timm = False
    return args


def main(argv: list[str] | None = None) -> dict:
    from crate_transformer.train.runtime import resolve_device

    args = parse(argv)
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")  # what a training run sets (--tf32)
    elif args.threads:
        torch.set_num_threads(args.threads)
    shape = dict(image_size=32, patch_size=8, depth=1) if args.tiny else {}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    args.peak = gemm_peak(device, 256 if args.tiny else 8192, 2 if args.tiny else 20)
    print(f"{name}; torch {torch.__version__}, CUDA {torch.version.cuda}; load average {os.getloadavg()}")
    print(f"measured bf16 GEMM peak: {args.peak / 1e12:.2f} TFLOP/s (the MFU denominator)")
    print(f"timm: {'vit_base_patch16_224 beside CRATE-B' if args.timm else 'not installed (no timm row)'}\n")
    result = {"device": name, "torch": torch.__version__, "peak_flops": args.peak, "rows": [], "e2e": None,
              "date": time.strftime("%Y-%m-%d %H:%M")}  # fmt: skip

    def save() -> None:  # after every measurement: a run cut short by a time limit keeps what it measured
        result["loadavg"] = os.getloadavg()
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))

    if args.profile:
        result["profile"] = []

        def report(row: dict) -> None:
            print_profile_row(row, head=len(result["profile"]) == 0)
            result["profile"].append(row)
            save()

        profile_step(args.profile, args, shape, device, report)
        return result
    print(HEAD + "\n" + "-" * len(HEAD), flush=True)
    for size in args.sizes:  # eager first, every size; then the data path; then the compiled rows
        result["rows"] += (rows := throughput(size, "eager", args, shape, device))
        print_rows(rows)
        save()
    for compiled in (False, True) if args.e2e_compile else (False,):
        if args.e2e == "none":
            break
        e2e = data_path(args, shape, device, compiled)
        result["e2e" if not compiled else "e2e_compiled"] = e2e
        print(
            f"\ncrate train CRATE-{e2e['size']} {e2e['mode']} batch {e2e['batch']}: {e2e['e2e_img_s']:.1f} img/s end "
            f"to end, {e2e['model_img_s']:.1f} img/s model alone: data path {e2e['ratio']:.2f} (target >= 0.95)\n",
            flush=True,
        )
        save()
    if args.attention_tokens:
        result["attention"] = attention_rows(args, device, EAGER_ATTENTION, args.attention_tokens)
        save()
    for size in args.compile:
        result["rows"] += (rows := throughput(size, "compiled", args, shape, device))
        print_rows(rows)
        save()
    if args.attention_compiled_tokens:  # last: compilations that a stage's time limit may cut cost no other row
        compiled = tuple(op for op in ATTENTION if op not in EAGER_ATTENTION)
        result.setdefault("attention", []).extend(
            attention_rows(args, device, compiled, args.attention_compiled_tokens)
        )
        save()
    result["decode"] = []
    if args.decode:
        what = f"{args.decode_prompt}-token prompt + {args.decode_new} new tokens, median of {args.rounds} rounds"
        print(f"\ngreedy decoding, {what}\n{DECODE_HEAD}\n{'-' * len(DECODE_HEAD)}", flush=True)
    for key in args.decode:
        result["decode"] += (rows := decoding(key, args, device))
        print_decoding(rows)
        save()
    print(f"load average at the end: {os.getloadavg()}")
    return result


if __name__ == "__main__":
    main()
