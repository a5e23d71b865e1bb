"""Messages that name tasks, options and listings: plain text, written where they are raised.

The library names an option as the Python API takes it (``lr``, ``lr=0.01``; a model config's field ``dim=384``, as a
run's argument ``model_args={'dim': 384}``; a task ``task='lm'``; a listing ``ct.list_models()``).  An error or
warning says which options it is about (``option=``; ``within="model_args"`` for a model config's fields) and the CLI
rewrites those names as its flags where it catches it (:mod:`crate_transformer.cli.messages`): ``str(e)`` is the
sentence found in the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice  # a container's first items, never listed whole
from typing import Any

__all__ = ["Step", "OptionError", "TaskError", "OptionWarning", "short_repr"]

SHORT = 60  # characters of a value that a one-line message shows


@dataclass(frozen=True)
class Step:
    """What to do next with a finished run: an ``action`` (``"analyze"``, ``"evaluate"``, ``"fine-tune"``,
    ``"generate"``) on ``run`` with ``options`` (``(name, value)`` pairs); ``str`` is the Python API's line
    (``evaluate runs/x (knn=True)``), the CLI writes the command that does it."""

    action: str
    run: str
    options: tuple[tuple[str, Any], ...] = field(default=())

    def __str__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.options)
        return f"{self.action} {self.run}" + (f" ({given})" if given else "")


class _About:
    """What a message is about: ``options``, the names (Python arguments) it names bare, and ``within``, the
    option whose ``KEY=VALUE`` entries hold them (``"model_args"`` for a model config's fields)."""

    def __init__(self, message: str, *, option: str | tuple[str, ...] = (), within: str = "") -> None:
        super().__init__(message)
        self.options: tuple[str, ...] = (option,) if isinstance(option, str) else tuple(option)
        self.within = within


class OptionError(_About, ValueError):
    """A mistake whose fix names options (or tasks, or a listing), in one line: ``OptionError(f"lr must be
    positive, got {lr}", option="lr")``."""


class TaskError(OptionError):
    """A mistake whose fix is another task (a model of another kind, a run of another task, a missing input)."""


class OptionWarning(_About, UserWarning):
    """A warning whose advice names options (``warnings.warn(OptionWarning(f"...", option="threads"))``)."""


def short_repr(value: object, limit: int = SHORT) -> str:
    """``repr(value)`` cut to about ``limit`` characters (ending ``…``), containers written item by item until then,
    never whole (a 1 KB YAML file of aliases expands to 10**8 strings)."""
    parts: list[str] = []
    if _write(value, parts, limit) or sum(map(len, parts)) > limit:
        return "".join(parts)[: limit - 1] + "…"
    return "".join(parts)


def _write(value: object, parts: list[str], limit: int, depth: int = 0) -> bool:
    """Append ``repr(value)`` to ``parts`` piece by piece; True once more than ``limit`` characters are written."""
    if depth > limit:  # nested deeper than the message shows: each level wrote an opener already
        return True
    if not isinstance(value, (dict, list, tuple)):
        parts.append(repr(value if not isinstance(value, (str, bytes)) or len(value) <= limit else value[:limit]))
        return sum(map(len, parts)) > limit
    opener, closer = "{}" if isinstance(value, dict) else "()" if isinstance(value, tuple) else "[]"
    items = list(islice(value.items() if isinstance(value, dict) else value, limit))
    parts.append(opener)
    for n, item in enumerate(items):
        parts.append(", " if n else "")
        if isinstance(value, dict):  # a (key, value) item
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
