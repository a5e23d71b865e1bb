"""The real ``crate`` command run in-process, and the check that it failed with one line (the tests share these)."""

from __future__ import annotations

import contextlib
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from crate_transformer import cli
from crate_transformer.cli.messages import Flags, command_flags


def crate(*argv: object) -> int:
    """``crate ARGV`` in this process; its exit code."""
    return cli.main([str(a) for a in argv])


@contextlib.contextmanager
def warnings_shown() -> Iterator[None]:
    """Inside the block warnings reach stderr as a user sees them: pytest records every warning instead, so the
    CLI's one-line form of an ``OptionWarning`` (made by ``warnings.formatwarning``) would never be written."""

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))  # Python's own display

    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = show
        yield


def one_line_error(
    capsys: pytest.CaptureFixture, *argv: object, rc: int = 2, after_output: bool = False, match: str | None = None
) -> str:
    """Run ``crate ARGV``, assert it exits ``rc`` with one line on stderr, and return that line.

    ``after_output=True`` is for commands that print their start lines before failing: stderr then holds no
    traceback and ends with the one ``crate …`` error line.  ``match`` is a regular expression the line must
    contain (``re.search``).
    """
    capsys.readouterr()  # drop what earlier commands printed
    assert crate(*argv) == rc, argv
    err = capsys.readouterr().err.strip()
    if after_output:
        assert "Traceback" not in err and err.splitlines()[-1].startswith("crate "), err
        err = err.splitlines()[-1]
    else:
        assert len(err.splitlines()) == 1, err
    if match is not None:
        assert re.search(match, err), (match, err)
    return err


def flags_of(*names: str) -> Flags:
    """The table of flags of the command ``names`` (``flags_of("pretrain", "mae")``), as ``cli.main`` translates
    that command's messages with it (``command_flags`` of its parser)."""
    parser = cli.build_parser(names[0])
    for name in names:
        parser = cli._subcommands(parser)[name]
    return command_flags(parser)
