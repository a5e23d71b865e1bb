"""The errors of the file helpers: every one is one line naming the file, what is wrong with it and the fix.

* :class:`CheckpointError` — a checkpoint is missing, unreadable, corrupt, or does not fit the model.
* :class:`DamagedFileError` — a file beside the weights (a run's ``config.yaml``, ``metrics.jsonl``, a cache) is
  damaged (what :func:`~crate_transformer.io.sidecars.read_side_file` raises).
* :class:`WriteError` — a file could not be written (what :func:`~crate_transformer.io.writes.atomic_write` and
  :func:`~crate_transformer.io.writes.make_folder` raise).
"""

from __future__ import annotations

from ..errors import OptionError

__all__ = ["CheckpointError", "DamagedFileError", "WriteError"]


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
