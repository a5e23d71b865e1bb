"""ToST's attention (TSSA) and the variational coding rate it descends (Wu et al., ICLR 2025): against a float64
formula, the authors' modules (``tests/official/tost_vision.py``, ``tests/official/tost_lang.py``), autograd and
the loop-by-token reference."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from official import tost_lang, tost_vision

import crate_transformer as ct
from crate_transformer.layers import MSSA, TSSA, tssa_reference


def _np_rvar(P: np.ndarray, Pi: np.ndarray, eps: float) -> float:
    """½ Σ_k (n_k/n) Σ_i log(1 + (p/ε²) Σ_j Π_jk P_kji² / n_k), one sample, loops: P (K, n, p), Pi (n, K)."""
    K, n, p = P.shape
    total = 0.0
    for k in range(K):
        n_k = sum(Pi[j, k] for j in range(n))
        for i in range(p):
            moment = sum(Pi[j, k] * P[k, j, i] ** 2 for j in range(n)) / n_k
            total += 0.5 * (n_k / n) * math.log(1 + p / eps**2 * moment)
    return total


def _memberships(b: int, n: int, K: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, n, K, generator=g, dtype=torch.float64), dim=-1)


def test_variational_coding_rate_matches_the_formula():
    K, d, p, n = 3, 12, 4, 9
    Z = torch.randn(2, n, d, dtype=torch.float64)
    U = torch.randn(K, d, p, dtype=torch.float64)
    Pi = _memberships(2, n, K)
    got = ct.variational_coding_rate(Z, U, Pi, eps=0.5)
    P = (Z.unsqueeze(-3) @ U).numpy()
    want = [_np_rvar(P[i], Pi[i].numpy(), 0.5) for i in range(2)]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
    # U=None: the projections themselves (a layer's own, bias included)
    torch.testing.assert_close(ct.variational_coding_rate(Z.unsqueeze(-3) @ U, None, Pi, eps=0.5), got)
    # float32 input computed in float64
    low = ct.variational_coding_rate(Z.float(), U.float(), Pi.float(), eps=0.5, dtype=torch.float64)
    assert low.dtype == torch.float64
    np.testing.assert_allclose(low.numpy(), want, rtol=1e-6)


def test_variational_coding_rate_bounds_the_weighted_logdet_and_meets_it_on_diagonal_statistics():
    """Σ_i log(1 + M_ii) ≥ logdet(I + M) for M ⪰ 0 (the diagonal is majorised by the eigenvalues, log(1+x) is
    concave), with equality for diagonal M: the variational form upper-bounds the Π-weighted R^c."""
    K, n, p, eps = 2, 10, 3, 0.7

    def weighted_logdet(P, Pi):
        total = 0.0
        for k in range(K):
            n_k = Pi[:, k].sum()
            M = (p / (n_k * eps**2)) * (P[k].T * Pi[:, k]) @ P[k]
            total += 0.5 * (n_k / n) * np.linalg.slogdet(np.eye(p) + M)[1]
        return total

    g = np.random.default_rng(0)
    P, Pi = g.standard_normal((K, n, p)), _memberships(1, n, K)[0].numpy()
    var = float(ct.variational_coding_rate(torch.from_numpy(P), None, torch.from_numpy(Pi), eps=eps))
    assert var > weighted_logdet(P, Pi) + 1e-3  # strictly above for generic tokens
    # each token on one coordinate of each head: the weighted second-moment matrices are diagonal
    D = np.zeros((K, n, p))
    for j in range(n):
        D[:, j, j % p] = g.standard_normal(K)
    var = float(ct.variational_coding_rate(torch.from_numpy(D), None, torch.from_numpy(Pi), eps=eps))
    assert var == pytest.approx(weighted_logdet(D, Pi), rel=1e-12)


def test_variational_coding_rate_refuses_bad_shapes():
    with pytest.raises(ValueError, match="Pi must be"):
        ct.variational_coding_rate(torch.randn(2, 5, 8), torch.randn(2, 8, 4), torch.rand(2, 5, 3))
    with pytest.raises(ValueError, match="eps"):
        ct.variational_coding_rate(torch.randn(5, 8), torch.randn(2, 8, 4), torch.rand(5, 2), eps=0)


def _tssa(causal: bool, dim=12, heads=3, n=7, seed=0, dtype=torch.float64) -> TSSA:
    torch.manual_seed(seed)
    op = TSSA(dim, heads, dim // heads, qkv_bias=True, causal=causal, block_size=n + 3).to(dtype).eval()
    with torch.no_grad():
        op.temp.uniform_(0.5, 2.0)
        if causal:
            op.denom_bias.normal_(0, 0.3)
    return op


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_is_its_loop_by_token_reference(causal):
    op, n = _tssa(causal), 7
    x = torch.randn(2, n, 12, dtype=torch.float64)
    w = op.project(x)
    bias = op.denom_bias[:, :n, 0] if causal else None
    for i in range(2):
        out, Pi = tssa_reference(w[i], op.temp[:, 0], causal=causal, denom_bias=bias)
        want = op.proj(out.transpose(0, 1).reshape(n, -1))
        torch.testing.assert_close(op(x)[i], want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(op.memberships(x)[i], Pi, rtol=1e-12, atol=1e-12) if not causal else None


def test_tssa_is_a_gradient_step_on_the_variational_coding_rate():
    """Before its projection TSSA outputs −n ∇_W R_c^var(W, Π) at p/ε² = 1 with Π held fixed."""
    K, p, n = 3, 4, 11
    op = _tssa(False, dim=K * p, heads=K, n=n)
    with torch.no_grad():  # the projection as the identity: the output is the heads' update itself
        op.proj.weight.copy_(torch.eye(K * p))
        op.proj.bias.zero_()
    x = torch.randn(1, n, K * p, dtype=torch.float64)
    W = op.project(x).detach().requires_grad_(True)
    Pi = op.memberships(x).detach()
    (grad,) = torch.autograd.grad(ct.variational_coding_rate(W, None, Pi, eps=math.sqrt(p)).sum(), W)
    step = (-n * grad).transpose(1, 2).reshape(1, n, K * p)
    torch.testing.assert_close(op(x), step, rtol=1e-7, atol=1e-12)  # 1e-8 mass offset of the authors' code


def _reference_forward(op: TSSA, x: torch.Tensor) -> torch.Tensor:
    """The layer by :func:`tssa_reference`, sample by sample (differentiable: the parameters get gradients)."""
    b, n, _ = x.shape
    w = op.project(x)
    outs = [tssa_reference(w[i], op.temp[:, 0])[0].transpose(0, 1).reshape(n, -1) for i in range(b)]
    return op.proj(torch.stack(outs))


@pytest.mark.parametrize("b", [1, 3])  # one sample: the factor folded into the output projection's weight
@pytest.mark.parametrize("grad", [False, True])  # without gradients the product reuses the squares' memory
def test_tssa_forms_equal_the_reference_in_values_and_gradients(b, grad):
    op = _tssa(False, n=20)
    x = torch.randn(b, 20, 12, dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        out = op(x)
    want = _reference_forward(op, x)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    if grad:
        got = torch.autograd.grad(out.square().sum(), list(op.parameters()))
        ref = torch.autograd.grad(want.square().sum(), list(op.parameters()))
        for g, r in zip(got, ref):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def _autograd_tssa(op: TSSA, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-causal layer and Π ``(b, n, K)`` as plain autograd operations (the authors' order: squares,
    energies, memberships, moments, shrink with its dropout, output), for the hand-written backward to match."""
    y = op.qkv(x)
    b, n, D = y.shape
    K = op.heads
    sq = y.square()
    share = (sq / sq.sum(1, keepdim=True).clamp_min(1e-24)).view(b, n, K, -1).sum(-1)
    pi = torch.softmax(share * op.temp.view(1, 1, K), dim=-1)
    num = torch.stack([pi[..., k].unsqueeze(1) @ sq.view(b, n, K, -1)[:, :, k] for k in range(K)], 1)  # (b, K, 1, p)
    moment = (num.squeeze(2) / (pi.sum(1) + 1e-8).unsqueeze(-1)).reshape(b, D)
    shrink = torch.nn.functional.dropout(1 / (1 + moment), op.attn_dropout, op.training)
    z = -(y.view(b, n, K, -1) * pi.unsqueeze(-1)).view(b, n, D) * shrink.unsqueeze(1)
    return op.proj(z), pi


@pytest.mark.parametrize("b", [1, 3])
def test_tssa_backward_is_autograd_of_the_step_with_dropout_and_the_memberships(b):
    """The non-causal step's hand-written backward (it keeps the projections, not the squares and products)
    against autograd of the plain formulation: gradients of the input, the projections, the temperature and the
    output projection, through the output and the memberships Π the step returns, with the same dropout mask."""
    op = TSSA(12, 3, 4, qkv_bias=True, attn_dropout=0.3).double().train()
    with torch.no_grad():
        op.temp.uniform_(0.5, 2.0)
    x = torch.randn(b, 20, 12, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(b, 3, 20, dtype=torch.float64)
    grads = []
    for forward in (lambda: op._global(x), lambda: _autograd_tssa(op, x)):
        torch.manual_seed(7)
        out, pi = forward()
        pi = pi if pi.shape[1] == 3 else pi.transpose(1, 2)  # (b, K, n)
        loss = out.square().sum() + (pi * weights).sum()
        grads.append((out, *torch.autograd.grad(loss, [x, *op.parameters()])))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert (grads[0][0] != 0).any() and grads[0][3].abs().sum() > 0  # the temperature's gradient is not trivial


def test_causal_tssa_backward_is_autograd_of_the_cached_form_with_dropout_and_the_memberships():
    """The causal step's hand-written backward (training without a cache: it keeps the projections and Π and
    recomputes the running sums) against autograd of the cached form's running sums (the decoding path, a fresh
    cache), the same dropout mask drawn; gradients of the input and every parameter, denom_bias included, through
    the output and Π."""
    op = _tssa(True, n=20).train()
    op.attn_dropout = 0.3
    x = torch.randn(2, 20, 12, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(2, 3, 20, dtype=torch.float64)
    grads = []
    for cache in (None, {}):
        torch.manual_seed(7)
        out, pi = op._causal(x, cache, 0)
        loss = out.square().sum() + (pi * weights).sum()
        grads.append((out, *torch.autograd.grad(loss, [x, *op.parameters()])))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    denom_bias = grads[0][3]
    assert denom_bias[:, 20:].abs().sum() == 0 and denom_bias[:, :20].abs().sum() > 0  # the positions read


@pytest.mark.parametrize(("causal", "b"), [(False, 1), (False, 3), (True, 2)])
def test_memory_saving_backward_gives_autograds_gradients_of_the_operator(causal, b):
    """The switch: ``memory_saving=True`` (the private module's hand-derived backward) and ``False`` (autograd of
    the operator as :mod:`.tssa` writes it) give the same outputs, Π and gradients of the input and every
    parameter, in float64, in training with dropout (the same mask drawn), through the output and Π."""
    op = _tssa(causal, n=20).train()
    op.attn_dropout = 0.3
    with torch.no_grad():
        op.temp.uniform_(0.5, 2.0)
    x = torch.randn(b, 20, 12, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(b, 3, 20, dtype=torch.float64)
    grads = []
    for saving in (True, False):
        op.memory_saving = saving
        torch.manual_seed(7)
        out, pi = op._causal(x, None, 0) if causal else op._global(x)
        pi = pi if pi.shape[1] == 3 else pi.transpose(1, 2)  # (b, K, n)
        loss = out.square().sum() + (pi * weights).sum()
        grads.append((out, pi, *torch.autograd.grad(loss, [x, *op.parameters()])))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert all(g.abs().sum() > 0 for g in grads[1][2:5])  # input, projections, temperature: not trivial
    # the switch changes what the backward keeps: the operator's graph keeps more (the squares and products)
    saved_bytes = _bench_tost().saved_bytes
    kept = []
    for saving in (True, False):
        op.memory_saving = saving
        kept.append(saved_bytes(op, x))
    assert kept[0] < kept[1], kept


def _bench_tost():  # noqa: ANN202
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_tost.py"
    spec = importlib.util.spec_from_file_location("bench_tost", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1024, 4096])
def test_tssa_keeps_fewer_bytes_for_the_backward_than_flash_attention(n, causal):
    """Activation memory: what autograd keeps between forward and backward, TSSA against MSSA on PyTorch's
    fused attention (which keeps its input, output and log-sum-exp, never the n × n matrix), ToST-S widths.
    Autograd of TSSA's own step kept the squares and two (n, K·p) products besides: 1.67x MSSA's bytes (the
    causal form its running sums too: 3.7x)."""
    saved_bytes = _bench_tost().saved_bytes
    torch.manual_seed(0)
    x = torch.randn(2, n, 384, requires_grad=True)
    tssa = saved_bytes(TSSA(384, 8, 48, qkv_bias=True, causal=causal, block_size=n).train(), x)
    mssa = saved_bytes(MSSA(384, 8, 48, causal=causal).train(), x)
    unit = x.numel() * x.element_size()  # one (b, n, d) float32 tensor
    assert mssa >= 3 * unit  # the counter sees MSSA's input, projections and output
    assert tssa <= mssa, (tssa / 2**20, mssa / 2**20)
    assert tssa <= 2.1 * unit  # the input and the projections, and per-head statistics


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_forward_and_backward_compile_to_one_graph(causal):
    """The hand-written backwards trace (torch.compile with AOT autograd, no graph break) and give eager's
    gradients."""
    op = TSSA(12, 3, 4, qkv_bias=True, causal=causal, block_size=10).train()
    x = torch.randn(2, 10, 12, requires_grad=True)
    grads = []
    for module in (op, torch.compile(op, backend="aot_eager", fullgraph=True)):
        out = module(x)
        grads.append((out, *torch.autograd.grad(out.square().sum(), [x, *op.parameters()])))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float16, 0.005), (torch.bfloat16, 0.02)])
def test_tssa_statistics_do_not_overflow_in_half_precision(dtype, tol):
    """Projections of a few hundred square past float16's range (65,504), and their energies sum over every
    token: the statistics run in float32, so half weights give the float64 layer's output to half rounding (in
    float16 the squares overflowed, zeroing those coordinates' updates: 3% of the output's scale)."""
    op = _tssa(False, dim=16, heads=4, n=600)
    x = 150 * torch.randn(1, 600, 16, dtype=torch.float64)
    assert op.project(x).abs().max() > 256
    want = op(x)
    scale = want.abs().max().item()
    got = op.to(dtype)(x.to(dtype))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=tol * scale)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # float32 weights under autocast: bf16 products
        auto = op.float()(x.float())
    torch.testing.assert_close(auto.double(), want, rtol=0, atol=0.02 * scale)


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_gradients_under_autocast_are_the_float64_gradients_to_bf16_rounding(causal):
    """Training in bf16 autocast: the hand-written backward takes the output's bf16 gradient and gives float32
    parameter gradients within 2% of the float64 layer's (the statistics' gradients in float32)."""
    op = _tssa(causal, dim=16, heads=4, n=30).train()
    x = torch.randn(3, 30, 16, dtype=torch.float64, requires_grad=True)
    want = torch.autograd.grad(op(x).square().sum(), [x, *op.parameters()])
    op = op.float()
    xf = x.detach().float().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = op(xf)
    assert out.dtype == torch.bfloat16
    got = torch.autograd.grad(out.float().square().sum(), [xf, *op.parameters()])
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g.double(), w, rtol=0, atol=0.02 * w.abs().max().item())


def _copy_vision(ours: TSSA, theirs: tost_vision.AttentionTSSA) -> None:
    theirs.load_state_dict(
        {"qkv.weight": ours.qkv.weight, "qkv.bias": ours.qkv.bias, "temp": ours.temp}
        | {"to_out.0.weight": ours.proj.weight, "to_out.0.bias": ours.proj.bias}
    )


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_tssa_equals_the_authors_vision_attention(dtype, tol):
    ours = _tssa(False, dim=16, heads=4, dtype=dtype)
    theirs = tost_vision.AttentionTSSA(16, num_heads=4, qkv_bias=True).to(dtype).eval()
    _copy_vision(ours, theirs)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(3, 50, 16, dtype=dtype)
    torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_causal_tssa_equals_the_authors_language_attention(dtype, tol):
    cfg = tost_lang.GPTConfig(block_size=20, n_head=4, n_embd=16, bias=True, TSSA=True)
    theirs = tost_lang.CausalSelfAttention_TSSA(cfg).to(dtype).eval()
    ours = TSSA(16, 4, 4, qkv_bias=True, causal=True, block_size=20).to(dtype).eval()
    with torch.no_grad():
        ours.temp.uniform_(0.5, 2.0)
        ours.denom_bias.normal_(0, 0.3)
    theirs.load_state_dict(
        {"c_attn.weight": ours.qkv.weight, "c_attn.bias": ours.qkv.bias, "temp": ours.temp}
        | {"denom_bias": ours.denom_bias, "c_proj.weight": ours.proj.weight, "c_proj.bias": ours.proj.bias}
    )
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(2, 13, 16, dtype=dtype)
    torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)


def test_causal_tssa_reads_no_future_token_and_its_cache_is_the_running_sums():
    op = _tssa(True, n=9)
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    full = op(x)
    later = x.clone()
    later[:, 5:] = torch.randn(2, 4, 12, dtype=torch.float64)
    torch.testing.assert_close(op(later)[:, :5], full[:, :5], rtol=0, atol=0)
    cache: dict = {}
    steps = [op(x[:, :4], cache=cache)] + [op(x[:, j : j + 1], cache=cache) for j in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-12, atol=1e-12)
    assert cache["length"] == 9
    assert {k: tuple(v.shape) for k, v in cache.items() if k != "length"} == {
        "sq": (2, 3, 1, 4),
        "wsq": (2, 3, 1, 4),
        "pi": (2, 3, 1),
    }  # fmt: skip  (a constant size, whatever the length)


@pytest.mark.parametrize("causal", [False, True])
def test_tssa_attention_is_the_membership_weights_each_token_reads(causal):
    op = _tssa(causal)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    attn = op.attention_map(x)
    assert attn.shape == (2, 3, 7, 7)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    Pi = op.memberships(x).transpose(1, 2)  # (b, K, n)
    if causal:
        assert torch.equal(attn, attn.tril())
        torch.testing.assert_close(attn[..., -1, :], Pi / Pi.sum(-1, keepdim=True), rtol=1e-6, atol=1e-12)
    else:  # every token reads the same statistics: every row is Π_k normalised over the tokens
        torch.testing.assert_close(attn[..., 3, :], Pi / Pi.sum(-1, keepdim=True), rtol=1e-6, atol=1e-12)
        torch.testing.assert_close(op.memberships(x).sum(-1), torch.ones(2, 7, dtype=torch.float64))


def test_tssa_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="block_size"):
        TSSA(8, 2, 4, causal=True)
    op = _tssa(True, n=5)
    with pytest.raises(ValueError, match="padding mask"):
        op(torch.randn(1, 3, 12, dtype=torch.float64), key_mask=torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="exceed the context of 8"):
        op(torch.randn(1, 9, 12, dtype=torch.float64))
    with pytest.raises(ValueError, match="causal TSSA"):
        _tssa(False)(torch.randn(1, 3, 12, dtype=torch.float64), cache={})
