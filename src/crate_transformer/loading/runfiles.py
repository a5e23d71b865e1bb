"""The files this package writes that a loader reads back: a training run's folder and a training state, and what
tells this package's own files from the authors' (the layout, not the trainer).

* a run folder ``RUN/`` holds ``model/`` (the final ``save_pretrained`` folder, :data:`MODEL_DIR`) once the run
  ends and ``checkpoints/last.pt`` (the training state, :data:`CHECKPOINT`) while it runs;
* a training state is a dict with ``model_config`` and ``model`` (the weights; a task that trains a wrapper names
  the weights it exports under ``task["export_model"]``) and, for a language model, ``task["tokenizer"]``;
* a ``save_pretrained`` folder holds ``config.json`` (with the model's ``arch``, never Hugging Face's
  ``model_type``) and ``model.safetensors``.

:data:`RUN_FILES` declares every file and folder a run folder holds (what each must be and how to recover it), and
:func:`check_run_folder` checks them all by what they are before any command reads one (``--resume``, ``eval``,
``analyze``, ``features``, ``load_model`` / ``from_pretrained`` of a run): a folder, a broken link, a device, a FIFO
or a socket where a file belongs is one line naming it, never read (a ``trackers.json`` linked to ``/dev/zero``
made a resumed run read forever).

The trainer (:mod:`crate_transformer.train.rundir`) writes these files; the loaders
(:func:`crate_transformer.loading.pipeline.load_model`, ``from_official``'s refusal of this package's own files) read
them through the functions here, so the layout is stated once and sits below both.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..io import (
    CONFIG_NAME,
    FILE_DIGESTS,
    MODEL_FILES,
    WEIGHTS_NAME,
    DamagedFileError,
    check_kind,
    describe_path,
    path_kind,
    read_safetensors_metadata,
)

__all__ = [
    "CHECKPOINT",
    "MODEL_DIR",
    "RunFile",
    "RUN_FILES",
    "CONFIG_FIX",
    "METRICS_FIX",
    "IDS_FIX",
    "check_run_folder",
    "run_model_source",
    "state_model",
    "state_tokenizer",
    "is_saved_model_dir",
    "is_run_dir",
    "is_training_state",
]

CHECKPOINT = Path("checkpoints") / "last.pt"
MODEL_DIR = "model"  # the final save_pretrained folder of a run
# how to recover a damaged config.yaml: the checkpoint holds the options, and a resumed run writes them again
CONFIG_FIX = "restore it from a backup, or delete it and resume the run, which writes it again from its checkpoint"
METRICS_FIX = (
    "restore it from a backup, or delete it (the run's earlier records are lost; its checkpoint and model are not)"
)
IDS_FIX = "restore it, or delete it to log the rest of the run to new tracker runs (W&B, MLflow)"
_MODEL_FIX = f"restore it, or delete {MODEL_DIR}/ and resume the run, which writes it again from its checkpoint"
_REDRAWN = "delete it: the run writes it again"


@dataclasses.dataclass(frozen=True)
class RunFile:
    """One entry of a run folder: ``kind`` (``"file"``: a regular file, or ``"folder"``) and ``fix``, how to
    recover it when it is damaged or is something else (a FIFO, a device, a broken link)."""

    kind: str
    fix: str


# Every file and folder a run folder holds, by its path in the folder ("*.png": the figures, any name).  The
# trackers' own folders are checked as folders; what their backends keep inside them is theirs.
RUN_FILES: dict[str, RunFile] = {
    "config.yaml": RunFile("file", CONFIG_FIX),
    "metrics.jsonl": RunFile("file", METRICS_FIX),
    "metrics.csv": RunFile("file", "delete it: a resumed run writes it again from metrics.jsonl"),
    "trackers.json": RunFile("file", IDS_FIX),
    ".lock": RunFile("file", "delete it: it only marks the folder in use while a command runs"),
    "*.png": RunFile("file", _REDRAWN),
    "layerwise.json": RunFile("file", "delete it: the ablation measures it again"),
    "checkpoints": RunFile("folder", "restore the run's checkpoints/ folder from a backup"),
    str(CHECKPOINT.as_posix()): RunFile(
        "file", "restore it from a backup (it is the run's training state: without it the run cannot be resumed)"
    ),
    MODEL_DIR: RunFile("folder", _MODEL_FIX),
    **{f"{MODEL_DIR}/{name}": RunFile("file", _MODEL_FIX) for name in MODEL_FILES},
    **{
        name: RunFile("folder", "delete it (that logger's records of this run are lost)")
        for name in ("tensorboard", "wandb", "mlruns")
    },
}
# the folders whose entries are checked one by one (a FIFO named like no declared file is refused there too)
_CHECKED_FOLDERS = ("", "checkpoints", MODEL_DIR)
_MARKERS = ("config.yaml", "checkpoints", MODEL_DIR)  # what tells a run folder (any one of them, of any kind)


def check_run_folder(path: str | os.PathLike) -> Path:
    """``path``, after checking every entry of the run folder by what it is (:func:`~crate_transformer.io.path_kind`,
    nothing opened): each declared in :data:`RUN_FILES` must be of its kind, and any other entry of the run folder,
    its ``checkpoints/`` or its ``model/`` a regular file or a folder.  Anything else — a folder where a file
    belongs, a broken link, a device, a FIFO, a socket — is a one-line
    :class:`~crate_transformer.io.DamagedFileError` naming it and how to recover, before any command reads it."""
    path = Path(path)
    for name, entry in RUN_FILES.items():
        if "*" not in name:
            check_kind(path / name, entry.kind, entry.fix, DamagedFileError)
    for folder in _CHECKED_FOLDERS:
        if path_kind(path / folder) != "folder":
            continue
        for child in (path / folder).iterdir():
            rel = child.relative_to(path).as_posix()
            declared = RUN_FILES.get(rel) or (RUN_FILES["*.png"] if folder == "" and child.suffix == ".png" else None)
            if declared is not None:
                check_kind(child, declared.kind, declared.fix, DamagedFileError)
            elif path_kind(child) not in ("file", "folder"):
                raise DamagedFileError(f"{child} {describe_path(child)}, not a file or a folder; delete it")
    return path


def _run_folder(path: Path) -> bool:
    """Whether ``path`` is a run folder (a folder, not a ``save_pretrained`` one, holding any of its markers, of
    whatever kind), checked by :func:`check_run_folder` when it is."""
    if path_kind(path) != "folder" or path_kind(path / CONFIG_NAME) != "missing":
        return False
    if not any(os.path.lexists(path / m) for m in _MARKERS):
        return False
    check_run_folder(path)
    return True


# keys only Hugging Face's config.json has (transformers' PretrainedConfig): a folder holding one is an authors' port
_HF_CONFIG_KEYS = ("model_type", "architectures")
# the model_type save_pretrained writes (``Config.MODEL_TYPE``, what transformers' AutoConfig reads) starts with it
MODEL_TYPE_PREFIX = "crate_transformer"


def is_saved_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder written by ``save_pretrained``: a ``config.json`` that is not Hugging Face's
    (no ``model_type`` / ``architectures``; an unreadable one counts as ours, so its own loader reports it)."""
    path = Path(path)
    kind = path_kind(path / CONFIG_NAME)
    if kind != "file":  # a config.json that is a folder, a FIFO, a device: told by the weights, and named by the loader
        return kind != "missing" and _saved_weights(path)
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
    return _run_folder(path) and ((path / MODEL_DIR / CONFIG_NAME).is_file() or (path / CHECKPOINT).is_file())


def run_model_source(path: str | os.PathLike) -> Path:
    """What a run directory offers to load: its final model folder (``model/``) once the run has written it,
    else its latest training state (``checkpoints/last.pt``) while it runs; any other path unchanged."""
    path = Path(path)
    if _run_folder(path):
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
