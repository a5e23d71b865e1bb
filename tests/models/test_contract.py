"""The one model contract (base.Model, with its config half models.contract.FamilyConfig) and the one config base
(config.Config), across every family."""

import json
import math

import pytest
import torch

import crate_transformer as ct
from crate_transformer.config import Config
from crate_transformer.models.base import POOLS, Model, pool_tokens
from crate_transformer.models.classifier import ModelConfig
from crate_transformer.models.contract import KINDS, FamilyConfig
from crate_transformer.models.dino import DINOHead, DINOModel
from crate_transformer.models.lm import LMConfig
from crate_transformer.models.mae import MAEConfig
from crate_transformer.train.dino import DINOOptions

IMG = dict(image_size=16, patch_size=4, in_chans=1, dim=32, depth=2, heads=4)
FAMILIES = {
    "crate": lambda: ct.create_model("crate_mnist", **IMG, num_classes=5),
    "vit": lambda: ct.create_model("vit_mnist", **IMG, num_classes=5),
    "crate_alpha": lambda: ct.create_model("crate_alpha_mnist", **IMG, num_classes=5),
    "crate_mae": lambda: ct.create_model("crate_mae_mnist", **IMG),
    "crate_gpt": lambda: ct.create_model("crate_gpt_mini", dim=32, depth=2, heads=4, block_size=8, num_labels=3),
    "gpt": lambda: ct.create_model("gpt_mini", dim=32, depth=2, heads=4, block_size=8),
    "tost": lambda: ct.create_model("tost_mnist", **IMG, num_classes=5),
    "tost_lm": lambda: ct.create_model("tost_gpt_mini", dim=32, depth=2, heads=4, block_size=8),
    "crate_bert": lambda: ct.create_model(
        "crate_bert_base",
        dim=32,
        depth=2,
        heads=4,
        block_size=8,
        vocab_size=50,
        dropout=0.0,  # released: 0.1
    ),
}


def _input(model):
    if isinstance(model, ct.LanguageModel):
        return torch.randint(0, model.config.vocab_size, (2, 8))
    return torch.randn(2, 1, 16, 16)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_follows_the_contract(family, tmp_path):
    model = FAMILIES[family]().eval()
    assert isinstance(model, Model) and isinstance(model.config, FamilyConfig) and model.kind in KINDS
    x = _input(model)
    z = model.forward_features(x)
    assert z.dim() == 3 and z.shape[0] == 2 and z.shape[-1] == model.config.dim
    trace = model.forward_trace(x)
    assert len(trace.tokens) == model.config.depth + 1
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    # save_pretrained / Family.from_pretrained round trip, with the config format version recorded
    model.save_pretrained(tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["config_version"] == type(model.config).VERSION
    again = type(model).from_pretrained(tmp_path / "m").eval()
    assert again.config == model.config
    torch.testing.assert_close(again.forward_features(x), z, rtol=0, atol=0)


CONTRACT = ("kind", "BLOCK_COUNTS", "pipeline_tag", "white_box", "sparse_output", "layer_blocks")


def test_the_capability_contract_is_the_model_families_alone() -> None:
    """Every registered family's config is a ``FamilyConfig`` of one of the ``KINDS``, with a Hub task and its
    numbered blocks; the option classes of a training, a task or a command, the DINO head's settings and the
    ``DataSpec`` are ``Config``s without the contract, and ``config.py`` keeps none of its names."""
    import dataclasses

    import crate_transformer.config as config_module
    from crate_transformer.models import _registry
    from crate_transformer.models.dino import DINOHeadConfig
    from crate_transformer.models.spec import DataSpec
    from crate_transformer.train.config import GROUPS
    from crate_transformer.train.task import TASKS, make_task

    families = _registry.config_classes()
    assert {ModelConfig, MAEConfig, LMConfig} <= set(families)
    for cls in families:
        assert issubclass(cls, FamilyConfig) and cls.kind in KINDS and "depth" in cls.BLOCK_COUNTS, cls
        config = cls()
        assert config.pipeline_tag and isinstance(config.white_box, bool) and len(config.layer_blocks) == 2, cls
    options = [type(make_task(name)).Options for name in TASKS]
    for cls in (*GROUPS.values(), *[o for o in options if o is not None], DINOHeadConfig, DataSpec):
        assert issubclass(cls, Config) and not issubclass(cls, FamilyConfig), cls
        own = {f.name for f in dataclasses.fields(cls)}  # DataSpec's field kind: the data's source type
        assert not [name for name in CONTRACT if hasattr(cls, name) and name not in own], cls
    assert not [
        n for n in ("KINDS", "IMAGE_CLASSIFIER", "MASKED_AUTOENCODER", "LANGUAGE_MODEL") if hasattr(config_module, n)
    ]
    assert not [name for name in CONTRACT if hasattr(Config, name)]


@pytest.mark.parametrize("family", FAMILIES)
def test_every_layer_names_its_second_block_block(family):
    """The block after attention (ISTA, MLP, overcomplete ISTA) is ``layer.block`` in every family, and the sparse
    code the analysis reads (``code_site``) lies in it: no consumer probes ``.ista`` or ``.mlp``."""
    model = FAMILIES[family]()
    for layer in model.layers:
        assert any(layer.block is child for child in layer.children())
        site, kind = layer.code_site()
        assert any(site is m for m in layer.block.modules()), (family, kind)
        assert kind in ("ista", "mlp", "odl", "ista_overcomplete")


def test_forward_features_has_one_meaning():
    """After the encoder's own final norm (CRATE-MAE ``norm``, GPT ``ln_f``); the classifier's head
    LayerNorm comes after pooling and belongs to the head."""
    x = torch.randn(2, 1, 16, 16)
    mae = FAMILIES["crate_mae"]().eval()
    torch.testing.assert_close(mae.forward_features(x), mae.norm(mae.forward_trace(x).tokens[-1]))
    clf = FAMILIES["crate"]().eval()
    torch.testing.assert_close(clf.forward_features(x), clf.forward_trace(x).tokens[-1])
    gpt = FAMILIES["gpt"]().eval()
    ids = torch.randint(0, gpt.config.vocab_size, (2, 8))
    torch.testing.assert_close(gpt.forward_features(ids), gpt.norm(gpt.forward_trace(ids).tokens[-1]))


def test_forward_head_pre_logits_and_classifier():
    x = torch.randn(2, 1, 16, 16)
    clf = FAMILIES["crate"]().eval()
    z = clf.forward_features(x)
    pre = clf.forward_head(z, pre_logits=True)
    torch.testing.assert_close(clf.get_classifier()(pre), clf(x))
    torch.testing.assert_close(pre, clf.head[0](z[:, 0]))  # pool "cls", then the head's LayerNorm
    clf.reset_classifier(7, pool="avg")
    assert clf(x).shape == (2, 7) and clf.config.num_classes == 7 and clf.config.pool == "avg"
    lm = FAMILIES["crate_gpt"]()
    assert lm.get_classifier() is lm.classifier and lm.classifier.out_features == 3
    lm.reset_classifier(5)
    assert lm.config.num_labels == 5 and lm.get_classifier().out_features == 5
    mae = FAMILIES["crate_mae"]()
    assert mae.get_classifier() is None
    with pytest.raises(ValueError, match="CRATEMAE has no classifier"):
        mae.reset_classifier(3)
    # the MAE head is the decoder's norm + W_post: forward_head(decoded tokens) = the predicted pixels
    out = mae(x, noise=torch.rand(2, 16))
    z_dec, _ = mae.forward_encoder(x, noise=torch.rand(2, 16))
    assert out.pred.shape == mae.forward_head(mae.run_layers(z_dec, mae.decoder_layers)).shape


def test_pooling_has_one_vocabulary():
    z = torch.randn(3, 5, 4, dtype=torch.float64)
    assert POOLS == ("cls", "mean", "avg")
    torch.testing.assert_close(pool_tokens(z, "cls"), z[:, 0])
    torch.testing.assert_close(pool_tokens(z, "mean"), z.sum(1) / 5)  # official: the class token included
    torch.testing.assert_close(pool_tokens(z, "avg"), z[:, 1:].sum(1) / 4)  # eq. (72): patch tokens only
    with pytest.raises(ValueError, match=r"unknown pooling 'max'; choose one of \('cls', 'mean', 'avg'\)"):
        pool_tokens(z, "max")
    assert ct.probe.POOLS is POOLS


def test_no_weight_decay_is_the_models_answer_and_dino_prefixes_its_backbones():
    clf = FAMILIES["crate"]()
    skip = clf.no_weight_decay()
    assert {"pos_embed", "cls_token", "head.0.weight", "head.1.bias", "layers.0.norm1.weight"} <= skip
    assert not {"layers.0.attn.qkv.weight", "layers.0.ista.weight", "head.1.weight"} & skip
    assert {"cls_token", "mask_token"} <= FAMILIES["crate_mae"]().no_weight_decay()
    dino = DINOModel(FAMILIES["crate"](), DINOHead(32, 16, hidden_dim=8, bottleneck_dim=4), pool="avg")
    skip = dino.no_weight_decay()  # DINO's own rule (utils.get_params_groups): biases and vectors only
    assert not {"backbone.pos_embed", "backbone.cls_token"} & skip
    assert {"backbone.layers.0.norm1.weight", "backbone.head.1.bias"} <= skip
    assert not any(n.startswith("head.") and n.endswith("weight_v") for n in skip)


def test_the_engine_asks_the_model_which_parameters_to_decay():
    from crate_transformer.train.config import TrainConfig
    from crate_transformer.train.optim import Optimization
    from crate_transformer.train.runtime import Runtime

    clf = FAMILIES["crate"]()
    opt = Optimization(clf, TrainConfig(weight_decay=0.1).optim, 10, 10, Runtime())
    no_decay = {id(p) for p in opt.optimizer.param_groups[1]["params"]}
    assert opt.optimizer.param_groups[1]["weight_decay"] == 0.0
    assert id(clf.pos_embed) in no_decay and id(clf.cls_token) in no_decay
    assert id(clf.layers[0].ista.weight) not in no_decay
    dino = DINOModel(FAMILIES["crate"](), DINOHead(32, 16, hidden_dim=8, bottleneck_dim=4), pool="avg")
    decayed = Optimization(dino, TrainConfig(weight_decay=0.1).optim, 10, 10, Runtime()).optimizer.param_groups[0]
    assert {id(dino.backbone.pos_embed), id(dino.backbone.cls_token)} <= {id(p) for p in decayed["params"]}  # DINO


@pytest.mark.parametrize("family", ["crate", "crate_mae", "crate_gpt", "crate_bert", "tost", "tost_lm"])
def test_grad_checkpointing_gives_the_same_gradients(family):
    model = FAMILIES[family]().double().train()
    x = _input(model)
    x = x.double() if x.is_floating_point() else x
    noise = torch.rand(2, 16, dtype=torch.float64)  # the MAE's mask, the same in both passes

    def grads():
        model.zero_grad()
        loss = model(x, noise=noise).loss if family == "crate_mae" else model(x).pow(2).mean()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.set_grad_checkpointing()
    checkpointed = grads()
    assert plain.keys() == checkpointed.keys() and len(plain) > 5
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "cls, bad, message",
    [
        (LMConfig, {"eta": float("nan")}, r"eta must be a finite number > 0, got nan; e.g. eta=0.1"),
        (LMConfig, {"lambd": "inf"}, r"lambd must be a finite number >= 0, got inf"),
        (LMConfig, {"dropout": 1.0}, r"dropout must be a finite number in \[0, 1\)"),
        (LMConfig, {"heads": 0}, r"heads must be a positive integer, got 0"),
        (MAEConfig, {"eta": float("nan")}, r"eta must be a finite number > 0, got nan"),
        (
            MAEConfig,
            {"mask_ratio": float("nan")},
            r"mask_ratio must be a finite number in \(0, 1\), got nan; e.g. mask_ratio=0.75",
        ),
        (ModelConfig, {"tied_beta": float("-inf")}, r"tied_beta must be a finite number, got -inf"),
        (DINOOptions, {"teacher_temp": float("nan")}, r"teacher_temp must be a finite number > 0, got nan"),
    ],
)
def test_every_config_checks_finiteness_and_ranges_in_one_line(cls, bad, message):
    with pytest.raises(ValueError, match=message) as e:
        cls(**bad)
    assert "\n" not in str(e.value)


def test_config_serialisation_refuses_unknown_keys_and_newer_versions():
    c = LMConfig(dim=64, eta="5e-2")
    assert c.eta == 0.05 and LMConfig.from_dict(c.to_dict()) == c
    assert LMConfig.from_dict({**c.to_dict(), "config_version": 1}) == c
    with pytest.raises(ValueError, match=r"unknown LMConfig keys \['dmi'\]"):
        LMConfig.from_dict({**c.to_dict(), "dmi": 3})
    with pytest.raises(ValueError, match=r"config_version 99 is newer than this crate_transformer reads \(1\)"):
        MAEConfig.from_dict({"config_version": 99})
    assert math.isclose(c.replace(eta=0.2).eta, 0.2)
    with pytest.raises(ValueError, match="eta must be a finite number > 0"):
        c.replace(eta=-1.0)


def test_a_family_takes_its_files_back_through_one_hook():
    """``attach_files``: what a training state carries beside the weights (a language model's tokenizer.json) goes
    back through the family's hook; the loaders never set a tokenizer themselves, and a family without files
    ignores them."""
    from crate_transformer.io import TOKENIZER_NAME, CheckpointError
    from crate_transformer.models.tokenizer import Tokenizer

    text = Tokenizer.byte_level().to_str()
    lm = ct.create_model("crate_gpt_mini", dim=32, depth=1, heads=4, block_size=8)
    assert lm.tokenizer is None
    lm.attach_files({TOKENIZER_NAME: text}, "run/state.pt")
    assert lm.tokenizer.to_str() == text and lm.extra_files() == {TOKENIZER_NAME: text}
    with pytest.raises(CheckpointError, match="run/state.pt"):
        lm.attach_files({TOKENIZER_NAME: "{not json"}, "run/state.pt")
    clf = FAMILIES["crate"]()
    clf.attach_files({TOKENIZER_NAME: text}, "x")  # nothing to take: no attribute appears
    assert not hasattr(clf, "tokenizer") and clf.extra_files() == {}
