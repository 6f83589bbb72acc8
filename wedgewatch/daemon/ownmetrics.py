"""wedgewatch's own Prometheus metrics, kept on an injected registry.

Nothing registers at import time: `OwnMetrics(registry, ...)` creates every family on the
registry it is given, so tests and several daemons in one process never collide. The
daemon is the only writer; the HTTP server renders the registry with `render`.

Names follow the Prometheus conventions (`wedgewatch_` prefix, `_total` for counters,
`_seconds` for durations, `_timestamp_seconds` for Unix times). docs/daemon.md documents
every family; tests/daemon/golden/ownmetrics.prom pins the exposition.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.samples import Sample

from wedgewatch.core.detection.canary import CANARY_FAILURE_REASONS
from wedgewatch.core.detection.states import CaptureFailureReason, CapturePhase
from wedgewatch.core.restart.restart_policy import FailureReason
from wedgewatch.core.text.redact import redact_text

# Buckets for how long an evidence capture takes: py-spy of a handful of processes
# normally finishes in a second or two; the goal is a complete bundle within 5 s.
CAPTURE_DURATION_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: Time to a canary's first token: an idle server answers in tens of milliseconds.
CANARY_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)

# Phases of an evidence capture: opened at suspect, completed at wedged, or on demand.
CAPTURE_PHASES = tuple(str(phase) for phase in CapturePhase)

# Why a restart failed: the remedy itself reported an error, it did not finish within its
# timeout, or the server did not come back healthy within startup_timeout_seconds.
RESTART_FAILURE_REASONS = tuple(str(reason) for reason in FailureReason)

# Why an evidence capture step failed (each reason is explained in `CaptureFailureReason`).
CAPTURE_FAILURE_REASONS = tuple(str(reason) for reason in CaptureFailureReason)


@dataclass(frozen=True, slots=True)
class EngineSample:
    """What the metrics say about one engine after a tick (plain values, no detector types)."""

    model_name: str
    engine: str
    state: str
    stalled_seconds: float
    last_progress_timestamp: float | None


class OwnMetrics:
    """Every wedgewatch metric family, created on `registry`, with small typed setters."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        version: str,
        states: Iterable[str],
        families: Iterable[str],
        scrape_failure_reasons: Iterable[str],
    ) -> None:
        self._states = tuple(str(s) for s in states)
        self._families = tuple(str(f) for f in families)
        self._scrape_failure_reasons = tuple(str(r) for r in scrape_failure_reasons)
        self._engines: dict[str, dict[tuple[str, str], str]] = {}

        self._build = Info(
            "wedgewatch_build",
            "wedgewatch build information; the value is always 1.",
            registry=registry,
        )
        self._build.info({"version": version})

        self._loop_last_tick = Gauge(
            "wedgewatch_loop_last_tick_timestamp_seconds",
            "Unix time at which the watch loop last completed a tick.",
            registry=registry,
        )
        self._loop_ticks = Counter(
            "wedgewatch_loop_ticks",
            "Watch loop ticks completed since wedgewatch started.",
            registry=registry,
        )

        self._target_up = Gauge(
            "wedgewatch_target_up",
            "1 when the last scrape of the target's /metrics succeeded and parsed, else 0.",
            ["target"],
            registry=registry,
        )
        self._scrape_duration = Gauge(
            "wedgewatch_scrape_duration_seconds",
            "Wall time the last scrape of the target's /metrics took, failed or not.",
            ["target"],
            registry=registry,
        )
        self._scrape_failures = Counter(
            "wedgewatch_scrape_failures",
            "Scrapes of the target's /metrics that failed, by reason.",
            ["target", "reason"],
            registry=registry,
        )
        self._target_state = Gauge(
            "wedgewatch_target_state",
            "Worst engine state of the target: 1 for the current state, 0 for the others.",
            ["target", "state"],
            registry=registry,
        )

        self._engine_state = Gauge(
            "wedgewatch_engine_state",
            "State of one engine: 1 for the current state, 0 for the others.",
            ["target", "model_name", "engine", "state"],
            registry=registry,
        )
        self._engine_stalled = Gauge(
            "wedgewatch_engine_stalled_seconds",
            "Seconds the engine has had work but made no progress (0 when not stalled).",
            ["target", "model_name", "engine"],
            registry=registry,
        )
        self._engine_last_progress = Gauge(
            "wedgewatch_engine_last_progress_timestamp_seconds",
            "Unix time at which the engine last showed progress (absent until it has).",
            ["target", "model_name", "engine"],
            registry=registry,
        )

        self._suspects = Counter(
            "wedgewatch_suspects",
            "Stall episodes that reached suspect (including ones that recovered), by family.",
            ["target", "family"],
            registry=registry,
        )
        self._wedges = Counter(
            "wedgewatch_wedges",
            "Stall episodes that reached wedged, by family.",
            ["target", "family"],
            registry=registry,
        )

        self._captures = Counter(
            "wedgewatch_evidence_captures",
            "Evidence bundle captures completed, by phase (suspect, wedged, manual).",
            ["target", "phase"],
            registry=registry,
        )
        self._capture_failures = Counter(
            "wedgewatch_evidence_capture_failures",
            "Evidence capture steps that failed, by reason (e.g. ptrace_denied, timeout).",
            ["target", "reason"],
            registry=registry,
        )
        self._capture_duration = Histogram(
            "wedgewatch_evidence_capture_duration_seconds",
            "Wall time an evidence capture took.",
            ["target"],
            buckets=CAPTURE_DURATION_BUCKETS,
            registry=registry,
        )

        self._restarts = Counter(
            "wedgewatch_restarts",
            "Restarts wedgewatch requested, by remedy.",
            ["target", "remedy"],
            registry=registry,
        )
        self._restart_failures = Counter(
            "wedgewatch_restart_failures",
            "Restarts that failed, by reason (remedy_error, timeout, not_recovered, not_replaced, "
            "not_vllm).",
            ["target", "reason"],
            registry=registry,
        )
        self._recoveries = Counter(
            "wedgewatch_recoveries",
            "Cures that ended, by cure (abort, restart) and outcome (recovered, failed, "
            "escalated).",
            ["target", "cure", "outcome"],
            registry=registry,
        )
        self._budget_remaining = Gauge(
            "wedgewatch_restart_budget_remaining",
            "Restarts still allowed in the current budget window.",
            ["target"],
            registry=registry,
        )
        self._gave_up = Gauge(
            "wedgewatch_gave_up",
            "1 when the restart budget is spent and wedgewatch only reports, else 0.",
            ["target"],
            registry=registry,
        )
        self._ready = Gauge(
            "wedgewatch_target_ready",
            "1 when /ready passes for the target (it should receive traffic), else 0.",
            ["target"],
            registry=registry,
        )

        self._canary_duration = Histogram(
            "wedgewatch_canary_duration_seconds",
            "Time from sending a canary to its first token (canaries that got one).",
            ["target"],
            buckets=CANARY_DURATION_BUCKETS,
            registry=registry,
        )
        self._canary_failures = Counter(
            "wedgewatch_canary_failures",
            "Canaries that got no token, by reason (timeout, refused, http_status, ...).",
            ["target", "reason"],
            registry=registry,
        )
        self._canary_last_success = Gauge(
            "wedgewatch_canary_last_success_timestamp_seconds",
            "Unix time at which a canary last got its first token (absent until one has).",
            ["target"],
            registry=registry,
        )

        self._webhook_failures = Counter(
            "wedgewatch_webhook_failures",
            "Webhook notifications that could not be delivered after their retries.",
            registry=registry,
        )
        self._registry = registry
        self._bundle_hooks: Counter | None = None  # `count_bundle_hook` creates it

        # Per-step updates touch a few series per target: their children are looked up once
        # (prometheus_client's `labels()` is the costly part), and an enum gauge is rewritten
        # only when its state changes; a gauge is set only when its value changes.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._values: dict[tuple[int, tuple[str, ...]], float] = {}
        self._enum_current: dict[tuple[int, tuple[str, ...]], str] = {}

    def _child(self, metric: Gauge, labels: tuple[str, ...]) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _set(self, metric: Gauge, labels: tuple[str, ...], value: float) -> None:
        key = (id(metric), labels)
        if self._values.get(key) == value:
            return
        self._child(metric, labels).set(value)
        self._values[key] = value

    def add_target(self, target: str, *, state: str, remedy: str, budget_remaining: int) -> None:
        """Create the target's series at their zero values so rates and alerts work from start."""
        self._set(self._target_up, (target,), 0)
        self._scrape_duration.labels(target)
        for reason in self._scrape_failure_reasons:
            self._scrape_failures.labels(target, reason)
        self._set_enum(self._target_state, (target,), state)
        for family in self._families:
            self._suspects.labels(target, family)
            self._wedges.labels(target, family)
        for phase in CAPTURE_PHASES:
            self._captures.labels(target, phase)
        self._restarts.labels(target, remedy)
        for reason in RESTART_FAILURE_REASONS:
            self._restart_failures.labels(target, reason)
        for reason in CAPTURE_FAILURE_REASONS:
            self._capture_failures.labels(target, reason)
        self._set(self._budget_remaining, (target,), budget_remaining)
        self._set(self._gave_up, (target,), 0)
        self._set(self._ready, (target,), 0)
        self._engines.setdefault(target, {})

    def mark_tick(self, timestamp: float) -> None:
        """Record a completed loop tick at Unix time `timestamp`."""
        self._loop_last_tick.set(timestamp)
        self._loop_ticks.inc()

    def observe_scrape(
        self, target: str, *, duration_seconds: float, failure_reason: str | None
    ) -> None:
        """Record one scrape: its duration and, when it failed, the reason."""
        self._child(self._scrape_duration, (target,)).set(duration_seconds)
        self._set(self._target_up, (target,), 0 if failure_reason is not None else 1)
        if failure_reason is not None:
            self._scrape_failures.labels(target, failure_reason).inc()

    def set_engines(self, target: str, state: str, engines: Sequence[EngineSample]) -> None:
        """Replace the target's per-engine series with `engines`; vanished engines lose theirs."""
        self._set_enum(self._target_state, (target,), state)
        previous = self._engines.get(target, {})
        current: dict[tuple[str, str], str] = {}
        for sample in engines:
            model_name = sample.model_name  # redacted where it leaves: `WithoutCreated`
            labels = (target, model_name, sample.engine)
            current[(model_name, sample.engine)] = sample.state
            self._set_enum(self._engine_state, labels, sample.state)
            self._set(self._engine_stalled, labels, sample.stalled_seconds)
            if sample.last_progress_timestamp is None:
                self._remove(self._engine_last_progress, labels)
            else:
                self._child(self._engine_last_progress, labels).set(sample.last_progress_timestamp)
        for (model_name, engine), last_state in previous.items():
            if (model_name, engine) in current:
                continue
            labels = (target, model_name, engine)
            for old_state in {*self._states, last_state}:
                self._remove(self._engine_state, (*labels, old_state))
            self._enum_current.pop((id(self._engine_state), labels), None)
            self._remove(self._engine_stalled, labels)
            self._remove(self._engine_last_progress, labels)
        self._engines[target] = current

    def count_suspect(self, target: str, family: str) -> None:
        """Count a stall episode that reached suspect."""
        self._suspects.labels(target, family).inc()

    def count_wedge(self, target: str, family: str) -> None:
        """Count a stall episode that reached wedged."""
        self._wedges.labels(target, family).inc()

    def count_capture(self, target: str, *, phase: str, duration_seconds: float) -> None:
        """Count a completed evidence capture and how long it took."""
        self._captures.labels(target, phase).inc()
        self._capture_duration.labels(target).observe(duration_seconds)

    def count_capture_failure(self, target: str, reason: str) -> None:
        """Count one failed capture step (a whole capture may fail several)."""
        self._capture_failures.labels(target, reason).inc()

    def count_restart(self, target: str, remedy: str) -> None:
        """Count a restart wedgewatch requested."""
        self._restarts.labels(target, remedy).inc()

    def count_recovery(self, target: str, cure: str, outcome: str) -> None:
        """A cure ended (the cure ladder's rule K1)."""
        self._recoveries.labels(target, cure, outcome).inc()

    def count_restart_failure(self, target: str, reason: str) -> None:
        """Count a restart that failed, by reason."""
        self._restart_failures.labels(target, reason).inc()

    def set_restart_budget(self, target: str, *, remaining: int, gave_up: bool) -> None:
        """Publish the remaining restart budget and whether wedgewatch gave up."""
        self._set(self._budget_remaining, (target,), remaining)
        self._set(self._gave_up, (target,), 1 if gave_up else 0)

    def set_ready(self, target: str, ready: bool) -> None:
        """Publish the target's readiness verdict (`core.readiness`, what /ready answers)."""
        self._set(self._ready, (target,), 1 if ready else 0)

    def add_canary(self, target: str) -> None:
        """Create the target's canary series at zero (only for targets with the canary on)."""
        self._canary_duration.labels(target)
        for reason in CANARY_FAILURE_REASONS:
            self._canary_failures.labels(target, reason)

    def observe_canary(
        self,
        target: str,
        *,
        first_token_seconds: float | None,
        failure_reason: str | None,
        success_timestamp: float | None,
    ) -> None:
        """Record one finished canary: its time to first token, or why it got none."""
        if first_token_seconds is not None:
            self._canary_duration.labels(target).observe(first_token_seconds)
        if failure_reason is not None:
            self._canary_failures.labels(target, failure_reason).inc()
        if success_timestamp is not None:
            self._canary_last_success.labels(target).set(success_timestamp)

    def count_webhook_failure(self) -> None:
        """Count a webhook notification that was dropped after its retries."""
        self._webhook_failures.inc()

    def count_bundle_hook(self, target: str, result: str) -> None:
        """Count one run of the `on_bundle` hook by how it ended (ok, failed, timeout)."""
        if self._bundle_hooks is None:  # created on first use: no series without a hook
            self._bundle_hooks = Counter(
                "wedgewatch_bundle_hook_runs",
                "Runs of the on_bundle hook, by result (ok, failed, timeout).",
                ["target", "result"],
                registry=self._registry,
            )
        self._bundle_hooks.labels(target, result).inc()

    def _set_enum(self, gauge: Gauge, labels: tuple[str, ...], current: str) -> None:
        key = (id(gauge), labels)
        if self._enum_current.get(key) == current:
            return
        states = self._states if current in self._states else (*self._states, current)
        for state in states:
            gauge.labels(*labels, state).set(1 if state == current else 0)
        self._enum_current[key] = current

    def _remove(self, metric: Gauge, labels: tuple[str, ...]) -> None:
        self._children.pop((id(metric), labels), None)
        self._values.pop((id(metric), labels), None)
        with contextlib.suppress(KeyError):  # the series was never set
            metric.remove(*labels)


#: The metric types whose samples prometheus_client pairs with a `<name>_created` series.
_CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class WithoutCreated:
    """A view of a registry without the `*_created` samples of its counters and histograms.

    prometheus_client adds one `_created` series (a creation timestamp) per labelled child:
    about 40 per target here, which no rule or dashboard reads. Its switches for that
    (`disable_created_metrics()`, `PROMETHEUS_DISABLE_CREATED_SERIES`) are process-wide; this
    view drops them from wedgewatch's own exposition only, for every text format.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        """The registry's families, with each `<family>_created` sample left out and every
        `model_name` label (the target's text) redacted: the one place the page leaves."""
        for family in self._registry.collect():
            if family.type in _CREATED_TYPES:
                created = f"{family.name}_created"
                family.samples = [s for s in family.samples if s.name != created]
            family.samples = [
                _redacted(s) if "model_name" in s.labels else s for s in family.samples
            ]
            yield family


def _redacted(sample: Sample) -> Sample:
    return sample._replace(
        labels={**sample.labels, "model_name": redact_text(sample.labels["model_name"])}
    )


def render(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """Render `registry` for a scrape: (body, content type), negotiated from `accept`; no
    `*_created` series (`WithoutCreated`)."""
    encoder, content_type = choose_encoder(accept)
    return encoder(WithoutCreated(registry)), content_type
