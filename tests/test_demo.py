"""`wedgewatch demo`: the story read from /status (pure), its view, and the whole demo run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from wedgewatch.demo import DEMO_SERVE_FLAGS, SCHEDULER_NOTE, DemoOptions, demo_settings
from wedgewatch.demo_story import (
    RECOVERED_AFTER_SECONDS,
    Story,
    advance,
    bundle_report,
    render_engines,
    render_summary,
    threshold_for,
)
from wedgewatch.sim.api import scheduler_config_from_args
from wedgewatch.sim.args import ServeArgs, parse_serve_args
from wedgewatch.sim.scheduler import SchedulerConfig

SETTINGS = demo_settings(DemoOptions(stall_after_seconds=10.0), listen_port=9321)


def engine(state: str, *, family: str | None = None, stalled: float = 0.0, **reading: Any) -> Any:
    """One engine of a /status document."""
    values = {
        "running": 0.0,
        "waiting": 0.0,
        "waiting_by_reason": {"capacity": 0.0, "deferred": 0.0},
        "generation_tokens": 0.0,
        **reading,
    }
    return {
        "engine": "0",
        "model_name": "m",
        "state": state,
        "family": family,
        "stalled_seconds": stalled,
        "reason": f"because {state}",
        "last_reading": values,
    }


def status(state: str, engines: list[Any], **target: Any) -> dict[str, Any]:
    """A /status document with one target."""
    return {
        "targets": [
            {
                "name": "t",
                "state": state,
                "restarts": 0,
                "restart_in_progress": False,
                "last_bundle": None,
                "episode": None,
                "restart_budget_remaining": 3,
                "engines": engines,
                **target,
            }
        ]
    }


WEDGED = engine(
    "wedged",
    family="deferred_stall",
    stalled=11.0,
    waiting=7.0,
    waiting_by_reason={"capacity": 1.0, "deferred": 6.0},
    generation_tokens=500.0,
)
BUNDLE = "/x/evidence/b1"


def the_whole_story() -> list[tuple[float, dict[str, Any]]]:
    """A wedge, its bundle, a restart and the recovery, as /status shows them over time."""
    recovered_at = 33.0 + RECOVERED_AFTER_SECONDS
    return [
        (0.0, status("starting", [])),
        (1.0, status("idle", [engine("idle")])),
        (5.0, status("ok", [engine("ok", running=3.0, generation_tokens=400.0)])),
        (20.0, status("suspect", [engine("suspect", family="deferred_stall", stalled=1.0)])),
        (30.0, status("wedged", [WEDGED], episode={"bundle": BUNDLE})),
        (31.0, status("wedged", [WEDGED], restarts=1, restart_in_progress=True)),
        (33.0, status("idle", [engine("idle", generation_tokens=0.0)], restarts=1)),
        (35.0, status("ok", [engine("ok", generation_tokens=50.0)], restarts=1)),
        (recovered_at, status("ok", [engine("ok", generation_tokens=900.0)], restarts=1)),
    ]


def play(steps: list[tuple[float, dict[str, Any]]]) -> tuple[Story, list[str]]:
    """Fold the documents into a story; the kinds of the events, in order."""
    story, kinds = Story(), []
    for at, doc in steps:
        story, events = advance(story, doc, at)
        kinds += [e.kind for e in events]
    return story, kinds


def test_the_demo_names_the_vllm_release_its_scheduler_model_follows() -> None:
    """The demo says which vLLM scheduler it simulates: the sim's default model (0.30.0, async
    scheduling) with full-ISL admission off, the one flag the demo adds."""
    default = SchedulerConfig()
    assert (default.vllm_structure, default.async_scheduling) == ("0.30", True)
    parsed = parse_serve_args(["tiny", *DEMO_SERVE_FLAGS])
    assert isinstance(parsed, ServeArgs)
    assert scheduler_config_from_args(parsed).reserve_full_isl is False
    assert "vLLM 0.30.0's scheduler" in SCHEDULER_NOTE
    assert "full-ISL admission off" in SCHEDULER_NOTE
    assert "0.31+" in SCHEDULER_NOTE


def test_the_story_is_told_in_order() -> None:
    """up -> suspect -> wedged -> bundle -> restarting -> back -> recovered, each once."""
    story, kinds = play(the_whole_story())
    assert kinds == ["up", "suspect", "wedged", "bundle", "restarting", "back", "recovered"]
    assert story.complete
    assert story.missing() == []
    assert story.bundle == BUNDLE
    assert (story.wedged_at, story.restart_at, story.back_at) == (30.0, 31.0, 33.0)
    assert story.tokens_since_back == 900.0


def test_recovery_needs_calm_engines_for_a_while_and_new_tokens() -> None:
    """A server that answers after the restart but stalls again has not recovered."""
    steps = the_whole_story()[:-1]
    steps.append(
        (42.0, status("suspect", [engine("suspect", family="deferred_stall")], restarts=1))
    )
    steps.append((60.0, status("ok", [engine("ok", generation_tokens=60.0)], restarts=1)))
    story, kinds = play(steps)
    assert "recovered" not in kinds
    assert story.missing() == ["the server did not recover"]
    story, events = advance(
        story, status("ok", [engine("ok", generation_tokens=70.0)], restarts=1), 66.0
    )
    assert [e.kind for e in events] == ["recovered"]


def test_a_stall_that_clears_by_itself_is_not_the_story() -> None:
    """A suspect engine that recovers on its own: no wedge, no bundle, no restart."""
    steps = [
        (1.0, status("ok", [engine("ok")])),
        (2.0, status("suspect", [engine("suspect", family="deferred_stall")])),
        (4.0, status("ok", [engine("ok", generation_tokens=10.0)], last_bundle="/x/routine")),
    ]
    story, kinds = play(steps)
    assert kinds == ["up", "suspect"]
    assert not story.complete
    assert story.missing() == [
        "no wedge was detected",
        "no evidence bundle was written",
        "the server was not restarted",
        "the server did not recover",
    ]


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        pytest.param("deferred_stall", ("stall_after_seconds", 10.0), id="deferred"),
        pytest.param("admission_stall", ("stall_after_seconds", 10.0), id="admission"),
        pytest.param(
            "deferred_only_stall", ("deferred_only_after_seconds", 600.0), id="deferred-only"
        ),
        pytest.param("progress_stall", ("hang_after_seconds", 30.0), id="progress"),
        pytest.param("unreachable", ("unreachable_after_seconds", 10.0), id="unreachable"),
        pytest.param(None, None, id="none"),
    ],
)
def test_each_family_counts_down_to_its_own_threshold(
    family: str | None, expected: tuple[str, float] | None
) -> None:
    """The countdown uses the threshold that decides the engine's stall family."""
    assert threshold_for(family, SETTINGS) == expected


def test_the_view_shows_reasons_progress_and_the_countdown() -> None:
    """Per engine: state, running, waiting by reason, tokens per second, time to the wedge."""
    suspect = engine(
        "suspect",
        family="deferred_stall",
        stalled=3.5,
        waiting=7.0,
        waiting_by_reason={"capacity": 1.0, "deferred": 6.0},
    )
    (line,) = render_engines(status("suspect", [suspect]), SETTINGS, {"0": 0.0}, colour=False)
    assert "suspect" in line
    assert "running 0" in line
    assert "waiting 7 (capacity 1, deferred 6)" in line
    assert "progress +0 tok/s" in line
    assert "wedge in 6.5 s (stall_after_seconds = 10)" in line
    (line,) = render_engines(status("wedged", [WEDGED]), SETTINGS, {}, colour=True)
    assert "\x1b[31;1m" in line
    assert "stalled 11.0 s >= stall_after_seconds = 10" in line


def test_bundle_report_names_triage_stacks_and_the_ptrace_fix() -> None:
    """The bundle lines give the triage, which stacks were dumped, and how to allow ptrace."""
    stacks = [
        {"role": "api_server", "have_json": True},
        {"role": "engine_core", "have_json": True},
        {"role": "worker", "have_json": True},
        {"role": "worker", "have_json": True},
        {"role": "worker", "have_json": False},
    ]
    summary = {
        "verdict": "wedged",
        "triage": {"kind": "scheduler_wedge", "summary": "engine loop spinning"},
        "phases": {"wedged": {"stacks": stacks}},
        "ptrace_denied": False,
    }
    lines = bundle_report(summary)
    assert lines[0] == "triage: scheduler_wedge: engine loop spinning"
    assert "py-spy stacks of 4 processes (api_server, engine_core, worker x2)" in lines[1]
    denied = bundle_report({**summary, "ptrace_denied": True})
    assert "ptrace_scope" in denied[-1]


def test_summary_names_each_step_or_what_is_missing(tmp_path: Path) -> None:
    """The closing summary has detection, evidence, restart and recovery, or MISSING lines."""
    story, _ = play(the_whole_story())
    text = "\n".join(render_summary(story, SETTINGS, ["triage: x"], tmp_path / "demo.log"))
    for word in ("detected", "evidence", "restart", "recovery", "stall_after_seconds = 10"):
        assert word in text
    assert "MISSING" not in text
    partial = "\n".join(render_summary(Story(up_at=1.0), SETTINGS, [], tmp_path / "demo.log"))
    assert "MISSING    no wedge was detected" in partial


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_demo_tells_the_whole_story(tmp_path: Path) -> None:
    """`wedgewatch demo` exits 0 after a wedge, a bundle with stacks, a restart and recovery."""
    directory = tmp_path / "demo"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WEDGEWATCH_", "NOTIFY_"))}
    mark = uuid.uuid4().hex  # inherited by every process the demo starts
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "demo", "--dir", str(directory)],
        capture_output=True,
        text=True,
        env={**clean, "DEMO_TEST_MARK": mark},
        timeout=540,
        check=False,
        cwd=tmp_path,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    assert "WEDGE DETECTED" in out
    assert "RECOVERED" in out
    summary_text = out[out.index("\nSummary") :]
    for heading in ("detected", "evidence", "restart", "recovery"):
        assert f"  {heading} " in summary_text, summary_text
    assert "MISSING" not in summary_text
    bundles = [p for p in (directory / "evidence").iterdir() if (p / "summary.json").exists()]
    wedged = [
        json.loads((p / "summary.json").read_text())
        for p in bundles
        if json.loads((p / "summary.json").read_text())["verdict"] == "wedged"
    ]
    assert len(wedged) == 1
    stacks = wedged[0]["phases"]["wedged"]["stacks"]
    assert {s["role"] for s in stacks if s.get("have_json")} >= {"engine_core", "worker"}
    assert any((directory / "evidence").rglob("*.json"))
    log = (directory / "demo.log").read_text()
    assert '"event": "restart_succeeded"' in log
    left = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get("DEMO_TEST_MARK") == mark:
                left.append((proc.pid, proc.name()))
    assert left == [], f"processes of the demo outlived it: {left}"


def test_a_stall_that_cleared_does_not_hide_the_next_one() -> None:
    """Each new stall is reported: suspect, calm again, suspect again gives two events."""
    steps = [
        (1.0, status("ok", [engine("ok")])),
        (2.0, status("suspect", [engine("suspect", family="unreachable")])),
        (3.0, status("ok", [engine("ok")])),
        (9.0, status("suspect", [engine("suspect", family="deferred_stall")])),
        (19.0, status("wedged", [WEDGED])),
    ]
    story, kinds = play(steps)
    assert kinds == ["up", "suspect", "suspect", "wedged"]
    assert story.suspect_at == 9.0
