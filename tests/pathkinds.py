"""Every kind of path a reader or a writer can be handed, made for real under ``tmp_path`` (FIFOs with
``os.mkfifo``, sockets bound and closed, links to ``/dev/zero``), and a deadline that turns a read that would never
end into a failed test (docs/robustness.md, "What a path is")."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

# what stands where a regular file belongs / where a folder belongs; each name is what io.describe_path says of it
NOT_A_FILE = {
    "a folder": "is a folder",
    "a broken link": "is a broken symbolic link",
    "a link to a device": "is a character device",
    "a FIFO": "is a FIFO",
    "a socket": "is a socket",
}
NOT_A_FOLDER = {**{k: v for k, v in NOT_A_FILE.items() if k != "a folder"}, "a file": "is a file"}


def make(path: Path, kind: str) -> Path:
    """Put ``kind`` (a key of :data:`NOT_A_FILE` / :data:`NOT_A_FOLDER`) at ``path``, replacing what was there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a folder":
        path.mkdir()
    elif kind == "a file":
        path.write_text("a file\n")
    elif kind == "a broken link":
        path.symlink_to(path.parent / "nothing-here")
    elif kind == "a link to a device":
        path.symlink_to("/dev/zero")  # reads never end: a reader that opens it hangs (and fills the memory)
    elif kind == "a FIFO":
        os.mkfifo(path)  # an open for reading blocks until a writer comes
    elif kind == "a socket":
        here = os.getcwd()
        os.chdir(path.parent)  # bound by its short name: a socket's path may hold 108 bytes only
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(here)
    else:
        raise ValueError(kind)
    return path


@contextlib.contextmanager
def deadline(seconds: float = 120) -> Iterator[None]:
    """Fail (the test process exits, printing every thread's stack) instead of hanging when the block has not
    finished after ``seconds``: a device or a FIFO that is read blocks for ever."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
