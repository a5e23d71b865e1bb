"""Every file a real run folder holds, damaged in turn, under every command that reads it: a one-line error (or a
warning) naming that file, never a traceback or a silent result (docs/robustness.md, "One reader for side files").

The files and which command reads each are not listed here: a tiny run is trained, its folder listed, and an audit
hook records which files each command opens for reading before it writes them (a figure a command redraws before
reading it is no input of that command).
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from clitools import warnings_shown
from pathkinds import NOT_A_FILE, NOT_A_FOLDER, deadline, make

import crate_transformer as ct
from crate_transformer import cli
from crate_transformer.loading.runfiles import RUN_FILES

# the tracker backends' own folders: their files are read by the backends, not by this package
BACKEND_FOLDERS = ("wandb", "mlruns", "tensorboard")
_ACCESS: list[tuple[str, str]] | None = None  # (kind, real path) while a command runs under the audit hook


def _audit(event: str, args: tuple) -> None:
    if _ACCESS is None:
        return
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        mode, flags = args[1], args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        writes = bool(flags & (os.O_WRONLY | os.O_RDWR)) or any(c in str(mode or "") for c in "wax+")
        _ACCESS.append(("w" if writes else "r", os.path.realpath(os.fsdecode(args[0]))))
    elif event == "os.rename":  # os.replace: the atomic writes' last step
        _ACCESS.append(("w", os.path.realpath(os.fsdecode(args[1]))))


sys.addaudithook(_audit)  # an audit hook cannot be removed: it does nothing unless _ACCESS is set


def _run(argv: list[object]) -> tuple[int, str, list[tuple[str, str]]]:
    """``crate ARGV`` in this process: its exit code, its stderr (warnings shown as a user sees them) and the files
    it opened."""
    global _ACCESS
    err, out = io.StringIO(), io.StringIO()
    _ACCESS = []
    try:
        with warnings_shown(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                rc = cli.main([str(a) for a in argv])
            except SystemExit as e:
                rc = int(e.code or 0)
        return rc, err.getvalue(), _ACCESS
    finally:
        _ACCESS = None


def _commands(run: Path, work: Path) -> dict[str, list[object]]:
    """The commands that take a run folder."""
    return {
        "resume": ["train", "--resume", run, "--no-progress", "--max-steps", 3],
        "eval": ["eval", run, "--threads", 1],
        "analyze": [
            "analyze",
            run,
            "--out",
            work / "analysis",
            "--overwrite",
            "--num-images",
            8,
            "--num-vis",
            1,
            "--threads",
            1,
            "--no-progress",
        ],
        "features": ["features", run, "--out", work / "features", "--overwrite", "--threads", 1],
    }


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real two-step run with measurements and the trackers that write side files (``trackers.json`` needs W&B or
    MLflow; W&B offline when installed)."""
    root = tmp_path_factory.mktemp("runfiles")
    loggers = ["csv"]
    with contextlib.suppress(ImportError):
        import wandb  # noqa: F401

        loggers.append("wandb")
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    argv = [
        "train",
        "--data",
        "digits",
        "--image-size",
        8,
        "--threads",
        1,
        "--no-progress",
        "--max-steps",
        2,
        "--log-every",
        1,
        "--measure-every",
        2,
        "--logger",
        *loggers,
        "--model-args",
        "dim=16",
        "depth=1",
        "heads=2",
        "patch_size=4",
        "--out",
        root / "run",
    ]
    rc, err, _ = _run(argv)
    assert rc == 0, err
    return root / "run"


def _files(run: Path) -> list[str]:
    return sorted(
        str(p.relative_to(run))
        for p in run.rglob("*")
        if p.is_file() and p.name != ".lock" and p.relative_to(run).parts[0] not in BACKEND_FOLDERS
    )


@contextlib.contextmanager
def _copy(run: Path, where: Path) -> Iterator[Path]:
    """A fresh copy of the run folder (commands change it), removed afterwards."""
    shutil.rmtree(where, ignore_errors=True)
    shutil.copytree(run, where)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _inputs(run: Path, work: Path) -> dict[str, list[str]]:
    """``{file: [commands that read it]}``: a file counts as read when a command's first access of it is a read."""
    readers: dict[str, list[str]] = {}
    for name in _commands(run, work):
        with _copy(run, work / "run") as copy:
            rc, err, access = _run(_commands(copy, work)[name])
            assert rc == 0, (name, err)
            first: dict[str, str] = {}
            for kind, path in access:
                first.setdefault(path, kind)
            for rel in _files(copy):
                if first.get(os.path.realpath(copy / rel)) == "r":
                    readers.setdefault(rel, []).append(name)
    return readers


def _damaged(data: bytes) -> Iterator[tuple[str, bytes]]:
    """The ways a file is found damaged: garbage bytes, cut short (mid-line for a text file), empty, and valid JSON
    of another kind (a list where the readers expect an object or a record)."""
    yield "garbage", bytes(range(255, -1, -1)) * 3
    cut = data[: len(data) // 2]
    yield "truncated", cut[:-1] if cut.endswith(b"\n") else cut
    yield "empty", b""
    yield "a JSON list", b"[1, 2]\n"


def test_every_run_file_damaged_is_named_by_every_command_that_reads_it(run_folder: Path, tmp_path: Path) -> None:
    readers = _inputs(run_folder, tmp_path)
    expected = {"config.yaml", "metrics.jsonl", "checkpoints/last.pt", "model/config.json", "model/model.safetensors"}
    if (run_folder / "trackers.json").is_file():
        expected.add("trackers.json")
    assert expected <= set(readers), readers  # what the walk below covers: at least the run's own files
    undeclared = [rel for rel in readers if _declared(rel) is None]
    assert not undeclared, f"files read that RUN_FILES does not declare: {undeclared}"
    failures = []
    for rel, names in sorted(readers.items()):
        for how, data in _damaged((run_folder / rel).read_bytes()):
            for name in names:
                with _copy(run_folder, tmp_path / "run") as copy:
                    (copy / rel).write_bytes(data)
                    rc, err, _ = _run(_commands(copy, tmp_path)[name])
                lines = err.strip().splitlines()
                named = [line for line in lines if str(copy / rel) in line]
                if "Traceback" in err or not named or rc not in (0, 2) or (rc == 2 and named[-1] != lines[-1]):
                    failures.append(f"{rel} ({how}) under {name}: rc={rc}, {lines[-1] if lines else 'nothing said'}")
                elif rc == 2 and "; " not in lines[-1]:
                    failures.append(f"{rel} ({how}) under {name}: no recovery in {lines[-1]}")
    assert not failures, "\n".join(failures)


def _declared(rel: str) -> str | None:
    """The entry of ``RUN_FILES`` that ``rel`` (a path in a run folder) is, or None."""
    return next((name for name in RUN_FILES if fnmatch.fnmatchcase(rel, name)), None)


def test_every_entry_of_a_run_folder_is_declared(run_folder: Path) -> None:
    """The table the checks and the walk below take their files from holds every file a real run writes."""
    entries = [p.relative_to(run_folder).as_posix() for p in run_folder.rglob("*")]
    entries = [e for e in entries if e.split("/")[0] not in BACKEND_FOLDERS or "/" not in e]
    undeclared = [e for e in entries if _declared(e) is None]
    assert not undeclared, f"RUN_FILES does not declare {undeclared}"


def _loaders(run: Path) -> dict[str, object]:
    """The Python loaders that take a run folder."""
    return {"load_model": lambda: ct.load_model(run), "from_pretrained": lambda: ct.from_pretrained(run)}


def test_every_run_file_of_every_kind_is_named_before_any_command_reads_it(run_folder: Path, tmp_path: Path) -> None:
    """Each declared file or folder of a run folder (``RUN_FILES``: the figures' ``*.png`` as ``curves.png``) made a
    folder, a broken link, a link to ``/dev/zero``, a FIFO or a socket (a folder: a file instead of a folder), under
    every command and loader that takes a run folder: one line naming it, before anything is trained or read —
    never a hang (the deadline fails the test instead), a traceback or a run that goes on."""
    failures = []
    for name, entry in RUN_FILES.items():
        rel = name.replace("*.png", "curves.png")
        for kind, said in (NOT_A_FILE if entry.kind == "file" else NOT_A_FOLDER).items():
            with _copy(run_folder, tmp_path / "run") as copy:
                target = make(copy / rel, kind)
                for command, argv in _commands(copy, tmp_path).items():
                    with deadline(120):
                        rc, err, _ = _run(argv)
                    lines = err.strip().splitlines() or ["nothing said"]
                    if rc != 2 or "Traceback" in err or f"{target} {said}" not in lines[-1]:
                        failures.append(f"{rel} as {kind} under {command}: rc={rc}, {lines[-1]}")
                for loader, load in _loaders(copy).items():
                    try:
                        with deadline(120):
                            load()
                    except ValueError as e:
                        if f"{target} {said}" not in str(e) or len(str(e).splitlines()) != 1:
                            failures.append(f"{rel} as {kind} under {loader}: {e}")
                    else:
                        failures.append(f"{rel} as {kind} under {loader}: loaded")
    assert not failures, "\n".join(failures)
