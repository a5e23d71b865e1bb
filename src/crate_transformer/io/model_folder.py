"""The ``save_pretrained`` folder: the names of its files, their checksums, its reader and its writer.

* :func:`save_pretrained` (what ``model.save_pretrained(dir)`` calls): the weights' header also stores
  :func:`~crate_transformer.io.digests.json_sha256` of ``config.json`` and ``tokenizer.json``, which
  :func:`read_model_json` verifies, so every file that defines the computation is covered by a checksum.
* :func:`model_dir` / :func:`read_config_dict` — the folder a path names, and its verified ``config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._version import __version__
from .digests import json_sha256
from .errors import CheckpointError, WriteError
from .paths import check_kind, describe_path, path_kind
from .sidecars import _side_value, read_side_file
from .tensors import read_safetensors_metadata, save_safetensors
from .writes import _write_bytes, atomic_write, make_folder

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "TOKENIZER_NAME",
    "FILE_DIGESTS",
    "MODEL_FILES",
    "digest_key",
    "read_model_json",
    "model_dir",
    "read_config_dict",
    "save_pretrained",
]


CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TOKENIZER_NAME = "tokenizer.json"
# the weights' metadata key holding json_sha256 of each JSON file of a saved model: the config and the extra files
# the families write (``Model.extra_files``); a file named here that a save does not write is removed from the folder
FILE_DIGESTS = {CONFIG_NAME: "config_sha256", TOKENIZER_NAME: "tokenizer_sha256"}
# the files of a save_pretrained folder: each, where present, must be a regular file (checked by model_dir)
MODEL_FILES = tuple(dict.fromkeys((CONFIG_NAME, WEIGHTS_NAME, *FILE_DIGESTS)))


def digest_key(name: str) -> str:
    """The weights' metadata key of the checksum of the saved JSON file ``name`` (``tokenizer.json`` →
    ``tokenizer_sha256``)."""
    return FILE_DIGESTS.get(name) or f"{Path(name).stem}_sha256"


def read_model_json(directory: str | Path, name: str) -> tuple[str, Any]:
    """The text and parsed content of ``directory/name`` (``config.json`` or ``tokenizer.json`` of a saved
    model), verified against the :func:`json_sha256` stored in the header of ``directory/model.safetensors``.

    Invalid JSON, a checksum mismatch, and a ``tokenizer.json`` beside weights whose header covers the config
    but not a tokenizer are one-line :class:`CheckpointError`; folders saved before these checksums were
    stored (no ``config_sha256``) are read unverified, as before.
    """
    path = Path(directory) / name
    # every model file of this name holds settings by name (a JSON object): a list is no config
    fix = f"restore the {name} that came with the model (re-save or re-download the folder)"
    text = read_side_file(path, fix, form="text")  # read once: the checksum covers what was parsed
    data = _side_value(text, path, fix, "json", dict)
    weights = Path(directory) / WEIGHTS_NAME
    meta = read_safetensors_metadata(weights) if path_kind(weights) != "missing" else {}
    expected = meta.get(digest_key(name))
    if expected is None and FILE_DIGESTS[CONFIG_NAME] in meta:
        raise CheckpointError(
            f"{path} is not covered by the checksums in {weights} (the model was saved without it); attach it "
            "to the model (model.tokenizer = Tokenizer.from_file(...)) and save the model again"
        )
    if expected is not None and json_sha256(data) != expected:
        raise CheckpointError(
            f"{path} is corrupt: its content does not match the checksum stored in {weights.name}; re-save or "
            "re-download the model folder (after editing it by hand, load the model, change it and save it again)"
        )
    return text, data


def model_dir(path: str | Path) -> Path:
    """The ``save_pretrained`` folder of ``path``: the folder itself, or the folder of its
    ``model.safetensors`` / ``config.json`` when one of those files is given."""
    path = Path(path)
    kind = path_kind(path)
    if kind not in ("file", "folder", "missing"):
        raise CheckpointError(
            f"{path} {describe_path(path)}, not a model folder; pass the folder written by model.save_pretrained"
        )
    if kind == "file":
        if path.name in (WEIGHTS_NAME, CONFIG_NAME):
            return _model_files(path.parent)
        raise CheckpointError(
            f"{path} is a file; pass the folder written by model.save_pretrained (with {CONFIG_NAME} and "
            f"{WEIGHTS_NAME}), or load an official .pth with from_official / load_model"
        )
    if kind == "missing":
        raise CheckpointError(f"model directory not found: {path}")
    return _model_files(path)


def _model_files(directory: Path, error: type[Exception] = CheckpointError) -> Path:
    """``directory``, after checking that each of :data:`MODEL_FILES` it holds is a regular file (a folder, a
    broken link, a device or a FIFO under such a name is one line, an ``error``, and never read)."""
    for name in MODEL_FILES:
        fix = f"restore the {name} that came with the model (re-save or re-download the folder)"
        if error is WriteError:
            fix = "remove it or save to another folder"
        check_kind(directory / name, "file", fix, error)
    return directory


def read_config_dict(directory: str | Path) -> dict:
    """The verified JSON object of ``directory/config.json`` (a ``save_pretrained`` folder), without the
    package version it records; which config class reads it is the caller's (by its ``arch``)."""
    directory = Path(directory)
    path = directory / CONFIG_NAME
    if path_kind(path) == "missing":  # anything else but a file is named by the reader
        raise CheckpointError(
            f"no {CONFIG_NAME} in {directory}; expected a directory written by model.save_pretrained(...)"
        )
    _, data = read_model_json(directory, CONFIG_NAME)  # verified against the checksum beside the weights
    data.pop("crate_transformer_version", None)
    data.pop("model_type", None)  # transformers' name of the config class (save_pretrained), not a field
    return data


def save_pretrained(model: Any, directory: str | Path) -> Path:
    """Write ``config.json`` (``model.config.to_dict()`` plus the package version), the model's extra files
    (``model.extra_files()``: a language model's ``tokenizer.json``) and ``model.safetensors`` into ``directory``,
    each atomically; read back with ``from_pretrained``.

    The weights are written last, with the checksum of the tensors and :func:`json_sha256` of each JSON file
    in their header: an interrupted save leaves no weights (an incomplete folder, refused on load), and a
    changed byte in any of the files is caught when the folder is loaded.  An extra file of an earlier save
    that this model does not write (a ``tokenizer.json`` beside a model without one) is removed: it would
    describe another model.
    """
    directory = _model_files(make_folder(directory, "model folder"), WriteError)  # no FIFO where a file goes
    meta = {"crate_transformer_version": __version__, "config_version": model.config.VERSION}
    if getattr(model.config, "MODEL_TYPE", None):  # transformers' AutoConfig reads the config class off it
        meta["model_type"] = model.config.MODEL_TYPE
    files = {CONFIG_NAME: json.dumps({**meta, **model.config.to_dict()}, indent=2) + "\n", **model.extra_files()}
    for name in FILE_DIGESTS:
        if name not in files:
            (directory / name).unlink(missing_ok=True)
    digests = {digest_key(name): json_sha256(json.loads(text)) for name, text in files.items()}
    for name, text in files.items():
        atomic_write(directory / name, _write_bytes(text.encode("utf-8")))
    save_safetensors(model.state_dict(), directory / WEIGHTS_NAME, metadata=digests)
    return directory
