"""The timeline chart, drawn with matplotlib (the optional `report` extra) as inline SVG.

Without matplotlib `timeline_svg` returns None and the report shows tables instead, with
the command that installs the charts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from wedgewatch.report.model import Point

INSTALL_HINT = "pip install 'wedgewatch[report]'"
_MARK_COLOURS = {
    "suspect": "#d99a00",
    "wedged": "#c62828",
    "unreachable": "#6a1b9a",
    "restart": "#1565c0",
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
_LABEL_ROWS = 3


def label_rows(marks: Sequence[tuple[float, str]], span: float) -> list[int]:
    """A row (0 at the top) for each mark's label, so that labels closer than about a tenth of
    the time axis never share a row (pure; "restart" and "back" a second apart stack)."""
    gap = max(span, 1e-9) * 0.1
    last = [float("-inf")] * _LABEL_ROWS
    rows: list[int] = []
    for x, _label in marks:
        row = next(
            (r for r in range(_LABEL_ROWS) if x - last[r] >= gap),
            min(range(_LABEL_ROWS), key=lambda r: last[r]),
        )
        last[row] = x
        rows.append(row)
    return rows


def timeline_svg(points: Sequence[Point], marks: Sequence[tuple[float, str]]) -> str | None:
    """An SVG document (text) of the flight recorder, or None without matplotlib or data."""
    if not points or not available():
        return None
    from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra; no pyplot, no GUI)
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    t = [p.t for p in points]
    marks = sorted(marks)
    fig = Figure(figsize=(10, 5.8), dpi=100)
    ax_req, ax_kv, ax_tok = fig.subplots(3, 1, sharex=True, height_ratios=[2.2, 1, 1.2])

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
    ax_req.legend(loc="upper left", fontsize=8, ncols=3, frameon=False)
    ax_kv.plot(
        t,
        series([None if p.kv_cache_usage is None else p.kv_cache_usage * 100 for p in points]),
        color="#00838f",
        lw=2,
        label="KV cache usage",
    )
    ax_kv.set_ylabel("KV %")
    ax_kv.set_ylim(0, 105)
    ax_kv.legend(loc="upper left", fontsize=8, frameon=False)
    ax_tok.plot(
        t, series([p.generation_rate for p in points]), color="#1565c0", lw=2, label="generation"
    )
    ax_tok.plot(t, series([p.prompt_rate for p in points]), color="#90a4ae", lw=1.5, label="prompt")
    ax_tok.set_ylabel("tokens/s")
    ax_tok.legend(loc="upper left", fontsize=8, ncols=2, frameon=False)
    ax_tok.set_xlabel("seconds relative to the wedge capture")
    failed = [p.t for p in points if p.failure is not None]
    for ax in (ax_req, ax_kv, ax_tok):
        ax.grid(True, color="#e0e0e0", lw=0.6)
        for x in failed:
            ax.axvspan(x - 0.5, x + 0.5, color=FAILED_SCRAPE, lw=0)
        for x, label in marks:
            ax.axvline(x, color=_MARK_COLOURS.get(label, "#424242"), lw=1.5, ls=":")
    span = (max(t) - min(t)) if t else 1.0
    for (x, label), row in zip(marks, label_rows(marks, span), strict=True):
        ax_req.text(
            x,
            0.98 - 0.1 * row,
            f" {label}",
            color=_MARK_COLOURS.get(label, "#424242"),
            fontsize=8,
            va="top",
            transform=ax_req.get_xaxis_transform(),
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.5},
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
        fig.tight_layout(rect=(0, 0.09, 1, 1))
    else:
        fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
