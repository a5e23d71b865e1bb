"""The ISTA step's two formulations and its reused step matrix ``A = I + η(D − DᵀD)``.

Every way the kept matrix could outlive the dictionary it was computed from has a test here: each changes ``D``
(or η) the way that path does, and the next forward must equal the paper's step, eq. (44), computed in float64
from the dictionary as it is now.  A kept matrix is observed through ``ISTA.kept_step_matrix`` (the same tensor
object while reused) and FLOPs through ``FlopCounterMode``.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import crate_transformer as ct
from crate_transformer.dino import ema_update
from crate_transformer.layers import ISTA, ista_reference
from crate_transformer.train.optim import ModelEma

D_MODEL = 24


def eq44(m: ISTA, x: torch.Tensor) -> torch.Tensor:
    """Eq. (44) in float64, column form, from the module's dictionary as it is now."""
    z = x.detach().double().reshape(-1, x.shape[-1]).T
    return ista_reference(z, m.weight.detach().double(), m.eta, m.lambd).T.reshape(x.shape)


def assert_step(m: ISTA, x: torch.Tensor, **kw) -> torch.Tensor | None:
    """One no-grad forward of ``m``, checked against eq. (44); returns the matrix it kept (or None)."""
    with torch.no_grad():
        y = m(x)
    torch.testing.assert_close(y.double(), eq44(m, x), rtol=1e-5, atol=1e-5, **kw)
    return None if m._kept is None else m._kept[2]


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
    m = ISTA(D_MODEL, eta=0.3, lambd=0.2, mode=mode).double()
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
    with torch.no_grad():  # the kept matrix, first built then reused
        for _ in range(2):
            torch.testing.assert_close(m(x), want, rtol=1e-12, atol=1e-12)


def test_the_cheaper_formulation_is_chosen_by_flops():
    d = D_MODEL
    m = ISTA(d)
    thin = lambda n: 4 * n * d * d  # noqa: E731  x Dᵀ, then (x − x Dᵀ) D
    fused = lambda n: 2 * n * d * d + 2 * d**3  # noqa: E731  DᵀD, then x A
    for n in (1, d - 1, d, 2 * d):
        x = torch.randn(n, d)
        with torch.no_grad():  # FlopCounterMode is a dispatch mode: nothing is kept under it
            assert step_flops(m, x) == min(thin(n), fused(n)) == (thin(n) if n < d else fused(n))
        xg = x.clone().requires_grad_()
        m.zero_grad()
        # with the backward: 12nd² against 6nd² + 6d³, the same crossover
        assert step_flops(m, xg, backward=True) == (3 * thin(n) if n < d else 3 * fused(n))
    assert m._kept is None


def matmuls(m: ISTA, x: torch.Tensor) -> list[tuple[str, list]]:
    """The matrix products one no-grad forward runs, with their operands' shapes (the profiler is no dispatch
    mode, so the kept matrix is used as in any forward)."""
    with torch.no_grad(), torch.profiler.profile(record_shapes=True) as prof:
        m(x)
    mm = ("aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::bmm")
    return [(e.name, e.input_shapes) for e in prof.events() if e.name in mm]


def test_a_decoded_token_costs_one_matvec_once_kept():
    d = D_MODEL
    m = ISTA(d)
    x = torch.randn(1, 1, d)
    first = matmuls(m, x)  # the d³ product DᵀD, once
    assert ("aten::mm", [[d, d], [d, d]]) in first
    A = m._kept[2]
    for _ in range(3):
        x = torch.randn(1, 1, d)
        assert matmuls(m, x) == [("aten::addmm", [[1], [1, d], [d, d], [], []])]  # x A − ηλ, nothing else
        assert assert_step(m, x) is A  # reused, not rebuilt


# --------------------------------------------------------------------------- when it is kept
def test_kept_only_when_no_gradient_flows_to_a_trainable_parameter():
    m = ISTA(D_MODEL)
    x = torch.randn(2, 5, D_MODEL)
    m(x)
    assert m._kept is None  # grad mode: D is being trained
    with torch.inference_mode():
        m(x)
    assert m._kept is not None
    m.requires_grad_(False)  # frozen: an EMA copy or teacher, commonly written through .data
    with torch.no_grad():
        assert m.kept_step_matrix() is None
    m.requires_grad_(True)
    m(x)
    assert m._kept is None  # a forward that trains D drops it


def test_not_in_state_dict_copies_or_pickles():
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=2, num_classes=3)
    keys = set(model.state_dict())
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 32, 32))
    kept = [layer.ista._kept for layer in model.layers]
    assert all(k is not None for k in kept)
    assert set(model.state_dict()) == keys
    clone = copy.deepcopy(model)
    assert all(layer.ista._kept is None for layer in clone.layers)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    assert buf.getbuffer().nbytes < sum(t.numel() * 4 for t in model.state_dict().values()) + 200_000
    assert all(layer.ista._kept is None for layer in pickle.loads(pickle.dumps(model)).layers)
    assert all(layer.ista._kept is k for layer, k in zip(model.layers, kept))  # the original keeps its own


# --------------------------------------------------------------------------- every way D or η can change
def _kept_then(change):
    """A module with a kept matrix, ``change(m)`` applied, and the next no-grad step checked against eq. (44)."""
    m = ISTA(D_MODEL, eta=0.2, lambd=0.1)
    x = torch.randn(2, 3, D_MODEL)
    A = assert_step(m, x)
    assert A is not None and assert_step(m, x) is A
    before = m.weight.detach().clone()
    change(m)
    assert_step(m, x)
    return m, before


def test_stale_after_in_place_write():
    def write(m):
        with torch.no_grad():
            m.weight.mul_(0.5)

    _kept_then(write)


def other_weights() -> dict[str, torch.Tensor]:
    return {"weight": torch.randn(D_MODEL, D_MODEL, generator=torch.Generator().manual_seed(7))}


def test_stale_after_load_state_dict():
    other = other_weights()
    m, before = _kept_then(lambda m: m.load_state_dict(other))
    assert not torch.equal(before, m.weight)


def test_stale_after_load_state_dict_assign():
    other = other_weights()
    _kept_then(lambda m: m.load_state_dict(other, assign=True))


def test_stale_after_eta_changes():
    def change(m):
        m.eta = 0.05

    _kept_then(change)


def test_stale_after_data_replaced():
    def replace(m):
        m.weight.data = torch.randn(D_MODEL, D_MODEL)

    _kept_then(replace)


def test_stale_after_data_replaced_twice():
    """The second new storage may take the first one's freed address (the allocator reuses a block of the same
    size) with the version counter unchanged: the kept matrix holds the old storage so no address repeats."""

    def replace_twice(m):
        m.weight.data = torch.randn(D_MODEL, D_MODEL)
        m.weight.data = torch.randn(D_MODEL, D_MODEL)

    _kept_then(replace_twice)


def test_stale_after_a_new_parameter_on_the_same_storage():
    """A new Parameter over the same storage starts its own version counter, which can reach the old count."""
    m = ISTA(D_MODEL)
    x = torch.randn(2, D_MODEL)
    assert assert_step(m, x) is not None
    version = m.weight._version
    m.weight = torch.nn.Parameter(m.weight.data)
    with torch.no_grad():
        for _ in range(version):
            m.weight.mul_(1.5)
    assert m.weight._version == version
    assert_step(m, x)


def test_stale_after_a_manual_sgd_step_through_data():
    """``p.data.add_(-lr * p.grad)`` (old tutorials' SGD) is invisible, but the training forward before it dropped
    the kept matrix."""
    m = ISTA(D_MODEL)
    x = torch.randn(2, 3, D_MODEL)
    for _ in range(3):
        assert assert_step(m, x) is not None
        m(x).square().sum().backward()
        m.weight.data.add_(-0.01 * m.weight.grad)
        m.weight.grad = None
    assert_step(m, x)


def test_stale_after_dtype_round_trip():
    """``.half().float()`` rounds D; the float32 dictionary that comes back must not meet the old matrix."""
    m, before = _kept_then(lambda m: m.half().float())
    assert not torch.equal(before, m.weight)


def test_stale_after_dtype_change():
    torch.manual_seed(0)
    m = ISTA(D_MODEL)
    x = torch.randn(2, 3, D_MODEL)
    assert_step(m, x)
    m.double()
    A = assert_step(m, x.double(), msg="float64 after .double()")
    assert A.dtype == torch.float64


def test_to_same_dtype_and_device_keeps_it():
    m = ISTA(D_MODEL)
    x = torch.randn(2, 3, D_MODEL)
    assert_step(m, x)
    m.to(torch.float32)  # a no-op conversion: still dropped (module._apply releases it), rebuilt equal
    assert m._kept is None
    A = assert_step(m, x)
    assert assert_step(m, x) is A


@pytest.mark.parametrize("opt", ["sgd", "adamw_foreach", "adamw_fused", "adamw_for_loop"])
def test_stale_after_an_optimizer_step(opt):
    """The training step with a no-grad forward between backward and step (e.g. a metric on the same batch): fused
    optimizers write the weights without bumping their version counters."""
    torch.manual_seed(0)
    m = ISTA(D_MODEL)
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.01),
        "adamw_foreach": lambda p: torch.optim.AdamW(p, lr=0.1, foreach=True),
        "adamw_fused": lambda p: torch.optim.AdamW(p, lr=0.1, fused=True),
        "adamw_for_loop": lambda p: torch.optim.AdamW(p, lr=0.1, foreach=False),
    }[opt]
    optimizer = make(m.parameters())
    x = torch.randn(2, 3, D_MODEL)
    for _ in range(2):
        m(x).square().sum().backward()
        kept = assert_step(m, x)  # kept from the weights before the step
        assert kept is not None
        before = m.weight.detach().clone()
        optimizer.step()
        optimizer.zero_grad()
        assert not torch.equal(before, m.weight)
        assert_step(m, x)


def test_fused_optimizers_do_not_bump_the_version_counter():
    """Why a version counter alone cannot prove a weight unchanged (PyTorch's fused kernels write in place)."""
    p = torch.nn.Parameter(torch.randn(4, 4))
    p.grad = torch.ones(4, 4)
    v = p._version
    torch.optim.AdamW([p], lr=0.1, fused=True).step()
    assert p._version == v


def test_stale_after_ema_update_of_a_trainable_copy():
    torch.manual_seed(0)
    student = ISTA(D_MODEL)
    _kept_then(lambda m: ema_update(m, student, 0.5))


def test_model_ema_copy_follows_its_updates():
    torch.manual_seed(0)
    model = ISTA(D_MODEL)
    ema = ModelEma(model, 0.5)
    x = torch.randn(2, 3, D_MODEL)
    for _ in range(3):
        assert_step(ema.module, x)
        with torch.no_grad():
            model.weight.add_(torch.randn_like(model.weight))
        ema.update(model)
    assert_step(ema.module, x)


def test_frozen_teacher_written_through_data_is_never_stale():
    """DINO's and mean-teacher code update the teacher with ``p.data.mul_(m).add_(...)``, which no version counter
    sees; frozen parameters are therefore never kept."""
    torch.manual_seed(0)
    teacher, student = ISTA(D_MODEL).requires_grad_(False), ISTA(D_MODEL)
    x = torch.randn(2, 3, D_MODEL)
    for _ in range(3):
        assert_step(teacher, x)
        for pt, ps in zip(teacher.parameters(), student.parameters()):
            pt.data.mul_(0.5).add_(0.5 * ps.detach().data)


def test_train_eval_switch_drops_it():
    """A write through ``.data`` on a trainable model is invisible; switching the mode is the documented remedy."""
    torch.manual_seed(0)
    model = ct.create_model("crate_tiny", image_size=32, patch_size=8, depth=2, num_classes=3).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        model(x)
    for layer in model.layers:
        layer.ista.weight.data.mul_(0.5)
    model.eval()
    ref = copy.deepcopy(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x))
    model.train()
    assert all(layer.ista._kept is None for layer in model.layers)


def test_requires_grad_switched_on_trains_the_current_weights():
    """Kept in inference, then the model trains: the gradient to D is the one of the literal step."""
    m = ISTA(D_MODEL).double()
    x = torch.randn(3, D_MODEL, dtype=torch.float64)
    m.requires_grad_(False)
    assert_step(m, x)
    m.requires_grad_(True)
    assert_step(m, x)  # kept now
    y = m(x)
    D = m.weight
    want = F.relu((x.T - m.eta * D.T @ (D @ x.T - x.T)).T - m.eta * m.lambd)
    g = torch.randn_like(y)
    torch.testing.assert_close(torch.autograd.grad(y, D, g)[0], torch.autograd.grad(want, D, g)[0])


def test_input_gradients_through_a_frozen_or_kept_step():
    """Saliency on a model used for inference: x requires grad, D does not (kept matrices are never built from an
    inference tensor that autograd would refuse to save)."""
    m = ISTA(D_MODEL)
    x = torch.randn(4, D_MODEL)
    with torch.inference_mode():
        m(x)
    m.requires_grad_(False)
    xg = x.clone().requires_grad_()
    m(xg).sum().backward()
    xr = x.double().requires_grad_()
    D = m.weight.double()
    F.relu((xr.T - m.eta * D.T @ (D @ xr.T - xr.T)).T - m.eta * m.lambd).sum().backward()
    torch.testing.assert_close(xg.grad.double(), xr.grad, rtol=1e-5, atol=1e-5)


def test_autocast_uses_a_full_precision_matrix_and_leaves_none_behind():
    m = ISTA(D_MODEL)
    x = torch.randn(2, 5, D_MODEL)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = m(x)
    assert y16.dtype == torch.bfloat16
    torch.testing.assert_close(y16.double(), eq44(m, x), rtol=0.05, atol=0.05)
    assert m._kept[2].dtype == torch.float32
    assert_step(m, x)  # float32 afterwards, to float32 rounding


# --------------------------------------------------------------------------- where nothing may be kept
def test_functional_call_uses_the_given_weights():
    m = ISTA(D_MODEL)
    x = torch.randn(2, D_MODEL)
    assert_step(m, x)
    other = {"weight": torch.randn(D_MODEL, D_MODEL)}
    with torch.no_grad():
        y = torch.func.functional_call(m, other, (x,))
    want = ista_reference(x.double().T, other["weight"].double(), m.eta, m.lambd).T
    torch.testing.assert_close(y.double(), want, rtol=1e-5, atol=1e-5)
    assert_step(m, x)  # and the module's own afterwards


def test_vmap_and_grad_transforms():
    m = ISTA(D_MODEL)
    xs = torch.randn(3, 2, D_MODEL)
    with torch.no_grad():
        y = torch.func.vmap(m)(xs)
    torch.testing.assert_close(y.double(), eq44(m, xs), rtol=1e-5, atol=1e-5)
    params = {k: v.detach() for k, v in m.named_parameters()}
    g = torch.func.grad(lambda p: torch.func.functional_call(m, p, (xs[0],)).sum())(params)["weight"]
    D = m.weight.detach().double().requires_grad_()
    z = xs[0].double().T
    F.relu((z - m.eta * D.T @ (D @ z - z)).T - m.eta * m.lambd).sum().backward()
    torch.testing.assert_close(g.double(), D.grad, rtol=1e-5, atol=1e-5)


def test_meta_and_fake_tensors_keep_nothing():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        meta = ISTA(D_MODEL)
    with torch.no_grad():
        assert meta(torch.empty(2, D_MODEL, device="meta")).shape == (2, D_MODEL)
    assert meta._kept is None
    real = ISTA(D_MODEL)
    x = torch.randn(2, D_MODEL)
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as fake:
        real(fake.from_tensor(x))
    assert real._kept is None
    assert_step(real, x)


def test_weights_made_in_inference_mode():
    """Inference tensors have no version counter: nothing is kept for them."""
    with torch.inference_mode():
        m = ISTA(D_MODEL)
        x = torch.randn(2, D_MODEL)
        for _ in range(2):
            torch.testing.assert_close(m(x).double(), eq44(m, x), rtol=1e-5, atol=1e-5)
    assert m._kept is None


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::torch.jit.TracerWarning")
def test_a_traced_module_follows_its_weights():
    """``torch.jit.trace`` records the ops of one call: a kept matrix would be frozen into the trace as a constant."""
    m = ISTA(D_MODEL)
    x = torch.randn(2, D_MODEL)
    assert_step(m, x)  # kept before tracing
    with torch.no_grad():
        traced = torch.jit.trace(m, x, check_trace=False)
        m.weight.mul_(0.5)
        torch.testing.assert_close(traced(x).double(), eq44(m, x), rtol=1e-5, atol=1e-5)


def test_no_reuse_while_a_process_group_is_up(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        m = ISTA(D_MODEL)
        assert_step(m, torch.randn(2, D_MODEL))
        assert m._kept is None
    finally:
        dist.destroy_process_group()


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
    assert all(layer.ista._kept is None for layer in model.layers)  # compiled code keeps nothing
