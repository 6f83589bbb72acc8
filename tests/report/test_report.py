"""`wedgewatch report` and `bundles`: every fault family, damaged bundles, redaction, no charts."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from html import escape as html_escape
from pathlib import Path
from typing import Any

import pytest
from report_bundles import SIMPLE_ENV, TP2_OFFLOAD, make_bundle, reading

from wedgewatch.lab.demo import write_demo_report
from wedgewatch.report.chart import label_rows, timeline_figure
from wedgewatch.report.commands import format_bundles, write_report
from wedgewatch.report.model import Point, list_bundles, read_bundle
from wedgewatch.report.render import (
    NO_MATCH,
    human_bytes,
    human_seconds,
    relative_seconds,
    render_markdown,
    render_upstream,
    what_now,
)

# family -> (bundle arguments, triage kind, known issue id or None for "no known issue")
FAMILIES: dict[str, tuple[dict[str, Any], str, str | None]] = {
    "deferred": ({"flags": TP2_OFFLOAD, "env": SIMPLE_ENV}, "scheduler_wedge", "vllm-53868"),
    "admission": ({"family": "admission_stall", "wedge": reading(capacity=6)},
                  "scheduler_wedge", "vllm-45414"),
    "collective_hang": ({"family": "progress_stall", "stacks": "collective_hang",
                         "flags": ("--tensor-parallel-size", "2"), "wedge": reading(running=2)},
                        "collective_hang", "vllm-45094"),
    "output_stall": ({"family": "output_stall", "flags": ("--mamba-cache-mode", "align"),
                      "wedge": reading(1, preemptions=30)}, "scheduler_wedge", "vllm-52520"),
    "unreachable": ({"family": "unreachable", "stacks": None, "unreachable": True,
                     "version": None}, "no_stacks", None),
    "api_hang": ({"family": "unreachable", "stacks": "api_hang", "unreachable": True},
                 "api_hang", None),
    "engine_crash": ({"family": "unreachable", "stacks": "engine_dead", "unreachable": True},
                     "engine_dead", "vllm-39863"),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_family_reports_its_triage_and_known_issue(name: str, tmp_path: Path) -> None:
    """Each fault family's report names its triage and its known issue, or says none matches."""
    kwargs, kind, issue = FAMILIES[name]
    bundle = make_bundle(tmp_path, **kwargs)
    written = write_report(bundle)
    html = (bundle / "report.html").read_text()
    markdown = (bundle / "report.md").read_text()
    assert written.paths == (bundle / "report.html", bundle / "report.md")
    model = read_bundle(bundle)
    assert model.triage["kind"] == kind
    assert f"<b>{kind}</b>" in html
    assert f"**{kind}**" in markdown
    if issue is None:
        assert model.matches == ()
        assert NO_MATCH in html
        assert NO_MATCH in markdown
    else:
        assert issue in {m.issue.id for m in model.matches}
        number = issue.split("-")[1]
        assert f"#{number}" in html
        assert f"#{number}" in markdown
    assert "<svg" in html  # matplotlib (the report extra) is installed in the test venv


def test_verdict_names_target_engine_family_duration_and_outcome(tmp_path: Path) -> None:
    """The verdict says who, which family, how long, the restart and the recovery."""
    bundle = make_bundle(
        tmp_path,
        flags=TP2_OFFLOAD,
        env=SIMPLE_ENV,
        remedy=[{"event": "restart", "at": 1032.0, "ok": True, "detail": "d"},
                {"event": "episode_closed", "outcome": "restarted", "at": 1040.0}],
    )  # fmt: skip
    model = read_bundle(bundle)
    write_report(bundle)
    html = (bundle / "report.html").read_text()
    for part in (
        "Target local",
        "engine 0",
        "deferred stall",
        "after 15 s",
        "restarted, server back after the restart",
    ):
        assert part in html
    assert {label for _t, label in model.marks} == {"suspect", "wedged", "restart", "back"}


def test_the_report_says_which_cure_ran_what_it_cost_and_serving_lost(tmp_path: Path) -> None:
    """An abort cure in remedy.jsonl: the report says the abort ran, how many requests it
    aborted, that no restart followed and how long serving was lost; it marks the timeline."""
    bundle = make_bundle(
        tmp_path,
        flags=TP2_OFFLOAD,
        env=SIMPLE_ENV,
        remedy=[{"event": "abort_requested", "at": 1031.0, "reason": "flat"},
                {"event": "abort", "at": 1032.0, "ok": True, "outcome": "recovered",
                 "aborted": 3, "serving_lost_seconds": 1.4},
                {"event": "episode_closed", "outcome": "recovered", "at": 1032.5}],
    )  # fmt: skip
    model = read_bundle(bundle)
    write_report(bundle)
    html = (bundle / "report.html").read_text()
    assert "aborted (3 request(s) aborted), serving again 1.4 s after the verdict, no restart" in (
        html
    )
    assert "abort cure" in html
    assert "abort" in {label for _t, label in model.marks}
    rows = list_bundles(tmp_path)
    assert rows[0].remedy.startswith("aborted (3 request(s) aborted)")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("rm summary.json", "summary.json: missing"),
        ("corrupt summary.json", "summary.json: corrupt"),
        ("rm history.jsonl", "history.jsonl: missing"),
        ("corrupt history.jsonl", "history.jsonl: 2 corrupt line(s)"),
        ("rm build.json", "build.json: missing"),
        ("corrupt build.json", "build.json: corrupt"),
        ("rm stacks", "missing (listed in summary.json)"),
        ("corrupt stacks", "corrupt, not JSON"),
        ("rm processes.json", "processes.json: missing"),
    ],
)
def test_damaged_bundle_still_renders_and_says_what_is_missing(
    damage: str, said: str, tmp_path: Path
) -> None:
    """A missing or corrupt file becomes a line in the report; the rest still renders."""
    bundle = make_bundle(tmp_path, flags=TP2_OFFLOAD, env=SIMPLE_ENV)
    action, _, what = damage.partition(" ")
    targets = (
        list((bundle / "pyspy").glob("engine_core-*.json")) if what == "stacks" else [bundle / what]
    )
    for target in targets:
        if action == "rm":
            target.unlink()
        else:
            target.write_text("{not json\n[also not\n")
    written = write_report(bundle)
    html = (bundle / "report.html").read_text()
    assert "This bundle is incomplete" in html
    assert said in html
    assert any(said in note for note in written.notes)
    assert "<h2>Stacks</h2>" in html


def test_upstream_body_is_short_redacted_and_has_two_stacks(tmp_path: Path) -> None:
    """--upstream: environment, flags, a short table, EngineCore and a worker in <details>."""
    bundle = make_bundle(
        tmp_path,
        flags=(*TP2_OFFLOAD, "--api-key", "sk-live-123"),
        env={**SIMPLE_ENV, "HF_TOKEN": "hf_secret"},
    )
    build = json.loads((bundle / "build.json").read_text())
    build["command_line"] = [*build["command_line"][:-1], "sk-live-123"]  # an unredacted old one
    (bundle / "build.json").write_text(json.dumps(build))
    written = write_report(bundle, tmp_path / "out", upstream=True)
    text = written.paths[0].read_text()
    assert "sk-live-123" not in text
    assert "hf_secret" not in text
    assert "--api-key ***" in text
    assert "HF_TOKEN=***" in text
    assert "VLLM_USE_SIMPLE_KV_OFFLOAD=1" in text
    assert text.count("<details>") == 2
    assert "EngineCore" in text
    assert "one worker" in text
    table_rows = [line for line in text.splitlines() if line.startswith(("| +", "| -"))]
    assert 2 <= len(table_rows) <= 12
    assert len(text) < 20_000
    html_bundle = read_bundle(bundle)
    assert "sk-live-123" not in render_upstream(html_bundle)


def test_bundles_lists_newest_first_with_match_and_remedy(tmp_path: Path) -> None:
    """`bundles` shows one line per bundle, newest first, with known issue and remedy outcome."""
    make_bundle(tmp_path, "20261202T090000Z_local_engine0_admission_stall",
                family="admission_stall", wedge=reading(capacity=6))  # fmt: skip
    newer = make_bundle(tmp_path, "20261202T100000Z_local_engine0_deferred_stall",
                        flags=TP2_OFFLOAD, env=SIMPLE_ENV,
                        remedy=[{"event": "restart", "at": 1.0, "ok": True}])  # fmt: skip
    summary = json.loads((newer / "summary.json").read_text())
    summary["created_timestamp"] = 1796205400.0
    summary["known_issues"] = [m.to_json() for m in read_bundle(newer).matches]
    (newer / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "not-a-bundle").mkdir()
    rows = list_bundles(tmp_path)
    assert [r.name for r in rows] == [newer.name, "20261202T090000Z_local_engine0_admission_stall"]
    assert rows[0].known_issues == (
        "vllm-53868 (no fix known), possibly vllm-simple-offload-stuck-transfer (no fix known)"
    )
    assert rows[0].remedy == "restarted"
    assert rows[1].remedy == "none recorded"
    text = format_bundles(rows)
    assert text.splitlines()[1].split()[-1] == newer.name


def test_cli_report_defaults_to_the_newest_bundle_and_works_without_matplotlib(
    tmp_path: Path,
) -> None:
    """Without matplotlib the report renders tables and says how to get the charts."""
    bundle = make_bundle(tmp_path, flags=TP2_OFFLOAD, env=SIMPLE_ENV)
    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.modules['matplotlib.figure'] = None; "
        "from wedgewatch.cli import main; sys.argv = ['wedgewatch', 'report', "
        f"'--evidence-dir', {str(tmp_path)!r}]; main()"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(bundle / "report.html"), str(bundle / "report.md")]
    assert "pip install 'wedgewatch[report]'" in done.stderr
    html = (bundle / "report.html").read_text()
    assert "<svg" not in html
    assert "pip install &#x27;wedgewatch[report]&#x27;" in html
    assert "<td>0.0</td>" in html or "<td>-0.5</td>" in html  # the readings table


def test_cli_report_of_a_missing_bundle_exits_2(tmp_path: Path) -> None:
    """A bundle path that does not exist is a clear error, exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "report", str(tmp_path / "nope")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no such bundle directory" in done.stderr


def test_the_wedge_time_profile_is_shown_with_its_top_stacks(tmp_path: Path) -> None:
    """A bundle's sampled profile: each EngineCore's top stacks by share; junk is skipped."""
    bundle = make_bundle(tmp_path)
    summary = json.loads((bundle / "summary.json").read_text())
    summary["phases"]["wedged"]["profiles"] = [
        {
            "pid": 4242,
            "status": "ok",
            "seconds": 2,
            "samples": 10,
            "file": "profile-enginecore-4242.folded",
            "top_stacks": [
                {"share": 0.7, "samples": 7, "stack": "Scheduler.schedule < step < <b>"},
                {"share": "junk", "stack": "skipped"},
                "not a mapping",
            ],
        },
        {"pid": 4343, "status": "no_process", "seconds": 2, "error": "process 4343 is gone"},
    ]
    (bundle / "summary.json").write_text(json.dumps(summary))
    write_report(bundle)
    html = (bundle / "report.html").read_text()
    assert "<h2>Sampled profile</h2>" in html
    assert "EngineCore pid 4242, ok, 10 busy samples in 2 s" in html
    assert "<td>70%</td><td><code>Scheduler.schedule &lt; step &lt; &lt;b&gt;</code>" in html
    assert "skipped" not in html
    assert "EngineCore pid 4343, no_process" in html
    assert "process 4343 is gone" in html
    plain = make_bundle(tmp_path / "plain")
    write_report(plain)
    assert "Sampled profile" not in (plain / "report.html").read_text()


def test_the_report_reads_at_3am(tmp_path: Path) -> None:
    """Headline at the verdict's time (not when the bundle was opened at suspect), a what-now box
    first (what wedgewatch did, what to do, the upgrade that closes the path, the Markdown to
    attach), sizes and durations with units."""
    offload = ("--tensor-parallel-size", "2", "--kv-offloading-size", "60",
               "--kv-offloading-backend", "native")  # fmt: skip
    bundle = make_bundle(
        tmp_path,
        flags=offload,
        version="0.30.0+wedgewatch.sim",
        remedy=[
            {"event": "restart", "at": 1031.0, "ok": True, "timestamp": 1796205317.0},
            {"event": "episode_closed", "outcome": "restarted", "timestamp": 1796205319.5},
        ],
    )
    summary = json.loads((bundle / "summary.json").read_text())
    summary["created_timestamp"] = 1796205300.0  # 09:55:00, opened at suspect
    summary["verdict_timestamp"] = 1796205315.0  # 09:55:15, the wedge's verdict
    summary["thresholds"] = {"stall_after_seconds": 90.0, "evidence_max_bytes": 268435456}
    (bundle / "summary.json").write_text(json.dumps(summary))
    processes = json.loads((bundle / "processes.json").read_text())
    processes["processes"][0]["rss_bytes"] = 42811392
    (bundle / "processes.json").write_text(json.dumps(processes))

    model = read_bundle(bundle)
    markdown = render_markdown(model)
    headline = markdown.splitlines()[2]
    assert "at 2026-12-02 09:55:15 UTC" in headline, headline
    assert "after 15 s without progress" in headline
    rows = what_now(model)
    now = {row.key: row.text for row in rows}
    assert list(now) == ["wedgewatch did", "do next", "upgrade", "attach upstream"]
    assert "at 09:55:15 UTC" in now["wedgewatch did"]
    assert (
        "restarted the server at 09:55:17 UTC; it answered again 2.5 s later"
        in now["wedgewatch did"]
    )
    assert now["do next"].startswith("#57841 (")
    assert "vLLM 0.30.0+wedgewatch.sim is affected (before 0.31.0)" in now["do next"]
    assert now["upgrade"] == "vLLM 0.31.0 or later closes this path (#57841, #58947)"
    command = rows[-1].command
    assert command.endswith(f"-m wedgewatch report --upstream {bundle.absolute()}"), command
    assert "`" not in now["attach upstream"]
    assert f"writes {bundle.absolute()}/upstream-issue.md" in now["attach upstream"]
    # The command runs from any directory: it names the bundle by its absolute path.
    done = subprocess.run(
        shlex.split(command), cwd="/", capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert (bundle / "upstream-issue.md").is_file()
    assert markdown.index("## What now") < markdown.index("## Timeline")
    # The known-issue line names the issue and whether this release has it; what to do is
    # the what-now box's alone.
    known = next(line for line in markdown.splitlines() if line.startswith("Known issue"))
    assert known.startswith("Known issue: #57841 ("), known
    assert "vLLM 0.30.0+wedgewatch.sim is affected (before 0.31.0)" in known, known
    for action in ("meanwhile", "upgrade to", "restart the server"):
        assert action not in known, known
    assert "-0.0" not in markdown
    # The demo names the possible match the way the report does (#45406, not vllm-45406).
    summary["known_issues"] = [m.to_json() for m in model.matches]
    (bundle / "summary.json").write_text(json.dumps(summary))
    told = "\n".join(write_demo_report(bundle))
    assert "possibly also #45406 (see the report)" in told, told
    write_report(bundle)
    html = (bundle / "report.html").read_text()
    assert html.index("id=verdict") < html.index("id=what-now") < html.index("id=known-line")
    assert "40.8 MiB" in html  # RSS, not 42811392
    assert "42811392" not in html
    assert "<td>1 min 30 s</td>" in html  # stall_after_seconds 90
    assert "<td>256.0 MiB</td>" in html
    assert f"<code>{html_escape(command)}</code>" in html
    assert "`" not in html[html.index("id=what-now") : html.index("id=known-line")]
    assert f"- **attach upstream**: `{command}` writes" in markdown
    assert "\\`" not in markdown
    svg = html[html.index("<svg") : html.index("</svg>")]
    for legend in ("suspect", "wedged", "restart", "back"):
        assert legend in svg, legend


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.5, "0.5 s"), (10.0, "10 s"), (90, "1 min 30 s"), (3600, "1 h"), (5400, "1 h 30 min"),
     (None, "-")],
)  # fmt: skip
def test_durations_read_as_people_say_them(value: float | None, text: str) -> None:
    """Durations with units, never raw seconds."""
    assert human_seconds(value) == text


def test_relative_times_never_read_minus_zero() -> None:
    """A reading a few hundredths before the wedge is at 0.0, not -0.0."""
    assert [relative_seconds(t) for t in (-0.04, 0.0, -0.0, 0.04, -9.0, 2.46)] == [
        "0.0", "0.0", "0.0", "0.0", "-9.0", "+2.5",
    ]  # fmt: skip


def test_sizes_read_as_people_say_them() -> None:
    """Sizes with units, never raw bytes."""
    assert [human_bytes(v) for v in (512, 2048, 42811392, 3 * 1024**3, "x")] == [
        "512 B", "2.0 KiB", "40.8 MiB", "3.0 GiB", "-",
    ]  # fmt: skip


def test_mark_labels_close_in_time_never_share_a_row() -> None:
    """ "restart" and "back" a second apart stack; labels far apart stay on the top row; five
    moments within a tenth of the axis get five rows."""
    marks = [(-10.0, "suspect"), (0.0, "wedged"), (3.1, "restart"), (4.6, "back")]
    rows = label_rows(marks, span=30.0)
    assert rows[0] == rows[1] == 0
    assert rows[2] != rows[3]
    crowd = [(0.0, "suspect"), (0.5, "wedged"), (1.0, "unreachable"), (1.5, "restart"),
             (2.0, "back")]  # fmt: skip
    assert sorted(label_rows(crowd, span=30.0)) == [0, 1, 2, 3, 4]


def _text_boxes(fig: Any) -> list[tuple[str, Any]]:
    """The on-screen box of every text and legend in the drawn figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    boxes: list[tuple[str, Any]] = []
    for ax in fig.axes:
        for text in ax.texts:
            boxes.append((f"label {text.get_text().strip()}", text.get_window_extent(renderer)))
        legend = ax.get_legend()
        if legend is not None:
            boxes.append(("legend", legend.get_window_extent(renderer)))
        for label in (ax.xaxis.label, ax.yaxis.label):
            if label.get_visible() and label.get_text():
                boxes.append((f"axis {label.get_text()}", label.get_window_extent(renderer)))
    for legend in fig.legends:
        boxes.append(("moments legend", legend.get_window_extent(renderer)))
    return boxes


@pytest.mark.parametrize(
    "marks",
    [
        # `wedgewatch demo --stall-after-seconds 20`: "suspect" in the left half.
        [(-19.0, "suspect"), (0.0, "wedged"), (2.0, "restart"), (3.5, "back")],
        [(-29.0, "suspect"), (-28.0, "wedged")],
        # Five moments within a tenth of the axis.
        [(1.0, "suspect"), (1.5, "wedged"), (2.0, "unreachable"), (2.5, "restart"),
         (3.0, "back")],
    ],
)  # fmt: skip
def test_no_chart_label_or_legend_overlaps_another(marks: list[tuple[float, str]]) -> None:
    """On the drawn figure no moment label covers a legend, an axis label or another label."""
    points = [
        Point(t=float(t), state="ok", running=4, capacity=2, deferred=1, kv_cache_usage=0.5,
              generation_rate=100.0, prompt_rate=50.0, failure="timeout" if t == -5 else None)
        for t in range(-30, 6)
    ]  # fmt: skip
    fig = timeline_figure(points, marks)
    assert fig is not None
    boxes = _text_boxes(fig)
    assert sum(name.startswith("label") for name, _ in boxes) == len(marks)
    assert sum(name == "legend" for name, _ in boxes) == 3
    for i, (name_a, a) in enumerate(boxes):
        for name_b, b in boxes[i + 1 :]:
            assert not a.overlaps(b), f"{name_a} {a} overlaps {name_b} {b}"
