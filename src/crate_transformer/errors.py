"""Messages that name tasks, options and listings, worded by whoever reports them.

The library names tasks (``classification``, ``lm``, ``mae``, ...) and options (``lr``, ``batch_size``,
``device``, ...), never the commands or flags of the ``crate`` CLI.  A message that names one keeps it as a
*place* — :class:`Use` (how to train with a task), :class:`Opt` (an option, maybe with a value), :class:`See`
(where a listing is) — and a :class:`Worded` message (:class:`OptionError`, :class:`TaskError`,
:class:`OptionWarning`, :class:`Step` of a result) fills its places with the current wording: the Python API's by
default (``the lm task``, ``lr``, ``device='cpu'``, ``ct.list_models()``); inside :func:`wording` the caller's
(the CLI says ``crate train-lm``, ``--lr``, ``--device cpu``, ``crate models``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Use",
    "Opt",
    "See",
    "Step",
    "Worded",
    "OptionError",
    "TaskError",
    "OptionWarning",
    "python_words",
    "wording",
    "words",
    "short_repr",
    "python_message",
]

_UNSET: Any = object()
SHORT = 60  # characters of a value that a one-line message shows


@dataclass(frozen=True)
class Use:
    """A place naming how to train with ``task`` (fine-tuning when ``init_from``)."""

    task: str
    init_from: bool = False


@dataclass(frozen=True)
class Opt:
    """A place naming the option ``name`` (its flat name, as ``TrainConfig(name=...)`` and config files take it),
    with the ``value`` to give it when the message suggests one.  ``within``: the option whose ``KEY=VALUE``
    entries hold it (``"model_args"`` for a model config's field): the Python API names the field alone
    (``dim=384``), the command line the option that carries it."""

    name: str
    value: Any = _UNSET
    within: str = ""

    @property
    def has_value(self) -> bool:
        return self.value is not _UNSET


@dataclass(frozen=True)
class See:
    """A place naming a listing: ``"models"`` (the registered models) or ``"pretrained"`` (the released weights)."""

    what: str


Place = Use | Opt | See


@dataclass(frozen=True)
class Step:
    """What to do next with a finished run: an ``action`` (``"analyze"``, ``"evaluate"``, ``"fine-tune"``,
    ``"generate"``) on ``run`` with ``options`` (``(name, value)`` pairs); a task's result lists them and the
    caller words them (the CLI as the command that does it)."""

    action: str
    run: str
    options: tuple[tuple[str, Any], ...] = field(default=())

    def __str__(self) -> str:
        return _WORDING.get()(self)


_LISTINGS = {"models": "ct.list_models()", "pretrained": "ct.list_pretrained()"}


def python_words(place: Place | Step) -> str:
    """The Python API's wording: ``the lm task`` (``… with init_from``), ``lr`` / ``device='cpu'``,
    ``ct.list_models()``, ``analyze runs/x (knn=True)``."""
    if isinstance(place, Use):
        return f"the {place.task} task" + (" with init_from" if place.init_from else "")
    if isinstance(place, Opt):
        return f"{place.name}={place.value!r}" if place.has_value else place.name
    if isinstance(place, See):
        return _LISTINGS.get(place.what, place.what)
    given = ", ".join(f"{k}={v!r}" for k, v in place.options)
    return f"{place.action} {place.run}" + (f" ({given})" if given else "")


_WORDING: ContextVar[Callable[[Any], str]] = ContextVar("wording", default=python_words)


@contextlib.contextmanager
def wording(name: Callable[[Any], str]) -> Iterator[None]:
    """Inside the block, every :class:`Worded` message and :class:`Step` is worded by ``name`` (the CLI's)."""
    token = _WORDING.set(name)
    try:
        yield
    finally:
        _WORDING.reset(token)


def words(parts: tuple[str | Place, ...], name: Callable[[Any], str] | None = None) -> str:
    """``parts`` as one string, each place written as ``name(place)`` (default: the current wording)."""
    name = name or _WORDING.get()
    return "".join(p if isinstance(p, str) else name(p) for p in parts)


class Worded:
    """A message of strings and places (:class:`Use`, :class:`Opt`, :class:`See`), worded when shown."""

    parts: tuple[str | Place, ...]

    def words(self, name: Callable[[Any], str] | None = None) -> str:
        """The message with each place written as ``name(place)`` (default: the current wording)."""
        return words(self.parts, name)

    def __str__(self) -> str:
        return self.words()


class OptionError(Worded, ValueError):
    """A mistake whose fix names options (or tasks, or a listing): one line, worded where it is shown."""

    def __init__(self, *parts: str | Place) -> None:
        self.parts = parts
        super().__init__(words(parts, python_words))

    __str__ = Worded.__str__


class TaskError(OptionError):
    """A mistake whose fix is another task (a model of another kind, a run of another task, a missing input)."""


class OptionWarning(Worded, UserWarning):
    """A warning whose advice names options, worded where it is shown (``warnings.warn(OptionWarning(...))``)."""

    def __init__(self, *parts: str | Place) -> None:
        self.parts = parts
        super().__init__(words(parts, python_words))

    __str__ = Worded.__str__


def python_message(e: BaseException) -> str:
    """``e``'s message in the Python API's words whatever the current wording: a value read from a file is named
    as the file names it (``depth``), never as the option that would have given it."""
    return e.words(python_words) if isinstance(e, Worded) else str(e)


def task_words(use: Use) -> str:
    """The Python API's wording of a :class:`Use` (kept for callers of the earlier API)."""
    return python_words(use)


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
