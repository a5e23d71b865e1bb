"""safetensors files with a checksum.

* :func:`save_safetensors` / :func:`load_safetensors` — tensors plus ``{"format": "pt", "sha256": ...}``
  metadata; the reader verifies the checksum when present (older files without one still load).
* :func:`read_safetensors_metadata` — a file's metadata, reading only its header.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from .digests import tree_sha256
from .errors import CheckpointError
from .paths import _read_regular, check_kind
from .writes import _write_bytes, atomic_write

__all__ = ["save_safetensors", "read_safetensors_metadata", "load_safetensors"]


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
