"""The shell's dispatch on `ReportEvent` (daemon/report.py): every event the core reports
becomes one log line whose event is the plain name, the counters it is meant to move (and
no others), and a webhook exactly for the `NotifyEvent` events, under the same name."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from prometheus_client import CollectorRegistry

from wedgewatch.config import Config
from wedgewatch.core.detection.states import (
    SCRAPE_FAILURE_REASONS,
    EngineState,
    Family,
    NotifyEvent,
)
from wedgewatch.core.episode.episode import Report, ReportEvent
from wedgewatch.daemon.ownmetrics import OwnMetrics
from wedgewatch.daemon.report import Reporter

FIELDS: Mapping[str, Any] = {
    "target": "sim",
    "engine": "0",
    "model_name": "m",
    "family": "progress_stall",
    "phase": "wedged",
    "reason": "probe_restart",
    "reasons": ["timeout"],
    "duration_seconds": 2.5,
}

# The counter samples each event moves by one; every other event moves none.
COUNTS: Mapping[ReportEvent, set[tuple[str, tuple[tuple[str, str], ...]]]] = {
    ReportEvent.STALL_SUSPECTED: {("wedgewatch_suspects_total", (("family", "progress_stall"),))},
    ReportEvent.WEDGE_DETECTED: {("wedgewatch_wedges_total", (("family", "progress_stall"),))},
    ReportEvent.TARGET_UNREACHABLE: {("wedgewatch_wedges_total", (("family", "progress_stall"),))},
    ReportEvent.RESTART_REQUESTED: {("wedgewatch_restarts_total", (("remedy", "signal"),))},
    ReportEvent.RESTART_SUCCEEDED: {("wedgewatch_restarts_total", (("remedy", "probe"),))},
    ReportEvent.RESTART_FAILED: {
        ("wedgewatch_restart_failures_total", (("reason", "probe_restart"),))
    },
    ReportEvent.EVIDENCE_CAPTURED: {
        ("wedgewatch_evidence_captures_total", (("phase", "wedged"),)),
        ("wedgewatch_evidence_capture_duration_seconds_count", ()),
    },
    ReportEvent.EVIDENCE_CAPTURE_FAILED: {
        ("wedgewatch_evidence_capture_failures_total", (("reason", "timeout"),))
    },
}


class Recorder:
    """A Notifier that keeps what it is asked to send."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, Mapping[str, Any]]] = []

    def notify(self, event: str, payload: Mapping[str, Any]) -> None:
        self.sent.append((event, payload))

    def failures(self) -> int:
        return 0

    async def aclose(self, timeout_seconds: float) -> None:
        return None


def _counters(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith(("_total", "_count")):
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "target"))
                out[(sample.name, labels)] = sample.value
    return out


@pytest.mark.parametrize("event", list(ReportEvent), ids=str)
def test_each_report_event_is_logged_counted_and_notified_as_before(
    event: ReportEvent, tmp_path: Path
) -> None:
    """A Report becomes its plain-named log line, its counters only, and a webhook iff notified."""
    config = Config.model_validate(
        {
            "targets": ["sim=http://127.0.0.1:8000"],
            "remedy": "signal",
            "state_dir": str(tmp_path / "state"),
            "evidence_dir": str(tmp_path / "evidence"),
        }
    )
    registry = CollectorRegistry()
    metrics = OwnMetrics(
        registry,
        version="0",
        states=tuple(EngineState),
        families=tuple(Family),
        scrape_failure_reasons=SCRAPE_FAILURE_REASONS,
    )
    notifier = Recorder()
    reporter = Reporter(config, config.detection_policy(), metrics, notifier)
    before = _counters(registry)
    with structlog.testing.capture_logs() as logs:
        reporter.report(config.targets[0], Report(event, "info", FIELDS), now=1_700_000_000.0)

    assert [(type(line["event"]), line["event"]) for line in logs] == [(str, str(event))]
    after = _counters(registry)
    moved = {key for key, value in after.items() if value != before.get(key, 0.0)}
    assert moved == COUNTS.get(event, set())
    assert all(after[key] - before.get(key, 0.0) == 1 for key in moved)
    if event in {str(e) for e in NotifyEvent}:
        [(name, payload)] = notifier.sent
        assert (type(name), name) == (str, str(event))
        assert (type(payload["event"]), payload["event"]) == (str, str(event))
    else:
        assert notifier.sent == []
