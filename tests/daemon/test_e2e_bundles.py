"""Bundles against the simulator, end to end: a crash is not an evidence failure (#24)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families
from test_e2e_daemon import Sim, daemons, sims  # noqa: F401 - the fixtures are used by name
from wedgewatch_daemon import DaemonProcess

_FAST = [
    "--interval-seconds", "1", "--unreachable-after-seconds", "5", "--scrape-timeout-seconds", "2",
]  # fmt: skip


def capture_failures(daemon: DaemonProcess, target: str) -> dict[str, float]:
    """wedgewatch_evidence_capture_failures_total of `target`, by reason, from /metrics."""
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(daemon.get("/metrics").text)
        for sample in family.samples
        if sample.name == "wedgewatch_evidence_capture_failures_total"
        and sample.labels.get("target") == target
    }


def test_a_crash_is_server_gone_not_an_evidence_failure(
    daemons: Callable[..., DaemonProcess],  # noqa: F811 - the fixture
    sims: Callable[..., Sim],  # noqa: F811 - the fixture
) -> None:
    """The engine crashes, the server exits: bundles say `server_gone`, no failure is counted."""
    crash = sims("crash", ["--fault", "engine-crash@3"])
    daemon = daemons(["--target", f"crash={crash.base_url}", *_FAST])
    daemon.wait_for("target_unreachable", timeout_seconds=90, target="crash")
    captured = daemon.wait_for(
        "evidence_captured", timeout_seconds=90, target="crash", phase="wedged"
    )
    assert captured["outcome"] == "server_gone", captured
    assert captured["failures"] == [], captured
    assert "no process listens" in captured["triage"], captured
    for line in daemon.events("evidence_captured", target="crash"):
        assert line["outcome"] == "server_gone", line
    assert daemon.events("evidence_capture_failed", target="crash") == []
    failures = capture_failures(daemon, "crash")
    assert failures, "the failure counter is exported with its reasons"
    assert set(failures.values()) == {0.0}, failures
    assert daemon.stop() == 0
