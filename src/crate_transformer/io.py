"""File helpers: atomic writes with one-line errors, safe unpickling, safetensors with a checksum, a
deterministic hash of nested tensor payloads, and the ``save_pretrained`` method of the models.

This module imports nothing from the model, the registry or the checkpoint loaders (``base.py``
imports it for ``save_pretrained``, ``checkpoint.py`` for the readers), so there is no cycle.

* :func:`atomic_write` — write to a temporary file in the target folder, then rename it into place;
  a full disk or an unwritable folder is a one-line :class:`WriteError` and leaves no temporary file.
* :func:`load_pickle` — ``torch.load(weights_only=True)``, plus ``argparse.Namespace`` (the MAE codebase's
  checkpoints store their arguments); anything it refuses is a one-line :class:`CheckpointError` saying
  what the file is not and what to pass instead.
* :func:`save_torch` — ``torch.save`` through :func:`atomic_write` (so a full disk is reported as such).
* :func:`save_state` / :func:`load_state` — a training state (``checkpoints/last.pt``) with the SHA-256 of its
  contents; :func:`load_state` is the one reader of such files (resume, ``load_model``, every command), so a
  flipped bit is caught wherever the file is read.
* :func:`save_safetensors` / :func:`load_safetensors` — tensors plus ``{"format": "pt", "sha256": ...}``
  metadata; the reader verifies the checksum when present (older files without one still load).
* :func:`tree_sha256` — SHA-256 of nested dicts / lists / tuples of tensors, arrays and plain values.
* :func:`path_kind` / :func:`describe_path` — what a path is, decided without opening it (a regular file, a folder,
  missing, an empty path, a broken symbolic link, a device, a FIFO, a socket): the reader and the writer below
  decide by it, so a device or a FIFO is named, never read (``/dev/zero`` would never end, a FIFO would block).
* :func:`make_folder` — the one writer of folders: every save and export (and :func:`atomic_write`, for the folder
  of each file) checks its target with it first, so a target that is a file, lies inside a file or cannot be
  written, is an empty path, a broken link, a device, a FIFO or a socket is a one-line :class:`WriteError` naming
  that target.
* :func:`read_side_file` — the one reader of the small files a run folder, a sweep or a cache holds beside the
  weights (``config.yaml``, ``metrics.jsonl``, ``trackers.json``, indexes, caches): a file that is unreadable,
  empty, not UTF-8, malformed or of the wrong kind is a one-line :class:`DamagedFileError` naming it, what is
  wrong and how to recover.
* :func:`write_json` and :func:`save_pretrained` (what ``model.save_pretrained(dir)`` calls): the weights'
  header also stores :func:`json_sha256` of ``config.json`` and ``tokenizer.json``, which
  :func:`read_model_json` verifies, so every file that defines the computation is covered by a checksum.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ._version import __version__
from .errors import OptionError

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


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}  # EFBIG: a file-size limit
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}


class CheckpointError(OptionError):
    """A checkpoint is missing, unreadable, corrupt, or does not fit the model (a ``ValueError``; its message may
    name options as the Python API takes them, as :class:`~crate_transformer.errors.OptionError` does)."""


class DamagedFileError(CheckpointError):
    """A file beside the weights (a run's ``config.yaml``, ``metrics.jsonl``, ``trackers.json``, a cache) is
    unreadable, empty, malformed or of the wrong kind; the message names it and how to recover."""


class WriteError(OSError, ValueError):
    """A file could not be written (disk full, quota exceeded, folder not writable).

    Both an ``OSError`` (what callers that handle I/O errors expect) and a ``ValueError`` (what the
    command line prints as one line).  ``errno`` is the original error number.
    """


# --------------------------------------------------------------------------- what a path is
PATH_KINDS = ("file", "folder", "missing", "empty path", "broken link", "device", "FIFO", "socket", "other")


def path_kind(path: str | os.PathLike) -> str:
    """What ``path`` names, decided by ``stat`` without opening it: one of :data:`PATH_KINDS`.

    A symbolic link is what it points to (a link to ``/dev/zero`` is a ``"device"``); one that points nowhere (or
    into a loop) is a ``"broken link"``; ``""`` is an ``"empty path"`` (``Path("")`` would be the current folder); a
    path under a file is ``"missing"`` (its first part that is no folder is what the callers name).
    """
    text = os.fspath(path)
    if text == "":
        return "empty path"
    try:
        mode = os.stat(text).st_mode
    except OSError:  # FileNotFoundError, NotADirectoryError (a path under a file), ELOOP
        return "broken link" if os.path.islink(text) else "missing"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "FIFO" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "other"


def describe_path(path: str | os.PathLike) -> str:
    """What ``path`` is, as the rest of a sentence that names it: ``"is a FIFO (named pipe)"``, ``"is a broken
    symbolic link (to /gone, which does not exist)"``, ``"is a character device (a symbolic link to /dev/zero)"``."""
    kind = path_kind(path)
    if kind == "empty path":
        return "is an empty path"
    if kind == "missing":
        return "does not exist"
    text = os.fspath(path)
    link = os.readlink(text) if os.path.islink(text) else None
    if kind == "broken link":
        return f"is a broken symbolic link (to {link}, which does not exist)"
    words = {
        "file": "a file",
        "folder": "a folder",
        "FIFO": "a FIFO (named pipe)",
        "socket": "a socket",
        "other": "a special file",
        "device": f"a {'block' if stat.S_ISBLK(os.stat(text).st_mode) else 'character'} device",
    }[kind]
    return f"is {words}" + (f" (a symbolic link to {link})" if link is not None else "")


def check_kind(
    path: str | os.PathLike, want: str, fix: str, error: type[Exception] = CheckpointError, missing_ok: bool = True
) -> str:
    """``path_kind(path)``, after refusing a path that is not what it should be: ``want`` (``"file"``: a regular
    file, or ``"folder"``), or ``"missing"`` when ``missing_ok``.  Anything else is one line ``"<path> is a FIFO
    (named pipe), not a file; <fix>"`` (an ``error``); the path is never opened, so a device or a FIFO is never
    read."""
    kind = path_kind(path)
    if kind == want or (kind == "missing" and missing_ok):
        return kind
    raise error(f"{os.fspath(path) or repr('')} {describe_path(path)}, not a {want}; {fix}")


def _read_regular(path: Path, fix: str, error: type[Exception]) -> bytes:
    """The bytes of the regular file ``path``; anything else is one line (an ``error``) and is not read.

    Opened without blocking (``O_NONBLOCK``: a FIFO swapped in after :func:`check_kind` cannot stall the open) and
    checked again on the open descriptor, so no device or FIFO is ever read, whatever a race put there."""
    check_kind(path, "file", fix, error)  # a missing file is named by the open below
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise error(f"cannot read {path} ({e.strerror or e}); {fix}") from None
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{path} is not a regular file (it changed while being opened); {fix}")
        return f.read()


# --------------------------------------------------------------------------- writing
def _write_error(e: OSError, path: Path) -> OSError:
    """A one-line WriteError for a full disk or an unwritable folder; any other OSError is returned as is."""
    if e.errno in _NO_SPACE:
        what = {errno.ENOSPC: "no space left on device", errno.EFBIG: "file too large (a file-size limit)"}.get(
            e.errno, "disk quota exceeded"
        )
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
    temporary file is removed and an existing ``path`` is untouched.  ``ENOSPC``/``EDQUOT``/``EFBIG`` (disk
    full, quota) and ``EACCES``/``EPERM``/``EROFS`` (folder not writable) become a one-line
    :class:`WriteError`; other exceptions propagate unchanged.  The file gets the usual
    umask-derived permissions (not ``mkstemp``'s private 0600).
    """
    if os.fspath(path) == "":
        raise _failed(errno.ENOENT, "cannot write a file to an empty path; pass a file path")
    path = Path(path)
    make_folder(path.parent)
    # the file replaces a regular file (or a link to one); a folder, a broken link, a device, a FIFO or a socket
    # under its name is named instead of replaced or written into
    check_kind(path, "file", "remove it or write to another path", WriteError)
    try:
        tmp = _new_temp_file(path)
    except OSError as e:
        raise _write_error(e, path) from None
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        cause = _os_error_in(e)  # torch's zip writer raises RuntimeError while the disk-full OSError is handled
        if cause is not None:
            err = _write_error(cause, path)
            if err is not cause:
                raise err from None
        raise
    return path


def _failed(number: int | None, message: str) -> WriteError:
    err = WriteError(message)
    err.errno = number
    return err


def make_folder(path: str | Path, what: str = "folder") -> Path:
    """Create the folder ``path`` (and its parents) for a save or an export, or check the existing one: the one
    check of every writer's target, done before anything is written.

    Decided by what the path is (:func:`path_kind`): a folder is checked for writing, a missing one is created;
    an empty path (``""``, which ``Path`` would take for the current folder), a file, a broken symbolic link, a
    device, a FIFO or a socket — or a path under one of them — is a one-line :class:`WriteError` naming the target
    (``what`` says what it is for, e.g. "model folder"), not an error about some file inside it; so is a folder
    that cannot be written (permissions, a read-only file system).
    """
    if os.fspath(path) == "":
        raise _failed(errno.ENOENT, f"{what} is an empty path; pass a folder path ('.' for the current folder)")
    path = Path(path)
    kind = path_kind(path)
    if kind not in ("folder", "missing"):
        fix = "pass a folder path (or remove the file)" if kind == "file" else "remove it or pass another path"
        raise _failed(errno.ENOTDIR, f"{what} {path} {describe_path(path)}, not a folder; {fix}")
    blocker = next((p for p in path.parents if path_kind(p) not in ("folder", "missing")), None)
    if blocker is not None and kind == "missing":
        raise _failed(
            errno.ENOTDIR,
            f"cannot create {what} {path}: {blocker} {describe_path(blocker)}, not a folder; pass another path",
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "permission denied" if e.errno in _NO_PERMISSION else (e.strerror or str(e))
        raise _failed(
            e.errno, f"cannot create {what} {path} ({why}); pass another path or fix its permissions"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _failed(
            errno.EACCES,
            f"cannot write into {what} {path} (permission denied); pass another path or fix its permissions",
        )
    return path


def _os_error_in(e: BaseException) -> OSError | None:
    """``e`` if it is an OSError, else the first OSError it was raised while handling (or from), if any."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _new_temp_file(path: Path) -> str:
    """Create an empty, new ``.<name>.<random>.tmp`` beside ``path`` with mode 0o666 less the umask.

    Not ``tempfile.mkstemp``: its files are private (0o600), and widening them needs the umask, which the only
    portable reader (``os.umask``) sets process-wide while it reads — a race with other threads.  ``os.open``
    with mode 0o666 lets the kernel apply the umask (or a folder's default ACL) as for any new file.
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666))
        except FileExistsError:
            continue
        return str(tmp)
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(path.parent))


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
# Classes a known checkpoint format needs beyond torch's safe list, allowed only while load_pickle reads:
# the MAE codebase's misc.save_model (used by CRATE-MAE) writes {'model', 'optimizer', 'epoch', 'scaler',
# 'args': argparse.Namespace}.  Rebuilding a Namespace only sets attributes (no code runs), and its values
# pass through the same weights-only unpickler, so a Namespace holding anything else is still refused.
SAFE_CLASSES: tuple[type, ...] = (argparse.Namespace,)


def load_pickle(path: str | Path) -> object:
    """``torch.load(path, weights_only=True)`` (safe for untrusted files) with one-line errors.

    Torch's safe list is extended by :data:`SAFE_CLASSES` (``argparse.Namespace``) for this load only.
    A missing, empty, truncated or non-checkpoint file, or a pickle that needs any other global,
    raises :class:`CheckpointError` saying what the file is not and what to pass instead.  Arbitrary
    pickles are never executed.
    """
    path = Path(path)
    kind = path_kind(path)
    if kind in ("folder", "missing"):
        what = "is a folder, not a file" if kind == "folder" else "not found"
        raise CheckpointError(f"checkpoint file {what}: {path}")
    check_kind(path, "file", "pass the checkpoint file itself (restore it from a backup)")  # a device, a FIFO
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(
            f"cannot read checkpoint {path}: the file is empty (0 bytes); the save or download was interrupted — "
            "re-save or re-download it"
        )
    try:
        with torch.serialization.safe_globals(list(SAFE_CLASSES)):
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


# --------------------------------------------------------------------------- training states
STATE_DIGEST = "sha256"  # the key of a training state holding tree_sha256 of everything else in it


def save_state(payload: Mapping[str, Any], path: str | Path) -> Path:
    """``torch.save`` a training state atomically with :func:`tree_sha256` of its contents under ``"sha256"``."""
    payload = dict(payload)
    payload.pop(STATE_DIGEST, None)
    return save_torch({**payload, STATE_DIGEST: tree_sha256(payload)}, path)


def load_state(path: str | Path) -> object:
    """:func:`load_pickle`, then verify the checksum a training state carries (and drop it from the result).

    The one reader of ``.pt`` / ``.pth`` files: a dict with a ``"sha256"`` entry (what :func:`save_state`
    writes) must match its contents, or a one-line :class:`CheckpointError` names the file; anything else
    (official checkpoints, states written before checksums) is returned as read.
    """
    obj = load_pickle(path)
    if isinstance(obj, dict) and isinstance(obj.get(STATE_DIGEST), str):
        digest = obj.pop(STATE_DIGEST)
        try:
            actual = tree_sha256(obj)
        except ValueError:  # holds something a training state never does
            actual = None
        if actual != digest:
            raise CheckpointError(
                f"{path} is corrupt: its contents do not match the checksum written with it; "
                "restore the file from a backup or start the run again"
            )
    return obj


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


def file_digest(path: str | Path, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes, read in blocks of 1 MiB: ``"sha256"``, or ``"git-sha1"`` — git's blob id,
    SHA-1 of ``b"blob <size>\\0"`` and the bytes, which is how the Hugging Face Hub names a file it does not keep in
    LFS (an LFS file's name in the cache is its SHA-256)."""
    path = Path(path)
    if algorithm == "sha256":
        h = hashlib.sha256()
    elif algorithm == "git-sha1":
        h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    else:
        raise ValueError(f"unknown digest {algorithm!r}; choose sha256 or git-sha1")
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def json_sha256(data: Any) -> str:
    """Hex SHA-256 of parsed JSON content in canonical form (sorted keys, no whitespace, ASCII escapes).

    The checksum of a JSON file's *content*: re-indenting or reordering it keeps the checksum, any change
    of a key or value (one flipped bit) changes it.
    """
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


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


def _safetensors_header(data: bytes, size: int, path: Path) -> dict:
    """The JSON header of a safetensors file from its first bytes (``data``; the file has ``size`` bytes)."""
    corrupt = f"{path} is corrupt or not a safetensors file"
    if size < 8 or len(data) < 8:
        raise CheckpointError(f"{corrupt} ({size} bytes); re-save or re-download it")
    n = int.from_bytes(data[:8], "little")
    try:
        if n > size - 8 or n > len(data) - 8:
            raise ValueError("header longer than the file")
        header = json.loads(data[8 : 8 + n])
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except ValueError as e:
        raise CheckpointError(f"{corrupt} ({str(e).splitlines()[0]}); re-save or re-download it") from None
    return header


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, reading only its header (a one-line error if malformed)."""
    path = Path(path)
    check_kind(path, "file", "pass the model.safetensors file itself (re-save or re-download it)")
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            size = os.fstat(f.fileno()).st_size
            data = head + f.read(min(n, max(size - 8, 0)))
    except OSError as e:
        raise CheckpointError(f"cannot read {path} ({e.strerror}); check the path and its permissions") from None
    return dict(_safetensors_header(data, size, path).get("__metadata__") or {})


def load_safetensors(path: str | Path, verify: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Read a ``.safetensors`` file on the CPU → ``(tensors, metadata)``.

    With ``verify`` (the default) a stored ``sha256`` must match :func:`tree_sha256` of the tensors;
    a mismatch, a malformed header or a truncated file is a one-line :class:`CheckpointError`.
    Files without a checksum (written before checksums were stored) load unverified.
    """
    from safetensors.torch import load

    path = Path(path)
    data = _read_regular(path, "check the path and its permissions (re-save or re-download it)", CheckpointError)
    metadata = _safetensors_header(data, len(data), path).get("__metadata__") or {}
    try:
        tensors = load(data)
    except Exception as e:  # SafetensorError, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(
            f"{path} is corrupt or not a safetensors file ({first}); re-save or re-download it"
        ) from None
    expected = metadata.get("sha256")
    if verify and expected and tree_sha256(tensors) != expected:
        raise CheckpointError(f"{path} is corrupt: checksum mismatch; re-save or re-download it")
    return tensors, dict(metadata)


_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}


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


# --------------------------------------------------------------------------- side files
SIDE_FORMS = ("json", "jsonl", "yaml", "text")


_REQUIRED = object()  # read_side_file's default ``missing``: a missing file is refused


def read_side_file(
    path: str | Path, fix: str, form: str = "json", expect: type | None = dict, missing: Any = _REQUIRED
) -> Any:
    """The content of a file a run folder, a sweep or a cache holds beside the weights: the one reader of them all.

    ``form``: ``"json"`` (one value), ``"jsonl"`` (a list of values, one a line), ``"yaml"`` or ``"text"`` (the
    text itself); ``expect``: the kind of the value (of each line's value for ``"jsonl"``), ``None`` for any;
    ``missing``: what a file that does not exist reads as (by default it is refused).  What the path is comes
    first (:func:`path_kind`): a folder, a broken link, a device, a FIFO or a socket is named and never opened (a
    link to ``/dev/zero`` would never end, a FIFO would block).  An unreadable, empty, non-UTF-8, malformed or
    wrongly kinded file is a one-line :class:`DamagedFileError` ``"<path> is damaged: <what>; <fix>"`` — ``fix``
    is how to recover (restore it, delete it and what that costs).  The one thing tolerated is a ``"jsonl"``
    file's last line cut short by a killed writer (no final newline): it is skipped with a warning naming the file.
    """
    path = Path(path)
    if missing is not _REQUIRED and path_kind(path) == "missing":
        return missing
    data = _read_regular(path, fix, DamagedFileError)
    if not data.strip():
        raise DamagedFileError(f"{path} is damaged: it is empty ({len(data)} bytes); {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DamagedFileError(
            f"{path} is damaged: it is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); {fix}"
        ) from None
    return text if form == "text" else _side_value(text, path, fix, form, expect)


def _side_value(text: str, path: Path, fix: str, form: str, expect: type | None) -> Any:
    """The value of a side file's ``text`` (see :func:`read_side_file`)."""
    try:
        value = _PARSERS[form](text, path)
    except (ValueError, ImportError) as e:  # json.JSONDecodeError, yaml.YAMLError (re-raised as ValueError)
        raise DamagedFileError(f"{path} is damaged: {str(e).splitlines()[0]}; {fix}") from None
    for where, item in enumerate(value if form == "jsonl" else [value], start=1):
        if expect is not None and not isinstance(item, expect):
            at = f" line {where}" if form == "jsonl" else ""
            raise DamagedFileError(f"{path}{at} holds a JSON {_kind(type(item))}, not {_kind(expect, 'a')}; {fix}")
    return value


def _kind(t: type, article: str = "") -> str:
    """A JSON / YAML kind by its Python type, in words (``article="a"``: with "a" or "an" before it)."""
    word = {dict: "object", **_JSON_KINDS}.get(t, t.__name__)
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}" if article else word


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"it is not valid JSON ({e.msg} at line {e.lineno})") from None


def _parse_jsonl(text: str, path: Path) -> list:
    lines = text.split("\n")
    values = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            values.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):  # no newline after it: a write cut short by a kill
                warnings.warn(
                    f"{path}: its last line is cut short (a killed run?); that record is skipped", stacklevel=4
                )
                break
            raise ValueError(f"line {number} is not valid JSON ({e.msg})") from None
    return values


def _parse_yaml(text: str, path: Path) -> Any:
    import yaml

    from .config_utils import load_yaml

    try:
        return load_yaml(text, str(path))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"it is not valid YAML ({getattr(e, 'problem', None) or type(e).__name__}{at})") from None


_PARSERS: dict[str, Callable[[str, Path], Any]] = {"json": _parse_json, "jsonl": _parse_jsonl, "yaml": _parse_yaml}


# --------------------------------------------------------------------------- save_pretrained
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
