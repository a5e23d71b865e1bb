"""Progress bars only where someone watches them: a tqdm bar on a terminal (or in a notebook), plain lines in a
redirected log.

A bar redraws itself with carriage returns, which a file keeps as hundreds of frames on one line (a training run's
output redirected to a file).  :func:`progress_bar` gives tqdm's bar when the stream is a terminal or the code runs
in a Jupyter kernel, and otherwise a :class:`PlainProgress` with the same methods (``update``, ``set_postfix_str``,
``write``, ``close``; iterable too) that prints a whole line now and then: at every tenth of the total for a bar
that is kept (``leave=True``: a training run, a sweep), every :data:`PLAIN_SECONDS` for any bar, and the final
count when a kept bar closes.  Every progress bar of the package comes from here.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

__all__ = ["progress_bar", "PlainProgress", "interactive", "PLAIN_SECONDS"]

# the longest a redirected log goes without a progress line while a bar runs
PLAIN_SECONDS = 30.0


def interactive(stream: IO[str]) -> bool:
    """Whether ``stream`` is watched live: a terminal, or a Jupyter kernel's output (tqdm draws a widget there)."""
    if "ipykernel" in sys.modules:
        try:
            from IPython import get_ipython

            if get_ipython() is not None and type(get_ipython()).__name__ == "ZMQInteractiveShell":
                return True
        except ImportError:
            pass
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed or detached stream
        return False


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    initial: int = 0,
    enabled: bool = True,
    leave: bool = True,
    stream: IO[str] | None = None,
) -> Any:
    """A progress bar on ``stream`` (stderr): tqdm's on a terminal or in a notebook, :class:`PlainProgress` lines
    elsewhere; silent when not ``enabled``.  Takes tqdm's arguments of the same names."""
    stream = stream if stream is not None else sys.stderr
    if enabled and not interactive(stream):
        return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave, stream=stream)
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, disable=not enabled, leave=leave,
                dynamic_ncols=True, file=stream)  # fmt: skip


class PlainProgress:
    """tqdm's interface as whole lines for a log: ``"train: 120/600 step (20%), 35.2 step/s, ETA 14 s, <postfix>"``."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        *,
        total: int | None = None,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        leave: bool = True,
        stream: IO[str] | None = None,
    ) -> None:
        self.iterable, self.desc, self.unit, self.leave = iterable, desc, unit, leave
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.n, self.start_n = total, initial, initial
        self.stream = stream if stream is not None else sys.stderr
        self.postfix, self.closed = "", False
        self.t0 = self.last_line = time.monotonic()
        self.next_tenth = self._tenth(initial) + 1

    def _tenth(self, n: int) -> int:
        return int(10 * n / self.total) if self.total else 0

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        tenth = self.leave and self.total and self._tenth(self.n) >= self.next_tenth and self.n < self.total
        if tenth or now - self.last_line >= PLAIN_SECONDS:
            self.next_tenth = self._tenth(self.n) + 1
            self._line(now)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def write(self, s: str, file: IO[str] | None = None, end: str = "\n") -> None:
        print(s, file=file or self.stream, end=end, flush=True)

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed and self.leave:
            self._line(time.monotonic())
        self.closed = True

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _line(self, now: float) -> None:
        done = self.n - self.start_n
        rate = done / max(now - self.t0, 1e-9)
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        parts = [f"{count} {self.unit}" + (f" ({100 * self.n / self.total:.0f}%)" if self.total else "")]
        if done:
            parts.append(f"{rate:.3g} {self.unit}/s")
            if self.total and self.n < self.total:
                parts.append(f"ETA {(self.total - self.n) / rate:.0f} s")
        if self.postfix:
            parts.append(self.postfix)
        self.write(f"{self.desc}: " * bool(self.desc) + ", ".join(parts))
        self.last_line = now
