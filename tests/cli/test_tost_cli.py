"""What every family gets, for ToST, through the unchanged ``crate`` command: ``crate train --model tost_mnist`` and
``crate train-lm --model tost_gpt_mini`` train, ``crate analyze`` measures the variational coding rate per layer and
draws the memberships Π as the attention picture, ``crate features`` reads the MLP units, the runs load back with
``from_pretrained``, and ``crate models`` lists them.  The numbers the reports give are checked against the model
computed here (tiny sizes: the point is the plumbing and the quantities, not the accuracy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from clitools import crate

import crate_transformer as ct
from crate_transformer.analysis.attention import cls_attention
from crate_transformer.analysis.explorer import image_payload
from crate_transformer.analysis.features import collect
from crate_transformer.analysis.measure import measure_batch
from crate_transformer.models.tost import ToST, ToSTLanguageModel

COMMON = ["--threads", 1, "--no-progress", "--epochs", 1, "--eval-every", 0]


def test_crate_models_lists_the_family(capsys):
    assert crate("models", "tost*") == 0
    out = capsys.readouterr().out
    assert "tost_cab_small_12_p16" in out and "tost_mnist" in out and "tost_gpt_base" in out
    assert "tssa+mlp" in out and "110,384,016" in out  # tost_gpt_base, the authors' README: 110M


def test_the_classifier_trains_is_analysed_gives_features_and_loads(tmp_path: Path):
    run = tmp_path / "run"
    args = ["--model", "tost_mnist", "--data", "digits", "--model-args", "dim=32", "depth=2", "--max-steps", 3]
    assert crate("train", *args, *COMMON, "--measure-every", 2, "--out", run) == 0
    model = ct.from_pretrained(run / "model")
    assert type(model) is ToST and model.config.data.name == "digits" and model.config.dim == 32
    x = torch.randn(2, 1, 24, 24)
    torch.testing.assert_close(model(x), ct.load_model(run)(x), rtol=0, atol=0)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("split") == "measure" and "rvar_in" in r for r in records)  # the training hook measures it
    report_dir = tmp_path / "report"
    assert crate("analyze", run, "--num-images", 6, "--num-vis", 2, "--masks", 1, "--no-progress", "--threads", 1,
                 "--out", report_dir) == 0  # fmt: skip
    report = json.loads((report_dir / "report.json").read_text())
    claims = [v["claim"] for v in report["verdicts"]]
    assert any("R^c_var" in c for c in claims) and (report_dir / "figures" / "layerwise_variational.png").is_file()
    assert report["figures"]["attention.png"]["title"].startswith("Attention maps (memberships)")
    assert len(report["attention"]["maps"][0]) == 4  # heads, each a 6x6 map over the patches
    assert crate("features", run, "--top-k", 2, "--num-images", 10, "--threads", 1) == 0
    features = json.loads((run / "features" / "features.json").read_text())
    assert [(layer["layer"], layer["summary"]["kind"]) for layer in features["layers"]] == [(1, "mlp"), (2, "mlp")]


def test_the_language_model_trains_is_analysed_generates_and_gives_features(tmp_path: Path, capsys):
    run = tmp_path / "lm"
    args = ["--model", "tost_gpt_mini", "--model-args", "dim=32", "depth=2", "block_size=32", "--max-steps", 3]
    assert crate("train-lm", *args, *COMMON, "--eval-blocks", 4, "--sample-tokens", 5, "--out", run) == 0
    model = ct.load_model(run)
    assert type(model) is ToSTLanguageModel and model.tokenizer.kind == "byte"
    assert crate("analyze", run, "--num-blocks", 4, "--attn-tokens", 12, "--threads", 1, "--no-progress",
                 "--out", tmp_path / "an") == 0  # fmt: skip
    report = json.loads((tmp_path / "an" / "report.json").read_text())
    assert "rvar_in" in report["measure"]["held-out text"]["layers"][0]
    assert "layerwise_variational.png" in report["figures"] and len(report["verdicts"]) == 3
    capsys.readouterr()
    assert crate("generate", run, "--prompt", "def ", "--max-new-tokens", 8, "--seed", 1) == 0
    assert capsys.readouterr().out.startswith("def ")
    assert crate("features", run, "--top-k", 2, "--threads", 1) == 0
    layers = json.loads((run / "features" / "features.json").read_text())["layers"]
    assert {layer["summary"]["kind"] for layer in layers} == {"mlp"}


@pytest.fixture
def tiny() -> ToST:
    torch.manual_seed(0)
    return ct.create_model("tost_mnist", image_size=16, dim=32, depth=2, heads=4).double().eval()


def test_the_measured_variational_rate_is_the_objective_of_each_layers_own_statistics(tiny):
    x = torch.randn(3, 1, 16, 16, dtype=torch.float64)
    values = measure_batch(tiny, x, eps=0.3)
    trace = tiny.forward_trace(x)
    for ell, layer in enumerate(tiny.layers):
        for name, z in (
            ("rvar_in", trace.tokens[ell]),
            ("rvar_half", trace.half[ell]),
            ("rvar_out", trace.tokens[ell + 1]),
        ):
            h = layer.norm1(z)
            W = (h @ layer.attn.qkv.weight.T + layer.attn.qkv.bias).view(3, 16, 4, 8).transpose(1, 2)
            Pi = layer.attn.memberships(h)
            want = ct.variational_coding_rate(W, None, Pi, eps=0.3)
            torch.testing.assert_close(values[name][:, ell], want, rtol=1e-12, atol=0)
    crate_model = ct.create_model("crate_mnist", image_size=16, patch_size=4, dim=32, depth=2, heads=4)
    assert "rvar_in" not in measure_batch(crate_model.eval(), torch.randn(2, 1, 16, 16))  # MSSA has no memberships


def test_the_attention_picture_is_each_heads_memberships_over_the_patches(tiny):
    x = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    maps = cls_attention(tiny, x, layer=-1)
    z = tiny.forward_trace(x).tokens[-2]  # the last layer's input
    Pi = tiny.layers[-1].attn.memberships(tiny.layers[-1].norm1(z))  # (b, n, K)
    want = (Pi / Pi.sum(1, keepdim=True)).transpose(1, 2).reshape(2, 4, 4, 4)
    torch.testing.assert_close(maps.double(), want, rtol=1e-6, atol=1e-9)
    payload = image_payload(tiny, torch.rand(2, 1, 16, 16, dtype=torch.float64), layers=[-1], n_masks=1)
    assert payload["summary"] == "all patches (mean)" and payload["grid"] == [4, 4]


def test_features_read_every_patch_of_the_layers_without_a_class_token(tiny):
    stats = collect(tiny, [torch.randn(3, 1, 16, 16, dtype=torch.float64)], k=2, layers=[0])
    assert stats[0].n_tokens == 3 * 16  # 16 patches per image, none dropped as a class token
    assert tiny.num_prefix_tokens == 1 and tiny.trace_prefix_tokens == 0
