"""Charts for the stability report and the benchmarks, drawn with matplotlib.

matplotlib is the optional ``plot`` extra (``pip install .[plot]``). It is imported only when
a chart is drawn, and figures are drawn on the Agg canvas without pyplot, so drawing changes
no global backend and opens no window. Without matplotlib every chart function raises
:class:`ChartsUnavailable`, whose message says how to install it.

Two kinds of chart, each returning a ``matplotlib.figure.Figure``:

- :func:`before_after_bars`: one pair of horizontal bars per item (before, after), each bar
  labelled with its value; a value that is not finite is named (``inf``, ``nan``) instead of
  drawn.
- :func:`scatter`: an estimate against a measurement, with the least-squares line and the
  Pearson correlation (:func:`pearson`) in the legend.

:func:`panels` lays several charts out in one figure; :func:`save` writes PNG and SVG (by
file suffix; SVG keeps its text as text, so titles and labels can be searched) and
:func:`svg_text` returns the SVG.

>>> from compiler import charts
>>> fig = charts.before_after_bars(["softmax", "log1p"], [24.0, 3.1], [0.9, 0.4],
...                                title="mean error", unit="bits")
>>> svg = charts.svg_text(fig)
>>> "mean error" in svg and "log1p" in svg
True
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["INSTALL_HINT", "ChartsUnavailable", "before_after_bars", "panels", "pearson",
           "require", "save", "scatter", "svg_text"]

INSTALL_HINT = ("charts need matplotlib, the optional 'plot' extra: pip install .[plot] "
                "(or pip install 'matplotlib>=3.8')")

BEFORE, AFTER, POINTS = "#d9534f", "#5cb85c", "#337ab7"

# SVG text stays text (searchable, and smaller than glyph paths); ids and the date are
# fixed so the same chart gives the same file.
_SVG_STYLE = {"svg.fonttype": "none", "svg.hashsalt": "egraph"}


class ChartsUnavailable(ImportError):
    """matplotlib is not installed; the message (:data:`INSTALL_HINT`) says how to install it.

    >>> issubclass(ChartsUnavailable, ImportError)
    True
    """


def require():
    """The ``matplotlib`` module, or :class:`ChartsUnavailable` with the install hint; call it
    before long work whose results end in charts.

    >>> require().__name__
    'matplotlib'
    """
    try:
        import matplotlib
        import matplotlib.backends.backend_agg  # noqa: F401 - the canvas figures draw on
        import matplotlib.figure  # noqa: F401
    except ImportError as err:
        raise ChartsUnavailable(INSTALL_HINT) from err
    return matplotlib


def panels(count: int = 1, *, columns: int = 2, size: tuple[float, float] = (6.4, 4.0)
           ) -> list[Axes]:
    """``count`` empty chart panels in one new figure, ``columns`` to a row, each ``size``
    inches (width, height); the figure is ``axes[0].figure``.

    >>> left, right = panels(2)
    >>> left.figure is right.figure
    True
    """
    matplotlib = require()
    cols = max(1, min(columns, count))
    rows = math.ceil(count / cols)
    fig = matplotlib.figure.Figure(figsize=(size[0] * cols, size[1] * rows),
                                   layout="constrained")
    matplotlib.backends.backend_agg.FigureCanvasAgg(fig)
    return [fig.add_subplot(rows, cols, i + 1) for i in range(count)]


def before_after_bars(labels: Sequence[str], before: Sequence[float], after: Sequence[float],
                      *, title: str, unit: str, names: tuple[str, str] = ("before", "after"),
                      log: bool = False, ax: Axes | None = None) -> Figure:
    """Horizontal bars, a before/after pair per label (first label on top); the value axis
    is named ``unit`` (log scale with ``log``). Draws on ``ax`` when given, else on a new
    figure sized to the number of labels; returns the figure.

    >>> fig = before_after_bars(["attention"], [float("inf")], [2e-7], title="error",
    ...                         unit="relative error", log=True)
    >>> "inf" in svg_text(fig)
    True
    """
    if ax is None:
        (ax,) = panels(1, size=(7.0, 1.2 + 0.5 * len(labels)))
    from matplotlib.transforms import blended_transform_factory

    y = np.arange(len(labels))
    height = 0.4
    for values, offset, name, color in ((before, -height / 2, names[0], BEFORE),
                                        (after, height / 2, names[1], AFTER)):
        values = [float(v) for v in values]
        # inf, nan (and zero on a log axis) have no bar: their value is written at the axis
        drawable = [math.isfinite(v) and (v > 0 or not log) for v in values]
        bars = ax.barh(y + offset, [v if ok else 0.0 for v, ok in zip(values, drawable)],
                       height, label=name, color=color)
        ax.bar_label(bars, labels=[_number(v) if ok else "" for v, ok in zip(values, drawable)],
                     padding=2, fontsize=8)
        at_axis = blended_transform_factory(ax.transAxes, ax.transData)
        for yi, v, ok in zip(y + offset, values, drawable):
            if not ok:
                ax.text(0.005, yi, _number(v), transform=at_axis, va="center", fontsize=8,
                        color=color)
    ax.set_yticks(y, labels=list(labels))
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
    ax.margins(x=0.15)
    ax.set_xlabel(unit)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return ax.figure


def scatter(x: Sequence[float], y: Sequence[float], *, title: str, xlabel: str, ylabel: str,
            points: str = "points", ax: Axes | None = None) -> Figure:
    """``y`` against ``x`` (pairs with a non-finite value are left out), the least-squares
    line, and the legend ``"<n> <points>, Pearson r = <r>"``. Draws on ``ax`` when given,
    else on a new figure; returns the figure.

    >>> fig = scatter([0, 1, 2, 3], [0.1, 0.9, 2.2, 2.8], title="curvature predicts error",
    ...               xlabel="predicted (bits)", ylabel="measured (bits)", points="graphs")
    >>> "4 graphs, Pearson r = 0.99" in svg_text(fig)
    True
    """
    if ax is None:
        (ax,) = panels(1)
    a, b = _finite_pairs(x, y)
    r = pearson(a, b)
    ax.scatter(a, b, s=16, alpha=0.6, color=POINTS, label=f"{len(a)} {points}, Pearson r = "
               f"{r:.2f}")
    if math.isfinite(r):
        slope, intercept = np.polyfit(a, b, 1)
        ends = np.array([a.min(), a.max()])
        ax.plot(ends, slope * ends + intercept, color="black", linewidth=1,
                label="least-squares fit")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.axvline(0, color="grey", linewidth=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    return ax.figure


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """The Pearson correlation of the pairs where both values are finite; nan with fewer than
    two such pairs or when either side is constant.

    >>> pearson([1, 2, 3], [2, 4, 7])
    0.9933992677987828
    >>> pearson([1, 1, 1], [1, 2, 3])
    nan
    """
    a, b = _finite_pairs(x, y)
    if len(a) < 2:
        return math.nan
    da, db = a - a.mean(), b - b.mean()
    scale = math.sqrt(float((da * da).sum() * (db * db).sum()))
    return float((da * db).sum() / scale) if scale > 0 else math.nan


def save(fig: Figure, *paths: str | Path) -> list[Path]:
    """Write ``fig`` to each path, as PNG or SVG by its suffix; returns the paths.

    >>> import tempfile
    >>> fig = scatter([0, 1], [1, 0], title="t", xlabel="x", ylabel="y")
    >>> folder = Path(tempfile.mkdtemp())
    >>> [p.name for p in save(fig, folder / "t.png", folder / "t.svg")]
    ['t.png', 't.svg']
    """
    matplotlib = require()
    written = []
    for path in map(Path, paths):
        kind = path.suffix.lower().lstrip(".")
        if kind not in ("png", "svg"):
            raise ValueError(f"save({str(path)!r}): charts are written as .png or .svg")
        with matplotlib.rc_context(_SVG_STYLE):
            fig.savefig(path, format=kind, dpi=150,
                        metadata={"Date": None} if kind == "svg" else None)
        written.append(path)
    return written


def svg_text(fig: Figure) -> str:
    """``fig`` as SVG text (what :func:`save` writes to a ``.svg`` file).

    >>> svg_text(scatter([0, 1], [1, 0], title="t", xlabel="x", ylabel="y"))[:5]
    '<?xml'
    """
    matplotlib = require()
    out = io.StringIO()
    with matplotlib.rc_context(_SVG_STYLE):
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def _finite_pairs(x: Sequence[float], y: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    return a[keep], b[keep]


def _number(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else str(value)
