"""How many CPU threads a run uses, chosen from what is free, and a warning when throughput collapses.

On a shared machine torch's default (one thread per core) oversubscribes the cores as soon as another
process is busy: OpenMP threads then wait on each other and a step can take ten times as long as with
one thread.  ``--threads 0`` (the default, "auto") therefore counts the CPUs this process may use
(affinity, cgroup quota) minus the other work that is running now.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

from ..config_utils import Range
from ..errors import OptionError, OptionWarning

__all__ = [
    "choose_threads",
    "free_cpu_inputs",
    "cgroup_cpu_quota",
    "auto_threads",
    "resolve_threads",
    "set_threads",
    "SlowdownWatch",
    "usable_cpus",
]


def choose_threads(affinity: int, quota: float | None, runnable: float) -> int:
    """Threads for this process: the usable CPUs (``affinity``, capped by the cgroup ``quota`` in CPUs,
    ``None`` = no quota) minus ``runnable`` (other tasks running now, not counting this process),
    rounded to the nearest integer and kept in ``[1, usable]``."""
    usable = usable_cpus(affinity, quota)
    free = math.floor(usable - max(0.0, runnable) + 0.5)
    return max(1, min(usable, free))


def usable_cpus(affinity: int, quota: float | None) -> int:
    """The CPUs this process may use: its ``affinity``, capped by the cgroup ``quota`` (a fractional quota is
    rounded down: it throttles the extra thread)."""
    usable = max(1, affinity)
    if quota is not None and quota > 0:
        usable = min(usable, max(1, math.floor(quota)))
    return usable


def cgroup_cpu_quota(root: str | os.PathLike = "/sys/fs/cgroup") -> float | None:
    """The CPU quota of the cgroup in CPUs (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``); ``None`` when there is none or it cannot be read."""
    root = Path(root)
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    for sub in ("cpu", "cpu,cpuacct", "."):
        try:
            quota_us = int((root / sub / "cpu.cfs_quota_us").read_text())
            period_us = int((root / sub / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    return None


def _running_others(samples: int = 5, gap: float = 0.02) -> float:
    """Other running tasks now: the median of /proc/loadavg's running count (this process included) minus one.

    The instantaneous count, not the 1-minute load average: the average still carries a run that just ended
    (a second training run right after the first would see a busy machine) and misses a job that just began.
    """
    counts = []
    for i in range(samples):
        try:
            counts.append(int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return max(0.0, os.getloadavg()[0] - 1) if hasattr(os, "getloadavg") else 0.0
        if i < samples - 1:
            time.sleep(gap)
    return max(0.0, statistics.median(counts) - 1)


def free_cpu_inputs() -> tuple[int, float | None, float]:
    """``(affinity, quota, runnable)`` for :func:`choose_threads`, read from this process and machine."""
    return _affinity(), cgroup_cpu_quota(), _running_others()


def _affinity() -> int:
    """The CPUs this process may run on (its affinity mask; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return os.cpu_count() or 1


@functools.cache
def _torch_default() -> int:
    return torch.get_num_threads()


def auto_threads() -> int:
    """The "auto" thread count: :func:`choose_threads` on :func:`free_cpu_inputs`, never above torch's own
    default (one per physical core); ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` set by the user win."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return _torch_default()
    return min(choose_threads(*free_cpu_inputs()), _torch_default())


def resolve_threads(threads: int | str | None) -> int:
    """``--threads`` → a thread count: a positive integer as given, ``0`` or ``None`` → :func:`auto_threads`."""
    if threads in (None, 0, "0"):
        return auto_threads()
    try:
        n = int(threads)
    except (TypeError, ValueError):
        n = -1
    if n < 1:
        raise OptionError(f"threads{Range(0, integer=True, note='0 = auto').requirement(threads)}", option="threads")
    if n > (usable := usable_cpus(_affinity(), cgroup_cpu_quota())):
        warnings.warn(
            OptionWarning(
                f"threads={n} is more than the {usable} CPUs this process may use: the extra threads only wait "
                f"for the others; use threads={usable} or threads=0 (chosen from the CPUs free now)"
            ),
            stacklevel=2,
        )
    return n


class SlowdownWatch:
    """Warns once per run when the seconds per step of ``run`` consecutive logging windows all exceed ``k``
    times the best window seen before them (a single slow window, e.g. data-loader start-up, does not)."""

    def __init__(self, k: float = 3.0, run: int = 3) -> None:
        self.k, self.run, self.times, self.warned = k, run, [], False
        self.seconds, self.steps, self.t_mark = 0.0, 0, time.perf_counter()

    def step_started(self) -> None:
        """Start timing a training step (what comes between, evaluation, hooks, checkpoints, is not counted)."""
        self.t_mark = time.perf_counter()

    def step_done(self) -> None:
        self.seconds, self.steps = self.seconds + time.perf_counter() - self.t_mark, self.steps + 1

    def end_window(self) -> str | None:
        """Close the logging window timed since the last one: :meth:`add` of its steps."""
        line = self.add(self.seconds, self.steps)
        self.seconds, self.steps = 0.0, 0
        return line

    def add(self, seconds: float, steps: int) -> str | None:
        """Record a window of ``steps`` steps taking ``seconds``; the warning line the first time it collapses."""
        if steps <= 0:
            return None
        self.times.append(seconds / steps)
        if self.warned or not collapsed(self.times, self.k, self.run):
            return None
        self.warned = True
        best, now = min(self.times[: -self.run]), statistics.median(self.times[-self.run :])
        fix = "rerun or resume with threads=1" if torch.get_num_threads() > 1 else "free some CPU"
        return OptionWarning(
            f"warning: training slowed {now / best:.0f}x ({now:.3g} s/step, best {best:.3g} s/step); other "
            f"processes are competing for the CPUs: {fix}"
        )


def collapsed(seconds_per_step: Sequence[float], k: float = 3.0, run: int = 3) -> bool:
    """True when each of the last ``run`` windows' seconds per step exceeds ``k`` × the best earlier window."""
    if len(seconds_per_step) <= run:
        return False
    best = min(seconds_per_step[:-run])
    return all(t > k * best for t in seconds_per_step[-run:])


def set_threads(threads: int | str | None) -> int:
    """Set torch's thread count from ``--threads`` (0 = auto) for the rest of the process; returns it."""
    n = resolve_threads(threads)
    if torch.get_num_threads() != n:  # set_num_threads costs speed even when it changes nothing
        torch.set_num_threads(n)
    return n
