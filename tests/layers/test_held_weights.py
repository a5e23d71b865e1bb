"""The product held by :func:`frozen_weights` (ISTA's ``A = I + η(D − DᵀD)``) is never used for weights other than
those it was computed from.

Every way a weight can change inside the context is walked (:data:`CHANGES`): in place (``add_``, ``copy_``, an
optimizer's step, ``load_state_dict``), by a new tensor (``param.data = …``, a new ``Parameter``,
``load_state_dict(assign=True)``, ``.double()``, ``torch.func.functional_call``), and by a copy of the model taken
inside (``copy.deepcopy``, ``torch.save`` / ``torch.load``) whose weights then change, before and after the context is
entered again.  After each, the model's outputs inside the context are a fresh model's with the same weights, built
outside any context, in float64 to 1e-10: a stale product is off by ~0.1.
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable

import pytest
import torch
from torch import nn

import crate_transformer as ct
from crate_transformer.layers import ISTA, evaluating, frozen_weights

TINY = dict(image_size=32, patch_size=8, depth=2, dim=32, heads=2, num_classes=3)


def build(seed: int = 0, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return ct.create_model("crate_tiny", **TINY).to(dtype).eval()


def images() -> torch.Tensor:
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def blocks(model: nn.Module) -> list[ISTA]:
    return [m for m in model.modules() if isinstance(m, ISTA)]


def noise(p: torch.Tensor) -> torch.Tensor:
    return 0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype)


def fresh_output(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The output of a model built anew with ``model``'s weights, outside any context, in float64."""
    fresh = build(seed=7)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        return fresh(x)


def assert_own_weights(model: nn.Module, x: torch.Tensor) -> None:
    """``model``'s outputs (twice: the second forward reads what the first may have recomputed) are a fresh
    model's with its weights."""
    want = fresh_output(model, x)
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(model(x.to(want.dtype)), want, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- the ways a weight changes
def add_in_place(model: nn.Module, x: torch.Tensor) -> nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(noise(p))
    return model


def copy_into(model: nn.Module, x: torch.Tensor) -> nn.Module:
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p + noise(p))
    return model


def optimizer_step(model: nn.Module, x: torch.Tensor) -> nn.Module:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(x).square().mean().backward()  # gradients flow to D: its own product (tests/layers/test_ista_reuse.py)
    opt.step()
    return model


def load_state(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model.load_state_dict(build(seed=3).state_dict())
    return model


def load_state_assigned(model: nn.Module, x: torch.Tensor) -> nn.Module:
    model.load_state_dict(build(seed=3).state_dict(), assign=True)
    return model


def assign_data(model: nn.Module, x: torch.Tensor) -> nn.Module:
    for p in model.parameters():
        p.data = p.data + noise(p)
    return model


def new_parameter(model: nn.Module, x: torch.Tensor) -> nn.Module:
    for block in blocks(model):
        block.weight = nn.Parameter(block.weight.detach() + noise(block.weight))
    return model


def to_double(model: nn.Module, x: torch.Tensor) -> nn.Module:
    return model.double()  # the context was entered on the float32 model (CHANGES_FROM_FLOAT32)


def deepcopy_then_change(model: nn.Module, x: torch.Tensor) -> nn.Module:
    return add_in_place(copy.deepcopy(model), x)  # an EMA or best-model copy taken during an evaluation


def saved_then_change(model: nn.Module, x: torch.Tensor) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return add_in_place(torch.load(buffer, weights_only=False), x)


def pickled_then_step(model: nn.Module, x: torch.Tensor) -> nn.Module:
    return optimizer_step(pickle.loads(pickle.dumps(model)), x)


CHANGES: dict[str, Callable[[nn.Module, torch.Tensor], nn.Module]] = {
    "add_ in place": add_in_place,
    "copy_ under no_grad": copy_into,
    "optimizer step": optimizer_step,
    "load_state_dict": load_state,
    "load_state_dict(assign=True)": load_state_assigned,
    "param.data = ...": assign_data,
    "a new Parameter": new_parameter,
    ".double()": to_double,
    "deepcopy, then the copy changes": deepcopy_then_change,
    "torch.save / torch.load, then the loaded model changes": saved_then_change,
    "pickle, then an optimizer step on the copy": pickled_then_step,
}
CHANGES_FROM_FLOAT32 = {".double()"}


@pytest.mark.parametrize("held", [frozen_weights, evaluating])
@pytest.mark.parametrize("change", CHANGES)
def test_a_held_product_is_never_used_for_other_weights(change: str, held: Callable) -> None:
    """Inside the context, after the change, the changed model (and the original, where the change was made to a
    copy) computes with its own weights; and again after the context is entered on it anew."""
    model = build(dtype=torch.float32 if change in CHANGES_FROM_FLOAT32 else torch.float64)
    x = images()
    with held(model):
        with torch.no_grad():
            model(x.to(model.cls_token.dtype))  # the held product in use
        changed = CHANGES[change](model, x.to(model.cls_token.dtype))
        assert changed.cls_token.dtype == torch.float64
        assert_own_weights(changed, x)
        assert_own_weights(model.double(), x)
        with held(changed):  # entered again, e.g. on a copy
            assert_own_weights(changed, x)
            add_in_place(changed, x)
            assert_own_weights(changed, x)
    assert all(b.frozen is None for b in blocks(model) + blocks(changed))
    assert_own_weights(changed, x)


def test_functional_call_with_other_weights_uses_them() -> None:
    model, x = build(), images()
    other = build(seed=5).state_dict()
    with frozen_weights(model), torch.no_grad():
        want = fresh_output(model, x)
        got = torch.func.functional_call(model, other, (x,))
        torch.testing.assert_close(got, fresh_output(build(seed=5), x), rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(model(x), want, rtol=1e-10, atol=1e-10)  # its own weights again


def test_copies_and_pickles_never_carry_the_held_product() -> None:
    model = build()
    outside = io.BytesIO()
    torch.save(model, outside)
    with frozen_weights(model):
        assert all(b.frozen is not None for b in blocks(model))
        inside = io.BytesIO()
        torch.save(model, inside)
        for twin in (copy.deepcopy(model), copy.copy(model.layers[0].ista), pickle.loads(pickle.dumps(model))):
            assert all(b.frozen is None for b in blocks(twin))  # not held: the context holds the original
    assert len(inside.getvalue()) == len(outside.getvalue())  # no product in the file


def test_the_product_is_computed_once_while_the_weights_stay_and_again_when_they_change() -> None:
    model, x = build(), images()
    block = model.layers[0].ista
    with frozen_weights(model), torch.no_grad():
        kept = block.frozen
        model(x)
        model(x)
        assert block.frozen is kept  # the weights did not change: the product of the entry
        block.weight.mul_(1.5)
        model(x)
        renewed = block.frozen
        assert renewed is not kept
        torch.testing.assert_close(renewed, block.step_matrix(), rtol=0, atol=0)
        model(x)
        assert block.frozen is renewed


def test_weights_made_under_inference_mode_are_not_held() -> None:
    """An inference tensor has no version counter: an in-place change to it cannot be seen, so nothing is held."""
    with torch.inference_mode():
        model, x = build(), images()
        with frozen_weights(model):
            add_in_place(model, x)
            want = fresh_output(model, x)
            torch.testing.assert_close(model(x), want, rtol=1e-10, atol=1e-10)


STALE = r"^ISTA's weight changed inside frozen_weights while compiled code kept reading the step matrix held for"


def test_compiled_code_reads_the_held_product_and_a_change_past_it_is_refused() -> None:
    """A graph cannot read a version counter: compiled forwards read the held product unchecked and say so, and a
    weight changed after that is refused at the next eager forward, or on leaving the context, never used."""
    model, x = build(), images()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    block = model.layers[0].ista
    with torch.no_grad():
        with pytest.raises(RuntimeError, match=STALE), frozen_weights(model):
            torch.testing.assert_close(compiled(x), fresh_output(model, x), rtol=1e-10, atol=1e-10)
            assert block.held.compiled  # the graph read the held product
            add_in_place(model, x)
            model(x)  # the eager forward finds the change
        with pytest.raises(RuntimeError, match=STALE), frozen_weights(model):
            compiled(x)
            add_in_place(model, x)  # found on leaving
        assert all(b.frozen is None for b in blocks(model))
        with frozen_weights(model):  # changed, then read eagerly first: recomputed, and the graph reads the new one
            add_in_place(model, x)
            assert_own_weights(model, x)
            torch.testing.assert_close(compiled(x), fresh_output(model, x), rtol=1e-10, atol=1e-10)
            assert block.held.compiled


def test_an_exported_program_holds_nothing() -> None:
    model, x = build(), images()
    with frozen_weights(model):
        program = torch.export.export(model, (x,))
        add_in_place(model, x)
    assert not program.constants  # no product baked in: its inputs are the parameters and the images
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), fresh_output(model, x), rtol=1e-10, atol=1e-10)
