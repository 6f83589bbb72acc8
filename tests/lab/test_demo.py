"""`wedgewatch demo`: the story read from /status (pure), its view, and the whole demo run."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from wedgewatch.lab.demo import (
    BASE_PROFILE,
    DEMO_ISSUE,
    DEMO_MODEL,
    DEMO_PROFILE,
    DEMO_SERVE_FLAGS,
    DemoOptions,
    demo_profiles,
    demo_settings,
    demo_story,
    vllm_connector,
)
from wedgewatch.lab.demo_story import (
    RECOVERED_AFTER_SECONDS,
    Story,
    advance,
    bundle_report,
    render_engines,
    render_summary,
    threshold_for,
)
from wedgewatch.lab.sim.api import scheduler_config_from_args
from wedgewatch.lab.sim.args import ServeArgs, parse_serve_args
from wedgewatch.launch import LaunchCommand, build_command
from wedgewatch.vllm.build_info import serve_flags
from wedgewatch.vllm.profiles import Profile, builtin_profiles

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


def demo_command(
    profile: Profile | None = None, flags: tuple[str, ...] = DEMO_SERVE_FLAGS
) -> LaunchCommand:
    """The command the demo prints, built as the demo builds it."""
    return build_command(
        vllm_bin="vllm",
        model=DEMO_MODEL,
        profile=profile or demo_profiles()[DEMO_PROFILE],
        extra_args=("--host", "127.0.0.1", "--port", "8000", *flags),
    )


def test_the_demo_tells_one_story() -> None:
    """Printed command, simulated connector, emulated release and known issue agree: vLLM builds
    OffloadingConnector from the printed flags, the simulator runs it and reports 0.30.0 (as the
    simulator), and #57841 matches that release, with 0.31.0 as the release that closes it."""
    command = demo_command()
    assert "VLLM_USE_SIMPLE_KV_OFFLOAD" not in command.render()
    story = demo_story(command)
    assert story.disagreements() == []
    assert (story.connector, story.simulated_connector) == ("OffloadingConnector",) * 2
    assert story.reported_version == "0.30.0+wedgewatch.sim"
    assert story.issue.ref == "#57841"
    assert story.issue.fixed_in == "0.31.0"
    note = story.scheduler_note()
    for part in ("vLLM 0.30.0's scheduler", "OffloadingConnector", "0.30.0+wedgewatch.sim",
                 "#57841 path", "vLLM 0.31.0 and later close it (#58947)",
                 "full-ISL admission off"):  # fmt: skip
        assert part in note, note
    parsed = parse_serve_args(["tiny", *DEMO_SERVE_FLAGS])
    assert isinstance(parsed, ServeArgs)
    assert scheduler_config_from_args(parsed).reserve_full_isl is False


def test_the_demo_profile_is_shipped_and_launch_takes_it(tmp_path: Path) -> None:
    """The header's profile is a real one: `launch --list-profiles` shows it and `launch
    --profile tp2-offload-connector` builds the demo's command (tp2-offload's flags, no
    VLLM_USE_SIMPLE_KV_OFFLOAD)."""
    shipped = builtin_profiles()
    assert shipped[DEMO_PROFILE] == demo_profiles()[DEMO_PROFILE]
    base = shipped[BASE_PROFILE]
    assert shipped[DEMO_PROFILE].args == base.args
    assert shipped[DEMO_PROFILE].env == {
        k: v for k, v in base.env.items() if k != "VLLM_USE_SIMPLE_KV_OFFLOAD"
    }
    for part in ("OffloadingConnector", "#57841", "VLLM_USE_SIMPLE_KV_OFFLOAD"):
        assert part in (shipped[DEMO_PROFILE].description or ""), part
    wedgewatch = [sys.executable, "-m", "wedgewatch", "launch"]
    listed = subprocess.run(
        [*wedgewatch, "--list-profiles"], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert listed.returncode == 0, listed.stderr
    assert f"{DEMO_PROFILE}: " in listed.stdout
    dry = subprocess.run(
        [*wedgewatch, "--profile", DEMO_PROFILE, "--model", DEMO_MODEL, "--dry-run",
         "--vllm-bin", str(tmp_path / "vllm")],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert " ".join(base.args) in dry.stdout
    assert "VLLM_USE_SIMPLE_KV_OFFLOAD" not in dry.stdout


def test_changing_the_profile_or_the_release_alone_breaks_the_story() -> None:
    """The tp2-offload profile as shipped (SimpleCPUOffloadConnector) or the 0.31+ structure,
    each without the rest, is two stories, and the demo refuses to start."""
    shipped = demo_profiles()[BASE_PROFILE]
    assert shipped.env.get("VLLM_USE_SIMPLE_KV_OFFLOAD") == "1"
    simple = demo_story(demo_command(profile=shipped)).disagreements()
    assert any("SimpleCPUOffloadConnector, but the simulator runs OffloadingConnector" in p
               for p in simple), simple  # fmt: skip
    newer = ("--no-scheduler-reserve-full-isl", "--vllm-structure", "0.31+")
    later = demo_story(demo_command(flags=newer))
    assert later.reported_version == "0.33.0+wedgewatch.sim"
    assert later.disagreements() == [
        "#57841 does not match a wedge of vLLM 0.33.0+wedgewatch.sim with OffloadingConnector"
    ]


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


def printed_connector(out: str) -> str:
    """The connector a real vLLM builds from the `server` line the demo printed."""
    line = next(x for x in out.splitlines() if x.startswith("  server     "))
    words = shlex.split(line.split(None, 1)[1])
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return vllm_connector(serve_flags(words)[1], env)


def assert_one_story(out: str, log: str, bundle: Path) -> None:
    """Printed command, the simulator's version and connector, build.json, the known issues
    and the report's headline tell one story: vLLM 0.30.0 (simulated) with OffloadingConnector
    takes the #57841 path, closed from 0.31.0."""
    connector = printed_connector(out)
    scheduler = next(x for x in out.splitlines() if x.startswith("  scheduler  "))
    served = re.search(r"GET /version: (\S+)", out)
    assert served, out[:3000]
    version = served.group(1)
    started = re.findall(r"wedgewatch sim (\S+) serving .*, connector (\w+),", log)
    assert started, log[:3000]
    build = json.loads((bundle / "build.json").read_text())
    summary = json.loads((bundle / "summary.json").read_text())
    built = vllm_connector(build["flags"], build["engine_env"])
    # every start of the simulator (the first and the restarted one) says the same
    assert set(started) == {(version, connector)}, (started, version, connector)
    assert (build["version"]["version"], summary["vllm_version"]) == (version, version)
    assert built == connector
    assert version in scheduler, scheduler
    assert connector in scheduler, scheduler
    assert version.endswith("+wedgewatch.sim")
    first, *rest = summary["known_issues"]
    assert first["id"] == DEMO_ISSUE, summary["known_issues"]
    assert first["possibility"] is None
    assert "#57841 path" in scheduler
    assert f"vLLM {first['fixed_in']} and later" in scheduler
    assert first["action"].startswith(f"#57841: vLLM {version} is affected")
    assert f"fixed in vLLM {first['fixed_in']}: upgrade to it or later" in first["action"]
    assert all(m["possibility"] for m in rest), rest  # anything else is labelled a possibility
    assert f"  known      {first['action']}" in out
    report = (bundle / "report.md").read_text()
    verdict_at = dt.datetime.fromtimestamp(summary["verdict_timestamp"], tz=dt.UTC)
    headline = report.split("\n")[2]
    assert f"at {verdict_at:%Y-%m-%d %H:%M:%S} UTC" in headline, headline
    assert "#57841" in report
    assert f"vLLM {first['fixed_in']} or later closes" in report


def assert_next_commands_work(out: str, cwd: Path, bundle: str) -> None:
    """The commands the demo prints to list and reopen its bundles work as printed."""
    block = out[out.index("\nNext (") :].splitlines()[2:5]
    assert len(block) == 3, block
    assert all(x.startswith("  ") for x in block), block
    results = [
        subprocess.run(
            shlex.split(line), cwd=cwd, capture_output=True, text=True, timeout=120, check=False
        )
        for line in block
    ]
    for line, done in zip(block, results, strict=True):
        assert done.returncode == 0, (line, done.stdout, done.stderr)
    listing, report, upstream = (r.stdout for r in results)
    assert bundle in listing, listing
    assert "vllm-57841" in listing, listing
    assert report.split(), report
    assert all(Path(p).is_file() for p in report.split()), report
    assert upstream.strip().endswith("upstream-issue.md"), upstream
    assert Path(upstream.strip()).is_file()


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
    wedged_names = [str(w["bundle"]) for w in wedged]
    stacks = wedged[0]["phases"]["wedged"]["stacks"]
    assert {s["role"] for s in stacks if s.get("have_json")} >= {"engine_core", "worker"}
    assert any((directory / "evidence").rglob("*.json"))
    log = (directory / "demo.log").read_text()
    assert '"event": "restart_succeeded"' in log
    assert_one_story(out, log, directory / "evidence" / wedged_names[0])
    assert_next_commands_work(out, tmp_path, wedged_names[0])
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
