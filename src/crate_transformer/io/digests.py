"""Checksums: a deterministic hash of nested tensor payloads, of a file's bytes and of parsed JSON.

* :func:`tree_sha256` — SHA-256 of nested dicts / lists / tuples of tensors, arrays and plain values.
* :func:`file_digest` — SHA-256 (or git's blob id) of a file's bytes.
* :func:`json_sha256` — SHA-256 of parsed JSON content in canonical form (what the weights' header stores for
  ``config.json`` and ``tokenizer.json``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["tree_sha256", "file_digest", "json_sha256"]


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
