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
