"""The CRATE classifier, the ViT baseline and the registry."""

import pytest
import torch

import crate_transformer as ct

TINY = dict(image_size=32, patch_size=8, dim=32, depth=2, heads=4, num_classes=5)


@pytest.mark.parametrize(
    "name,count",
    [
        ("crate_tiny", 6_090_856),
        ("crate_small", 13_116_328),
        ("crate_base", 22_796_008),
        ("crate_large", 77_641_192),
        ("vit_tiny", 5_717_416),  # paper Table 1: 5.72M
        ("vit_small", 22_050_664),  # paper Table 1: 22.05M
    ],
)
def test_exact_parameter_counts(name, count):
    with torch.device("meta"):
        model = ct.create_model(name)
    assert model.num_params() == count


def test_parameter_count_formula():
    """§2.10: L(3d²+5d) + patch embed + pos + cls + head, for a non-registered size."""
    c = dict(image_size=64, patch_size=8, in_chans=2, num_classes=7, dim=40, depth=3, heads=5)
    m = ct.create_model("crate_tiny", **c)
    d, L, N, pd, C = 40, 3, 64, 2 * 64, 7
    assert m.num_params() == L * (3 * d * d + 5 * d) + (2 * pd + pd * d + d + 2 * d) + (N + 1) * d + d + (
        2 * d + d * C + C
    )


def test_registry_listing_and_overrides():
    names = ct.list_models()
    assert {"crate_tiny", "crate_small", "crate_base", "crate_large", "vit_tiny", "vit_small"} <= set(names)
    assert all(n.startswith("crate_") for n in ct.list_models("crate_*"))
    m = ct.create_model("crate_small", num_classes=10, image_size=32, patch_size=4, eta=0.2, lambd=0.05, pool="mean")
    c = m.config
    assert (c.num_classes, c.image_size, c.patch_size, c.eta, c.lambd, c.pool, c.head_dim) == (
        10,
        32,
        4,
        0.2,
        0.05,
        "mean",
        48,
    )
    assert m.layers[0].ista.eta == 0.2 and m.layers[0].ista.lambd == 0.05
    assert len(m.layers) == 12 and m.pos_embed.shape == (1, 65, 576)


def test_registry_errors():
    with pytest.raises(ValueError, match="unknown model 'crate_tyni'.*did you mean crate_tiny"):
        ct.create_model("crate_tyni")
    with pytest.raises(ValueError, match="unknown override.*num_class"):
        ct.create_model("crate_tiny", num_class=10)
    with pytest.raises(ValueError, match="dim=100 is not divisible by heads=6"):
        ct.create_model("crate_tiny", dim=100)
    with pytest.raises(ValueError, match="image_size=30 is not divisible by patch_size=16"):
        ct.create_model("crate_tiny", image_size=30)
    with pytest.raises(ValueError, match="pool"):
        ct.create_model("crate_tiny", pool="max")


def test_forward_trace_consistency():
    m = ct.create_model("crate_tiny", **TINY).eval()
    x = torch.randn(3, 3, 32, 32)
    logits = m(x)
    assert logits.shape == (3, 5)
    feats = m.forward_features(x)
    torch.testing.assert_close(m.forward_head(feats), logits)
    tr = m.forward_trace(x, return_attention=True)
    assert len(tr.tokens) == 3 and len(tr.half) == 2 and len(tr.attention) == 2
    torch.testing.assert_close(tr.tokens[-1], feats)
    torch.testing.assert_close(tr.tokens[0], m.embed(x))
    assert tr.attention[0].shape == (3, 4, 17, 17)
    for ell in range(2):  # the trace's tokens are really the layers' inputs / outputs
        out, half, _ = m.layers[ell](tr.tokens[ell])
        torch.testing.assert_close(out, tr.tokens[ell + 1])
        torch.testing.assert_close(half, tr.half[ell])
        assert (tr.tokens[ell + 1] >= 0).all()  # ISTA output is non-negative


def test_patchify_order_is_p1_p2_c():
    """Official 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)', checked element by element."""
    m = ct.create_model("crate_tiny", **TINY)
    x = torch.randn(2, 3, 32, 16)
    got = m.patchify(x)
    p = 8
    for i in range(4):
        for j in range(2):
            for p1 in range(p):
                for p2 in range(p):
                    for c in range(3):
                        assert got[1, i * 2 + j, (p1 * p + p2) * 3 + c] == x[1, c, i * p + p1, j * p + p2]


def test_mean_pool_includes_class_token():
    m = ct.create_model("crate_tiny", **TINY, pool="mean").eval()
    x = torch.randn(2, 3, 32, 32)
    z = m.forward_features(x)
    torch.testing.assert_close(m(x), m.head(z.mean(1)))


def test_position_embedding_interpolation():
    m = ct.create_model("crate_tiny", **TINY).eval()
    g = m.config.grid
    assert m.interpolate_pos_embed(g, g) is m.pos_embed  # same grid: untouched
    pe = m.interpolate_pos_embed(6, 5)
    assert pe.shape == (1, 31, 32)
    torch.testing.assert_close(pe[:, 0], m.pos_embed[:, 0])
    # bicubic resampling of a constant grid stays constant
    with torch.no_grad():
        m.pos_embed[:, 1:] = 0.25
    torch.testing.assert_close(m.interpolate_pos_embed(8, 8)[:, 1:], torch.full((1, 64, 32), 0.25))
    assert m(torch.randn(1, 3, 48, 40)).shape == (1, 5)  # non-square, larger than trained


def test_resize_pos_embed_and_reset_head():
    m = ct.create_model("crate_tiny", **TINY)
    m.reset_head(9)
    assert m.config.num_classes == 9 and m(torch.randn(1, 3, 32, 32)).shape == (1, 9)
    m.eval()
    x = torch.randn(1, 3, 64, 64)
    before = m(x)
    m.resize_pos_embed(64)
    assert m.config.image_size == 64 and m.pos_embed.shape == (1, 65, 32)
    torch.testing.assert_close(m(x), before)  # same embedding, now stored


def test_bad_image_input_errors():
    m = ct.create_model("crate_tiny", **TINY)
    cases = [
        (torch.randn(1, 1, 32, 32), "expects 3-channel images.*got 1 channels"),
        (torch.randint(0, 255, (1, 3, 32, 32), dtype=torch.uint8), "floating-point.*x.float\\(\\) / 255"),
        (torch.randn(3, 32, 32), "add a batch dimension"),
        (torch.randn(1, 3, 30, 32), "30x32 is not divisible by the patch size 8"),
        (torch.full((1, 3, 32, 32), float("nan")), "NaN"),
    ]
    for x, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m(x)
    with pytest.raises(ValueError, match="torch.Tensor"):
        m([[1.0]])


def test_vit_baseline():
    m = ct.create_model("vit_tiny", **{**TINY, "dim": 48, "heads": 3}).eval()
    x = torch.randn(2, 3, 32, 32)
    assert m(x).shape == (2, 5)
    tr = m.forward_trace(x, return_attention=True)
    torch.testing.assert_close(tr.tokens[-1], m.forward_features(x), rtol=1e-5, atol=1e-5)
    assert tr.attention[1].shape == (2, 3, 17, 17)
    assert isinstance(m, ct.ViT) and isinstance(ct.create_model("crate_tiny", **TINY), ct.CRATE)


def test_ablation_variants_run_and_differ():
    x = torch.randn(2, 3, 32, 32)
    outs = {}
    for variant in [
        {},
        {"ista_mode": "soft"},
        {"ista_mode": "mm"},
        {"ista_mode": "none"},
        {"tied_output": True},
        {"scale_scores": False},
        {"layer_form": "jmlr"},
    ]:
        torch.manual_seed(0)
        m = ct.create_model("crate_tiny", **TINY, **variant).eval()
        outs[str(variant)] = m(x)
        m(x).sum().backward()
    vals = list(outs.values())
    assert all(not torch.allclose(vals[0], v) for v in vals[1:])
    torch.manual_seed(0)
    tied = ct.create_model("crate_tiny", **TINY, tied_output=True)
    assert tied.layers[0].attn.proj is None  # no W: output is β[U_1..U_K]
