"""Errors and warnings worded by whoever reports them.

The library names tasks (``classification``, ``lm``, ``mae``, ...) and options (``warmup_fraction``), never the
commands and flags of the ``crate`` CLI: a :class:`TaskError` keeps the places that name a task as :class:`Use`
facts, so the Python API says ``the lm task`` and the CLI (:func:`crate_transformer.cli.task_command`) says the
command that runs it; an :class:`OptionsWarning` keeps the options it advises as :class:`Option` facts, which
the Python API writes as option names and the CLI as flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TaskError", "Use", "Option", "OptionsWarning"]


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


@dataclass(frozen=True)
class Option:
    """A place in an :class:`OptionsWarning` naming a training option (``TrainConfig`` or task option name)."""

    name: str


class OptionsWarning(UserWarning):
    """A warning whose advice names options: ``str()`` writes them as option names, :meth:`words` any other way
    (the CLI: ``--warmup-fraction``)."""

    def __init__(self, *parts: str | Option) -> None:
        self.parts = parts
        super().__init__(self.words(lambda option: option.name))

    def words(self, name: Callable[[Option], str]) -> str:
        """The message with each :class:`Option` place written as ``name(option)``."""
        return "".join(p if isinstance(p, str) else name(p) for p in self.parts)
