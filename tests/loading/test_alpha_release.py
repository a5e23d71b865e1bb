"""CRATE-α (crate_transformer.models.alpha): the authors' released PyTorch checkpoints load and reproduce the authors'
model (tests/official/crate_alpha_official.py, transcribed from UCSC-VLAA/CRATE-alpha @ edbd624)."""

import json

import pytest
import torch
from official.crate import OfficialCRATE
from official.crate_alpha_official import CRATE as OfficialCRATEAlpha
from official.crate_alpha_official import CRATE_base, CRATE_large

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.loading.official import native_to_official
from crate_transformer.loading.pipeline import load_model
from crate_transformer.models.alpha import (
    AlphaConfig,
    CRATEAlpha,
    alpha_config,
    alpha_native_to_official,
    alpha_official_to_native,
    looks_like_alpha,
)

TINY = dict(image_size=32, patch_size=8, num_classes=10, dim=32, depth=2, heads=4)


def official_tiny(seed: int = 0) -> OfficialCRATEAlpha:
    """The authors' module at a tiny size with every parameter random (LayerNorms and biases too, so a key
    mapped to the wrong place cannot go unnoticed)."""
    torch.manual_seed(seed)
    off = OfficialCRATEAlpha(**TINY, dim_head=TINY["dim"] // TINY["heads"]).eval()
    with torch.no_grad():
        for name, p in off.named_parameters():
            if "norm" in name or name.startswith("mlp_head.0"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    return off


def test_from_official_reproduces_the_authors_logits_fp32_and_fp64(tmp_path):
    off = official_tiny()
    path = tmp_path / "crate_alpha_tiny.pth"
    torch.save(off.state_dict(), path)  # what the release is: a plain state dict, loaded strictly by eval_in1k_cls.py
    m = ct.from_official(path, "crate_alpha_base16", **TINY).eval()
    assert isinstance(m, CRATEAlpha) and m.config.arch == "crate_alpha" and m.config.mlp == "odl"
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ours, theirs = m(x), off(x)
        assert (ours - theirs).abs().max().item() <= 1e-5
        assert theirs.std().item() > 0.1  # not a degenerate comparison of near-constant logits
        ours64, theirs64 = m.double()(x.double()), off.double()(x.double())
    assert (ours64 - theirs64).abs().max().item() <= 1e-10


def test_full_size_b16_reproduces_the_authors_logits():
    """CRATE_base() itself (the architecture of torch/crate_alpha_B16.pth), random weights, one 224 image."""
    torch.manual_seed(2)
    off = CRATE_base().eval()
    m = ct.from_official(off.state_dict(), "crate_alpha_base16").eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ours, theirs = m(x), off(x)
    assert (ours - theirs).abs().max().item() <= 1e-5 and theirs.std().item() > 0.1


def test_layer_norm_eps_and_biases_follow_the_authors_module():
    off, m = official_tiny(), CRATEAlpha(alpha_config(ct.ModelConfig(**TINY)))
    ours = {k: v.eps for k, v in m.named_modules() if isinstance(v, torch.nn.LayerNorm)}
    theirs = {k: v.eps for k, v in off.named_modules() if isinstance(v, torch.nn.LayerNorm)}
    assert sorted(ours.values()) == sorted(theirs.values()) == [1e-6] * 4 + [1e-5]  # PreNorms 1e-6, head 1e-5
    assert m.layers[0].attn.proj.bias is None and m.patch_embed[0].bias is not None


@pytest.mark.parametrize("container", ["bare", "module_prefix"])
def test_native_official_round_trip_loads_strictly_in_the_authors_module(container):
    torch.manual_seed(1)
    m = ct.create_model("crate_alpha_base16", **TINY).eval()
    sd = alpha_native_to_official(m.state_dict(), in_chans=3)
    off = OfficialCRATEAlpha(**TINY, dim_head=8).eval()
    off.load_state_dict(sd, strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(off(x), m(x), rtol=0, atol=1e-5)
    if container == "module_prefix":  # a DDP-wrapped save
        sd = {"module." + k: v for k, v in sd.items()}
    back = ct.from_official(sd, "crate_alpha_base16", **TINY)
    for k, v in m.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    assert alpha_official_to_native(alpha_native_to_official(m.state_dict())).keys() == m.state_dict().keys()


@pytest.mark.parametrize(
    "name, factory, expected",
    [("crate_alpha_base16", CRATE_base, 72_328_936), ("crate_alpha_large14", CRATE_large, 253_650_920)],
)
def test_parameter_counts_of_the_released_sizes(name, factory, expected):
    with torch.device("meta"):
        ours, theirs = ct.create_model(name), factory()
    assert ours.num_params() == sum(p.numel() for p in theirs.parameters()) == expected
    shapes = {k: tuple(v.shape) for k, v in alpha_official_to_native(theirs.state_dict()).items()}
    assert shapes == {k: tuple(v.shape) for k, v in ours.state_dict().items()}


def test_released_sizes_are_the_authors_factories():
    c = ct.model_config("crate_alpha_large14")
    assert (c.image_size, c.patch_size, c.dim, c.depth, c.heads, c.head_dim) == (224, 14, 1024, 24, 16, 64)
    c = ct.model_config("crate_alpha_base16")
    assert (c.image_size, c.patch_size, c.dim, c.depth, c.heads, c.head_dim) == (224, 16, 768, 12, 12, 64)


def test_initialisation_matches_the_authors_scales():
    """Same distributions as the authors' module: kaiming-uniform D, D1 (bound √(6/4d)), PyTorch's default conv /
    Linear init (the conv's fan-in c·p·p equals the Linear's), randn class token and position table."""
    torch.manual_seed(0)
    sizes = dict(image_size=64, patch_size=8, num_classes=10, dim=64, depth=1, heads=4)
    m, off = ct.create_model("crate_alpha_base16", **sizes), OfficialCRATEAlpha(**sizes, dim_head=16)
    theirs = alpha_official_to_native(off.state_dict())
    for k, v in m.state_dict().items():
        t = theirs[k]
        if v.numel() >= 1000:
            assert abs(v.std().item() / t.std().item() - 1) < 0.1, k
            assert abs(v.abs().max().item() / t.abs().max().item() - 1) < 0.3, k
        elif "norm" in k or k.startswith("head.0"):
            assert torch.equal(v, t), k


def test_wrong_checkpoint_formats_are_one_line_errors_naming_the_fix():
    crate = OfficialCRATE(**TINY).state_dict()  # the CRATE classifier (model/crate.py), not CRATE-α
    with pytest.raises(
        CheckpointError, match=r"not a CRATE-α checkpoint .*it is a CRATE classifier.*crate_small$"
    ) as e:
        ct.from_official(crate, "crate_alpha_base16", **TINY)
    assert "\n" not in str(e.value)
    alpha = official_tiny().state_dict()
    with pytest.raises(CheckpointError, match="not a CRATE classifier checkpoint .*e.g. crate_alpha_base16$") as e:
        ct.from_official(alpha, "crate_tiny", **TINY)
    assert "\n" not in str(e.value)
    with pytest.raises(CheckpointError, match="shape mismatches: .*pass .*num_classes=10"):
        ct.from_official(alpha, "crate_alpha_base16", **{**TINY, "num_classes": 1000})
    p4 = OfficialCRATEAlpha(**{**TINY, "patch_size": 4, "num_classes": 7}, dim_head=8).state_dict()  # e.g. B/32 vs B/16
    with pytest.raises(CheckpointError, match="pass patch_size=4, num_classes=7$"):
        ct.from_official(p4, "crate_alpha_base16", **TINY)
    # the CRATE + ODL ablation (arch crate, patch LayerNorms) is not CRATE-α: the file's own format is named
    with pytest.raises(CheckpointError, match="not a CRATE classifier .*CRATE-α checkpoint.*e.g. crate_alpha_base16$"):
        ct.from_official(alpha, "crate_alpha_mnist")
    with pytest.raises(CheckpointError, match="MSSA \\+ ISTA layers, not .*mlp='odl'; pass a CRATE classifier name"):
        ct.from_official(crate, "crate_alpha_mnist")  # a CRATE file under the ablation's name: no override was given
    assert looks_like_alpha(alpha) and not looks_like_alpha(crate)
    assert not looks_like_alpha(ct.create_model("crate_mae_mnist", depth=1).state_dict())
    assert not looks_like_alpha(native_to_official(ct.create_model("crate_tiny", **TINY).state_dict()))


def test_load_model_resolves_an_official_alpha_file_and_suggests_the_name(tmp_path):
    """What the commands (crate analyze / eval / finetune CHECKPOINT --model NAME) go through."""
    path = tmp_path / "crate_alpha_B16.pth"
    torch.save(official_tiny().state_dict(), path)
    assert isinstance(load_model(path, "crate_alpha_base16", **TINY), CRATEAlpha)
    with pytest.raises(
        CheckpointError, match="authors' checkpoint, .*its architecture: pass the model name, e.g. crate_alpha_base16$"
    ):
        load_model(path)


def test_alpha_config_fixes_the_family_and_refuses_other_variants():
    c = alpha_config(ct.ModelConfig(**TINY))
    assert isinstance(c, AlphaConfig) and (c.arch, c.mlp, c.patch_norm, c.attention) == (
        "crate_alpha",
        "odl",
        False,
        "mssa",
    )
    assert (c.dim, c.depth, c.num_classes) == (32, 2, 10)
    with pytest.raises(ValueError, match="CRATE-α has attention='mssa', got attention='mhsa'; drop attention"):
        alpha_config(ct.ModelConfig(**TINY, attention="mhsa"))
    with pytest.raises(ValueError, match="CRATE-α has patch_norm=False, got patch_norm=True"):
        ct.create_model("crate_alpha_base16", patch_norm=True)
    with pytest.raises(ValueError, match="unknown arch 'vit'"):
        AlphaConfig(arch="vit")
    with pytest.raises(ValueError, match="expected an AlphaConfig"):
        CRATEAlpha({"dim": 32})
    with torch.device("meta"):
        assert CRATEAlpha().num_params() == 72_328_936  # the default is CRATE-α-B/16


def test_the_model_contract_and_save_pretrained_round_trip(tmp_path):
    off = official_tiny()
    m = ct.from_official(off.state_dict(), "crate_alpha_base16", **TINY).eval()
    x = torch.randn(2, 3, 32, 32)
    z = m.forward_features(x)
    assert z.shape == (2, 17, 32) and len(m.forward_trace(x).tokens) == 3
    assert {"pos_embed", "cls_token"} <= m.no_weight_decay() and "layers.0.mlp.D" not in m.no_weight_decay()
    m.save_pretrained(tmp_path / "alpha")
    stored = json.loads((tmp_path / "alpha" / "config.json").read_text())
    assert stored["arch"] == "crate_alpha" and stored["config_version"] == AlphaConfig.VERSION
    r = CRATEAlpha.from_pretrained(tmp_path / "alpha").eval()
    assert r.config == m.config and isinstance(ct.from_pretrained(tmp_path / "alpha"), CRATEAlpha)
    with torch.no_grad():
        torch.testing.assert_close(r(x), off(x), rtol=0, atol=1e-5)
        assert r(torch.randn(1, 3, 48, 48)).shape == (1, 10)  # other image sizes: the position table is interpolated


def test_crate_alpha_mnist_ablation_still_builds_and_trains_a_step():
    m = ct.create_model("crate_alpha_mnist", depth=1)
    assert type(m) is ct.CRATE and m.config.patch_norm and m.config.layer_blocks[1] == "odl"
    loss = torch.nn.functional.cross_entropy(m(torch.randn(4, 1, 28, 28)), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())


def test_crate_train_and_resume_build_the_family(tmp_path):
    """The training engine builds a registered family by its arch (a fresh run and a resumed one)."""
    from crate_transformer.io import load_pickle
    from crate_transformer.train import TrainConfig, train

    args = dict(model="crate_alpha_base16", model_args=dict(dim=32, depth=1, heads=4, patch_size=4), data="digits")
    cfg = TrainConfig(**args, image_size=8, epochs=1, max_steps=3, progress=False, out=str(tmp_path / "a"), threads=1)
    assert train(cfg)["test_acc"] >= 0
    state = load_pickle(tmp_path / "a" / "checkpoints" / "last.pt")
    assert state["model_config"]["arch"] == "crate_alpha" and "layers.0.mlp.D1" in state["model"]
    assert isinstance(ct.from_pretrained(tmp_path / "a" / "model"), CRATEAlpha)
    resumed = train(None, resume=tmp_path / "a", overrides={"max_steps": 5})
    assert resumed["step"] == 5 and not resumed["interrupted"]


def test_the_family_module_imports_only_torch_and_the_core():
    import ast
    from pathlib import Path

    import crate_transformer.models.alpha as alpha

    tree = ast.parse(Path(alpha.__file__).read_text())
    imported = {(n.module or "") if isinstance(n, ast.ImportFrom) else a.name for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}  # fmt: skip
    core = {"classifier", "layers", "loading.official", "io", "base", "config", "config_utils", "spec", "_registry"}
    assert imported - {"__future__", "dataclasses", "collections.abc", "typing", "torch"} <= core, imported
