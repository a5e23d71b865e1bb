"""What a path is, decided without opening it, and the one reader of a regular file's bytes.

* :func:`path_kind` / :func:`describe_path` — what a path is, decided without opening it (a regular file, a folder,
  missing, an empty path, a broken symbolic link, a device, a FIFO, a socket): the reader and the writer below
  decide by it, so a device or a FIFO is named, never read (``/dev/zero`` would never end, a FIFO would block).
* :func:`check_kind` — refuse a path that is not what it should be, in one line, without opening it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import CheckpointError

__all__ = ["PATH_KINDS", "path_kind", "describe_path", "check_kind"]


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
