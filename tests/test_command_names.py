"""The library names tasks, never the commands of the ``crate`` CLI: only ``cli/`` maps tasks to commands.

A mistake whose fix is another task is a :class:`TaskError`: from Python it names the task, from the CLI
the command (byte for byte the CLI's wording); an interrupted run's "continue with" line is the CLI's.
"""

from __future__ import annotations

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
COMMAND_NAMES = re.compile(r"pretrain mae|pretrain dino|train-lm|finetune-text|crate train\b")


def test_no_library_module_names_a_cli_command() -> None:
    found = []
    for path in sorted(SRC.rglob("*")):
        if path.is_file() and "cli" not in path.relative_to(SRC).parts[:1] and path.suffix in {".py", ".html"}:
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if COMMAND_NAMES.search(line):
                    found.append(f"{path.relative_to(SRC)}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_pattern_finds_command_names() -> None:  # the scan above cannot pass by matching nothing
    assert COMMAND_NAMES.search("train it with crate train-lm") and COMMAND_NAMES.search("use: crate train --resume")
    assert not COMMAND_NAMES.search("a crate training run")


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
        "crate_gpt_mini is a language model, and the mae task trains a masked autoencoder (e.g. --model "
        "crate_mae_mnist); "
        "train crate_gpt_mini with the lm task --model crate_gpt_mini"
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
