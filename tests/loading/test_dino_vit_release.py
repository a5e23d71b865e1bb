"""DINO's and SimDINO's ViT checkpoints against the authors' model code (``tests/official/dino_vit.py``, DINO's
``vision_transformer.py`` and ``MultiCropWrapper``): the same random weights, in the containers the authors' code
writes and read by ``ct.from_official``, give the same class-token and patch-token features (float64 1e-12, float32
1e-5), at the training size and at others (the position table resized as DINO resizes it); the registered sizes have
the authors' factories' parameter counts; bad files are one line; the zoo's direct links download into torch's hub
cache and are reported honestly offline."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from official import dino_vit
from torch import nn

import crate_transformer as ct
from crate_transformer.io import CheckpointError, load_pickle
from crate_transformer.loading import pretrained
from crate_transformer.loading.official import dino_vit_to_native, unwrap
from crate_transformer.models.classifier import ViT

SMALL = dict(img_size=[32], embed_dim=48, depth=2, num_heads=4, mlp_ratio=4, qkv_bias=True)


def _randomise(model: nn.Module, seed: int = 0) -> None:
    """Every parameter random (the initial LayerNorms and biases are too regular to catch a swapped key)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() < 2 else 0.2))


def _theirs(patch: int = 8, seed: int = 0, **changes) -> dino_vit.VisionTransformer:
    """A small ``VisionTransformer`` as DINO's ``vit_small`` factory builds it (qkv bias, LayerNorm eps 1e-6)."""
    kw = {**SMALL, "patch_size": patch, "norm_layer": partial(nn.LayerNorm, eps=1e-6), **changes}
    model = dino_vit.VisionTransformer(**kw)
    _randomise(model, seed)
    return model.eval()


@pytest.mark.parametrize("patch", [8, 16])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_a_released_backbone_gives_the_authors_features(tmp_path, patch, dtype, tol):
    theirs = _theirs(patch).to(dtype)
    torch.save(theirs.state_dict(), tmp_path / "dino_deitsmall16_pretrain.pth")  # what hubconf.py's links serve
    ours = ct.from_official(tmp_path / "dino_deitsmall16_pretrain.pth", "dino_vits16", heads=4).to(dtype)
    assert type(ours) is ViT and not ours.training
    c = ours.config
    assert (c.dim, c.depth, c.heads, c.patch_size, c.image_size, c.num_classes) == (48, 2, 4, patch, 32, 0)
    assert (c.final_norm, c.norm_eps, c.interpolate_offset) == ("tokens", 1e-6, 0.1)
    assert ours.num_params() == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(3, 3, 32, 32, dtype=dtype)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)  # the class token after the last norm
        # every token (class and patches) after the last norm: DINO's get_intermediate_layers
        torch.testing.assert_close(
            ours.forward_features(x), theirs.get_intermediate_layers(x, 1)[0], rtol=tol, atol=tol
        )
        mine = ours.forward_intermediates(x, [0, 1], norm=True, output_fmt="NLC", intermediates_only=True)
        for got, want in zip(mine, theirs.get_intermediate_layers(x, 2)):
            torch.testing.assert_close(got, want[:, 1:], rtol=tol, atol=tol)  # each block's patch tokens, normed
        for shape in [(2, 3, 48, 64), (2, 3, 2 * patch, 5 * patch)]:  # other grids: DINO's (h + 0.1) / grid resize
            big = torch.randn(*shape, dtype=dtype)
            torch.testing.assert_close(ours(big), theirs(big), rtol=tol, atol=tol)


def test_the_resize_offset_is_what_makes_other_sizes_agree(tmp_path):
    """Without DINO's offset (resizing to the size, the package's default) the features at another size differ:
    the option is the difference, not a rounding."""
    theirs = _theirs(8).double()
    state = theirs.state_dict()
    plain = ct.from_official(state, "dino_vits16", heads=4, interpolate_offset=0.0).double()
    big = torch.randn(2, 3, 48, 64, dtype=torch.float64)
    with torch.no_grad():
        assert (plain(big) - theirs(big)).abs().max() > 1e-6
        x = torch.randn(2, 3, 32, 32, dtype=torch.float64)  # at the training size nothing is resized
        torch.testing.assert_close(plain(x), theirs(x), rtol=1e-12, atol=1e-12)


def _training_checkpoint(path: Path, teacher: nn.Module, student: nn.Module, compiled: bool) -> Path:
    """What main_dino.py saves: ``MultiCropWrapper(backbone, DINOHead)`` for both, the student under
    DistributedDataParallel (``module.``), both under ``torch.compile`` (``_orig_mod.``, SimDINO's default)."""
    t = dino_vit.MultiCropWrapper(teacher, dino_vit.DINOHead(48, 64, hidden_dim=32, bottleneck_dim=16))
    s = dino_vit.MultiCropWrapper(student, dino_vit.DINOHead(48, 64, hidden_dim=32, bottleneck_dim=16))
    compile_prefix = "_orig_mod." if compiled else ""
    args = argparse.Namespace(arch="vit_small", patch_size=8, out_dim=64, compile=compiled, lr=5e-4)
    payload = {
        "student": {f"{compile_prefix}module.{k}": v for k, v in s.state_dict().items()},
        "teacher": {f"{compile_prefix}{k}": v for k, v in t.state_dict().items()},
        "optimizer": torch.optim.AdamW(s.parameters(), lr=1e-3).state_dict(),
        "epoch": 100,
        "args": args,
        "dino_loss": {"center": torch.zeros(1, 64)},
    }
    torch.save(payload, path)
    return path


@pytest.mark.parametrize("compiled", [False, True], ids=["dino-full-checkpoint", "simdino-compiled"])
def test_a_training_checkpoint_loads_its_teacher(tmp_path, compiled):
    teacher, student = _theirs(8, seed=1), _theirs(8, seed=2)
    path = _training_checkpoint(tmp_path / "checkpoint.pth", teacher, student, compiled)
    ours = ct.from_official(path, "simdino_vitb16", heads=4).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), teacher.double()(x), rtol=1e-12, atol=1e-12)
        assert (ours(x) - student.double()(x)).abs().max() > 1e-3  # the teacher, not the student
    native = dino_vit_to_native(unwrap(load_pickle(path)))  # the package's safe reader (Namespace allowed)
    assert set(native) == set(ours.state_dict())  # the projection head (head.mlp.*, head.last_layer.*) dropped


def test_a_fresh_head_keeps_the_backbone_and_its_last_norm(tmp_path):
    theirs = _theirs(8).double()
    torch.save(theirs.state_dict(), tmp_path / "b.pth")
    model = ct.create_model("dino_vits16", pretrained_file=tmp_path / "b.pth", heads=4, num_classes=5).double()
    assert model.config.num_classes == 5 and isinstance(model.head[0], nn.Identity)
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        features = model.forward_head(model.forward_features(x), pre_logits=True)
        torch.testing.assert_close(features, theirs(x), rtol=1e-12, atol=1e-12)
        assert model(x).shape == (2, 5)
        model.reset_classifier(3)  # timm's: a new Linear, DINO's norm kept
        torch.testing.assert_close(model.forward_head(model.forward_features(x), pre_logits=True), theirs(x))


def _official_count(depth: int, **kw) -> int:
    """The parameter count of DINO's VisionTransformer at ``depth`` blocks, from the authors' code built with one
    and two blocks (each block has the same parameters; building the full models would take gigabytes)."""
    one, two = (sum(p.numel() for p in dino_vit.VisionTransformer(depth=d, **kw).parameters()) for d in (1, 2))
    return one + (depth - 1) * (two - one)


def test_the_registered_sizes_are_the_authors_factories():
    """dino_vits16 … dino_vitb8 have the parameter counts of DINO's vit_small / vit_base factories (about the
    README's 21M and 85M); simdino_vitl16 the standard ViT-L/16 (the SimDINO README's 300 M)."""
    small, base = dict(embed_dim=384, num_heads=6), dict(embed_dim=768, num_heads=12)
    for name, sizes, patch, depth, readme in [
        ("dino_vits16", small, 16, 12, 21e6),
        ("dino_vits8", small, 8, 12, 21e6),
        ("dino_vitb16", base, 16, 12, 85e6),
        ("dino_vitb8", base, 8, 12, 85e6),
        ("simdino_vitb16", base, 16, 12, 86e6),
        ("simdino_vitl16", dict(embed_dim=1024, num_heads=16), 16, 24, 300e6),
    ]:
        with torch.device("meta"):
            ours = ct.create_model(name).num_params()
        assert ours == _official_count(depth, patch_size=patch, qkv_bias=True, **sizes), name
        assert abs(ours - readme) / readme < 0.035, (name, ours)  # the READMEs round to the million


def test_bad_files_are_one_line_naming_the_file(tmp_path):
    def refused(path, name="dino_vits16", **kw) -> str:
        with pytest.raises(CheckpointError) as e:
            ct.from_official(path, name, **kw)
        msg = str(e.value)
        assert "\n" not in msg and str(path) in msg, msg
        return msg

    text = tmp_path / "dino_vits16.pth"
    text.write_text("<html>Google Drive can't scan this file for viruses</html>")
    assert "a text file (an HTML error page" in refused(text)
    torch.save(_theirs(8).state_dict(), tmp_path / "full.pth")
    cut = tmp_path / "cut.pth"
    cut.write_bytes((tmp_path / "full.pth").read_bytes()[:5000])
    assert "truncated or corrupt" in refused(cut)
    assert "does not store heads" in refused(tmp_path / "full.pth")  # width 48 is not dino_vits16's 384
    crate = ct.create_model("crate_small", dim=48, heads=4, depth=1, image_size=32, patch_size=8)
    torch.save({f"to_patch_embedding.{k}": v for k, v in crate.state_dict().items()}, tmp_path / "crate.pth")
    msg = refused(tmp_path / "crate.pth", heads=4)
    assert "is not a DINO ViT checkpoint" in msg and "e.g. crate_small" in msg
    msg = refused(tmp_path / "full.pth", "crate_small", heads=4)
    assert "is not a CRATE classifier checkpoint" in msg and "it is a DINO ViT checkpoint" in msg
    v2 = dict(_theirs(8).state_dict(), **{"blocks.0.ls1.gamma": torch.ones(48), "blocks.0.ls2.gamma": torch.ones(48)})
    torch.save({"teacher": {f"backbone.{k}": v for k, v in v2.items()}}, tmp_path / "v2.pth")
    assert "has LayerScale (blocks.N.ls1.gamma / ls2.gamma)" in refused(tmp_path / "v2.pth", heads=4)
    unbiased = _theirs(8, qkv_bias=False)
    torch.save(unbiased.state_dict(), tmp_path / "nobias.pth")
    assert "no qkv bias" in refused(tmp_path / "nobias.pth", heads=4)


def test_dino_v2s_chunked_blocks_and_mask_token_load_without_layer_scale_or_registers(tmp_path):
    """DINOv2's layout with LayerScale and registers off (SimDINO's simdinov2/configs/eval/vitl16_v1.yaml) is DINO's
    computation: its ``blocks.C.N.`` keys (``block_chunks``) and its training-only ``mask_token`` are mapped and
    dropped as its own ``load_pretrained_weights`` does."""
    theirs = _theirs(8).double()
    chunked = {k.replace("blocks.1.", "blocks.1.1.").replace("blocks.0.", "blocks.0.0."): v
               for k, v in theirs.state_dict().items()}  # fmt: skip
    chunked["mask_token"] = torch.zeros(1, 48, dtype=torch.float64)
    torch.save({"teacher": {f"backbone.{k}": v for k, v in chunked.items()}}, tmp_path / "v2.pth")
    ours = ct.from_official(tmp_path / "v2.pth", "simdino_vitl16", heads=4).double()
    x = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)


def test_the_dino_options_apply_to_the_vit_only():
    for option, value in (("final_norm", "tokens"), ("norm_eps", 1e-6), ("interpolate_offset", 0.1)):
        with pytest.raises(ValueError, match=rf"^{option} applies only when arch is vit; arch is crate"):
            ct.create_model("crate_tiny", **{option: value})


# --------------------------------------------------------------------------- the zoo's direct links
@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    """torch's hub cache in a fresh folder (TORCH_HOME), the package offline (HF_HUB_OFFLINE=1, conftest's)."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    return tmp_path / "torch" / "hub" / "checkpoints"


def _tiny_release(path: Path) -> tuple[nn.Module, Path]:
    theirs = _theirs(16)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(theirs.state_dict(), path)
    return theirs, path


def test_a_direct_link_offline_and_not_cached_is_one_line(torch_home):
    assert pretrained.cache_status("dino_vits16") == ("download", "")
    with pytest.raises(CheckpointError) as e:
        ct.create_model("dino_vits16", pretrained=True)
    msg = str(e.value)
    assert "\n" not in msg and "HF_HUB_OFFLINE=1" in msg and str(torch_home) in msg
    assert pretrained.ZOO["dino_vits16"].url in msg and "pretrained_file='PATH'" in msg
    answers = pretrained.probe_sources("dino_vits16")
    assert answers[0].address == "torch's hub cache" and not answers[0].answered
    assert all(not a.answered and "not tried: offline" in a.detail for a in answers[1:])


def test_a_direct_link_in_torchs_hub_cache_loads_offline(torch_home):
    """A file torch.hub.load('facebookresearch/dino:main', 'dino_vits16') fetched lies in torch's hub cache under
    the link's name: the zoo finds it there."""
    theirs, f = _tiny_release(torch_home / "dino_deitsmall16_pretrain.pth")
    assert pretrained.cache_status("dino_vits16") == ("cached", str(f))
    model = ct.create_model("dino_vits16", pretrained=True, heads=4)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert model.pretrained_cfg["file"] == str(f) and model.pretrained_cfg["interpolation"] == "bicubic"
    assert ct.resolve_data_config(model)["crop_pct"] == 0.875
    assert pretrained.probe_sources("dino_vits16")[0].answered


def test_a_direct_link_downloads_into_torchs_hub_cache_and_a_bad_checksum_is_one_line(
    torch_home, tmp_path, monkeypatch
):
    """The download itself, from a file:// link (torch.hub's downloader reads it as it reads https://)."""
    theirs, served = _tiny_release(tmp_path / "served" / "dino_deitsmall16_pretrain.pth")
    entry = dataclasses.replace(pretrained.ZOO["dino_vits16"], url=served.as_uri())
    monkeypatch.setitem(pretrained.ZOO, "dino_vits16", entry)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    path = pretrained.download("dino_vits16")
    assert path == torch_home / "dino_deitsmall16_pretrain.pth" and path.read_bytes() == served.read_bytes()
    monkeypatch.setitem(pretrained.ZOO, "dino_vits16", dataclasses.replace(entry, sha256="0" * 64))
    status, detail = pretrained.cache_status("dino_vits16")
    assert status == "corrupt" and "\n" not in detail and str(path) in detail and "force_download=True" in detail
    gone = dataclasses.replace(entry, url=(tmp_path / "nowhere.pth").as_uri())
    monkeypatch.setitem(pretrained.ZOO, "dino_vits16", gone)
    path.unlink()
    with pytest.raises(CheckpointError, match=r"^dino_vits16: downloading file://.*nowhere\.pth failed \(") as e:
        pretrained.download("dino_vits16")
    assert "\n" not in str(e.value) and "pretrained_file='PATH'" in str(e.value)


def test_the_cli_check_reports_the_dino_and_simdino_entries_honestly_offline(tmp_path):
    """``crate models --pretrained 'd*' --check`` offline in a fresh process: nothing is asked of the network, the
    empty torch hub cache and each link are named as not answering, and what is known (no checksum; for SimDINO no
    size or file name) is said with the pretrained_file= fix."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_HOME": str(tmp_path / "torch")}
    out = subprocess.run(
        [sys.executable, "-m", "crate_transformer.cli", "models", "--pretrained", "*dino_vit[bs]16", "--check"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["dino_vitb16", "dino_vits16", "simdino_dino_vitb16"]
    dino = next(line for line in lines if line.startswith("dino_vits16: no answer from"))
    assert "torch's hub cache: not cached (download)" in dino
    assert f"{pretrained.ZOO['dino_vits16'].url}: not tried: offline (HF_HUB_OFFLINE=1)" in dino
    fix = next(line for line in lines if line.startswith("dino_vits16: none of its sources answered"))
    assert "no checksum is published" in fix and "create_model('dino_vits16', pretrained=True, pretrained_file=" in fix
    simdino = next(line for line in lines if line.startswith("simdino_dino_vitb16: none of its sources answered"))
    assert "no direct URL, file name, size or checksum is published" in simdino and "(size not stated)" in simdino
