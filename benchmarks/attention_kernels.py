"""Kernels per forward+backward of one attention operator, eager against torch.compile (inductor), on the CPU.

TSSA's gap to MSSA on a GPU below 4k tokens is kernel launches (issue 42: 2.70 vs 1.67 ms at 1,024 tokens), so the
count is what a CPU can show of it before a GPU times it (``bench_gpu.py``'s ``tssa-compiled`` / ``mssa-compiled``
rows).  Per operator (d=384, 8 heads, batch 2, n=256, training mode; TSSA non-causal and causal, MSSA):

* eager: the aten operators one forward+backward dispatches, read from ``torch.profiler``: the outermost calls of
  operators that compute (views, allocations and metadata left out; a composite operator such as ``linear`` or
  ``dropout`` counted by the operators it calls), each at least one kernel launch on a GPU;
* compiled: ``torch.compile(fullgraph=True, dynamic=False)``'s generated code for the forward and the backward
  graphs (``torch._inductor.utils.run_and_get_code``): the calls inside each module's ``call()`` of fused C++
  kernels (``cpp_fused_*``), of extern kernels (``extern_kernels.*``: the GEMMs) and of aten fallbacks.

It also checks that the compiled outputs and gradients are eager's (float32; float64 with ``--float64``; under bf16
autocast, as a GPU run trains, with ``--bf16``).

    python benchmarks/attention_kernels.py            # the table (about a minute: inductor builds C++ kernels)
    python benchmarks/attention_kernels.py --float64 --bf16  # also float64 parity and bf16 autocast
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import torch
from _common import POSITIVE, Arguments
from torch.profiler import ProfilerActivity, profile

OPS = ("tssa", "tssa-causal", "mssa")
# operators that only reshape, allocate or read metadata: no kernel on a GPU
_NOT_COMPUTE = {"_unsafe_view", "_reshape_alias", "empty", "empty_like", "empty_strided", "result_type", "lift_fresh"}


def build(op: str, dim: int = 384, heads: int = 8, n: int = 256) -> torch.nn.Module:
    """The operator in training mode (TSSA with the qkv bias ``bench_tost.build`` gives it)."""
    from crate_transformer.layers import MSSA, TSSA

    if op == "mssa":
        return MSSA(dim, heads, dim // heads).train()
    causal = op == "tssa-causal"
    return TSSA(dim, heads, dim // heads, qkv_bias=True, causal=causal, block_size=n if causal else None).train()


def _computes(name: str) -> bool:
    """Whether the profiler's event ``aten::name`` is an operator that computes (not a view, an allocation,
    metadata, or a composite whose work is the operators it calls)."""
    packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
    if packet is None or name.removeprefix("aten::") in _NOT_COMPUTE:
        return False
    overloads = [getattr(packet, o) for o in packet.overloads()]
    if any(o.is_view for o in overloads):
        return False
    return not any(_composite(o) for o in overloads if not o._overloadname.endswith("out"))


def _composite(overload: torch._ops.OpOverload) -> bool:
    """Whether an aten overload is a composite of other operators (its work shows as theirs in the profile)."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "CompositeImplicitAutograd")
    except RuntimeError:  # a TorchScript-only overload (``sum.int``): not in the dispatcher
        return False


def step(
    module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, amp: torch.dtype | None = None
) -> tuple[torch.Tensor, ...]:
    """One forward+backward from fresh gradients (no accumulation), the forward under autocast to ``amp`` when given
    (as a training step runs it): the output and the gradients of ``x`` and of every parameter."""
    for t in (x, *module.parameters()):
        t.grad = None
    with torch.autocast(x.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        out = module(x)
    out.backward(grad)
    return (out.detach(), x.grad, *(p.grad for p in module.parameters()))


def eager_ops(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, amp: torch.dtype | None = None) -> Counter:
    """The computing aten operators (by name) one eager forward+backward (:func:`step`) dispatches (module
    docstring)."""
    step(module, x, grad, amp)  # warm: first-call work stays out of the count
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(module, x, grad, amp)
    counted = Counter()
    for e in prof.events():
        if not e.name.startswith("aten::") or not _computes(e.name):
            continue
        parent = e.cpu_parent
        while parent is not None and not (parent.name.startswith("aten::") and _computes(parent.name)):
            parent = parent.cpu_parent
        if parent is None:  # the outermost computing call: what it calls is its own work
            counted[e.name.removeprefix("aten::")] += 1
    return counted


# a statement of call() that runs a kernel: ``cpp_fused_…(…)``, ``extern_kernels.mm(…)``,
# ``buf3 = torch.ops.aten.cumsum.default(…)``
_CALL = re.compile(r"^\s+(?:\w+ = )?(cpp_fused_\w+|extern_kernels\.\w+|(?:torch\.ops\.)?aten\.\w+)[.\w]*\(", re.M)


def generated_calls(code: str) -> Counter:
    """The kernel calls in the ``call()`` of one module inductor generated: ``fused`` (C++ or Triton kernels it wrote),
    ``extern`` (``extern_kernels.*``) and ``aten`` (fallbacks to aten operators)."""
    body = code[code.index("def call(") :]
    body = body[: body.index("\n    return ") if "\n    return " in body else len(body)]
    kinds = Counter()
    for name in _CALL.findall(body):
        kinds["extern" if name.startswith("extern") else "aten" if "aten." in name else "fused"] += 1
    return kinds


def compiled_calls(
    module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, amp: torch.dtype | None = None
) -> tuple[list[Counter], tuple[torch.Tensor, ...], float, torch.nn.Module]:
    """Compile ``module`` (inductor, one graph, static shapes) and run one forward+backward: the kernel calls of
    each module it generated, the forward's first (:func:`generated_calls`), the outputs and gradients
    (:func:`step`), the seconds the first call took (the compilation) and the compiled module."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, dynamic=False)
    start = time.perf_counter()
    result, codes = run_and_get_code(step, compiled, x, grad, amp)
    seconds = time.perf_counter() - start
    if len(codes) < 2:
        raise RuntimeError(f"expected a forward and a backward module, inductor generated {len(codes)}")
    return [generated_calls(c) for c in codes], result, seconds, compiled


def compiled_kernels(
    module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, amp: torch.dtype | None = None
) -> tuple[Counter, tuple[torch.Tensor, ...], float, torch.nn.Module]:
    """:func:`compiled_calls` with the forward's and the backward's kernel calls summed."""
    calls, result, seconds, compiled = compiled_calls(module, x, grad, amp)
    return sum(calls, Counter()), result, seconds, compiled


def _commit() -> str:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> list[dict]:
    ap = Arguments(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--tokens", type=int, range=POSITIVE, default=256)
    ap.add_argument("--batch", type=int, range=POSITIVE, default=2)
    ap.add_argument("--float64", action="store_true", help="also compare compiled and eager in float64")
    ap.add_argument("--bf16", action="store_true", help="also count under bf16 autocast (what a GPU run uses)")
    args = ap.parse_args(argv)
    load = " / ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"{time.strftime('%Y-%m-%d %H:%M')} commit {_commit()}; torch {torch.__version__}; load {load}")
    rows = []
    for op in args.ops:
        for mode in ["float32"] + ["float64"] * args.float64 + ["bf16-autocast"] * args.bf16:
            torch.manual_seed(0)
            dtype = torch.float64 if mode == "float64" else torch.float32
            amp = torch.bfloat16 if mode == "bf16-autocast" else None
            module = build(op, n=args.tokens).to(dtype)
            x = torch.randn(args.batch, args.tokens, 384, dtype=dtype, requires_grad=True)
            grad = torch.randn(args.batch, args.tokens, 384, dtype=dtype)
            eager = eager_ops(module, x, grad, amp)
            want = step(module, x, grad, amp)
            kernels, got, seconds, _ = compiled_kernels(module, x, grad, amp)
            error = max(((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item() for g, w in zip(got, want))
            rows.append(
                dict(
                    op=op,
                    mode=mode,
                    eager=sum(eager.values()),
                    compiled=sum(kernels.values()),
                    kinds=dict(kernels),
                    error=error,
                    compile_s=seconds,
                )
            )
            print(
                f"{op:12s} {mode:13s} eager {sum(eager.values()):3d} aten ops; compiled "
                f"{sum(kernels.values()):3d} kernels ({dict(kernels)}), compiled in {seconds:.1f} s; "
                f"max relative difference from eager {error:.1e}",
                flush=True,
            )
            print(f"    eager ops: {dict(sorted(eager.items()))}")
    return rows


if __name__ == "__main__":
    main()
