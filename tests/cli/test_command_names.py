"""The library names tasks, never the commands of the ``crate`` CLI: only ``cli/`` maps tasks to commands.

A mistake whose fix is another task is a :class:`TaskError`: from Python it names the task (``task='lm'``), from
the CLI the command (byte for byte the CLI's translation, :mod:`crate_transformer.cli.messages`); an interrupted
run's "continue with" line is the CLI's.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from clitools import flags_of

import crate_transformer
from crate_transformer import cli
from crate_transformer.cli.messages import Flags, cli_message, step_command
from crate_transformer.cli.training import finished, pretraining_tasks
from crate_transformer.errors import TaskError
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
        "crate_gpt_mini is a language model, and task='mae' trains a masked autoencoder (e.g. "
        "model='crate_mae_mnist'); train crate_gpt_mini with task='lm' model='crate_gpt_mini'"
    )
    flags = flags_of("pretrain", "mae")
    assert cli.error_message(info.value, flags=flags) == (
        "crate_gpt_mini is a language model, and crate pretrain mae trains a masked autoencoder (e.g. --model "
        "crate_mae_mnist); train crate_gpt_mini with crate train-lm --model crate_gpt_mini"
    )
    assert not (tmp_path / "r").exists()
    error = TaskError("R is a classification run, not mae; use: task='classification' with init_from resume='R'")
    flags = flags_of("train")
    assert cli.error_message(error, flags=flags) == "R is a classification run, not mae; use: crate finetune --resume R"
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

    from crate_transformer.errors import OptionError, OptionWarning, Step

    text = "lower lr, use amp='none' or probe=False; ct.list_models(); split='val', the lr option"
    error = OptionError(text, option="lr")
    assert str(error) == text  # the sentence as raised, the same everywhere: no wording context
    flags = Flags({"probe": _switch("--probe"), "amp": _valued("--amp"), "lr": _valued("--lr")})
    assert cli.error_message(error, flags=flags) == (
        "lower --lr, use --amp none or --no-probe; crate models; split='val', the --lr option"
    )  # split is no option of this command: left as Python wrote it
    assert cli.error_message(error) == (
        "lower --lr, use amp='none' or probe=False; crate models; split='val', the --lr option"
    )  # without a table, only the subject (the message says it is an option) becomes a flag
    with cli.option_warnings("train", lambda: Flags({"on_bad_image": _valued("--on-bad-image")})):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warnings.warn(OptionWarning("pass on_bad_image='error' to fail instead"), stacklevel=1)
        assert warnings.formatwarning(caught[0].message, OptionWarning, "f.py", 1) == ""  # as Python shows one
    assert str(caught[0].message) == "pass on_bad_image='error' to fail instead"  # recorded as raised
    assert capsys.readouterr().err == "crate train: warning: pass --on-bad-image error to fail instead\n"  # shown
    steps = (Step("fine-tune", "runs/x", (("data", "my data"),)), Step("evaluate", "runs/x", (("knn", True),)))
    assert [step_command(s) for s in steps] == [
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


def _switch(flag: str):
    import argparse

    return argparse.BooleanOptionalAction([flag], dest=flag[2:])


def _valued(flag: str):
    import argparse

    return argparse.Action([flag], dest=flag[2:])


def test_the_translation_renders_values_as_flags_take_them() -> None:
    """Lists space-separated, model fields as ``--model-args`` entries, ``model_args`` dicts as entries, values
    quoted for the shell; a word that merely contains an option's name is not touched."""
    flags = Flags({n: _valued("--" + n.replace("_", "-")) for n in ("logger", "model_args", "out", "betas")})
    assert cli_message("logger=['wandb', 'tensorboard'] or betas=(0.9, 0.95)", flags) == (
        "--logger wandb tensorboard or --betas 0.9 0.95"
    )
    assert cli_message("a context of 16 tokens (model_args={'block_size': 16})", flags) == (
        "a context of 16 tokens (--model-args block_size=16)"
    )
    assert cli_message("depth must be positive; e.g. depth=12", flags, ("depth",), "model_args") == (
        "--model-args depth must be positive; e.g. --model-args depth=12"
    )
    assert cli_message("out='my runs/x' is a file; output, outer, out_dir, without", flags, ("out",)) == (
        "--out 'my runs/x' is a file; output, outer, out_dir, without"
    )
    assert cli_message("bad value out=[1, 2", flags) == "bad value out=[1, 2"  # no literal: left alone


def test_the_command_list_names_every_pre_training_task() -> None:
    """``crate --help``'s pretrain line lists the tasks ``crate pretrain`` runs, no more, no fewer."""
    listed = re.search(r"\{([a-z,]+)\}", cli.COMMANDS["pretrain"][1])
    assert listed and sorted(listed.group(1).split(",")) == sorted(pretraining_tasks()), cli.COMMANDS["pretrain"]
