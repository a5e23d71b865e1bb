"""Fast paths of MSSA / ISTA / layers against plain transcriptions of the paper and the official code, on the device
under test (``CRATE_TEST_DEVICE``)."""

import pytest
import torch
import torch.nn.functional as F
from official.crate import Attention as OfficialAttention
from official.crate import FeedForward as OfficialISTA
from tolerances import tol

from crate_transformer.layers import (
    ISTA,
    MMISTA,
    MSSA,
    DecoderLayer,
    EncoderLayer,
    Skip,
    SoftISTA,
    ista_reference,
    mssa_reference,
    trace_layer,
)


def explicit_mssa(m: MSSA, x, causal=False):
    """Explicit softmax-matrix attention, head by head, written out."""
    b, n, d = x.shape
    outs = []
    for k in range(m.heads):
        Uk_t = m.qkv.weight[k * m.dim_head : (k + 1) * m.dim_head]  # U_kᵀ (p×d)
        P = x @ Uk_t.T  # b n p
        S = P @ P.transpose(-1, -2) * m.scale
        if causal:
            S = S.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1), float("-inf"))
        outs.append(torch.softmax(S, -1) @ P)
    return m.proj(torch.cat(outs, -1))


def test_mssa_fast_path_equals_official_attention(device):
    d, K, p = 48, 4, 12
    ours = MSSA(d, K, p)
    off = OfficialAttention(d, K, p)
    off.qkv.weight.data.copy_(ours.qkv.weight)
    off.to_out[0].weight.data.copy_(ours.proj.weight)
    off.to_out[0].bias.data.copy_(ours.proj.bias)
    ours, off, x, t = ours.to(device), off.to(device), torch.randn(3, 17, d).to(device), tol(torch.float32, device)
    torch.testing.assert_close(ours(x), off(x), **t)
    torch.testing.assert_close(ours(x), explicit_mssa(ours, x), **t)
    attn = ours.attention_map(x)  # the map a trace shows is the one the kernel applies
    assert attn.shape == (3, K, 17, 17)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3, K, 17, device=device))
    mixed = (attn @ ours.project(x)).transpose(1, 2).reshape(3, 17, K * p)
    torch.testing.assert_close(ours.proj(mixed), off(x), **t)


def test_row_softmax_code_equals_paper_column_form(device):
    """With W = β[U_1..U_K] and no score scale, the module is eq. (36) exactly."""
    d, K, p, n, beta = 24, 3, 8, 10, 0.7
    m = MSSA(d, K, p, scale_scores=False, tied_output=True, tied_beta=beta).double().to(device)
    x = torch.randn(n, d, dtype=torch.float64).to(device)
    U = m.subspaces().detach()
    want = mssa_reference(x.T, U, beta=beta).T  # paper: columns are tokens, column softmax
    torch.testing.assert_close(m(x[None])[0], want, **tol(torch.float64, device))
    for k in range(K):  # the row-softmax map is the paper's column softmax (eq. (35)), transposed
        A = U[k].T @ x.T
        want_k = torch.softmax(A.T @ A, dim=0).T
        torch.testing.assert_close(m.attention_map(x[None])[0, k], want_k, **tol(torch.float64, device))


def test_causal_mask_no_leakage_and_matches_explicit(device):
    m, t = MSSA(32, 4, 8, causal=True).to(device), tol(torch.float32, device)
    x = torch.randn(2, 9, 32).to(device)
    y = m(x)
    torch.testing.assert_close(y, explicit_mssa(m, x, causal=True), **t)
    x2 = x.clone()
    x2[:, 6:] += torch.randn(2, 3, 32).to(device)
    y2 = m(x2)
    torch.testing.assert_close(y2[:, :6], y[:, :6], **t)
    assert not torch.allclose(y2[:, 6:], y[:, 6:])
    attn = m.attention_map(x)
    assert (attn.triu(1) == 0).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 9, device=device))


def test_attention_dropout_only_in_training():
    m = MSSA(16, 2, 8, dropout=0.5)
    x = torch.randn(2, 6, 16)
    m.eval()
    torch.testing.assert_close(m(x), m(x))
    m.train()
    torch.manual_seed(1)
    a = m(x)
    torch.manual_seed(2)
    assert not torch.allclose(a, m(x))


def test_ista_fast_path_equals_three_matmul_forms(device):
    d = 40
    ours = ISTA(d, eta=0.1, lambd=0.1)
    off = OfficialISTA(d, step_size=0.1)
    off.weight.data.copy_(ours.weight)
    ours, off, x, t = ours.to(device), off.to(device), torch.randn(4, 13, d).to(device), tol(torch.float32, device)
    torch.testing.assert_close(ours(x), off(x), **t)
    # paper column form, eq. (44): ReLU(Z - η Dᵀ(DZ - Z) - ηλ)
    want = ista_reference(x.reshape(-1, d).T, ours.weight.detach(), 0.1, 0.1).T.reshape(x.shape)
    torch.testing.assert_close(ours(x), want, **t)
    assert (ours(x) >= 0).all()


def test_ista_eta_lambda_are_used():
    a = ISTA(8, eta=0.3, lambd=0.5)
    x = torch.randn(2, 5, 8)
    want = ista_reference(x.reshape(-1, 8).T, a.weight.detach(), 0.3, 0.5).T.reshape(x.shape)
    torch.testing.assert_close(a(x), want, rtol=1e-5, atol=1e-5)


def test_ista_soft_threshold_and_mm_modes(device):
    d, eta, lambd = 12, 0.2, 0.4
    x = torch.randn(3, 7, d, dtype=torch.float64).to(device)
    soft = SoftISTA(d, eta, lambd).double().to(device)
    D = soft.weight.detach()
    v = (x.reshape(-1, d).T + eta * D.T @ (x.reshape(-1, d).T - D @ x.reshape(-1, d).T)).T.reshape(x.shape)
    torch.testing.assert_close(soft(x), F.softshrink(v, eta * lambd))
    assert (soft(x) < 0).any()  # soft-threshold keeps negative codes
    mm = MMISTA(d, eta, lambd, eps=0.5).double().to(device)
    n = x.shape[1]
    alpha = d / (n * 0.5**2)
    D = mm.weight.detach()
    # eq. (123): ReLU((1 + 4/(9(1+α))) Dᵀ z − 4λ/(9α)), columns z
    want = F.relu((1 + 4 / (9 * (1 + alpha))) * (D.T @ x.reshape(-1, d).T) - 4 * lambd / (9 * alpha)).T
    torch.testing.assert_close(mm(x), want.reshape(x.shape))


def test_encoder_layer_forms():
    d = 32
    torch.manual_seed(3)
    layer = EncoderLayer(d, 4, 8)
    x = torch.randn(2, 6, d)
    out, half, attn = trace_layer(layer, x)
    assert attn is None
    torch.testing.assert_close(half, x + layer.attn(layer.norm1(x)))
    torch.testing.assert_close(out, layer.ista(layer.norm2(half)))
    torch.testing.assert_close(layer(x), out)
    jmlr = EncoderLayer(d, 4, 8, layer_form="jmlr")
    jmlr.load_state_dict(layer.state_dict())
    out_j, half_j, _ = trace_layer(jmlr, x)
    h = layer.norm1(x)
    torch.testing.assert_close(half_j, h + layer.attn(h))
    torch.testing.assert_close(out_j, layer.ista(layer.norm2(half_j)))
    none = EncoderLayer(d, 4, 8, ista_mode="none")
    assert isinstance(none.block, Skip) and not any(k.startswith(("ista", "norm2")) for k in none.state_dict())
    o, hf, _ = trace_layer(none, x)
    torch.testing.assert_close(o, hf)
    with pytest.raises(ValueError, match="layer_form"):
        EncoderLayer(d, 4, 8, layer_form="other")
    with pytest.raises(ValueError, match="no setting 'form'"):
        EncoderLayer(d, 4, 8, form="jmlr")
    # the ablations are the table's entries, picked by ista_mode once when the layer is built
    for mode, block in (("relu", ISTA), ("soft", SoftISTA), ("mm", MMISTA), ("none", Skip)):
        assert type(EncoderLayer(d, 4, 8, ista_mode=mode).block) is block
        assert sorted(EncoderLayer(d, 4, 8, ista_mode=mode).state_dict()) == sorted((none if mode == "none" else
                                                                                     layer).state_dict())  # fmt: skip
    with pytest.raises(ValueError, match="unknown ista_mode 'hard'"):
        EncoderLayer(d, 4, 8, ista_mode="hard")


def test_the_layer_not_its_block_says_its_norms_and_the_attentions_bias():
    """The LayerNorms' eps and the attention's output bias come from the layer's settings (LayerConfig.ln_eps,
    .attention_bias: CRATE-α's 1e-6 and no bias with its ODL, as the blocks' class attributes said before) or the
    model's keywords (norm_eps, norm_bias, proj_bias); the second block declares neither."""
    d = 16
    for mlp, eps, bias in (("ista", 1e-5, True), ("mlp", 1e-5, True), ("odl", 1e-6, False),
                           ("ista_overcomplete", 1e-5, True)):  # fmt: skip
        layer = EncoderLayer(d, 4, 4, mlp=mlp)
        assert (layer.norm1.eps, layer.norm2.eps, layer.attn.proj.bias is not None) == (eps, eps, bias), mlp
        assert not hasattr(type(layer.block), "norm_eps") and not hasattr(type(layer.block), "attention_bias")
    assert EncoderLayer(d, 4, 4, mlp="odl", proj_bias=True).attn.proj.bias is not None  # the setting wins
    layer = EncoderLayer(d, 4, 4, mlp="mlp", norm_eps=1e-3, norm_bias=False)
    assert (layer.norm1.eps, layer.norm2.eps, layer.norm1.bias, layer.norm2.bias) == (1e-3, 1e-3, None, None)
    assert not any(k.startswith(("norm1.bias", "norm2.bias")) for k in layer.state_dict())


def test_layer_scale_scales_both_residual_branches_and_is_off_by_default():
    """``layer_scale`` (LayerScale, CaiT/ToST): ``Z_half = Z + γ1 ⊙ Attn(LN1 Z)``, ``Z_next = Z_half + γ2 ⊙
    f(LN2 Z_half)``, γ initialised to the value; off: no parameters, CRATE's keys; a block that replaces the tokens
    refuses it; a block given built must be the class the table names."""
    d = 16
    torch.manual_seed(0)
    plain = EncoderLayer(d, 4, 4, mlp="mlp")
    scaled = EncoderLayer(d, 4, 4, mlp="mlp", layer_scale=0.25)
    assert sorted(scaled.state_dict()) == sorted([*plain.state_dict(), "gamma1", "gamma2"])
    assert plain.gamma1 is None and not any("gamma" in k for k in EncoderLayer(d, 4, 4).state_dict())
    torch.testing.assert_close(scaled.gamma1.detach(), torch.full((d,), 0.25))
    scaled.load_state_dict({**plain.state_dict(), "gamma1": torch.rand(d), "gamma2": torch.rand(d)})
    x = torch.randn(2, 5, d)
    half = x + scaled.gamma1 * plain.attn(plain.norm1(x))
    want = half + scaled.gamma2 * plain.mlp(plain.norm2(half))
    torch.testing.assert_close(scaled(x), want)
    assert scaled.output_bias() is None and plain.output_bias() is plain.mlp[3].bias  # a scaled bias is not added
    with pytest.raises(ValueError, match="layer_scale scales residual branches, but ISTA replaces the tokens"):
        EncoderLayer(d, 4, 4, layer_scale=0.1)
    with pytest.raises(ValueError, match="attn is a MSSA, but the layer's 'mhsa' is MHSA"):
        EncoderLayer(d, 4, 4, attention="mhsa", attn=plain.attn)


def test_files_saved_with_the_unused_ista_of_ista_mode_none_still_load():
    """Before Skip, ``ista_mode="none"`` layers kept a frozen ISTA block and LN2, whose keys are in saved files."""
    import crate_transformer as ct
    from crate_transformer.loading.weights import load_weights

    model = ct.create_model("crate_mnist", dim=32, depth=2, heads=4, ista_mode="none")
    old = dict(model.state_dict())
    for i in range(2):
        old |= {f"layers.{i}.ista.weight": torch.randn(32, 32), f"layers.{i}.norm2.weight": torch.ones(32)}
        old[f"layers.{i}.norm2.bias"] = torch.zeros(32)
    load_weights(model, old)  # the loaders' strict check
    model.load_state_dict(old)  # a resumed run's
    with pytest.raises(Exception, match="unexpected"):
        load_weights(model, {**old, "layers.0.ista.bias": torch.zeros(32)})


def test_decoder_layer_forms():
    d = 24
    dec = DecoderLayer(d, 3, 8)
    x = torch.randn(2, 5, d)
    x_ = F.linear(dec.norm1(x), dec.weight)
    torch.testing.assert_close(dec(x), x_ - dec.attn(dec.norm2(x_)))
    jmlr = DecoderLayer(d, 3, 8, form="jmlr")
    jmlr.load_state_dict(dec.state_dict())
    torch.testing.assert_close(jmlr(x), dec.norm2(x_) - dec.attn(dec.norm2(x_)))


def test_backward_through_fast_paths_matches_reference(device):
    d = 16
    layer = EncoderLayer(d, 2, 8).double().to(device)
    x = torch.randn(2, 5, d, dtype=torch.float64).to(device).requires_grad_()
    layer(x).sum().backward()
    g_fast = x.grad.clone()
    x.grad = None
    # the same layer written with the three-matmul ISTA and explicit attention
    h = layer.norm1(x)
    half = x + explicit_mssa(layer.attn, h)
    z = layer.norm2(half)
    D = layer.ista.weight
    out = F.relu(z + 0.1 * (z @ D - z @ D.T @ D) - 0.1 * 0.1)
    out.sum().backward()
    torch.testing.assert_close(g_fast, x.grad, **tol(torch.float64, device))


def test_one_layer_config_is_read_whole_by_the_layer():
    """The layer's settings are declared once (``LayerConfig``), inherited by every config of CRATE layers, and
    the layer is built from them given whole: every field, changed from CRATE's default (where it applies),
    changes the layer built — its weights' names or shapes, or what it computes."""
    import dataclasses

    import crate_transformer as ct
    from crate_transformer.layers import LayerConfig
    from crate_transformer.models.mae import MAEConfig

    names = [f.name for f in dataclasses.fields(LayerConfig)]
    for cls in (ct.ModelConfig, MAEConfig, ct.LMConfig):
        assert issubclass(cls, LayerConfig)
        own = {f.name: f for f in dataclasses.fields(cls)}
        for n in names:  # redeclared (a family's default) only with LayerConfig.default: help, range, choices kept
            assert own[n].metadata == {f.name: f for f in dataclasses.fields(LayerConfig)}[n].metadata, (cls, n)
    assert MAEConfig().lambd == 0.5 and ct.ModelConfig().lambd == 0.1
    changes = {  # field: (its value, the settings it needs to apply)
        "dropout": (0.5, {}), "eta": (0.3, {}), "lambd": (0.5, {}), "ista_mode": ("soft", {}),
        "layer_form": ("jmlr", {}), "scale_scores": (False, {}), "tied_output": (True, {}),
        "tied_beta": (0.5, {"tied_output": True}), "eps": (0.5, {"ista_mode": "mm"}), "attention": ("mhsa", {}),
        "mlp": ("mlp", {}), "odl_ratio": (2, {"mlp": "odl"}), "mlp_ratio": (2.0, {"mlp": "mlp"}),
        "gelu": ("tanh", {"mlp": "mlp"}), "proj_bias": (False, {}),
    }  # fmt: skip
    assert set(changes) == set(names)
    x = torch.randn(2, 5, 32) * 3

    def built(**settings):
        torch.manual_seed(0)
        layer = EncoderLayer.from_config(ct.ModelConfig(dim=32, heads=4, **settings)).train()
        torch.manual_seed(1)
        return {k: tuple(v.shape) for k, v in layer.state_dict().items()}, layer(x)

    for field, (value, needs) in changes.items():
        keys, out = built(**needs)
        keys2, out2 = built(**needs, **{field: value})
        assert keys != keys2 or not torch.allclose(out, out2), field
    with pytest.raises(ValueError, match="extends LayerConfig"):
        EncoderLayer.from_config(object())


# --------------------------------------------------------------------------- the layer's norms under autocast
def test_the_layer_norms_bf16_tokens_in_bf16_as_float32_would_round_them():
    """Under bf16 autocast CRATE's tokens between layers are bf16 (the sparse code replaces them). The layer's
    norm gives what a float32 LayerNorm with bf16-cast γ and β gives, rounded once to bf16; float32 tokens as
    ``nn.LayerNorm`` gives them; γ and β get float32 gradients."""
    from crate_transformer.layers.block import LayerNorm

    torch.manual_seed(0)
    norm = LayerNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.3, 0.3)
    x = (torch.randn(3, 7, 48) * 4 + 1).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
    want = F.layer_norm(x.double(), (48,), norm.weight.bfloat16().double(), norm.bias.bfloat16().double(), 1e-6)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), want, rtol=2**-8, atol=2**-8)  # one bf16 rounding
    y.float().square().sum().backward()
    assert norm.weight.grad.dtype == torch.float32 and norm.bias.grad.abs().sum() > 0
    x32 = x.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.testing.assert_close(norm(x32), torch.nn.LayerNorm.forward(norm, x32), rtol=0, atol=0)


def test_a_layer_normalises_bf16_tokens_outside_autocast(monkeypatch):
    """CUDA's autocast runs layer_norm in float32 (a cast of the bf16 tokens in, a float32 result cast back at the
    next product: three passes where one does). Every LayerNorm of CRATE's encoder and decoder layers that reads
    bf16 tokens is called with autocast off, so no device's autocast policy applies to it; at least one per layer
    past the first does (the first reads the float32 input)."""
    calls: list[tuple] = []
    layer_norm = F.layer_norm

    def recording(x, *args, **kwargs):
        calls.append((x.dtype, torch.is_autocast_enabled("cpu")))
        return layer_norm(x, *args, **kwargs)

    monkeypatch.setattr(F, "layer_norm", recording)
    layers = torch.nn.Sequential(*(EncoderLayer(32, 4, 8) for _ in range(2)), DecoderLayer(32, 4, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layers(torch.randn(2, 9, 32))
    low = [on for dtype, on in calls if dtype == torch.bfloat16]
    assert len(low) >= 3 and not any(low), calls


@pytest.mark.parametrize(
    ("model_dtype", "input_dtype"), [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.bfloat16)]
)
def test_every_family_runs_on_meta_in_half_precision(model_dtype, input_dtype):
    """Shapes without a device: every question about autocast (the layer's norm, the image models' input cast)
    goes through ``objectives.autocast_on``, which answers False where the device has no autocast (``meta``;
    asking torch raised). Images of another dtype are cast to the model's."""
    from tiny import family_builders, family_inputs

    for name, build in family_builders().items():
        model = build().to("meta", model_dtype)
        x = family_inputs(model, "meta")
        x = [t.to(input_dtype) for t in x] if isinstance(x, list) else x.to(input_dtype) if x.is_floating_point() else x
        out = model(x)
        loss = getattr(out, "loss", None)  # CRATE-MAE's loss is float32 by design
        out = out[0] if isinstance(out, tuple) else out
        assert out.device.type == "meta" and (loss is not None or out.dtype == model_dtype), name
