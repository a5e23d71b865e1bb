"""The process a run lives in: device, distributed group, RNG state, mixed precision and interrupts.

Everything here is independent of what is trained; the loop (:mod:`.loop`) and tasks use it.
"""

from __future__ import annotations

import gc
import os
import random
import signal
import sys
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from ..data.base import Position
from ..errors import OptionError
from .threads import resolve_threads

__all__ = ["Runtime", "resolve_device", "rng_state", "set_rng_state", "seed_everything", "Interrupt", "StopVote"]

T = TypeVar("T")


def resolve_device(name: str = "auto", local_rank: int = 0) -> torch.device:
    """``auto`` → ``cuda:LOCAL_RANK`` if a GPU is present, else ``mps``, else ``cpu``; a named device is checked.

    The one device resolver of every command (train, eval, analyze).
    """
    name = str(name).strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device(f"cuda:{local_rank}")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"unsupported device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise OptionError(f"device={name!r} was requested but no CUDA GPU is available; use device='cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise OptionError(f"device={name!r}: only {torch.cuda.device_count()} GPU(s) present")
    if device.type == "mps" and not (torch.backends.mps.is_available()):
        raise OptionError("device='mps' was requested but MPS is not available; use device='cpu'")
    return device


@dataclass
class Runtime:
    """Rank, world size and device of this process (torchrun's environment; one process without it)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    amp_dtype: torch.dtype | None = None
    host_group: Any = None  # a gloo group for host-side agreement (see :class:`StopVote`), made by start()

    @classmethod
    def start(cls, device: str = "auto", amp: str = "none") -> Runtime:
        """Read torchrun's environment and start gloo (CPU) or nccl (GPU) when ``WORLD_SIZE`` > 1."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        dev = resolve_device(device, local)
        if dev.type == "cuda":
            # under torchrun each process takes its own GPU; alone, ``cuda`` means the current one (set_device
            # needs an index)
            index = local if world > 1 else dev.index if dev.index is not None else torch.cuda.current_device()
            dev = torch.device("cuda", index)
            torch.cuda.set_device(dev)
        host_group = None
        if world > 1:
            if not torch.distributed.is_initialized():
                torch.distributed.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
            host_group = torch.distributed.new_group(backend="gloo")
        return cls(rank, world, local, dev, amp_dtype(amp, dev), host_group)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def position(self, seed: int = 0, epoch: int = 0, start: int = 0) -> Position:
        """This process's share of epoch ``epoch`` of the ``seed`` order from global batch ``start`` (what a data
        source's ``batches(at=...)`` reads); the defaults are an evaluation pass, which is read in order."""
        return Position(seed=seed, epoch=epoch, start=start, rank=self.rank, world=self.world)

    def autocast(self) -> Any:
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over processes, in place (a no-op in one process)."""
        if self.distributed:
            torch.distributed.all_reduce(t)
        return t

    def any(self, flag: bool) -> bool:
        """True on every process if ``flag`` is true on any (a collective on the device, which waits for it)."""
        if not self.distributed:
            return flag
        t = torch.tensor([float(flag)], device=self.device)
        return bool(self.all_reduce(t).item() > 0)

    def gather(self, obj: T) -> list[T]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj`` on every process."""
        if not self.distributed:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def on_main(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` on rank 0 only (its result there, None elsewhere); its ValueError is raised on every process.

        For checks of shared state (the run directory): rank 0 decides, and every process stops with the
        same one-line error instead of its peers hanging in a collective while rank 0 exits.
        """
        result, error = None, None
        if self.main:
            try:
                result = fn()
            except ValueError as e:
                error = str(e)
        error = self.broadcast(error)
        if error is not None:
            raise ValueError(error)
        return result

    def log(self, msg: str) -> None:
        """Print a status line on rank 0 (stderr, beside the progress bar)."""
        if self.main:
            print(msg, file=sys.stderr, flush=True)

    def progress(self, enabled: bool, total: int, initial: int = 0) -> Any:
        """A progress bar (steps, rate and ETA) on rank 0 — tqdm's on a terminal, plain lines in a redirected log
        (:func:`~crate_transformer.progress.progress_bar`) — and a silent stand-in elsewhere or when disabled."""
        from ..progress import progress_bar

        return progress_bar(total=total, initial=initial, desc="train", unit="step", enabled=enabled and self.main)

    def barrier(self) -> None:
        if self.distributed:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.distributed and torch.distributed.is_initialized():
            # a DDP module dropped but left in a reference cycle (the first one a process builds can be, through a
            # closure) is freed now: freed after destroy_process_group, its C++ Reducer would be the gloo group's
            # last owner and destroy it holding the GIL, deadlocking against a gloo worker that waits for the GIL to
            # release the last collective's tensor (issue 52); freed first, the group dies in
            # destroy_process_group, whose Python group object releases the GIL before destroying it
            gc.collect()
            torch.distributed.destroy_process_group()


def amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """``auto``: bf16 (or fp16 without bf16 support) on a GPU, none elsewhere."""
    if mode == "auto":
        if device.type != "cuda":
            return None
        mode = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if mode == "none":
        return None
    if mode == "fp16" and device.type != "cuda":
        raise OptionError("amp='fp16' needs a CUDA GPU; use amp='bf16' or amp='none' on CPU")
    return torch.bfloat16 if mode == "bf16" else torch.float16


# --------------------------------------------------------------------------- RNG state
def rng_state() -> dict:
    """Torch/CUDA/numpy/python RNG states as tensors and plain lists (loadable with weights_only=True)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        ("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        # one state per GPU seen at save; a machine with fewer GPUs restores those it has
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, index)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class ProcessSettings:
    """Set threads (0 = auto: :func:`~.threads.auto_threads`), deterministic mode and, on a GPU, TF32 for a run; put
    the calling process back as it was afterwards.

    ``tf32``: float32 matrix products on an NVIDIA GPU (Ampere and later) use TensorFloat-32 tensor cores
    (``torch.set_float32_matmul_precision("high")``: inputs rounded to a 10-bit mantissa, float32 accumulation,
    several times the float32 throughput); off, they are full float32 ("highest").  CPU runs are left as they are.
    """

    def __init__(
        self, threads: int, deterministic: bool, tf32: bool = True, device: torch.device | None = None
    ) -> None:
        self.threads, self.deterministic = threads, deterministic
        self.tf32 = tf32 if device is not None and device.type == "cuda" else None

    def __enter__(self) -> ProcessSettings:
        self._saved = (
            torch.get_num_threads(),
            torch.are_deterministic_algorithms_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
            torch.get_float32_matmul_precision(),
        )
        if self.tf32 is not None:
            torch.set_float32_matmul_precision("high" if self.tf32 else "highest")
        threads = resolve_threads(self.threads)  # 0 = auto: what is free now
        if threads != self._saved[0]:
            torch.set_num_threads(threads)
        if self.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.use_deterministic_algorithms(self.deterministic)
        return self

    def __exit__(self, *exc: object) -> None:
        threads, det, cudnn_det, cudnn_bench, matmul = self._saved
        if torch.get_float32_matmul_precision() != matmul:
            torch.set_float32_matmul_precision(matmul)
        if torch.get_num_threads() != threads:  # set_num_threads costs speed even when it changes nothing
            torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn_det, cudnn_bench


class StopVote:
    """Whether any process was interrupted, agreed by all without waiting for the device.

    Each call starts an all-reduce of this process's flag over the host group (gloo, on the CPU) and returns the
    result of the one the previous call started, which finished meanwhile: every process gets the same answer at
    the same step, one step after a signal, and a GPU is never waited for (an all-reduce of a flag on the device
    read with ``.item()`` stalled it every step).  One process: the flag itself.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.pending: tuple[Any, torch.Tensor] | None = None

    def __call__(self, flag: bool) -> bool:
        if not self.rt.distributed:
            return flag
        mine = torch.tensor([float(flag)])
        started = torch.distributed.all_reduce(mine, group=self.rt.host_group, async_op=True)
        previous, self.pending = self.pending, (started, mine)
        return previous is not None and self._result(previous)

    @staticmethod
    def _result(vote: tuple[Any, torch.Tensor]) -> bool:
        work, total = vote
        work.wait()
        return bool(total[0] > 0)  # a host tensor: no device to wait for

    def close(self) -> None:
        """Finish the vote in flight (before the process group goes)."""
        if self.pending is not None:
            self._result(self.pending)
            self.pending = None


class Interrupt:
    """SIGINT/SIGTERM → finish the current step, checkpoint, exit.  A second Ctrl-C aborts at once."""

    def __init__(self) -> None:
        self.flag = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupt:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.flag and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.flag = True

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
