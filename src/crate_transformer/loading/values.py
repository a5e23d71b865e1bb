"""Sizes and types from outside the package's own checksummed files: checked before anything is built.

Two rules, each written once:

* :func:`file_fields` — every config value a reader takes off an authors' or foreign file (``OfficialFormat.fields``
  of the tensors and the containers' metadata — nanoGPT's ``model_args``, ToST's ``args.input_size`` —
  ``OfficialFormat.config_file`` of a ``config.json`` beside the weights) has its field's declared type exactly, and
  an integer lies in ``0..`` :func:`size_limit`.  The readers return what the file holds; nothing is replaced by a
  default or truncated (``int(32.5)``) on the way.
* :func:`check_build` — a model about to be built from a file's config and the caller's overrides: each integer
  override within :func:`size_limit`, then the model built on the meta device (no memory) must fit this machine's
  memory, so ``from_pretrained(run, image_size=10**6)`` is one line instead of an 8 TB allocation.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ..config import Config
from ..config_utils import field_types
from ..errors import short_repr
from ..io import CheckpointError
from ..models.contract import FamilyConfig

__all__ = ["SIZE_LIMITS", "MAX_COUNT", "size_limit", "file_fields", "check_build"]

# The largest value of an integer config field read from a file or given to a loader.  An image side sizes the
# input and the position grid (8192 px: 800 MB per RGB float32 image); every other count (classes, vocabulary,
# context, layers, widths) at most 2**24, above any released model's.
SIZE_LIMITS: Mapping[str, int] = {"image_size": 8192}
MAX_COUNT = 2**24


def size_limit(field: str) -> int:
    """The largest value :func:`file_fields` and :func:`check_build` accept for integer field ``field``."""
    return SIZE_LIMITS.get(field, MAX_COUNT)


def _accepts(tp: Any, value: object) -> bool:
    """Whether ``value`` is of declared type ``tp`` as a file must store it (no coercion: ``32.0`` is no int)."""
    if tp is Any:
        return True
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return any(_accepts(t, value) for t in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return True  # containers and records: their own dataclass checks them


_WORDS = {int: "a whole number", float: "a number", bool: "true or false", str: "a string"}


def file_fields(
    cls: type[Config], found: Mapping[str, object], source: str, names: Mapping[str, str], fix: Callable[[str], str]
) -> dict[str, object]:
    """``found`` (config field → the value a reader took off the file ``source``) after the one rule for values
    from files: the field's declared type exactly, and an integer within ``0..size_limit(field)``.  ``names``: how
    the file names a field (``{"image_size": "args.input_size"}``); ``fix(field)``: what to do about a bad one.
    A violation is one :class:`~crate_transformer.io.CheckpointError` line naming the file, the entry and the fix."""
    declared = field_types(cls)
    for key, value in found.items():
        tp = declared.get(key, Any)
        base = next((t for t in typing.get_args(tp) if t is not type(None)), tp)
        problem = ""
        if not _accepts(tp, value):
            problem = f"not {_WORDS.get(base, 'of the type ' + str(tp))}"
        elif isinstance(value, int) and not isinstance(value, bool) and not 0 <= value <= size_limit(key):
            problem = f"outside 0..{size_limit(key):,}"
        if problem:
            shown = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else short_repr(value)
            raise CheckpointError(
                f"{source} holds {names.get(key, key)}={shown} ({type(value).__name__}), {problem}; {fix(key)}"
            )
    return dict(found)


def _memory() -> int | None:
    """This machine's physical memory in bytes (None where the platform does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_build(
    target: Callable[[FamilyConfig], nn.Module],
    config: FamilyConfig,
    stored: FamilyConfig,
    given: Mapping[str, object],
    source: str,
) -> None:
    """Refuse, before anything is allocated, a model ``target(config)`` whose sizes come from the caller (``given``:
    the overrides of the ``stored`` config, by field): an integer above :func:`size_limit`, a count of numbered
    blocks other than the file's (``FamilyConfig.BLOCK_COUNTS``: the weights number them), or weights larger than this
    machine's memory (the model built on the meta device, which allocates nothing).  No integer overrides: nothing
    to check (a file's own sizes are bounded by its weights)."""
    ints = {k: v for k, v in given.items() if isinstance(v, int) and not isinstance(v, bool)}
    for key, value in ints.items():
        if value > size_limit(key):
            raise CheckpointError(
                f"{source}: {key}={value:,} is more than {size_limit(key):,}, the largest {key} a loader builds; "
                "pass a smaller value"
            )
        if key in stored.BLOCK_COUNTS and value != getattr(stored, key):
            raise CheckpointError(
                f"{source}: {key}={value:,} does not fit the file, whose weights number {getattr(stored, key)} "
                f"blocks {stored.BLOCK_COUNTS[key]}.N; drop {key}"
            )
    if not ints:
        return
    named = ", ".join(f"{k}={v:,}" for k, v in ints.items())
    try:
        with torch.device("meta"):
            probe = target(config)
    except (RuntimeError, OverflowError):  # "storage size calculation overflowed"
        raise CheckpointError(
            f"{source}: {named} would make a model too large to describe; pass smaller values"
        ) from None
    size = sum(t.numel() * t.element_size() for t in [*probe.parameters(), *probe.buffers()])
    memory = _memory()
    if memory is not None and size > memory:
        raise CheckpointError(
            f"{source}: {named} would make a model of {size / 2**30:,.0f} GiB of weights, more than this machine's "
            f"{memory / 2**30:,.0f} GiB of memory; pass smaller values"
        )
