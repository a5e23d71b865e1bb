"""Model registry: ``create_model(name, **overrides)`` and ``list_models()`` (timm-style).

A registered model is a name and the :class:`~crate_transformer.model.ModelConfig` fields that
define it; overrides replace any field.  CRATE sizes are JMLR Table 8 (p.96); ViT sizes are the
standard ViT-T/S/B/L (timm layout, the paper's baselines).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch

from .model import ImageClassifier, ModelConfig, build_model

__all__ = ["register_model", "list_models", "registered_fields", "model_config", "create_model"]

_REGISTRY: dict[str, dict] = {}


def register_model(name: str, **fields: object) -> None:
    """Register ``name`` as the ModelConfig with ``fields`` (validated now, so typos fail at import)."""
    ModelConfig(**fields)
    _REGISTRY[name] = dict(fields)  # as given; ModelConfig coerces them again on every use


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

# The CRATE variants of the ablations at the same size as crate_mnist: JMLR Table 17's hybrids and
# CRATE-α's sparse-coding block (Yang et al. 2024).  `crate ablate 17` trains them side by side.
_MNIST = dict(arch="crate", image_size=28, patch_size=7, in_chans=1, num_classes=10, dim=128, depth=6, heads=4)
register_model("crate_mlp_mnist", **_MNIST, mlp="mlp")  # MSSA + GELU MLP
register_model("crate_mhsa_mnist", **_MNIST, attention="mhsa")  # standard attention + ISTA
register_model("crate_alpha_mnist", **_MNIST, mlp="odl")  # MSSA + overcomplete ISTA (4d atoms) + residual


def list_models(pattern: str = "*") -> list[str]:
    """Names of registered models matching a shell-style ``pattern`` (e.g. ``"crate_*"``), sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def registered_fields(name: str) -> dict:
    """The ModelConfig fields a registered model name sets (a copy; the others are ModelConfig defaults)."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} Available: {', '.join(list_models())}")
    return dict(_REGISTRY[name])


def model_config(name: str, **overrides: object) -> ModelConfig:
    """The :class:`ModelConfig` of a registered model with ``overrides`` applied (values are coerced
    and validated by ModelConfig, e.g. ``lambd="5e-2"`` → 0.05)."""
    fields = registered_fields(name)
    valid = {f.name for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise ValueError(f"unknown override(s) {bad} for {name!r}; valid fields: {sorted(valid)}")
    return ModelConfig(**{**fields, **overrides})


def create_model(name: str, **overrides: object) -> ImageClassifier:
    """Build a registered model, e.g. ``create_model("crate_small", num_classes=10, image_size=32, patch_size=4)``."""
    return build_model(model_config(name, **overrides))
