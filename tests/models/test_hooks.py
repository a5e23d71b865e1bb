"""Hook points, ``run_with_cache`` and ``intervene`` (``models/hooks.py``, ``layers/hooks.py``).

Every family's names are read off its layers; the cache equals ``forward_trace`` and the layers' own modules in
float64; each ready-made edit equals the same change made another way (the weights of a head zeroed, the layers run
by hand, another input's output); interventions hold in ``generate`` (eager, cached, compiled), inside
``evaluating`` and under autocast, and leave nothing behind, an exception included.
"""

from __future__ import annotations

import copy

import pytest
import tiny
import torch
import torch.nn.functional as F

import crate_transformer as ct
from crate_transformer.layers import _hook_state
from crate_transformer.models.hooks import ablate, multiply, patch, scale, set_value, steer

FAMILIES = [f for f in tiny.family_builders() if f != "dino"]


def _build(family: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny.family_builders()[family]().to(dtype).eval()


def _call(model: torch.nn.Module) -> dict:
    """Keyword arguments of a run of every layer on the whole input (CRATE-MAE: its encoder on the unmasked image,
    the forward masks)."""
    return {"method": "forward_features"} if isinstance(model, ct.CRATEMAE) else {}


def _hooks_left(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()) + (
        "forward_head" in model.__dict__
    )


# ----------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_names_every_layers_values(family: str) -> None:
    model = _build(family)
    names = model.hook_names()
    assert names[0] == "embed" and names[-1] == "head" and len(set(names)) == len(names)
    for i in range(model.config.depth):
        mine = [n.split(".", 2)[2] for n in names if n.startswith(f"layers.{i}.")]
        attn = {"attn.q", "attn.k", "attn.v"} if family in ("vit", "gpt", "crate_mhsa") else {"attn.qkv"}
        units = "mlp.hidden" if family in ("vit", "gpt", "tost", "tost_lm") else "code"
        assert set(mine) == {"z_in", "attn.pattern", "attn.out", "z_half", units, "z_out"} | attn, mine
        assert mine[0] == "z_in" and mine[-1] == "z_out"  # in the order they are formed
    if family == "crate_mae":
        assert f"decoder_layers.{model.config.depth - 1}.z_half" in names
    # the hook points hold no state: the state dict is the released one
    assert not [k for k in model.state_dict() if "z_half" in k or "pattern" in k]


# ----------------------------------------------------------------------------------------------- the cache
@pytest.mark.parametrize("family", FAMILIES)
def test_cache_equals_forward_trace_and_the_layers_own_modules_float64(family: str) -> None:
    model = _build(family, torch.float64)
    x = tiny.family_inputs(model)
    x = x.double() if x.is_floating_point() else x
    out, cache = model.run_with_cache(x, **_call(model))
    trace = model.forward_trace(x, return_attention=True)
    exact = dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cache["embed"], trace.tokens[0], **exact)
    for i, layer in enumerate(model.layers):
        z, half = cache[f"layers.{i}.z_in"], cache[f"layers.{i}.z_half"]
        torch.testing.assert_close(z, trace.tokens[i], **exact)
        torch.testing.assert_close(half, trace.half[i], **exact)
        torch.testing.assert_close(cache[f"layers.{i}.z_out"], trace.tokens[i + 1], **exact)
        torch.testing.assert_close(cache[f"layers.{i}.attn.pattern"], trace.attention[i], **exact)
        # the projections and the units, computed again from the cached input by the layer's own modules
        h = layer.norm1(z)
        if f"layers.{i}.attn.qkv" in cache:
            torch.testing.assert_close(cache[f"layers.{i}.attn.qkv"], layer.attn.project(h), **exact)
        else:
            for name, mine in zip("qkv", layer.attn.project(h)):
                torch.testing.assert_close(cache[f"layers.{i}.attn.{name}"], mine, **exact)
        module, kind = layer.code_site()
        block_in = layer.norm2(half)
        if kind == "mlp":
            units = F.gelu(layer.block[0](block_in), approximate=layer.block[1].approximate)
            torch.testing.assert_close(cache[f"layers.{i}.mlp.hidden"], units, **exact)
        elif kind in ("odl", "ista_overcomplete"):
            torch.testing.assert_close(cache[f"layers.{i}.code"], layer.block.code(block_in), **exact)
        else:
            torch.testing.assert_close(cache[f"layers.{i}.code"], layer.block(block_in), **exact)
    if not _call(model):  # the head's output is the model's output
        torch.testing.assert_close(cache["head"], out, **exact)
    assert _hooks_left(model) == 0 and _hook_state.key == 0


def test_only_the_named_values_are_recorded() -> None:
    model = _build("crate")
    x = tiny.family_inputs(model)
    _, cache = model.run_with_cache(x, names=["layers.1.code", "embed"])
    assert list(cache) == ["embed", "layers.1.code"]
    _, cache = model.run_with_cache(x, names=lambda n: n.endswith("z_half"))
    assert list(cache) == ["layers.0.z_half", "layers.1.z_half"]
    with pytest.raises(KeyError, match="nearest recorded: layers.0.z_half"):
        cache["layers.0.z_hal"]


# ----------------------------------------------------------------------------------------------- edits
@pytest.mark.parametrize("family", FAMILIES)
def test_an_edit_returning_a_copy_changes_nothing_anywhere(family: str) -> None:
    """Every site's write-back (the head axis joined again, the overcomplete code decoded) is exact."""
    model = _build(family, torch.float64)
    x = tiny.family_inputs(model)
    x = x.double() if x.is_floating_point() else x
    torch.manual_seed(1)
    plain = model(x)  # CRATE-MAE: encoder and decoder, a seeded mask
    editable = [n for n in model.hook_names() if not n.endswith("pattern") or family not in ("tost", "tost_lm")]
    with model.intervene({n: (lambda v: v.clone() * 1.0) for n in editable}):
        torch.manual_seed(1)
        edited = model(x)
    for a, b in zip(plain if isinstance(plain, tuple) else [plain], edited if isinstance(edited, tuple) else [edited]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert _hooks_left(model) == 0


@pytest.mark.parametrize("family", ["crate", "gpt", "tost"])
def test_ablating_a_head_equals_zeroing_its_projection_weights(family: str) -> None:
    """A head's ``U_kᵀ`` rows zeroed in the weights gives what ablating head k of ``attn.qkv`` (or q, k and v of a
    standard attention) gives, at layer 0."""
    model = _build(family, torch.float64)
    x = tiny.family_inputs(model)
    names = [n for n in model.hook_names() if n.startswith("layers.0.attn.") and n[-1] in "qkv"]
    with model.intervene({n: ablate([1], axis=1) for n in names}):
        edited = model(x)
    bare = copy.deepcopy(model)
    attn = bare.layers[0].attn
    rows = torch.arange(attn.qkv.out_features).view(len(names), attn.heads, -1)[:, 1].reshape(-1)
    with torch.no_grad():
        attn.qkv.weight[rows] = 0
        if attn.qkv.bias is not None:
            attn.qkv.bias[rows] = 0
    torch.testing.assert_close(edited, bare(x), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(edited, model(x))


def test_ablating_an_atom_equals_running_the_layers_by_hand() -> None:
    model = _build("crate", torch.float64)
    x = tiny.family_inputs(model).double()
    with model.intervene({"layers.0.code": ablate([3, 5])}):
        edited = model(x)
    z = model.layers[0](model.embed(x))
    z[..., [3, 5]] = 0
    by_hand = model.forward_head(model.layers[1](z))
    torch.testing.assert_close(edited, by_hand, rtol=1e-12, atol=1e-12)
    # scale by 0 is ablate; scale by 1 is nothing; multiply per sample: sample 0 ablates atom 3, sample 1 nothing
    with model.intervene({"layers.0.code": scale([3, 5], 0.0)}):
        torch.testing.assert_close(model(x), by_hand, rtol=1e-12, atol=1e-12)
    with model.intervene({"layers.0.code": scale([3], 1.0)}):
        torch.testing.assert_close(model(x), model.forward_head(model.layers[1](model.layers[0](model.embed(x)))))
    mask = torch.ones(2, 1, model.config.dim, dtype=torch.float64)
    mask[0, 0, 3] = 0
    with model.intervene({"layers.0.code": multiply(mask)}):
        per_sample = model(x)
    with model.intervene({"layers.0.code": ablate(3)}):
        torch.testing.assert_close(per_sample[0], model(x)[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(per_sample[1], model(x)[1], rtol=1e-12, atol=1e-12)


def test_patching_the_last_z_half_gives_the_other_inputs_output() -> None:
    """CRATE's last layer replaces its tokens by ISTA of LN(Z^{L+1/2}): with Z^{L+1/2} patched from input B,
    input A's logits are B's (activation patching, eq. (44))."""
    model = _build("crate", torch.float64)
    a, b = tiny.family_inputs(model).double(), tiny.family_inputs(model).double()
    out_b, cache_b = model.run_with_cache(b, names="layers.1.z_half")
    with model.intervene({"layers.1.z_half": patch(cache_b)}):
        torch.testing.assert_close(model(a), out_b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"the patch for layers.1.z_half has shape \(2, 17, 32\), the value \(1,"):
        with model.intervene({"layers.1.z_half": patch(cache_b)}):
            model(a[:1])


def test_set_pattern_and_steer_are_the_equations_with_that_term() -> None:
    """The pattern set to the identity: each token's head output is its own ``U_kᵀ z``, so Z^{1/2} = Z +
    W U^T LN(Z) (eq. (37) with softmax → I); steering adds the direction to every token's Z^{1/2}."""
    model = _build("crate", torch.float64)
    x = tiny.family_inputs(model).double()
    n = model.embed(x).shape[1]
    layer = model.layers[0]
    with model.intervene({"layers.0.attn.pattern": set_value(torch.eye(n, dtype=torch.float64))}):
        _, cache = model.run_with_cache(x, names=["layers.0.z_in", "layers.0.z_half"])
    z = cache["layers.0.z_in"]
    torch.testing.assert_close(cache["layers.0.z_half"], z + layer.attn.proj(layer.attn.qkv(layer.norm1(z))))
    direction = torch.randn(model.config.dim, dtype=torch.float64)
    _, plain = model.run_with_cache(x, names="layers.1.z_half")
    with model.intervene({"layers.1.z_half": steer(direction, 2.0, positions=[0])}):
        _, steered = model.run_with_cache(x, names="layers.1.z_half")
    expect = plain["layers.1.z_half"].clone()
    expect[:, 0] += 2.0 * direction
    torch.testing.assert_close(steered["layers.1.z_half"], expect, rtol=1e-12, atol=1e-12)


def test_two_argument_edits_are_told_the_hook() -> None:
    model = _build("crate")
    seen = []
    with model.intervene({"layers.1.code": lambda value, hook: seen.append((hook.name, hook.layer))}):
        model(tiny.family_inputs(model))
    assert seen == [("layers.1.code", 1)]


# ----------------------------------------------------------------------------------------------- where they hold
def test_interventions_hold_inside_evaluating_and_frozen_weights() -> None:
    model = _build("crate")
    x = tiny.family_inputs(model)
    with model.intervene({"layers.0.code": ablate([0, 1, 2])}):
        outside = model(x)
        with ct.layers.evaluating(model), torch.no_grad():
            inside = model(x)
    torch.testing.assert_close(inside, outside)
    assert not torch.allclose(inside, model(x))


def test_interventions_hold_under_autocast_and_refuse_another_dtype() -> None:
    model = _build("crate")
    x = tiny.family_inputs(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, cache = model.run_with_cache(x, names="layers.1.z_half")
        with model.intervene({"layers.0.code": ablate([0, 1]), "layers.1.z_half": patch(cache)}):
            _, edited = model.run_with_cache(x, names=["layers.0.code", "layers.1.z_half"])
        assert edited["layers.0.code"].dtype == torch.bfloat16 and not edited["layers.0.code"][..., :2].any()
        torch.testing.assert_close(edited["layers.1.z_half"], cache["layers.1.z_half"], rtol=0, atol=0)
        with pytest.raises(ValueError) as e:
            with model.intervene({"layers.0.code": lambda v: v.float()}):
                model(x)
    line = str(e.value)
    assert "\n" not in line and "layers.0.code returned (2, 17, 32) torch.float32" in line
    assert "the value there is (2, 17, 32) torch.bfloat16" in line


def test_generation_is_edited_at_every_token_with_and_without_the_cache() -> None:
    model = _build("crate_gpt")
    prompt = torch.randint(0, model.config.vocab_size, (2, 3))

    def favour_7(logits):
        return logits.index_fill(-1, torch.tensor([7]), 1e4)

    with model.intervene({"head": favour_7}):
        tokens = model.generate(prompt, 4, temperature=0)
    assert (tokens[:, 3:] == 7).all()
    edits = {"layers.0.code": ablate(list(range(8))), "layers.1.attn.pattern": scale([0], 0.5, axis=1)}
    with model.intervene(edits):
        cached, logits = model.generate(prompt, 4, temperature=0, return_logits=True)
        uncached, logits_u = model.generate(prompt, 4, temperature=0, return_logits=True, use_cache=False)
    torch.testing.assert_close(logits, logits_u)
    assert torch.equal(cached, uncached)
    plain = model.generate(prompt, 4, temperature=0, return_logits=True)[1]
    assert not torch.allclose(plain, logits)
    assert _hooks_left(model) == 0


def test_compiled_generation_sees_interventions_attached_after_compiling() -> None:
    """Dynamo does not guard on module hooks: the layers' hook key makes the compiled step trace again when an
    intervention is attached, and reuse the plain graph after it."""
    torch.manual_seed(0)
    model = ct.create_model("crate_gpt_mini", dim=32, depth=2, heads=2, vocab_size=64, block_size=64).eval()
    prompt = torch.randint(0, 64, (1, 4))
    plain = model.generate(prompt, 5, temperature=0, return_logits=True, compile=True)[1]
    edits = {"layers.1.code": ablate(list(range(16))), "layers.0.attn.pattern": scale([1], 0.0, axis=1)}
    with model.intervene(edits):
        eager = model.generate(prompt, 5, temperature=0, return_logits=True)[1]
        compiled = model.generate(prompt, 5, temperature=0, return_logits=True, compile=True)[1]
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(compiled, plain, rtol=1e-3, atol=1e-3)
    again = model.generate(prompt, 5, temperature=0, return_logits=True, compile=True)[1]
    torch.testing.assert_close(again, plain, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------------------- nothing left
def test_an_exception_inside_leaves_the_model_as_it_was() -> None:
    model = _build("crate_gpt")
    x = tiny.family_inputs(model)
    before, state = model(x), copy.deepcopy(model.state_dict())
    with pytest.raises(RuntimeError, match="inside"):
        with model.intervene({"layers.0.code": ablate(0), "head": scale(0, 2.0), "layers.1.attn.pattern": ablate(0)}):
            raise RuntimeError("inside")
    with pytest.raises(ValueError):  # an edit failing during the forward
        with model.intervene({"layers.0.z_half": lambda v: v[:, :1]}):
            model(x)
    with pytest.raises(ValueError):  # a bad name after good ones: nothing attached
        with model.intervene({"layers.0.code": ablate(0), "layers.9.code": ablate(0)}):
            pass
    assert _hooks_left(model) == 0 and _hook_state.key == 0 and "_head_hooks" not in model.__dict__
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


# ----------------------------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_naming_the_fix() -> None:
    model = _build("crate")
    x = tiny.family_inputs(model)
    with pytest.raises(ValueError) as e:
        with model.intervene({"layers.1.z_halff": ablate(0)}):
            pass
    assert "\n" not in str(e.value) and "no hook point 'layers.1.z_halff'" in str(e.value)
    assert "nearest: layers.1.z_half" in str(e.value)
    with pytest.raises(ValueError, match="nearest: layers.0.code"):
        model.run_with_cache(x, names=["layers.0.cod"])
    with pytest.raises(ValueError) as e:
        with model.intervene({"layers.0.z_half": lambda v: v[:, 1:]}):
            model(x)
    assert str(e.value) == (
        "the edit of layers.0.z_half returned (2, 16, 32) torch.float32, but the value there is (2, 17, 32) "
        "torch.float32; return a tensor of the value's shape and dtype"
    )
    with pytest.raises(ValueError, match="is a int, not a function"):
        with model.intervene({"layers.0.code": 0}):
            pass
    with pytest.raises(ValueError, match=r"index \[40\] is outside axis 2 of size 32; pass 0..31"):
        with model.intervene({"layers.0.code": ablate(40)}):
            model(x)
    tost = _build("tost")
    with pytest.raises(ValueError, match="layers.0.attn.pattern can be read .run_with_cache., not replaced: TSSA"):
        with tost.intervene({"layers.0.attn.pattern": ablate(0)}):
            pass
