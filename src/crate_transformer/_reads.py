"""Which dataclass fields a block of code reads (:func:`reads`): how a model build finds the options it never used
(``option(..., applies=OBSERVED)``, refused by ``models._registry.build`` when given), without a second list of
what each family reads.

While a :func:`reads` block is open, the class of the object watched looks its attributes up through a recording
``__getattribute__`` (restored after the block), and ``dataclasses.replace`` hands a copy of a watched object the
same record (the layers' settings with a block's own, ``LayerConfig.layer_config``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

__all__ = ["reads", "watch", "watched"]


@functools.lru_cache(maxsize=256)
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


_WATCHED: dict[int, set[str]] = {}  # id of a watched object → the names read from it
_PATCHED: dict[type, Any] = {}  # class → the __getattribute__ it had of its own (None: inherited)
_RECORDING: list[Any] = []  # a reads() block is open (holding dataclasses.replace, restored after it)


def _recording(self: Any, name: str) -> Any:
    seen = _WATCHED.get(id(self))
    if seen is not None and name in _field_names(type(self)):
        seen.add(name)
    return object.__getattribute__(self, name)


def _replace(obj: Any, /, **changes: Any) -> Any:
    """``dataclasses.replace`` while a build is recorded: a copy of a watched object reads into the same set."""
    seen = _WATCHED.pop(id(obj), None)
    try:
        copy = _RECORDING[0](obj, **changes)
    finally:
        if seen is not None:
            _WATCHED[id(obj)] = seen
    if seen is not None:
        watch(copy, seen)
    return copy


def watch(obj: Any, seen: set[str]) -> None:
    """Record into ``seen`` the dataclass fields read from ``obj`` until the open :func:`reads` block ends (a copy
    made to hand the layers their settings, ``LayerConfig.layer_config``, is watched into the same set)."""
    if not _RECORDING:
        return
    cls = type(obj)
    if cls not in _PATCHED:
        _PATCHED[cls] = cls.__dict__.get("__getattribute__")
        cls.__getattribute__ = _recording
    _WATCHED[id(obj)] = seen


def watched(obj: Any) -> set[str] | None:
    """The set :func:`watch` records ``obj``'s reads into, or None."""
    return _WATCHED.get(id(obj)) if _WATCHED else None


@contextlib.contextmanager
def reads(obj: Any) -> Iterator[set[str] | None]:
    """The names of the dataclass fields of ``obj`` read inside the block (a model's build: which options it uses),
    recorded by the class's attribute lookup while the block runs and restored after it; None inside another
    block (a build within a build is the outer one's)."""
    if _RECORDING:
        yield None
        return
    seen: set[str] = set()
    _RECORDING.append(dataclasses.replace)
    dataclasses.replace = _replace  # a copy (the layers' settings, with a block's own) reads for its original
    try:
        watch(obj, seen)
        yield seen
    finally:
        dataclasses.replace = _RECORDING[0]
        _RECORDING.clear()
        _WATCHED.clear()
        for cls, own in _PATCHED.items():
            if own is None:
                del cls.__getattribute__
            else:
                cls.__getattribute__ = own
        _PATCHED.clear()
