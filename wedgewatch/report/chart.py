"""The timeline chart, drawn with matplotlib (the optional `report` extra) as inline SVG.

Without matplotlib `timeline_svg` returns None and the report shows tables instead, with
the command that installs the charts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wedgewatch.report.model import Point

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'wedgewatch[report]'"
_MARK_COLOURS = {
    "suspect": "#d99a00",
    "wedged": "#c62828",
    "unreachable": "#6a1b9a",
    "restart": "#1565c0",
    "abort": "#00838f",
    "recovered": "#2e7d32",
    "back": "#2e7d32",
}


def available() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401, PLC0415 (optional extra)
    except ImportError:
        return False
    return True


FAILED_SCRAPE = "#ffcdd2"
_ROW_INCHES = 0.2  # the height of one row of moment labels in their band


def label_rows(marks: Sequence[tuple[float, str]], span: float) -> list[int]:
    """A row (0 at the top) for each mark's label, so that labels closer than about a tenth of
    the time axis never share a row (pure; "restart" and "back" a second apart stack). As
    many rows as needed: a crowd of moments gets a taller band, never a shared row."""
    gap = max(span, 1e-9) * 0.1
    last: list[float] = []
    rows: list[int] = []
    for x, _label in marks:
        row = next((r for r, at in enumerate(last) if x - at >= gap), len(last))
        if row == len(last):
            last.append(x)
        last[row] = x
        rows.append(row)
    return rows


def timeline_svg(points: Sequence[Point], marks: Sequence[tuple[float, str]]) -> str | None:
    """An SVG document (text) of the flight recorder, or None without matplotlib or data."""
    fig = timeline_figure(points, marks)
    if fig is None:
        return None
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def timeline_figure(points: Sequence[Point], marks: Sequence[tuple[float, str]]) -> Figure | None:
    """The laid-out matplotlib figure behind `timeline_svg` (None without matplotlib or data).

    Moment labels sit in their own band above the panels and every legend sits outside the
    plot areas, so no label ever covers a line's legend entry or another label."""
    if not points or not available():
        return None
    from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra; no pyplot, no GUI)
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    t = [p.t for p in points]
    marks = sorted(marks)
    span = (max(t) - min(t)) if t else 1.0
    rows = label_rows(marks, span)
    band_rows = max(rows, default=-1) + 1
    band = _ROW_INCHES * band_rows
    fig = Figure(figsize=(10, 5.8 + band), dpi=100)
    ratios = [max(band, 0.01), 2.2, 1, 1.2]
    ax_band, ax_req, ax_kv, ax_tok = fig.subplots(4, 1, sharex=True, height_ratios=ratios)
    ax_band.set_axis_off()
    ax_band.set_ylim(band_rows, 0)

    def series(values: Sequence[float | None]) -> list[float]:
        return [float("nan") if v is None else v for v in values]

    ax_req.plot(t, series([p.running for p in points]), color="#2e7d32", lw=2, label="running")
    ax_req.plot(
        t, series([p.capacity for p in points]), color="#ef6c00", lw=2, label="waiting: capacity"
    )
    ax_req.plot(
        t,
        series([p.deferred for p in points]),
        color="#6a1b9a",
        lw=2,
        ls="--",
        label="waiting: deferred",
    )
    ax_req.set_ylabel("requests")
    _legend_outside(ax_req)
    ax_kv.plot(
        t,
        series([None if p.kv_cache_usage is None else p.kv_cache_usage * 100 for p in points]),
        color="#00838f",
        lw=2,
        label="KV cache usage",
    )
    ax_kv.set_ylabel("KV %")
    ax_kv.set_ylim(0, 105)
    _legend_outside(ax_kv)
    ax_tok.plot(
        t, series([p.generation_rate for p in points]), color="#1565c0", lw=2, label="generation"
    )
    ax_tok.plot(t, series([p.prompt_rate for p in points]), color="#90a4ae", lw=1.5, label="prompt")
    ax_tok.set_ylabel("tokens/s")
    _legend_outside(ax_tok)
    ax_tok.set_xlabel("seconds relative to the wedge capture")
    failed = [p.t for p in points if p.failure is not None]
    for ax in (ax_req, ax_kv, ax_tok):
        ax.grid(True, color="#e0e0e0", lw=0.6)
        for x in failed:
            ax.axvspan(x - 0.5, x + 0.5, color=FAILED_SCRAPE, lw=0)
        for x, label in marks:
            ax.axvline(x, color=_MARK_COLOURS.get(label, "#424242"), lw=1.5, ls=":")
    for (x, label), row in zip(marks, rows, strict=True):
        colour = _MARK_COLOURS.get(label, "#424242")
        ax_band.axvline(x, color=colour, lw=1.5, ls=":")
        ax_band.text(
            x,
            row + 0.5,
            f" {label}",
            color=colour,
            fontsize=8,
            va="center",
            clip_on=False,
            zorder=5,  # over the next moment's dotted line
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.9, "pad": 0.5},
        )
    # Every band and mark line has a legend entry, under the chart.
    keys: list[Line2D | Patch] = []
    for label in dict.fromkeys(label for _x, label in marks):
        colour = _MARK_COLOURS.get(label, "#424242")
        keys.append(Line2D([], [], color=colour, lw=1.5, ls=":", label=label))
    if failed:
        keys.append(Patch(color=FAILED_SCRAPE, label="failed scrape (no reading)"))
    if keys:
        fig.legend(
            handles=keys,
            loc="lower center",
            ncols=min(len(keys), 6),
            fontsize=8,
            frameon=False,
            title="moments (0 = the wedge capture)",
            title_fontsize=8,
        )
        fig.tight_layout(rect=(0, 0.09, 1, 1), h_pad=0.2)
    else:
        fig.tight_layout(h_pad=0.2)
    return fig


def _legend_outside(ax: Axes) -> None:
    """The panel's line legend to the right of the plot area, where no moment label goes."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
