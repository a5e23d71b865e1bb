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
    from crate_transformer.models.registry import create_model

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

    from crate_transformer.cli.options import parse_model_args
    from crate_transformer.models.registry import model_config

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
    from crate_transformer.cli.training import pretraining_tasks

    monkeypatch.setenv("COLUMNS", "300")
    commands = [[c] for c in cli.COMMANDS if c != "pretrain"] + [["pretrain", t] for t in pretraining_tasks()]
    for argv in commands:
        text = _help(capsys, *argv)
        assert "(default: None)" not in text and "(default: none)" not in text, argv
        assert not re.search(r"\(default:[^()]*\)\s*\(default:", text), argv
    assert "--lr LR peak learning rate" in _help(capsys, "train") and "(default: 0.004" in _help(capsys, "train")
    assert "--batch-size SIZE evaluation batch size (default: 500; > 0)" in _help(capsys, "eval")  # and its range


def test_an_unknown_option_prints_the_commands_short_usage_and_the_nearest_flag(capsys) -> None:
    """A typo of a flag, through the real parser of each command: two lines, the command's one-line usage (not
    every flag) and the error naming what was typed and the command's nearest flag; nothing near, no guess."""
    import pytest

    for argv, command, said in [
        (["train", "--lrr", "0.1"], "crate train", "--lrr 0.1 (did you mean --lr?)"),
        (["finetune", "--form", "run"], "crate finetune", "--form run (did you mean --from?)"),
        (["pretrain", "dino", "--epohcs", "3"], "crate pretrain dino", "--epohcs 3 (did you mean --epochs?)"),
        (["train-lm", "--vocab-sise", "64"], "crate train-lm", "--vocab-sise 64 (did you mean --vocab-size?)"),
        (["analyze", "RUN", "--attn-layr", "2"], "crate analyze", "--attn-layr 2 (did you mean --attn-layer?)"),
        (["ablate", "11", "--seedz", "2"], "crate ablate", "--seedz 2 (did you mean --seeds?)"),
        (["models", "--pretrianed"], "crate models", "--pretrianed (did you mean --pretrained?)"),
        (["train", "--lrr=0.1", "--bogus", "-3"], "crate train", "--lrr=0.1 (did you mean --lr?), --bogus -3"),
        (["eval", "RUN", "--top-k", "5"], "crate eval", "--top-k 5"),  # --no-knn is no guess
        (["train", "--lr", "1e-3", "stray"], "crate train", "stray"),
    ]:
        with pytest.raises(SystemExit) as done:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert done.value.code == 2 and len(err) == 2, err
        assert err[0].startswith(f"usage: {command} [options]"), err[0]
        assert err[1] == f"{command}: error: unrecognized arguments: {said}", err[1]


def _help_text(capsys, argv: list[str], which: str) -> str:
    import pytest

    with pytest.raises(SystemExit) as done:
        main([*argv, which])
    assert done.value.code == 0
    return capsys.readouterr().out


def _shown(flag: str, text: str) -> bool:
    """Whether ``flag`` has its own entry in a help text (not merely named inside another's)."""
    import re

    return re.search(rf"^  (?:-{{1,2}}[a-z0-9-]+, )?{re.escape(flag)}(?:[ ,]|$)", text, re.M) is not None


def test_every_help_fits_a_screen_and_help_all_shows_every_flag(capsys, monkeypatch) -> None:
    """``--help`` of each command (and of ``crate pretrain TASK``) is at most 100 lines at 80 columns and shows
    the options declared ``basic``; ``--help-all`` shows every flag the command's parser accepts."""
    import argparse

    from crate_transformer import cli
    from crate_transformer.cli.training import pretraining_tasks

    monkeypatch.setenv("COLUMNS", "80")
    commands = [[c] for c in cli.COMMANDS] + [["pretrain", t] for t in pretraining_tasks()]
    hidden_somewhere = 0
    for argv in commands:
        command = cli.build_parser(argv[0])
        for name in argv:  # the (sub-)command's own parser
            command = next(a for a in command._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        short, full = _help_text(capsys, argv, "--help"), _help_text(capsys, argv, "--help-all")
        assert len(short.splitlines()) <= 100, (argv, len(short.splitlines()))
        hidden = [a for a in command._actions if hasattr(a, "help_all")]
        for action in command._actions:
            for flag in action.option_strings:
                assert _shown(flag, full), (argv, flag)
                assert _shown(flag, short) != (action in hidden), (argv, flag)  # basic: in --help; else not
        assert (f"{len(hidden)} more options: crate {' '.join(argv)} --help-all" in short) == bool(hidden), argv
        hidden_somewhere += len(hidden)
    assert hidden_somewhere > 100  # the long commands do leave options to --help-all
    train = _help_text(capsys, ["train"], "--help")
    for flag in ("--model", "--data", "--lr", "--epochs", "--batch-size", "--device", "--out", "--resume"):
        assert _shown(flag, train), flag


def test_the_off_switches_of_earlier_releases_still_parse(capsys, tmp_path) -> None:
    """``--no-cache`` and ``--no-progress`` are now the off forms of ``--cache`` / ``--progress`` (one declared
    switch each): the same flags, the same meaning; two sources of images for ``crate analyze`` are one line."""
    from clitools import one_line_error

    from crate_transformer import cli
    from crate_transformer.cli.options import resolve_options

    cases = [
        (["generate", "x", "--no-cache"], "cache"),
        (["analyze", "x", "--no-progress"], "progress"),
        (["theory", "all", "--no-progress"], "progress"),
        (["ablate", "12", "--no-progress"], "progress"),
    ]
    for argv, dest in cases:
        for given, value in ((argv, False), (argv[:2], True)):
            args = cli.build_parser(argv[0]).parse_args(given)
            resolve_options(args)
            assert getattr(args, dest) is value, (given, dest)
    err = one_line_error(capsys, "analyze", "x", "--images", tmp_path, "--data", "digits")
    assert err.endswith("--images and --data both name what to measure; pass one"), err
