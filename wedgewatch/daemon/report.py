"""What the daemon tells people: log lines, its own metrics and webhooks, from data it is given.

Nothing here decides anything about a target: the detector's transitions and the episode
core's `Report` effects come in, and go out as one log line each, metric updates and webhook
notifications. Also the pure summaries the evidence bundle and the flight recorder keep.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, assert_never

import structlog

from wedgewatch import __version__
from wedgewatch.core.detection.detect import (
    DetectionPolicy,
    EngineVerdict,
    ScrapeFailed,
    TargetVerdict,
)
from wedgewatch.core.detection.states import STALLED, THRESHOLD_SETTINGS, NotifyEvent
from wedgewatch.core.episode.episode import Report, ReportEvent
from wedgewatch.core.text.redact import redact_url, scrub_text, secret_fragments
from wedgewatch.daemon.ownmetrics import EngineSample, OwnMetrics
from wedgewatch.daemon.roles import Notifier
from wedgewatch.io.bundle_hook import BundleHook
from wedgewatch.io.bundles import history_lines

if TYPE_CHECKING:
    from wedgewatch.config import Config, Target

log = structlog.get_logger("wedgewatch.daemon")


def wall(at: float | None, now_at: float, now: float) -> float | None:
    """The Unix time of monotonic instant `at`, given one pair (now_at, now)."""
    return None if at is None else now - (now_at - at)


class Reporter:
    """Turns transitions and `Report` effects into log lines, metrics and webhooks."""

    def __init__(
        self, config: Config, policy: DetectionPolicy, metrics: OwnMetrics, notifier: Notifier
    ) -> None:
        self.config = config
        self.policy = policy
        self.metrics = metrics
        self.notifier = notifier

    def notify(
        self, event: NotifyEvent, target: Target, fields: Mapping[str, Any], now: float
    ) -> None:
        """Queue one webhook for `event` with the target's identity."""
        payload = {
            "event": str(event),  # a plain str to io/: the JSON and log bytes do not change
            "target": target.name,
            "url": shown_url(target.url),
            "timestamp": now,
            "wedgewatch_version": __version__,
            **{k: v for k, v in fields.items() if k != "target"},
        }
        self.notifier.notify(str(event), payload)

    def report(self, target: Target, effect: Report, now: float) -> None:
        """One `Report` effect of the episode core: its log line, metric and webhook."""
        fields = dict(effect.fields)
        self.count(target, effect.event, {**fields, **(effect.log_only or {})})
        getattr(log, effect.level)(str(effect.event), **fields, **(effect.log_only or {}))
        webhook = effect.notify
        if webhook is not None:
            self.notify(webhook, target, fields, now)

    def count(self, target: Target, event: ReportEvent, fields: Mapping[str, Any]) -> None:
        """The own-metrics counters a reported event moves (every event is decided here:
        a new or renamed `ReportEvent` fails mypy at `assert_never` until it is)."""
        name, family = target.name, str(fields.get("family") or "unknown")
        match event:
            case ReportEvent.STALL_SUSPECTED:
                self.metrics.count_suspect(name, family)
            case ReportEvent.WEDGE_DETECTED | ReportEvent.TARGET_UNREACHABLE:
                if "engine" in fields:  # an engine's transition, not "never came up"
                    self.metrics.count_wedge(name, family)
            case ReportEvent.RESTART_REQUESTED:
                self.metrics.count_restart(name, self.config.remedy)
            case ReportEvent.RESTART_FAILED:
                self.metrics.count_restart_failure(name, str(fields.get("reason")))
            case ReportEvent.RESTART_SUCCEEDED:
                if fields.get("reason") == "probe_restart":
                    self.metrics.count_restart(name, "probe")  # the kubelet's, proven (Q1)
            case ReportEvent.EVIDENCE_CAPTURED:
                duration = float(fields.get("duration_seconds") or 0.0)
                phase = str(fields["phase"])
                self.metrics.count_capture(name, phase=phase, duration_seconds=duration)
            case ReportEvent.EVIDENCE_CAPTURE_FAILED:
                for reason in fields.get("reasons") or ():
                    self.metrics.count_capture_failure(name, str(reason))
            case (
                ReportEvent.ENGINE_RECOVERED
                | ReportEvent.ENGINE_UNKNOWN
                | ReportEvent.ENGINE_DISCOVERED
                | ReportEvent.ENGINE_STATE_CHANGED
                | ReportEvent.EPISODE_OPENED
                | ReportEvent.EPISODE_CLOSED
                | ReportEvent.SUSPECT_CAPTURE_SKIPPED
                | ReportEvent.RESTART_SKIPPED
                | ReportEvent.RESTART_WAITING
                | ReportEvent.RESTART_DEFERRED
                | ReportEvent.RESTART_COMPLETED
                | ReportEvent.GAVE_UP
                | ReportEvent.GAVE_UP_CLEARED
                | ReportEvent.BACKOFF_RESET
                | ReportEvent.BUDGET_RESET
                | ReportEvent.ABORT_REQUESTED
                | ReportEvent.ABORT_SKIPPED
                | ReportEvent.ABORT_SUCCEEDED
                | ReportEvent.ABORT_FAILED
            ):
                pass  # no counter: the log line (a cure is counted from `Recovered`)
            case _:
                assert_never(event)

    def scrape(
        self,
        target: Target,
        previous: ScrapeFailed | None,
        failure: ScrapeFailed | None,
        failing_since: float | None,
        now: float,
    ) -> float | None:
        """Log a scrape failure when its reason changes and the recovery; the new failing_since."""
        if failure is not None:
            if previous is None or previous.reason != failure.reason:
                log.warning(
                    "scrape_failed",
                    target=target.name,
                    url=shown_url(target.metrics_url),
                    reason=failure.reason,
                    detail=failure.detail,
                )
            return now if previous is None else failing_since
        if previous is not None:
            log.info(
                "scrape_recovered",
                target=target.name,
                after_seconds=round(now - failing_since, 3) if failing_since is not None else None,
                last_reason=previous.reason,
            )
        return None

    def verdict_summary(
        self,
        target: Target,
        verdict: TargetVerdict,
        engine: EngineVerdict | None,
        now_at: float,
        now: float,
    ) -> dict[str, Any]:
        """The verdict as an evidence bundle records it."""
        return {
            "target": target.name,
            "url": shown_url(target.metrics_url),
            "state": str(engine.state if engine else verdict.state),
            "family": str(engine.family) if engine and engine.family else None,
            "reason": engine.reason if engine else None,
            "stalled_seconds": engine.stalled_seconds if engine else None,
            "since_timestamp": wall(engine.since_at, now_at, now) if engine else None,
            "last_progress_timestamp": (
                wall(engine.last_progress_at, now_at, now) if engine else None
            ),
            "verdict_timestamp": now,
            "thresholds": thresholds_of(self.config),
            "engines": [
                {
                    "model_name": e.key.model_name,
                    "engine": e.key.engine,
                    "state": str(e.state),
                    "family": str(e.family) if e.family else None,
                    "reason": e.reason,
                }
                for e in verdict.engines
            ],
            "remedy": self.config.remedy,
        }


def thresholds_of(config: Config) -> dict[str, float]:
    """The detector's thresholds and the scrape interval, by setting name (bundles, webhooks)."""
    policy = config.detection_policy()
    return {name: getattr(policy, name) for name in THRESHOLD_SETTINGS} | {
        "interval_seconds": config.interval_seconds
    }


def engine_samples(verdict: TargetVerdict, now_at: float, now: float) -> list[EngineSample]:
    """The per-engine gauges of wedgewatch's own metrics."""
    return [
        EngineSample(
            model_name=e.key.model_name,
            engine=e.key.engine,
            state=str(e.state),
            stalled_seconds=e.stalled_seconds if e.state in STALLED else 0.0,
            last_progress_timestamp=wall(e.last_progress_at, now_at, now),
        )
        for e in verdict.engines
    ]


class FlightRecorder:
    """The recent history of one target, bounded by entry count and by bytes.

    `max_entries` follows from `history_seconds`; `max_bytes` (`history_max_bytes`) counts
    each entry as the JSON line it becomes in an evidence bundle, so a body with many
    engines keeps fewer seconds instead of growing without bound. Oldest entries go first.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._entries: deque[tuple[Mapping[str, Any], int]] = deque()
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._bytes = 0

    def append(self, entry: Mapping[str, Any]) -> None:
        """Keep `entry`, dropping the oldest entries past either bound."""
        size = json_line_size(entry)
        self._entries.append((entry, size))
        self._bytes += size
        while len(self._entries) > 1 and (  # the newest entry is always kept
            len(self._entries) > self._max_entries or self._bytes > self._max_bytes
        ):
            _, dropped = self._entries.popleft()
            self._bytes -= dropped

    def entries(self) -> tuple[Mapping[str, Any], ...]:
        """The kept entries, oldest first."""
        return tuple(entry for entry, _ in self._entries)

    @property
    def size_bytes(self) -> int:
        """The JSON bytes of the kept entries."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


#: Encodes an entry as `history_lines` does but for the order of its keys, which does not
#: change the length: one encoder for every entry, and no sort.
_SIZE_ENCODER = json.JSONEncoder(allow_nan=False)


def json_line_size(entry: Mapping[str, Any]) -> int:
    """The bytes `history_lines` writes for `entry` (its JSON line)."""
    try:
        return len(_SIZE_ENCODER.encode(entry)) + 1  # ASCII (`ensure_ascii`), and a newline
    except (TypeError, ValueError):  # a non-finite float or a value json does not know
        return len(history_lines((entry,)))


def history_entry(
    verdict: TargetVerdict, now: float, failure: ScrapeFailed | None
) -> Mapping[str, Any]:
    """One step of the flight recorder an evidence bundle keeps."""
    entry: dict[str, Any] = {"timestamp": round(now, 3), "state": str(verdict.state)}
    if failure is not None:
        entry["failure"] = {"reason": failure.reason, "detail": failure.detail}
    engines = []
    for e in verdict.engines:
        item: dict[str, Any] = {
            "model_name": e.key.model_name,
            "engine": e.key.engine,
            "state": str(e.state),
        }
        if e.family is not None:
            item["family"] = str(e.family)
            item["stalled_seconds"] = round(e.stalled_seconds, 3)
        r = e.reading
        if r is not None:
            item.update(
                running=r.running,
                waiting=r.waiting,
                waiting_by_reason=dict(r.waiting_by_reason),
                kv_cache_usage=r.kv_cache_usage,
                awake=r.awake,
                prompt_tokens=r.prompt_tokens,
                generation_tokens=r.generation_tokens,
                request_success=r.request_success,
                finished_by_reason=dict(r.finished_by_reason),
                prefix_cache_queries=r.prefix_cache_queries,
                preemptions=r.preemptions,
                iterations=r.iterations,
            )
        engines.append(item)
    entry["engines"] = engines
    return entry


def shown_url(url: str) -> str:
    """A target URL as it may be printed: without credentials and query."""
    return redact_url(url)


class SecretScrubber:
    """A structlog processor: masks the secret parts of the configured URLs (webhook paths
    and queries, URL credentials) in every string of every log line, whatever put them
    there (an error message from a library, a detail that embeds a URL)."""

    def __init__(self, config: Config) -> None:
        self.fragments = (
            *secret_fragments(config.webhook_urls),
            *secret_fragments((t.url for t in config.targets), keep_path=True),
        )

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """Scrub the event dict in place."""
        if self.fragments:
            for key, value in event.items():
                event[key] = _scrub(value, self.fragments)
        return event


def _scrub(value: Any, fragments: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return scrub_text(value, fragments)
    if isinstance(value, Mapping):
        return {k: _scrub(v, fragments) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, fragments) for v in value]
    return value


def install_secret_scrubber(config: Config) -> None:
    """Put a `SecretScrubber` for `config` first in structlog's processor chain."""
    processors = [
        p for p in structlog.get_config()["processors"] if not isinstance(p, SecretScrubber)
    ]
    structlog.configure(processors=[SecretScrubber(config), *processors])


async def run_bundle_hook(hook: BundleHook, bundle: str, *, target: str, phase: str) -> str:
    """Run the `on_bundle` hook for a complete bundle and log how it went; its result."""
    outcome = await hook.run(Path(bundle), target=target, phase=phase)
    getattr(log, "info" if outcome.result == "ok" else "warning")(
        "bundle_hook_finished",
        target=target,
        bundle=bundle,
        result=outcome.result,
        detail=outcome.detail,
        duration_seconds=round(outcome.duration_seconds, 3),
    )
    return outcome.result
