"""The loaders at their former path: :mod:`crate_transformer.loading.pipeline` is the one loader pipeline
(``load_model``, ``from_pretrained``, ``from_official``: a source resolved once, one conversion step, one build).

The file primitives (atomic writes, safe unpickling, checksummed safetensors) live in :mod:`crate_transformer.io`,
the official key maps and converters in :mod:`crate_transformer.official`; ``atomic_write``, ``load_pickle``,
``save_pretrained``, ``load_weights``, ``resolve_hub``, ``CheckpointError`` and those maps are re-exported here for
code written when they lived here.
"""

from __future__ import annotations

from ._hub import resolve_hub
from .io import CheckpointError, atomic_write, load_pickle, save_pretrained
from .loading.pipeline import (
    ArchitectureNeeded,
    check_stored_config,
    config_from_dict,
    from_official,
    from_pretrained,
    load_model,
    read_config,
)
from .loading.weights import load_weights
from .official import (  # noqa: F401  (re-exported at their former paths)
    CLASSIFIER_KEY_MAP,
    MAE_KEY_MAP,
    mae_native_to_official,
    mae_official_to_native,
    native_to_official,
    official_to_native,
)

__all__ = [
    "ArchitectureNeeded",
    "CheckpointError",
    "atomic_write",
    "check_stored_config",
    "load_pickle",
    "save_pretrained",
    "read_config",
    "config_from_dict",
    "from_pretrained",
    "from_official",
    "load_model",
    "load_weights",
    "resolve_hub",
]
