"""`wedgewatch run`: the watch loop, the one place where IO meets the detection core.

Every `interval_seconds` the loop scrapes all targets concurrently, folds each
observation into the pure detector (`detect.step`), logs one line per state change,
updates its own metrics, hands the detector's actions to a per-target worker, and
publishes an immutable `Snapshot` for the HTTP endpoints. The loop never waits for
evidence or a restart: each target has one worker task that runs its actions in order
(evidence before restart), each under a timeout, so the loop keeps ticking and
`/health` stays honest while py-spy or systemctl take their time.

Per target the daemon keeps one *episode*: it opens when any engine turns suspect,
wedged or unreachable, gets one evidence bundle (opened at suspect, completed at
wedged), at most one restart, and closes when every engine is calm again, or when a
restart resolves (`restart_succeeded` at the restarted server's first good scrape,
`restart_failed` otherwise).

After a restart the target's detector state is reset: the detector then reports the
target as `starting` until the first good scrape (or `unreachable` after
`startup_timeout_seconds`): that is the startup grace. The restart policy (budget,
back-off, give-up; `remedy`) is pure and decides at the moment a restart would run.

Restart budget, back-off, the open episode and the detector state survive a wedgewatch
restart through `statefile` (atomic writes). `run(config, deps)` is the composition root;
tests pass fakes (a fake clock replays a 30-minute story in milliseconds) and
`real_deps(config)` builds the real adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import re
import signal
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import structlog
from prometheus_client import CollectorRegistry

from wedgewatch import __version__
from wedgewatch.config import Config, Target, default_target_name, metrics_url_of
from wedgewatch.core import restart_policy
from wedgewatch.core.detect import (
    CaptureEvidence,
    EngineVerdict,
    Observation,
    Restart,
    Scraped,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    step,
)
from wedgewatch.core.detect_state import dump_state, load_state
from wedgewatch.core.states import (
    ACTED_ON,
    CALM,
    SCRAPE_FAILURE_REASONS,
    STALLED,
    THRESHOLD_SETTING,
    EngineState,
    Family,
)
from wedgewatch.daemon.ownmetrics import EngineSample, OwnMetrics
from wedgewatch.daemon.server import EngineSnapshot, HttpServer, Snapshot, TargetSnapshot, make_app
from wedgewatch.io import bundles, evidence, statefile
from wedgewatch.io.notify import Notification, NotifyEvent, WebhookNotifier
from wedgewatch.io.procs import Discovery, ProcessFinder, ProcessSelector, PsutilProcessFinder
from wedgewatch.io.restarters import (
    COMMAND_TIMEOUT_SECONDS,
    KILL_WAIT_SECONDS,
    ExecRestarter,
    Restarter,
    RestartRequest,
    SignalRestarter,
    SuperviseRestarter,
    Supervisor,
    SystemdRestarter,
)
from wedgewatch.io.scrape import FetchFailed, ScrapeLimits, fetch, new_client
from wedgewatch.io.systemd_notify import SystemdNotifier
from wedgewatch.vllm import signals
from wedgewatch.vllm.signals import EngineKey

log = structlog.get_logger("wedgewatch.daemon")

# A saved detector state is trusted only when the monotonic clock kept running between the
# save and the load (same boot): the wall and monotonic gaps may then differ by this much.
_SAME_BOOT_TOLERANCE_SECONDS = 60.0
# How often the state file is refreshed while nothing notable happens (detector clocks).
_PERSIST_EVERY_SECONDS = 30.0
# Extra time granted to an evidence capture beyond its py-spy deadlines (process sampling,
# nvidia-smi, writing files) before the daemon gives up waiting for it.
_CAPTURE_SLACK_SECONDS = 15.0
# Bodies at or above this size are parsed in a worker thread so the loop keeps ticking.
_THREAD_PARSE_BYTES = 512 * 1024


# ---------------------------------------------------------------------------------------------
# Roles (Protocols) and the data they exchange


class Clock(Protocol):
    """Monotonic seconds for durations; wall seconds (Unix time) for what humans read."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def wall(self) -> float:
        """Unix time."""
        ...


class Sleeper(Protocol):
    """Waits between ticks."""

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds` (a fake returns at once after advancing its clock)."""
        ...


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """One scrape: the observation for the detector, the raw body of a good one, its duration."""

    observation: Observation
    body: bytes | None
    duration_seconds: float


class Scraper(Protocol):
    """Scrapes a target's /metrics; failures come back as `ScrapeFailed` observations."""

    async def scrape(self, target: Target) -> ScrapeResult:
        """Scrape once; never raises for anything the server does."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """What an evidence capture needs to know: who, why, and what the loop has seen."""

    target: Target
    key: EngineKey
    family: str
    phase: Literal["suspect", "wedged"]
    episode_id: str
    bundle: str | None  # the bundle opened at suspect, to be completed; None opens one
    metrics_body: bytes | None
    history: tuple[Mapping[str, Any], ...]
    verdict: Mapping[str, Any]
    verdict_at: float | None = None


@dataclass(frozen=True, slots=True)
class CaptureOutcome:
    """What a capture produced: the bundle directory, failed steps (reasons), the triage."""

    bundle: str | None
    failures: tuple[str, ...] = ()
    triage: str | None = None
    detail: str = ""


class EvidenceCollector(Protocol):
    """Writes or completes an evidence bundle."""

    async def capture(self, request: CaptureRequest) -> CaptureOutcome:
        """Capture evidence; failures of single steps are reported in the outcome."""
        ...

    async def resolve(self, bundle: str, note: str) -> None:
        """Mark a suspect bundle whose episode ended without a wedge as routine."""
        ...


class Notifier(Protocol):
    """Sends notifications (webhooks) without blocking the caller."""

    def notify(self, event: str, payload: Mapping[str, Any]) -> None:
        """Queue one notification and return at once."""
        ...

    def failures(self) -> int:
        """Notifications given up on (after retries) since the start."""
        ...

    async def aclose(self, timeout_seconds: float) -> None:
        """Deliver what is queued within `timeout_seconds`, then drop the rest."""
        ...


class StateStore(Protocol):
    """Loads and saves the daemon's persistent state atomically (see statefile)."""

    def load(self) -> statefile.Loaded:
        """The saved state (empty on a first start; a problem string when it was corrupt)."""
        ...

    def save(
        self, state: statefile.SavedState, timestamp: float
    ) -> statefile.Saved | statefile.SaveFailed:
        """Replace the saved state atomically."""
        ...

    def take_resets(self) -> statefile.ResetRequests:
        """Operator requests to reset restart budgets, collected since the last call."""
        ...


class ServiceManager(Protocol):
    """The supervisor of wedgewatch itself (systemd's sd_notify, or nothing)."""

    @property
    def watchdog_seconds(self) -> float | None:
        """The supervisor's watchdog timeout, if any."""
        ...

    def ready(self, status: str = "") -> bool:
        """Startup finished."""
        ...

    def watchdog(self) -> bool:
        """The loop is alive."""
        ...

    def status(self, status: str) -> bool:
        """A one-line status for `systemctl status`."""
        ...

    def stopping(self, status: str = "") -> bool:
        """Shutdown began."""
        ...


@dataclass(frozen=True, slots=True)
class Deps:
    """Everything the daemon talks to; `real_deps(config)` builds the real ones."""

    clock: Clock
    sleeper: Sleeper
    scraper: Scraper
    evidence: EvidenceCollector
    restarters: Mapping[str, Restarter]  # by target name; empty for remedy "none"
    finder: ProcessFinder
    notifier: Notifier
    state_store: StateStore
    service: ServiceManager
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    serve_http: bool = True


# ---------------------------------------------------------------------------------------------
# Per-target bookkeeping (mutable, owned by the loop; workers touch it only between awaits)


@dataclass(slots=True)
class Episode:
    """One stall episode of a target: from the first stalled engine until all are calm."""

    episode_id: str
    key: EngineKey
    family: str
    opened_at: float
    opened_timestamp: float
    bundle: str | None = None
    suspect_requested: bool = False
    wedged_requested: bool = False
    restart_requested: bool = False
    restart_pending_since: float | None = None  # a restart waits for the back-off to pass
    triage: str | None = None
    scrape_failure: str | None = None  # the latest scrape failure reason seen in the episode


@dataclass(frozen=True, slots=True)
class _CaptureJob:
    key: EngineKey
    family: str
    phase: Literal["suspect", "wedged"]
    body: bytes | None
    verdict: Mapping[str, Any]
    verdict_at: float


@dataclass(frozen=True, slots=True)
class _ResolveJob:
    bundle: str
    note: str


@dataclass(frozen=True, slots=True)
class _RestartJob:
    key: EngineKey
    family: str
    reason: str


_Job = _CaptureJob | _RestartJob | _ResolveJob


@dataclass(slots=True)
class _TargetRuntime:
    target: Target
    detector: TargetState
    policy: restart_policy.PolicyState
    history: deque[Mapping[str, Any]]
    queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    worker: asyncio.Task[None] | None = None
    busy: str | None = None  # "capture" or "restart" while a job runs
    verdict: TargetVerdict | None = None
    last_body: bytes | None = None
    last_scrape_timestamp: float | None = None
    failure: ScrapeFailed | None = None
    failing_since_timestamp: float | None = None
    episode: Episode | None = None
    last_bundle: str | None = None
    restarts: int = 0
    ignore_before_at: float | None = None  # scrapes begun before a restart ended are stale
    target_state: EngineState = EngineState.STARTING


# ---------------------------------------------------------------------------------------------
# The daemon


class Daemon:
    """The watch loop over every configured target; see the module docstring."""

    def __init__(self, config: Config, deps: Deps) -> None:
        if not config.targets:
            raise ValueError("no targets to watch: give --target URL or targets in the config")
        self.config = config
        self.deps = deps
        self.policy = config.policy()
        self.restart_policy = restart_policy.RestartPolicy(
            restart_budget=config.restart_budget,
            restart_budget_window_seconds=config.restart_budget_window_seconds,
            restart_backoff_seconds=config.restart_backoff_seconds,
            restart_backoff_max_seconds=config.restart_backoff_max_seconds,
            startup_timeout_seconds=config.startup_timeout_seconds,
        )
        self.metrics = OwnMetrics(
            deps.registry,
            version=__version__,
            states=tuple(EngineState),
            families=tuple(Family),
            scrape_failure_reasons=SCRAPE_FAILURE_REASONS,
        )
        self.capture_timeout_seconds = capture_deadline_seconds(config) + _CAPTURE_SLACK_SECONDS
        self.restart_timeout_seconds = (
            max(config.grace_seconds + KILL_WAIT_SECONDS, COMMAND_TIMEOUT_SECONDS) + 30.0
        )
        history_len = max(2, math.ceil(config.history_seconds / config.interval_seconds) + 1)
        now_at = deps.clock.monotonic()
        self._targets = {
            t.name: _TargetRuntime(
                target=t,
                detector=TargetState.initial(),
                policy=restart_policy.PolicyState(),
                history=deque(maxlen=history_len),
            )
            for t in config.targets
        }
        self._started_at = now_at
        self._started_timestamp = deps.clock.wall()
        self._ticks = 0
        self._last_tick_at: float | None = None
        self._last_tick_timestamp: float | None = None
        self._last_persist_at = now_at
        self._dirty = False
        self._stopping = False
        self._webhook_failures = 0
        self.health_stale_after_seconds = (
            3 * config.interval_seconds + config.scrape_timeout_seconds
        )
        self._published = self._build_snapshot()

    # -- public surface -------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        """The latest published snapshot (replaced whole after every tick)."""
        return self._published

    def jobs_pending(self) -> int:
        """Evidence captures and restarts queued or running, over all targets."""
        return sum(rt.queue.qsize() + (rt.busy is not None) for rt in self._targets.values())

    def restore(self) -> None:
        """Load persisted state: restart policy always; detector and episode if same boot."""
        loaded = self.deps.state_store.load()
        if loaded.problem is not None:
            log.warning("state_file_reset", reason=loaded.problem)
        saved = loaded.state
        at, now = self.deps.clock.monotonic(), self.deps.clock.wall()
        for name, rt in self._targets.items():
            record = saved.targets.get(name)
            if record is None:
                continue
            if record.restart_policy is not None:
                rt.policy = restart_policy.from_record(
                    record.restart_policy, self.restart_policy, at, now
                )
            restored = self._restore_detector(rt, record.detector, at, now)
            if restored and record.open_episodes:
                episode = record.open_episodes[0]
                rt.episode = Episode(
                    episode_id=episode.episode_id,
                    key=EngineKey(episode.model_name, episode.engine),
                    family=episode.family,
                    opened_at=at - max(now - episode.opened_timestamp, 0.0),
                    opened_timestamp=episode.opened_timestamp,
                    bundle=episode.bundle_path,
                    suspect_requested=episode.bundle_path is not None,
                )
                rt.last_bundle = episode.bundle_path
            log.info(
                "state_restored",
                target=name,
                restart_phase=str(rt.policy.phase),
                restart_budget_remaining=restart_policy.budget_remaining(
                    rt.policy, self.restart_policy, at
                ),
                detector_restored=restored,
                episode=rt.episode.episode_id if rt.episode else None,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until `stop` is set, then shut down cleanly."""
        for name, rt in self._targets.items():
            self.metrics.add_target(
                name,
                state=str(EngineState.STARTING),
                remedy=self.config.remedy,
                budget_remaining=self._budget(rt),
            )
            rt.worker = asyncio.create_task(self._work(rt), name=f"wedgewatch-worker-{name}")
        clock = self.deps.clock
        next_at = clock.monotonic()
        try:
            while not stop.is_set():
                await self.tick()
                next_at += self.config.interval_seconds
                now_at = clock.monotonic()
                next_at = max(next_at, now_at)  # after a slow tick: skip, never burst
                await self._wait(next_at - now_at, stop)
        finally:
            await self._shutdown(stop)

    async def tick(self) -> None:
        """Scrape every target once, judge, act, publish."""
        results = await asyncio.gather(
            *(self.deps.scraper.scrape(rt.target) for rt in self._targets.values())
        )
        clock = self.deps.clock
        now_at, now = clock.monotonic(), clock.wall()
        resets = self.deps.state_store.take_resets()
        for rt, result in zip(self._targets.values(), results, strict=True):
            if resets.covers(rt.target.name):
                self._apply_policy_step(rt, restart_policy.reset(rt.policy, now_at, now))
            self._apply(rt, result, now_at, now)
        self._ticks += 1
        self._last_tick_at, self._last_tick_timestamp = now_at, now
        self.metrics.mark_tick(now)
        failures = self.deps.notifier.failures()
        for _ in range(failures - self._webhook_failures):
            self.metrics.count_webhook_failure()
        self._webhook_failures = failures
        self.deps.service.watchdog()
        if self._dirty or now_at - self._last_persist_at >= _PERSIST_EVERY_SECONDS:
            self._persist(now_at, now)
        self._published = self._build_snapshot()

    # -- one target, one observation ------------------------------------------------------

    def _apply(self, rt: _TargetRuntime, result: ScrapeResult, now_at: float, now: float) -> None:
        obs = result.observation
        name = rt.target.name
        if rt.ignore_before_at is not None and obs.at < rt.ignore_before_at:
            return  # begun before the restart finished: it saw the old server
        failure = obs if isinstance(obs, ScrapeFailed) else None
        self.metrics.observe_scrape(
            name,
            duration_seconds=result.duration_seconds,
            failure_reason=failure.reason if failure else None,
        )
        self._log_scrape(rt, failure, now)
        if failure is None:
            rt.last_body = result.body
            rt.last_scrape_timestamp = now

        rt.detector, verdict = step(rt.detector, obs, self.policy)
        rt.verdict = verdict
        self._log_transitions(rt, verdict, now_at, now)
        self._track_episode(rt, verdict, now_at, now)
        if rt.episode is not None and failure is not None:
            rt.episode.scrape_failure = failure.reason
        for action in verdict.actions:
            self._on_action(rt, verdict, action, now_at)

        if isinstance(obs, Scraped):
            self._apply_policy_step(
                rt, restart_policy.record_good_scrape(rt.policy, self.restart_policy, now_at, now)
            )
        healthy = bool(verdict.engines) and verdict.state in CALM
        self._apply_policy_step(
            rt,
            restart_policy.record_tick(
                rt.policy, self.restart_policy, now_at, now, healthy=healthy
            ),
        )
        self._maybe_retry_restart(rt, verdict, now_at)

        if verdict.state is not rt.target_state:
            if not verdict.engines and verdict.state is EngineState.UNREACHABLE:
                log.error(
                    "target_unreachable",
                    target=name,
                    reason="no good scrape within startup_timeout_seconds "
                    f"({self.config.startup_timeout_seconds:g} s)",
                    detail=failure.detail if failure else None,
                )
            rt.target_state = verdict.state
            self.deps.service.status(self._status_line())
        self.metrics.set_engines(
            name, str(verdict.state), self._engine_samples(verdict, now_at, now)
        )
        self.metrics.set_restart_budget(
            name,
            remaining=self._budget(rt),
            gave_up=rt.policy.phase is restart_policy.Phase.GAVE_UP,
        )
        rt.history.append(_history_entry(verdict, now, failure))

    def _log_scrape(self, rt: _TargetRuntime, failure: ScrapeFailed | None, now: float) -> None:
        name = rt.target.name
        previous = rt.failure
        if failure is not None:
            if previous is None or previous.reason != failure.reason:
                log.warning(
                    "scrape_failed",
                    target=name,
                    url=rt.target.metrics_url,
                    reason=failure.reason,
                    detail=failure.detail,
                )
            if previous is None:
                rt.failing_since_timestamp = now
        elif previous is not None:
            since = rt.failing_since_timestamp
            log.info(
                "scrape_recovered",
                target=name,
                after_seconds=round(now - since, 3) if since is not None else None,
                last_reason=previous.reason,
            )
            rt.failing_since_timestamp = None
        rt.failure = failure

    def _log_transitions(
        self, rt: _TargetRuntime, verdict: TargetVerdict, now_at: float, now: float
    ) -> None:
        by_key = {e.key: e for e in verdict.engines}
        for transition in verdict.transitions:
            engine = by_key.get(transition.key)
            fields: dict[str, Any] = {
                "target": rt.target.name,
                "model_name": transition.key.model_name,
                "engine": transition.key.engine,
                "state": str(transition.new),
                "previous": str(transition.old),
            }
            if transition.family is not None:
                fields["family"] = str(transition.family)
            if engine is not None:
                fields["reason"] = engine.reason
                if transition.new in STALLED:
                    fields["stalled_seconds"] = round(engine.stalled_seconds, 3)
                    fields["threshold_seconds"] = self.policy.threshold(
                        transition.family or Family.UNREACHABLE
                    )
            if transition.new in ACTED_ON:
                # What tells an engine crash (refused: the server is gone) from an API hang
                # (timeout: the port accepts, nothing answers), and what the stacks said.
                if transition.family is Family.UNREACHABLE and rt.failure is not None:
                    fields["scrape_failure"] = rt.failure.reason
                if rt.episode is not None and rt.episode.triage is not None:
                    fields["triage"] = rt.episode.triage
            new, old = transition.new, transition.old
            family = str(transition.family) if transition.family else "unknown"
            if new is EngineState.SUSPECT and old not in STALLED:
                self.metrics.count_suspect(rt.target.name, family)
                log.warning("stall_suspected", **fields)
            elif new is EngineState.WEDGED:
                self.metrics.count_wedge(rt.target.name, family)
                log.error("wedge_detected", remedy=self.config.remedy, **fields)
                self._notify("wedge_detected", rt, fields)
            elif new is EngineState.UNREACHABLE:
                self.metrics.count_wedge(rt.target.name, family)
                log.error("target_unreachable", remedy=self.config.remedy, **fields)
                self._notify("target_unreachable", rt, fields)
            elif old in STALLED and new in CALM:
                episode = rt.episode
                if episode is not None:
                    fields["stalled_for_seconds"] = round(now_at - episode.opened_at, 3)
                log.info("engine_recovered", **fields)
                self._notify("engine_recovered", rt, fields)
            elif old is EngineState.STARTING:
                log.info("engine_discovered", **fields)
            elif EngineState.SLEEPING in (old, new):
                log.info("engine_state_changed", **fields)
            else:
                log.debug("engine_state_changed", **fields)

    def _track_episode(
        self, rt: _TargetRuntime, verdict: TargetVerdict, now_at: float, now: float
    ) -> None:
        stalled = [e for e in verdict.engines if e.state in STALLED]
        episode = rt.episode
        if episode is None and stalled:
            worst = min(stalled, key=lambda e: (e.state is not EngineState.WEDGED, e.key))
            family = str(worst.family) if worst.family else "unknown"
            rt.episode = Episode(
                episode_id=_episode_id(rt.target.name, worst.key, family, now),
                key=worst.key,
                family=family,
                opened_at=now_at,
                opened_timestamp=now,
            )
            self._dirty = True
            log.info(
                "episode_opened",
                target=rt.target.name,
                episode=rt.episode.episode_id,
                engine=worst.key.engine,
                model_name=worst.key.model_name,
                family=family,
            )
            return
        restart_phases = (restart_policy.Phase.RESTARTING, restart_policy.Phase.STARTING)
        calm = bool(verdict.engines) and not stalled
        if episode is not None and calm and rt.policy.phase not in restart_phases:
            self._close_episode(rt, "recovered", now_at)

    def _close_episode(self, rt: _TargetRuntime, outcome: str, now_at: float) -> None:
        episode = rt.episode
        if episode is None:
            return
        log.info(
            "episode_closed",
            target=rt.target.name,
            episode=episode.episode_id,
            outcome=outcome,
            duration_seconds=round(now_at - episode.opened_at, 3),
            bundle=episode.bundle,
        )
        if outcome == "recovered" and episode.suspect_requested and not episode.wedged_requested:
            # Queued behind the suspect capture, so it sees the finished bundle.
            rt.queue.put_nowait(_ResolveJob(episode.bundle or "", "the engine recovered"))
        rt.episode = None
        self._dirty = True

    def _on_action(
        self,
        rt: _TargetRuntime,
        verdict: TargetVerdict,
        action: CaptureEvidence | Restart,
        now_at: float,
    ) -> None:
        episode = rt.episode
        if episode is None:  # an action always comes with a stalled engine, hence an episode
            return
        engine = next((e for e in verdict.engines if e.key == action.key), None)
        summary = self._verdict_summary(rt, verdict, engine)
        if isinstance(action, CaptureEvidence):
            if action.phase == "suspect":
                if episode.suspect_requested or episode.wedged_requested:
                    return
                episode.suspect_requested = True
            else:
                if episode.wedged_requested:
                    return
                episode.wedged_requested = True
            rt.queue.put_nowait(
                _CaptureJob(
                    action.key, str(action.family), action.phase, rt.last_body, summary, now_at
                )
            )
            return
        if episode.restart_requested:
            return
        episode.restart_requested = True
        reason = engine.reason if engine is not None else str(action.family)
        if rt.target.name not in self.deps.restarters:
            why = (
                'remedy = "none" (observe mode): reporting only'
                if self.config.remedy == "none"
                else f"no {self.config.remedy} restarter for this target"
            )
            log.info(
                "restart_skipped", target=rt.target.name, episode=episode.episode_id, reason=why
            )
            return
        rt.queue.put_nowait(_RestartJob(action.key, str(action.family), reason))

    def _maybe_retry_restart(
        self, rt: _TargetRuntime, verdict: TargetVerdict, now_at: float
    ) -> None:
        """A restart deferred by the back-off runs once it may, if the target still needs it."""
        episode = rt.episode
        if episode is None or episode.restart_pending_since is None or rt.busy is not None:
            return
        not_before = rt.policy.not_before_at
        if not_before is not None and now_at < not_before:
            return
        if verdict.state not in ACTED_ON:
            episode.restart_pending_since = None
            return
        worst = next((e for e in verdict.engines if e.state in ACTED_ON), None)
        key = worst.key if worst is not None else episode.key
        reason = worst.reason if worst is not None else episode.family
        episode.restart_pending_since = None
        rt.queue.put_nowait(_RestartJob(key, episode.family, reason))

    def _apply_policy_step(self, rt: _TargetRuntime, result: restart_policy.Step) -> None:
        rt.policy = result.state
        for event in result.events:
            self._dirty = True
            fields: dict[str, Any] = {
                "target": rt.target.name,
                "reason": event.reason,
                "detail": event.detail,
            }
            if rt.verdict is not None:
                fields["state"] = str(rt.verdict.state)
            episode = rt.episode
            if episode is not None:
                fields.update(
                    episode=episode.episode_id,
                    engine=episode.key.engine,
                    model_name=episode.key.model_name,
                    family=episode.family,
                    bundle=episode.bundle,
                )
            kind = event.kind
            if kind is restart_policy.PolicyEventKind.RESTART_FAILED:
                self.metrics.count_restart_failure(rt.target.name, event.reason)
                if event.reason == restart_policy.FailureReason.NOT_RECOVERED:
                    log.error("restart_failed", **fields)
                    rt.ignore_before_at = None
                    self._close_episode(rt, "restart_failed", event.at)
                else:
                    # The remedy itself failed (error, timeout): the server is still the
                    # stalled one, so try again once the back-off allows, within the budget.
                    log.error("restart_failed", retry="after the back-off", **fields)
                    if episode is not None:
                        episode.restart_pending_since = event.at
            elif kind is restart_policy.PolicyEventKind.RESTART_SUCCEEDED:
                log.info("restart_succeeded", **fields)
                self._close_episode(rt, "restarted", event.at)
            elif kind is restart_policy.PolicyEventKind.GAVE_UP:
                log.error("gave_up", **fields)
            else:
                log.info(str(kind), **fields)
            self._notify(str(kind), rt, fields)

    # -- the per-target worker: evidence, then restart ----------------------------------------

    async def _work(self, rt: _TargetRuntime) -> None:
        while True:
            job = await rt.queue.get()
            try:
                if isinstance(job, _CaptureJob):
                    rt.busy = "capture"
                    await self._capture(rt, job)
                elif isinstance(job, _ResolveJob):
                    rt.busy = "resolve"
                    bundle = job.bundle or rt.last_bundle
                    if bundle is not None:
                        await self.deps.evidence.resolve(bundle, job.note)
                else:
                    rt.busy = "restart"
                    await self._restart(rt, job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in an adapter must not kill the worker
                log.exception("worker_error", target=rt.target.name, error=repr(exc))
            finally:
                rt.busy = None
                rt.queue.task_done()

    async def _capture(self, rt: _TargetRuntime, job: _CaptureJob) -> None:
        clock = self.deps.clock
        episode = rt.episode
        episode_id = (
            episode.episode_id
            if episode
            else _episode_id(rt.target.name, job.key, job.family, clock.wall())
        )
        request = CaptureRequest(
            target=rt.target,
            key=job.key,
            family=job.family,
            phase=job.phase,
            episode_id=episode_id,
            bundle=episode.bundle if episode else None,
            metrics_body=job.body,
            history=tuple(rt.history),
            verdict=job.verdict,
            verdict_at=job.verdict_at,
        )
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.capture_timeout_seconds):
                outcome = await self.deps.evidence.capture(request)
        except TimeoutError:
            outcome = CaptureOutcome(
                bundle=request.bundle,
                failures=("timeout",),
                detail=f"evidence capture did not finish within {self.capture_timeout_seconds:g} s",
            )
        except (OSError, ValueError) as exc:
            outcome = CaptureOutcome(
                bundle=request.bundle, failures=("error",), detail=f"evidence capture failed: {exc}"
            )
        duration = time.monotonic() - started
        name = rt.target.name
        for reason in outcome.failures:
            self.metrics.count_capture_failure(name, reason)
        if outcome.bundle is not None:
            rt.last_bundle = outcome.bundle
            if rt.episode is not None and rt.episode.episode_id == episode_id:
                rt.episode.bundle = outcome.bundle
                rt.episode.triage = outcome.triage or rt.episode.triage
            self._dirty = True
        fields = {
            "target": name,
            "episode": episode_id,
            "phase": job.phase,
            "family": job.family,
            "engine": job.key.engine,
            "model_name": job.key.model_name,
            "bundle": outcome.bundle,
            "triage": outcome.triage,
            "scrape_failure": rt.episode.scrape_failure if rt.episode else None,
            "duration_seconds": round(duration, 3),
        }
        if outcome.bundle is not None:
            self.metrics.count_capture(name, phase=job.phase, duration_seconds=duration)
            log.info(
                "evidence_captured",
                failures=list(outcome.failures),
                detail=outcome.detail or None,
                **fields,
            )
            self._notify("evidence_captured", rt, fields)
        if outcome.failures:
            log.warning(
                "evidence_capture_failed",
                reasons=list(outcome.failures),
                detail=outcome.detail,
                **fields,
            )

    async def _restart(self, rt: _TargetRuntime, job: _RestartJob) -> None:
        restarter = self.deps.restarters.get(rt.target.name)
        if restarter is None:
            return
        clock = self.deps.clock
        name = rt.target.name
        episode = rt.episode
        verdict = rt.verdict
        if verdict is None or verdict.state not in ACTED_ON:
            log.info(
                "restart_skipped",
                target=name,
                reason="the target recovered before the restart could run",
            )
            return
        at, now = clock.monotonic(), clock.wall()
        decision, result = restart_policy.decide(rt.policy, self.restart_policy, at, now)
        self._apply_policy_step(rt, result)
        if isinstance(decision, restart_policy.Deny):
            if decision.reason is restart_policy.DenyReason.BACKOFF and episode is not None:
                episode.restart_pending_since = at
                log.info("restart_deferred", target=name, reason=decision.detail)
            elif not result.events:  # a fresh gave_up was just logged with its reason
                log.info("restart_skipped", target=name, reason=decision.detail)
            self.metrics.set_restart_budget(
                name,
                remaining=self._budget(rt),
                gave_up=rt.policy.phase is restart_policy.Phase.GAVE_UP,
            )
            return
        rt.restarts += 1
        self.metrics.count_restart(name, self.config.remedy)
        self.metrics.set_restart_budget(name, remaining=self._budget(rt), gave_up=False)
        self._persist(at, now)  # the attempt counts against the budget even if we die now
        discovery = await self._discover(rt.target)
        request = RestartRequest(
            target=name,
            url=rt.target.url,
            model_name=job.key.model_name,
            engine=job.key.engine,
            family=job.family,
            state=str(verdict.state),
            reason=job.reason,
            bundle=Path(episode.bundle) if episode and episode.bundle else None,
            server_pid=discovery.root_pid,
        )
        fields = {
            "target": name,
            "remedy": self.config.remedy,
            "attempt": decision.attempt,
            "restart_budget": self.config.restart_budget,
            "server_pid": discovery.root_pid,
            "family": job.family,
            "engine": job.key.engine,
            "reason": job.reason,
        }
        log.warning("restart_requested", **fields)
        self._notify("restart_requested", rt, fields)
        try:
            async with asyncio.timeout(self.restart_timeout_seconds):
                outcome = await restarter.restart(request)
        except TimeoutError:
            outcome = restart_policy.RestartOutcome(
                False,
                f"the {self.config.remedy} remedy did not finish within "
                f"{self.restart_timeout_seconds:g} s",
                self.restart_timeout_seconds,
                restart_policy.FailureReason.TIMEOUT,
            )
        at, now = clock.monotonic(), clock.wall()
        self._apply_policy_step(
            rt, restart_policy.record_restart(rt.policy, self.restart_policy, at, now, outcome)
        )
        if outcome.ok:
            # The startup grace: a fresh detector reports `starting` until the first good
            # scrape; scrapes begun before this instant saw the old server and are dropped.
            rt.detector = TargetState.initial()
            rt.ignore_before_at = at
            rt.failure = None
            log.info(
                "restart_completed",
                target=name,
                detail=outcome.detail,
                duration_seconds=round(outcome.duration_seconds, 3),
                waiting_up_to_seconds=self.config.startup_timeout_seconds,
            )
        self._persist(at, now)

    async def _discover(self, target: Target) -> Discovery:
        selector = ProcessSelector(url=target.url, pid=target.pid, pid_file=target.pid_file)
        try:
            async with asyncio.timeout(10):
                return await asyncio.to_thread(self.deps.finder.discover, selector)
        except TimeoutError:
            return Discovery(selector.describe(), None, (), error="process discovery timed out")

    # -- shutdown ---------------------------------------------------------------------------

    async def _wait(self, seconds: float, stop: asyncio.Event) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        sleeper = asyncio.ensure_future(self.deps.sleeper.sleep(seconds))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _shutdown(self, stop: asyncio.Event) -> None:
        """Let an in-flight capture or restart finish (or time out); drop queued jobs."""
        self._stopping = True
        for rt in self._targets.values():
            dropped = 0
            while not rt.queue.empty():
                rt.queue.get_nowait()
                rt.queue.task_done()
                dropped += 1
            if dropped:
                log.info("jobs_dropped", target=rt.target.name, count=dropped)
        workers = [rt.worker for rt in self._targets.values() if rt.worker is not None]
        busy = [rt for rt in self._targets.values() if rt.busy is not None]
        if busy:
            log.info("waiting_for_jobs", targets=[rt.target.name for rt in busy])
            limit = max(self.capture_timeout_seconds, self.restart_timeout_seconds)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await asyncio.gather(*(rt.queue.join() for rt in busy))
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        clock = self.deps.clock
        self._persist(clock.monotonic(), clock.wall())

    # -- persistence ---------------------------------------------------------------------------

    def _restore_detector(
        self, rt: _TargetRuntime, saved: Mapping[str, Any] | None, at: float, now: float
    ) -> bool:
        if saved is None:
            return False
        try:
            if saved.get("url") != rt.target.metrics_url:
                return False  # the name now points at another server
            saved_at, saved_timestamp = float(saved["saved_at"]), float(saved["saved_timestamp"])
            drift = abs((now - saved_timestamp) - (at - saved_at))
            if at < saved_at or drift > _SAME_BOOT_TOLERANCE_SECONDS:
                return False  # another boot: monotonic instants mean nothing now
            rt.detector = load_state(saved["state"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("detector_state_ignored", target=rt.target.name, reason=str(exc))
            return False
        return True

    def _persist(self, at: float, now: float) -> None:
        targets: dict[str, statefile.TargetRecord] = {}
        for name, rt in self._targets.items():
            episode = rt.episode
            episodes: tuple[statefile.OpenEpisode, ...] = ()
            if episode is not None:
                episodes = (
                    statefile.OpenEpisode(
                        episode_id=episode.episode_id,
                        model_name=episode.key.model_name,
                        engine=episode.key.engine,
                        family=episode.family,
                        opened_timestamp=episode.opened_timestamp,
                        bundle_path=episode.bundle,
                    ),
                )
            targets[name] = statefile.TargetRecord(
                restart_policy=restart_policy.to_record(rt.policy, at, now),
                open_episodes=episodes,
                detector={
                    "url": rt.target.metrics_url,
                    "saved_at": at,
                    "saved_timestamp": now,
                    "state": dump_state(rt.detector),
                },
            )
        result = self.deps.state_store.save(statefile.SavedState(targets=targets), now)
        if isinstance(result, statefile.SaveFailed):
            log.error("state_save_failed", reason=result.message)
        self._last_persist_at = at
        self._dirty = False

    # -- snapshot, metrics, notifications -------------------------------------------------------

    def _budget(self, rt: _TargetRuntime) -> int:
        return restart_policy.budget_remaining(
            rt.policy, self.restart_policy, self.deps.clock.monotonic()
        )

    def _wall(self, at: float | None, now_at: float, now: float) -> float | None:
        return None if at is None else now - (now_at - at)

    def _engine_samples(
        self, verdict: TargetVerdict, now_at: float, now: float
    ) -> list[EngineSample]:
        return [
            EngineSample(
                model_name=e.key.model_name,
                engine=e.key.engine,
                state=str(e.state),
                stalled_seconds=e.stalled_seconds if e.state in STALLED else 0.0,
                last_progress_timestamp=self._wall(e.last_progress_at, now_at, now),
            )
            for e in verdict.engines
        ]

    def _verdict_summary(
        self, rt: _TargetRuntime, verdict: TargetVerdict, engine: EngineVerdict | None
    ) -> dict[str, Any]:
        clock = self.deps.clock
        now_at, now = clock.monotonic(), clock.wall()
        return {
            "target": rt.target.name,
            "url": rt.target.metrics_url,
            "state": str(engine.state if engine else verdict.state),
            "family": str(engine.family) if engine and engine.family else None,
            "reason": engine.reason if engine else None,
            "stalled_seconds": engine.stalled_seconds if engine else None,
            "since_timestamp": self._wall(engine.since_at, now_at, now) if engine else None,
            "last_progress_timestamp": (
                self._wall(engine.last_progress_at, now_at, now) if engine else None
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

    def _notify(self, event: str, rt: _TargetRuntime, fields: Mapping[str, Any]) -> None:
        payload = {
            "event": event,
            "target": rt.target.name,
            "url": rt.target.url,
            "timestamp": self.deps.clock.wall(),
            "wedgewatch_version": __version__,
            **{k: v for k, v in fields.items() if k != "target"},
        }
        self.deps.notifier.notify(event, payload)

    def _status_line(self) -> str:
        states = ", ".join(f"{n}={rt.target_state}" for n, rt in self._targets.items())
        return f"watching {len(self._targets)} target(s): {states}"

    def _build_snapshot(self) -> Snapshot:
        clock = self.deps.clock
        now_at, now = clock.monotonic(), clock.wall()
        targets: dict[str, TargetSnapshot] = {}
        for name, rt in self._targets.items():
            verdict = rt.verdict
            engines = tuple(
                EngineSnapshot(
                    model_name=e.key.model_name,
                    engine=e.key.engine,
                    state=str(e.state),
                    family=str(e.family) if e.family else None,
                    since_timestamp=self._wall(e.since_at, now_at, now),
                    stalled_seconds=e.stalled_seconds if e.state in STALLED else 0.0,
                    last_progress_timestamp=self._wall(e.last_progress_at, now_at, now),
                    reason=e.reason,
                    missing=e.missing,
                    reading=e.reading,
                )
                for e in (verdict.engines if verdict else ())
            )
            episode = rt.episode
            not_before = rt.policy.not_before_at
            targets[name] = TargetSnapshot(
                name=name,
                url=rt.target.metrics_url,
                state=str(verdict.state if verdict else EngineState.STARTING),
                reason=_target_reason(rt, verdict),
                up=rt.failure is None and verdict is not None,
                last_scrape_timestamp=rt.last_scrape_timestamp,
                last_scrape_error=(
                    f"{rt.failure.reason}: {rt.failure.detail}" if rt.failure else None
                ),
                engines=engines,
                remedy=self.config.remedy,
                restarts=rt.restarts,
                restart_budget_remaining=self._budget(rt),
                gave_up=rt.policy.phase is restart_policy.Phase.GAVE_UP,
                restart_in_progress=rt.busy == "restart"
                or rt.policy.phase
                in (restart_policy.Phase.RESTARTING, restart_policy.Phase.STARTING),
                next_restart_allowed_timestamp=(
                    self._wall(not_before, now_at, now)
                    if not_before is not None and not_before > now_at
                    else None
                ),
                last_bundle=rt.last_bundle,
                episode=(
                    {
                        "id": episode.episode_id,
                        "engine": episode.key.engine,
                        "model_name": episode.key.model_name,
                        "family": episode.family,
                        "opened_timestamp": episode.opened_timestamp,
                        "bundle": episode.bundle,
                        "triage": episode.triage,
                        "scrape_failure": episode.scrape_failure,
                        "restart_requested": episode.restart_requested,
                    }
                    if episode
                    else None
                ),
            )
        return Snapshot(
            version=__version__,
            started_at=self._started_at,
            started_timestamp=self._started_timestamp,
            health_stale_after_seconds=self.health_stale_after_seconds,
            last_tick_at=self._last_tick_at,
            last_tick_timestamp=self._last_tick_timestamp,
            ticks=self._ticks,
            targets=targets,
        )


def _target_reason(rt: _TargetRuntime, verdict: TargetVerdict | None) -> str:
    """One sentence for /probe: why the target is in its state."""
    if verdict is None:
        return "not scraped yet"
    if rt.policy.phase is restart_policy.Phase.STARTING:
        return "restarted; waiting for the first good scrape (startup grace)"
    worst = [e for e in verdict.engines if e.state is verdict.state]
    if worst:
        return "; ".join(
            f"engine {e.key.engine} ({e.key.model_name}) {e.state}: {e.reason}" for e in worst
        )
    if verdict.failure is not None:
        prefix = "unreachable" if verdict.state is EngineState.UNREACHABLE else "starting"
        return f"{prefix}: {verdict.failure.reason}: {verdict.failure.detail}"
    return f"{verdict.state}: no engine reported yet"


def _history_entry(
    verdict: TargetVerdict, now: float, failure: ScrapeFailed | None
) -> Mapping[str, Any]:
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
                preemptions=r.preemptions,
                iterations=r.iterations,
            )
        engines.append(item)
    entry["engines"] = engines
    return entry


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _episode_id(target: str, key: EngineKey, family: str, now: float) -> str:
    """`20260101T120000Z-<target>-e<engine>-<family>`, safe as a directory name."""
    stamp = dt.datetime.fromtimestamp(now, tz=dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    parts = (stamp, target, f"e{key.engine}", family)
    return "-".join(_UNSAFE.sub("_", p).strip("_") or "_" for p in parts)


# ---------------------------------------------------------------------------------------------
# The real adapters


class SystemClock:
    """time.monotonic and time.time."""

    def monotonic(self) -> float:
        """Seconds on the monotonic clock."""
        return time.monotonic()

    def wall(self) -> float:
        """Unix time."""
        return time.time()


class AsyncioSleeper:
    """asyncio.sleep."""

    async def sleep(self, seconds: float) -> None:
        """Sleep on the event loop."""
        await asyncio.sleep(seconds)


class HttpScraper:
    """Scrapes with `scrape.fetch` (bounded in time and size) and parses with `signals.parse`."""

    def __init__(self, limits: ScrapeLimits, clock: Clock) -> None:
        self._limits = limits
        self._clock = clock
        self._client = new_client()

    async def scrape(self, target: Target) -> ScrapeResult:
        """Fetch and parse once; the observation is stamped when the scrape began."""
        at = self._clock.monotonic()
        url = target.metrics_url
        result = await fetch(
            self._client,
            url,
            timeout_seconds=self._limits.timeout_seconds,
            max_body_bytes=self._limits.max_body_bytes,
            clock=self._clock.monotonic,
        )
        if isinstance(result, FetchFailed):
            failed = ScrapeFailed(at=at, reason=result.reason, detail=result.detail)
            return ScrapeResult(failed, None, result.elapsed_seconds)
        if len(result.body) >= _THREAD_PARSE_BYTES:
            parsed = await asyncio.to_thread(signals.parse, result.body)
        else:
            parsed = signals.parse(result.body)
        duration = self._clock.monotonic() - at
        if isinstance(parsed, signals.ParseFailure):
            detail = f"{url}: {parsed.message}"
            content_type = result.content_type or "none"
            if not content_type.lower().startswith("text/plain"):
                detail += f" (Content-Type: {content_type}; expected text/plain)"
            return ScrapeResult(ScrapeFailed(at, "parse_error", detail), None, duration)
        return ScrapeResult(Scraped(at, parsed), result.body, duration)

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()


class BundleEvidence:
    """Evidence through `evidence.capture_bundle`: py-spy, process tree, metrics, history."""

    def __init__(self, deps: evidence.EvidenceDeps, thresholds: Mapping[str, float]) -> None:
        self._deps = deps
        self._thresholds = dict(thresholds)

    async def capture(self, request: CaptureRequest) -> CaptureOutcome:
        """Open (suspect) or complete (wedged) the episode's bundle."""
        target = request.target
        result = await evidence.capture_bundle(
            evidence.CaptureRequest(
                target=target.name,
                selector=ProcessSelector(url=target.url, pid=target.pid, pid_file=target.pid_file),
                phase=bundles.Phase(request.phase),
                family=request.family,
                engine=request.key.engine,
                model_name=request.key.model_name,
                episode_id=request.episode_id,
                bundle=Path(request.bundle) if request.bundle else None,
                metrics_body=request.metrics_body,
                metrics_error=None if request.metrics_body is not None else "no good scrape kept",
                history=request.history,
                thresholds=self._thresholds,
                verdict=request.verdict,
                verdict_at=request.verdict_at,
            ),
            self._deps,
        )
        return CaptureOutcome(
            bundle=str(result.bundle) if result.bundle is not None else None,
            failures=capture_failure_reasons(result),
            triage=f"{result.triage.kind}: {result.triage.summary}",
            detail="; ".join(result.failures),
        )

    async def resolve(self, bundle: str, note: str) -> None:
        """Mark the bundle resolved so retention evicts it before wedge bundles."""
        problem = await asyncio.to_thread(evidence.resolve_bundle, Path(bundle), self._deps, note)
        if problem is not None:
            log.warning("bundle_resolve_failed", bundle=bundle, reason=problem)


def capture_failure_reasons(result: evidence.BundleResult) -> tuple[str, ...]:
    """The closed set of reasons (`ownmetrics.CAPTURE_FAILURE_REASONS`) for the failure counter."""
    reasons: list[str] = []
    if result.bundle is None:
        reasons.append("write_failed")
    if result.ptrace_denied:
        reasons.append("ptrace_denied")
    if result.deadline_exceeded:
        reasons.append("timeout")
    if result.failures and not reasons:
        reasons.append("incomplete")
    return tuple(reasons)


class WebhookNotifications:
    """Sends the daemon's notable events through `notify.WebhookNotifier`."""

    EVENTS = frozenset(NotifyEvent)

    def __init__(self, notifier: WebhookNotifier | None) -> None:
        self._notifier = notifier
        self._started = False

    def notify(self, event: str, payload: Mapping[str, Any]) -> None:
        """Queue the event for every webhook URL (none configured: nothing)."""
        if self._notifier is None or event not in self.EVENTS:
            return
        if not self._started:
            self._notifier.start()  # needs the running loop; notify is called from it
            self._started = True
        reason = str(payload.get("reason") or "")
        detail = str(payload.get("detail") or "")
        if detail and detail != reason:  # a policy event: the code, then the sentence
            reason = f"{reason}: {detail}" if reason else detail
        self._notifier.notify(
            Notification(
                event=event,
                target=str(payload.get("target", "")),
                engine=str(payload.get("engine") or ""),
                model_name=str(payload.get("model_name") or ""),
                family=str(payload.get("family") or ""),
                state=str(payload.get("state") or ""),
                reason=reason,
                timestamp=float(payload.get("timestamp", time.time())),
                bundle=payload.get("bundle"),
            )
        )

    def failures(self) -> int:
        """Notifications dropped after their retries."""
        return 0 if self._notifier is None else self._notifier.stats.failed

    async def aclose(self, timeout_seconds: float) -> None:
        """Deliver what is queued, within the deadline."""
        if self._notifier is not None and self._started:
            await self._notifier.aclose(timeout_seconds)


class FileStateStore:
    """`statefile` under `state_dir`, holding the directory's exclusive lock while alive."""

    def __init__(self, state_dir: Path) -> None:
        locked = statefile.lock_state_dir(state_dir)
        if isinstance(locked, statefile.LockFailed):
            raise RuntimeError(locked.message)
        self._lock = locked
        self._dir = state_dir
        self._path = statefile.state_path(state_dir)

    def load(self) -> statefile.Loaded:
        """Read the state file (a corrupt one is set aside and reported)."""
        return statefile.load(self._path)

    def save(
        self, state: statefile.SavedState, timestamp: float
    ) -> statefile.Saved | statefile.SaveFailed:
        """Write it atomically."""
        return statefile.save(self._path, state, timestamp)

    def take_resets(self) -> statefile.ResetRequests:
        """Operator reset requests dropped into the state directory."""
        return statefile.take_reset_requests(self._dir)

    def close(self) -> None:
        """Release the state directory lock."""
        self._lock.release()


def evidence_settings(config: Config) -> evidence.EvidenceSettings:
    """The evidence slice of the configuration."""
    return evidence.EvidenceSettings(
        evidence_dir=config.evidence_dir,
        capture_locals=config.capture_locals,
        pyspy_path=config.pyspy_path,
        pyspy_timeout_seconds=config.pyspy_timeout_seconds,
        evidence_keep=config.evidence_keep,
        evidence_max_bytes=config.evidence_max_bytes,
        process_sample_seconds=config.process_sample_seconds,
        capture_deadline_seconds=capture_deadline_seconds(config),
    )


def thresholds_of(config: Config) -> dict[str, float]:
    """The detector's thresholds and the scrape interval, by setting name (bundles, webhooks)."""
    policy = config.policy()
    settings = dict.fromkeys(THRESHOLD_SETTING.values())  # each setting once, in family order
    return {name: getattr(policy, name) for name in settings} | {
        "interval_seconds": config.interval_seconds
    }


def capture_deadline_seconds(config: Config) -> float:
    """How long one capture may take: py-spy with and without --native, sampling, writing."""
    return 2 * config.pyspy_timeout_seconds + config.process_sample_seconds + 10.0


def build_restarters(config: Config, supervisor: Supervisor | None = None) -> dict[str, Restarter]:
    """One restarter per target for the configured remedy (none for `none`)."""
    restarters: dict[str, Restarter] = {}
    for target in config.targets:
        if config.remedy == "none":
            continue
        if config.remedy == "signal":
            restarters[target.name] = SignalRestarter(grace_seconds=config.grace_seconds)
        elif config.remedy == "systemd":
            unit = target.systemd_unit or config.systemd_unit
            restarters[target.name] = SystemdRestarter(unit)
        elif config.remedy == "exec":
            restarters[target.name] = ExecRestarter(config.exec_command)
        else:
            if supervisor is None:
                raise ValueError(
                    'remedy = "supervise" needs a server that wedgewatch runs itself: '
                    "use `wedgewatch launch --watch`"
                )
            restarters[target.name] = SuperviseRestarter(
                supervisor, grace_seconds=config.grace_seconds
            )
    return restarters


def real_deps(
    config: Config,
    *,
    supervisor: Supervisor | None = None,
    environ: Mapping[str, str] | None = None,
) -> Deps:
    """The production adapters; raises RuntimeError/ValueError for unusable settings.

    Takes the state directory's lock: a second wedgewatch on the same `state_dir` is
    refused (it would restart the same server twice).
    """
    clock = SystemClock()
    finder = PsutilProcessFinder()
    thresholds = thresholds_of(config)
    webhooks = (
        WebhookNotifier(
            config.webhook_urls,
            timeout_seconds=config.webhook_timeout_seconds,
            retries=config.webhook_retries,
        )
        if config.webhook_urls
        else None
    )
    restarters = build_restarters(config, supervisor)
    return Deps(
        clock=clock,
        sleeper=AsyncioSleeper(),
        scraper=HttpScraper(config.scrape_limits(), clock),
        evidence=BundleEvidence(
            evidence.EvidenceDeps(settings=evidence_settings(config), finder=finder), thresholds
        ),
        restarters=restarters,
        finder=finder,
        notifier=WebhookNotifications(webhooks),
        state_store=FileStateStore(config.state_dir),
        service=SystemdNotifier.from_environ(environ),
        registry=CollectorRegistry(),
        serve_http=True,
    )


# ---------------------------------------------------------------------------------------------
# Entry point


async def run(config: Config, deps: Deps, *, stop: asyncio.Event | None = None) -> int:
    """Run the daemon until SIGTERM/SIGINT (or `stop`); 0 on a clean stop.

    The first SIGTERM/SIGINT stops the loop and lets an in-flight capture or restart finish
    or time out; a second one cancels it at once.
    """
    daemon = Daemon(config, deps)
    daemon.restore()
    stop_event = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    main_task = asyncio.current_task()

    def on_signal(sig: signal.Signals) -> None:
        if stop_event.is_set() and main_task is not None:
            main_task.cancel()  # the second signal: do not wait any longer
        stop_event.set()

    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    server: HttpServer | None = None
    try:
        if deps.serve_http:
            app = make_app(lambda: daemon.snapshot, deps.registry, deps.clock.monotonic)
            server = HttpServer(app, config.listen_host, config.listen_port)
            await server.start()
            host, port = server.address
            log.info("http_listening", host=host, port=port)
        log.info(
            "daemon_started",
            version=__version__,
            targets={t.name: t.metrics_url for t in config.targets},
            interval_seconds=config.interval_seconds,
            remedy=config.remedy,
            evidence_dir=str(config.evidence_dir),
            state_dir=str(config.state_dir),
        )
        watchdog = deps.service.watchdog_seconds
        if watchdog is not None and watchdog < 2 * daemon.health_stale_after_seconds:
            log.warning(
                "systemd_watchdog_tight",
                watchdog_seconds=watchdog,
                reason="WatchdogSec should exceed a few intervals plus scrape_timeout_seconds",
            )
        deps.service.ready(daemon._status_line())
        await daemon.run(stop_event)
    finally:
        deps.service.stopping("stopping")
        log.info("daemon_stopping")
        if server is not None:
            await server.stop()
        await deps.notifier.aclose(5.0)
        await deps.scraper.aclose()
        for sig in installed:
            loop.remove_signal_handler(sig)
        log.info("daemon_stopped")
    return 0


def serve(config: Config, *, supervisor: Supervisor | None = None) -> int:
    """`wedgewatch run`: build the real adapters and run until stopped; the exit code.

    0 after a clean stop, 2 when the settings cannot work (no target, state directory in
    use, unknown remedy setup), 1 when the HTTP port cannot be bound, 130 when a second
    signal cut the shutdown short.
    """
    if not config.targets:
        log.error(
            "no_targets", reason="give --target URL (repeatable) or [[targets]] in the config"
        )
        return 2
    try:
        deps = real_deps(config, supervisor=supervisor)
    except (RuntimeError, ValueError) as exc:
        log.error("startup_failed", reason=str(exc))
        return 2
    try:
        return asyncio.run(run(config, deps))
    except OSError as exc:
        log.error("startup_failed", reason=str(exc))
        return 1
    except asyncio.CancelledError:
        log.warning("shutdown_cut_short", reason="a second signal arrived during shutdown")
        return 130
    finally:
        if isinstance(deps.state_store, FileStateStore):
            deps.state_store.close()


async def capture_on_demand(
    config: Config,
    *,
    url: str | None = None,
    pid: int | None = None,
    pid_file: Path | None = None,
    name: str | None = None,
) -> evidence.BundleResult:
    """`wedgewatch capture`: one manual bundle of a server found by URL, pid or pid file.

    With a URL the server's /metrics body is saved too (a failed scrape is noted in the
    bundle, never fatal) and its processes are found from the listening port unless a
    pid or pid file is given.
    """
    body: bytes | None = None
    metrics_error: str | None = None
    metrics_url = metrics_url_of(url) if url is not None else None
    if metrics_url is not None:
        limits = config.scrape_limits()
        async with new_client() as client:
            result = await fetch(
                client,
                metrics_url,
                timeout_seconds=limits.timeout_seconds,
                max_body_bytes=limits.max_body_bytes,
            )
        if isinstance(result, FetchFailed):
            metrics_error = f"{result.reason}: {result.detail}"
        else:
            body = result.body
    else:
        metrics_error = "no URL given (--pid / --pid-file capture)"
    if name is None:
        name = default_target_name(url) if url is not None else f"pid-{pid}" if pid else "server"
    request = evidence.CaptureRequest(
        target=name,
        selector=ProcessSelector(url=url, pid=pid, pid_file=pid_file),
        phase=bundles.Phase.MANUAL,
        family="manual",
        metrics_body=body,
        metrics_error=metrics_error,
        verdict={"reason": "on-demand capture (wedgewatch capture)"},
    )
    deps = evidence.EvidenceDeps(settings=evidence_settings(config))
    return await evidence.capture_bundle(request, deps)
