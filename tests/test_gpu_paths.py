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
