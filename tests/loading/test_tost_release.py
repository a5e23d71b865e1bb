"""The ToST models against the authors' (``tests/official/tost_vision.py``, ``tests/official/tost_lang.py``): the same
random weights, written in the authors' checkpoint containers and read by ``ct.from_official``, give the same
outputs (float64 1e-12, float32 1e-5); the registered sizes have the authors' parameter counts."""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import pytest
import torch
from official import tost_lang, tost_vision
from torch import nn

import crate_transformer as ct
from crate_transformer.io import CheckpointError
from crate_transformer.models.tost import ToST, ToSTLanguageModel


def _randomise(model: nn.Module, seed: int = 0) -> None:
    """Every parameter and batch-norm statistic random (the initial ones are too regular to catch a swapped key)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var") or name.endswith("temp"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=g) * (0.3 if t.dim() < 2 else 0.2))


def _official_vision(patch: int = 8, dim: int = 32, depth: int = 2, heads: int = 4, classes: int = 7):
    return tost_vision.VisionTransformer(
        img_size=32, patch_size=patch, num_classes=classes, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=4,
        qkv_bias=True, norm_layer=partial(nn.LayerNorm, eps=1e-6), eta=1.0, tokens_norm=True,
    )  # fmt: skip


def _main_py_container(model: nn.Module, path: Path, input_size: int) -> Path:
    """What tost_vision/main.py saves: the state dict, the optimizer's, the epoch and the argparse Namespace."""
    args = argparse.Namespace(model="tost_cab_tiny_12_p16", input_size=input_size, drop_path=0.0, lr=5e-4,
                              opt_betas=None, nb_classes=7, output_dir="/experiments/x", model_ema=True)  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    payload = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "args": args,
               "model_ema": model.state_dict(), "scaler": {"scale": 1024.0}}  # fmt: skip
    torch.save(payload, path)
    return path


@pytest.mark.parametrize("patch", [8, 16])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_classifier_equals_the_authors_through_their_checkpoint(tmp_path, patch, dtype, tol):
    theirs = _official_vision(patch)
    _randomise(theirs)
    theirs = theirs.to(dtype).eval()
    path = _main_py_container(theirs, tmp_path / "checkpoint.pth", 32)
    ours = ct.from_official(path, f"tost_cab_tiny_12_p{patch}").to(dtype).eval()
    assert type(ours) is ToST
    c = ours.config
    assert (c.dim, c.depth, c.heads, c.patch_size, c.cls_layers, c.num_classes, c.image_size) == (
        32,
        2,
        4,
        patch,
        2,
        7,
        32,
    )
    assert ours.num_params() == sum(p.numel() for p in theirs.parameters())
    x = torch.randn(3, 3, 32, 32, dtype=dtype)
    torch.testing.assert_close(ours(x), theirs(x), rtol=tol, atol=tol)
    # the class token after the final norm is the authors' forward_features; a larger grid works too (Fourier)
    torch.testing.assert_close(ours.forward_features(x)[:, 0], theirs.forward_features(x), rtol=tol, atol=tol)
    big = torch.randn(2, 3, 48, 64, dtype=dtype)
    torch.testing.assert_close(ours(big), theirs(big), rtol=tol, atol=tol)


def test_the_classifier_reads_a_bare_state_dict_and_refuses_other_files(tmp_path):
    theirs = _official_vision()
    _randomise(theirs)
    theirs.eval()
    torch.save({f"module.{k}": v for k, v in theirs.state_dict().items()}, tmp_path / "ddp.pth")  # a DDP save
    ours = ct.from_official(tmp_path / "ddp.pth", "tost_cab_small_12_p8").eval()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    assert ours.config.image_size == 224  # no Namespace: the registered size, which the Fourier encoding does not need
    crate = ct.create_model("crate_mnist")
    torch.save(crate.state_dict(), tmp_path / "crate.pth")
    with pytest.raises(CheckpointError, match="not a ToST classifier checkpoint"):
        ct.from_official(tmp_path / "crate.pth", "tost_cab_tiny_12_p16")


def _lm_container(model: nn.Module, path: Path, cfg) -> Path:
    """What tost_lang/train.py saves as ckpt.pt (torch.compile's "_orig_mod." prefix included)."""
    model_args = dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
                      bias=cfg.bias, vocab_size=cfg.vocab_size, dropout=0.0, TSSA=True)  # fmt: skip
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    torch.save({"model": state, "model_args": model_args, "iter_num": 100, "best_val_loss": 3.2,
                "config": {"batch_size": 12, "TSSA": True}}, path)  # fmt: skip
    return path


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_the_language_model_equals_the_authors_through_their_checkpoint(tmp_path, bias, dtype, tol):
    cfg = tost_lang.GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=4, n_embd=32, bias=bias, TSSA=True)
    theirs = tost_lang.GPT(cfg)
    _randomise(theirs)
    theirs = theirs.to(dtype).eval()
    ours = ct.from_official(_lm_container(theirs, tmp_path / "ckpt.pt", cfg), "tost_gpt_base").to(dtype).eval()
    assert type(ours) is ToSTLanguageModel
    c = ours.config
    assert (c.vocab_size, c.block_size, c.dim, c.depth, c.heads, c.bias) == (50, 16, 32, 2, 4, bias)
    assert ours.num_params() == sum(p.numel() for p in theirs.parameters())
    assert ours.num_params(exclude_positions=True) == theirs.get_num_params()
    idx = torch.randint(0, 50, (3, 16))
    torch.testing.assert_close(ours(idx), theirs(idx, idx)[0], rtol=tol, atol=tol)
    short = idx[:, :5].contiguous()
    torch.testing.assert_close(ours(short), theirs(short, short)[0], rtol=tol, atol=tol)


def test_language_model_generation_with_its_constant_size_cache_equals_recomputing():
    torch.manual_seed(0)
    model = ct.create_model("tost_gpt_mini", dim=32, depth=2, heads=4, block_size=12).eval()
    _randomise(model, seed=1)
    prompt = torch.randint(0, model.config.vocab_size, (2, 5))
    cached, logits = model.generate(prompt, 14, temperature=0, return_logits=True)  # slides past the context of 12
    plain, plain_logits = model.generate(prompt, 14, temperature=0, use_cache=False, return_logits=True)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(logits, plain_logits, rtol=1e-4, atol=1e-4)
    cache = model.new_cache()
    model(prompt, cache)
    model(prompt[:, :1], cache)
    assert (
        cache[0]["length"] == 6 and ct.models.lm.cache_nbytes(cache) == 2 * 2 * 4 * (8 + 8 + 1) * 4
    )  # sq, wsq (p=8), pi


def test_language_model_trains_the_authors_parameters_without_decaying_the_heads_statistics():
    model = ct.create_model("tost_gpt_mini", dim=32, depth=2, heads=4, block_size=8)
    skip = model.no_weight_decay()
    assert {"layers.0.attn.temp", "layers.1.attn.denom_bias", "layers.0.gamma1"} <= skip
    assert "layers.0.attn.qkv.weight" not in skip and "wte.weight" not in skip


def _count(build) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build().parameters())


@pytest.mark.parametrize("name", [n for n in ct.list_models("tost_cab_*")])
def test_the_registered_classifiers_have_the_authors_parameter_counts(name):
    assert _count(lambda: ct.create_model(name)) == _count(lambda: tost_vision.create(name))


@pytest.mark.parametrize("name,layers,heads,dim", [("tost_gpt_base", 12, 12, 768), ("tost_gpt_medium", 24, 16, 1024),
                                                   ("tost_gpt_large", 36, 20, 1280)])  # fmt: skip
def test_the_registered_language_models_have_the_authors_parameter_counts(name, layers, heads, dim):
    cfg = tost_lang.GPTConfig(block_size=1024, vocab_size=50304, n_layer=layers, n_head=heads, n_embd=dim, bias=False,
                              TSSA=True)  # fmt: skip
    assert _count(lambda: ct.create_model(name)) == _count(lambda: tost_lang.GPT(cfg))


def test_the_classifier_refuses_sizes_its_embedding_cannot_build():
    with pytest.raises(ValueError, match="power of two"):
        ct.create_model("tost_mnist", patch_size=6)
    with pytest.raises(ValueError, match="divisible by heads"):
        ct.create_model("tost_mnist", heads=5)
    with pytest.raises(ValueError, match="causal GPT"):
        ct.create_model("tost_gpt_mini", causal=False)


def test_a_checkpoint_of_other_sizes_names_the_overrides_that_fit_it():
    small = ct.create_model("tost_mnist", dim=32, depth=2, heads=2, num_classes=7)
    with pytest.raises(CheckpointError, match=r"pass dim=32, depth=2, heads=2, num_classes=7"):
        ct.loading.weights.load_weights(ct.create_model("tost_mnist"), small.state_dict())


@pytest.mark.parametrize("bias", [True, False])
def test_the_tost_layer_is_the_crate_layer_with_layer_scale_and_its_released_keys(bias):
    """``ToSTBlock`` is an ``EncoderLayer`` (``attention="tssa"``, ``mlp="mlp"``, layer scale): the keys of the
    authors' block in their order (``gamma1``, ``gamma2``, ``norm1``, ``attn``, ``norm2``, ``mlp``), the norms' eps
    and biases the model gives, and its forward the two lines ``Z + γ1 ⊙ TSSA(LN1 Z)``, ``+ γ2 ⊙ MLP(LN2 ·)``."""
    from crate_transformer.layers import MLP, TSSA, EncoderLayer
    from crate_transformer.models.tost import ToSTBlock

    torch.manual_seed(0)
    block = ToSTBlock(16, 2, 8, layer_scale=0.5, qkv_bias=bias, bias=bias, ln_eps=1e-5, causal=True, block_size=6)
    assert isinstance(block, EncoderLayer) and isinstance(block.attn, TSSA) and isinstance(block.block, MLP)
    norms = ["norm{}.weight", "norm{}.bias"] if bias else ["norm{}.weight"]
    mlp = ["mlp.0.weight", "mlp.0.bias", "mlp.3.weight", "mlp.3.bias"] if bias else ["mlp.0.weight", "mlp.3.weight"]
    attn = ["attn.temp", "attn.denom_bias", "attn.qkv.weight", *(["attn.qkv.bias"] if bias else []), "attn.proj.weight"]
    attn += ["attn.proj.bias"] if bias else []
    want = ["gamma1", "gamma2", *(k.format(1) for k in norms), *attn, *(k.format(2) for k in norms), *mlp]
    assert list(block.state_dict()) == want
    assert block.norm1.eps == block.norm2.eps == 1e-5 and block.code_site() == (block.mlp[1], "mlp")
    with torch.no_grad():
        block.gamma1.uniform_()
        block.gamma2.uniform_()
    x = torch.randn(2, 6, 16)
    half = x + block.gamma1 * block.attn(block.norm1(x))
    torch.testing.assert_close(block(x), half + block.gamma2 * block.mlp(block.norm2(half)))
