"""``crate features``: unit statistics against float64 numpy on hand-set weights, the purity score on constructed
activations, dead / always-on fractions, the CLI end to end and its one-line errors."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from clitools import crate, one_line_error

from crate_transformer import LMConfig, ModelConfig
from crate_transformer.analysis import features as F
from crate_transformer.models.classifier import build_model
from crate_transformer.models.lm import build_lm

IMG = dict(image_size=8, patch_size=4, in_chans=1, num_classes=3, dim=16, depth=2, heads=2)


def _hand_set(model: torch.nn.Module) -> None:
    """Fixed, distinct weights from a seeded numpy generator (no torch initialiser involved)."""
    rng = np.random.default_rng(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.normal(0, 0.5, p.shape)))


def _layer_norm(x: np.ndarray, ln: torch.nn.LayerNorm) -> np.ndarray:
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + ln.eps) * ln.weight.detach().numpy() + ln.bias.detach().numpy()


def _numpy_codes(model: torch.nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    """Each layer's units, float64 numpy, from the MSSA outputs ``Z^{ℓ+1/2}`` of a traced pass: CRATE's ISTA step
    in the paper's column form, eq. (44): ``ReLU(Z + η Dᵀ(Z − D Z) − ηλ)``; the ViT MLP's ``GELU(W1 LN(Z) + b1)``."""
    with torch.no_grad():
        trace = model.double().forward_trace(x.double())
    erf = np.vectorize(math.erf)
    codes = []
    for layer, half in zip(model.layers, trace.half):
        h = _layer_norm(half.numpy(), layer.norm2)[:, 1:]  # patch tokens (the class token is not a patch)
        if layer.code_site()[1] == "ista":
            D, eta, lam = layer.ista.weight.detach().numpy(), layer.ista.eta, layer.ista.lambd
            Z = h.reshape(-1, h.shape[-1]).T  # columns are tokens
            codes.append(np.maximum(Z + eta * D.T @ (Z - D @ Z) - eta * lam, 0).T)
        else:
            fc1 = layer.mlp[0]
            pre = h.reshape(-1, h.shape[-1]) @ fc1.weight.detach().numpy().T + fc1.bias.detach().numpy()
            codes.append(0.5 * pre * (1 + erf(pre / math.sqrt(2))))
    model.float()
    return codes


def _numpy_topk(a: np.ndarray, k: int) -> np.ndarray:
    """(m, k) token indices of the k largest positive activations per unit (−1 when fewer), larger first."""
    out = np.full((a.shape[1], k), -1)
    for u in range(a.shape[1]):
        order = [t for t in np.argsort(-a[:, u], kind="stable") if a[t, u] > 0][:k]
        out[u, : len(order)] = order
    return out


@pytest.mark.parametrize("arch", ["crate", "vit"])
def test_statistics_match_numpy(arch):
    model = build_model(ModelConfig(arch=arch, mlp_ratio=2.0, **IMG)).eval()
    _hand_set(model)
    x = torch.from_numpy(np.random.default_rng(1).normal(size=(11, 1, 8, 8))).float()
    expected = _numpy_codes(model, x)
    stats = F.collect(model, x.split(3), k=5)  # batches of 3: the top-k must merge across batches
    assert sorted(stats) == [0, 1]
    for ell, a in enumerate(expected):
        st = stats[ell]
        assert st.kind == ("ista" if arch == "crate" else "mlp") and st.width == a.shape[1] == (
            16 if arch == "crate" else 32
        )
        assert st.n_tokens == 11 * 4 and st.tokens_per_sample == 4
        np.testing.assert_allclose(st.frequency, (a > 0).mean(0), atol=1e-12)
        np.testing.assert_allclose(st.mean, a.mean(0), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(st.max, a.max(0), rtol=1e-4, atol=1e-5)
        idx, val = st.top()
        np.testing.assert_array_equal(idx, _numpy_topk(a, 5))
        rows = np.maximum(idx, 0)
        np.testing.assert_allclose(
            np.where(idx >= 0, val, 0),
            np.where(idx >= 0, a[rows, np.arange(a.shape[1])[:, None]], 0),
            rtol=1e-4,
            atol=1e-5,
        )
    if arch == "crate":  # the sparse code is sparse: some units are off on some tokens
        assert 0 < np.mean([s.frequency.mean() for s in stats.values()]) < 1


def test_top_k_does_not_depend_on_the_batching():
    model = build_model(ModelConfig(arch="crate", **IMG)).eval()
    x = torch.randn(9, 1, 8, 8)
    one, many = F.collect(model, [x], k=4, layers=[1]), F.collect(model, x.split(2), k=4, layers=[1])
    assert list(one) == [1]
    np.testing.assert_array_equal(one[1].top()[0], many[1].top()[0])
    np.testing.assert_allclose(one[1].count, many[1].count)


def test_purity_on_constructed_activations():
    # 10 classes, 20 tokens per class; unit 0 fires only on class-3 tokens, unit 1 once on each class, unit 2
    # on 4 tokens only (fewer than k: not scored), unit 3 never
    labels = np.repeat(np.arange(10), 20)
    codes = torch.zeros(200, 4)
    codes[labels == 3, 0] = torch.linspace(1, 2, 20)
    codes[np.arange(10) * 20, 1] = torch.arange(1, 11).float()
    codes[:4, 2] = 1.0
    st = F.UnitStats("ista", tokens_per_sample=1, k=10)
    st.add(codes)
    idx, _ = st.top()
    s = F.purity(labels[np.maximum(idx, 0)], idx, num_classes=10)
    assert s["purity"][0] == 1.0 and s["entropy"][0] == 0.0 and s["majority"][0] == 3
    assert s["purity"][1] == pytest.approx(0.1) and s["entropy"][1] == pytest.approx(1.0)
    assert np.isnan(s["purity"][2]) and np.isnan(s["purity"][3]) and s["majority"][3] == -1
    assert list(idx[0]) == list(range(79, 59, -1))[:10]  # the largest activations first
    row = F.layer_summary(st, {"class": s}, {"class": F.chance_purity(labels, 10)})
    assert row["class_scored"] == 2 and row["class_purity"] == pytest.approx(0.55)
    assert row["dead"] == 0.25 and row["width"] == 4
    # random draws of 10 of 200 tokens from 10 balanced classes: purity well below a class-pure unit's
    assert 0.15 < row["class_chance"] < 0.4


def test_dead_and_always_on_fractions():
    codes = torch.zeros(100, 5)
    codes[:95, 0] = 1.0  # > 90 %: always on
    codes[:90, 1] = 1.0  # exactly 90 %: not "more than 90 %"
    codes[:3, 2] = 0.5
    codes[:, 3] = -1.0  # negative (a GELU below zero): not active
    st = F.UnitStats("mlp", tokens_per_sample=10, k=2)
    st.add(codes[:40])
    st.add(codes[40:])
    np.testing.assert_allclose(st.frequency, [0.95, 0.9, 0.03, 0.0, 0.0])
    assert F.dead_fraction(st.frequency) == pytest.approx(0.4)
    assert F.always_on_fraction(st.frequency) == pytest.approx(0.2)
    np.testing.assert_allclose(st.mean, [0.95, 0.9, 0.015, -1.0, 0.0])


def test_text_features_overcomplete_codes_and_contexts():
    """crate-lm's overcomplete ISTA: the units are ``OvercompleteISTA.code`` (4d atoms), read through a hook."""
    model = build_lm(
        LMConfig(arch="crate_lm", mlp="ista_overcomplete", dim=16, depth=1, heads=2, block_size=8, vocab_size=20)
    )
    blocks = torch.from_numpy(np.random.default_rng(0).integers(0, 20, size=(6, 9)))
    report, assets = F.text_features(model, blocks, k=3, batch_size=4, context=2)
    layer = report["layers"][0]
    assert layer["summary"]["width"] == 64 and layer["summary"]["kind"] == "ista_overcomplete"
    with torch.no_grad():
        z = model.forward_trace(blocks[:, :-1]).half[0]
        a = model.layers[0].mlp.code(model.layers[0].norm2(z)).reshape(-1, 64).numpy()
    for u in (0, 17, 63):
        rec = layer["units"][u]
        assert rec["frequency"] == pytest.approx((a[:, u] > 0).mean())
        top = [8 * s + p for s, p, _ in rec["top"]]
        assert top == list(_numpy_topk(a, 3)[u][: len(top)])
        assert len(top) == 3  # each of these units is active on more than k tokens
        toks = blocks[:, :-1].reshape(-1)[top].tolist()  # the token purity of its top tokens, counted here
        assert rec["token_purity"] == pytest.approx(max(toks.count(t) for t in toks) / 3)
        s, p, _ = rec["top"][0]
        left, tok, right = assets["contexts"][f"{s}:{p}"]
        assert tok == f"<{blocks[s, p]}>" and left.count("<") == min(p, 2)


def _tiny_image_run(tmp_path):
    run = tmp_path / "run"
    args = ["--data", "digits", "--image-size", "8", "--threads", "1", "--no-progress", "--epochs", "1"]
    args += ["--max-steps", "2", "--measure-every", "0", "--eval-every", "0"]
    args += ["--model-args", "dim=32", "depth=2", "heads=2", "patch_size=4"]
    assert crate("train", *args, "--out", run) == 0
    return run


def test_cli_end_to_end_and_errors(tmp_path, capsys):
    run = _tiny_image_run(tmp_path)
    capsys.readouterr()
    assert crate("features", run, "--top-k", 4, "--num-images", 60, "--threads", 1) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+1\s+ista\s+32\s", out, re.M) and re.search(r"^\s+2\s+ista\s+32\s", out, re.M)
    assert "class purity" in out and "features.html" in out
    report = json.loads((run / "features" / "features.json").read_text())  # RUN/features: new, or -2, -3, ...
    assert [layer["layer"] for layer in report["layers"]] == [1, 2] and report["n_samples"] == 60
    unit = report["layers"][0]["units"][0]
    assert 0 <= unit["frequency"] <= 1 and len(unit["top"]) <= 4
    page = (run / "features" / "features.html").read_text()
    for hook in (
        'id="layer-select"',
        'id="atom-list"',
        'id="atom-stats"',
        'id="atom-examples"',
        "data:image/png;base64",
    ):
        assert hook in page
    assert "http://" not in page and "https://" not in page and "<script src" not in page  # works offline
    # one layer, written elsewhere
    assert crate("features", run, "--layer", -1, "--top-k", 2, "--num-images", 20, "--out", tmp_path / "o") == 0
    assert [layer["layer"] for layer in json.loads((tmp_path / "o" / "features.json").read_text())["layers"]] == [2]
    err = one_line_error(capsys, "features", run, "--layer", 3)
    assert "--layer 3 does not exist" in err and "1..2" in err
    (tmp_path / "empty").mkdir()
    err = one_line_error(capsys, "features", tmp_path / "empty")
    assert "not a run directory" in err and "crate train" in err
    err = one_line_error(capsys, "features", tmp_path / "missing")
    assert "does not exist" in err
    err = one_line_error(capsys, "features", run, "--top-k", 0)
    assert "top_k" in err or "top-k" in err


def test_cli_language_model_run(tmp_path, capsys):
    run = tmp_path / "lm"
    args = ["--model", "crate_gpt_mini", "--model-args", "dim=32", "depth=1", "heads=2", "block_size=32"]
    args += ["--epochs", "1", "--max-steps", "2", "--eval-every", "0", "--eval-blocks", "4", "--sample-tokens", "0"]
    assert crate("train-lm", *args, "--threads", 1, "--no-progress", "--out", run) == 0
    capsys.readouterr()
    assert crate("features", run, "--num-blocks", 5, "--top-k", 3, "--context", 4) == 0
    out = capsys.readouterr().out
    assert "token purity" in out and "next_token purity" in out and "5 blocks of 32" in out
    report = json.loads((run / "features" / "features.json").read_text())
    assert report["n_tokens"] == 5 * 32 and report["label_kinds"] == ["token", "next_token"]
    page = (run / "features" / "features.html").read_text()
    assert '"contexts":' in page and 'id="atom-examples"' in page
    err = one_line_error(capsys, "features", run, "--layer", -2)
    assert "the model has 1 layers" in err
