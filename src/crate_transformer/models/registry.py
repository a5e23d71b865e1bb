"""The model factory (timm's ``_factory``): ``create_model(name, **overrides)`` and ``list_models()``.

The tables it reads are :mod:`crate_transformer.models._registry` (re-exported here under their familiar names:
``register_arch``, ``register_model``, ``model_config``, ...), filled by the family modules this module
imports: each family registers its architectures, its named models and its released weights at the bottom
of its own module (``model.py``: CRATE and ViT classifiers; ``mae.py``: CRATE-MAE; ``lm.py``: CRATE-GPT,
CRATE-BERT in the eqs. (83)-(84) form and GPT-2; ``bert.py``: the released CRATE-BERT; ``alpha.py``:
CRATE-α; ``tost.py``: ToST).  A new family is one module plus its registry lines (``docs/adding_a_model.md``).

CRATE sizes are JMLR Table 8 (p.96); ViT sizes are the standard ViT-T/S/B/L (timm layout, the paper's
baselines); CRATE-MAE sizes are the official ``mae_crate_*`` factories (Table 9, p.96); CRATE-BERT /
CRATE-GPT sizes are Table 10 (p.97).
"""

from __future__ import annotations

from pathlib import Path

from ..loading.pretrained import load_pretrained
from . import alpha, bert, classifier, lm, mae, tost  # noqa: F401  (each registers its family into the tables)
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
from .base import Model, timm_overrides

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
    pooled features).
    """
    overrides = timm_overrides(overrides)
    if checkpoint_path is not None:
        if pretrained_file is not None:
            raise ValueError("checkpoint_path (timm's name) and pretrained_file name the same file; pass one")
        pretrained_file = checkpoint_path
    if pretrained or pretrained_file is not None:
        return load_pretrained(name, pretrained_file=pretrained_file, **overrides)
    return build(model_config(name, **overrides))
