"""Failures that used to lose work or block the fix: each ends in one line and leaves the run folder usable.

A run that failed during setup left ``config.yaml`` behind, so the corrected command on the same ``--out`` was
refused; a diverging run ended in a FloatingPointError traceback; ``pretrain mae`` / ``dino`` on one class trained,
then failed in the evaluation.  Every test calls the real CLI in-process.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from clitools import crate, one_line_error
from PIL import Image

from crate_transformer import cli
from crate_transformer.models import generation as lm_module
from crate_transformer.train import RunDir, load_training_state

IMG = ["--image-size", 8, "--model", "crate_mnist", "--threads", 1, "--no-progress", "--batch-size", 8,
       "--model-args", "patch_size=4", "dim=16", "depth=1", "heads=2", "in_chans=1"]  # fmt: skip


def image_folder(root: Path, classes: tuple[str, ...] = ("a", "b"), n: int = 8) -> Path:
    """``root/train/<class>/*.png`` grey 8x8 images, a different mean per class."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(classes):
        folder = root / "train" / name
        folder.mkdir(parents=True)
        for i in range(n):
            pixels = np.clip(rng.normal(60 + 120 * c, 20, (8, 8)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, "L").save(folder / f"{i}.png")
    return root


def test_a_run_that_fails_after_its_folder_is_made_leaves_the_out_reusable(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = image_folder(tmp_path / "data")
    for png in sorted((data / "train" / "a").glob("*.png"))[:4]:  # valid headers, truncated pixels
        png.write_bytes(png.read_bytes()[:60])
    run = tmp_path / "run"
    args = ["train", "--data", data, *IMG, "--epochs", 1, "--data-mode", "stream", "--workers", 0, "--out", run]
    err = one_line_error(capsys, *args, "--on-bad-image", "error", after_output=True)
    assert ".png" in err and "--on-bad-image" in err, err
    assert not run.exists()  # nothing of the failed run is left (it made the folder)
    run.mkdir()  # an empty folder the user made is kept, emptied back
    assert crate(*args, "--on-bad-image", "error") == 2
    assert run.is_dir() and not [p for p in run.iterdir() if p.name != ".lock"]
    assert crate(*args, "--on-bad-image", "skip") == 0  # the corrected command on the same --out
    assert load_training_state(run)["step"] >= 1


def test_a_diverging_run_is_one_line_naming_step_loss_and_fixes_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    # batch 2: 7 steps an epoch, so the first epoch's checkpoint comes after the divergence
    common = [*IMG, "--batch-size", 2, "--log-every", 1, "--grad-clip", 0, "--eval-every", 0, "--lr", 1e12]
    err = one_line_error(
        capsys, "train", "--data", data, *common, "--checkpoint-every", 1, "--out", run, after_output=True
    )
    assert "training diverged: the loss became nan by step" in err, err
    for fix in ("--lr", "--grad-clip", "--amp none", f"last good checkpoint is kept in {run}"):
        assert fix in err, err
    kept = load_training_state(run)  # finite and resumable
    assert kept["step"] >= 1
    assert all(bool(v.isfinite().all()) for v in kept["model"].values() if v.is_floating_point())
    new = tmp_path / "new"
    err = one_line_error(capsys, "train", "--data", data, *common, "--out", new, after_output=True)
    assert "training diverged" in err and "no checkpoint was saved" in err and not new.exists(), err


SSL_ARCH = ["--model-args", "image_size=8", "patch_size=2", "dim=16", "depth=1", "heads=2"]
SSL = ["--threads", 1, "--no-progress", "--batch-size", 8, "--epochs", 2, "--eval-every", 1]


def test_mae_on_one_class_is_refused_before_training_naming_no_probe(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = image_folder(tmp_path / "one", classes=("only",), n=16)
    run = tmp_path / "mae"
    args = ["pretrain", "mae", "--data", data, "--model", "crate_mae_mnist", *SSL, *SSL_ARCH, "--out", run]
    capsys.readouterr()
    assert crate(*args) == 2
    out = capsys.readouterr()
    assert "single class" in out.err and "pass --no-probe" in out.err, out.err
    assert "run directory" not in out.err + out.out  # refused before the run started
    assert crate(*args, "--no-probe") == 0  # the corrected command on the same --out
    assert load_training_state(run)["step"] == 2 and not (run / "probe.json").exists()


def test_dino_on_one_unlabelled_folder_trains_and_skips_its_label_evaluations(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = image_folder(tmp_path / "one", classes=("only",), n=16)
    run = tmp_path / "dino"
    head = ["--out-dim", 16, "--hidden-dim", 16, "--bottleneck-dim", 8, "--warmup-epochs", 0]
    capsys.readouterr()
    assert crate("pretrain", "dino", "--data", data, *SSL, *SSL_ARCH, *head, "--out", run) == 0
    err = capsys.readouterr().err
    notice = [line for line in err.splitlines() if line.startswith("notice:")]
    assert len(notice) == 1 and "single class" in notice[0] and "skipped" in notice[0], err
    assert load_training_state(run)["step"] == 2 and (run / "model").is_dir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert not any("knn" in r for r in records)  # no k-NN score made up for one class
    assert any(r.get("final") and r["feature_std"] > 0 for r in records)


LM_ARGS = ["--threads", 1, "--no-progress", "--batch-size", 4, "--eval-every", 0, "--sample-tokens", 0,
           "--model-args", "dim=16", "depth=1", "heads=2", "block_size=16"]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lm")
    corpus = root / "c.txt"
    corpus.write_text("".join(f"line {i}: the value of x is {i * i}.\n" for i in range(120)))
    assert crate("train-lm", "--data", corpus, *LM_ARGS, "--max-steps", 2, "--out", root / "run") == 0
    return root / "run"


def test_ctrl_c_during_generate_keeps_the_streamed_text_and_exits_130(
    tiny_lm: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["generate", tiny_lm, "--prompt", "line ", "--max-new-tokens", 30, "--seed", 3, "--temperature", 1.0]
    capsys.readouterr()
    assert crate(*args) == 0
    full = capsys.readouterr().out
    calls = []
    real = lm_module.sample_next

    def interrupted(*a: object, **kw: object) -> object:
        calls.append(1)
        if len(calls) > 12:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(lm_module, "sample_next", interrupted)
    assert crate(*args) == 130
    out = capsys.readouterr()
    assert out.out.startswith("line ") and len(out.out.rstrip("\n")) > len("line ")
    assert full.startswith(out.out.rstrip("\n").rstrip("\ufffd"))  # the first 12 tokens of the same text
    assert len(out.err.strip().splitlines()) == 1 and "interrupted" in out.err and "Traceback" not in out.err


def test_a_huge_num_samples_runs_in_batches_and_figure_images_is_capped(
    tiny_lm: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = []
    real = lm_module.sample_next

    def counted(logits: object, **kw: object) -> object:
        rows.append(logits.shape[0])
        return real(logits, **kw)

    monkeypatch.setattr(lm_module, "sample_next", counted)
    capsys.readouterr()
    assert crate("generate", tiny_lm, "--prompt", "x", "--max-new-tokens", 2, "--num-samples", 70) == 0
    out = capsys.readouterr().out
    assert [f"--- sample {i}" for i in range(1, 71)] == [ln for ln in out.splitlines() if ln.startswith("--- ")]
    assert sorted(set(rows)) == [6, 32] and sum(rows) == 70 * 2  # 32 + 32 + 6 samples, never all 70 at once
    data = image_folder(tmp_path / "data")
    err = one_line_error(
        capsys, "pretrain", "mae", "--data", data, "--model", "crate_mae_mnist", *SSL, *SSL_ARCH,
        "--figure-images", 100000, "--out", tmp_path / "mae", after_output=True,
    )  # fmt: skip
    assert "--figure-images must be an integer in [0, 64], got 100000" in err, err


KILLED_RUN = """
import os, signal, sys, time
from crate_transformer.train import RunDir
run = RunDir.create(sys.argv[1])
worker = os.fork()  # as a DataLoader worker is made
if worker == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)  # the test reads the parent's output to its end, not the orphan's
    time.sleep(60)
    os._exit(0)
print(worker, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="forked workers exist on POSIX only")
def test_an_orphaned_worker_of_a_killed_run_does_not_hold_its_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2])}
    done = subprocess.run([sys.executable, "-c", KILLED_RUN, str(run)], capture_output=True, text=True, env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr
    worker = int(done.stdout.split()[0])
    try:
        os.kill(worker, 0)  # the orphan is alive ...
        RunDir.reopen(run).close()  # ... and the folder is free at once
    finally:
        os.kill(worker, signal.SIGKILL)


FULL_DISK = """
import resource, signal, sys
from crate_transformer import cli
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="file-size limits exist on POSIX only")
def test_a_checkpoint_write_that_runs_out_of_space_is_one_line_and_keeps_the_old_checkpoint(tmp_path: Path) -> None:
    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert crate("train", "--data", data, *IMG, "--epochs", 1, "--out", run) == 0
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2])}
    argv = ["train", "--resume", str(run), "--epochs", "2"]
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(len(before) // 2), *argv], capture_output=True,
                          text=True, env=env)  # fmt: skip
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"file too large (a file-size limit) while writing {last}; free space or write to" in err[-1], err
    assert last.read_bytes() == before and load_training_state(run)["step"] == 1
    assert not list(last.parent.glob(".*.tmp"))


class _FullDisk:
    """A file that takes ``room`` bytes, then fails each write as a full disk does (``ENOSPC``)."""

    def __init__(self, f, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name: str):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def test_a_disk_that_fills_inside_torchs_zip_writer_is_one_line_and_keeps_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The real full disk: torch's zip writer catches the OSError of a write and raises a RuntimeError from its
    ``__exit__`` while handling it ("unexpected pos"), which is not an OSError (RLIMIT_FSIZE fails earlier)."""
    from crate_transformer.io import pickles as cio

    data = image_folder(tmp_path / "data")
    run = tmp_path / "run"
    assert crate("train", "--data", data, *IMG, "--epochs", 1, "--out", run) == 0
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    real_open = open
    full = lambda path, mode="r", *a, **kw: (  # noqa: E731
        _FullDisk(real_open(path, mode, *a, **kw), len(before) // 2)
        if "last.pt" in str(path) and "w" in mode
        else real_open(path, mode, *a, **kw)
    )
    monkeypatch.setattr(cio, "open", full, raising=False)  # save_torch's module's open: its file object
    err = one_line_error(capsys, "train", "--resume", run, "--epochs", 2, after_output=True)
    assert f"no space left on device while writing {last}; free space or write to another folder" in err, err
    assert last.read_bytes() == before and load_training_state(run)["step"] == 1
    assert not list(last.parent.glob(".*.tmp"))


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="file-size limits exist on POSIX only")
def test_a_token_cache_write_that_runs_out_of_space_is_one_line_naming_the_cache_setting(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"line {i} of a corpus about sparse rate reduction" for i in range(4000)))
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parents[2]), "CRATE_CACHE_DIR": str(cache)}
    argv = ["train-lm", "--data", str(corpus), "--max-steps", "1", "--threads", "1", "--out", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-c", FULL_DISK, "20000", *argv], capture_output=True, text=True,
                          env=env)  # fmt: skip
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr  # was: ndarray.tofile's OSError
    assert "file too large (a file-size limit) while writing" in err[-1] and "CRATE_CACHE_DIR" in err[-1], err
    assert not [p for p in cache.rglob("*") if p.is_file()]  # no partial cache (nor temporary file) left behind
    assert not (tmp_path / "run").exists()
