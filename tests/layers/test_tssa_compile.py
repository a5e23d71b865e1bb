"""TSSA fused by torch.compile's inductor backend on the CPU (issue 42: TSSA lost to MSSA on a GPU below 4k tokens
by kernel launches): one graph for the forward and the hand-written backward, eager's outputs and gradients, one
compilation for repeated calls, and fewer kernels than eager dispatches operators (``benchmarks/attention_kernels.py``
counts both; ``aot_eager``'s tracing alone is ``tests/layers/test_tssa.py``'s)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _kernels():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("attention_kernels", BENCHMARKS / "attention_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
# the causal form's C++ build is another 20 s on two cores (the GPU run times the non-causal form)
@pytest.mark.parametrize("op", ["tssa", pytest.param("tssa-causal", marks=pytest.mark.slow)])
def test_tssa_compiles_with_inductor_to_fewer_kernels_than_eager_operators(op):
    """Training mode, forward+backward: ``fullgraph=True`` (a graph break raises), the outputs and the gradients of
    the input and every parameter equal eager's, a second call with new tokens of the same shape compiles nothing
    (``error_on_recompile``), and the generated forward and backward modules call fewer kernels than the eager
    step dispatches computing operators, both counted on this run, no GEMM among them but the projections'."""
    ak = _kernels()
    torch.manual_seed(0)
    module = ak.build(op, dim=48, heads=4, n=32)
    x, grad = torch.randn(2, 32, 48, requires_grad=True), torch.randn(2, 32, 48)
    eager = ak.eager_ops(module, x, grad)
    want = ak.step(module, x, grad)
    kernels, got, _, compiled = ak.compiled_kernels(module, x, grad)
    _close(got, want)
    x2 = torch.randn_like(x).requires_grad_()
    want = ak.step(module, x2, grad)
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = ak.step(compiled, x2, grad)
    _close(got, want)
    assert kernels["fused"] > 0  # the counter read the generated code
    # the GEMMs are the two projections' (qkv and proj: one forward, two backward each); the token statistics'
    # sums are fused reductions (_token_sums), not GEMMs of their own
    assert kernels["extern"] == 6, kernels
    assert sum(kernels.values()) < sum(eager.values()), (kernels, eager)


def _close(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    """float32 sums reassociated by the fused kernels: each tensor within 1e-5 of its own largest entry."""
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * w.abs().max().item())
