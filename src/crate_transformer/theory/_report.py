"""Shared plumbing of the theory experiments: progress bars, claim checks, figures and the JSON/PNG output.

Every experiment returns (and, given ``out_dir``, writes as ``<name>.json`` next to ``<name>.png``) a
report of the form::

    {"experiment": name, "config": {...}, "results": {...},
     "checks": [{"claim": ..., "holds": bool, "detail": ...}, ...], "runtime_s": float}

A check whose ``holds`` is false is a *finding* (the paper's claim does not hold in that regime),
not an error.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..analysis.figures import InlineFigure
from ..io import make_folder, write_json
from ..progress import progress_bar

T = TypeVar("T")
P = ParamSpec("P")

__all__ = ["single_threaded", "check", "progress", "new_figure", "style_axis", "finish", "to_jsonable", "loglog_slope"]


def single_threaded(fn: Callable[P, T]) -> Callable[P, T]:
    """Run ``fn`` with one intra-op thread, then restore the previous setting.

    The experiments are many small dense problems (at most 768 × 768); with several OpenMP threads on
    a busy machine, spin-waiting makes such calls up to ~100× slower than a single thread.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


def problem_size(d: int, K: int, p: int, n: int) -> dict[str, int]:
    """The size of a synthetic subspace problem, as every report records it: ``n`` tokens in ``R^d`` drawn near
    ``K`` subspaces of dimension ``p`` (the model of JMLR §2.3)."""
    return {"d": d, "K": K, "p": p, "n": n}


def check(claim: str, holds: bool, detail: str) -> dict[str, Any]:
    """One verified (or refuted) statement, with the numbers that decide it."""
    return {"claim": claim, "holds": bool(holds), "detail": detail}


def progress(iterable: Iterable[T], desc: str, enabled: bool, total: int | None = None) -> Iterator[T]:
    """A progress bar over ``iterable`` (:func:`~crate_transformer.progress.progress_bar`: plain lines in a log;
    silent when ``enabled`` is false)."""
    return iter(progress_bar(iterable, desc=desc, total=total, enabled=enabled, leave=False))


def new_figure(
    ncols: int, nrows: int = 1, *, title: str, width: float = 4.6, height: float = 3.6
) -> tuple[Figure, Any]:
    """A matplotlib figure that needs no pyplot/backend state (rendered with Agg on save)."""
    fig = InlineFigure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    fig.suptitle(title, fontsize=11)
    return fig, axes


def style_axis(ax: Axes, title: str, xlabel: str, ylabel: str, *, logx: bool = False, logy: bool = False) -> None:
    """Title, axis labels, grid, optional log scales and a legend when the axis has labelled artists."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3, which="both" if (logx or logy) else "major")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def to_jsonable(obj: Any) -> Any:
    """Tensors, numpy values, tuples and paths → plain JSON types (non-finite floats → None)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return to_jsonable(obj.detach().cpu().tolist())
    if isinstance(obj, np.ndarray):
        return to_jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log y against log x (the empirical order of a power law)."""
    lx, ly = np.log(np.asarray(x, dtype=float)), np.log(np.asarray(y, dtype=float))
    return float(np.polyfit(lx, ly, 1)[0])


def _save_png(fig: Figure, path: Path, dpi: int = 90) -> None:
    """Render with Agg and save as a 256-colour palette PNG (line plots lose nothing; files stay small)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    image = Image.frombuffer("RGBA", canvas.get_width_height(), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def finish(
    name: str,
    config: dict[str, Any],
    results: dict[str, Any],
    checks: list[dict[str, Any]],
    fig: Figure,
    start: float,
    out_dir: str | Path | None,
) -> dict[str, Any]:
    """Assemble the report; if ``out_dir`` is given write ``<name>.json`` and ``<name>.png`` there."""
    report: dict[str, Any] = {
        "experiment": name,
        "config": to_jsonable(config),
        "results": to_jsonable(results),
        "checks": checks,
        "runtime_s": round(time.perf_counter() - start, 3),
    }
    if out_dir is not None:
        out = make_folder(out_dir, "theory results folder")
        png, js = out / f"{name}.png", out / f"{name}.json"
        _save_png(fig, png)
        report["files"] = {"figure": str(png), "json": str(js)}
        write_json(js, report)
    return report
