"""Bundles against the simulator, end to end (#24): a crash is not an evidence failure, and
the `on_bundle` hook (the shipped deploy/hooks/upload-bundle.sh) ships a complete bundle."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from test_e2e_daemon import TP2_OFFLOAD, Sim, daemons, sims  # noqa: F401 - the fixtures are used by name
from wedgewatch_daemon import DaemonProcess

_FAST = [
    "--interval-seconds", "1", "--unreachable-after-seconds", "5", "--scrape-timeout-seconds", "2",
]  # fmt: skip


UPLOAD = Path(__file__).resolve().parents[2] / "deploy" / "hooks" / "upload-bundle.sh"


def counter(daemon: DaemonProcess, name: str, target: str, by: str) -> dict[str, float]:
    """A counter of wedgewatch's /metrics for `target`, by the label `by`."""
    return {
        sample.labels[by]: sample.value
        for family in text_string_to_metric_families(daemon.get("/metrics").text)
        for sample in family.samples
        if sample.name == name and sample.labels.get("target") == target
    }


def capture_failures(daemon: DaemonProcess, target: str) -> dict[str, float]:
    """wedgewatch_evidence_capture_failures_total of `target`, by reason."""
    return counter(daemon, "wedgewatch_evidence_capture_failures_total", target, "reason")


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


def test_on_bundle_ships_the_complete_wedge_bundle(
    daemons: Callable[..., DaemonProcess],  # noqa: F811 - the fixture
    sims: Callable[..., Sim],  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    """A collective hang under load: the wedge bundle, once complete, is copied by the shipped
    upload script to a directory; the run is logged and counted. The hook waits for a file
    before it uploads: the daemon keeps scraping meanwhile (the hook never blocks a scrape)."""
    shipped, release = tmp_path / "shipped", tmp_path / "release"
    # on_bundle appends the bundle: $0 is the upload script, "$@" its DEST and the bundle.
    gate = f'while [ ! -e {shlex.quote(str(release))} ]; do sleep 0.1; done; exec "$0" "$@"'
    hook = shlex.join(["/bin/sh", "-c", gate, str(UPLOAD), str(shipped)])
    hang = sims("hang", [*TP2_OFFLOAD, "--fault", "collective-hang@3"])
    load = hang.load("steady", 60)
    try:
        daemon = daemons(
            [
                *("--target", f"hang={hang.base_url}", *_FAST),
                *("--stall-after-seconds", "5", "--hang-after-seconds", "5"),
                *("--on-bundle", hook),
            ]
        )
        daemon.wait_for("wedge_detected", timeout_seconds=90, target="hang")
        captured = daemon.wait_for(
            "evidence_captured", timeout_seconds=90, target="hang", phase="wedged"
        )
        seen = daemon.get("/status").json()["targets"][0]["last_scrape"]
        deadline = time.monotonic() + 30
        while daemon.get("/status").json()["targets"][0]["last_scrape"] == seen:
            assert time.monotonic() < deadline, "no scrape while the hook waited"
            time.sleep(0.2)
        assert daemon.events("bundle_hook_finished") == []  # scraped while the hook waits
        release.touch()
        finished = daemon.wait_for("bundle_hook_finished", timeout_seconds=90, target="hang")
    finally:
        load.kill()
    assert finished["result"] == "ok", finished
    assert finished["bundle"] == captured["bundle"]
    bundle = Path(captured["bundle"])
    copy = shipped / bundle.name
    summary = json.loads((copy / "summary.json").read_text())
    assert summary["verdict"] == "wedged"  # the complete bundle, both rounds
    assert summary == json.loads((bundle / "summary.json").read_text())
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == sorted(
        p.relative_to(bundle) for p in bundle.rglob("*")
    )
    assert list(shipped.iterdir()) == [copy]  # one run, for the complete bundle only
    runs = counter(daemon, "wedgewatch_bundle_hook_runs_total", "hang", "result")
    assert runs == {"ok": 1.0}, runs
    assert daemon.stop() == 0
