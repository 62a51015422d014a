"""Charts (compiler.charts): valid PNG and SVG files whose text carries the titles, labels,
legends and values a reader needs; a clear install hint when matplotlib is missing."""

import math
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from compiler import charts
from compiler.stability import Rewrite, StabilityReport

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _text(svg: str) -> str:
    """All the text of an SVG document (parsing it checks that it is well-formed XML)."""
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return " ".join(t.strip() for t in root.itertext() if t.strip())


def test_before_after_bars_saved_as_png_and_svg_with_labels_values_and_legend(tmp_path):
    pytest.importorskip("matplotlib")
    fig = charts.before_after_bars(
        ["softmax", "attention (float16)"], [24.0, math.inf], [0.9, 2e-7], log=True,
        title="error before and after", unit="relative error")
    png, svg = charts.save(fig, tmp_path / "bars.png", tmp_path / "bars.svg")
    assert png.read_bytes().startswith(PNG_MAGIC)
    text = _text(svg.read_text())
    for expected in ("error before and after", "relative error", "softmax",
                     "attention (float16)", "before", "after", "24", "0.9", "2e-07", "inf"):
        assert expected in text, expected


def test_scatter_legend_gives_pearson_r_of_the_points():
    pytest.importorskip("matplotlib")
    x = [0.0, 1.0, 2.0, 3.0, 4.0, math.nan]
    y = [0.2, 0.8, 2.3, 2.9, 4.1, 1.0]
    r = float(np.corrcoef(x[:5], y[:5])[0, 1])
    text = _text(charts.svg_text(charts.scatter(
        x, y, title="curvature predicts error", xlabel="predicted (bits)",
        ylabel="measured (bits)", points="graphs")))
    for expected in ("curvature predicts error", "predicted (bits)", "measured (bits)",
                     f"5 graphs, Pearson r = {r:.2f}", "least-squares fit"):
        assert expected in text, expected


def test_pearson_ignores_non_finite_pairs_and_is_nan_without_spread():
    assert charts.pearson([1, 2, 3, math.inf], [2, 4, 6, 1]) == pytest.approx(1.0)
    assert charts.pearson([1, 2, 3], [-1, -2, -3]) == pytest.approx(-1.0)
    assert math.isnan(charts.pearson([1, 1, 1], [1, 2, 3]))
    assert math.isnan(charts.pearson([1], [2]))


def test_panels_share_one_figure_and_save_refuses_other_formats(tmp_path):
    pytest.importorskip("matplotlib")
    left, right = charts.panels(2)
    charts.scatter([0, 1], [0, 1], title="left", xlabel="x", ylabel="y", ax=left)
    charts.scatter([0, 1], [1, 0], title="right", xlabel="x", ylabel="y", ax=right)
    text = _text(charts.svg_text(left.figure))
    assert "left" in text and "right" in text
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        charts.save(left.figure, tmp_path / "chart.pdf")


def test_stability_report_chart_shows_rewrites_and_measured_error(tmp_path):
    pytest.importorskip("matplotlib")
    report = StabilityReport(
        [Rewrite("blocks.0.attn.softmax", "exp(x) / sum(exp(x))", "softmax(x)", 6.2, 0.1)],
        6.2, 0.1, math.inf, 1e-7, "float16", 11.0, 0.3, 11.0, 2.0)
    svg = report.to_svg(str(tmp_path / "report.svg"))
    assert (tmp_path / "report.svg").read_text() == svg
    text = _text(svg)
    for expected in ("predicted error (curvature) per rewrite", "blocks.0.attn.softmax",
                     "all rewrites", "6.2", "0.1", "measured error in float16 vs float64",
                     "bits of float16", "mean", "worst element", "11", "0.3",
                     "max relative error inf -> 1e-07"):
        assert expected in text, expected
    charts.save(report.chart(), tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes().startswith(PNG_MAGIC)


def test_without_matplotlib_charts_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    report = StabilityReport([], 0.2, 0.2, 1e-7, 1e-7, "float32")
    with pytest.raises(charts.ChartsUnavailable, match=r"pip install \.\[plot\]"):
        report.to_svg()
    with pytest.raises(ImportError, match=r"pip install \.\[plot\]"):
        charts.scatter([0, 1], [0, 1], title="t", xlabel="x", ylabel="y")
