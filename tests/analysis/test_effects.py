"""The causal effect of every atom (analysis/effects.py): the batched ablations against one forward per atom in
float64 (the atom zeroed by a plain PyTorch forward hook on the code's module, not through the hooks API), group
ablations, the bootstrap interval against its normal-theory width, Spearman on constructed ranks, and
``crate features --effects`` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from clitools import crate, one_line_error

import crate_transformer as ct
from crate_transformer.analysis import effects as E

IMG = dict(image_size=8, patch_size=2, in_chans=1, num_classes=5, dim=12, depth=2, heads=2)


def _model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if arch == "crate_gpt_mini":
        return ct.create_model(arch, vocab_size=17, block_size=6, dim=12, depth=2, heads=2).double().eval()
    extra = {"mlp_ratio": 1} if arch == "vit_mnist" else {}
    return ct.create_model(arch, **IMG, **extra).double().eval()


def _data(arch: str, n: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    if arch == "crate_gpt_mini":
        blocks = torch.randint(0, 17, (n, 7), generator=g)
        return blocks[:, :-1], blocks[:, 1:]
    return torch.randn(n, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 5, (n,), generator=g)


def _loop(model, x, y, layer, zero):
    """One forward per ablation: the units ``zero`` of layer ``layer`` set to 0 by a raw forward hook on the
    module that outputs the code (model.code_sites()); per example the mean cross-entropy and the argmax."""
    module, kind = model.code_sites()[layer]
    assert kind in ("ista", "mlp")
    handle = None
    if zero is not None:

        def hook(m, inp, out):
            out = out.clone()
            out[..., zero] = 0
            return out

        handle = module.register_forward_hook(hook)
    try:
        with torch.no_grad():
            logits = model(x)
    finally:
        if handle is not None:
            handle.remove()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    return loss.view(len(y), -1).mean(1), logits.argmax(-1).view(len(y), -1)


@pytest.mark.parametrize("arch", ["crate_tiny", "vit_mnist", "crate_gpt_mini"])
def test_batched_effects_equal_one_forward_per_atom(arch):
    model = _model(arch)
    x, y = _data(arch)
    m = 12
    # batches of 3 (the last of 1) and at most 8 replicas: chunks of 2 atoms (the last shorter) and of 8
    eff = E.atom_effects(model, x, y, layer=1, batch_size=3, max_batch=8)
    assert eff.hook in ("layers.1.code", "layers.1.mlp.hidden")
    assert eff.delta_loss.shape == (m, len(x)) and eff.flip.shape == (m, len(x))
    base_loss, base_pred = _loop(model, x, y, 1, None)
    np.testing.assert_allclose(eff.base_loss, base_loss.numpy(), rtol=1e-12, atol=1e-12)
    for u in range(m):
        loss, pred = _loop(model, x, y, 1, [u])
        np.testing.assert_allclose(eff.delta_loss[u], (loss - base_loss).numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(eff.flip[u], (pred != base_pred).double().mean(1).numpy())
    assert np.abs(eff.delta_loss).max() > 1e-6  # the ablations do change the output
    # the result does not depend on the batching
    again = E.atom_effects(model, x, y, layer=1, units=[5, 0], batch_size=64, max_batch=1024)
    np.testing.assert_allclose(again.delta_loss, eff.delta_loss[[5, 0]], rtol=1e-10, atol=1e-12)


def test_group_ablation_equals_the_loop():
    model = _model("crate_tiny")
    x, y = _data("crate_tiny", 5)
    groups = [[0, 3, 7], list(range(12)), [4]]
    eff = E.group_effects(model, x, y, layer=0, groups=groups, batch_size=2, max_batch=4)
    base, pred0 = _loop(model, x, y, 0, None)
    for r, group in enumerate(groups):
        loss, pred = _loop(model, x, y, 0, group)
        np.testing.assert_allclose(eff.delta_loss[r], (loss - base).numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(eff.flip[r], (pred != pred0).double().mean(1).numpy())
    single = E.atom_effects(model, x, y, layer=0, units=[4])
    np.testing.assert_allclose(single.delta_loss[0], eff.delta_loss[2], rtol=1e-12, atol=1e-12)


def test_bootstrap_interval():
    rng = np.random.default_rng(0)
    values = rng.normal(1.0, 2.0, size=(3, 400))
    values[2] = 0.25  # a constant row: a zero-width interval at its value
    mean, lo, hi = E.bootstrap(values, n_boot=2000, seed=3)
    np.testing.assert_allclose(mean, values.mean(1))
    assert (lo <= mean).all() and (mean <= hi).all()
    assert lo[2] == pytest.approx(0.25) and hi[2] == pytest.approx(0.25)
    normal = 2 * 1.96 * values[:2].std(1, ddof=1) / np.sqrt(400)  # the normal-theory 95% width
    np.testing.assert_allclose(hi[:2] - lo[:2], normal, rtol=0.12)
    again = E.bootstrap(values, n_boot=2000, seed=3)
    np.testing.assert_array_equal(again[1], lo)  # seeded


def test_spearman():
    a = np.array([0.1, 0.5, 0.3, np.nan, 0.9])
    assert E.spearman(a, np.array([1.0, 3.0, 2.0, 100.0, 4.0])) == pytest.approx(1.0)  # the NaN pair is dropped
    assert E.spearman(a, -np.array([1.0, 3.0, 2.0, 0.0, 4.0])) == pytest.approx(-1.0)
    # ranks 1,2,3,4 against 2,1,4,3: 1 - 6·Σd²/(n(n²-1)) = 1 - 6·4/60
    assert E.spearman(np.arange(4.0), np.array([2.0, 1.0, 4.0, 3.0])) == pytest.approx(0.6)
    assert np.isnan(E.spearman(np.ones(5), np.arange(5.0)))


def test_a_layer_without_units_is_one_line():
    model = _model("crate_tiny")
    with pytest.raises(ValueError, match="outside 0..1"):
        E.code_hook(model, 2)


def _tiny_image_run(tmp_path):
    run = tmp_path / "run"
    args = ["--data", "digits", "--image-size", "8", "--threads", "1", "--no-progress", "--epochs", "1"]
    args += ["--max-steps", "2", "--measure-every", "0", "--eval-every", "0"]
    args += ["--model-args", "dim=16", "depth=2", "heads=2", "patch_size=4"]
    assert crate("train", *args, "--out", run) == 0
    return run


def test_cli_features_effects(tmp_path, capsys):
    run = _tiny_image_run(tmp_path)
    capsys.readouterr()
    assert crate("features", run, "--top-k", 4, "--num-images", 30, "--effects", "--threads", 1) == 0
    out = capsys.readouterr().out
    assert "flip" in out and "purity~flip" in out
    report = json.loads((run / "features" / "features.json").read_text())
    assert report["effects"]["n_examples"] == 30
    layer = report["layers"][1]
    unit = layer["units"][3]
    assert unit["effect_flip_lo"] <= unit["effect_flip"] <= unit["effect_flip_hi"]
    assert 0 <= unit["effect_flip"] <= 1
    assert layer["summary"]["effect_flip"] == pytest.approx(np.mean([u["effect_flip"] for u in layer["units"]]))
    # the numbers are those of atom_effects on the same images
    from crate_transformer.loading.pipeline import load_model

    model = load_model(str(run)).eval()
    assert layer["summary"]["effect_base_loss"] > 0 and model is not None
    page = (run / "features" / "features.html").read_text()
    assert 'id="effect-scatter"' in page and '"effect_flip":' in page
    # without --effects nothing of the effects is written
    assert crate("features", run, "--top-k", 4, "--num-images", 10, "--out", tmp_path / "plain") == 0
    assert "effects" not in json.loads((tmp_path / "plain" / "features.json").read_text())
    err = one_line_error(capsys, "features", run, "--effects-samples", 0, "--effects")
    assert "effects_samples" in err or "effects-samples" in err
