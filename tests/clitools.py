"""The real ``crate`` command run in-process, and the check that it failed with one line (the tests share these)."""

from __future__ import annotations

import pytest

from crate_transformer import cli


def crate(*argv: object) -> int:
    """``crate ARGV`` in this process; its exit code."""
    return cli.main([str(a) for a in argv])


def one_line_error(capsys: pytest.CaptureFixture, *argv: object) -> str:
    """Run ``crate ARGV``, assert it exits 2 with exactly one line on stderr, and return that line."""
    capsys.readouterr()  # drop what earlier commands printed
    assert crate(*argv) == 2, argv
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err
