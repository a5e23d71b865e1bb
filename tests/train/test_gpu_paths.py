"""GPU code paths proven on the CPU: torch.cuda's functions replaced by recorders (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from crate_transformer.train.runtime import Runtime, rng_state, set_rng_state


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch):
    """``fake_gpus(n)``: torch.cuda reports ``n`` GPUs; returns the calls made to it (``set_device``, RNG states)."""
    calls: dict[str, list] = {"set_device": [], "set_rng_state": []}

    def install(n: int) -> dict[str, list]:
        def set_rng(state: torch.Tensor, device: int | str = "cuda") -> None:
            index = device if isinstance(device, int) else torch.device(device).index or 0
            if index >= n:  # what torch does for a GPU that is not there
                raise IndexError(f"list index out of range (GPU {index} of {n})")
            calls["set_rng_state"].append(index)

        def set_device(device: torch.device | int) -> None:
            torch.cuda._get_device_index(device)  # torch's own check: an index-less device raises here
            calls["set_device"].append(device)

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, "set_device", set_device)
        monkeypatch.setattr(torch.cuda, "set_rng_state", set_rng)
        monkeypatch.setattr(torch.cuda.random, "set_rng_state", set_rng)
        return calls

    return install


@pytest.mark.parametrize(("name", "index"), [("cuda", 0), ("cuda:1", 1), ("auto", 0)])
def test_runtime_start_on_a_gpu_sets_an_indexed_device(fake_gpus, monkeypatch, name, index):
    """``--device cuda`` (the documented value) set torch.device("cuda"), which set_device refuses (no index)."""
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    calls = fake_gpus(2)
    rt = Runtime.start(name, amp="auto")
    assert rt.device == torch.device("cuda", index)
    assert [torch.device(d) for d in calls["set_device"]] == [torch.device("cuda", index)]
    assert rt.amp_dtype == torch.bfloat16


def test_resume_on_fewer_gpus_restores_the_rng_states_of_those_present(fake_gpus):
    """A checkpoint written with 2 GPUs visible, resumed with 1: the first GPU's state is restored, no IndexError."""
    state = {**rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]}
    calls = fake_gpus(1)
    set_rng_state(state)
    assert calls["set_rng_state"] == [0]
    calls = fake_gpus(2)
    calls["set_rng_state"].clear()
    set_rng_state(state)
    assert calls["set_rng_state"] == [0, 1]


def _ops_of_backward(fn) -> set[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    out = fn()
    with Record():
        out.sum().backward()
    return seen


@pytest.mark.parametrize(("h", "w"), [(2, 3), (6, 6), (9, 5)])
def test_position_interpolation_is_bicubic_with_a_deterministic_backward(h, w):
    """The position grid resized by two matrix products equals F.interpolate's bicubic resize, and its backward
    has no bicubic-upsampling backward (which has no deterministic CUDA kernel: --deterministic with DINO's local
    crops or a fine-tuning resolution failed on a GPU)."""
    import torch.nn.functional as F

    import crate_transformer as ct

    model = ct.create_model("crate_tiny", image_size=16, patch_size=4, dim=8, depth=1, heads=2, num_classes=3)
    g = model.config.grid
    grid = model.pos_embed[:, 1:].detach().double().reshape(1, g, g, -1).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=False)
    want = want.permute(0, 2, 3, 1).reshape(1, h * w, -1)
    got = model.interpolate_pos_embed(h, w)
    torch.testing.assert_close(got[:, 1:].double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got[:, :1], model.pos_embed[:, :1])
    ops = _ops_of_backward(lambda: model.interpolate_pos_embed(h, w))
    assert not any("upsample_bicubic2d" in op for op in ops), sorted(ops)
    assert model.pos_embed.grad is not None and model.pos_embed.grad[:, 1:].abs().sum() > 0


def _vote(rank: int, port: int, out: dict) -> None:
    import os

    import torch.distributed as dist

    from crate_transformer.train.runtime import StopVote

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rt = Runtime(rank, 2, rank, torch.device("cpu"), host_group=dist.new_group(backend="gloo"))
    vote = StopVote(rt)
    out[rank] = [vote(rank == 1 and step >= 3) for step in range(6)]  # a signal reaches process 1 at step 3
    vote.close()
    dist.destroy_process_group()


@pytest.mark.slow
def test_processes_agree_to_stop_on_the_host_one_step_after_a_signal() -> None:
    """The interrupt vote runs on the host (gloo), never reading a device value: both processes stop at the same
    step, the one after the signal, however many steps the signalled process has flagged."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_vote, args=(port, out), nprocs=2)
    assert out[0] == out[1] == [False, False, False, False, True, True]


@pytest.mark.parametrize(("tf32", "run_on", "inside"), [(True, "cuda", "high"), (False, "cuda", "highest"),
                                                        (True, "cpu", None)])  # fmt: skip
def test_tf32_for_float32_matmuls_on_a_gpu_run(tf32: bool, run_on: str, inside: str | None) -> None:
    """On a GPU run, float32 matmuls use TF32 unless --no-tf32; a CPU run is left alone; both put the process
    back as it was."""
    from crate_transformer.train.runtime import ProcessSettings

    before = torch.get_float32_matmul_precision()
    with ProcessSettings(1, False, tf32, torch.device(run_on)):
        assert torch.get_float32_matmul_precision() == (inside or before)
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize(("cpus", "local_world", "workers"), [(2, None, 1), (16, None, 15), (96, "8", 11),
                                                              (64, None, 16), (1, None, 1)])  # fmt: skip
def test_loader_workers_follow_the_machine(monkeypatch, cpus: int, local_world: str | None, workers: int) -> None:
    from crate_transformer.data.streaming import resolve_workers

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    if local_world is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world)
    assert resolve_workers(-1) == workers
    assert resolve_workers(3) == 3 and resolve_workers(0) == 0


def test_batches_reach_a_gpu_through_pinned_memory(monkeypatch) -> None:
    """A batch in ordinary host memory is pinned before its non-blocking copy to a GPU (from pageable memory the
    copy makes the host wait); a pinned one is not copied twice; the CPU path copies nothing."""
    from crate_transformer.data import to_device

    calls = []
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t, *a: getattr(t, "_fake_pinned", False))

    def pin(t):
        calls.append("pin")
        out = t.clone()
        out._fake_pinned = True
        return out

    def to(t, device, non_blocking=False):
        calls.append(("to", str(device), non_blocking, getattr(t, "_fake_pinned", False)))
        return t

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    to_device(torch.zeros(2), "cuda:0")
    assert calls == ["pin", ("to", "cuda:0", True, True)]
    calls.clear()
    already = pin(torch.zeros(2))
    calls.clear()
    to_device(already, "cuda")
    assert calls == [("to", "cuda", True, True)]
    calls.clear()
    to_device(torch.zeros(2), "cpu")
    assert calls == [("to", "cpu", True, False)]
