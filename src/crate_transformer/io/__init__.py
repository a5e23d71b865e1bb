"""File helpers: atomic writes with one-line errors, safe unpickling, safetensors with a checksum, a
deterministic hash of nested tensor payloads, and the ``save_pretrained`` method of the models.

This package imports nothing from the model, the registry or the checkpoint loaders (``base.py`` imports it for
``save_pretrained``, :mod:`crate_transformer.loading` for the readers), so there is no cycle; its modules import only
downward, in the order listed, and every public name is re-exported here (``from crate_transformer.io import
atomic_write``):

* :mod:`~crate_transformer.io.errors` — the one-line errors: :class:`CheckpointError`, :class:`DamagedFileError`,
  :class:`WriteError`.
* :mod:`~crate_transformer.io.paths` — what a path is, decided without opening it (:func:`path_kind`,
  :func:`describe_path`, :func:`check_kind`), so a device or a FIFO is named, never read.
* :mod:`~crate_transformer.io.writes` — :func:`atomic_write`, :func:`make_folder` (the one writer of folders) and
  :func:`write_json`: a full disk or an unwritable target is a one-line :class:`WriteError`.
* :mod:`~crate_transformer.io.digests` — checksums: :func:`tree_sha256` (nested tensor payloads),
  :func:`file_digest` (a file's bytes), :func:`json_sha256` (parsed JSON content).
* :mod:`~crate_transformer.io.pickles` — ``torch.save`` files: :func:`save_torch`, :func:`load_pickle` (safe
  unpickling), :func:`save_state` / :func:`load_state` (training states with a checksum).
* :mod:`~crate_transformer.io.tensors` — safetensors with a checksum: :func:`save_safetensors`,
  :func:`load_safetensors`, :func:`read_safetensors_metadata`.
* :mod:`~crate_transformer.io.sidecars` — :func:`read_side_file`, the one reader of the small files beside the
  weights (``config.yaml``, ``metrics.jsonl``, ``trackers.json``, indexes, caches), and :func:`load_yaml`, the one
  YAML parser (its aliases' expansion bounded).
* :mod:`~crate_transformer.io.model_folder` — the ``save_pretrained`` folder: its file names (:data:`CONFIG_NAME`,
  :data:`WEIGHTS_NAME`, :data:`TOKENIZER_NAME`, :data:`MODEL_FILES`), :func:`save_pretrained` (what
  ``model.save_pretrained(dir)`` calls), :func:`read_model_json`, :func:`model_dir` and :func:`read_config_dict`.
"""

from __future__ import annotations

from .digests import file_digest, json_sha256, tree_sha256
from .errors import CheckpointError, DamagedFileError, WriteError
from .model_folder import (
    CONFIG_NAME,
    MODEL_FILES,
    TOKENIZER_NAME,
    WEIGHTS_NAME,
    digest_key,
    model_dir,
    read_config_dict,
    read_model_json,
    save_pretrained,
)
from .model_folder import FILE_DIGESTS as FILE_DIGESTS
from .paths import PATH_KINDS as PATH_KINDS
from .paths import check_kind, describe_path, path_kind
from .pickles import SAFE_CLASSES as SAFE_CLASSES
from .pickles import STATE_DIGEST as STATE_DIGEST
from .pickles import load_pickle, load_state, save_state, save_torch
from .sidecars import SIDE_FORMS as SIDE_FORMS
from .sidecars import YAML_VALUES as YAML_VALUES
from .sidecars import load_yaml, read_side_file
from .tensors import load_safetensors, read_safetensors_metadata, save_safetensors
from .writes import atomic_write, make_folder, write_json

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "TOKENIZER_NAME",
    "CheckpointError",
    "DamagedFileError",
    "WriteError",
    "path_kind",
    "describe_path",
    "check_kind",
    "make_folder",
    "read_side_file",
    "load_yaml",
    "atomic_write",
    "write_json",
    "save_torch",
    "load_pickle",
    "save_state",
    "load_state",
    "tree_sha256",
    "json_sha256",
    "file_digest",
    "save_safetensors",
    "load_safetensors",
    "read_safetensors_metadata",
    "read_model_json",
    "digest_key",
    "MODEL_FILES",
    "model_dir",
    "read_config_dict",
    "save_pretrained",
]
