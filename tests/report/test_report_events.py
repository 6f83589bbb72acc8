"""Typed events between the core and the shell (#20): every event the episode core reports
is a `ReportEvent`, and the shell's dispatch on it (own metrics, remedy notes, webhooks) is
exhaustive, so mypy fails when an event is renamed or added without updating the shell."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from wedgewatch.core.detection.states import NotifyEvent
from wedgewatch.core.episode.episode import Report, ReportEvent
from wedgewatch.core.episode.episode_types import notify_event
from wedgewatch.core.episode.events import ReportEvent as CoreEvent
from wedgewatch.core.restart.restart_policy import PolicyEventKind

ROOT = Path(__file__).resolve().parents[2]


def test_webhooks_are_keyed_by_report_events_of_the_same_name() -> None:
    """H1: exactly the NotifyEvent events send a webhook, under the same name."""
    sent = {event: notify_event(event) for event in ReportEvent}
    assert {w for w in sent.values() if w is not None} == set(NotifyEvent)
    for event, webhook in sent.items():
        assert webhook is None or str(webhook) == str(event)
        assert Report(event, "info", {}).notify == webhook


def test_policy_events_are_members_of_the_one_report_event_type() -> None:
    """The restart policy's facts are not a second enum: they are six `ReportEvent` members
    (one closed type, the one the episode core and the shell re-export)."""
    kinds = get_args(PolicyEventKind)
    assert all(isinstance(kind, ReportEvent) for kind in kinds), kinds
    assert {str(kind) for kind in kinds} == {
        "restart_succeeded",
        "restart_failed",
        "gave_up",
        "gave_up_cleared",
        "backoff_reset",
        "budget_reset",
    }
    assert CoreEvent is ReportEvent


def test_every_reported_event_is_in_the_log_table() -> None:
    """The values are the log lines' event names: docs/daemon.md's table lists each one."""
    text = (ROOT / "docs" / "daemon.md").read_text()
    table = text[text.index("| event | level |") :]
    table = table[: table.index("\n\n")]
    listed = set(re.findall(r"`(\w+)`", table))
    assert {str(e) for e in ReportEvent} - listed == set()


def _mypy(project: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
    )


def _seed_mypy_cache(cache: Path) -> None:
    """Start from the checkout's own mypy cache when there is one (tests/run.sh runs mypy
    before the tests): mypy reuses a module's cached result only when the copy's source hashes
    the same and the options match, and checks every other module, so the verdicts are those
    of a cold cache, without re-reading the standard library's and the dependencies' stubs
    (most of a cold run). A cache cut short while being copied is only a colder start."""
    with contextlib.suppress(OSError):  # shutil.Error is an OSError
        shutil.copytree(ROOT / ".mypy_cache", cache)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new))


def _rename(core: Path, old: str, new: str) -> None:
    """Rename the ReportEvent member `old` in its definition and in every use in the core."""
    _edit(core / "episode" / "events.py", f"    {old} = ", f"    {new} = ")
    for path in core.rglob("*.py"):
        text = path.read_text()
        path.write_text(text.replace(f"ReportEvent.{old}", f"ReportEvent.{new}"))


@pytest.mark.slow
def test_renaming_or_adding_an_event_without_the_shell_fails_mypy(tmp_path: Path) -> None:
    """Acceptance of #20: a copy of the package passes mypy; renamed or added events that
    the shell does not handle make it fail, at the shell's dispatch."""
    project = tmp_path / "project"
    shutil.copytree(
        ROOT / "wedgewatch",
        project / "wedgewatch",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", project / "pyproject.toml")  # the strict settings
    cache = tmp_path / "mypy-cache"
    _seed_mypy_cache(cache)
    baseline = _mypy(project, cache)
    assert baseline.returncode == 0, baseline.stdout + baseline.stderr

    core = project / "wedgewatch" / "core"
    # 1. Rename a metric's event everywhere in the core, but not in the shell.
    _rename(core, "WEDGE_DETECTED", "WEDGE_SEEN")
    renamed = _mypy(project, cache)
    assert renamed.returncode == 1, renamed.stdout + renamed.stderr
    errors = [line for line in renamed.stdout.splitlines() if ": error:" in line]
    failing = {line.split(":")[0] for line in errors}
    # The shell's dispatches fail (metrics, remedy notes), and nothing in the core does.
    assert {"wedgewatch/daemon/report.py", "wedgewatch/daemon/target.py"} <= failing, errors
    assert not any(f.startswith("wedgewatch/core/") for f in failing), errors
    assert 'has no attribute "WEDGE_DETECTED"' in renamed.stdout

    # 2. Undo that; add an event nobody decided about: every dispatch fails at assert_never.
    _rename(core, "WEDGE_SEEN", "WEDGE_DETECTED")
    _edit(
        core / "episode" / "events.py",
        '    BUDGET_RESET = "budget_reset"\n',
        '    BUDGET_RESET = "budget_reset"\n    ENGINE_HAUNTED = "engine_haunted"\n',
    )
    added = _mypy(project, cache)
    assert added.returncode == 1, added.stdout + added.stderr
    never = [line for line in added.stdout.splitlines() if '"assert_never"' in line]
    assert {line.split(":")[0] for line in never} >= {
        "wedgewatch/core/episode/episode_types.py",  # notify_event: does it send a webhook?
        "wedgewatch/daemon/report.py",  # Reporter.count: which metric?
        "wedgewatch/daemon/target.py",  # remedy_note: what became of the bundle?
    }, added.stdout
    assert all("ENGINE_HAUNTED" in line for line in never), added.stdout

    # 3. Undo that; rename one of the restart policy's events in the one type, but not in
    #    the policy: the policy's own Literal and its uses fail, in the core.
    _edit(core / "episode" / "events.py", '    ENGINE_HAUNTED = "engine_haunted"\n', "")
    _edit(core / "episode" / "events.py", "    BUDGET_RESET = ", "    BUDGET_CLEARED = ")
    policy = _mypy(project, cache)
    assert policy.returncode == 1, policy.stdout + policy.stderr
    assert 'has no attribute "BUDGET_RESET"' in policy.stdout, policy.stdout
    assert "wedgewatch/core/restart/restart_policy.py" in policy.stdout, policy.stdout

    # 4. Undo that; the policy reports one more kind that the episode core does not
    #    handle: its match on the policy's events fails at assert_never.
    _edit(core / "episode" / "events.py", "    BUDGET_CLEARED = ", "    BUDGET_RESET = ")
    _edit(
        core / "restart" / "restart_policy.py",
        "    ReportEvent.BUDGET_RESET,\n]",
        "    ReportEvent.BUDGET_RESET,\n    ReportEvent.RESTART_DEFERRED,\n]",
    )
    unhandled = _mypy(project, cache)
    assert unhandled.returncode == 1, unhandled.stdout + unhandled.stderr
    never = [line for line in unhandled.stdout.splitlines() if '"assert_never"' in line]
    assert [line.split(":")[0] for line in never] == ["wedgewatch/core/episode/episode.py"], never
    assert "RESTART_DEFERRED" in never[0], never
