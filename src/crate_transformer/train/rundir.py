"""The run directory: one owner at a time, nothing overwritten, nothing half-written, nothing corrupt unnoticed.

``<run>/config.yaml``, ``metrics.jsonl`` (one record per line), ``checkpoints/last.pt`` (the full
training state, with a SHA-256 of its contents), ``model/`` and the figures.  A run holds an exclusive
lock on ``<run>/.lock`` while it writes, so a second process on the same directory stops with a clear
error instead of mixing its records and checkpoints into the first one's; a folder is deleted only by
a process holding its lock (:meth:`RunDir.reset`), so a live run's folder is never removed.
:class:`FolderLock` is that lock, also held by a whole ``crate ablate`` sweep on its ``--out``.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import OptionError
from ..io import (
    DamagedFileError,
    atomic_write,
    check_kind,
    describe_path,
    load_state,
    make_folder,
    path_kind,
    save_state,
)
from ..loading.runfiles import (
    CHECKPOINT,
    CONFIG_FIX,
    MODEL_DIR,
    RUN_FILES,
    check_run_folder,
    run_model_source,
    state_model,
    state_tokenizer,
)
from .config import TrainConfig, read_options_file
from .trackers import Tracker, failure, open_trackers, read_metrics

__all__ = [
    "run_model_source",
    "state_model",
    "state_tokenizer",
    "RunDir",
    "FolderLock",
    "read_metrics",
    "load_training_state",
    "CHECKPOINT",
    "MODEL_DIR",
    "METRICS_FILE",
    "CONFIG_FILE",
    "read_run_config",
    "CONFIG_FIX",
]

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
LOCK_FILE = ".lock"


# Windows locks a byte range, and a locked range cannot be read by other processes; the lock therefore sits
# on one byte far past the owner line, which stays readable for the "in use by ..." message.
_WINDOWS_LOCK_OFFSET = 1 << 30


def _try_lock(fd: int) -> bool:
    """Take the exclusive, non-blocking lock of a run directory; False if another holder has it.

    POSIX: ``flock`` (released by the kernel when the process dies, even by ``kill -9``).  Windows:
    ``msvcrt.locking`` on one byte (likewise released when the process's handles close).
    """
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:  # EACCES / EDEADLOCK: held by another handle
            return False
        finally:
            os.lseek(fd, 0, os.SEEK_SET)
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _unlock(fd: int) -> None:
    """Release the lock taken by :func:`_try_lock`."""
    try:
        import fcntl
    except ImportError:
        import msvcrt

        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        os.lseek(fd, 0, os.SEEK_SET)
        return
    fcntl.flock(fd, fcntl.LOCK_UN)


def load_training_state(path: str | os.PathLike) -> dict:
    """Read a training state (``last.pt``, or a run directory holding one), its checksum verified by
    :func:`crate_transformer.io.load_state` (the reader ``load_model`` and every command use too)."""
    path = Path(path)
    if path.is_dir():
        check_run_folder(path)  # by what each file is, before any is read: a FIFO or /dev/zero is named, not read
        if not (path / CHECKPOINT).is_file():
            raise ValueError(f"nothing to resume in {path}: no {CHECKPOINT}; pass the run directory of a crate run")
        path = path / CHECKPOINT
    state = load_state(path)
    if not isinstance(state, dict) or "train_config" not in state or "model" not in state:
        raise ValueError(f"{path} is not a crate training checkpoint (no train_config/model); pass a run directory")
    return state


_HELD_LOCKS: set[int] = set()  # descriptors of the FolderLocks this process holds


def _drop_inherited_locks() -> None:
    """In a forked child (a DataLoader worker): close the inherited lock descriptors without unlocking.

    ``flock`` lasts while any descriptor of the open file is open, so a worker orphaned by a ``kill -9`` of its
    run would otherwise keep the folder "in use" and refuse an immediate ``--resume``.
    """
    for fd in _HELD_LOCKS:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):  # POSIX; Windows spawns its workers, which inherit no descriptor
    os.register_at_fork(after_in_child=_drop_inherited_locks)


class FolderLock:
    """An exclusive lock on ``<path>/.lock`` (the folder is created): one owner at a time (POSIX ``flock``,
    Windows ``msvcrt.locking``; see :func:`_try_lock`).

    A second owner, in this process or another, gets a one-line ValueError naming the holder's process
    (written into the lock file).  The OS drops the lock when its process dies, so a killed run never
    leaves its folder locked.
    """

    def __init__(self, path: str | os.PathLike, what: str = "run directory") -> None:
        self.path = make_folder(path, what)
        check_kind(self.path / LOCK_FILE, "file", RUN_FILES[LOCK_FILE].fix, DamagedFileError)
        try:
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except PermissionError:
            raise OptionError(
                f"cannot write to {self.path} (permission denied); choose another out", option="out"
            ) from None
        except OSError as e:
            raise OptionError(
                f"cannot create {what} {self.path} ({e.strerror}); choose another out", option="out"
            ) from None
        if not _try_lock(fd):
            os.close(fd)
            owner = (self.path / LOCK_FILE).read_text(errors="replace").strip() or "another process"
            raise OptionError(
                f"{what} {self.path} is in use by {owner}; wait for it to finish or use another out", option="out"
            )
        os.ftruncate(fd, 0)
        os.write(fd, f"crate process {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        self._fd: int | None = fd
        _HELD_LOCKS.add(fd)

    def close(self) -> None:
        if self._fd is not None and self._fd in _HELD_LOCKS:  # not in a forked child: the parent's lock stays
            _HELD_LOCKS.discard(self._fd)
            _unlock(self._fd)
            os.close(self._fd)
        self._fd = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RunDir:
    """A locked run directory.  Use :meth:`create` for a new run and :meth:`reopen` to resume one."""

    def __init__(self, path: str | os.PathLike, writer: bool = True) -> None:
        self.path = Path(path)
        self.writer = writer  # False on distributed ranks other than 0: every write is skipped
        self._folder_lock: FolderLock | None = None
        self._trackers: list[Tracker] = []
        self._made_folder = False  # set by create(): discard_unfinished() may then remove the folder itself

    # ---------------------------------------------------------------- opening
    @classmethod
    def create(cls, path: str | os.PathLike) -> RunDir:
        """Claim a new run directory: refuse files, non-empty folders (not this run's) and unwritable places."""
        if os.fspath(path) == "":  # Path("") would be the current folder
            raise OptionError("out is an empty path; pass a folder for the run", option="out")
        path = Path(path)
        if path_kind(path) not in ("folder", "missing"):  # a file, a broken link, a FIFO, a device
            raise OptionError(
                f"run directory {path} {describe_path(path)}, not a folder; pass another out", option="out"
            )
        if path.is_dir() and any(p.name != LOCK_FILE for p in path.iterdir()):
            if (path / CHECKPOINT).is_file():
                raise OptionError(
                    f"run directory {path} already holds a run; continue it with resume={str(path)!r} or use another "
                    "out",
                    option="out",
                )
            shown = ", ".join(sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)[:4])
            raise OptionError(
                f"out={str(path)!r} is not empty ({shown}, …) and holds no resumable run; pass a new or empty "
                "directory so nothing in it is overwritten"
            )
        new_folder = not path.exists()
        run = cls(path)
        run._lock()
        run._made_folder = new_folder
        return run

    def discard_unfinished(self) -> bool:
        """Remove what a new run that failed before its first checkpoint wrote, so the corrected command can reuse
        ``--out``: its files (the folder held nothing else when :meth:`create` claimed it) and, when this run made
        the folder, the folder too.  A run with a checkpoint is kept (continue it with ``--resume``).  True if removed.
        """
        if not self.writer or self._folder_lock is None or (self.path / CHECKPOINT).is_file():
            return False
        for entry in self.path.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        self.close()
        if self._made_folder:
            (self.path / LOCK_FILE).unlink(missing_ok=True)
            try:
                self.path.rmdir()
            except OSError:  # another process created something meanwhile: leave it
                pass
        return True

    @classmethod
    def reopen(cls, path: str | os.PathLike) -> RunDir:
        """Lock an existing run directory to continue it."""
        run = cls(check_run_folder(path))  # before the lock file is opened: it is one of the files checked
        run._lock()
        return run

    def _lock(self) -> None:
        self._folder_lock = FolderLock(self.path)
        self._remove_stale_temporaries()

    @classmethod
    def reset(cls, path: str | os.PathLike) -> None:
        """Empty a run directory that holds no checkpoint (a run killed before its first one) to start it again.

        Done while holding the directory's lock, so the folder of a run that is alive (in this process or
        another) is never deleted: that is a one-line "in use" error instead.  A directory with a checkpoint
        is refused too (continue it with ``--resume``).
        """
        path = Path(path)
        with FolderLock(path):
            if (path / CHECKPOINT).is_file():
                raise OptionError(f"run directory {path} holds a checkpoint; continue it with resume={str(path)!r}")
            for entry in path.iterdir():
                if entry.name == LOCK_FILE:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of writes that a kill interrupted (``.<name>.<random>.tmp``, see ``atomic_write``)."""
        for folder in (self.path, self.path / "checkpoints", self.path / "model"):
            if folder.is_dir():
                for tmp in folder.glob(".*.tmp"):
                    tmp.unlink(missing_ok=True)

    def close(self) -> None:
        for tracker in list(self._trackers):
            self._send(tracker, -1, lambda t: t.finish())
        self._trackers = []
        if self._folder_lock is not None:
            self._folder_lock.close()
            self._folder_lock = None

    # ---------------------------------------------------------------- records
    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    def start_log(
        self,
        resume_step: int | None,
        tensorboard: bool = False,
        loggers: Sequence[str] = (),
        params: Mapping[str, Any] | None = None,
    ) -> None:
        """Begin ``metrics.jsonl`` (empty for a new run; on resume, drop the records of steps that will be
        redone) and start the trackers ``loggers`` (``tensorboard=True`` is ``loggers=["tensorboard"]``)."""
        if not self.writer:
            return
        if resume_step is None:
            self.metrics_path.unlink(missing_ok=True)
        else:
            kept = [
                r for r in read_metrics(self.metrics_path) if r.get("step", 0) <= resume_step and not r.get("final")
            ]
            text = "".join(json.dumps(r) + "\n" for r in kept)
            if text:
                atomic_write(self.metrics_path, lambda tmp: Path(tmp).write_text(text))
            else:  # no records: no file (an empty one reads as damaged)
                self.metrics_path.unlink(missing_ok=True)
        names = [*loggers, *(["tensorboard"] if tensorboard else [])]
        self._trackers = open_trackers(names, self.path, params or {}, resume_step)

    def record(self, split: str, step: int, **metrics: Any) -> dict:
        """Append one record ``{"step", "split", **metrics}`` to metrics.jsonl (and to the trackers)."""
        rec = {"step": step, "split": split, **metrics}
        if not self.writer:
            return rec
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        for tracker in list(self._trackers):
            self._send(tracker, step, lambda t: t.log(rec))
        return rec

    def log_figures(self, step: int) -> None:
        """Send the run's figures (``*.png`` in the run directory) to the trackers."""
        figures = sorted(self.path.glob("*.png"))
        for tracker in list(self._trackers) if self.writer else []:
            self._send(tracker, step, lambda t: t.log_figures(figures, step))

    def _send(self, tracker: Tracker, step: int, send: Callable[[Tracker], None]) -> None:
        """``send(tracker)``; a tracker that fails mid-run (a server gone, a full disk) is warned about once and
        dropped, and the run goes on: metrics.jsonl holds every record."""
        try:
            send(tracker)
        except Exception as e:  # noqa: BLE001 - any backend's error: the training run is worth more than a tracker
            self._trackers.remove(tracker)
            at = f"at step {step}" if step >= 0 else "while closing"
            warnings.warn(
                f"the {tracker.name} logger failed {at} ({failure(e)}); it gets no more records, "
                f"and {self.metrics_path} keeps them all",
                stacklevel=3,
            )

    # ---------------------------------------------------------------- files
    def write_yaml(self, name: str, data: Mapping) -> None:
        import yaml

        if not self.writer:
            return
        text = yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=None)
        atomic_write(self.path / name, lambda tmp: Path(tmp).write_text(text))

    def save_state(self, payload: dict) -> Path:
        """Write the training state atomically, with the SHA-256 of its contents."""
        if not self.writer:
            return self.path / CHECKPOINT
        return save_state(payload, self.path / CHECKPOINT)


RUN_EXTRAS = ("model_config", "derived")  # what a run's config.yaml records beside the options


def read_run_config(path: str | os.PathLike) -> TrainConfig:
    """The :class:`TrainConfig` of a run directory's ``config.yaml`` (``path``: the file or the run directory),
    whichever layout it was written in (runs of earlier releases hold flat options)."""
    path = Path(path)
    options = read_options_file(path / CONFIG_FILE if path.is_dir() else path)
    return TrainConfig.from_dict({k: v for k, v in options.items() if k not in RUN_EXTRAS}, saved=True)
