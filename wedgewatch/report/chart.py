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


def timeline_svg(points: Sequence[Point], marks: Sequence[tuple[float, str]]) -> str | None:
    """An SVG document (text) of the flight recorder, or None without matplotlib or data."""
    if not points or not available():
        return None
    from matplotlib.figure import Figure  # noqa: PLC0415 (optional extra; no pyplot, no GUI)

    t = [p.t for p in points]
    fig = Figure(figsize=(10, 5.2), dpi=100)
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
    )
    ax_kv.set_ylabel("KV %")
    ax_kv.set_ylim(0, 105)
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
            ax.axvspan(x - 0.5, x + 0.5, color="#ffcdd2", lw=0)
        for x, label in marks:
            ax.axvline(x, color=_MARK_COLOURS.get(label, "#424242"), lw=1.5, ls=":")
    top = ax_req.get_ylim()[1]
    for x, label in marks:
        ax_req.text(
            x, top, f" {label}", color=_MARK_COLOURS.get(label, "#424242"), fontsize=8, va="top"
        )
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
