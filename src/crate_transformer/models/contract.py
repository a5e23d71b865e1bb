"""The config half of the capability contract (:mod:`crate_transformer.models.base`): :class:`FamilyConfig`, the
base of every model family's config, and the kinds of model (:data:`KINDS`).

The tasks, the analysis, the features, the CLI and the loaders ask a model's config what the model is instead of
checking its class or its ``arch`` name: :attr:`FamilyConfig.kind` (one of :data:`KINDS`),
:attr:`~FamilyConfig.white_box`, :attr:`~FamilyConfig.sparse_output` (JMLR Figs. 14-15),
:attr:`~FamilyConfig.layer_blocks`, :attr:`~FamilyConfig.pipeline_tag` and :attr:`~FamilyConfig.BLOCK_COUNTS`.  The
options of a training, a task or a command (a :class:`~crate_transformer.config.Config` directly) describe no model
and have none of these.

This module imports only the config base, so the loaders below ``models.base`` can name it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ..config import Config

__all__ = ["FamilyConfig", "KINDS", "IMAGE_CLASSIFIER", "MASKED_AUTOENCODER", "LANGUAGE_MODEL"]

# what a model is (``FamilyConfig.kind``): the question a training task, the analysis or a loader asks of it
IMAGE_CLASSIFIER = "image classifier"  # images → class logits; the classification (and dino) task trains it
MASKED_AUTOENCODER = "masked autoencoder"  # images → reconstructed patches; the mae task trains it
LANGUAGE_MODEL = "language model"  # token ids → token logits; the lm task trains it
KINDS = (IMAGE_CLASSIFIER, MASKED_AUTOENCODER, LANGUAGE_MODEL)


class FamilyConfig(Config):
    """Base of every model family's config (a ``@dataclass`` as every :class:`~crate_transformer.config.Config`):
    what a model of it is, each with a default here that a family's class attribute or property replaces."""

    # what a model of this config is (one of KINDS; "" for a common base that describes no model)
    kind: ClassVar[str] = ""
    # a training takes a family's fields as entries of model_args: messages name them so (``--model-args dim``)
    GIVEN_IN: ClassVar[str | None] = "model_args"
    # the config's counts of numbered blocks → the blocks' key prefix in its weights ({"depth": "layers"}): a count
    # read from a file is bounded by the keys of the weights beside it (loading.weights.check_sizes)
    BLOCK_COUNTS: ClassVar[Mapping[str, str]] = {}

    @property
    def pipeline_tag(self) -> str:
        """The Hugging Face Hub pipeline tag of a model of this config (its model card's task)."""
        return ""

    @property
    def white_box(self) -> bool:
        """Whether the layers are CRATE layers (MSSA, then a sparsification step) the analysis measures."""
        return False

    @property
    def sparse_output(self) -> bool:
        """Whether every layer ends with CRATE's ISTA step (outputs with exact zeros, JMLR Figs. 14-15)."""
        return False

    @property
    def layer_blocks(self) -> tuple[str, str]:
        """The layer's two blocks: attention (``"mssa"``, ``"mhsa"``) and the second block (``"ista"``, ``"mlp"``,
        ``"odl"``, ``"ista_overcomplete"``); ``("", "")`` for a config that describes no layers."""
        return ("", "")
