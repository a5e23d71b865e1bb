"""TEMPORARY (replaced by the hardening branch): tree_sha256."""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def tree_sha256(obj: Any) -> str:
    h = hashlib.sha256()

    def visit(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            h.update(t.numpy().tobytes())
        elif isinstance(o, dict):
            h.update(b"{")
            for k in sorted(o, key=repr):
                h.update(repr(k).encode())
                visit(o[k])
            h.update(b"}")
        elif isinstance(o, (list, tuple)):
            h.update(b"[")
            for v in o:
                visit(v)
            h.update(b"]")
        else:
            h.update(repr(o).encode())

    visit(obj)
    return h.hexdigest()
