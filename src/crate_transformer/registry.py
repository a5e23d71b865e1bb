"""Model registry: ``create_model(name, **overrides)`` and ``list_models()`` (timm-style).

A registered model is a name and the config fields that define it — :class:`~crate_transformer.model.ModelConfig`
for image classifiers, :class:`~crate_transformer.lm.LMConfig` for language models; overrides replace
any field.  CRATE sizes are JMLR Table 8 (p.96); ViT sizes are the standard ViT-T/S/B/L (timm layout,
the paper's baselines); CRATE-BERT / CRATE-GPT sizes are Table 10 (p.98).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch

from torch import nn

from .lm import LanguageModel, LMConfig, build_lm
from .model import ImageClassifier, ModelConfig, build_model

__all__ = [
    "register_model",
    "register_lm",
    "list_models",
    "registered_fields",
    "model_config",
    "create_model",
    "is_language_model",
]

_REGISTRY: dict[str, dict] = {}
_CONFIG_CLASS: dict[str, type] = {}  # name → ModelConfig | LMConfig


def register_model(name: str, **fields: object) -> None:
    """Register ``name`` as the ModelConfig with ``fields`` (validated now, so typos fail at import)."""
    ModelConfig(**fields)
    _REGISTRY[name] = dict(fields)  # as given; the config class coerces them again on every use
    _CONFIG_CLASS[name] = ModelConfig


def register_lm(name: str, **fields: object) -> None:
    """Register ``name`` as the language model :class:`~crate_transformer.lm.LMConfig` with ``fields``."""
    LMConfig(**fields)
    _REGISTRY[name] = dict(fields)
    _CONFIG_CLASS[name] = LMConfig


# JMLR Table 8: image 224, patch 16, p = d/K.  Parameter counts: 6.09M / 13.12M / 22.80M / 77.64M.
register_model("crate_tiny", arch="crate", dim=384, depth=12, heads=6)
register_model("crate_small", arch="crate", dim=576, depth=12, heads=12)
register_model("crate_base", arch="crate", dim=768, depth=12, heads=12)
register_model("crate_large", arch="crate", dim=1024, depth=24, heads=16)
# ViT baselines (paper Table 1/8: 5.72M, 22.05M, 86.5M, 304M with a 1000-class head).
register_model("vit_tiny", arch="vit", dim=192, depth=12, heads=3)
register_model("vit_small", arch="vit", dim=384, depth=12, heads=6)
register_model("vit_base", arch="vit", dim=768, depth=12, heads=12)
register_model("vit_large", arch="vit", dim=1024, depth=24, heads=16)
# Small models for the built-in 28x28 digits (the `crate train` default) and its ViT counterpart, paired as
# CRATE-T/ViT-T are (Table 8): ViT at half the width and half the heads (same head size 32), 4x MLP, and about
# the same parameter count (309k vs 305k).
register_model(
    "crate_mnist", arch="crate", image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=128, depth=6, heads=4
)
register_model(
    "vit_mnist",
    arch="vit",
    image_size=28,
    patch_size=7,
    in_chans=1,
    num_classes=10,
    dim=64,
    depth=6,
    heads=2,
    mlp_ratio=4.0,
)


# Language models, JMLR Table 10 (p.98): CRATE-BERT with the RoBERTa vocabulary (V = 50,265) and the sinusoidal
# E_pos of eq. (83); CRATE-GPT as the official nanoGPT-based code (V = 50,304, learned wpe, context 1,024).
# Parameters (tied head, position table excluded): BERT 32.0M / 59.9M / 127.1M, GPT 59.9M / 241.6M (paper:
# 33M / 61M / 129M and 60M / 242M).  Table 10's "Small" GPT-2 (64M) has no CRATE entry; crate_gpt_small is
# CRATE at that width and depth.  gpt2_* are the GPT-2 baselines (124M / 774M with wpe; 64M "Small").
_BERT = dict(arch="crate_lm", causal=False, pos_embed="sinusoidal", vocab_size=50265, block_size=512)
_GPT = dict(vocab_size=50304, block_size=1024)
register_lm("crate_bert_medium", **_BERT, dim=512, depth=8, heads=8)
register_lm("crate_bert_base", **_BERT, dim=768, depth=12, heads=12)
register_lm("crate_bert_large", **_BERT, dim=1024, depth=24, heads=16)
register_lm("crate_gpt_small", arch="crate_lm", **_GPT, dim=512, depth=12, heads=8)
register_lm("crate_gpt_base", arch="crate_lm", **_GPT, dim=768, depth=12, heads=12)
register_lm("crate_gpt_large", arch="crate_lm", **_GPT, dim=1280, depth=36, heads=20)
register_lm("gpt2_small", arch="gpt", final_norm=True, **_GPT, dim=512, depth=12, heads=8)
register_lm("gpt2_base", arch="gpt", final_norm=True, **{**_GPT, "vocab_size": 50257}, dim=768, depth=12, heads=12)
register_lm("gpt2_large", arch="gpt", final_norm=True, **{**_GPT, "vocab_size": 50257}, dim=1280, depth=36, heads=20)
# Laptop presets (the `crate train-lm` default: byte-level tokenizer, context 128, d = 128, 4 layers, 4 heads),
# and the GPT of the same width, depth and heads with a 4x GELU MLP (the README's comparison).
_MINI = dict(vocab_size=262, block_size=128, dim=128, depth=4, heads=4)
register_lm("crate_gpt_mini", arch="crate_lm", **_MINI)
register_lm("crate_bert_mini", arch="crate_lm", causal=False, pos_embed="sinusoidal", **_MINI)
register_lm("gpt_mini", arch="gpt", final_norm=True, **_MINI)


def list_models(pattern: str = "*") -> list[str]:
    """Names of registered models matching a shell-style ``pattern`` (e.g. ``"crate_*"``), sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def is_language_model(name: str) -> bool:
    """Whether the registered ``name`` is a language model (an :class:`~crate_transformer.lm.LMConfig`)."""
    registered_fields(name)
    return _CONFIG_CLASS[name] is LMConfig


def registered_fields(name: str) -> dict:
    """The config fields a registered model name sets (a copy; the others are ModelConfig defaults)."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} Available: {', '.join(list_models())}")
    return dict(_REGISTRY[name])


def model_config(name: str, **overrides: object) -> ModelConfig | LMConfig:
    """The config (:class:`ModelConfig` or :class:`~crate_transformer.lm.LMConfig`) of a registered model
    with ``overrides`` applied (values are coerced and validated, e.g. ``lambd="5e-2"`` → 0.05)."""
    fields = registered_fields(name)
    cls = _CONFIG_CLASS[name]
    valid = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise ValueError(f"unknown override(s) {bad} for {name!r}; valid fields: {sorted(valid)}")
    return cls(**{**fields, **overrides})


def build(config: ModelConfig | LMConfig) -> nn.Module:
    """The model a config describes (image classifier or language model)."""
    return build_lm(config) if isinstance(config, LMConfig) else build_model(config)


def create_model(name: str, **overrides: object) -> ImageClassifier | LanguageModel:
    """Build a registered model, e.g. ``create_model("crate_small", num_classes=10, image_size=32, patch_size=4)``
    or ``create_model("crate_gpt_mini", depth=2)``."""
    return build(model_config(name, **overrides))
