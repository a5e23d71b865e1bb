"""The `crate` command's wiring (subcommands are tested with their modules)."""

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


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "crate_transformer.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "models" in r.stdout
