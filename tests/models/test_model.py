"""The CRATE classifier, the ViT baseline and the registry."""

import pytest
import tiny
import torch

import crate_transformer as ct

TINY = tiny.IMAGE


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
        layer, z = m.layers[ell], tr.tokens[ell]
        torch.testing.assert_close(layer(z), tr.tokens[ell + 1])
        torch.testing.assert_close(z + layer.attn(layer.norm1(z)), tr.half[ell])
        w = layer.attn.project(layer.norm1(z))  # eq. (35)'s scores, row-softmaxed
        torch.testing.assert_close(tr.attention[ell], torch.softmax(w @ w.transpose(-1, -2) * layer.attn.scale, -1))
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


def test_resize_pos_embed_and_reset_classifier():
    m = ct.create_model("crate_tiny", **TINY)
    m.reset_classifier(9)
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
    ]
    for x, msg in cases:
        with pytest.raises(ValueError, match=msg):
            m(x)
        with pytest.raises(ValueError, match=msg):
            m.check_images(x)  # the same checks at an API boundary
    with pytest.raises(ValueError, match="torch.Tensor"):
        m([[1.0]])
    # NaN/Inf is checked at API boundaries (check_images / check_finite), not in every forward (a device sync)
    for bad in (float("nan"), float("inf")):
        x = torch.randn(1, 3, 32, 32)
        x[0, 1, 3, 4] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            m.check_images(x)
        with pytest.raises(ValueError, match="NaN or Inf"):
            m.check_finite(x)
        m.check_images(x, finite=False)  # metadata only
    m.check_images(torch.randn(1, 3, 32, 32))


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


# --------------------------------------------------------------------------- CRATE / ViT build what they say
def test_crate_and_vit_classes_fix_their_architecture():
    from crate_transformer.layers import MHSA, MLP, EncoderLayer
    from crate_transformer.models.classifier import build_model

    cfg = ct.ModelConfig(**{**TINY, "dim": 48, "heads": 3})  # arch defaults to "crate"
    vit = ct.ViT(cfg)
    assert isinstance(vit, ct.ViT) and isinstance(vit, ct.ImageClassifier) and vit.config.arch == "vit"
    assert all(isinstance(layer.attn, MHSA) and isinstance(layer.block, MLP) for layer in vit.layers)
    assert cfg.arch == "crate"  # caller's config kept
    crate = ct.CRATE(ct.ModelConfig(**{**TINY, "dim": 48, "heads": 3, "arch": "vit"}))
    assert crate.config.arch == "crate" and all(isinstance(layer, EncoderLayer) for layer in crate.layers)
    # the same modules, keys and sizes as the registry / build_model give for that architecture
    torch.manual_seed(0)
    reg_vit = ct.create_model("vit_tiny", **{**TINY, "dim": 48, "heads": 3})
    assert vit.state_dict().keys() == reg_vit.state_dict().keys() and vit.num_params() == reg_vit.num_params()
    reg_crate = ct.create_model("crate_tiny", **{**TINY, "dim": 48, "heads": 3})
    assert crate.state_dict().keys() == reg_crate.state_dict().keys() and crate.num_params() == reg_crate.num_params()
    assert type(build_model(vit.config)) is ct.ViT and type(build_model(crate.config)) is ct.CRATE
    assert ct.ViT().config.arch == "vit" and ct.CRATE().config == ct.ModelConfig()
    with torch.device("meta"):  # paper sizes through the classes, not the registry
        assert ct.ViT(ct.model_config("vit_tiny")).num_params() == 5_717_416
        assert ct.CRATE(ct.model_config("crate_tiny", arch="vit")).num_params() == 6_090_856
    with pytest.raises(ValueError, match="expected a ModelConfig"):
        ct.CRATE({"dim": 32})


def test_model_modules_import_only_torch_and_the_core():
    """A model module imports torch and the layers below it (the objectives, the core, ``base``, the registry's
    tables, other model modules) and nothing above it (data, train, analysis, cli, the loaders, the factory),
    anywhere in the file; the package's whole import graph is checked for cycles in tests/test_import_layering.py."""
    import ast
    from pathlib import Path

    src = Path(ct.__file__).parent
    from crate_transformer.models import _registry

    model_modules = {a.model_class.__module__.removeprefix("crate_transformer.") for a in _registry._ARCHS.values()}
    assert {f"models.{m}" for m in ("classifier", "mae", "lm", "alpha", "bert", "tost")} <= model_modules
    below = {"config", "config_utils", "errors", "io", "objectives", "_version", "layers"}
    below |= {
        f"models.{m}"
        for m in ("base", "contract", "spec", "tokenizer", "_registry", "generation", "token_prior", "image_input")
    }
    below |= {"loading.official", "loading.hub"}
    for name in model_modules:
        tree = ast.parse((src / f"{name.replace('.', '/')}.py").read_text())
        nodes = list(ast.walk(tree))
        # relative imports resolved from the module's package (models/): ``.x`` → models.x, ``..x`` → x
        pkg = name.split(".")[:-1]
        rel = {
            ".".join(pkg[: len(pkg) - n.level + 1] + [n.module])
            for n in nodes
            if isinstance(n, ast.ImportFrom) and n.level and n.module
        }
        rel = {"layers" if t.startswith("layers.") else t for t in rel}  # any of the layers
        absolute = {a.name.split(".")[0] for n in nodes if isinstance(n, ast.Import) for a in n.names}
        absolute |= {n.module.split(".")[0] for n in nodes if isinstance(n, ast.ImportFrom) and not n.level}
        assert rel <= below | model_modules, (name, rel - below - model_modules)
        assert absolute <= {"__future__", "torch", "math", "dataclasses", "typing", "collections", "re", "pathlib"}, (
            name,
            absolute,
        )
    text = (src / "models" / "classifier.py").read_text()
    io_calls = ("open(", "Path(", "import json", "json.", "safetensors", "torch.save", "torch.load", "write_", "read_")
    assert not [s for s in io_calls if s in text]
    assert "save_pretrained" in dir(ct.ImageClassifier)


# --------------------------------------------------------------------------- input dtypes and checks
def test_other_float_dtypes_are_cast_to_the_parameter_dtype():
    m = ct.create_model("crate_tiny", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = m(x)
        torch.testing.assert_close(m(x.double()), ref, rtol=0, atol=0)  # exactly the float32 computation
        for low in (torch.float16, torch.bfloat16):
            xl = x.to(low)
            out = m(xl)
            assert out.dtype == torch.float32
            torch.testing.assert_close(out, m(xl.float()), rtol=0, atol=0)  # = float32 on the rounded input
            torch.testing.assert_close(out, ref, rtol=0.05, atol=0.05)  # and close to the full-precision input
        m64 = ct.create_model("crate_tiny", **TINY).double().eval()
        m64.load_state_dict({k: v.double() for k, v in m.state_dict().items()})
        assert m64(x).dtype == torch.float64
        torch.testing.assert_close(m64(x).float(), ref, rtol=1e-4, atol=1e-4)
        with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast the input is left to autocast
            torch.testing.assert_close(m(x).float(), ref, rtol=0.1, atol=0.1)


def test_forward_checks_metadata_only():
    m = ct.create_model("crate_tiny", **TINY).eval()
    x = torch.randn(1, 3, 32, 32)
    x[0, 0, 0, 0] = float("nan")
    with torch.no_grad():
        assert torch.isnan(m(x)).all()  # no NaN check (no device sync) inside forward
    with pytest.raises(ValueError, match="images are on meta but the model is on cpu"):
        m.check_images(torch.empty(1, 3, 32, 32, device="meta"), finite=False)


# --------------------------------------------------------------------------- ModelConfig types and ranges
def test_model_config_coerces_strings_by_field_type():
    c = ct.ModelConfig(lambd="5e-2", eta="0.2", dim="64", heads=4.0, dim_head="none", scale_scores="false")
    assert (c.lambd, c.eta, c.dim, c.heads, c.dim_head, c.scale_scores) == (0.05, 0.2, 64, 4, None, False)
    assert type(c.lambd) is float and type(c.dim) is int and type(c.heads) is int
    assert type(ct.ModelConfig(eta=1).eta) is float
    m = ct.create_model("crate_tiny", **TINY, lambd="5e-2")  # what YAML 1.1 gives for --model-args lambd=5e-2
    assert m.layers[0].ista.lambd == 0.05 and m(torch.randn(1, 3, 32, 32)).shape == (1, 5)


@pytest.mark.parametrize(
    "bad,msg",
    [
        ({"lambd": "abc"}, r"lambd must be a number, got 'abc' \(str\); e.g. lambd=0.1"),
        ({"dim": True}, r"dim must be an integer, got True \(bool\); e.g. dim=384"),
        ({"dim": 2.5}, r"dim must be an integer, got 2.5"),
        ({"depth": "1.5"}, r"depth must be an integer"),
        ({"eta": True}, r"eta must be a number, got True"),
        ({"tied_output": "maybe"}, r"tied_output must be a boolean"),
        ({"eta": float("nan")}, r"eta must be a finite number > 0, got nan; e.g. eta=0.1"),
        ({"eta": "nan"}, r"eta must be a finite number > 0, got nan"),
        ({"eta": 0}, r"eta must be a finite number > 0"),
        ({"lambd": -0.1}, r"lambd must be a finite number >= 0"),
        ({"eps": 0.0}, r"eps must be a finite number > 0"),
        ({"tied_beta": float("inf")}, r"tied_beta must be a finite number, got inf"),
        ({"mlp_ratio": 0}, r"mlp_ratio must be a finite number > 0"),
        ({"dropout": 1.0}, r"dropout must be a finite number in \[0, 1\)"),
        ({"emb_dropout": -0.1}, r"emb_dropout must be a finite number in \[0, 1\)"),
        ({"dim_head": 0}, r"dim_head must be a positive integer \(or None = dim // heads\), got 0"),
        ({"data": {"mean": [0.5, 0.5], "std": [1, 1]}}, r"2 values, which cannot be adapted to in_chans=3"),
    ],
)
def test_model_config_rejects_bad_values_in_one_line(bad, msg):
    with pytest.raises(ValueError, match=msg) as e:
        ct.ModelConfig(**bad)
    assert "\n" not in str(e.value)


def test_coerce_fields_is_generic_over_dataclasses():
    import dataclasses

    from crate_transformer.config_utils import coerce_fields

    @dataclasses.dataclass
    class Cfg:  # string annotations, as under `from __future__ import annotations`
        lr: "float" = 1e-3
        epochs: "int" = 10
        amp: "bool" = False
        name: "str" = "run"
        limit: "int | None" = None
        tag: "str | None" = None
        mean: "list[float]" = dataclasses.field(default_factory=list)
        args: "dict[str, float]" = dataclasses.field(default_factory=dict)
        sizes: "tuple[int, ...]" = ()

    got = coerce_fields(
        Cfg,
        {
            "lr": "1e-3",
            "epochs": "1e2",
            "amp": "Yes",
            "name": 7,
            "limit": "null",
            "tag": "none",
            "mean": "0.5, 2.5e-1",
            "args": {"a": "3"},
            "sizes": "[32, 64]",
        },
    )
    assert got == {
        "lr": 0.001,
        "epochs": 100,
        "amp": True,
        "name": "7",
        "limit": None,
        "tag": "none",  # a str field keeps the string
        "mean": [0.5, 0.25],
        "args": {"a": 3.0},
        "sizes": (32, 64),
    }
    assert coerce_fields(Cfg, {"limit": "5", "mean": (1, 2)}) == {"limit": 5, "mean": [1.0, 2.0]}
    with pytest.raises(ValueError, match=r"unknown Cfg keys \['lrr'\]; valid keys"):
        coerce_fields(Cfg, {"lrr": 1})
    assert coerce_fields(Cfg, {"lrr": "x"}, allow_unknown=True) == {"lrr": "x"}
    with pytest.raises(ValueError, match=r"Cfg.limit must be an integer or None, got 'x'"):
        coerce_fields(Cfg, {"limit": "x"})
    with pytest.raises(ValueError, match=r"Cfg.amp must be a boolean .*; e.g. amp=False"):
        coerce_fields(Cfg, {"amp": 2})
    with pytest.raises(ValueError, match=r"^Cfg.epochs must be an integer, got 1.5 \(float\); e.g. epochs=10$"):
        coerce_fields(Cfg, {"epochs": 1.5})
