"""Errors whose fix is training with another task, worded by whoever reports them.

The library names tasks (``classification``, ``lm``, ``mae``, ...), never the commands of the ``crate`` CLI:
a :class:`TaskError` keeps the places that name a task as :class:`Use` facts, so the Python API says
``the lm task`` and the CLI (:func:`crate_transformer.cli.task_command`) says the command that runs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TaskError", "Use"]


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
