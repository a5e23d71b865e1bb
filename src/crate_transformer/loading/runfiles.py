"""The files this package writes that a loader reads back: a training run's folder and a training state, and what
tells this package's own files from the authors' (the layout, not the trainer).

* a run folder ``RUN/`` holds ``model/`` (the final ``save_pretrained`` folder, :data:`MODEL_DIR`) once the run
  ends and ``checkpoints/last.pt`` (the training state, :data:`CHECKPOINT`) while it runs;
* a training state is a dict with ``model_config`` and ``model`` (the weights; a task that trains a wrapper names
  the weights it exports under ``task["export_model"]``) and, for a language model, ``task["tokenizer"]``;
* a ``save_pretrained`` folder holds ``config.json`` (with the model's ``arch``, never Hugging Face's
  ``model_type``) and ``model.safetensors``.

The trainer (:mod:`crate_transformer.train.rundir`) writes these files; the loaders
(:func:`crate_transformer.loading.pipeline.load_model`, ``from_official``'s refusal of this package's own files) read
them through the functions here, so the layout is stated once and sits below both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..io import CONFIG_NAME, FILE_DIGESTS, WEIGHTS_NAME, read_safetensors_metadata

__all__ = [
    "CHECKPOINT",
    "MODEL_DIR",
    "run_model_source",
    "state_model",
    "state_tokenizer",
    "is_saved_model_dir",
    "is_run_dir",
    "is_training_state",
]

CHECKPOINT = Path("checkpoints") / "last.pt"
MODEL_DIR = "model"  # the final save_pretrained folder of a run
# keys only Hugging Face's config.json has (transformers' PretrainedConfig): a folder holding one is an authors' port
_HF_CONFIG_KEYS = ("model_type", "architectures")
# the model_type save_pretrained writes (``Config.MODEL_TYPE``, what transformers' AutoConfig reads) starts with it
MODEL_TYPE_PREFIX = "crate_transformer"


def is_saved_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by ``save_pretrained``: a ``config.json`` that is not Hugging Face's
    (no ``model_type`` / ``architectures``; an unreadable one counts as ours, so its own loader reports it)."""
    path = Path(path)
    if not (path / CONFIG_NAME).is_file():
        return False
    try:
        data = json.loads((path / CONFIG_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return _saved_weights(path)
    if not isinstance(data, dict):
        return _saved_weights(path)
    ours = str(data.get("model_type", "")).startswith(MODEL_TYPE_PREFIX)  # save_pretrained's, for transformers
    return ours or not any(k in data for k in _HF_CONFIG_KEYS)


def _saved_weights(path: Path) -> bool:
    """Whether a folder whose ``config.json`` cannot tell (unreadable, or no JSON object) is this package's, by its
    weights: ``save_pretrained`` never writes ``pytorch_model.bin`` and records the config's checksum in the header
    of ``model.safetensors``; without weights it counts as ours, so its own loader names what is missing."""
    if (path / "pytorch_model.bin").is_file():
        return False
    if not (path / WEIGHTS_NAME).is_file():
        return True
    try:
        return FILE_DIGESTS[CONFIG_NAME] in read_safetensors_metadata(path / WEIGHTS_NAME)
    except ValueError:  # a damaged header: the package's own loader reports it
        return True


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run folder with something to load (its ``model/`` or its training state)."""
    path = Path(path)
    return path.is_dir() and ((path / MODEL_DIR / CONFIG_NAME).is_file() or (path / CHECKPOINT).is_file())


def run_model_source(path: str | os.PathLike) -> Path:
    """What a run directory offers to load: its final model folder (``model/``) once the run has written it,
    else its latest training state (``checkpoints/last.pt``) while it runs; any other path unchanged."""
    path = Path(path)
    if path.is_dir() and not (path / CONFIG_NAME).is_file():
        if (path / MODEL_DIR / CONFIG_NAME).is_file():
            return path / MODEL_DIR
        if (path / CHECKPOINT).is_file():
            return path / CHECKPOINT
    return path


def is_training_state(state: object) -> bool:
    """Whether a loaded file is a training state of this package (``model_config`` and ``model``)."""
    return isinstance(state, Mapping) and "model_config" in state and "model" in state


def state_model(state: object) -> tuple[Mapping, Mapping] | None:
    """``(model config dict, weights)`` of a training state, or None when ``state`` is not one.  A task that
    trains a wrapper of the model names the weights to export under ``task["export_model"]`` (DINO: the
    teacher's backbone, not the student wrapper)."""
    if not is_training_state(state):
        return None
    task = state.get("task")
    if isinstance(task, Mapping) and isinstance(task.get("export_model"), Mapping):
        return state["model_config"], task["export_model"]
    return state["model_config"], state["model"]


def state_tokenizer(state: object) -> str | None:
    """The tokenizer.json text a language-model training state holds (``task["tokenizer"]``), else None; the
    state's checksum covers it like the weights."""
    task = state.get("task") if isinstance(state, Mapping) else None
    tok = task.get("tokenizer") if isinstance(task, Mapping) else None
    return tok if isinstance(tok, str) else None
