"""Writing files and folders: atomic writes with one-line errors.

* :func:`atomic_write` — write to a temporary file in the target folder, then rename it into place;
  a full disk or an unwritable folder is a one-line :class:`~crate_transformer.io.errors.WriteError` and leaves no
  temporary file.
* :func:`make_folder` — the one writer of folders: every save and export (and :func:`atomic_write`, for the folder
  of each file) checks its target with it first, so a target that is a file, lies inside a file or cannot be
  written, is an empty path, a broken link, a device, a FIFO or a socket is a one-line
  :class:`~crate_transformer.io.errors.WriteError` naming that target.
* :func:`write_json` — a JSON file, through :func:`atomic_write`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import WriteError
from .paths import check_kind, describe_path, path_kind

__all__ = ["atomic_write", "make_folder", "write_json"]


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}  # EFBIG: a file-size limit
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}


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
