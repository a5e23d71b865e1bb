"""What the benchmark scripts share: their arguments, checked as the ``crate`` commands check their options.

Every script builds its parser with :class:`Arguments`.  A numeric argument (``type=int`` or ``float``) declares the
values it takes with ``range=``, a :class:`~crate_transformer.config_utils.Range` (the one rule behind every numeric
option of the package: ``POSITIVE``, ``NON_NEGATIVE``, ...), and a value outside it, or one that is no number, is a
one-line error and exit code 2 before any work is done (``bench_generate.py: error: --repeats must be a positive
integer, got 0; e.g. --repeats 3``), not a traceback or a table of zeros after it.  A numeric argument declared
without ``range=`` is refused when the script builds its parser, so none is left unchecked; a rule across
arguments (``layer_kernels.py --depths 4 4`` measures no layer) is declared with :meth:`Arguments.rule` and said the
same way.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from crate_transformer.config_utils import NON_NEGATIVE, POSITIVE, Range

__all__ = ["Arguments", "Range", "POSITIVE", "NON_NEGATIVE"]


class Arguments(argparse.ArgumentParser):
    """An ``argparse`` parser whose numeric arguments are checked against their declared :class:`Range`, with
    errors in one line (``--help`` lists the arguments)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.rules: list[tuple[Callable[[argparse.Namespace], bool], str]] = []

    def add_argument(self, *names: Any, range: Range | None = None, **kw: Any) -> argparse.Action:
        """``argparse``'s, with ``range=``: the values a numeric argument takes (required for ``type=int`` /
        ``float``; each item of a list)."""
        if kw.get("type") in (int, float) and range is None:
            raise TypeError(f"{names[0]} is numeric: declare the values it takes (range=POSITIVE, ...)")
        action = super().add_argument(*names, **kw)
        action.range = range
        return action

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:
        """``argparse``'s, then every numeric value checked against its argument's ``range``."""
        parsed = super().parse_args(args, namespace)
        for action in self._actions:
            rule, value = getattr(action, "range", None), getattr(parsed, action.dest, None)
            if rule is None or value is None:  # not numeric, or an optional number not given
                continue
            for x in value if isinstance(value, list) else [value]:
                if not rule.ok(x):
                    self.error(f"{flag(action)}{rule.requirement(x)}{example(action)}")
        for holds, message in self.rules:
            if not holds(parsed):
                self.error(message)
        return parsed

    def rule(self, holds: Callable[[argparse.Namespace], bool], message: str) -> None:
        """A rule across arguments, checked after their ranges: where ``holds(args)`` is false, ``message`` (the
        problem and the fix) is the one-line error."""
        self.rules.append((holds, message))

    def error(self, message: str) -> NoReturn:
        """One line, as the ``crate`` commands say a mistake (no usage block; ``--help`` lists the arguments)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def flag(action: argparse.Action) -> str:
    """The argument's long flag (``--batch-size``)."""
    return max(action.option_strings, key=len)


def example(action: argparse.Action) -> str:
    """``; e.g. --repeats 3``: the argument's default as a valid value, where it has one."""
    default = action.default
    if default is None or default == [] or default is argparse.SUPPRESS:
        return ""
    shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
    return f"; e.g. {flag(action)} {shown}"
