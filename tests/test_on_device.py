"""The device under test (``CRATE_TEST_DEVICE``, default cpu) end to end: every family's forward and backward
against the CPU in float64, its bf16 autocast forward, and the training commands of every task with ``--device``.

On the CPU these are quick checks of the same paths; on a GPU (``CRATE_TEST_DEVICE=cuda python -m pytest``) they
are what a GPU user runs first.  Tolerances: tests/tolerances.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import tiny
import torch
from clitools import crate
from tolerances import tol

FAMILIES = tiny.family_builders()


def _seeded_inputs(model: torch.nn.Module) -> object:
    torch.manual_seed(1)
    return tiny.family_inputs(model)


def _forward(model: torch.nn.Module, x: object, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The family's differentiated scalar (CRATE-MAE: masking fixed by a seeded noise, so both runs mask alike)."""
    move = lambda t: t.to(device, dtype) if t.is_floating_point() else t.to(device)  # noqa: E731
    x = [move(v) for v in x] if isinstance(x, list) else move(x)
    if hasattr(model, "decoder_layers"):  # CRATE-MAE
        noise = torch.rand(2, model.config.grid**2, generator=torch.Generator().manual_seed(0))
        return tiny.family_loss(model(x, noise=noise.to(device, dtype)))
    return tiny.family_loss(model(x))


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_computes_on_the_device_what_float64_gives(family: str, device: torch.device) -> None:
    """Forward and backward in float32 on the device against the same model in float64 on the CPU."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    x = _seeded_inputs(model)
    ref = copy.deepcopy(model).double()
    want = _forward(ref, x, torch.device("cpu"), torch.float64)
    want.backward()
    model = model.to(device)
    got = _forward(model, x, device, torch.float32)
    got.backward()
    t = tol(torch.float32, device)
    torch.testing.assert_close(got.double().cpu(), want, **t)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if q.grad is not None:  # relative to the gradient's largest entry: float32 sums of large terms cancel
            scale = q.grad.abs().max().clamp_min(1.0)
            torch.testing.assert_close(p.grad.double().cpu() / scale, q.grad / scale, **t, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_runs_under_bf16_autocast_on_the_device(family: str, device: torch.device) -> None:
    """bf16 autocast (``--amp bf16``): finite, and the float32 result to bf16's precision."""
    torch.manual_seed(0)
    model = FAMILIES[family]().eval().to(device)
    x = _seeded_inputs(model)
    full = _forward(model, x, device, torch.float32)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        half = _forward(model, x, device, torch.float32)
    half.backward()
    assert torch.isfinite(half) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    torch.testing.assert_close(half.float(), full, **tol(torch.bfloat16, device))


# --------------------------------------------------------------------------- the training commands with --device
def _final(run: Path) -> dict:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()][-1]


COMMON = ["--threads", "1", "--no-progress", "--epochs", "1", "--eval-every", "0"]


@pytest.mark.parametrize(
    "command",
    [
        [
            "train",
            "--data",
            "digits",
            "--image-size",
            "8",
            "--measure-every",
            "2",
            "--model-args",
            *tiny.kv(tiny.TRAIN_ARCH),
        ],
        [
            "pretrain",
            "mae",
            "--data",
            "digits",
            "--model",
            "crate_mae_mnist",
            "--model-args",
            *tiny.SSL_ARCH,
            "--no-probe",
            "--no-recognition",
            "--figure-images",
            "0",
        ],
        [
            "pretrain",
            "dino",
            "--data",
            "digits",
            "--model",
            "crate_mnist",
            "--model-args",
            *tiny.SSL_ARCH,
            "--preset",
            "paper",
            "--out-dim",
            "32",
            "--hidden-dim",
            "16",
            "--bottleneck-dim",
            "8",
            "--local-crops-number",
            "2",
            "--local-crop-size",
            "4",
        ],
        [
            "train-lm",
            "--model-args",
            "dim=32",
            "depth=1",
            "heads=2",
            "block_size=16",
            "--eval-blocks",
            "8",
            "--sample-tokens",
            "4",
        ],
    ],  # fmt: skip
    ids=["classification", "mae", "dino", "lm"],
)
def test_the_training_commands_run_on_the_device(command: list[str], device: torch.device, tmp_path: Path) -> None:
    """Each task trains a few steps on the device (``--amp auto``: bf16 on a GPU) with ``--deterministic`` (DINO's
    local crops interpolate the position grid: a deterministic backward on a GPU too) and finishes."""
    args = [*command, *COMMON, "--max-steps", "3", "--batch-size", "16", "--device", str(device), "--deterministic"]
    assert crate(*args, "--out", tmp_path / "run") == 0
    assert _final(tmp_path / "run").get("final") is True


def test_a_resumed_run_on_the_device_continues_bitwise(device: torch.device, tmp_path: Path) -> None:
    """Six steps straight, or three and three more after a resume, give the same weights on the device
    (``--deterministic``; the RNG states of the device are part of the checkpoint)."""
    from safetensors.torch import load_file

    args = ["train", "--data", "digits", "--image-size", "8", *COMMON, "--measure-every", "0", "--batch-size", "32",
            "--device", str(device), "--deterministic", "--log-every", "1", "--model-args", *tiny.kv(tiny.TRAIN_ARCH),
            "dropout=0.1"]  # fmt: skip
    assert crate(*args, "--max-steps", "6", "--out", tmp_path / "full") == 0
    assert crate(*args, "--max-steps", "3", "--out", tmp_path / "cut") == 0
    assert crate("train", "--resume", tmp_path / "cut", "--max-steps", "6", "--threads", "1", "--no-progress") == 0
    full, resumed = (load_file(tmp_path / r / "model" / "model.safetensors") for r in ("full", "cut"))
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


def test_text_finetuning_runs_on_the_device_compiled(device: torch.device, tmp_path: Path) -> None:
    """finetune-text on the device; on a GPU with ``--compile`` (what the loss runs, ``classify``, compiled)."""
    from crate_transformer.models.lm import LMConfig, build_lm
    from crate_transformer.models.tokenizer import Tokenizer

    lm = build_lm(LMConfig(dim=32, depth=1, heads=2, block_size=24))
    lm.tokenizer = Tokenizer.byte_level()
    lm.save_pretrained(tmp_path / "lm")
    (tmp_path / "t.csv").write_text("text,label\n" + "".join(f"row {'ab' * (i % 5)},{i % 2}\n" for i in range(64)))
    compile_ = ["--compile"] if device.type == "cuda" else []
    args = ["finetune-text", "--from", tmp_path / "lm", "--data", tmp_path / "t.csv", *COMMON, "--batch-size", "8",
            "--max-steps", "4", "--val-fraction", "0.25", "--device", str(device), *compile_]  # fmt: skip
    assert crate(*args, "--out", tmp_path / "run") == 0
    assert "acc" in _final(tmp_path / "run")
