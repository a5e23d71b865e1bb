"""The model factory (timm's ``_factory``): ``create_model(name, **overrides)`` and ``list_models()``.

The tables it reads are :mod:`crate_transformer.models._registry` (re-exported here under their familiar names:
``register_arch``, ``register_model``, ``model_config``, ...), filled by the family modules this module
imports: each family registers its architectures, its named models and its released weights at the bottom
of its own module (``classifier.py``: CRATE and ViT classifiers, whose named models and released weights fill
``classifier_zoo.py``; ``mae.py``: CRATE-MAE; ``lm.py``: CRATE-GPT, CRATE-BERT in the eqs. (83)-(84) form and
GPT-2; ``bert.py``: the released CRATE-BERT; ``alpha.py``: CRATE-α; ``tost.py``: ToST).  A new family is one
module plus its registry lines (``docs/adding_a_model.md``).

CRATE sizes are JMLR Table 8 (p.96); ViT sizes are the standard ViT-T/S/B/L (timm layout, the paper's
baselines); CRATE-MAE sizes are the official ``mae_crate_*`` factories (Table 9, p.96); CRATE-BERT /
CRATE-GPT sizes are Table 10 (p.97).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from ..errors import OptionError
from ..loading.pretrained import load_pretrained
from . import alpha, bert, classifier, classifier_zoo, lm, mae, tost  # noqa: F401  (each fills the tables)
from ._registry import (
    Arch,
    arch_info,
    build,
    config_class,
    config_classes,
    list_models,
    model_config,
    model_kind,
    official_formats,
    register_arch,
    register_model,
    registered_fields,
)
from .base import TIMM_ARGS, Model, take_indices, timm_overrides

__all__ = [
    "Arch",
    "register_arch",
    "arch_info",
    "official_formats",
    "register_model",
    "list_models",
    "registered_fields",
    "config_class",
    "config_classes",
    "model_config",
    "model_kind",
    "build",
    "create_model",
    "FeatureListNet",
    "FeatureInfo",
]


def create_model(
    name: str,
    pretrained: bool = False,
    pretrained_file: str | Path | None = None,
    checkpoint_path: str | Path | None = None,
    **overrides: object,
) -> Model:
    """Build a registered model, e.g. ``create_model("crate_small", num_classes=10, image_size=32, patch_size=4)``,
    ``create_model("crate_mae_small")`` or ``create_model("crate_gpt_mini", depth=2)``.

    ``pretrained=True`` loads the authors' released weights (``ct.list_pretrained()`` names the models that
    have them), downloaded through the Hugging Face cache; ``pretrained_file=PATH`` (timm's ``checkpoint_path``)
    loads a file already on disk (a Google Drive release, any checkpoint in the authors' format for ``name``) or a
    folder this package wrote (``save_pretrained``, a finished run).  With either, a ``num_classes`` other than the
    file's loads the backbone and gives a fresh head (logged).  timm's names work: ``img_size``,
    ``drop_path_rate``, ``drop_rate``, ``global_pool`` (``"token"``, ``"avg"``;
    :data:`~crate_transformer.models.base.TIMM_ARGS`); ``num_classes=0`` builds the model without a classifier (its
    pooled features).  ``features_only=True`` (``out_indices``: the layers, default the last three) returns a
    :class:`FeatureListNet`, timm's feature extractor: a list of ``(b, d, h, w)`` maps and ``.feature_info``.
    """
    features = _feature_options(overrides)
    _timm_names_apply(name, overrides)
    overrides = timm_overrides(overrides)
    if checkpoint_path is not None:
        if pretrained_file is not None:
            raise ValueError("checkpoint_path (timm's name) and pretrained_file name the same file; pass one")
        pretrained_file = checkpoint_path
    if pretrained or pretrained_file is not None:
        model = load_pretrained(name, pretrained_file=pretrained_file, **overrides)
    else:
        model = build(model_config(name, written=overrides, **overrides))
    return model if features is None else FeatureListNet(model, features)


def _timm_names_apply(name: str, overrides: Mapping[str, object]) -> None:
    """One line for a timm argument (``img_size``, ``global_pool``, ...) whose field the model's config does not
    have (a language model's ``image_size``, ToST's ``pool``), naming timm's word and the package's."""
    fields = {f.name for f in dataclasses.fields(model_config(name))}
    for timm, ours in TIMM_ARGS.items():
        if timm in overrides and ours not in fields:
            raise OptionError(
                f"{timm} (timm's name for {ours}) does not apply to {name}: its {type(model_config(name)).__name__} "
                f"has no {ours}; drop {timm}",
                option=timm,
            )


def _feature_options(overrides: dict[str, object]) -> int | list[int] | None:
    """timm's ``features_only`` / ``out_indices`` taken out of ``overrides``: the layers to return feature maps
    of (``out_indices`` alone is a one-line error: it only selects features)."""
    only, indices = overrides.pop("features_only", False), overrides.pop("out_indices", None)
    if not isinstance(only, bool):
        raise OptionError(f"features_only must be True or False, got {only!r}", option="features_only")
    if indices is not None and not only:
        raise OptionError("out_indices selects the layers of features_only=True; pass both", option="out_indices")
    if not only:
        return None
    return FEATURE_LAYERS if indices is None else indices


FEATURE_LAYERS = 3  # timm's ViT default for features_only: the last three blocks


class FeatureInfo:
    """timm's ``feature_info`` of a feature extractor: per returned map, its channels (``num_chs``), its
    ``reduction`` (the patch size: pixels per map cell) and ``module`` (``layers.{i}``)."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.info = entries
        self.out_indices = [e["index"] for e in entries]

    def _get(self, key: str, idx: int | Sequence[int] | None) -> Any:
        if idx is None:
            return [e[key] for e in self.info]
        return [self.info[i][key] for i in idx] if isinstance(idx, Sequence) else self.info[idx][key]

    def channels(self, idx: int | Sequence[int] | None = None) -> Any:
        return self._get("num_chs", idx)

    def reduction(self, idx: int | Sequence[int] | None = None) -> Any:
        return self._get("reduction", idx)

    def module_name(self, idx: int | Sequence[int] | None = None) -> Any:
        return self._get("module", idx)

    def get_dicts(self) -> list[dict[str, Any]]:
        return [dict(e) for e in self.info]

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.info[i]

    def __len__(self) -> int:
        return len(self.info)


class FeatureListNet(nn.Module):
    """timm's ``create_model(name, features_only=True, out_indices=...)``: ``forward(x)`` returns the list of the
    chosen layers' patch tokens as ``(b, d, h, w)`` maps (``forward_intermediates``, the layers after the last
    one chosen skipped), with :class:`FeatureInfo` as ``feature_info``; the model is ``.model``."""

    def __init__(self, model: Model, out_indices: int | Sequence[int]) -> None:
        super().__init__()
        if not callable(getattr(model, "forward_intermediates", None)):
            raise OptionError(
                f"features_only builds feature maps of image models, and this is a {model.kind} "
                f"({model.config.arch}); drop features_only (forward_trace gives every layer's tokens)",
                option="features_only",
            )
        self.model = model
        self.out_indices = take_indices(len(model.layers), out_indices)
        dim, patch = model.num_features, model.config.patch_size
        self.feature_info = FeatureInfo(
            [{"num_chs": dim, "reduction": patch, "module": f"layers.{i}", "index": i} for i in self.out_indices]
        )

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.model.forward_intermediates(x, self.out_indices, stop_early=True, intermediates_only=True)
