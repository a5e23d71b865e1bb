"""The ISTA step's two formulations and the step matrix ``A = I + η(D − DᵀD)`` held by :func:`frozen_weights`.

Outside the context every forward computes its own product (the thin or the fused one, whichever costs fewer
FLOPs); inside, ``A`` is computed once on entry and every forward through which no gradient flows to ``D`` uses it.
Each forward is checked against the paper's step, eq. (44), in float64 from the dictionary as it is; FLOPs through
``FlopCounterMode``, products through the profiler.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import crate_transformer as ct
from crate_transformer.layers import ISTA, SoftISTA, frozen_weights, ista_reference

D_MODEL = 24


def eq44(m: ISTA, x: torch.Tensor) -> torch.Tensor:
    """Eq. (44) in float64, column form, from the module's dictionary as it is now."""
    z = x.detach().double().reshape(-1, x.shape[-1]).T
    return ista_reference(z, m.weight.detach().double(), m.eta, m.lambd).T.reshape(x.shape)


def assert_step(m: ISTA, x: torch.Tensor, **kw) -> None:
    """One no-grad forward of ``m``, checked against eq. (44)."""
    with torch.no_grad():
        y = m(x)
    torch.testing.assert_close(y.double(), eq44(m, x), rtol=1e-5, atol=1e-5, **kw)


def step_flops(m: ISTA, x: torch.Tensor, backward: bool = False) -> int:
    with FlopCounterMode(display=False) as fc:
        y = m(x)
        if backward:
            y.sum().backward()
    return fc.get_total_flops()


# --------------------------------------------------------------------------- the two formulations
@pytest.mark.parametrize("rows", [1, 7, D_MODEL - 1, D_MODEL, 3 * D_MODEL])
@pytest.mark.parametrize("mode", ["relu", "soft"])
def test_both_formulations_are_eq44_in_float64(rows, mode):
    m = (ISTA if mode == "relu" else SoftISTA)(D_MODEL, eta=0.3, lambd=0.2).double()
    x = torch.randn(1, rows, D_MODEL, dtype=torch.float64, requires_grad=True)
    y = m(x)  # gradients flow: never the kept matrix
    z = x.reshape(-1, D_MODEL).T
    D = m.weight
    pre = (z - 0.3 * D.T @ (D @ z - z)).T.reshape(x.shape)  # eq. (44) before the proximal map
    want = F.relu(pre - 0.06) if mode == "relu" else F.softshrink(pre, 0.06)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    gy = torch.randn_like(y)
    got = torch.autograd.grad(y, (x, m.weight), gy)
    ref = torch.autograd.grad(want, (x, m.weight), gy)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)
    with torch.no_grad(), frozen_weights(m):  # the held matrix
        for _ in range(2):
            torch.testing.assert_close(m(x), want, rtol=1e-12, atol=1e-12)


def test_the_cheaper_formulation_is_chosen_by_flops():
    d = D_MODEL
    m = ISTA(d)
    thin = lambda n: 4 * n * d * d  # noqa: E731  x Dᵀ, then (x − x Dᵀ) D
    fused = lambda n: 2 * n * d * d + 2 * d**3  # noqa: E731  DᵀD, then x A
    for n in (1, d - 1, d, 2 * d):
        x = torch.randn(n, d)
        with torch.no_grad():
            assert step_flops(m, x) == min(thin(n), fused(n)) == (thin(n) if n < d else fused(n))
            with frozen_weights(m):  # A computed on entry: 2nd² per forward
                assert step_flops(m, x) == 2 * n * d * d
        xg = x.clone().requires_grad_()
        m.zero_grad()
        # with the backward: 12nd² against 6nd² + 6d³, the same crossover
        assert step_flops(m, xg, backward=True) == (3 * thin(n) if n < d else 3 * fused(n))
        m.zero_grad()
        with frozen_weights(m):  # a gradient flows to D: D's own product, never the held one
            assert step_flops(m, xg, backward=True) == (3 * thin(n) if n < d else 3 * fused(n))
    assert m.frozen is None


def matmuls(m: ISTA, x: torch.Tensor) -> list[tuple[str, list]]:
    """The matrix products one no-grad forward runs, with their operands' shapes."""
    with torch.no_grad(), torch.profiler.profile(record_shapes=True) as prof:
        m(x)
    mm = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm")
    return [(e.name, e.input_shapes) for e in prof.events() if e.name in mm]


def test_a_decoded_token_costs_one_matvec_inside_frozen_weights():
    d = D_MODEL
    m = ISTA(d)
    x = torch.randn(1, 1, d)
    assert ("aten::linear", [[1, d], [d, d], []]) in matmuls(m, x)  # outside: the thin form, two products
    with frozen_weights(m):
        A = m.frozen
        for _ in range(3):
            x = torch.randn(1, 1, d)
            assert matmuls(m, x) == [("aten::addmm", [[d], [1, d], [d, d], [], []])]  # x A − ηλ, nothing else
            assert_step(m, x)
        assert m.frozen is A  # computed once, on entry
    assert m.frozen is None


# --------------------------------------------------------------------------- the context
def test_the_context_holds_and_drops_and_nests():
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=2).eval()
    blocks = [layer.ista for layer in model.layers]
    with frozen_weights(model) as held:
        assert held is model and all(b.frozen is not None for b in blocks)
        kept = [b.frozen for b in blocks]
        with frozen_weights(model.layers[0]):  # an inner context leaves what the outer one holds
            pass
        assert all(b.frozen is k for b, k in zip(blocks, kept))
        torch.testing.assert_close(kept[0], blocks[0].step_matrix().detach())
    assert all(b.frozen is None for b in blocks)
    with pytest.raises(RuntimeError, match="inside"), frozen_weights(model):
        raise RuntimeError("inside")
    assert all(b.frozen is None for b in blocks)  # dropped on an error too
    assert not any(k.endswith("frozen") for k in model.state_dict())


def test_model_outputs_are_unchanged_inside_the_context():
    for name, x in (("crate_tiny", torch.randn(1, 3, 32, 32)), ("crate_gpt_mini", torch.randint(0, 262, (1, 3)))):
        model = ct.create_model(name, **({"image_size": 32, "patch_size": 8} if "tiny" in name else {}), depth=2)
        model = model.double().eval()
        x = x.double() if x.is_floating_point() else x
        with torch.no_grad():
            want = model(x)
            with frozen_weights(model):
                torch.testing.assert_close(model(x), want, rtol=1e-10, atol=1e-10)


def test_input_gradients_flow_through_the_held_step():
    """Saliency on a model used for inference: x requires grad, D does not."""
    m = ISTA(D_MODEL).requires_grad_(False)
    x = torch.randn(4, D_MODEL)
    with frozen_weights(m):
        xg = x.clone().requires_grad_()
        m(xg).sum().backward()
    xr = x.double().requires_grad_()
    D = m.weight.double()
    F.relu((xr.T - m.eta * D.T @ (D @ xr.T - xr.T)).T - m.eta * m.lambd).sum().backward()
    torch.testing.assert_close(xg.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)


def test_weights_trained_inside_the_context_get_their_own_gradients():
    m = ISTA(D_MODEL)
    x = torch.randn(3, D_MODEL)
    with frozen_weights(m):
        m(x).sum().backward()
    g = m.weight.grad.clone()
    m.zero_grad()
    m(x).sum().backward()
    torch.testing.assert_close(g, m.weight.grad)


def test_autocast_holds_a_full_precision_matrix():
    m = ISTA(D_MODEL)
    x = torch.randn(2, 5, D_MODEL)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), frozen_weights(m):
        assert m.frozen.dtype == torch.float32
        y16 = m(x)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.double(), eq44(m, x), rtol=0.05, atol=0.05)


def test_meta_models():
    with torch.device("meta"):
        meta = ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=1)
    with frozen_weights(meta):  # shapes only: nothing to compute, nothing fails
        assert meta.layers[0].ista.frozen.device.type == "meta"


def test_importing_the_package_registers_no_optimizer_hook():
    code = (
        "import torch.optim.optimizer as o; before = len(o._global_optimizer_post_hooks); "
        "import crate_transformer; assert len(o._global_optimizer_post_hooks) == before"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_inference_entry_points_hold_the_weights(monkeypatch):
    """generate, evaluation, the analysis: each runs the model inside ``frozen_weights`` (counted on ISTA.freeze)."""
    from crate_transformer.analysis import measure

    calls = []
    real = ISTA.freeze
    monkeypatch.setattr(ISTA, "freeze", lambda self: (calls.append(self), real(self)))
    lm = ct.create_model("crate_gpt_mini", depth=2, dim=32, heads=2)
    lm.generate(torch.randint(0, 262, (1, 3)), 2)
    assert len(calls) == 2 and all(layer.ista.frozen is None for layer in lm.layers)
    image = ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=2, num_classes=3)
    measure(image, torch.randn(2, 3, 32, 32), progress=False)
    assert len(calls) == 4
    image.forward_trace(torch.randn(1, 3, 32, 32))  # a plain call holds nothing
    assert len(calls) == 4


# --------------------------------------------------------------------------- compile
FAMILIES = {
    "crate": lambda: (ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=2), torch.randn(2, 3, 32, 32)),
    "crate_lm": lambda: (ct.create_model("crate_gpt_mini", depth=2, dim=32, heads=2), torch.randint(0, 262, (2, 9))),
    "crate_mae": lambda: (
        ct.create_model("crate_mae_tiny", image_size=32, patch_size=8, depth=1, dim=32, heads=2),
        torch.randn(2, 3, 32, 32),
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_graph_breaks_in_eval_and_train(family):
    model, x = FAMILIES[family]()
    for mode, grad in (("eval", False), ("eval", True), ("train", True)):
        getattr(model, mode)()
        with torch.set_grad_enabled(grad):
            explained = torch._dynamo.explain(model)(x)
        assert explained.graph_break_count == 0, (mode, grad, explained.break_reasons)


def test_a_sharded_model_keeps_nothing_and_computes_what_it_computed(tmp_path):
    """FSDP's weights are DTensor shards, whole only inside each block's forward: frozen_weights holds nothing
    for them, and the sharded model's outputs inside the context are its outputs outside it."""
    import torch.distributed as dist

    from crate_transformer.train.sharding import shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model = ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=2, dim=32, heads=2).eval()
        x = torch.randn(2, 3, 32, 32)
        with torch.no_grad():
            want = model(x)
            sharded = shard(model)
            with frozen_weights(sharded):
                assert all(layer.ista.frozen is None for layer in sharded.layers)
                torch.testing.assert_close(sharded(x), want)
    finally:
        dist.destroy_process_group()


# --------------------------------------------------------------------------- the GEMM's bias
def _families() -> dict:
    from tiny import family_builders

    lm = dict(dim=32, depth=2, heads=4, block_size=8, vocab_size=50)
    return {**family_builders(), "crate_lm_overcomplete": lambda: ct.create_model("crate_gpt_12l_pile", **lm)}


def _addmm_biases(model: torch.nn.Module, x, amp: torch.dtype | None) -> list[tuple]:
    """(bias shape, contiguous, output shape, the bias's value where constant) of every ``addmm`` over more token
    rows than the model's width in a training step, an evaluation and an evaluation inside ``frozen_weights``."""
    from tiny import family_loss
    from torch.utils._python_dispatch import TorchDispatchMode

    calls: list[tuple] = []
    width = next(m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)).normalized_shape[0]

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.addmm and args[1].shape[0] > width:
                bias = args[0]
                first = bias.flatten()[0].item()  # the sparse step's bias is -ηλ everywhere
                constant = first if bool((bias == first).all()) else None
                calls.append((tuple(bias.shape), bias.is_contiguous(), tuple(out.shape), constant))
            return out

    for mode, held in (("train", False), ("eval", False), ("eval", True)):
        getattr(model, mode)()
        with frozen_weights(model) if held else torch.enable_grad(), Record():
            with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
                out = model(x)
            if mode == "train":
                family_loss(out[0] if isinstance(out, tuple) else out).backward()
    return calls


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
def test_every_product_over_token_rows_takes_its_bias_as_a_row(amp):
    """A GPU's GEMM adds a bias row of the output's width in its epilogue (cuBLASLt); any other broadcast bias
    (ISTA's ``-ηλ`` and CRATE-α's shift as one-entry tensors did) is first expanded into the whole output and
    read back by the GEMM.  In every family, every ``addmm`` over more token rows than the width, in training,
    evaluation and inside ``frozen_weights``, with and without autocast, takes a contiguous bias row of the
    output's width or a per-token term of the output's shape."""
    from tiny import family_inputs

    for family, build in _families().items():
        torch.manual_seed(0)
        model = build()
        x = family_inputs(model)
        if isinstance(model, ct.LanguageModel):  # more token rows than the width: ISTA's fused product
            x = torch.randint(0, model.config.vocab_size, (6, 8))
        calls = _addmm_biases(model, x, amp)
        bad = [c for c in calls if not ((c[0] == c[2][-1:] and c[1]) or c[0] == c[2])]
        assert not bad, (family, bad)
        if family in ("crate", "crate_gpt", "crate_alpha"):  # the sparse step is among the products checked
            shifts = {-m.eta * m.lambd for m in model.modules() if hasattr(m, "lambd")}
            sparse = [c for c in calls if c[3] is not None and any(abs(c[3] - t) < 1e-3 for t in shifts)]
            assert len(sparse) >= 2 * 3, (family, calls)  # each of the 2 layers in each of the 3 modes
