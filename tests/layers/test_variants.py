"""The CRATE variants of the ablations: hybrids (JMLR Table 17), MSSA/ISTA forms (Tables 12, 13, 15), CRATE-α."""

import json

import pytest
import torch
import torch.nn.functional as F

import crate_transformer as ct
from crate_transformer.cli import main
from crate_transformer.layers import ISTA, MHSA, MLP, MSSA, EncoderLayer, OvercompleteISTA, odl_reference, trace_layer

SMALL = dict(image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=32, depth=2, heads=4)


# --------------------------------------------------------------------------- parameter counts, by formula
def _embed_and_head(d: int, C: int, P: int, c: int, N: int, vit: bool = False) -> int:
    pd = c * P * P
    embed = pd * d + d if vit else 2 * pd + (pd * d + d) + 2 * d  # [LN] → Linear → [LN]
    return embed + d + (N + 1) * d + 2 * d + d * C + C  # + cls token, pos embedding, head LN + Linear


def _layer_params(variant: str, d: int, h: int = 0, m: int = 0) -> int:
    ln = 2 * d
    mssa = d * d + (d * d + d)  # U (no bias) + W (with bias)
    mhsa = (3 * d * d + 3 * d) + (d * d + d)  # separate Q, K, V with bias + output projection
    ista = d * d  # D
    mlp = (d * h + h) + (h * d + d)
    return {
        "crate": ln + mssa + ln + ista,  # 3d² + 5d (JMLR Table 10 sizes)
        "tied": ln + d * d + ln + ista,  # no W
        "mlp": ln + mssa + ln + mlp,
        "mhsa": ln + mhsa + ln + ista,
        "vit": ln + mhsa + ln + mlp,
        "odl": ln + 2 * d * d + ln + 2 * d * m,  # W without bias; D and D1 are d × m
    }[variant]


@pytest.mark.parametrize(
    "variant, overrides",
    [
        ("crate", {}),
        ("tied", {"tied_output": True}),
        ("mlp", {"mlp": "mlp"}),
        ("mhsa", {"attention": "mhsa"}),
        ("vit", {"arch": "vit"}),
        ("odl", {"mlp": "odl"}),
        ("odl", {"mlp": "odl", "odl_ratio": 2}),
        ("mlp", {"mlp": "mlp", "mlp_ratio": 2.0}),
    ],
)
def test_parameter_counts_match_the_formulas(variant, overrides):
    d, L, C, P, c = 48, 3, 10, 7, 1
    h, m = int(d * overrides.get("mlp_ratio", 4.0)), d * overrides.get("odl_ratio", 4)
    cfg = dict(SMALL, dim=d, depth=L, heads=4, **overrides)
    model = ct.create_model("crate_mnist", **cfg)
    expected = L * _layer_params(variant, d, h, m) + _embed_and_head(d, C, P, c, (28 // P) ** 2, vit=variant == "vit")
    assert model.num_params() == expected


def test_registered_variants_and_their_counts():
    d, L = 128, 6
    extra = _embed_and_head(d, 10, 7, 1, 16)
    assert ct.create_model("crate_mnist").num_params() == L * (3 * d * d + 5 * d) + extra == 309_356
    # the default digits model: 24 px, 4x4 patches (P = 4, a 6x6 grid of 36), d = 128, 3 layers
    p4 = ct.create_model("crate_mnist_p4")
    assert p4.config.grid == 6 and p4.num_params() == 3 * (3 * d * d + 5 * d) + _embed_and_head(d, 10, 4, 1, 36)
    assert p4.num_params() == 158_250
    assert ct.create_model("crate_mlp_mnist").num_params() == L * _layer_params("mlp", d, 4 * d) + extra
    assert ct.create_model("crate_mhsa_mnist").num_params() == L * _layer_params("mhsa", d) + extra
    assert ct.create_model("crate_alpha_mnist").num_params() == L * _layer_params("odl", d, m=4 * d) + extra
    assert {"crate_mlp_mnist", "crate_mhsa_mnist", "crate_alpha_mnist"} <= set(ct.list_models("crate_*"))


def test_defaults_keep_the_crate_and_vit_key_layouts():
    crate = ct.create_model("crate_mnist", **SMALL)
    assert sorted(k for k in crate.state_dict() if k.startswith("layers.0.")) == [
        "layers.0.attn.proj.bias", "layers.0.attn.proj.weight", "layers.0.attn.qkv.weight", "layers.0.ista.weight",
        "layers.0.norm1.bias", "layers.0.norm1.weight", "layers.0.norm2.bias", "layers.0.norm2.weight",
    ]  # fmt: skip
    vit = ct.create_model("vit_mnist", **{**SMALL, "heads": 2})
    assert sorted(k for k in vit.state_dict() if k.startswith("layers.0.")) == [
        "layers.0.attn.proj.bias", "layers.0.attn.proj.weight", "layers.0.attn.qkv.bias", "layers.0.attn.qkv.weight",
        "layers.0.mlp.0.bias", "layers.0.mlp.0.weight", "layers.0.mlp.3.bias", "layers.0.mlp.3.weight",
        "layers.0.norm1.bias", "layers.0.norm1.weight", "layers.0.norm2.bias", "layers.0.norm2.weight",
    ]  # fmt: skip
    assert all(isinstance(layer.attn, MHSA) and isinstance(layer.block, MLP) for layer in vit.layers)


# --------------------------------------------------------------------------- the hybrids are what they say
def test_crate_mhsa_is_standard_attention_then_ista():
    torch.manual_seed(0)
    model = ct.create_model("crate_mnist", **SMALL, attention="mhsa").eval()
    layer = model.layers[0]
    assert isinstance(layer.attn, MHSA) and isinstance(layer.ista, ISTA) and not hasattr(layer, "mlp")
    d, K = 32, 4
    x = torch.randn(2, 5, d)
    h = layer.norm1(x)
    q, k, v = (F.linear(h, w, b) for w, b in zip(layer.attn.qkv.weight.split(d), layer.attn.qkv.bias.split(d)))
    assert not torch.allclose(q, k) and not torch.allclose(k, v)  # separate Q, K, V
    heads = lambda t: t.view(2, 5, K, d // K).transpose(1, 2)  # noqa: E731
    a = torch.softmax(heads(q) @ heads(k).transpose(-1, -2) / (d // K) ** 0.5, dim=-1)
    attn_out = layer.attn.proj((a @ heads(v)).transpose(1, 2).reshape(2, 5, d))
    half = x + attn_out
    D = layer.ista.weight
    z = layer.norm2(half)
    expected = F.relu(z + 0.1 * (z - z @ D.T) @ D - 0.1 * 0.1)  # eq. (44), row form: ReLU(Z + ηDᵀ(Z − DZ) − ηλ)
    out, half_got, _ = trace_layer(layer, x)
    torch.testing.assert_close(half_got, half, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_crate_mlp_is_mssa_then_residual_gelu_mlp():
    torch.manual_seed(0)
    layer = ct.create_model("crate_mnist", **SMALL, mlp="mlp").layers[0].eval()
    assert isinstance(layer.attn, MSSA) and isinstance(layer.mlp, MLP) and not hasattr(layer, "ista")
    x = torch.randn(2, 5, 32)
    half = x + layer.attn(layer.norm1(x))
    fc1, fc2 = layer.mlp[0], layer.mlp[3]
    assert fc1.out_features == 128
    expected = half + fc2(F.gelu(fc1(layer.norm2(half))))
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_odl_block_matches_the_crate_alpha_equations():
    torch.manual_seed(0)
    d, n, eta, lam = 16, 7, 0.1, 0.1
    odl = OvercompleteISTA(d, ratio=4, eta=eta, lambd=lam)
    assert odl.D.shape == odl.D1.shape == (d, 4 * d)
    X = torch.randn(d, n)  # column tokens
    D, D1 = odl.D.detach(), odl.D1.detach()
    z1 = torch.clamp(eta * D.T @ X - eta * lam, min=0)  # z1 = ReLU(η Dᵀx − ηλ)
    z2 = torch.clamp(z1 - eta * D.T @ (D @ z1 - X) - eta * lam, min=0)  # z2 = ReLU(z1 − η Dᵀ(D z1 − x) − ηλ)
    expected = D1 @ z2  # x̂ = D1 z2
    torch.testing.assert_close(odl(X.T).T.detach(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(odl_reference(X, D, D1, eta, lam), expected)
    assert (odl.code(X.T) == 0).float().mean() > 0  # a non-negative sparse code


@pytest.mark.parametrize("tied", [False, True])
def test_odl_fast_path_and_its_gradients_are_the_reference_in_float64(tied):
    """The fused products (scales and shifts inside ``addmm``) against :func:`odl_reference`, batched row tokens."""
    d = 12
    odl = OvercompleteISTA(d, ratio=3, eta=0.3, lambd=0.05, tied=tied).double()
    x = torch.randn(2, 5, d, dtype=torch.float64, requires_grad=True)
    D1 = odl.D if tied else odl.D1
    want = odl_reference(x.reshape(-1, d).T, odl.D, D1, 0.3, 0.05).T.reshape(x.shape)
    got = odl(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(got)
    params = (x, odl.D) if tied else (x, odl.D, odl.D1)
    for a, b in zip(torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_crate_alpha_layer_residual_eps_and_bias_free_output():
    torch.manual_seed(0)
    layer = EncoderLayer(32, 4, 8, mlp="odl")
    assert layer.norm1.eps == layer.norm2.eps == 1e-6 and layer.attn.proj.bias is None
    x = torch.randn(2, 5, 32)
    half = x + layer.attn(layer.norm1(x))
    torch.testing.assert_close(layer(x), half + layer.mlp(layer.norm2(half)))


def test_crate_tssa_is_tost_attention_then_ista():
    """ToST's TSSA as CRATE's compression step: one class plus one entry of ``layers.ATTENTIONS``."""
    from crate_transformer.layers import ATTENTIONS, TSSA

    assert ATTENTIONS["tssa"] is TSSA
    torch.manual_seed(0)
    layer = EncoderLayer(32, 4, 8, attention="tssa").eval()
    assert isinstance(layer.attn, TSSA) and isinstance(layer.block, ISTA)
    x = torch.randn(2, 5, 32)
    half = x + layer.attn(layer.norm1(x))
    torch.testing.assert_close(layer(x), layer.ista(layer.norm2(half)))
    with pytest.raises(ValueError, match="non-causal layers only"):
        EncoderLayer(32, 4, 8, attention="tssa", causal=True)
    with pytest.raises(ValueError, match="tied_output applies to MSSA only, but attention='tssa'"):
        ct.model_config("crate_mnist", attention="tssa", tied_output=True)


def test_variants_train_a_step_and_trace():
    for overrides in (
        {"mlp": "mlp"},
        {"attention": "mhsa"},
        {"mlp": "odl"},
        {"attention": "mhsa", "mlp": "mlp"},
        {"attention": "tssa"},
    ):
        model = ct.create_model("crate_mnist", **SMALL, **overrides)
        x = torch.randn(2, 1, 28, 28)
        model(x).sum().backward()
        assert all(p.grad is not None for p in model.parameters())
        tr = model.forward_trace(x, return_attention=True)
        assert len(tr.tokens) == 3 and tr.attention[0].shape == (2, 4, 17, 17)


def test_measure_on_the_hybrids():
    from crate_transformer.analysis import measure

    x = torch.randn(4, 1, 28, 28)
    for overrides, ista in (
        ({}, True),
        ({"attention": "mhsa"}, True),
        ({"mlp": "mlp"}, False),
        ({"mlp": "odl"}, False),
    ):
        t = measure(ct.create_model("crate_mnist", **SMALL, **overrides), x, progress=False)
        assert t.num_layers == 2 and t.meta["ista_output"] is ista
        assert all(torch.isfinite(torch.as_tensor(t.mean(k))).all() for k in ("rc_in", "nonzero"))
        if not ista:
            assert (t.mean("nonzero") == 1.0).all()  # residual outputs: no exact zeros
    assert (
        measure(ct.create_model("crate_mnist", **SMALL, ista_mode="none"), x, progress=False).meta["ista_output"]
        is False
    )


# --------------------------------------------------------------------------- configuration and CLI
@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"attention": "linear"}, "unknown attention 'linear'; choose one of ('mssa', 'mhsa', 'tssa')"),
        ({"mlp": "moe"}, "unknown mlp 'moe'; choose one of ('ista', 'mlp', 'odl', 'ista_overcomplete')"),
        ({"mlp": "mlp", "ista_mode": "soft"}, "ista_mode='soft' applies to the ISTA block only"),
        ({"attention": "mhsa", "tied_output": True}, "tied_output applies to MSSA only"),
        ({"odl_ratio": 0}, "odl_ratio must be a positive integer"),
    ],
)
def test_bad_variant_values_are_one_line_errors(overrides, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as e:
        ct.ModelConfig(**SMALL, **overrides)
    assert "\n" not in str(e.value)


def test_bad_variant_from_the_cli_is_one_line(capsys, tmp_path):
    assert main(["train", "--model-args", "attention=linear", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown attention 'linear'" in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["mlp=mlp"], {"mlp": "mlp"}),
        (["attention=mhsa"], {"attention": "mhsa"}),
        (["mlp=odl", "odl_ratio=2"], {"mlp": "odl", "odl_ratio": 2}),
        (["tied_output=true", "ista_mode=soft"], {"tied_output": True, "ista_mode": "soft"}),
        (["ista_mode=none"], {"ista_mode": "none"}),
        (["arch=vit"], {"arch": "vit"}),
    ],
)
def test_model_args_reach_each_variant_through_crate_train_options(args, expected):
    from crate_transformer.cli import build_parser
    from crate_transformer.cli.options import given_options
    from crate_transformer.models.registry import model_config
    from crate_transformer.train import TrainConfig

    ns = build_parser("train").parse_args(["train", "--model-args", *args])
    cfg = TrainConfig.from_dict(given_options(ns))
    built = model_config(cfg.model, **cfg.model_args)  # what the classification task builds
    assert {k: getattr(built, k) for k in expected} == expected


def test_a_variant_trains_end_to_end_from_the_cli(tmp_path):
    from crate_transformer.loading.pipeline import load_model

    out = tmp_path / "run"
    argv = ["train", "--model-args", "dim=32", "depth=1", "heads=4", "mlp=odl", "odl_ratio=2", "--train-subset",
            "64", "--batch-size", "32", "--max-steps", "1", "--epochs", "1", "--measure-every", "0", "--no-progress",
            "--eval-batch-size", "1000", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["mlp"] == "odl" and config["odl_ratio"] == 2
    expected = ct.create_model("crate_mnist", dim=32, depth=1, heads=4, mlp="odl", odl_ratio=2)
    assert load_model(out).state_dict().keys() == expected.state_dict().keys()  # the variant, reloaded
