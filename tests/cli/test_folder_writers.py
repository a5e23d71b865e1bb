"""Every writer of a folder checks its target first (``io.make_folder``): a target that is an existing file or lies
inside a file is one line naming that target, never an error about some file inside it (docs/robustness.md, "One
writer of folders").  The commands are found from the ``crate`` parsers (every one with ``--out``); the library's
writers are called one by one."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tiny
import torch
from clitools import crate
from pathkinds import NOT_A_FOLDER, deadline, make

import crate_transformer as ct
from crate_transformer import cli
from crate_transformer.io import WriteError, make_folder

# what a command's positional argument takes, by its name, and the inputs a command may ask for before its --out
POSITIONAL = {"checkpoint": "MODEL", "run": "MODEL", "tables": "11", "experiment": "ista"}
INPUTS = {"--data": "digits", "--from": "MODEL"}


def _commands_with_out() -> list[list[str]]:
    """Every (sub-)command of ``crate`` that takes ``--out``, with its positional arguments."""
    found = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, [*words, name])
        if not subs and any("--out" in a.option_strings for a in parser._actions):
            found.append([*words, *(POSITIONAL[a.dest] for a in parser._actions if not a.option_strings)])

    for name in cli.COMMANDS:
        top = cli.build_parser(name)
        walk(next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[name], [name])
    return found


def _targets(tmp_path: Path) -> dict[str, Path]:
    afile = tmp_path / "afile"
    afile.write_text("a file, not a folder\n")
    return {"an existing file": afile, "a path inside a file": afile / "sub"}


def test_every_command_with_out_names_a_target_that_is_or_lies_in_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = tmp_path / "model"
    ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER).save_pretrained(model)
    commands = _commands_with_out()
    assert {c[0] for c in commands} >= {"train", "eval", "analyze", "features", "ablate", "theory", "train-lm"}
    failures = []
    for words in commands:
        argv = [str(model) if w == "MODEL" else w for w in words]
        for what, target in _targets(tmp_path).items():
            capsys.readouterr()
            rc = crate(*argv, "--out", target, "--threads", 1) if "--threads" in _options(words) else None
            if rc is None:
                rc = crate(*argv, "--out", target)
            err = capsys.readouterr().err.strip()
            inputs = [w for k, v in INPUTS.items() if k in _options(words) for w in (k, v)]
            if str(target) not in err and inputs:  # it asked for its inputs first: give them
                rc = crate(*argv, *(str(model) if w == "MODEL" else w for w in inputs), "--out", target)
                err = capsys.readouterr().err.strip()
            lines = err.splitlines()
            if rc != 2 or "Traceback" in err or not lines or str(target) not in lines[-1]:
                failures.append(f"crate {' '.join(words)} --out <{what}>: rc={rc}, {lines[-1] if lines else ''}")
    assert not failures, "\n".join(failures)


def _options(words: list[str]) -> set[str]:
    top = cli.build_parser(words[0])
    parser = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[words[0]]
    for w in words[1:]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and w in subs[0].choices:
            parser = subs[0].choices[w]
    return {s for a in parser._actions for s in a.option_strings}


def _writers() -> dict[str, Callable[[Path], Any]]:
    """Each library writer of a folder (or of a file, whose folder it makes), given its target."""
    from crate_transformer.analysis import measure
    from crate_transformer.analysis.explorer import write_explorer
    from crate_transformer.analysis.plots import save_figure
    from crate_transformer.io import save_safetensors, save_torch, write_json
    from crate_transformer.loading.hub import write_hub_folder
    from crate_transformer.models.tokenizer import Tokenizer
    from crate_transformer.theory import run_experiment
    from crate_transformer.train.rundir import FolderLock, RunDir

    def figure() -> Any:
        from matplotlib.figure import Figure  # not pyplot's: no figure left open in its registry

        return Figure()

    digits = ct.create_model("crate_mnist", **tiny.DIGITS_ONE_LAYER)
    writers: dict[str, Callable[[Path], Any]] = {
        f"{name}.save_pretrained": model.save_pretrained
        for name, model in ((name, build()) for name, build in tiny.family_builders().items())
        if hasattr(model, "save_pretrained")
    }
    writers |= {
        "write_hub_folder": lambda t: write_hub_folder(digits, t, "me/model"),
        "Tokenizer.save": lambda t: Tokenizer.byte_level().save(t / "tokenizer.json"),
        "write_json": lambda t: write_json(t / "x.json", {}),
        "save_torch": lambda t: save_torch({}, t / "x.pt"),
        "save_safetensors": lambda t: save_safetensors({}, t / "x.safetensors"),
        "save_figure": lambda t: save_figure(figure(), t / "x.png"),
        "write_explorer": lambda t: write_explorer({}, t / "x.html"),
        "LayerTable.to_json": lambda t: measure(digits, torch.zeros(2, 1, 8, 8), progress=False).to_json(t / "x.json"),
        "run_experiment": lambda t: run_experiment("ista", t, quick=True, progress_bar=False),
        "RunDir.create": lambda t: RunDir.create(t).close(),
        "FolderLock": lambda t: FolderLock(t).close(),
        "make_folder": make_folder,
    }
    return writers


def test_every_library_writer_names_a_target_that_is_or_lies_in_a_file(tmp_path: Path) -> None:
    failures = []
    for name, write in _writers().items():
        for what, target in _targets(tmp_path).items():
            folder = target.parent if name in ("Tokenizer.save",) else target
            try:
                write(target)
            except ValueError as e:  # WriteError and OptionError are ValueErrors: the one-line errors
                if len(str(e).splitlines()) != 1 or str(folder) not in str(e) or str(folder / "x") in str(e):
                    failures.append(f"{name} into {what}: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - what the test reports
                failures.append(f"{name} into {what}: {type(e).__name__}: {e}")
            else:
                failures.append(f"{name} into {what}: nothing refused")
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="permissions do not bind root")
def test_an_unwritable_target_is_named(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for target in (locked, locked / "sub"):
        with pytest.raises(WriteError, match=f"{target}.*permission"):
            make_folder(target)


# the writers that take the folder itself (the others are given a file inside it: "" / "x.json" is a file name)
FOLDER_WRITERS = ("write_hub_folder", "run_experiment", "RunDir.create", "FolderLock", "make_folder")


def test_every_library_writer_names_a_target_of_every_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each writer, given a target that is no folder — a broken link, a link to /dev/zero, a FIFO, a socket, a file
    (tests/pathkinds.py) — or an empty path: one line naming the target and what it is, nothing written, no hang."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")  # "" would be this folder: it must stay empty
    failures = []
    writers = _writers()
    for name, write in writers.items():
        for kind, said in NOT_A_FOLDER.items():
            target = folder = make(tmp_path / "target", kind)
            try:
                with deadline(60):
                    write(target)
            except ValueError as e:
                if len(str(e).splitlines()) != 1 or f"{folder} {said}" not in str(e):
                    failures.append(f"{name} into {kind}: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - what the test reports
                failures.append(f"{name} into {kind}: {type(e).__name__}: {e}")
            else:
                failures.append(f"{name} into {kind}: nothing refused")
        if name.endswith(".save_pretrained") or name in FOLDER_WRITERS:
            try:
                write("")
            except ValueError as e:
                if "empty path" not in str(e) or len(str(e).splitlines()) != 1:
                    failures.append(f"{name} into '': {type(e).__name__}: {e}")
            else:
                failures.append(f"{name} into '': nothing refused")
    assert not failures, "\n".join(failures)
    assert list((tmp_path / "cwd").iterdir()) == []
