"""Model registry: ``create_model(name, **overrides)`` and ``list_models()`` (timm-style).

Two tables.  **Architectures** (:func:`register_arch`): an ``arch`` name → its config class, its builder,
and the authors' checkpoint format (:class:`~crate_transformer.official.OfficialFormat`).  **Models**
(:func:`register_model`): a name → the config fields that define it; overrides replace any field.  A new
model family is one module (its :class:`~crate_transformer.config.Config` and
:class:`~crate_transformer.base.Model` subclasses, and its checkpoint format) plus a ``register_arch`` call
and its ``register_model`` entries here.

CRATE sizes are JMLR Table 8 (p.96); ViT sizes are the standard ViT-T/S/B/L (timm layout, the paper's
baselines); CRATE-MAE sizes are the official ``mae_crate_*`` factories (Table 9, p.96); CRATE-BERT /
CRATE-GPT sizes are Table 10 (p.97).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from .alpha import ALPHA_ARCH, ALPHA_FORMAT, AlphaConfig, CRATEAlpha
from .base import Model
from .bert import BERT_FORMAT
from .config import Config
from .lm import CRATE_LM_FORMAT, GPT2_FORMAT, LanguageModel, LMConfig, build_lm
from .mae import CRATEMAE, MAE_ARCH, MAEConfig
from .model import ImageClassifier, ModelConfig, build_model
from .official import CLASSIFIER_FORMAT, MAE_FORMAT, OfficialFormat

__all__ = [
    "Arch",
    "register_arch",
    "arch_info",
    "official_formats",
    "register_model",
    "list_models",
    "registered_fields",
    "config_class",
    "model_config",
    "build",
    "create_model",
    "is_language_model",
]


@dataclass(frozen=True)
class Arch:
    """An architecture: its config class, the function that builds a model from a config, whether it is a
    language model (token ids in), and the authors' checkpoint format, if any (``ct.from_official``)."""

    config_class: type[Config]
    build: Callable[[Config], Model]
    language: bool = False
    official: OfficialFormat | None = None


_ARCHS: dict[str, Arch] = {}
_REGISTRY: dict[str, dict] = {}


def register_arch(
    arch: str,
    config_class: type[Config],
    build: Callable[[Config], Model],
    *,
    language: bool = False,
    official: OfficialFormat | None = None,
) -> None:
    """Make ``arch`` (a config's ``arch`` value) buildable; a new model family is a module plus this call
    and its :func:`register_model` entries."""
    _ARCHS[arch] = Arch(config_class, build, language, official)


def arch_info(arch: object) -> Arch:
    """The :class:`Arch` of an architecture name (one-line error naming the known ones)."""
    if arch not in _ARCHS:
        raise ValueError(f"unknown arch {arch!r}; choose one of {tuple(_ARCHS)}")
    return _ARCHS[arch]


def official_formats() -> list[Arch]:
    """The registered architectures that have an authors' checkpoint format."""
    return [a for a in _ARCHS.values() if a.official is not None]


def config_class(arch: object) -> type[Config]:
    """The config dataclass of an architecture name (the classifier's :class:`ModelConfig` when ``arch`` is
    None); an unknown name is a one-line error naming the registered ones (and the closest, for a misspelling),
    not a list of keys that the wrong config class lacks."""
    if arch is None:
        return ModelConfig
    if not isinstance(arch, str) or arch not in _ARCHS:
        import difflib

        close = difflib.get_close_matches(str(arch), list(_ARCHS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown arch {str(arch)[:40]!r}{hint}; registered: {', '.join(sorted(_ARCHS))}")
    return _ARCHS[arch].config_class


def register_model(name: str, **fields: object) -> None:
    """Register ``name`` as the config with ``fields`` (validated now, so typos fail at import)."""
    config_class(fields.get("arch"))(**fields)
    _REGISTRY[name] = dict(fields)  # as given; the config coerces them again on every use


register_arch("crate", ModelConfig, build_model, official=CLASSIFIER_FORMAT)
register_arch("vit", ModelConfig, build_model)
register_arch(MAE_ARCH, MAEConfig, CRATEMAE, official=MAE_FORMAT)
register_arch("crate_lm", LMConfig, build_lm, language=True, official=CRATE_LM_FORMAT)
register_arch("gpt", LMConfig, build_lm, language=True, official=GPT2_FORMAT)
register_arch(ALPHA_ARCH, AlphaConfig, CRATEAlpha, official=ALPHA_FORMAT)
register_arch("crate_bert", LMConfig, build_lm, language=True, official=BERT_FORMAT)


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
# Small models for the built-in 28x28 digits (the classification task's default) and its ViT counterpart, paired as
# CRATE-T/ViT-T are (Table 8): ViT at half the width and half the heads (same head size 32), 4x MLP, and about
# the same parameter count (309k vs 305k).
register_model(
    "crate_mnist", arch="crate", image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=128, depth=6, heads=4
)
# The classification task's default model: the digits resized to 24 px on a 6x6 grid of 4x4 patches (d = 128,
# 3 layers, 4 heads of 32; 158,250 parameters).  Patches of 4 px make the attention maps and MaskCut masks of the
# analysis follow the strokes, where crate_mnist's 4x4 grid of 7 px patches gives 16 blocks; the 24 px resize drops
# MNIST's empty border, so 36 patches cost what crate_mnist's 16 patches and 6 layers do (docs/results.md).
register_model(
    "crate_mnist_p4", arch="crate", image_size=24, patch_size=4, in_chans=1, num_classes=10, dim=128, depth=3, heads=4
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

# CRATE-MAE (official mae_crate_* factories; encoder and decoder share L, d, K; patch 16, λ = 0.5).
# Official-layout parameter counts (Table 9): S 25,405,824 (25.4M), B 44,638,464 (44.6M).  The official
# mae_crate_large has depth 24; Table 9's "Large, L = 12, 78.5M" is crate_mae_large with depth=12.
register_model("crate_mae_tiny", arch=MAE_ARCH, dim=384, depth=12, heads=6)
register_model("crate_mae_small", arch=MAE_ARCH, dim=576, depth=12, heads=12)
register_model("crate_mae_base", arch=MAE_ARCH, dim=768, depth=12, heads=12)
register_model("crate_mae_large", arch=MAE_ARCH, dim=1024, depth=24, heads=16)
# The mae task's default for the built-in 28x28 digits.  ISTA step η = 0.5, not the official 0.1: at
# d = 64 and 5 minutes of training the larger step learns faster (the measurement: docs/results.md).
register_model(
    "crate_mae_mnist", arch=MAE_ARCH, image_size=28, patch_size=4, in_chans=1, dim=64, depth=4, heads=4, eta=0.5
)


# Language models, JMLR Table 10 (p.97).  CRATE-BERT as the authors released it (their Hugging Face port,
# models/crate/modeling_crate.py; bert.py): RoBERTa's vocabulary (V = 50,265), embedding (learned positions from
# pad_token_id + 1 = 2, so 512 rows hold 510 tokens; 2 token types; LayerNorm eps 1e-12) and masked-LM head, no bias on
# MSSA's W, dropout 0.1.  Parameters 32,621,657 / 60,912,729 / 128,697,433 (paper: 33M / 61M / 129M; "60.9M").
# crate_bert_eq83_* are the literal eqs. (83)-(84) form (sinusoidal E_pos, the head tied to the embedding and nothing
# else): 32,047,616 / 59,883,264 / 127,091,712.
# CRATE-GPT as the official nanoGPT-based code (V = 50,304, learned wpe, context 1,024).
# Parameters (tied head, position table excluded): GPT 59.9M / 241.6M (paper: 60M / 242M).  Table 10's "Small"
# GPT-2 (64M) has no CRATE entry; crate_gpt_small is CRATE at that width and depth.  gpt2_* are the GPT-2 baselines
# (124M / 774M with wpe; 64M "Small").
_BERT = dict(arch="crate_bert", causal=False, vocab_size=50265, block_size=510, proj_bias=False, dropout=0.1)
_BERT_EQ83 = dict(arch="crate_lm", causal=False, pos_embed="sinusoidal", vocab_size=50265, block_size=512)
_GPT = dict(vocab_size=50304, block_size=1024)
register_model("crate_bert_medium", **_BERT, dim=512, depth=8, heads=8)
register_model("crate_bert_base", **_BERT, dim=768, depth=12, heads=12)
register_model("crate_bert_large", **_BERT, dim=1024, depth=24, heads=16)
register_model("crate_bert_eq83_medium", **_BERT_EQ83, dim=512, depth=8, heads=8)
register_model("crate_bert_eq83_base", **_BERT_EQ83, dim=768, depth=12, heads=12)
register_model("crate_bert_eq83_large", **_BERT_EQ83, dim=1024, depth=24, heads=16)
register_model("crate_gpt_small", arch="crate_lm", **_GPT, dim=512, depth=12, heads=8)
register_model("crate_gpt_base", arch="crate_lm", **_GPT, dim=768, depth=12, heads=12)
register_model("crate_gpt_large", arch="crate_lm", **_GPT, dim=1280, depth=36, heads=20)
register_model("gpt2_small", arch="gpt", final_norm=True, **_GPT, dim=512, depth=12, heads=8)
register_model("gpt2_base", arch="gpt", final_norm=True, **{**_GPT, "vocab_size": 50257}, dim=768, depth=12, heads=12)
register_model("gpt2_large", arch="gpt", final_norm=True, **{**_GPT, "vocab_size": 50257}, dim=1280, depth=36, heads=20)
# OpenAI's GPT-2 medium and XL (gpt2_base and gpt2_large above are GPT-2 small and large): 354.8M / 1,557.6M.
_GPT2 = dict(arch="gpt", final_norm=True, vocab_size=50257, block_size=1024)
register_model("gpt2_medium", **_GPT2, dim=1024, depth=24, heads=16)
register_model("gpt2_xl", **_GPT2, dim=1600, depth=48, heads=25)
# The released crate-lm CRATE-GPT (Bai & Ma 2025; Hugging Face JackBAI/CRATE-GPT-12L-Pile-600000steps, file
# ckpt-crate-12l-overparam-600000.pt, trained on the Pile with crate-lm's crate_overcomplete.py): MSSA + the tied
# overcomplete ISTA (4d atoms, no residual) and a final LayerNorm; 81,934,848 parameters (81,148,416 without wpe).
register_model(
    "crate_gpt_12l_pile", arch="crate_lm", **_GPT, dim=768, depth=12, heads=12, mlp="ista_overcomplete", final_norm=True
)
# Laptop presets (the lm task's default: byte-level tokenizer, context 128, d = 128, 4 layers, 4 heads),
# and the GPT of the same width, depth and heads with a 4x GELU MLP (the README's comparison).
_MINI = dict(vocab_size=262, block_size=128, dim=128, depth=4, heads=4)
register_model("crate_gpt_mini", arch="crate_lm", **_MINI)
register_model("crate_bert_mini", arch="crate_lm", causal=False, pos_embed="sinusoidal", **_MINI)
register_model("gpt_mini", arch="gpt", final_norm=True, **_MINI)

# The CRATE variants of the ablations at the same size as crate_mnist: JMLR Table 17's hybrids and
# CRATE-α's sparse-coding block (Yang et al. 2024).  `crate ablate 17` trains them side by side.
_MNIST = dict(arch="crate", image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=128, depth=6, heads=4)
register_model("crate_mlp_mnist", **_MNIST, mlp="mlp")  # MSSA + GELU MLP
register_model("crate_mhsa_mnist", **_MNIST, attention="mhsa")  # standard attention + ISTA
register_model("crate_alpha_mnist", **_MNIST, mlp="odl")  # MSSA + overcomplete ISTA (4d atoms) + residual

# CRATE-α (Yang et al. 2024, alpha.py): the sizes of the released PyTorch checkpoints (UCSC-VLAA/CRATE-alpha on
# the HF Hub, torch/crate_alpha_B16.pth and torch/crate_alpha_L14.pth; the factories CRATE_base / CRATE_large of
# torch_inference/model/crate_alpha.py), both fine-tuned and evaluated at 224.  Parameters with the 1000-class
# head: 72,328,936 and 253,650,920.  The ImageNet-21K pre-training files (torch/in21k_Pretrain): num_classes=19167.
register_model("crate_alpha_base16", arch=ALPHA_ARCH, image_size=224, patch_size=16, dim=768, depth=12, heads=12)
register_model("crate_alpha_large14", arch=ALPHA_ARCH, image_size=224, patch_size=14, dim=1024, depth=24, heads=16)


def list_models(pattern: str = "*") -> list[str]:
    """Names of registered models matching a shell-style ``pattern`` (e.g. ``"crate_*"``), sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def is_language_model(name: str) -> bool:
    """Whether the registered ``name`` is a language model (takes token ids)."""
    arch = registered_fields(name).get("arch")
    return arch in _ARCHS and _ARCHS[arch].language


def registered_fields(name: str) -> dict:
    """The config fields a registered model name sets (a copy; the others are ModelConfig defaults)."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} Available: {', '.join(list_models())}")
    return dict(_REGISTRY[name])


def model_config(name: str, **overrides: object) -> Config:
    """The config (the class its ``arch`` registered) of a registered model with ``overrides`` applied
    (values are coerced and validated, e.g. ``lambd="5e-2"`` → 0.05)."""
    registered = registered_fields(name)
    cls = config_class(registered.get("arch"))
    valid = {f.name for f in fields(cls)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise ValueError(f"unknown override(s) {bad} for {name!r}; valid fields: {sorted(valid)}")
    return cls(**{**registered, **overrides})


def build(config: Config) -> Model:
    """The model a config describes (by its ``arch``)."""
    return arch_info(getattr(config, "arch", None)).build(config)


def create_model(
    name: str, pretrained: bool = False, pretrained_file: str | Path | None = None, **overrides: object
) -> ImageClassifier | CRATEMAE | LanguageModel | Model:
    """Build a registered model, e.g. ``create_model("crate_small", num_classes=10, image_size=32, patch_size=4)``,
    ``create_model("crate_mae_small")`` or ``create_model("crate_gpt_mini", depth=2)``.

    ``pretrained=True`` loads the authors' released weights (``crate models --pretrained`` lists them),
    downloaded through the Hugging Face cache; ``pretrained_file=PATH`` loads a file already on disk
    (a Google Drive release, or any checkpoint in the authors' format for ``name``).
    """
    if pretrained or pretrained_file is not None:
        from .pretrained import load_pretrained

        return load_pretrained(name, pretrained_file=pretrained_file, **overrides)
    return build(model_config(name, **overrides))
