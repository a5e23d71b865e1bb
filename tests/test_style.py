"""Code style the linter does not check: no function in src/ is longer than 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "crate_transformer"
MAX_LINES = 60

# Functions still over the limit while the branches that split them are open; each entry is removed when its
# split lands, and an entry that is no longer needed fails the test below, so the list can only shrink.
ALLOWED: set[str] = set()


def function_lengths(root: Path = SRC) -> dict[str, int]:
    """``{"<path under root>::<name>": lines}`` for every function and method (decorators not counted)."""
    lengths = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{path.relative_to(root).as_posix()}::{node.name}"
                lengths[key] = max(lengths.get(key, 0), node.end_lineno - node.lineno + 1)
    return lengths


def test_no_function_in_src_exceeds_60_lines():
    lengths = function_lengths()
    too_long = {k: n for k, n in lengths.items() if n > MAX_LINES and k not in ALLOWED}
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named parts): {too_long}"


def test_allow_list_only_names_long_functions():
    lengths = function_lengths()
    stale = sorted(k for k in ALLOWED if lengths.get(k, 0) <= MAX_LINES)
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): remove from ALLOWED in tests/test_style.py: {stale}"


def test_the_counter_counts_lines(tmp_path):
    """The measurement itself: a 61-line function is caught, a 60-line one and a nested def are measured apart."""
    body = "\n".join(f"    x{i} = {i}" for i in range(59))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n    return 0\n\n\ndef ok():\n{body}\n")
    assert function_lengths(tmp_path) == {"m.py::long": 61, "m.py::ok": 60}


FMT_SKIP_LIMIT = 60


def test_hand_formatted_lines_stay_rare():
    """``# fmt: skip`` keeps a hand-wrapped statement out of ruff format: at most 60 in src, so the formatter, not
    hand wrapping, decides how the code reads (a new one needs an old one removed)."""
    count = sum(p.read_text(encoding="utf-8").count("# fmt: skip") for p in SRC.rglob("*.py"))
    assert count <= FMT_SKIP_LIMIT, (
        f"{count} '# fmt: skip' in src (at most {FMT_SKIP_LIMIT}): let ruff format wrap them"
    )
