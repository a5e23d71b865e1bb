"""timm's backbone contract, as a timm user types it: timm's ``create_model`` arguments, ``num_features``,
``reset_classifier(0)``, ``forward_intermediates``, ``group_matcher`` (checked with timm's own grouping code,
transcribed in tests/official/timm_manipulate.py), and pretrained loading with a new head — the backbone loaded,
a fresh classifier, one logged line — from the authors' files, ``save_pretrained`` folders and training runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import tiny
import torch
from official.timm_manipulate import group_parameters
from test_pretrained import official_tiny_file

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.train.optim import layer_id

# one small model of every image family, built from its registered name
IMAGE_FAMILIES = {
    "crate_mnist": dict(depth=3),
    "vit_mnist": dict(depth=3),
    "crate_alpha_mnist": dict(depth=3),
    "tost_mnist": dict(depth=3),
    "crate_mae_mnist": dict(depth=3),
}


def _images(model: ct.Model, n: int = 2) -> torch.Tensor:
    c = model.config
    return torch.randn(n, c.in_chans, c.image_size, c.image_size)


# --------------------------------------------------------------------------- create_model with timm's names
def test_create_model_takes_timms_names_as_the_configs_fields() -> None:
    timm = ct.create_model("crate_mnist", img_size=35, drop_path_rate=0.1, drop_rate=0.05, global_pool="avg")
    ours = ct.create_model("crate_mnist", image_size=35, drop_path=0.1, dropout=0.05, pool="avg")
    assert timm.config == ours.config
    assert ct.create_model("crate_mnist", global_pool="token").config.pool == "cls"
    assert [layer.drop_path.p for layer in timm.layers][-1] == pytest.approx(0.1)  # stochastic depth is on
    with pytest.raises(ValueError, match="^img_size and image_size name the same option; pass one of them$"):
        ct.create_model("crate_mnist", img_size=28, image_size=28)
    with pytest.raises(ValueError, match=r"^unknown pooling 'max'; choose one of \('cls', 'mean', 'avg'\)"):
        ct.create_model("crate_mnist", global_pool="max")


@pytest.mark.parametrize("name", ["crate_mnist", "vit_mnist", "crate_alpha_mnist", "tost_mnist"])
def test_reset_classifier_0_is_a_headless_model_of_num_features(name: str, tmp_path: Path) -> None:
    model = ct.create_model(name, depth=2).eval()
    x = _images(model)
    with torch.no_grad():
        pre_logits = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(0)
        out = model(x)
    assert model.num_features == model.config.dim and out.shape == (2, model.num_features)
    torch.testing.assert_close(out, pre_logits)  # what a timm backbone returns: the features before the classifier
    assert not any(p.numel() for p in model.get_classifier().parameters())
    back = ct.from_pretrained(model.save_pretrained(tmp_path / "headless")).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(x), out)
    headless = ct.create_model(name, depth=2, num_classes=0)
    assert headless.config.num_classes == 0 and headless(x).shape == (2, model.num_features)
    with pytest.raises(ValueError, match="num_classes must be a non-negative integer"):
        ct.create_model(name, num_classes=-1)


# --------------------------------------------------------------------------- forward_intermediates
@pytest.mark.parametrize("name", IMAGE_FAMILIES)
def test_forward_intermediates_are_the_layers_tokens_as_maps(name: str) -> None:
    """Each intermediate is that layer's output in ``forward_trace`` (computed separately), patches as
    ``(b, d, h, w)`` maps, the class token beside them on request; the final tokens are ``forward_features``."""
    model = ct.create_model(name, **IMAGE_FAMILIES[name]).eval()
    x = _images(model)
    with torch.no_grad():
        trace = model.forward_trace(x).tokens[1:]
        final, maps = model.forward_intermediates(x)
        features = model.forward_features(x)
        last_two = model.forward_intermediates(x, indices=2, output_fmt="NLC", intermediates_only=True)
        picked = model.forward_intermediates(x, indices=[0, -1], return_prefix_tokens=True, intermediates_only=True)
        early = model.forward_intermediates(x, indices=[0], stop_early=True, intermediates_only=True)
        normed = model.forward_intermediates(x, indices=[-1], norm=True, intermediates_only=True, output_fmt="NLC")
    prefix, (h, w) = model.trace_prefix_tokens, model.patch_grid(x)
    torch.testing.assert_close(final, features)
    assert len(maps) == len(model.layers) == 3
    for m, t in zip(maps, trace):
        assert m.shape == (2, model.num_features, h, w)
        torch.testing.assert_close(m.flatten(2).transpose(1, 2), t[:, prefix:])  # row-major patch order
    torch.testing.assert_close(last_two[0], trace[1][:, prefix:])
    assert [p[1].shape[1] for p in picked] == [prefix, prefix]
    torch.testing.assert_close(picked[1][1], trace[2][:, :prefix])
    torch.testing.assert_close(early[0], maps[0])
    torch.testing.assert_close(normed[0], model.norm_tokens(trace[2])[:, prefix:])
    with pytest.raises(ValueError, match="layer index 3 does not exist in a model of 3 layers; pass 0..2"):
        model.forward_intermediates(x, indices=[3])
    with pytest.raises(ValueError, match="indices=4 asks for the last 4 layers of 3; pass 1..3"):
        model.forward_intermediates(x, indices=4)


def test_the_norm_of_intermediates_is_the_familys_final_norm() -> None:
    mae = ct.create_model("crate_mae_mnist", depth=2).eval()
    z = torch.randn(2, 5, mae.config.dim)
    torch.testing.assert_close(mae.norm_tokens(z), mae.norm(z))
    crate = ct.create_model("crate_mnist", depth=2)
    assert torch.equal(crate.norm_tokens(z[..., : crate.config.dim]), z[..., : crate.config.dim])  # like fc_norm


# --------------------------------------------------------------------------- group_matcher
@pytest.mark.parametrize("name", ["crate_mnist", "vit_mnist", "crate_alpha_mnist", "crate_mae_mnist"])
@pytest.mark.parametrize("coarse", [False, True])
def test_group_matcher_gives_timm_the_layer_groups_of_our_layer_decay(name: str, coarse: bool) -> None:
    model = ct.create_model(name, depth=3)
    by_timm = group_parameters(model, model.group_matcher(coarse=coarse), reverse=True)
    ours = {n: layer_id(n, len(model.layers)) for n, _ in model.named_parameters()}
    assert by_timm == ours
    assert by_timm["cls_token"] == 0 and by_timm["layers.2.norm1.weight"] == 3 and max(by_timm.values()) == 4


# --------------------------------------------------------------------------- pretrained weights with a new head
def _backbone(model: ct.Model) -> dict[str, torch.Tensor]:
    head = {n for n in model.state_dict() if n.startswith("head.1.")}
    return {k: v for k, v in model.state_dict().items() if k not in head}


def test_an_official_file_with_other_classes_loads_the_backbone_and_a_fresh_head(tmp_path, caplog) -> None:
    _, f = official_tiny_file(tmp_path / "five_classes.pth")  # 5 classes
    arch = {k: v for k, v in tiny.IMAGE.items() if k != "num_classes"}
    reference = ct.from_official(f, "crate_small", num_classes=5, **arch)
    with caplog.at_level(logging.WARNING, logger="crate_transformer"):
        model = ct.create_model("crate_small", pretrained_file=f, num_classes=3, **arch)
    assert model.config.num_classes == 3 and model.get_classifier().weight.shape == (3, 32)
    mine = _backbone(model)
    assert mine.keys() == _backbone(reference).keys()
    assert all(torch.equal(mine[k], v) for k, v in _backbone(reference).items())
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (
        f"{f}: a fresh 3-class classifier (head.1) instead of the file's (5 classes); every other weight is loaded "
        "from the file — train the new head before using its outputs"
    )
    with pytest.raises(CheckpointError, match="pass num_classes=5"):  # from_official stays strict
        ct.from_official(f, "crate_small", num_classes=3, **arch)


def test_from_pretrained_takes_overrides_run_folders_and_create_model_takes_folders(tmp_path, caplog) -> None:
    model = ct.create_model("crate_mnist", **tiny.DIGITS).eval()
    run = tmp_path / "run"
    model.save_pretrained(run / "model")  # what a finished crate train run holds
    (run / "checkpoints").mkdir()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ct.from_pretrained(run).eval()(x), model(x), rtol=0, atol=0)
        with caplog.at_level(logging.WARNING, logger="crate_transformer"):
            three = ct.from_pretrained(run, num_classes=3, drop_path_rate=0.1)
        assert three.config.num_classes == 3 and three.config.drop_path == 0.1
        assert all(torch.equal(v, _backbone(model)[k]) for k, v in _backbone(three).items())
        assert "a fresh 3-class classifier (head.1) instead of the file's (10 classes)" in caplog.text
        arch = {k: v for k, v in tiny.DIGITS.items() if k != "num_classes"}
        folder = ct.create_model("crate_mnist", pretrained_file=run / "model", num_classes=4, **arch)
        assert folder.config.num_classes == 4 and folder.pretrained_cfg["file"] == str(run / "model")
        assert all(torch.equal(v, _backbone(model)[k]) for k, v in _backbone(folder).items())
        bigger = ct.from_pretrained(run, image_size=16)
        model.resize_pos_embed(16)
        assert bigger.config.image_size == 16
        torch.testing.assert_close(bigger.pos_embed, model.pos_embed, rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"differs from the given model name 'vit_mnist' .*arch='vit'"):
        ct.create_model("vit_mnist", pretrained_file=run)  # the name's architecture must be the folder's
    running = tmp_path / "running"
    (running / "checkpoints").mkdir(parents=True)
    (running / "checkpoints" / "last.pt").write_bytes(b"a training state")
    with pytest.raises(CheckpointError, match=r"without its final model/ yet .* load_model\(RUN\) loads its"):
        ct.from_pretrained(running)


# --------------------------------------------------------------------------- the model's own preprocessing
def test_every_registered_model_has_a_data_config_or_says_it_takes_tokens() -> None:
    for name in ct.list_models():
        with torch.device("meta"):  # every size, the large ones included, without allocating them
            model = ct.create_model(name)
        cfg = model.pretrained_cfg
        if model.kind == "language model":
            assert "input_size" not in cfg, name
            with pytest.raises(ValueError, match="takes no images"):
                ct.resolve_data_config(model)
            continue
        c = model.config
        assert cfg["input_size"] == (c.in_chans, c.image_size, c.image_size), name
        assert len(cfg["mean"]) == len(cfg["std"]) == c.in_chans, name
        assert (cfg["crop_pct"], cfg["crop_mode"], cfg["interpolation"]) == (1.0, "center", "bilinear"), name
        assert cfg["normalization"] == "ImageNet's (none recorded)", name  # a fresh model: nothing recorded yet


def test_released_weights_state_their_preprocessing_and_the_loaders_use_it(tmp_path) -> None:
    from crate_transformer.loading.pipeline import load_model
    from crate_transformer.loading.pretrained import ZOO
    from crate_transformer.models.spec import IMAGENET_MEAN, IMAGENET_STD, resolve_normalization

    for name, entry in ZOO.items():
        if "resize 256, centre crop 224" in entry.input:  # the authors' evaluation transform, as their code has it
            assert entry.preprocessing() == dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, crop_pct=224 / 256,
                                                 interpolation="bilinear"), name  # fmt: skip
    _, f = official_tiny_file(tmp_path / "crate_small.pth")
    loaded = [
        ct.create_model("crate_small", pretrained_file=f, **tiny.IMAGE),
        load_model(f, "crate_small", **tiny.IMAGE),
    ]
    for model in loaded:  # create_model, and the loader every command uses
        cfg = ct.resolve_data_config(model)
        assert cfg == dict(input_size=(3, 32, 32), interpolation="bilinear", mean=IMAGENET_MEAN, std=IMAGENET_STD,
                           crop_pct=0.875, crop_mode="center")  # fmt: skip
        assert model.pretrained_cfg["normalization"] == "released weights"
        assert resolve_normalization(model, dataset=object()) == (list(IMAGENET_MEAN), list(IMAGENET_STD))
    plain = ct.create_model("crate_small", **tiny.IMAGE)  # not loaded from a release: the dataset's statistics
    assert resolve_normalization(plain) is None


def test_the_training_datas_statistics_come_before_everything(tmp_path) -> None:
    from crate_transformer.models.spec import DataSpec

    model = ct.create_model("crate_mnist", **tiny.DIGITS)
    model.pretrained_cfg = {"mean": (0.5,), "std": (0.5,), "crop_pct": 0.9}  # e.g. a zoo entry
    model.config.data = DataSpec(source="digits", mean=[0.1], std=[0.3])
    cfg = model.pretrained_cfg
    assert (cfg["mean"], cfg["std"], cfg["normalization"], cfg["crop_pct"]) == ((0.1,), (0.3,), "training data", 0.9)
    over = ct.resolve_data_config(model, img_size=16, crop_pct=1.0, interpolation="bicubic")
    assert (over["input_size"], over["crop_pct"], over["interpolation"]) == ((1, 16, 16), 1.0, "bicubic")
    for bad, match in (({"crop": 1}, "unknown data config key"), ({"interpolation": "nearest"}, "unknown interp"),
                       ({"crop_pct": 1.5}, r"crop_pct must be a finite number in \(0, 1\]")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            ct.resolve_data_config(model, **bad)


def test_image_transform_resizes_keeping_the_aspect_crops_the_centre_and_normalises() -> None:
    import numpy as np
    from PIL import Image

    cfg = dict(input_size=(3, 28, 28), mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.5), crop_pct=0.875,
               interpolation="bilinear", crop_mode="center")  # fmt: skip
    rng = np.random.default_rng(0)
    exact = rng.integers(0, 256, (32, 48, 3), dtype=np.uint8)  # shorter side already 28 / 0.875 = 32: no resize
    x = ct.data.image_transform(cfg)(Image.fromarray(exact))
    centre = torch.from_numpy(exact[2:30, 10:38].astype(np.float64) / 255).permute(2, 0, 1)
    want = (centre - torch.tensor(cfg["mean"]).view(3, 1, 1)) / torch.tensor(cfg["std"]).view(3, 1, 1)
    torch.testing.assert_close(x.double(), want, rtol=0, atol=1e-6)
    wide = np.zeros((60, 200), dtype=np.uint8)  # grey, 10:3: the white middle survives, the black sides do not
    wide[:, 70:130] = 255
    y = ct.data.image_transform({**cfg, "input_size": (1, 28, 28), "mean": (0.0,), "std": (1.0,)})(wide)
    assert y.shape == (1, 28, 28) and float(y.min()) > 0.99  # squashing would keep black on both sides
    noisy = rng.integers(0, 256, (50, 70, 3), dtype=np.uint8)
    a, b = (ct.data.image_transform({**cfg, "interpolation": i})(noisy) for i in ("bilinear", "bicubic"))
    assert not torch.allclose(a, b)  # the interpolation is the one asked for
