"""Render a `BundleModel`: one self-contained HTML page, a Markdown file, an upstream issue body.

The HTML page has inline CSS and an inline SVG chart: it needs no network to view. Every
value rendered here was redacted as the bundle was read (`report.model.load_files`, through
the bundle writer's own pass, command line and environment included), so a bundle written
by an older wedgewatch cannot leak a secret into a report either; nothing here masks again.

Markdown: a bundle is untrusted input, so every string from it is in inline code
(`md_inline`), escaped (`md_text`) or in a fence longer than any backtick run in it
(`md_fence`): no link, image, HTML or broken fence comes of a hostile model name, `/version`,
argument or frame name (`wedgewatch.core.text.escape`).
"""

from __future__ import annotations

import datetime as dt
import html
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from wedgewatch import __version__
from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.evidence.known_issues import Match
from wedgewatch.core.evidence.triage import digest
from wedgewatch.core.evidence.watchdog import StackDumpRecord
from wedgewatch.core.text.escape import md_fence, md_inline, md_text, neutralise
from wedgewatch.report.chart import INSTALL_HINT
from wedgewatch.report.model import (
    BundleModel,
    Point,
    StackView,
    abort_outcome,
    remedy_outcome,
)

NO_MATCH = "No known issue matches this bundle."
_UPSTREAM_ROWS = 12


def _when(timestamp: Any) -> str:
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return "?"


def _clock(timestamp: float | None) -> str:
    """`HH:MM:SS UTC` of a wall-clock instant ("?" when unknown)."""
    if timestamp is None:
        return "?"
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%H:%M:%S UTC")


def human_bytes(value: object) -> str:
    """`42811392` -> `40.8 MiB` (a size as people read it); "-" when not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def human_seconds(value: object) -> str:
    """`5.0` -> `5 s`, `90` -> `1 min 30 s`, `3600` -> `1 h`; "-" when not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    seconds = float(value)
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


def _setting(name: str, value: object) -> str:
    """A threshold or setting as people read it (seconds and bytes with units)."""
    if name.endswith("_seconds"):
        return human_seconds(value)
    if name.endswith("_bytes"):
        return human_bytes(value)
    return str(value)


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def verdict_sentence(model: BundleModel) -> str:
    """The verdict in one sentence: who, what, how long, what wedgewatch did, the outcome."""
    verdict = model.text("verdict")
    family = model.text("family")
    stalled = model.stalled_seconds
    what = {
        CapturePhase.WEDGED: "was wedged",
        CapturePhase.SUSPECT: "was suspect (no wedge verdict in this bundle)",
        "resolved": "was suspect and recovered on its own",
        CapturePhase.MANUAL: "was captured on demand",
    }.get(verdict, f"had verdict {verdict}")
    parts = [
        f"Target {model.text('target')}, engine {model.engine} ({model.model_name}) {what}"
        + (f" ({family.replace('_', ' ')})" if family not in ("?", CapturePhase.MANUAL) else "")
        + (f" after {human_seconds(stalled)} without progress" if stalled is not None else "")
        + f" at {_when(model.verdict_timestamp)}."
    ]
    outcome = remedy_outcome(model.remedy)
    if outcome == "none recorded":
        parts.append("wedgewatch captured this bundle; no restart is recorded in it.")
    else:
        parts.append(f"wedgewatch captured this bundle, then: {outcome}.")
    triage = model.triage
    if triage.get("summary"):
        parts.append(f"Triage: {triage.get('summary')}.")
    return " ".join(parts)


def relative_seconds(t: float) -> str:
    """Seconds relative to the wedge to a tenth, signed: `-9.0`, `+2.5`, and `0.0` (never
    `-0.0`: a reading a few hundredths before the wedge is at 0.0)."""
    rounded = round(t, 1) + 0.0
    return "0.0" if rounded == 0 else f"{rounded:+.1f}"


def _moments(model: BundleModel) -> str:
    """`suspect at -9.0 s, wedged at 0.0 s, ...` (never `-0.0`)."""
    return ", ".join(f"{label} at {relative_seconds(t)} s" for t, label in model.marks)


def _known_line(model: BundleModel) -> str:
    if not model.matches:
        return NO_MATCH
    first, rest = model.matches[0], model.matches[1:]
    also = f" (also {', '.join(_ref(m) for m in rest)}: see below)" if rest else ""
    # What to do is the what-now box's; this line names the issue and whether it applies.
    return f"Known issue: {_ref(first)} ({first.issue.title}): {first.release_verdict}{also}"


def _ref(match: Match) -> str:
    return f"possibly {match.issue.ref}" if match.possible else match.issue.ref


def _did(model: BundleModel) -> str:
    """What wedgewatch already did, with the times."""
    stacks = {(v.role, v.pid) for v in model.stacks if v.threads}
    text = (
        f"Captured this bundle at {_clock(model.verdict_timestamp)} (py-spy stacks of "
        f"{len(stacks)} processes, /metrics, the process tree, the flight recorder)"
    )
    aborted = abort_outcome(model.remedy)
    if aborted is not None:
        text += f", then sent the abort cure: {aborted}"
    restarts = [e for e in model.remedy if e.get("event") == "restart"]
    closed = [e for e in model.remedy if e.get("event") == "episode_closed"]
    if restarts:
        last = restarts[-1]
        when = _num(last.get("timestamp"))
        ok = "restarted the server" if last.get("ok") is True else "tried to restart the server"
        text += f", then {ok} at {_clock(when)}"
        back = next((_num(e.get("timestamp")) for e in closed), None)
        if back is not None and when is not None and closed[0].get("outcome") == "restarted":
            text += f"; it answered again {human_seconds(max(back - when, 0.0))} later"
        elif last.get("ok") is not True:
            text += f" ({last.get('detail')})"
    elif aborted is None:
        text += f"; {remedy_outcome(model.remedy)}"
    return text + "."


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class NowRow(NamedTuple):
    """One row of the what-now box: its key, its text, and a command to run first (or "")."""

    key: str
    text: str
    command: str = ""


def wedgewatch_program() -> str:
    """How the user ran wedgewatch, so printed commands run the same one from any directory."""
    invoked = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if invoked is not None and invoked.name == "wedgewatch":
        return shlex.quote(str(invoked))
    return f"{shlex.quote(sys.executable)} -m wedgewatch"


def what_now(model: BundleModel) -> list[NowRow]:
    """The 3 a.m. box: what wedgewatch did, what to do next, the upgrade, what to attach."""
    rows = [NowRow("wedgewatch did", _did(model))]
    first = model.matches[0] if model.matches else None
    bundle = Path(model.path).absolute()
    upstream = f"{wedgewatch_program()} report --upstream {shlex.quote(str(bundle))}"
    if first is None:
        rows.append(
            NowRow(
                "do next",
                "No known issue matches: keep the server watched (wedgewatch restarts it "
                "within its budget) and report this wedge upstream with the Markdown below.",
            )
        )
        rows.append(NowRow("upgrade", "none known to close this"))
    else:
        label = "possibly " if first.possible else ""
        rows.append(
            NowRow(
                "do next",
                f"{label}{first.issue.ref} ({first.issue.title}): {first.release_verdict}; "
                f"meanwhile: {first.issue.workaround}.",
            )
        )
        rows.append(
            NowRow(
                "upgrade",
                f"vLLM {first.issue.fixed_in} or later closes this path "
                f"({', '.join(first.issue.refs)})"
                if first.issue.fixed_in
                else f"no release closes {first.issue.ref} yet",
            )
        )
    where = first.issue.ref if first is not None else "a new vLLM issue"
    rows.append(
        NowRow(
            "attach upstream",
            f"writes {bundle / 'upstream-issue.md'}; attach it to {where}",
            upstream,
        )
    )
    return rows


# --------------------------------------------------------------------------- HTML

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;
 color:#212121;background:#fafafa}
main{max-width:1100px;margin:0 auto;padding:16px 24px}
h1{font-size:20px;margin:8px 0}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.verdict{background:#fff;border-left:6px solid #c62828;padding:10px 14px;font-size:16px}
.known{background:#fff3e0;border-left:6px solid #ef6c00;padding:8px 14px;margin-top:8px}
.known.none{background:#eceff1;border-left-color:#90a4ae}
.problems{background:#ffebee;border:1px solid #e57373;padding:8px 14px;margin-top:8px}
table{border-collapse:collapse;background:#fff;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}code,pre{font:12px/1.4 ui-monospace,Menlo,Consolas,monospace}
pre{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto;max-height:420px}
.frames li{font:12px/1.5 ui-monospace,Menlo,Consolas,monospace;list-style:none}
.frames{padding-left:12px;margin:2px 0 8px}
mark{background:#fff59d}.muted{color:#757575}.chart{background:#fff;border:1px solid #ddd}
.chart svg{display:block;width:100%;max-width:100%;height:auto}
details{margin:4px 0}summary{cursor:pointer}
.issue{background:#fff;border:1px solid #ddd;padding:6px 12px;margin:8px 0}
.now{background:#e8f5e9;border-left:6px solid #2e7d32;padding:6px 14px;margin-top:8px}
.now dt{font-weight:bold;float:left;clear:left;width:9.5em}.now dd{margin:2px 0 4px 10em}
.possible{color:#757575}
@media (max-width:600px){main{padding:8px 10px}
 td,code,.frames li,.now dd,h1{overflow-wrap:anywhere}.now dt{float:none;width:auto}
 .now dd{margin:0 0 6px 0}table{display:block;overflow-x:auto}}
"""


def _e(value: object) -> str:
    """HTML-escaped, control characters visible (a bundle's strings are data)."""
    return html.escape(neutralise(str(value), 1_000_000))


def _sorted_env(env: Mapping[Any, Any]) -> list[tuple[str, str]]:
    """The build's environment (redacted as it was read) as sorted (name, value) pairs."""
    return sorted((str(k), str(v)) for k, v in env.items())


def _table(rows: Sequence[Sequence[object]], head: Sequence[str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _points_table(points: Sequence[Point], limit: int | None = None) -> list[list[str]]:
    chosen = list(points)
    if limit is not None and len(chosen) > limit:
        step = len(chosen) / limit
        chosen = [chosen[int(i * step)] for i in range(limit - 1)] + [chosen[-1]]
    return [
        [
            relative_seconds(p.t),
            p.state,
            _fmt(p.running),
            _fmt(p.capacity),
            _fmt(p.deferred),
            "-" if p.kv_cache_usage is None else f"{p.kv_cache_usage:.0%}",
            _fmt(p.generation_rate, 1),
            p.failure or "",
        ]
        for p in chosen
    ]


_POINT_HEAD = ["t (s)", "state", "running", "capacity", "deferred", "KV", "gen tok/s", "scrape"]


def _profiles_html(summary: Mapping[str, Any]) -> list[str]:
    """The wedge-time sampled profiles: each EngineCore's top stacks by share of samples."""
    out: list[str] = []
    phases = summary.get("phases")
    for phase, data in phases.items() if isinstance(phases, Mapping) else ():
        for p in data.get("profiles") or [] if isinstance(data, Mapping) else ():
            if not isinstance(p, Mapping):
                continue
            out.append(
                f"<p>{_e(phase)}: EngineCore pid {_e(p.get('pid'))}, {_e(p.get('status'))}, "
                f"{_e(p.get('samples', 0))} busy samples in {_e(p.get('seconds'))} s "
                f"(<code>{_e(p.get('file') or p.get('error'))}</code>)</p>"
            )
            rows = [
                f"<tr><td>{t['share']:.0%}</td><td><code>{_e(t.get('stack'))}</code></td></tr>"
                for t in p.get("top_stacks") or []
                if isinstance(t, Mapping) and isinstance(t.get("share"), int | float)
            ]
            if rows:
                out.append("<table>" + "".join(rows) + "</table>")
    return ["<h2>Sampled profile</h2>", *out] if out else []


def _stack_html(view: StackView) -> str:
    head = f"{view.role} pid {view.pid} <span class=muted>{_e(view.title[:100])}</span>"
    body: list[str] = []
    if view.state:
        body.append(f"<p class=problems><b>Process state:</b> {_e(view.state)}</p>")
    if view.problem:
        body.append(f"<p class=problems>{_e(view.problem)}</p>")
    for ti, thread in enumerate(view.threads or ()):
        name = thread.name or f"thread {thread.thread_id}"
        body.append(
            f"<div><b>{_e(name)}</b> <span class=muted>os tid {thread.os_thread_id}"
            f"{' active' if thread.active else ''}</span><ul class=frames>"
        )
        for fi, frame in enumerate(thread.frames):
            text = f"{frame.name} ({frame.filename}:{frame.line})"
            if (ti, fi) in view.highlighted:
                body.append(f"<li><mark>{_e(text)}</mark></li>")
            else:
                body.append(f"<li>{_e(text)}</li>")
        body.append("</ul></div>")
    if view.text:
        body.append(
            f"<details><summary>py-spy text dump</summary><pre>{_e(view.text)}</pre></details>"
        )
    opened = " open" if view.role in ("engine_core", "worker") else ""
    return f"<details{opened}><summary>{head}</summary>{''.join(body)}</details>"


def render_html(model: BundleModel, chart_svg: str | None) -> str:
    """The self-contained report page."""
    s: list[str] = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        f"<title>wedgewatch report: {_e(model.name)}</title><style>{_CSS}</style>",
        "</head><body><main>",
        f"<h1>wedgewatch report <span class=muted>{_e(model.name)}</span></h1>",
        f"<p class=verdict id=verdict>{_e(verdict_sentence(model))}</p>",
        "<div class=now id=what-now><b>What now</b><dl>"
        + "".join(
            f"<dt>{_e(k)}</dt><dd>{f'<code>{_e(c)}</code> ' if c else ''}{_e(v)}</dd>"
            for k, v, c in what_now(model)
        )
        + "</dl></div>",
        f"<p class='known{'' if model.matches else ' none'}' id=known-line>"
        f"{_e(_known_line(model))}</p>",
    ]
    if model.problems:
        s.append(
            "<div class=problems id=problems><b>This bundle is incomplete; the report shows the "
            "rest.</b><ul>" + "".join(f"<li>{_e(p)}</li>" for p in model.problems) + "</ul></div>"
        )
    s.append("<h2>Timeline</h2>")
    if chart_svg is not None:
        s.append(f"<div class=chart id=chart>{chart_svg}</div>")
    elif model.points:
        s.append(
            f"<p class=muted id=chart-missing>Charts need matplotlib: <code>{_e(INSTALL_HINT)}"
            "</code>. The flight recorder as a table:</p>"
        )
    else:
        s.append("<p class=muted>No flight recorder in this bundle.</p>")
    if model.points:
        rows = _points_table(model.points, None if chart_svg is None else 40)
        s.append(
            f"<details{' open' if chart_svg is None else ''}><summary>Readings</summary>"
            + _table(rows, _POINT_HEAD)
            + "</details>"
        )
    marks = _moments(model)
    if marks:
        s.append(f"<p class=muted>Moments: {_e(marks)} (0 = the wedge capture).</p>")

    triage = model.triage
    s.append("<h2>Triage and known issues</h2>")
    s.append(
        f"<p><b>{_e(triage.get('kind', 'unknown'))}</b>: "
        f"{_e(triage.get('summary', 'no triage'))}</p>"
    )
    details = triage.get("details") or []
    if details:
        s.append("<ul>" + "".join(f"<li><code>{_e(d)}</code></li>" for d in details) + "</ul>")
    if not model.matches:
        s.append(f"<p id=no-known-issue>{_e(NO_MATCH)}</p>")
    for m in model.matches:
        issue = m.issue
        refs = ", ".join(issue.refs)
        possible = (
            f"<br><b class=possible>A possibility, not shown by the evidence:</b> "
            f"{_e(issue.possibility)}"
            if m.possible
            else ""
        )
        s.append(
            f"<div class='issue{' possible' if m.possible else ''}'><b><a href='{_e(issue.url)}'>"
            f"{_e(refs or issue.id)}</a></b> {_e(issue.title)}<br><b>What to do:</b> "
            f"{_e(m.action)}{possible}<br><b>Status:</b> {_e(issue.status)}<br><b>Affected:</b> "
            f"{_e(issue.affected)}<br><b>Matched on:</b> {_e('; '.join(m.evidence))}</div>"
        )

    s.extend(_profiles_html(model.summary))
    s.append("<h2>Stacks</h2><p class=muted>Highlighted: the frames triage read.</p>")
    if not model.stacks:
        s.append("<p>No stacks in this bundle.</p>")
    current = None
    for view in model.stacks:
        if view.round != current:
            current = view.round
            s.append(f"<h3>Round: {_e(current)}</h3>")
        s.append(_stack_html(view))
    s.extend(_watchdog_html(model))

    s.append("<h2>vLLM build and configuration</h2>")
    s.append(_build_html(model))
    s.append("<h2>Processes</h2>")
    procs = [
        [
            p.get("round", ""),
            p.get("pid"),
            p.get("ppid"),
            p.get("role"),
            p.get("status"),
            p.get("cpu_percent"),
            human_bytes(p.get("rss_bytes")),
            p.get("title", ""),
        ]
        for p in model.processes
    ]
    s.append(
        _table(procs, ["file", "pid", "ppid", "role", "status", "CPU %", "RSS", "command"])
        if procs
        else "<p>No process tree in this bundle.</p>"
    )
    s.append("<h2>wedgewatch</h2>")
    thresholds = [[k, _setting(k, v)] for k, v in sorted(model.thresholds.items())]
    s.append(_table(thresholds, ["threshold", "value"]) if thresholds else "<p>No thresholds.</p>")
    s.append(
        _table(
            [
                ["bundle", model.path],
                ["wedgewatch", model.text("wedgewatch_version")],
                ["host", model.text("host")],
                ["selector", model.text("selector")],
                ["failures", "; ".join(map(str, model.summary.get("failures") or [])) or "none"],
                ["remedy", remedy_outcome(model.remedy)],
                ["report by", f"wedgewatch {__version__}"],
            ]
        )
    )
    s.append("</main></body></html>\n")
    return "".join(s)


def _build_html(model: BundleModel) -> str:
    b = model.build
    out: list[str] = []
    version = b.get("version") if isinstance(b.get("version"), Mapping) else {}
    rows = [
        [
            "vLLM version",
            model.version or f"unknown ({(version or {}).get('error', 'not captured')})",
        ],
        ["model", b.get("model") or model.model_name],
    ]
    argv = b.get("command_line")
    if isinstance(argv, list):
        rows.append(["command line", " ".join(map(str, argv))])
    for key in ("command_line_error", "engine_env_error", "cache_config_info_error"):
        if b.get(key):
            rows.append([key.replace("_", " "), b[key]])
    out.append(_table(rows))
    env = b.get("engine_env")
    if isinstance(env, Mapping):
        out.append("<h3>EngineCore environment (VLLM_*, CUDA_*, NCCL_*)</h3>")
        rows_env = _sorted_env(env)
        out.append(_table(rows_env, ["name", "value"]) if rows_env else "<p>none set</p>")
    cache = b.get("cache_config_info")
    if isinstance(cache, Mapping) and cache:
        out.append(
            "<details><summary>vllm:cache_config_info</summary>"
            + _table(sorted(cache.items()), ["label", "value"])
            + "</details>"
        )
    feats = model.facts.features
    if feats:
        out.append(
            "<details><summary>Facts known-issue signatures read</summary>"
            + _table(sorted(feats.items()), ["fact", "evidence"])
            + "</details>"
        )
    return "".join(out)


# --------------------------------------------------------------------------- Markdown


def _md_table(rows: Sequence[Sequence[object]], head: Sequence[str]) -> list[str]:
    def cell(v: object) -> str:
        return md_text(v, 200)

    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out.extend("| " + " | ".join(cell(c) for c in row) + " |" for row in rows)
    return out


def _frames_text(view: StackView, threads: int | None = None) -> str:
    lines = [f"{view.role} pid {view.pid}: {view.title[:100]}"]
    if view.state:
        lines.append(f"  (process state: {view.state})")
    if view.problem:
        lines.append(f"  ({view.problem})")
    for ti, thread in enumerate((view.threads or ())[:threads]):
        lines.append(f"Thread {thread.os_thread_id} ({thread.name or '?'})")
        for fi, f in enumerate(thread.frames):
            star = "*" if (ti, fi) in view.highlighted else " "
            lines.append(f" {star}  {f.name} ({f.filename}:{f.line})")
    return "\n".join(lines)


def render_markdown(model: BundleModel) -> str:
    """The report as Markdown (the same parts as the page, stacks as text)."""
    lines = [
        f"# wedgewatch report: {md_text(model.name)}",
        "",
        f"**{md_text(verdict_sentence(model))}**",
        "",
    ]
    lines += ["## What now", ""] + [
        f"- **{k}**: {f'{md_inline(c)} ' if c else ''}{md_text(v)}" for k, v, c in what_now(model)
    ]
    lines += [""]
    lines.append(md_text(_known_line(model)))
    if model.problems:
        lines += ["", "## Missing or corrupt", ""] + [f"- {md_text(p)}" for p in model.problems]
    lines += ["", "## Timeline", ""]
    if model.points:
        lines += _md_table(_points_table(model.points, 30), _POINT_HEAD)
        marks = md_text(_moments(model))
        if marks:
            lines += ["", f"Moments: {marks} (0 = the wedge capture)."]
    else:
        lines.append("No flight recorder in this bundle.")
    triage = model.triage
    lines += [
        "",
        "## Triage and known issues",
        "",
        f"**{md_text(triage.get('kind', 'unknown'))}**: "
        + md_text(triage.get("summary", "no triage")),
        "",
    ]
    lines += [f"- {md_inline(d)}" for d in triage.get("details") or []]
    lines.append("")
    if not model.matches:
        lines.append(NO_MATCH)
    for m in model.matches:
        i = m.issue
        lines += [
            f"### [{', '.join(i.refs) or i.id}]({i.url}) {i.title}",
            "",
            f"- What to do: {md_text(m.action)}",
            *(
                [f"- A possibility, not shown by the evidence: {i.possibility}"]
                if m.possible
                else []
            ),
            f"- Status: {i.status}",
            f"- Affected: {i.affected}",
            f"- Matched on: {md_text('; '.join(m.evidence))}",
            "",
        ]
    lines += ["## Stacks", "", "`*` marks the frames triage read.", ""]
    for view in model.stacks:
        lines += [
            f"### {md_text(view.round)}: {md_text(view.role)} {view.pid}",
            "",
            *md_fence(_frames_text(view)),
            "",
        ]
    lines += _watchdog_md(model)
    lines += ["## vLLM build", ""]
    lines += _build_md(model)
    lines += ["", "## wedgewatch thresholds", ""]
    lines += _md_table(
        [(k, _setting(k, v)) for k, v in sorted(model.thresholds.items())], ["threshold", "value"]
    )
    lines += ["", f"Bundle: {md_inline(model.path, 1000)}", ""]
    return "\n".join(lines)


_WATCHDOG_INTRO = (
    "vLLM's own watchdog dumps every thread's stack when its process's loop has not fed it "
    "for its timeout: a loop blocked inside a step dumps, a scheduler that keeps stepping "
    "without scheduling anything never does."
)


def _watchdog_rows(model: BundleModel) -> list[list[object]]:
    return [
        [
            w.file,
            w.role,
            w.pid,
            len(w.dumps),
            w.last.at if w.last else "",
            w.last.reason if w.last else "",
            digest(w.last.main, depth=6) if w.last and w.last.main else "",
        ]
        for w in model.watchdog
    ]


_WATCHDOG_HEAD = ["file", "role", "pid", "dumps", "last dump at", "reason", "loop thread"]


def _dump_text(record: StackDumpRecord) -> str:
    """One dump's threads, innermost frame first, as faulthandler lists them."""
    lines: list[str] = []
    for thread in record.threads:
        lines.append(f"Thread {thread.thread_id:#x}")
        lines += [f"  {f.name} ({f.filename}:{f.line})" for f in thread.frames]
    return "\n".join(lines)


def _watchdog_html(model: BundleModel) -> list[str]:
    """vLLM's watchdog dumps and timeout counter, beside py-spy's stacks (none: nothing)."""
    timeouts = model.watchdog_timeouts
    if not model.watchdog and not timeouts:
        return []
    out = ["<h2>vLLM's watchdog</h2>", f"<p class=muted>{_e(_WATCHDOG_INTRO)}</p>"]
    if timeouts:
        rows = [[labels or "(no labels)", value] for labels, value in sorted(timeouts.items())]
        out.append(_table(rows, ["vllm:watchdog_timeouts_total", "value"]))
    if model.watchdog:
        out.append(_table(_watchdog_rows(model), _WATCHDOG_HEAD))
    for w in model.watchdog:
        if w.last is not None:
            out.append(
                f"<h3>{_e(w.file)}: dump #{_e(w.last.seq)}</h3><pre>{_e(_dump_text(w.last))}</pre>"
            )
    return out


def _watchdog_md(model: BundleModel) -> list[str]:
    timeouts = model.watchdog_timeouts
    if not model.watchdog and not timeouts:
        return []
    lines = ["## vLLM's watchdog", "", md_text(_WATCHDOG_INTRO), ""]
    if timeouts:
        lines += _md_table(
            [(labels or "(no labels)", value) for labels, value in sorted(timeouts.items())],
            ["vllm:watchdog_timeouts_total", "value"],
        )
        lines.append("")
    if model.watchdog:
        lines += _md_table(_watchdog_rows(model), _WATCHDOG_HEAD)
        lines.append("")
    for w in model.watchdog:
        if w.last is not None:
            lines += [f"### {md_text(w.file)}: dump #{w.last.seq}", ""]
            lines += [*md_fence(_dump_text(w.last)), ""]
    return lines


def _build_md(model: BundleModel) -> list[str]:
    b = model.build
    lines = [
        f"- vLLM version: {md_inline(model.version or 'unknown')}",
        f"- model: {md_inline(b.get('model') or model.model_name)}",
    ]
    argv = b.get("command_line")
    if isinstance(argv, list):
        lines.append(f"- command line: {md_inline(' '.join(map(str, argv)), 4000)}")
    env = b.get("engine_env")
    if isinstance(env, Mapping):
        lines.append(
            "- EngineCore environment: "
            + (", ".join(md_inline(f"{k}={v}") for k, v in _sorted_env(env)) or "none set")
        )
    for key in ("command_line_error", "engine_env_error", "cache_config_info_error"):
        if b.get(key):
            lines.append(f"- {key.replace('_', ' ')}: {md_text(b[key])}")
    return lines


def render_upstream(model: BundleModel) -> str:
    """A body for a GitHub issue on vLLM: environment, flags, short metric table, two stacks."""
    b = model.build
    environment = [
        f"vLLM version (GET /version): {model.version or 'unknown'}",
        f"model: {b.get('model') or model.model_name}",
    ]
    cache = b.get("cache_config_info")
    if isinstance(cache, Mapping):
        keys = (
            "block_size",
            "cache_dtype",
            "enable_prefix_caching",
            "num_gpu_blocks",
            "kv_offloading_backend",
            "kv_offloading_size",
            "mamba_cache_mode",
        )
        environment.append(
            "cache_config_info: " + ", ".join(f"{k}={cache[k]}" for k in keys if k in cache)
        )
    env = b.get("engine_env")
    if isinstance(env, Mapping):
        environment += [f"{k}={v}" for k, v in _sorted_env(env)]
    lines = ["### Your current environment", "", *md_fence("\n".join(environment), "text")]
    lines += ["", "### Command", ""]
    argv = b.get("command_line")
    lines += md_fence(
        " ".join(map(str, argv)) if isinstance(argv, list) else "(not captured)",
        "sh",
    )
    lines += ["", "### What happened", ""]
    lines.append(
        md_text(
            verdict_sentence(model).replace(
                "wedgewatch captured this bundle", "A watchdog (wedgewatch) captured stacks"
            )
        )
    )
    lines += ["", "Metrics from the watchdog's flight recorder (0 = the capture at the wedge):", ""]
    lines += (
        _md_table(_points_table(model.points, _UPSTREAM_ROWS), _POINT_HEAD)
        if model.points
        else ["(no flight recorder)"]
    )
    if model.matches:
        lines += [
            "",
            "Related, by the watchdog's known-issue signatures: "
            + md_text(  # a verdict names the bundle's version: the target's text
                "; ".join(
                    f"{_ref(m)} ({m.release_verdict}; {m.fix})" if not m.possible else _ref(m)
                    for m in model.matches
                )
            ),
        ]
    engine = next(
        (v for v in reversed(model.stacks) if v.role == "engine_core" and v.threads), None
    )
    worker = next((v for v in reversed(model.stacks) if v.role == "worker" and v.threads), None)
    for title, view in (("EngineCore", engine), ("one worker", worker)):
        if view is None:
            continue
        lines += [
            "",
            f"<details><summary>py-spy stack: {title} ({_e(md_text(view.round, 80))})</summary>",
            "",
            *md_fence(_frames_text(view, threads=3), "text"),
            "",
            "</details>",
        ]
    triage = model.triage
    if triage.get("summary"):
        lines += [
            "",
            f"Watchdog triage: {md_text(triage.get('kind'))}: {md_text(triage.get('summary'))}",
        ]
    lines.append("")
    return "\n".join(lines)
