"""File helpers: atomic writes with one-line errors, safe unpickling, safetensors with a checksum, a
deterministic hash of nested tensor payloads, and the ``save_pretrained`` method of the models.

This module imports nothing from the model, the registry or the checkpoint loaders (``base.py``
imports it for ``save_pretrained``, ``checkpoint.py`` for the readers), so there is no cycle.

* :func:`atomic_write` — write to a temporary file in the target folder, then rename it into place;
  a full disk or an unwritable folder is a one-line :class:`WriteError` and leaves no temporary file.
* :func:`load_pickle` — ``torch.load(weights_only=True)``; anything it refuses is a one-line
  :class:`CheckpointError` saying what the file is not and what to pass instead.
* :func:`save_torch` — ``torch.save`` through :func:`atomic_write` (so a full disk is reported as such).
* :func:`save_safetensors` / :func:`load_safetensors` — tensors plus ``{"format": "pt", "sha256": ...}``
  metadata; the reader verifies the checksum when present (older files without one still load).
* :func:`tree_sha256` — SHA-256 of nested dicts / lists / tuples of tensors, arrays and plain values.
* :func:`write_json` and :func:`save_pretrained` (what ``model.save_pretrained(dir)`` calls).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "CheckpointError",
    "WriteError",
    "atomic_write",
    "write_json",
    "save_torch",
    "load_pickle",
    "tree_sha256",
    "save_safetensors",
    "load_safetensors",
    "save_pretrained",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

_UMASK = os.umask(0)
os.umask(_UMASK)

_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, corrupt, or does not fit the model."""


class WriteError(OSError, ValueError):
    """A file could not be written (disk full, quota exceeded, folder not writable).

    Both an ``OSError`` (what callers that handle I/O errors expect) and a ``ValueError`` (what the
    command line prints as one line).  ``errno`` is the original error number.
    """


# --------------------------------------------------------------------------- writing
def _write_error(e: OSError, path: Path) -> OSError:
    """A one-line WriteError for a full disk or an unwritable folder; any other OSError is returned as is."""
    if e.errno in _NO_SPACE:
        what = "disk quota exceeded" if e.errno != errno.ENOSPC else "no space left on device"
        err = WriteError(f"{what} while writing {path}; free space or write to another folder")
    elif e.errno in _NO_PERMISSION:
        why = "read-only file system" if e.errno == errno.EROFS else "permission denied"
        err = WriteError(
            f"cannot write {path.name} to folder {path.parent} ({why}); write to another folder or fix its permissions"
        )
    else:
        return e
    err.errno = e.errno
    return err


def atomic_write(path: str | Path, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)``, then rename the temporary file (same folder) onto ``path``.

    A killed process never leaves a half-written file under the final name; on any failure the
    temporary file is removed and an existing ``path`` is untouched.  ``ENOSPC``/``EDQUOT`` (disk
    full, quota) and ``EACCES``/``EPERM``/``EROFS`` (folder not writable) become a one-line
    :class:`WriteError`; other exceptions propagate unchanged.  The file gets the usual
    umask-derived permissions (not ``mkstemp``'s private 0600).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise _write_error(e, path) from None
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            err = _write_error(e, path)
            if err is not e:
                raise err from None
        raise
    return path


def _write_bytes(data: bytes) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    return write


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    """Write ``obj`` as JSON (plus a final newline) atomically."""
    return atomic_write(path, _write_bytes((json.dumps(obj, indent=indent) + "\n").encode()))


def save_torch(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` atomically, through a Python file object so a full disk is an ``OSError``
    (``ENOSPC``) and therefore a one-line :class:`WriteError` (``torch.save(obj, str_path)`` reports
    it as an opaque ``RuntimeError``)."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            torch.save(obj, f)

    return atomic_write(path, write)


# --------------------------------------------------------------------------- reading pickles
_UNSAFE_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def load_pickle(path: str | Path) -> object:
    """``torch.load(path, weights_only=True)`` (safe for untrusted files) with one-line errors.

    A missing, empty, truncated or non-checkpoint file, or a pickle that needs globals outside
    torch's safe list, raises :class:`CheckpointError` saying what the file is not and what to pass
    instead.  Arbitrary pickles are never executed.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "not found"
        raise CheckpointError(f"checkpoint file {what}: {path}")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(
            f"cannot read checkpoint {path}: the file is empty (0 bytes); the save or download was interrupted — "
            "re-save or re-download it"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt zip, truncated file, disallowed pickle global, not a pickle at all
        raise CheckpointError(f"cannot read checkpoint {path}: {_describe_unreadable(path, e)}") from None


def _describe_unreadable(path: Path, e: Exception) -> str:
    """What the file is not and what to pass instead — never torch's advice to disable ``weights_only``."""
    text = str(e)
    with open(path, "rb") as f:
        head = f.read(8)
    refused = "is refused for safety (loading it could run arbitrary code)"
    fix = (
        "pass a checkpoint saved with torch.save(model.state_dict(), path), or convert it to a state dict of "
        "tensors in a trusted environment"
    )
    m = _UNSAFE_GLOBAL.search(text)
    if m:
        return f"it is a pickle that needs the global {m.group(1)}, outside torch's safe list, which {refused}; {fix}"
    if head.startswith(b"PK") and "Weights only load failed" in text:
        return f"it is a torch.save archive holding objects outside torch's safe list, which {refused}; {fix}"
    if head.startswith(b"PK"):
        return (
            "the torch.save zip archive is truncated or corrupt; re-save or re-download it "
            "(compare its size with the original)"
        )
    if head[:1] == b"\x80":
        return (
            "it is a pickle that torch's safe loader cannot read (written by pickle.dump rather than torch.save, "
            f"truncated, or holding arbitrary objects), which {refused}; {fix}"
        )
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        return (
            "it is a text file (an HTML error page or a failed download?), not a torch checkpoint; pass a file "
            "written by torch.save(state_dict, path)"
        )
    return "not a torch checkpoint (neither a torch.save zip archive nor a pickle); pass a file written by torch.save"


# --------------------------------------------------------------------------- hashing
def tree_sha256(obj: Any) -> str:
    """Hex SHA-256 of a nested structure of tensors, numpy arrays and plain values.

    Deterministic across calls and processes.  Tensors are hashed by dtype, shape and raw bytes
    (on the CPU, contiguous; any dtype — bfloat16 and friends through a same-size integer view);
    arrays likewise.  Dict entries are hashed in sorted-key order, so the hash does **not** depend
    on insertion order; lists and tuples are ordered and distinguished from each other.  Supported
    leaves: ``None``, ``bool``, ``int``, ``float`` (exact, via ``float.hex``), ``str``, ``bytes``,
    numpy scalars, ``torch.dtype`` and ``torch.device``; anything else raises a ``ValueError``
    (an object's ``repr`` may contain a memory address, so it is never hashed silently).
    """
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if obj is None:
        h.update(b"N;")
    elif isinstance(obj, bool):
        h.update(b"B1;" if obj else b"B0;")
    elif isinstance(obj, int):
        h.update(b"I%d;" % obj)
    elif isinstance(obj, float):
        h.update(b"F" + float.hex(obj).encode() + b";")
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(b"S%d:" % len(data) + data)
    elif isinstance(obj, (bytes, bytearray)):
        h.update(b"Y%d:" % len(obj) + bytes(obj))
    elif isinstance(obj, Tensor):
        _feed_tensor(h, obj)
    elif isinstance(obj, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(obj)
        if a.dtype.hasobject:
            raise ValueError("tree_sha256 cannot hash numpy object arrays; convert them to numbers or strings")
        h.update(b"A" + a.dtype.str.encode() + repr(a.shape).encode() + b"%d:" % a.nbytes)
        h.update(a.reshape(-1).view(np.uint8))
    elif isinstance(obj, Mapping):
        items = sorted(obj.items(), key=lambda kv: (type(kv[0]).__name__, repr(kv[0])))
        h.update(b"D%d{" % len(items))
        for k, v in items:
            _feed(h, k)
            _feed(h, v)
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update((b"L%d[" if isinstance(obj, list) else b"U%d(") % len(obj))
        for v in obj:
            _feed(h, v)
        h.update(b"]")
    elif isinstance(obj, (torch.dtype, torch.device)):
        h.update(b"O" + type(obj).__name__.encode() + b":" + str(obj).encode() + b";")
    else:
        raise ValueError(
            f"tree_sha256 cannot hash a {type(obj).__module__}.{type(obj).__name__}; "
            "pass tensors, arrays, numbers, strings, None and dicts/lists/tuples of them"
        )


def _feed_tensor(h: Any, t: Tensor) -> None:
    if t.layout != torch.strided:
        raise ValueError(f"tree_sha256 hashes dense tensors only, got layout {t.layout}; call .to_dense() first")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    flat = t.contiguous().reshape(-1)
    h.update(b"T" + str(t.dtype).encode() + repr(tuple(t.shape)).encode() + b"%d:" % (flat.numel() * t.element_size()))
    if flat.numel():
        h.update(flat.view(torch.uint8).numpy())


# --------------------------------------------------------------------------- safetensors
def save_safetensors(
    tensors: Mapping[str, Tensor], path: str | Path, metadata: Mapping[str, str] | None = None
) -> Path:
    """Write ``tensors`` to a ``.safetensors`` file atomically, with ``{"format": "pt", "sha256":
    tree_sha256(tensors)}`` (plus ``metadata``) in its header; :func:`load_safetensors` verifies it."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    meta = {"format": "pt", **(metadata or {}), "sha256": tree_sha256(tensors)}
    return atomic_write(path, _write_bytes(save(tensors, metadata=meta)))


def load_safetensors(path: str | Path, verify: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read a ``.safetensors`` file on the CPU → ``(tensors, metadata)``.

    With ``verify`` (the default) a stored ``sha256`` must match :func:`tree_sha256` of the tensors;
    a mismatch, a malformed header or a truncated file is a one-line :class:`CheckpointError`.
    Files without a checksum (written before checksums were stored) load unverified.
    """
    from safetensors.torch import load

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror}); check the path and its permissions") from None
    corrupt = f"{path} is corrupt or not a safetensors file"
    if len(data) < 8:
        raise CheckpointError(f"{corrupt} ({len(data)} bytes); re-save or re-download it")
    n = int.from_bytes(data[:8], "little")
    try:
        if n > len(data) - 8:
            raise ValueError("header longer than the file")
        header = json.loads(data[8 : 8 + n])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
        metadata = header.get("__metadata__") or {}
        tensors = load(data)
    except Exception as e:  # JSON error, SafetensorError, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{corrupt} ({first}); re-save or re-download it") from None
    expected = metadata.get("sha256")
    if verify and expected and tree_sha256(tensors) != expected:
        raise CheckpointError(f"{path} is corrupt: checksum mismatch; re-save or re-download it")
    return tensors, dict(metadata)


# --------------------------------------------------------------------------- save_pretrained
def _package_version() -> str:
    from . import __version__

    return __version__


def save_pretrained(model: Any, directory: str | Path) -> Path:
    """Write ``model.safetensors`` (with a checksum) and ``config.json`` (``model.config.to_dict()``
    plus the package version) into ``directory``, each atomically; read back with ``from_pretrained``."""
    directory = Path(directory)
    save_safetensors(model.state_dict(), directory / WEIGHTS_NAME)
    meta = {"crate_transformer_version": _package_version(), "config_version": model.config.VERSION}
    write_json(directory / CONFIG_NAME, {**meta, **model.config.to_dict()})
    return directory
