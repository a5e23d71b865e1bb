"""Every benchmark script's arguments are checked as the ``crate`` commands' options are (``benchmarks/_common.py``):
each numeric argument of every script, given a value outside its declared range or one that is no number, is a
one-line error and exit code 2 from the script's own parser, before any work.  The parsers are taken from the scripts
as they run (each run stops where the script parses its arguments), so the walk covers every script and every
argument without running a benchmark."""

from __future__ import annotations

import argparse
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from _common import Arguments

from crate_transformer.config_utils import Range

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


class _Parsing(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def parser_of(script: Path) -> argparse.ArgumentParser:
    """The parser ``script`` builds when run as a program, taken where it parses (nothing of the benchmark runs)."""

    def stop(self: argparse.ArgumentParser, *args: object, **kw: object) -> None:
        raise _Parsing(self)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_known_args", stop)
        m.setattr(sys, "argv", [str(script)])
        try:
            runpy.run_path(str(script), run_name="__main__")
        except _Parsing as e:
            return e.parser
    raise AssertionError(f"{script.name} ran without parsing its arguments")


def bad_values(rule: Range) -> list[str]:
    """Values outside ``rule``: no number, not finite, and each bound crossed."""
    out = ["x", "nan", "inf"]
    if rule.lo is not None:
        out.append(f"{rule.lo if rule.lo_open else rule.lo - 1:g}")
    if rule.hi is not None:
        out.append(f"{rule.hi if rule.hi_open else rule.hi + 1:g}")
    return out


def _numeric(action: argparse.Action) -> bool:
    default = action.default[0] if isinstance(action.default, list) and action.default else action.default
    numeric_default = isinstance(default, (int, float)) and not isinstance(default, bool)
    return action.type in (int, float) or (numeric_default and action.type is None and action.nargs != 0)


def test_every_numeric_argument_of_every_benchmark_refuses_a_bad_value_in_one_line(capsys) -> None:
    walked = {}
    for script in SCRIPTS:
        parser = parser_of(script)
        assert isinstance(parser, Arguments), f"{script.name} builds a plain ArgumentParser: use _common.Arguments"
        assert not [a for a in parser._actions if not a.option_strings], script.name  # no positional to give
        numeric = [a for a in parser._actions if _numeric(a)]
        for action in numeric:
            assert isinstance(getattr(action, "range", None), Range), (script.name, action.dest)
            flag = max(action.option_strings, key=len)
            count = action.nargs if isinstance(action.nargs, int) else 1
            for value in bad_values(action.range):
                capsys.readouterr()
                with pytest.raises(SystemExit) as done:
                    parser.parse_args([flag, *[value] * count])
                err = capsys.readouterr().err.strip()
                assert done.value.code == 2 and len(err.splitlines()) == 1, (script.name, flag, value, err)
                assert err.startswith(f"{script.name}: error: ") and flag in err, (script.name, flag, value, err)
        walked[script.name] = len(numeric)
    assert len(walked) == len(SCRIPTS) >= 20 and sum(walked.values()) >= 70, walked


def test_a_value_in_range_parses_and_a_rule_across_arguments_is_one_line(capsys) -> None:
    """The check refuses only what is out of range (the defaults and a good value parse); a rule across
    arguments (two equal ``--depths`` measure no layer) is said the same way."""
    for script in SCRIPTS:
        parser_of(script).parse_args([])  # every default is in range
    kernels = parser_of(ROOT / "benchmarks" / "layer_kernels.py")
    assert kernels.parse_args(["--depths", "2", "5", "--batch", "1"]).depths == [2, 5]
    for depths in (["4", "4"], ["4", "3"]):
        with pytest.raises(SystemExit) as done:
            kernels.parse_args(["--depths", *depths])
        err = capsys.readouterr().err.strip()
        assert done.value.code == 2 and err == (
            "layer_kernels.py: error: --depths: the second depth must be larger than the first (a layer is their "
            "difference); e.g. --depths 3 4"
        ), err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench_generate.py", "--repeats", "0"], "--repeats must be a positive integer, got 0; e.g. --repeats 3"),
        (["bench_datapath.py", "--steps", "-1"], "--steps must be a positive integer, got -1"),
        (["layer_kernels.py", "--depths", "4", "4"], "--depths: the second depth must be larger than the first"),
    ],
)
def test_the_scripts_themselves_stop_before_any_work(argv: list[str], said: str) -> None:
    """Issue 48's three, run as a user runs them: one line, exit code 2, no traceback, no table."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.strip().startswith(f"{argv[0]}: error: {said}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
