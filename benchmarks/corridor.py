"""The option corridor measured as issue 47 measured it: what a change walks through to declare an option and word its
error, here and at an earlier revision.

    python benchmarks/corridor.py                  # this tree beside 783163a (where the issue measured it)
    python benchmarks/corridor.py --against HEAD~5 # beside another revision
    python benchmarks/corridor.py --tiny           # this tree only, no --help runs

Rows: the lines of the corridor's modules (the issue's list; ``cli/messages.py``, where the command line words the
library's messages since the wording context went, on a row of its own), split into docstrings, comments, blank
lines, option declarations and the rest (code); the modules at the package root; the declaration routes the issue
counted (each should be 0 but ``option(...)``); the lines of every training command's ``--help``.  Lines are counted
from the files (``git show`` for a revision); nothing is timed.
"""

from __future__ import annotations

import ast
import contextlib
import io
import subprocess
import tokenize
from pathlib import Path

from _common import Arguments

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "src/crate_transformer"
# the modules the issue named (cli/common.py was folded into cli/options.py since)
CORRIDOR = ("config.py", "config_utils.py", "train/config.py", "cli/options.py", "cli/common.py", "cli/__init__.py",
            "errors.py", "layers/config.py")  # fmt: skip
MESSAGES = "cli/messages.py"
DECLARING = ("option", "override", "like", "field")  # the calls a declaration's value is
# the routes the issue counted besides option(...), as a module's syntax shows them
ROUTES = ("dataclasses.field(metadata=...)", "_layer_field(...)", "class-level CHOICES / RULES", "typed= parse mode",
          "add_argument(...) by hand, any")  # fmt: skip
COMMANDS = (("train",), ("finetune",), ("pretrain", "mae"), ("pretrain", "dino"), ("pretrain", "simdino"),
            ("train-lm",), ("finetune-text",), ("eval",), ("analyze",), ("generate",), ("features",))  # fmt: skip


def read(revision: str | None, path: str) -> str | None:
    """The text of ``path`` (under the package) in the working tree or at ``revision``; None where it is absent."""
    if revision is None:
        file = ROOT / PACKAGE / path
        return file.read_text() if file.is_file() else None
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{PACKAGE}/{path}"], capture_output=True)
    return done.stdout.decode() if done.returncode == 0 else None


def split_lines(text: str) -> dict[str, int]:
    """A module's lines by kind: docstrings, comment lines, blank lines, option declarations, code."""
    tree, lines = ast.parse(text), text.splitlines()
    docs: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docs.update(range(first.lineno, first.end_lineno + 1))
    declared = {
        n
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", "") in DECLARING
        for n in range(node.lineno, node.end_lineno + 1)
    }  # fmt: skip
    comments = {t.start[0] for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT}
    comments = {n for n in comments if lines[n - 1].lstrip().startswith("#")}
    blank = {n for n, line in enumerate(lines, 1) if not line.strip()}
    counts = {"docstrings": len(docs), "comments": len(comments - docs), "blank": len(blank - docs)}
    counts["declarations"] = len(declared - docs - comments - blank)
    counts["code"] = len(lines) - sum(counts.values())
    return {"lines": len(lines), **counts}


def corridor(revision: str | None) -> dict[str, dict[str, int]]:
    """Each present corridor module's :func:`split_lines` (and ``cli/messages.py``'s)."""
    out = {}
    for path in (*CORRIDOR, MESSAGES):
        text = read(revision, path)
        if text is not None:
            out[path] = split_lines(text)
    return out


def root_modules(revision: str | None) -> int:
    """The ``.py`` files at the package root."""
    if revision is None:
        return len(list((ROOT / PACKAGE).glob("*.py")))
    done = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{revision}:{PACKAGE}"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return sum(name.endswith(".py") for name in done.stdout.split())


def sources(revision: str | None) -> list[str]:
    """The text of every module of the package (this tree or ``revision``)."""
    if revision is None:
        return [p.read_text() for p in (ROOT / PACKAGE).rglob("*.py")]
    done = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", revision, "--", PACKAGE],
                          capture_output=True, text=True, check=True)  # fmt: skip
    paths = [p.removeprefix(PACKAGE + "/") for p in done.stdout.split() if p.endswith(".py")]
    return [t for p in paths if (t := read(revision, p)) is not None]


def routes(revision: str | None) -> dict[str, int]:
    """How often each route other than ``option(...)`` is taken in the package (:data:`ROUTES`): a ``field()`` call
    with ``metadata=`` outside ``option`` itself, a call of ``_layer_field``, a class attribute ``CHOICES`` or
    ``RULES``, a ``typed=`` keyword; and every ``add_argument`` call written out (flags that are no config field,
    such as ``--resume`` and positionals, included: an upper bound on the config fields declared by hand)."""
    counts = dict.fromkeys(ROUTES, 0)
    for text in sources(revision):
        tree = ast.parse(text)
        own = [range(n.lineno, n.end_lineno + 1) for n in ast.walk(tree) if getattr(n, "name", "") == "option"]
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and any(node.lineno in r for r in own):
                continue  # the one declaration builds its field(metadata=...) itself
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                keywords = {k.arg for k in node.keywords}
                counts[ROUTES[0]] += name == "field" and "metadata" in keywords
                counts[ROUTES[1]] += name == "_layer_field"
                counts[ROUTES[3]] += "typed" in keywords
                counts[ROUTES[4]] += name == "add_argument"  # also --resume, --config, positionals: not options
            if isinstance(node, ast.ClassDef):
                targets = [t for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                           for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]  # fmt: skip
                counts[ROUTES[2]] += sum(getattr(t, "id", "") in ("CHOICES", "RULES") for t in targets)
    return counts


def help_lines(command: tuple[str, ...]) -> tuple[int, int]:
    """The lines of ``crate COMMAND --help`` and ``--help-all`` (this tree)."""
    from crate_transformer.cli import main

    counts = []
    for flag in ("--help", "--help-all"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*command, flag])
        counts.append(len(out.getvalue().splitlines()))
    return counts[0], counts[1]


def print_table(against: str | None, tiny: bool) -> None:
    here, there = corridor(None), corridor(against) if against else {}
    kinds = ("lines", "docstrings", "comments", "blank", "declarations", "code")
    head = f"{'module':24s}" + "".join(f"{k:>13s}" for k in kinds)
    print(f"corridor lines, this tree{f' (then at {against})' if against else ''}\n{head}")
    for path in dict.fromkeys([*there, *here]):
        for label, table in (("", here), (f"  @{against}", there)):
            if path in table:
                print(f"{path + label:24s}" + "".join(f"{table[path][k]:13d}" for k in kinds))
    for label, table in (("this tree", here), (against, there)):
        if table:
            issue = sum(v["lines"] for p, v in table.items() if p != MESSAGES)
            words = table.get(MESSAGES, {}).get("lines", 0)
            print(f"total, the issue's list ({label}): {issue}; with {MESSAGES}: {issue + words}")
    print(
        f"\nmodules at the package root: {root_modules(None)}"
        + (f" ({root_modules(against)} at {against})" if against else "")
    )
    print("declaration routes other than option(...), occurrences in the package:")
    then = routes(against) if against else {}
    for name, count in routes(None).items():
        print(f"  {name:36s} {count:5d}" + (f"   ({then[name]} at {against})" if against else ""))
    if tiny:
        return
    print("\n--help / --help-all lines (this tree)")
    for command in COMMANDS:
        short, whole = help_lines(command)
        print(f"  crate {' '.join(command):22s} {short:4d} {whole:5d}")


def main() -> None:
    parser = Arguments(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="783163a", help="a git revision to measure beside this tree")
    parser.add_argument("--tiny", action="store_true", help="this tree only, without the --help runs")
    args = parser.parse_args()
    print_table(None if args.tiny else args.against, args.tiny)


if __name__ == "__main__":
    main()
