"""`wedgewatch report` and `bundles`: every fault family, damaged bundles, redaction, no charts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from report_bundles import SIMPLE_ENV, TP2_OFFLOAD, make_bundle, reading

from wedgewatch.report.commands import format_bundles, write_report
from wedgewatch.report.model import list_bundles, read_bundle
from wedgewatch.report.render import NO_MATCH, render_upstream

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
    assert rows[0].known_issues == "vllm-53868, vllm-simple-offload-stuck-transfer"
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
    assert "<td>+0.0</td>" in html or "<td>-0.5</td>" in html  # the readings table


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
