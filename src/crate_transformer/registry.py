"""Model registry: ``create_model(name, **overrides)`` and ``list_models()`` (timm-style).

A registered model is a name and the config fields that define it; overrides replace any field.
The ``arch`` field picks the config class: :class:`~crate_transformer.model.ModelConfig` for the
classifiers (``crate``, ``vit``), :class:`~crate_transformer.mae.MAEConfig` for ``crate_mae``.
CRATE sizes are JMLR Table 8 (p.96); ViT sizes are the standard ViT-T/S/B/L (timm layout, the
paper's baselines); CRATE-MAE sizes are the official ``mae_crate_*`` factories (Table 9, p.96).
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch

from .mae import CRATEMAE, MAE_ARCH, MAEConfig
from .model import ImageClassifier, ModelConfig, build_model

__all__ = [
    "register_model",
    "list_models",
    "registered_fields",
    "config_class",
    "model_config",
    "build",
    "create_model",
]

_REGISTRY: dict[str, dict] = {}


def config_class(arch: object) -> type[ModelConfig] | type[MAEConfig]:
    """The config dataclass of an architecture name: MAEConfig for ``"crate_mae"``, else ModelConfig."""
    return MAEConfig if arch == MAE_ARCH else ModelConfig


def register_model(name: str, **fields: object) -> None:
    """Register ``name`` as the config with ``fields`` (validated now, so typos fail at import)."""
    config_class(fields.get("arch"))(**fields)
    _REGISTRY[name] = dict(fields)  # as given; the config coerces them again on every use


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

# CRATE-MAE (official mae_crate_* factories; encoder and decoder share L, d, K; patch 16, λ = 0.5).
# Official-layout parameter counts (Table 9): S 25,405,824 (25.4M), B 44,638,464 (44.6M).  The official
# mae_crate_large has depth 24; Table 9's "Large, L = 12, 78.5M" is crate_mae_large with depth=12.
register_model("crate_mae_tiny", arch=MAE_ARCH, dim=384, depth=12, heads=6)
register_model("crate_mae_small", arch=MAE_ARCH, dim=576, depth=12, heads=12)
register_model("crate_mae_base", arch=MAE_ARCH, dim=768, depth=12, heads=12)
register_model("crate_mae_large", arch=MAE_ARCH, dim=1024, depth=24, heads=16)
# The `crate pretrain mae` default for the built-in 28x28 digits.
register_model("crate_mae_mnist", arch=MAE_ARCH, image_size=28, patch_size=4, in_chans=1, dim=64, depth=4, heads=4)


def list_models(pattern: str = "*") -> list[str]:
    """Names of registered models matching a shell-style ``pattern`` (e.g. ``"crate_*"``), sorted."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatch(n, pattern))


def registered_fields(name: str) -> dict:
    """The config fields a registered model name sets (a copy; the others are ModelConfig defaults)."""
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"unknown model {name!r}{hint} Available: {', '.join(list_models())}")
    return dict(_REGISTRY[name])


def model_config(name: str, **overrides: object) -> ModelConfig | MAEConfig:
    """The config (:class:`ModelConfig`, or :class:`MAEConfig` for ``crate_mae_*``) of a registered model
    with ``overrides`` applied (values are coerced and validated, e.g. ``lambd="5e-2"`` → 0.05)."""
    fields = registered_fields(name)
    cls = config_class(fields.get("arch"))
    valid = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(overrides) - valid)
    if bad:
        raise ValueError(f"unknown override(s) {bad} for {name!r}; valid fields: {sorted(valid)}")
    return cls(**{**fields, **overrides})


def build(config: ModelConfig | MAEConfig) -> ImageClassifier | CRATEMAE:
    """The model a config describes: :class:`CRATEMAE` for an MAEConfig, else :func:`build_model`."""
    return CRATEMAE(config) if isinstance(config, MAEConfig) else build_model(config)


def create_model(name: str, **overrides: object) -> ImageClassifier | CRATEMAE:
    """Build a registered model, e.g. ``create_model("crate_small", num_classes=10, image_size=32, patch_size=4)``
    or ``create_model("crate_mae_small")``."""
    return build(model_config(name, **overrides))
