"""The library names tasks, never the commands of the ``crate`` CLI: only ``cli/`` maps tasks to commands.

A mistake whose fix is another task is a :class:`TaskError`: from Python it names the task, from the CLI
the command (byte for byte the CLI's wording); an interrupted run's "continue with" line is the CLI's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import crate_transformer
from crate_transformer import cli
from crate_transformer.cli.pretrain import pretraining_tasks
from crate_transformer.cli.train import finished
from crate_transformer.errors import TaskError, Use
from crate_transformer.train import TrainConfig, train

SRC = Path(crate_transformer.__file__).parent
COMMANDS = "|".join(sorted(map(re.escape, cli.COMMANDS), key=len, reverse=True))
# a command (``crate train``, ``crate models``, ...) or a flag (`` --lr``, ``(--data-mode``, ...)
CLI_WORDS = re.compile(rf"\bcrate ({COMMANDS})\b|(^|[\s(\[`'\"])--[a-z][a-z0-9-]*")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def cli_strings(path: Path) -> list[str]:
    """The string constants of a module (error messages, warnings, help texts, results; not its docstrings, which
    document the package and may show a command) that name a ``crate`` command or a flag."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    return [
        f"{path.relative_to(SRC)}:{node.lineno}: {node.value.strip()[:100]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        and CLI_WORDS.search(node.value)
    ]  # fmt: skip


def test_no_library_string_names_a_cli_command_or_flag() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if "cli" not in path.relative_to(SRC).parts[:1]:
            found += cli_strings(path)
    assert not found, "\n".join(found)
    html = [p for p in SRC.rglob("*.html") if "cli" not in p.relative_to(SRC).parts[:1]]
    assert not [p for p in html if CLI_WORDS.search(p.read_text(encoding="utf-8"))]


def test_the_pattern_finds_commands_and_flags() -> None:  # the scan above cannot pass by matching nothing
    for text in ("train it with crate train-lm", "use: crate train --resume", "see crate models", "lower --lr",
                 "(--data-mode memory)", "pass --on-bad-image error"):  # fmt: skip
        assert CLI_WORDS.search(text), text
    for text in ("a crate training run", "x--y", "2--3 steps", "the lr option"):
        assert not CLI_WORDS.search(text), text


def test_the_cli_maps_tasks_to_commands() -> None:
    assert [cli.task_command(t) for t in ("classification", "lm", "text-classification", "mae", "dino")] == [
        "train", "train-lm", "finetune-text", "pretrain mae", "pretrain dino"
    ]  # fmt: skip
    assert cli.task_command("classification", init_from=True) == "finetune"
    assert cli.task_command("least-squares") == "pretrain least-squares"  # a user's task: a sub-command of pretrain
    assert {"mae", "dino"} <= set(pretraining_tasks()) and not {"classification", "lm"} & set(pretraining_tasks())


def test_a_task_error_names_tasks_in_python_and_commands_in_the_cli(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as info:
        train(TrainConfig.from_dict({"task": "mae", "model": "crate_gpt_mini", "out": str(tmp_path / "r")}))
    assert str(info.value) == (
        "crate_gpt_mini is a language model, and the mae task trains a masked autoencoder (e.g. "
        "model='crate_mae_mnist'); train crate_gpt_mini with the lm task model='crate_gpt_mini'"
    )
    assert cli.error_message(info.value) == (
        "crate_gpt_mini is a language model, and crate pretrain mae trains a masked autoencoder (e.g. --model "
        "crate_mae_mnist); train crate_gpt_mini with crate train-lm --model crate_gpt_mini"
    )
    assert not (tmp_path / "r").exists()
    error = TaskError("R is a classification run, not mae; use: ", Use("classification", init_from=True), " --resume R")
    assert str(error) == "R is a classification run, not mae; use: the classification task with init_from --resume R"
    assert cli.error_message(error) == "R is a classification run, not mae; use: crate finetune --resume R"
    assert cli.error_message(ValueError("plain")) == "plain"


@pytest.mark.parametrize(
    "task, init_from, command",
    [("classification", None, "train"), ("classification", "ckpt", "finetune"), ("mae", None, "pretrain mae")],
)
def test_an_interrupted_run_says_the_command_that_continues_it(
    task: str, init_from: str | None, command: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    result = {"run_dir": "runs/x", "step": 3, "interrupted": True, "task": task, "init_from": init_from}
    assert finished(result) == 130
    out = capsys.readouterr()
    assert out.err == f"continue with: crate {command} --resume runs/x\n" and out.out == ""
    monkeypatch.setenv("RANK", "1")  # one line per job: rank 0's
    assert finished(result) == 130 and capsys.readouterr().err == ""


def test_options_listings_and_next_steps_are_worded_by_who_shows_them(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import warnings

    from crate_transformer.errors import Opt, OptionError, OptionWarning, See, Step, wording

    error = OptionError(
        "lower ", Opt("lr"), ", use ", Opt("amp", "none"), " or ", Opt("probe", False), "; ", See("models")
    )
    assert str(error) == "lower lr, use amp='none' or probe=False; ct.list_models()"
    assert cli.error_message(error) == "lower --lr, use --amp none or --no-probe; crate models"
    with wording(cli.cli_words):  # what the CLI does while a command runs: messages, warnings, printed hints
        assert str(error) == "lower --lr, use --amp none or --no-probe; crate models"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.warn(OptionWarning("pass ", Opt("on_bad_image", "error"), " to fail instead"), stacklevel=1)
        assert str(caught[0].message) == "pass --on-bad-image error to fail instead"
    assert str(error) == "lower lr, use amp='none' or probe=False; ct.list_models()"  # outside: Python's words again
    steps = (Step("fine-tune", "runs/x", (("data", "my data"),)), Step("evaluate", "runs/x", (("knn", True),)))
    assert [cli.cli_words(s) for s in steps] == [
        "crate finetune --from runs/x --data 'my data'",
        "crate eval runs/x --knn",
    ]
    assert str(steps[1]) == "evaluate runs/x (knn=True)"
    monkeypatch.delenv("RANK", raising=False)
    result = {"run_dir": "runs/x", "step": 3, "interrupted": False, "next": steps}
    assert finished(result) == 0
    assert (
        capsys.readouterr().out
        == "next: crate finetune --from runs/x --data 'my data'    |    crate eval runs/x --knn\n"
    )
