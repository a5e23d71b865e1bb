"""Errors whose fix is training with another task, worded by whoever reports them.

The library names tasks (``classification``, ``lm``, ``mae``, ...), never the commands of the ``crate`` CLI:
a :class:`TaskError` keeps the places that name a task as :class:`Use` facts, so the Python API says
``the lm task`` and the CLI (:func:`crate_transformer.cli.task_command`) says the command that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TaskError", "Use", "short_repr"]

SHORT = 60  # characters of a value that a one-line message shows


@dataclass(frozen=True)
class Use:
    """A place in a :class:`TaskError` naming how to train with ``task`` (fine-tuning when ``init_from``)."""

    task: str
    init_from: bool = False


def task_words(use: Use) -> str:
    """The Python API's wording of a :class:`Use`: ``the lm task`` (``... with init_from`` when fine-tuning)."""
    return f"the {use.task} task" + (" with init_from" if use.init_from else "")


class TaskError(ValueError):
    """A mistake whose fix is another task (a model of another kind, a run of another task, a missing input).

    The message is ``parts``: strings and :class:`Use` places; ``str()`` fills the places with
    :func:`task_words`, :meth:`words` with any other wording (the CLI's commands)."""

    def __init__(self, *parts: str | Use) -> None:
        self.parts = parts
        super().__init__(self.words(task_words))

    def words(self, name: Callable[[Use], str]) -> str:
        """The message with each :class:`Use` place written as ``name(use)``."""
        return "".join(p if isinstance(p, str) else name(p) for p in self.parts)


def short_repr(value: object, limit: int = SHORT) -> str:
    """``repr(value)`` cut to about ``limit`` characters (ending ``…``): a message names the value the user gave
    without printing a megabyte of it.  Containers are written item by item until ``limit`` is reached, never
    built whole (a 1 KB YAML file of aliases expands to 10**8 strings)."""
    parts: list[str] = []
    if _write(value, parts, limit) or sum(map(len, parts)) > limit:
        return "".join(parts)[: limit - 1] + "…"
    return "".join(parts)


def _write(value: object, parts: list[str], limit: int, depth: int = 0) -> bool:
    """Append ``repr(value)`` to ``parts`` piece by piece; True once more than ``limit`` characters are written."""
    if depth > limit:  # nested deeper than the message shows: each level wrote an opener already
        return True
    if isinstance(value, dict):
        opener, closer, items = "{", "}", [(k, v) for k, v in _first(value.items(), limit)]
    elif isinstance(value, (list, tuple)):
        opener, closer, items = "[("[isinstance(value, tuple)], "])"[isinstance(value, tuple)], _first(value, limit)
    else:
        text = repr(value) if not isinstance(value, (str, bytes)) or len(value) <= limit else repr(value[:limit])
        parts.append(text)
        return sum(map(len, parts)) > limit
    parts.append(opener)
    for n, item in enumerate(items):
        if n:
            parts.append(", ")
        if isinstance(item, tuple) and isinstance(value, dict):
            if _write(item[0], parts, limit, depth + 1):
                return True
            parts.append(": ")
            item = item[1]
        if _write(item, parts, limit, depth + 1):
            return True
    if len(items) < len(value):
        return True
    parts.append("," + closer if isinstance(value, tuple) and len(value) == 1 else closer)
    return sum(map(len, parts)) > limit


def _first(items: object, n: int) -> list:
    """The first ``n`` of ``items`` (a container's items are never listed whole)."""
    out = []
    for item in items:
        if len(out) == n:
            break
        out.append(item)
    return out
