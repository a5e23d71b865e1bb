"""``--strategy fsdp`` (FSDP2 ``fully_shard``): the same training as DDP, exact resume, checkpoints and saved
models that load in one process, and the one-line errors where it cannot shard.

The multi-process runs are two gloo processes on the CPU (``torchrun`` fixture) training a d=32, depth-2 CRATE on
the 8x8 digits for a few steps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import tiny
import torch
from clitools import crate, one_line_error
from safetensors.torch import load_file

from crate_transformer.io import load_pickle
from crate_transformer.loading.pipeline import from_pretrained, load_model
from crate_transformer.train import TrainConfig
from crate_transformer.train.sharding import check_strategy

# two blocks, so there are several FSDP units (one per block, and the root)
TINY = ["--data", "digits", "--image-size", "8", "--threads", "1", "--no-progress", "--log-every", "1", "--epochs",
        "1", "--batch-size", "64", "--model-args", "dim=32", "depth=2", "heads=2", "patch_size=4"]  # fmt: skip


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "model" / "model.safetensors")


def _finish(proc, what: str) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{what}:\n{err[-3000:]}"
    return out


def _train_losses(run: Path) -> list[float]:
    return [r["loss"] for r in _records(run) if r["split"] == "train"]


@pytest.mark.slow
def test_fsdp_trains_as_ddp_does(tmp_path: Path, torchrun) -> None:
    # the same global batches, accumulated in 2 chunks (FSDP's no-sync path), clipped (sharded gradient norms)
    args = [*TINY, "--augment", "none", "--max-steps", "6", "--accum-steps", "2", "--lr", "0.01", "--grad-clip", "0.5"]
    fsdp = torchrun("train", *args, "--strategy", "fsdp", "--out", tmp_path / "fsdp")
    ddp = torchrun("train", *args, "--out", tmp_path / "ddp")  # both at once: each waits on its peer's messages
    _finish(fsdp, "fsdp")
    _finish(ddp, "ddp")
    losses, reference = _train_losses(tmp_path / "fsdp"), _train_losses(tmp_path / "ddp")
    assert len(losses) == 6 and reference[0] != reference[-1]
    np.testing.assert_allclose(losses, reference, rtol=1e-5, atol=1e-6)
    w, ref = _weights(tmp_path / "fsdp"), _weights(tmp_path / "ddp")
    assert w.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(w[k], ref[k], rtol=0, atol=1e-5, msg=k)
    # the per-layer measurements of step 0 (--measure-every) ran on the gathered replica
    measured = [[r for r in _records(tmp_path / name) if r["split"] == "measure"] for name in ("fsdp", "ddp")]
    assert len(measured[0]) == 2 and measured[0] == measured[1]  # one record per layer


@pytest.mark.slow
def test_fsdp_resume_is_bitwise_identical_and_saves_full_weights(tmp_path: Path, torchrun) -> None:
    # dropout and translations consume every process's RNG; accumulation runs the no-sync path
    args = [*TINY, "dropout=0.1", "--accum-steps", "2", "--lr", "0.01", "--deterministic", "--strategy", "fsdp"]
    full = torchrun("train", *args, "--max-steps", "6", "--out", tmp_path / "full")
    cut = tmp_path / "cut"
    _finish(torchrun("train", *args, "--max-steps", "3", "--out", cut), "first half")
    _finish(full, "uninterrupted")
    state = load_pickle(cut / "checkpoints" / "last.pt")
    assert state["step"] == 3
    # world-size independent: full tensors, the optimizer state keyed by parameter name
    model = load_model(cut / "checkpoints" / "last.pt")
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert {k: v.shape for k, v in state["model"].items()} == shapes
    adam = state["optimizer"]["state"]
    assert set(adam) == {n for n, p in model.named_parameters()}
    assert all(adam[n]["exp_avg"].shape == shapes[n] for n in adam)
    halfway = {k: v.clone() for k, v in state["model"].items()}

    _finish(torchrun("train", "--resume", cut, "--max-steps", "6"), "resumed")
    ref, resumed = _weights(tmp_path / "full"), _weights(cut)
    assert ref.keys() == resumed.keys()
    for k in ref:
        assert torch.equal(ref[k], resumed[k]), k
    assert any(not torch.equal(resumed[k], halfway[k]) for k in halfway)  # the resumed half trained
    assert [r["step"] for r in _records(cut) if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]

    # the saved model/ loads in one process and holds the gathered weights of the final checkpoint
    final = load_pickle(cut / "checkpoints" / "last.pt")["model"]
    for loaded in (load_model(cut / "model"), from_pretrained(cut / "model")):
        sd = loaded.state_dict()
        assert sd.keys() == final.keys()
        for k in final:
            assert torch.equal(sd[k], final[k]), k


def test_fsdp_needs_several_processes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "train", *TINY, "--strategy", "fsdp", "--out", tmp_path / "r")
    assert "--strategy fsdp shards the model over processes" in err and "start it with torchrun" in err
    assert not (tmp_path / "r").exists()  # refused before a run directory was made
    with pytest.raises(ValueError, match=r"unknown strategy 'zero3'; choose one of \('ddp', 'fsdp'\)"):
        TrainConfig(strategy="zero3")  # a config file's value (argparse checks the flag's)


def test_check_strategy() -> None:
    check_strategy("ddp", 1, "classification")
    check_strategy("fsdp", 2, "classification")
    with pytest.raises(ValueError, match="task='dino' cannot train with strategy='fsdp'; use strategy='ddp'"):
        check_strategy("fsdp", 2, "dino", shardable=False)
    with pytest.raises(ValueError, match="one process"):
        check_strategy("fsdp", 1, "classification")


@pytest.mark.slow
def test_checkpoints_move_between_strategies(tmp_path: Path, torchrun) -> None:
    args = [*TINY, "--augment", "none", "--lr", "0.01"]
    reference = torchrun("train", *args, "--max-steps", "6", "--out", tmp_path / "ddp")
    _finish(torchrun("train", *args, "--max-steps", "3", "--out", tmp_path / "cut"), "first half (ddp)")
    _finish(reference, "ddp to the end")
    shutil.copytree(tmp_path / "cut", tmp_path / "cut_fsdp")
    # a DDP checkpoint (optimizer state keyed by index) continued by FSDP: the same training as DDP's
    _finish(torchrun("train", "--resume", tmp_path / "cut_fsdp", "--max-steps", "6", "--strategy", "fsdp"), "to fsdp")
    w, ref = _weights(tmp_path / "cut_fsdp"), _weights(tmp_path / "ddp")
    for k in ref:
        torch.testing.assert_close(w[k], ref[k], rtol=0, atol=1e-5, msg=k)
    state = load_pickle(tmp_path / "cut_fsdp" / "checkpoints" / "last.pt")
    assert all(isinstance(k, str) for k in state["optimizer"]["state"])  # saved by name now
    # ... and that FSDP checkpoint continued in one process: AdamW's step count goes on from 6
    assert crate("train", "--resume", tmp_path / "cut_fsdp", "--max-steps", "8", "--strategy", "ddp") == 0
    adam = load_pickle(tmp_path / "cut_fsdp" / "checkpoints" / "last.pt")["optimizer"]["state"]
    assert adam and all(float(s["step"]) == 8 for s in adam.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        # CRATE-MAE: the decoder's layer list is sharded too
        ["pretrain", "mae", "--data", "digits", "--model", "crate_mae_mnist", "--model-args", *tiny.SSL_ARCH],
        # a GPT: the head is tied to the token embedding, in the root unit
        [
            "train-lm",
            "--model",
            "gpt2_small",
            "--model-args",
            "dim=32",
            "depth=2",
            "heads=2",
            "block_size=32",
            "--eval-blocks",
            "16",
            "--sample-tokens",
            "5",
        ],
    ],  # fmt: skip
    ids=["mae", "lm"],
)
def test_fsdp_trains_the_other_tasks_as_ddp_does(tmp_path: Path, torchrun, command: list[str]) -> None:
    args = [*command, "--threads", "1", "--no-progress", "--epochs", "1", "--max-steps", "4", "--batch-size", "16"]
    fsdp = torchrun(*args, "--strategy", "fsdp", "--out", tmp_path / "fsdp")
    ddp = torchrun(*args, "--out", tmp_path / "ddp")
    _finish(fsdp, "fsdp")
    _finish(ddp, "ddp")
    w, ref = _weights(tmp_path / "fsdp"), _weights(tmp_path / "ddp")
    assert w.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(w[k], ref[k], rtol=0, atol=1e-5, msg=k)


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks, self.head = torch.nn.ModuleList([torch.nn.Linear(8, 8)]), torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks[0](x))


def _two_shards(rank: int, port: int, out: dict) -> None:
    """One of two gloo processes: a sharded model under the bf16 policy, and the engine's fp16 scaler on it."""
    import os

    import torch.distributed as dist

    from crate_transformer.train import sharding
    from crate_transformer.train.optim import Optimization
    from crate_transformer.train.runtime import Runtime

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, seen = _Net(), []
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.append((m.weight.dtype, args[0].dtype)))
    sharding.shard(model, amp_dtype=torch.bfloat16)
    x = torch.randn(4, 8)
    model(x).float().sum().backward()
    out[f"compute_{rank}"] = seen
    out[f"grads_{rank}"] = sorted({str(p.grad.dtype) for p in model.parameters()})
    # fp16: an overflow in one process's shard skips the step on both (the scale halves on both)
    model = sharding.shard(_Net())
    cfg = TrainConfig(lr=0.1, grad_clip=0, warmup_epochs=0, epochs=1)
    rt = Runtime(rank, 2, rank, torch.device("cpu"), amp_dtype=torch.float16)
    opt = Optimization(model, cfg.optim, 10, 10, rt)
    before = [p.full_tensor().clone() for p in model.parameters()]
    opt.zero_grad()
    opt.backward(model(x).sum())
    if rank == 1:
        next(iter(model.parameters())).grad.to_local().fill_(float("inf"))
    opt.step()
    out[f"stepped_{rank}"] = any(not torch.equal(a, p.full_tensor()) for a, p in zip(before, model.parameters()))
    out[f"scale_{rank}"] = float(opt.scaler.get_scale())
    dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_computes_in_the_amp_dtype_and_skips_overflowing_steps_together() -> None:
    """--strategy fsdp with --amp: the blocks run on weights gathered in the amp dtype (FSDP's MixedPrecisionPolicy:
    half the all-gather bytes), gradients stay float32; with fp16, a step whose gradients overflow in one process's
    shard is skipped by every process (the inf check is all-reduced over the shards)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_two_shards, args=(port, out), nprocs=2)
    for rank in (0, 1):
        assert out[f"compute_{rank}"] == [(torch.bfloat16, torch.bfloat16)]
        assert out[f"grads_{rank}"] == ["torch.float32"]
        assert out[f"stepped_{rank}"] is False
        assert out[f"scale_{rank}"] == 65536.0 / 2
