"""``torch.save`` files: written atomically, read safely, and training states with a checksum.

* :func:`save_torch` — ``torch.save`` through :func:`~crate_transformer.io.writes.atomic_write` (so a full disk is
  reported as such).
* :func:`load_pickle` — ``torch.load(weights_only=True)``, plus ``argparse.Namespace`` (the MAE codebase's
  checkpoints store their arguments); anything it refuses is a one-line
  :class:`~crate_transformer.io.errors.CheckpointError` saying what the file is not and what to pass instead.
* :func:`save_state` / :func:`load_state` — a training state (``checkpoints/last.pt``) with the SHA-256 of its
  contents; :func:`load_state` is the one reader of such files (resume, ``load_model``, every command), so a
  flipped bit is caught wherever the file is read.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .digests import tree_sha256
from .errors import CheckpointError
from .paths import check_kind, path_kind
from .writes import atomic_write

__all__ = ["SAFE_CLASSES", "STATE_DIGEST", "save_torch", "load_pickle", "save_state", "load_state"]


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
