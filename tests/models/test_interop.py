"""nnsight and TransformerLens on the package's models, unmodified (``models/interop.py``, ``docs/hooks.md``).

nnsight addresses modules; the package's hook points are modules (``layers.{i}.z_half`` is the HookPoint
``model.layers[i].z_half``), so an nnsight edit of Z^{ℓ+1/2} is ``model.intervene``'s, to the bit.  TransformerLens
runs the GPT baseline through ``transformers``' GPT-2 (:func:`~crate_transformer.models.interop.to_transformer_lens`):
the same logits and, under the mapped names, the same cached values.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import tiny
import torch

import crate_transformer as ct
from crate_transformer.models.hooks import patch, steer
from crate_transformer.models.interop import TRANSFORMER_LENS_NAMES, to_transformer_lens, transformer_lens_name

# nnsight mounts .save() on every Python object unless told not to (its PYMOUNT setting); process-wide, that shadows
# other libraries' save (onnxscript's ir.save in the export tests): the tests call nnsight.save(value) instead
os.environ.setdefault("NNSIGHT_CONFIG", str(Path(__file__).resolve().parents[1] / "nnsight.yaml"))
nnsight = pytest.importorskip("nnsight", reason="the optional 'interp' extra installs nnsight")

FAMILIES = [f for f in tiny.family_builders() if f != "dino"]


def _build(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny.family_builders()[family]().double().eval()


def _input(model: torch.nn.Module) -> torch.Tensor:
    x = tiny.family_inputs(model)
    return x.double() if x.is_floating_point() else x


@pytest.mark.parametrize("family", FAMILIES)
def test_nnsight_patching_z_half_equals_intervene_exactly(family: str) -> None:
    """Tolerance 0: both replace the HookPoint's output by the same tensor.  Each forward is seeded (CRATE-MAE's
    draws its mask)."""
    model = _build(family)
    a, b = _input(model), _input(model)

    def seeded(run):
        torch.manual_seed(3)
        out = run()
        return out.pred if isinstance(model, ct.CRATEMAE) else out

    torch.manual_seed(3)
    _, cache = model.run_with_cache(b, names="layers.1.z_half")
    with model.intervene({"layers.1.z_half": patch(cache)}):
        ours = seeded(lambda: model(a))
    traced = nnsight.NNsight(model)
    torch.manual_seed(3)
    with traced.trace(b):
        half_b = nnsight.save(traced.layers[1].z_half.output)
    torch.manual_seed(3)
    with traced.trace(a):
        traced.layers[1].z_half.output[:] = half_b
        theirs = nnsight.save(traced.output)
    theirs = theirs.pred if isinstance(model, ct.CRATEMAE) else theirs
    torch.testing.assert_close(half_b, cache["layers.1.z_half"], rtol=0, atol=0)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=0)
    assert not torch.allclose(ours, seeded(lambda: model(a)))


def test_nnsight_steering_in_place_equals_steer() -> None:
    model = _build("crate_gpt")
    ids = _input(model)
    direction = torch.randn(model.config.dim, dtype=torch.float64)
    with model.intervene({"layers.0.z_half": steer(direction, 3.0)}):
        ours = model(ids)
    traced = nnsight.NNsight(model)
    with traced.trace(ids):
        traced.layers[0].z_half.output[:] += 3.0 * direction
        theirs = nnsight.save(traced.output)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------- TransformerLens
@pytest.fixture(scope="module")
def lens() -> tuple:
    pytest.importorskip("transformer_lens", reason="the optional 'interp' extra installs transformer-lens")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the bridge wraps the converted model
    torch.manual_seed(0)
    model = ct.create_model("gpt_mini", dim=32, depth=2, heads=4, block_size=16, vocab_size=50).eval()
    return model, to_transformer_lens(model)


def test_transformer_lens_runs_the_gpt_baseline_with_its_logits_and_values(lens: tuple) -> None:
    model, bridge = lens
    ids = torch.randint(0, 50, (2, 10))
    logits, theirs = bridge.run_with_cache(ids)
    out, ours = model.run_with_cache(ids)
    torch.testing.assert_close(logits, out, rtol=1e-5, atol=1e-5)
    mapped = [n for n in model.hook_names() if n != "head"]
    assert len(mapped) == 1 + model.config.depth * 9
    for name in mapped:
        value = theirs[transformer_lens_name(name)]
        if name.split(".")[-1] in ("q", "k", "v"):
            value = value.transpose(1, 2)  # TransformerLens: (b, n, K, p); the package: (b, K, n, p)
        torch.testing.assert_close(ours[name], value, rtol=1e-5, atol=1e-5, msg=name)


def test_transformer_lens_edits_equal_intervene_and_resid_mid_reaches_ln2_only(lens: tuple) -> None:
    """An edit of ``hook_resid_pre`` / ``hook_attn_out`` / ``mlp.hook_post`` is ``intervene``'s on the mapped name.
    TransformerLens 4.3's bridge takes ``hook_resid_mid`` at LN2's input: an edit there reaches the MLP but not the
    residual stream (what this asserts, so a change of TransformerLens shows here), whereas ``layers.{i}.z_half``
    edits Z^{ℓ+1/2} itself, both uses (docs/hooks.md)."""
    model, bridge = lens
    ids = torch.randint(0, 50, (2, 10))
    direction = torch.randn(32)
    for name in ("layers.1.z_in", "layers.1.attn.out", "layers.0.mlp.hidden"):
        add = direction if not name.endswith("hidden") else torch.randn(128)
        hooks = [(transformer_lens_name(name), lambda value, hook, add=add: value + 2.0 * add)]
        theirs = bridge.run_with_hooks(ids, fwd_hooks=hooks)
        with model.intervene({name: steer(add, 2.0)}):
            torch.testing.assert_close(theirs, model(ids), rtol=1e-5, atol=1e-5, msg=name)
    theirs = bridge.run_with_hooks(
        ids, fwd_hooks=[("blocks.1.hook_resid_mid", lambda value, hook: value + 2.0 * direction)]
    )
    handle = model.layers[1].norm2.register_forward_pre_hook(lambda m, args: (args[0] + 2.0 * direction,))
    try:
        ln2_only = model(ids)
    finally:
        handle.remove()
    torch.testing.assert_close(theirs, ln2_only, rtol=1e-5, atol=1e-5)
    with model.intervene({"layers.1.z_half": steer(direction, 2.0)}):
        assert not torch.allclose(theirs, model(ids), rtol=1e-3, atol=1e-3)


def test_the_route_refuses_a_model_with_no_gpt2_counterpart() -> None:
    with pytest.raises(
        ValueError, match="TransformerLens' GPT-2 takes the GPT baseline .* not this CRATELanguageModel"
    ):
        to_transformer_lens(_build("crate_gpt"))
    with pytest.raises(ValueError, match="layers.0.code has no TransformerLens name"):
        transformer_lens_name("layers.0.code")
    assert transformer_lens_name("layers.3.z_half") == "blocks.3.hook_resid_mid"
    assert set(TRANSFORMER_LENS_NAMES) >= {"layers.{i}.z_in", "layers.{i}.mlp.hidden"}
