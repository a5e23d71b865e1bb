"""The training engine: run-directory safety, checksummed state, accumulation, TensorBoard, config coercion,
and a task that is not classification trained by the same loop."""

from __future__ import annotations

import dataclasses
import errno
import io
import json
import os
import sys
from pathlib import Path

import pytest
import tiny
import torch
from clitools import crate, one_line_error
from torch import nn

from crate_transformer.train import RunDir, Task, TaskResult, TrainConfig, load_training_state, train
from crate_transformer.train.runtime import resolve_device
from crate_transformer.train.task import TASKS, task_option

ARCH = tiny.TRAIN_ARCH
TINY = tiny.TRAIN_CLI
FAST = ["--epochs", "1", "--max-steps", "3", "--measure-every", "0", "--eval-every", "0"]


def small_cfg(out: Path, **kw: object) -> TrainConfig:
    base = dict(data="digits", image_size=8, threads=1, progress=False, model_args=dict(ARCH), epochs=1,
                measure_every=0, eval_every=0, out=str(out))  # fmt: skip
    return TrainConfig(**{**base, **kw})


# --------------------------------------------------------------------------- run directory
def test_a_run_directory_in_use_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = RunDir.create(tmp_path / "r")  # another process's run, as far as the lock is concerned
    try:
        err = one_line_error(capsys, "train", *TINY, *FAST, "--out", tmp_path / "r")
        assert "is in use by crate process" in err
        assert not (tmp_path / "r" / "metrics.jsonl").exists()
    finally:
        run.close()
    assert crate("train", *TINY, *FAST, "--out", tmp_path / "r") == 0  # free again once the owner closes


class FakeMsvcrt:
    """``msvcrt.locking`` as Windows behaves: a byte range locked by one handle is refused to every other handle
    (of this process too), unlocking needs the handle that locked it, and the range starts at the file position."""

    LK_NBLCK, LK_UNLCK = 2, 0

    def __init__(self) -> None:
        self.held: dict[tuple[int, int, int], int] = {}  # (device, inode, offset) -> fd
        self.calls: list[tuple[int, int]] = []  # (mode, offset)

    def locking(self, fd: int, mode: int, nbytes: int) -> None:
        assert nbytes == 1
        st, offset = os.fstat(fd), os.lseek(fd, 0, os.SEEK_CUR)
        key = (st.st_dev, st.st_ino, offset)
        self.calls.append((mode, offset))
        if mode == self.LK_NBLCK:
            if key in self.held:
                raise PermissionError(errno.EACCES, "Permission denied")
            self.held[key] = fd
        elif self.held.get(key) != fd:
            raise PermissionError(errno.EACCES, "Permission denied")  # unlocking a range this handle does not hold
        else:
            del self.held[key]


def test_the_run_directory_lock_on_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without fcntl (Windows) the lock is msvcrt's byte-range lock, with the same semantics as flock."""
    fake = FakeMsvcrt()
    monkeypatch.setitem(sys.modules, "fcntl", None)  # `import fcntl` raises ImportError, as on Windows
    monkeypatch.setitem(sys.modules, "msvcrt", fake)
    first = RunDir.create(tmp_path / "r")
    with pytest.raises(ValueError, match=f"is in use by crate process {os.getpid()} since"):
        RunDir.create(tmp_path / "r")  # the owner line stays readable while the lock is held
    with pytest.raises(ValueError, match="is in use by"):
        RunDir.reopen(tmp_path / "r")
    owner_line = (tmp_path / "r" / ".lock").read_text()
    locked_at = {offset for _, offset in fake.calls}
    assert len(locked_at) == 1 and locked_at.pop() > len(owner_line)  # the locked byte is past the owner line
    first.close()
    assert not fake.held  # released by the handle that took it
    second = RunDir.reopen(tmp_path / "r")  # free again once the owner closes
    assert len(fake.held) == 1
    second.close()
    assert not fake.held and [m for m, _ in fake.calls].count(fake.LK_NBLCK) == 4


def test_the_run_directory_lock_is_flock_on_posix(tmp_path: Path) -> None:
    """On POSIX a second open file description is refused while the first holds the lock."""
    fcntl = pytest.importorskip("fcntl")  # Windows runs the test above instead
    run = RunDir.create(tmp_path / "r")
    fd = os.open(tmp_path / "r" / ".lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        run.close()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released by close()
    finally:
        os.close(fd)


def test_a_finished_run_without_checkpoints_or_user_files_are_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "done"
    assert crate("train", *TINY, *FAST, "--out", run) == 0
    weights = (run / "model" / "model.safetensors").read_bytes()
    (run / "checkpoints" / "last.pt").unlink()
    err = one_line_error(capsys, "train", *TINY, *FAST, "--out", run)
    assert "is not empty" in err and "new or empty directory" in err
    assert (run / "model" / "model.safetensors").read_bytes() == weights

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "metrics.jsonl").write_text("my notes\n")
    assert "is not empty" in one_line_error(capsys, "train", *TINY, *FAST, "--out", mine)
    assert (mine / "metrics.jsonl").read_text() == "my notes\n"

    (tmp_path / "f").write_text("x")
    assert "is a file" in one_line_error(capsys, "train", *TINY, *FAST, "--out", tmp_path / "f")


def test_unwritable_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    real_open = os.open

    def deny(path, *a, **kw):  # root ignores chmod, so refuse the write the way a read-only mount would
        if str(path).startswith(str(tmp_path / "ro")):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", deny)
    assert "permission denied" in one_line_error(capsys, "train", *TINY, *FAST, "--out", tmp_path / "ro")


def test_corrupt_training_state_is_detected_and_temporaries_are_cleaned(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "r"
    assert crate("train", *TINY, "--epochs", "2", "--max-steps", "3", "--measure-every", "0", "--out", run) == 0
    ckpt = run / "checkpoints" / "last.pt"
    good = ckpt.read_bytes()
    state = torch.load(ckpt, weights_only=True)
    assert len(state["sha256"]) == 64 and load_training_state(run)["step"] == 3

    # one weight changed behind the checksum's back (what a flipped bit in the tensor data amounts to)
    key = next(iter(state["model"]))
    state["model"][key].view(-1)[0] += 1.0
    torch.save(state, ckpt)
    err = one_line_error(capsys, "train", "--resume", run)
    assert "is corrupt" in err and str(ckpt) in err

    # a flipped byte inside the stored weights of the file itself
    weight = torch.load(io.BytesIO(good), weights_only=True)["model"]["layers.0.attn.qkv.weight"]
    raw = bytearray(good)
    at = good.find(weight.numpy().tobytes()[:64])
    assert at > 0
    raw[at + 10] ^= 0x40
    ckpt.write_bytes(bytes(raw))
    assert "is corrupt" in one_line_error(capsys, "train", "--resume", run)

    # a kill during a write leaves a temporary file; the next start removes it
    ckpt.write_bytes(good)
    (run / "checkpoints" / ".last.pt.abc123.tmp").write_bytes(b"")
    (run / ".metrics.jsonl.xyz.tmp").write_bytes(b"")
    assert crate("train", "--resume", run, "--no-progress") == 0
    assert not list(run.rglob(".*.tmp"))


# --------------------------------------------------------------------------- options
def test_bad_options_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert "--lr must be a finite number" in one_line_error(capsys, "train", "--lr", "inf")
    assert "--lr must be a number" in one_line_error(capsys, "train", "--lr", "fast")
    assert "unknown device 'tpu'" in one_line_error(capsys, "train", *TINY, "--device", "tpu")
    assert "--image-size must be a positive integer" in one_line_error(capsys, "train", "--image-size", "0")
    one = tmp_path / "one" / "only"
    one.mkdir(parents=True)
    from PIL import Image

    for i in range(6):
        Image.new("L", (8, 8), color=i * 40).save(one / f"{i}.png")
    err = one_line_error(capsys, "train", "--data", tmp_path / "one", "--model-args", "dim=32", "depth=1",
                         "--out", tmp_path / "o1")  # fmt: skip
    assert "single class" in err and "at least two" in err
    with pytest.raises(ValueError, match="resolve_device|unknown device|unsupported device"):
        resolve_device("tpu")


def test_yaml_values_are_coerced_by_field_type(tmp_path: Path) -> None:
    from crate_transformer.train import load_config

    (tmp_path / "c.yaml").write_text("lr: 1e-3\nbatch_size: '64'\naugment: crop-flip\nhflip: 'no'\nimage_size: null\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.optim.lr == 0.001 and isinstance(cfg.optim.lr, float)  # YAML 1.1 reads 1e-3 as a string
    assert cfg.optim.batch_size == 64 and cfg.augmentation.hflip is False and cfg.data.image_size is None
    (tmp_path / "bad.yaml").write_text("epochs: 2.5\n")
    with pytest.raises(ValueError, match="epochs must be an integer"):
        load_config(tmp_path / "bad.yaml")


def test_eval_out_that_is_a_file_fails_before_evaluating(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "r"
    assert crate("train", *TINY, *FAST, "--out", run) == 0
    (tmp_path / "f").write_text("x")
    assert "is a file" in one_line_error(capsys, "eval", run, "--out", tmp_path / "f")
    assert "--batch-size must be a positive" in one_line_error(capsys, "eval", run, "--batch-size", "0")


# --------------------------------------------------------------------------- the loop
def _weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model" / "model.safetensors")


def test_gradient_accumulation_matches_the_full_batch(tmp_path: Path) -> None:
    """4 chunks of 16 give the gradient of one batch of 64: the same weights after 5 steps (float rounding)."""
    kw = dict(augment="none", batch_size=64, max_steps=5, label_smoothing=0.0, deterministic=True)
    full = train(small_cfg(tmp_path / "full", **kw))
    acc = train(small_cfg(tmp_path / "acc", accum_steps=4, **kw))
    assert full["step"] == acc["step"] == 5
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "acc")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    other = train(small_cfg(tmp_path / "b32", **{**kw, "batch_size": 32}))  # a different gradient: not close
    c = _weights(tmp_path / "b32")
    assert other["step"] == 5 and any(not torch.allclose(a[k], c[k], rtol=1e-4, atol=1e-5) for k in a)
    with pytest.raises(ValueError, match="not divisible by 1 process"):
        train(small_cfg(tmp_path / "bad", batch_size=64, accum_steps=3))


def test_tensorboard_logs_beside_metrics(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(small_cfg(tmp_path / "tb", max_steps=4, log_every=2, tensorboard=True))
    ev = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    ev.Reload()
    losses = [e.value for e in ev.Scalars("train/loss")]
    jsonl = [r["loss"] for r in map(json.loads, (tmp_path / "tb" / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]  # fmt: skip
    assert losses == pytest.approx(jsonl, rel=1e-6) and len(losses) == 2
    assert "test/acc" in ev.Tags()["scalars"]


@dataclasses.dataclass
class _RegressionOptions:
    scale: float = task_option(1.0, "scale of the regression targets")


class _Regression(Task):
    """A task that is not classification: least squares on fixed random data, to show the engine is generic."""

    name, metric, command, Options = "regression", "mse", "pretrain regression", _RegressionOptions
    defaults = {"batch_size": 32, "lr": 0.1, "min_lr": 0.0, "warmup_epochs": 0, "weight_decay": 0.0, "grad_clip": 0}

    def setup(self, state):
        self.options = self.parse_options(self.cfg)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) * self.options.scale

        class Data:
            def __len__(self):
                return 256

            def steps_per_epoch(self, b):
                return 256 // b

            def batches(self, b, *, shuffle, at):
                from crate_transformer.data import global_batches, rank_slice

                for idx in global_batches(256, b, shuffle=shuffle, at=at):
                    i = rank_slice(idx, at.rank, at.world)
                    yield x[i], y[i]

        self.train_data = Data()
        self.model = nn.Linear(8, 1)
        self.x, self.y = x, y

    def prepare(self, batch):
        return batch

    def loss(self, model, batch):
        x, y = batch
        loss = ((model(x) - y) ** 2).mean()
        n = torch.tensor(float(len(x)))
        return loss, {"loss": loss.detach() * n, "mse": loss.detach() * n, "n": n}

    def evaluate(self, split):
        with torch.no_grad():
            return {"loss": float(((self.model(self.x) - self.y) ** 2).mean())}

    def finish(self, run_dir):
        m = self.evaluate("test")
        return TaskResult(record=m, message=f"final mse {m['loss']:.4f}", numbers={"mse": m["loss"]})


def test_the_engine_trains_any_task(tmp_path: Path) -> None:
    cfg = TrainConfig(epochs=20, batch_size=32, lr=0.05, min_lr=0.0, weight_decay=0.0, warmup_epochs=0,
                      grad_clip=0, measure_every=0, progress=False, out=str(tmp_path / "reg"))  # fmt: skip
    first = train(cfg, task=_Regression(), overrides={"max_steps": 8})
    assert first["step"] == 8
    done = train(task=_Regression(), resume=tmp_path / "reg", overrides={"max_steps": 0})
    assert done["step"] == 20 * 8 and done["mse"] < 0.05
    records = [json.loads(line) for line in (tmp_path / "reg" / "metrics.jsonl").read_text().splitlines()]
    train_r = [r for r in records if r["split"] == "train"]
    assert train_r[-1]["mse"] < train_r[0]["mse"] / 10
    assert (tmp_path / "reg" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_registered_task_is_a_pretrain_command_with_its_own_options(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    monkeypatch.setitem(TASKS, "regression", f"{__name__}:_Regression")
    run = tmp_path / "reg"
    common = ["--threads", "1", "--no-progress", "--eval-every", "0"]
    assert crate("pretrain", "regression", *common, "--epochs", 20, "--max-steps", 5, "--scale", 2, "--out", run) == 0
    saved = load_training_state(run)["train_config"]
    assert saved["task"] == "regression" and saved["task_args"] == {"scale": 2.0} and saved["optim"]["batch_size"] == 32
    # the wrong command refuses the run and names the right one; options of the task are checked
    err = one_line_error(capsys, "train", "--resume", run)
    assert f"crate pretrain regression --resume {run}" in err
    err = one_line_error(capsys, "pretrain", "regression", *common, "--scale", "abc", "--out", tmp_path / "bad")
    assert "scale" in err and "abc" in err
    # resuming keeps the task options: the same targets, so the loss keeps falling to the optimum
    assert crate("pretrain", "regression", "--resume", run, "--max-steps", "0") == 0
    state = load_training_state(run)
    assert state["step"] == 20 * 8 and state["train_config"]["task_args"] == {"scale": 2.0}
    w = state["model"]["weight"]
    g = torch.Generator().manual_seed(0)
    torch.randn(256, 8, generator=g)
    truth = torch.randn(8, 1, generator=g).T * 2
    assert torch.allclose(w, truth, atol=0.1), (w, truth)


def test_disk_full_while_checkpointing_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    def full(obj, f, *a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    capsys.readouterr()
    assert crate("train", *TINY, *FAST, "--out", tmp_path / "r") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the run's start banner
    assert err.startswith("crate train: error: no space left on device while writing") and "last.pt" in err
    assert not list((tmp_path / "r").rglob("*.tmp"))
