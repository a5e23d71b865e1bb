"""Messages that name tasks, options and listings: plain text, written where they are raised.

The library names an option as the Python API takes it (``lr``, ``lr=0.01``; a model config's field ``dim=384``, as a
run's argument ``model_args={'dim': 384}``; a task ``task='lm'``; a listing ``ct.list_models()``).  An error or
warning says which options it is about (``option=``; ``within="model_args"`` for a model config's fields) and the CLI
rewrites those names as its flags where it catches it (:mod:`crate_transformer.cli.messages`): ``str(e)`` is the
sentence found in the source.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field
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
    """``repr(value)`` cut to ``limit`` characters (ending ``…``), by :mod:`reprlib`, which writes containers and
    strings only as far as a message shows them (never whole: a 1 KB YAML file of aliases expands to 10**8 strings)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# reprlib's limits, above what a message keeps and with a bounded product (at most 16**3 items written in all): a
# level's first items, three levels deep, a string's first characters
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 4 * SHORT, 4 * SHORT
for _kind in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
    setattr(_REPR, _kind, 16)
