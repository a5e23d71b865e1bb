"""SimDINOv2's and DINOv2's ViT checkpoints against the authors' model code (``tests/official/dinov2_vit.py``,
SimDINO's ``simdinov2/models/vision_transformer.py`` and its layers): the same random weights, in the containers the
authors' code writes and read by ``ct.from_official``, give the same class token, register tokens and patch tokens
after the last norm (float64 1e-12, float32 1e-5), at the training size and at other grids (the table resized as
DINOv2 resizes it: antialiased, to the size); the registered sizes have the authors' factories' parameter counts; bad
files are one line; the zoo lists the entries, and DINOv2's direct links are found in torch's hub cache."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from official import dinov2_vit
from torch import nn

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.loading import pretrained
from crate_transformer.models.base import pool_tokens
from crate_transformer.models.classifier import ViT
from crate_transformer.models.image_input import bicubic_matrix

# SimDINOv2's layout (simdino_config.yaml over ssl_default_config.yaml) at a tiny width: 4 registers, LayerScale 0.1,
# the antialiased resize to the size, the blocks chunked (block_chunks: blocks.C.N keys), the nested block its training
# builds (NestedTensorBlock with MemEffAttention: Attention's path without xFormers)
TINY = dict(img_size=224, embed_dim=48, depth=2, num_heads=4, mlp_ratio=4, block_fn=dinov2_vit.get_block_fn("nested"))
SIMDINOV2 = dict(
    TINY, patch_size=16, layerscale=0.1, num_register_tokens=4, interpolate_antialias=True, interpolate_offset=0.0
)
SIMDINOV2["block_chunks"] = 2
# DINOv2's released backbones without registers (simdinov2/hub/backbones.py): patch 14, LayerScale 1.0, DINO's resize,
# the blocks not chunked
DINOV2 = dict(TINY, patch_size=14, layerscale=1.0, interpolate_antialias=False, interpolate_offset=0.1, block_chunks=0)


def _theirs(layout: dict, seed: int = 0, **changes) -> dinov2_vit.DinoVisionTransformer:
    """The authors' ViT with every parameter random (LayerScale's γ, the registers and the norms too)."""
    model = dinov2_vit.DinoVisionTransformer(**{**layout, **changes})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 0.2))
    return model.eval()


class _ResizedInItsDtype(nn.Parameter):
    """The authors' position table, whose ``.float()`` keeps a float64 table float64: their
    ``interpolate_pos_encoding`` resizes ``self.pos_embed.float()``, in float32 whatever the model's dtype, so in
    float64 the resize would differ from an exact one by float32's rounding (1e-8).  The rest of their code runs as
    written; in float32 ``.float()`` is the identity and the table is theirs as is."""

    def float(self) -> torch.Tensor:
        return self


def _float64(theirs: nn.Module) -> nn.Module:
    theirs = theirs.double()
    theirs.pos_embed = _ResizedInItsDtype(theirs.pos_embed.detach())
    return theirs


def _teacher_checkpoint(path, teacher: nn.Module, seed: int = 5) -> None:
    """What ``simdinov2/train/train.py``'s ``do_test`` writes: ``{'teacher': state}`` of the teacher's
    ``ModuleDict(backbone=, dino_head=, ibot_head=)`` (the heads here: two Linears standing in for DINOHead)."""
    g = torch.Generator().manual_seed(seed)
    heads = {f"{h}.mlp.0.weight": torch.randn(32, 48, generator=g) for h in ("dino_head", "ibot_head")}
    torch.save({"teacher": {**{f"backbone.{k}": v for k, v in teacher.state_dict().items()}, **heads}}, path)


def _check_features(ours: nn.Module, theirs: nn.Module, x: torch.Tensor, tol: float, registers: int) -> None:
    """The class token (``model(x)``: DINOv2's ``head(x_norm_clstoken)``), the register and patch tokens after the
    last norm (``forward_features``), and each block's normalised patch tokens with its class token
    (``get_intermediate_layers(x, 2, return_class_token=True)``)."""
    want = theirs.forward_features(x)
    got = ours.forward_features(x)
    torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)
    torch.testing.assert_close(got[:, 0], want["x_norm_clstoken"], rtol=tol, atol=tol)
    torch.testing.assert_close(got[:, 1 : 1 + registers], want["x_norm_regtokens"], rtol=tol, atol=tol)
    torch.testing.assert_close(got[:, 1 + registers :], want["x_norm_patchtokens"], rtol=tol, atol=tol)
    taken = dict(norm=True, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)
    mine = ours.forward_intermediates(x, [0, 1], **taken)
    for (patches, prefix), (p_want, cls_want) in zip(
        mine, theirs.get_intermediate_layers(x, 2, return_class_token=True)
    ):
        torch.testing.assert_close(patches, p_want, rtol=tol, atol=tol)
        torch.testing.assert_close(prefix[:, 0], cls_want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_a_simdinov2_teacher_checkpoint_gives_the_authors_tokens(tmp_path, dtype, tol):
    theirs = _theirs(SIMDINOV2)
    _teacher_checkpoint(tmp_path / "teacher_checkpoint.pth", theirs)
    ours = ct.from_official(tmp_path / "teacher_checkpoint.pth", "simdinov2_vitb16", heads=4).to(dtype)
    theirs = _float64(theirs) if dtype == torch.float64 else theirs
    assert type(ours) is ViT and not ours.training
    c = ours.config
    assert (c.dim, c.depth, c.heads, c.patch_size, c.image_size, c.num_classes) == (48, 2, 4, 16, 224, 0)
    assert (c.registers, c.layer_scale_init, c.interpolate_antialias, c.interpolate_offset) == (4, 0.1, True, 0.0)
    assert (c.final_norm, c.norm_eps) == ("tokens", 1e-6) and ours.num_prefix_tokens == 5
    assert ours.num_params() == sum(p.numel() for p in theirs.parameters()) - theirs.mask_token.numel()
    with torch.no_grad():
        for shape in [(2, 3, 224, 224), (2, 3, 160, 128), (1, 3, 288, 256), (1, 3, 64, 240)]:  # shrunk, grown, mixed
            _check_features(ours, theirs, torch.randn(*shape, dtype=dtype), tol, registers=4)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_a_dinov2_backbone_without_registers_gives_the_authors_tokens(tmp_path, dtype, tol):
    """DINOv2's released layout (``dinov2_vits14_pretrain.pth``: the bare state dict, blocks not chunked): LayerScale,
    no registers, DINO's resize (offset 0.1, no antialiasing), as ``_make_dinov2_model`` builds it."""
    theirs = _theirs(DINOV2)
    torch.save(theirs.state_dict(), tmp_path / "dinov2_vits14_pretrain.pth")
    ours = ct.from_official(tmp_path / "dinov2_vits14_pretrain.pth", "dinov2_vits14", heads=4).to(dtype)
    theirs = _float64(theirs) if dtype == torch.float64 else theirs
    c = ours.config
    assert (c.patch_size, c.image_size, c.registers, c.layer_scale_init) == (14, 224, 0, 1.0)
    assert (c.interpolate_antialias, c.interpolate_offset) == (False, 0.1) and ours.num_prefix_tokens == 1
    with torch.no_grad():
        for shape in [(2, 3, 224, 224), (2, 3, 140, 168), (1, 3, 308, 252)]:
            _check_features(ours, theirs, torch.randn(*shape, dtype=dtype), tol, registers=0)


def test_the_antialiasing_is_what_makes_other_grids_agree():
    """Without DINOv2's antialiasing, a grid smaller and a grid larger than the table's differ from the authors' (the
    option is the difference, not a rounding: PyTorch's antialiased bicubic is PIL's cubic, a = -0.5, where plain
    bicubic's is -0.75; widened where the grid shrinks), and at the table's own grid nothing is resized."""
    theirs = _float64(_theirs(SIMDINOV2))
    plain = ct.from_official(_theirs(SIMDINOV2).state_dict(), "simdinov2_vitb16", heads=4, interpolate_antialias=False)
    plain = plain.double()
    with torch.no_grad():
        small, big = torch.randn(1, 3, 160, 128, dtype=torch.float64), torch.randn(1, 3, 288, 256, dtype=torch.float64)
        assert (plain(small) - theirs(small)).abs().max() > 1e-4 and (plain(big) - theirs(big)).abs().max() > 1e-6
        x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
        torch.testing.assert_close(plain(x), theirs(x), rtol=1e-12, atol=1e-12)


def test_bicubic_matrix_is_pytorchs_antialiased_resize_along_each_axis():
    """The separable matrices give ``F.interpolate(..., antialias=True)``'s 2-D resize, shrinking and growing, to the
    size and by DINO's scale factor (grids of width 2 and more: PyTorch's antialiased kernel resizes a grid one
    sample wide differently from the same grid transposed)."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(1, 5, 14, 14, generator=g, dtype=torch.float64)
    for h, w, offset in [(10, 8, 0.0), (20, 9, 0.0), (3, 2, 0.0), (9, 17, 0.1), (14, 6, 0.1)]:
        how = dict(scale_factor=((h + offset) / 14, (w + offset) / 14)) if offset else dict(size=(h, w))
        want = F.interpolate(table, mode="bicubic", antialias=True, **how)[0]
        rows, cols = (bicubic_matrix(14, n, offset=offset, dtype=torch.float64, antialias=True) for n in (h, w))
        torch.testing.assert_close(torch.einsum("ia,cab,jb->cij", rows, table[0], cols), want, rtol=1e-12, atol=1e-12)
        plain = bicubic_matrix(14, h, offset=offset, dtype=torch.float64)
        assert (plain - rows).abs().max() > 1e-3  # another kernel, shrinking or growing


def test_dinov2s_full_training_state_loads_its_teacher(tmp_path):
    """DINOv2's fvcore checkpoint: ``{'model': SSLMetaArch.state_dict(), 'optimizer', 'iteration'}``, keys
    ``student.backbone.*`` and ``teacher.backbone.*`` beside their heads: the teacher is read."""
    teacher, student = _theirs(SIMDINOV2, seed=1), _theirs(SIMDINOV2, seed=2)
    state = {}
    for who, model in (("teacher", teacher), ("student", student)):
        state.update({f"{who}.backbone.{k}": v for k, v in model.state_dict().items()})
    state["student.dino_head.mlp.0.weight"] = torch.zeros(32, 48)
    torch.save({"model": state, "optimizer": {}, "iteration": 24999}, tmp_path / "model_0024999.rank_0.pth")
    ours = ct.from_official(tmp_path / "model_0024999.rank_0.pth", "simdinov2_vitb16", heads=4).double()
    x = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), _float64(teacher)(x), rtol=1e-12, atol=1e-12)
        assert (ours(x) - student.double()(x)).abs().max() > 1e-3  # the teacher, not the student


def test_the_registered_sizes_are_the_authors_factories():
    """simdinov2_vitb16 / vitl16 and the SimDINO authors' DINOv2 baselines have the parameter counts of the
    transcribed vit_base / vit_large with 4 registers and LayerScale (the SimDINO README's 86 M and 300 M), DINOv2's
    released backbones those of ``_make_dinov2_model``'s (patch 14, the table for 518): both built on the meta
    device, ``mask_token`` (read in training only, dropped by the loader) left out."""
    base, large = dinov2_vit.vit_base, dinov2_vit.vit_large
    for name, factory, readme in [
        ("simdinov2_vitb16", base, 86e6),
        ("simdinov2_vitl16", large, 300e6),
        ("simdino_dinov2_vitb16", base, 86e6),
        ("simdino_dinov2_vitl16", large, 300e6),
        ("dinov2_vits14", dinov2_vit.vit_small, None),  # SimDINO's README states no size for Meta's backbones
        ("dinov2_vitb14_reg", base, None),
        ("dinov2_vitl14", large, None),
        ("dinov2_vitl14_reg", large, None),
    ]:
        c = ct.model_config(name)
        sizes = dict(img_size=c.image_size, patch_size=c.patch_size, num_register_tokens=c.registers)
        with torch.device("meta"):
            ours = ct.create_model(name).num_params()
            # drop_path_uniform (ssl_default_config.yaml's): no torch.linspace(...).item(), which the meta device
            # cannot give; the parameters are the same
            theirs = factory(**sizes, layerscale=c.layer_scale_init, block="base", drop_path_uniform=True)
        assert ours == sum(p.numel() for p in theirs.parameters()) - theirs.mask_token.numel(), name
        assert readme is None or abs(ours - readme) / readme < 0.035, (name, ours)  # the README rounds (86 M, 300 M)


def _refused(path, name: str = "simdinov2_vitb16", **kw) -> str:
    with pytest.raises(CheckpointError) as e:
        ct.from_official(path, name, **kw)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg, msg
    return msg


def test_bad_files_are_one_line_naming_the_problem_and_the_fix(tmp_path):
    state = _theirs(SIMDINOV2).state_dict()
    torch.save(state, tmp_path / "v2.pth")
    msg = _refused(tmp_path / "v2.pth", "dino_vits16", heads=4)  # LayerScale in the file, none in the name
    assert "has LayerScale (blocks.N.ls1.gamma / ls2.gamma)" in msg and "pass layer_scale_init=" in msg
    assert ct.from_official(tmp_path / "v2.pth", "dino_vits16", heads=4, layer_scale_init=0.1).config.registers == 4
    swiglu = {k.replace("mlp.fc1.", "mlp.w12."): v for k, v in state.items()}  # ViT-g/14's SwiGLUFFNFused
    torch.save(swiglu, tmp_path / "vitg.pth")
    assert "a SwiGLU MLP (blocks.N.mlp.w12 / w3" in _refused(tmp_path / "vitg.pth", heads=4)
    torch.save(dict(state, register_tokens=torch.zeros(1, 4, 32)), tmp_path / "narrow.pth")
    assert "register_tokens (1, 4, 32) are not (1, R, 48)" in _refused(tmp_path / "narrow.pth", heads=4)
    assert "does not store heads" in _refused(tmp_path / "v2.pth")  # width 48 is not simdinov2_vitb16's 768
    plain = _theirs(SIMDINOV2, layerscale=None).state_dict()  # no LayerScale: the layout fixes none
    torch.save(plain, tmp_path / "plain.pth")
    msg = _refused(tmp_path / "plain.pth", heads=4, layer_scale_init=0.1)
    assert "disagrees with the given overrides: layer_scale_init=0.1 (checkpoint: None)" in msg
    assert ct.from_official(tmp_path / "plain.pth", "simdinov2_vitb16", heads=4).config.layer_scale_init is None


def test_the_dinov2_options_apply_to_the_vit_only_and_default_to_none():
    for option, value in (("registers", 4), ("layer_scale_init", 0.1), ("interpolate_antialias", True)):
        with pytest.raises(ValueError, match=rf"^{option} applies only when arch is vit; arch is crate"):
            ct.create_model("crate_tiny", **{option: value})
    vit = ct.create_model("vit_tiny", depth=1)
    assert vit.register_tokens is None and vit.layers[0].gamma1 is None and vit.num_prefix_tokens == 1
    assert not {"registers", "layer_scale_init", "interpolate_antialias"} & set(vit.config.to_dict())


def test_avg_pooling_and_the_prefix_read_the_patches_after_the_registers():
    model = ct.create_model("vit_tiny", dim=32, heads=2, depth=1, image_size=32, patch_size=8, registers=3, pool="avg")
    assert "register_tokens" in model.no_weight_decay()
    z = model.forward_features(torch.randn(2, 3, 32, 32))
    assert z.shape == (2, 1 + 3 + 16, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.pool(z), z[:, 4:].mean(1))
        assert (pool_tokens(z, "avg") - model.pool(z)).abs().max() > 1e-6  # the registers left out
    taken = dict(output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)
    patches, prefix = model.forward_intermediates(torch.randn(2, 3, 32, 32), [0], **taken)[0]
    assert patches.shape == (2, 16, 32) and prefix.shape == (2, 4, 32)


def test_the_zoo_lists_the_simdinov2_entries():
    """``crate models --pretrained 'simdinov2*'`` in a fresh process: both entries, to be fetched by hand (Drive view
    links), stated so; DINOv2's backbones are direct links."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "crate_transformer.cli", "models", "--pretrained", "simdinov2*"]
    lines = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    at = lines[0].index("status")  # the columns are padded to a common width
    rows = {line.split()[0]: line[at:].split()[0] for line in lines[1:3]}
    assert rows == {"simdinov2_vitb16": "manual", "simdinov2_vitl16": "manual"}
    assert "load it with create_model('simdinov2_vitl16', pretrained_file=PATH)" in lines[-1]
    assert ct.list_pretrained("simdino_dinov2*") == ["simdino_dinov2_vitb16", "simdino_dinov2_vitl16"]
    drives = {
        "simdinov2_vitb16": "1g_f3aEFdfiKCn8IH11Y4FwtEDu1pPbQv",
        "simdinov2_vitl16": "1IotEWszh1chGtzwl8X_ul6j3ACT7Tn6i",
    }
    for name, drive in drives.items():
        entry = pretrained.ZOO[name]
        assert entry.url.split("/")[5] == drive and not entry.direct and entry.size == "not stated"
    reg = pretrained.ZOO["dinov2_vitb14_reg"]
    assert (
        reg.direct and reg.url == "https://dl.fbaipublicfiles.com/dinov2/dinov2_vitb14/dinov2_vitb14_reg4_pretrain.pth"
    )


def test_a_dinov2_direct_link_in_torchs_hub_cache_loads_offline(tmp_path, monkeypatch):
    """A file torch.hub fetched for ``dinov2_vits14_reg`` lies in torch's hub cache under the link's name: found."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    cache = tmp_path / "torch" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    theirs = _theirs(dict(SIMDINOV2, patch_size=14, layerscale=1.0, block_chunks=0))
    torch.save(theirs.state_dict(), cache / "dinov2_vits14_reg4_pretrain.pth")
    assert pretrained.cache_status("dinov2_vits14_reg") == ("cached", str(cache / "dinov2_vits14_reg4_pretrain.pth"))
    model = ct.create_model("dinov2_vits14_reg", pretrained=True, heads=4)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert model.config.registers == 4 and model.pretrained_cfg["interpolation"] == "bicubic"
