"""Figures that show themselves in Jupyter, without pyplot.

The package draws with matplotlib's object API (no pyplot figure registry, no backend chosen), so a figure
returned by a plotting function is not one that Jupyter's inline backend knows about: it would print as
``<Figure size 420x340 with 2 Axes>``. :class:`InlineFigure` gives it the ``_repr_png_`` that IPython's display
system asks for, so the last expression of a cell (or ``display(fig)``) shows the picture whatever backend the
kernel runs (``MPLBACKEND=Agg`` included), and no figure is shown twice.
"""

from __future__ import annotations

import io
from typing import Any

from matplotlib.figure import Figure

__all__ = ["InlineFigure", "subplots"]


class InlineFigure(Figure):
    """A :class:`matplotlib.figure.Figure` that Jupyter displays as a PNG (rendered with Agg, tight box)."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        return buf.getvalue()


def subplots(
    nrows: int = 1,
    ncols: int = 1,
    *,
    figsize: tuple[float, float] | None = None,
    layout: str | None = None,
    **kwargs: Any,
) -> tuple[InlineFigure, Any]:
    """A figure and its axes, as ``pyplot.subplots`` makes them, without pyplot: nothing joins pyplot's figure
    registry and no backend is chosen (a notebook keeps its own); the figure shows itself when displayed.
    ``kwargs`` go to :meth:`~matplotlib.figure.Figure.subplots` (``sharex``, ``squeeze``, ...)."""
    fig = InlineFigure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kwargs)
