"""What the daemon appends to a bundle's remedy.jsonl, read from the episode core's reports."""

from __future__ import annotations

from wedgewatch.core.episode import episode as core
from wedgewatch.daemon.target import remedy_note
from wedgewatch.vllm.signals import EngineKey

EPISODE = core.Episode("e1", EngineKey("m", "0"), "deferred_stall", 1.0, 2.0, bundle="/b/x")


def test_completed_restart_is_noted_in_the_episodes_bundle() -> None:
    """restart_completed has no bundle field: the open episode's bundle is used."""
    report = core.Report(
        core.ReportEvent.RESTART_COMPLETED, "info", {"detail": "d", "duration_seconds": 1.5}
    )
    assert remedy_note(report, EPISODE, 10.0, 100.0) == (
        "/b/x",
        {"event": "restart", "ok": True, "detail": "d", "duration_seconds": 1.5,
         "at": 10.0, "timestamp": 100.0},
    )  # fmt: skip


def test_failed_restart_and_episode_end_are_noted() -> None:
    """A failed restart and the episode's end carry the bundle in their own fields."""
    failed = core.Report(
        core.ReportEvent.RESTART_FAILED, "error", {"bundle": "/b/y", "reason": "timeout"}
    )
    noted = remedy_note(failed, None, 1.0, 2.0)
    assert noted is not None
    assert noted[0] == "/b/y"
    assert noted[1]["ok"] is False
    assert noted[1]["reason"] == "timeout"
    closed = core.Report(
        core.ReportEvent.EPISODE_CLOSED, "info", {"bundle": "/b/y", "outcome": "restarted"}
    )
    assert remedy_note(closed, None, 1.0, 2.0) == (
        "/b/y",
        {"event": "episode_closed", "outcome": "restarted", "at": 1.0, "timestamp": 2.0},
    )


def test_other_reports_and_bundleless_episodes_are_not_noted() -> None:
    """Nothing is noted without a bundle, or for reports that do not end a restart or episode."""
    closed = core.Report(
        core.ReportEvent.EPISODE_CLOSED, "info", {"bundle": None, "outcome": "recovered"}
    )
    assert remedy_note(closed, None, 1.0, 2.0) is None
    opened = core.Report(core.ReportEvent.EPISODE_OPENED, "info", {"bundle": "/b/x"})
    assert remedy_note(opened, EPISODE, 1.0, 2.0) is None
