"""The `crate` command's wiring (subcommands are tested with their modules)."""

import os
import subprocess
import sys

from crate_transformer.cli import main


def test_models_lists_registry_with_exact_counts(capsys):
    assert main(["models", "crate_*"]) == 0
    out = capsys.readouterr().out
    assert "crate_small" in out and "13,116,328" in out and "6,090,856" in out
    assert "vit_tiny" not in out


def test_errors_are_one_line_with_exit_code_2(capsys):
    assert main(["models", "nothing_like_this"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no registered model matches 'nothing_like_this'" in err


def test_console_script_entry_point(capsys):
    """``crate`` is ``cli.main``; ``python -m crate_transformer.cli`` runs it in a fresh process, its help names every
    subcommand with its description, and a listed subcommand does what its line says."""
    from importlib.metadata import entry_points

    import torch

    from crate_transformer import cli
    from crate_transformer.registry import create_model

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "crate"]
    assert script.value == "crate_transformer.cli:main" and script.load() is main

    wide = {**os.environ, "COLUMNS": "300"}  # argparse wraps at the terminal width, also inside hyphenated words
    r = subprocess.run([sys.executable, "-m", "crate_transformer.cli", "--help"], capture_output=True, text=True,
                       env=wide)  # fmt: skip
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    for name, (_, description) in cli.COMMANDS.items():
        assert f"{name} {' '.join(description.split())}" in flat, name

    # "models: list the registered models with their parameter counts", counted here independently
    assert main(["models", "crate_mnist"]) == 0
    lines = capsys.readouterr().out.splitlines()
    with torch.device("meta"):
        params = sum(p.numel() for p in create_model("crate_mnist").parameters())
    assert len(lines) == 2 and lines[1].split()[0] == "crate_mnist" and lines[1].split()[-1] == f"{params:,}", lines


def test_model_args_accept_every_config_family_and_the_model_rejects_foreign_ones() -> None:
    import pytest

    from crate_transformer.cli.common import parse_model_args
    from crate_transformer.registry import model_config

    args = parse_model_args(["visible_only=true", "mask_ratio=0.6", "dim=32"])  # MAEConfig fields
    assert args == {"visible_only": True, "mask_ratio": 0.6, "dim": 32}
    assert model_config("crate_mae_mnist", **args).visible_only is True
    with pytest.raises(ValueError, match="visible_only"):
        model_config("crate_mnist", visible_only=True)  # a classifier has no such field
    with pytest.raises(ValueError, match="unknown model argument"):
        parse_model_args(["no_such_field=1"])


# --------------------------------------------------------------------------- progress bars only where someone watches
def test_progress_in_a_log_is_whole_lines_at_each_tenth() -> None:
    import io

    from crate_transformer.progress import PlainProgress, progress_bar

    log = io.StringIO()
    bar = progress_bar(total=50, desc="train", unit="step", stream=log)
    assert isinstance(bar, PlainProgress)
    for _ in range(50):
        bar.update(1)
        bar.set_postfix_str("loss 0.5")
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 10  # 10%, ..., 90% and the final count
    assert [line.split(" step")[0] for line in lines] == [f"train: {5 * i}/50" for i in range(1, 10)] + ["train: 50/50"]
    assert lines[0].startswith("train: 5/50 step (10%), ") and "ETA" in lines[0] and lines[0].endswith("loss 0.5")
    transient = io.StringIO()  # a bar that is not kept (leave=False: a measurement inside a report) says nothing
    for _ in progress_bar(range(40), desc="measure", leave=False, stream=transient):
        pass
    assert transient.getvalue() == ""


def test_progress_on_a_terminal_is_tqdms_bar() -> None:
    import io

    from tqdm.auto import tqdm

    from crate_transformer.progress import progress_bar

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = progress_bar(total=3, desc="train", stream=Terminal())
    assert isinstance(bar, tqdm)
    bar.close()


def test_crate_train_into_a_log_writes_no_carriage_returns(tmp_path, capsys) -> None:
    import tiny

    argv = [a for a in tiny.TRAIN_CLI if a != "--no-progress"]
    assert main(["train", *argv, "--epochs", "1", "--max-steps", "10", "--batch-size", "32", "--eval-every", "0",
                 "--measure-every", "0", "--out", str(tmp_path / "run")]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("train: ")]
    assert len(lines) == 10 and lines[-1].startswith("train: 10/10 step (100%), ") and " loss " in lines[-1], err


# --------------------------------------------------------------------------- usage and help as the user reads them
def _help(capsys, *argv: str) -> str:
    import pytest

    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_every_help_text_states_a_default_once_and_never_none(capsys, monkeypatch) -> None:
    import re

    from crate_transformer import cli
    from crate_transformer.cli.pretrain import pretraining_tasks

    monkeypatch.setenv("COLUMNS", "300")
    commands = [[c] for c in cli.COMMANDS if c != "pretrain"] + [["pretrain", t] for t in pretraining_tasks()]
    for argv in commands:
        text = _help(capsys, *argv)
        assert "(default: None)" not in text and "(default: none)" not in text, argv
        assert not re.search(r"\(default:[^()]*\)\s*\(default:", text), argv
    assert "--lr LR peak learning rate" in _help(capsys, "train") and "(default: 0.004" in _help(capsys, "train")
    assert "(default: 500)" in _help(capsys, "eval")  # argparse's own default words where the text has none


def test_an_unknown_option_prints_the_commands_usage(capsys) -> None:
    import pytest

    for argv, command, unknown in [
        (["eval", "RUN", "--top-k", "5"], "crate eval", "--top-k 5"),
        (["pretrain", "mae", "--bogus"], "crate pretrain mae", "--bogus"),
        (["train", "--lr", "1e-3", "stray"], "crate train", "stray"),
    ]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert done.value.code == 2 and err[0].startswith(f"usage: {command} "), err[0]
        assert err[-1] == f"{command}: error: unrecognized arguments: {unknown}"
