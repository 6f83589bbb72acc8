"""The watch loop with fakes and a fake clock: a 30-minute wedge story replays in milliseconds."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from wedgewatch.config import Config
from wedgewatch.core.detection.detect import Observation, Scraped, ScrapeFailed
from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.restart import restart_policy
from wedgewatch.daemon.adapters import WebhookNotifications
from wedgewatch.daemon.loop import Daemon, run
from wedgewatch.daemon.ownmetrics import CAPTURE_FAILURE_REASONS
from wedgewatch.daemon.roles import CaptureOutcome, CaptureRequest, Deps, ScrapeResult
from wedgewatch.daemon.server import make_app
from wedgewatch.io import restarters, statefile
from wedgewatch.io.notify import Notification, NotifyStats
from wedgewatch.io.notify import payload as webhook_payload
from wedgewatch.io.procs import Discovery, ProcessSelector
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition

KEY = EngineKey("m", "0")
T0_WALL = 1_800_000_000.0

# -- fakes ---------------------------------------------------------------------------------------


class FakeClock:
    """Monotonic and wall time that only move when the fake sleeper says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return T0_WALL + self.now


class FakeServer:
    """A vLLM stand-in at the level of readings: healthy, wedged, idle, asleep or down."""

    def __init__(self, clock: FakeClock, script: Callable[[float], str]) -> None:
        self.clock = clock
        self.script = script  # seconds since start -> mode
        self.start = clock.now
        self.counter = 0.0
        self.restarted_at: float | None = None
        self.after_restart = "healthy"
        self.down_after_restart_seconds = 3.0

    def mode(self, at: float) -> str:
        if self.restarted_at is not None:
            if at - self.restarted_at < self.down_after_restart_seconds:
                return "down"
            return self.after_restart
        return self.script(at - self.start)

    def restart(self) -> None:
        self.restarted_at = self.clock.now
        self.counter = 0.0

    def observe(self, at: float) -> Observation:
        mode = self.mode(at)
        if mode == "down":
            return ScrapeFailed(at, "refused", "connection refused by 127.0.0.1:8000")
        if mode == "timeout":
            return ScrapeFailed(at, "timeout", "no complete response within 5 s")
        running, waiting, by_reason, awake = 2.0, 1.0, {"capacity": 1.0, "deferred": 0.0}, True
        if mode == "healthy":
            self.counter += 10
        elif mode == "wedged":
            running, waiting, by_reason = 0.0, 5.0, {"capacity": 1.0, "deferred": 4.0}
        elif mode == "idle":
            running, waiting, by_reason = 0.0, 0.0, {"capacity": 0.0, "deferred": 0.0}
        elif mode == "sleeping":
            awake = False
        elif mode == "nan":  # a fault that writes non-finite gauges
            running, waiting, by_reason = math.nan, math.inf, {"capacity": math.inf}
        else:
            raise AssertionError(mode)
        reading = EngineReading(
            key=KEY,
            running=running,
            waiting=waiting,
            waiting_by_reason=by_reason,
            kv_cache_usage=0.5,
            awake=awake,
            prompt_tokens=self.counter,
            generation_tokens=self.counter,
            request_success=self.counter / 10,
            preemptions=0.0,
            iterations=self.counter,
        )
        # Like vLLM's process collector: a restarted server has a new start time.
        started = self.start if self.restarted_at is None else self.restarted_at
        return Scraped(at, Exposition({KEY: reading}, process_start_time_seconds=1.7e9 + started))


class FakeScraper:
    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.closed = False
        self.lag_seconds = 0.0  # real seconds a scrape takes after it has seen the server

    async def scrape(self, target: Any) -> ScrapeResult:
        obs = self.server.observe(self.server.clock.monotonic())
        if self.lag_seconds:
            await asyncio.sleep(self.lag_seconds)
        body = b"# fake body\n" if isinstance(obs, Scraped) else None
        return ScrapeResult(obs, body, 0.01)

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class FakeEvidence:
    """Records capture requests; can fail, raise or hang."""

    behaviour: str = "ok"  # ok | fail | raise | hang | hang-wedged | slow
    requests: list[CaptureRequest] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    resolved: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)

    async def capture(self, request: CaptureRequest) -> CaptureOutcome:
        self.requests.append(request)
        if self.behaviour == "raise":
            raise OSError("disk full")
        if self.behaviour == "hang" or (
            self.behaviour == "hang-wedged" and request.phase is CapturePhase.WEDGED
        ):
            await asyncio.Event().wait()
        if self.behaviour == "slow":
            await asyncio.sleep(0.3)
        bundle = request.bundle or f"/evidence/{request.episode_id}"
        self.finished.append(request.phase)
        if self.behaviour == "fail":
            return CaptureOutcome(bundle, ("ptrace_denied",), "no_stacks", "py-spy: permission")
        return CaptureOutcome(bundle, (), "scheduler_wedge", "")

    async def cut_off(self, bundle: str, detail: str) -> None:
        self.cut.append(bundle)

    async def resolve(self, bundle: str, note: str) -> None:
        self.resolved.append(bundle)


class FakeRestarter:
    """Restarts the fake server (or fails to)."""

    name = "signal"

    def __init__(self, server: FakeServer, ok: bool = True) -> None:
        self.server = server
        self.ok = ok
        self.requests: list[restarters.RestartRequest] = []
        self.delay_seconds = 0.0  # real seconds the restart takes

    async def restart(self, request: restarters.RestartRequest) -> restart_policy.RestartOutcome:
        self.requests.append(request)
        if self.delay_seconds:
            await asyncio.sleep(self.delay_seconds)
            self.server.clock.now += 0.5  # the fake world moved on while the server stopped
        if not self.ok:
            return restart_policy.RestartOutcome(
                False, "kill: permission denied", 0.1, restart_policy.FailureReason.REMEDY_ERROR
            )
        self.server.restart()
        return restart_policy.RestartOutcome(True, "all 4 exited on SIGTERM", 0.1)


class FakeFinder:
    def discover(self, selector: ProcessSelector) -> Discovery:
        return Discovery(selector.describe(), 4242, ())


@dataclass
class FakeNotifier:
    events: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)
    failed: int = 0

    def notify(self, event: str, payload: Mapping[str, Any]) -> None:
        self.events.append((event, payload))

    def failures(self) -> int:
        return self.failed

    async def aclose(self, timeout_seconds: float) -> None:
        return None


@dataclass
class MemoryStateStore:
    saved: statefile.SavedState = field(default_factory=statefile.SavedState)
    saves: int = 0
    resets: list[statefile.ResetRequests] = field(default_factory=list)

    def load(self) -> statefile.Loaded:
        # Round-trip through the real encoding, as the file would.
        decoded = statefile.decode(statefile.encode(self.saved, T0_WALL))
        assert isinstance(decoded, statefile.SavedState)
        return statefile.Loaded(decoded)

    def save(self, state: statefile.SavedState, timestamp: float) -> statefile.Saved:
        self.saved = state
        self.saves += 1
        return statefile.Saved(Path("/memory"), 0)

    def take_resets(self) -> statefile.ResetRequests:
        return self.resets.pop(0) if self.resets else statefile.ResetRequests()


@dataclass
class FakeService:
    calls: list[str] = field(default_factory=list)
    watchdog_seconds: float | None = 30.0

    def ready(self, status: str = "") -> bool:
        self.calls.append("READY")
        return True

    def watchdog(self) -> bool:
        self.calls.append("WATCHDOG")
        return True

    def status(self, status: str) -> bool:
        self.calls.append(f"STATUS={status}")
        return True

    def stopping(self, status: str = "") -> bool:
        self.calls.append("STOPPING")
        return True


class FakeSleeper:
    """Advances the fake clock; lets workers settle; stops the daemon at `until`."""

    def __init__(self, clock: FakeClock, stop: asyncio.Event, until: float) -> None:
        self.clock = clock
        self.stop = stop
        self.until = until
        self.daemon: Daemon | None = None
        self.settle = True
        self.on_tick: Callable[[float], None] | None = None

    async def sleep(self, seconds: float) -> None:
        for _ in range(3):
            await asyncio.sleep(0)
        if self.settle and self.daemon is not None:
            for _ in range(2000):  # let captures and restarts finish before time moves on
                if not self.daemon.jobs_pending():
                    break
                await asyncio.sleep(0.001)
        self.clock.now += seconds
        if self.on_tick is not None:
            self.on_tick(self.clock.now)
        if self.clock.now >= self.until:
            self.stop.set()


@dataclass
class World:
    clock: FakeClock
    server: FakeServer
    evidence: FakeEvidence
    restarter: FakeRestarter
    notifier: FakeNotifier
    store: MemoryStateStore
    service: FakeService
    registry: CollectorRegistry
    stop: asyncio.Event
    sleeper: FakeSleeper
    config: Config
    deps: Deps

    def metric(self, name: str, **labels: str) -> float:
        from prometheus_client import generate_latest

        text = generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        raise KeyError(name)


def make_world(
    tmp_path: Path,
    script: Callable[[float], str],
    *,
    until: float,
    remedy_name: str = "signal",
    evidence: str = "ok",
    restart_ok: bool = True,
    store: MemoryStateStore | None = None,
    **settings: Any,
) -> World:
    clock = FakeClock()
    server = FakeServer(clock, script)
    values: dict[str, Any] = {
        "targets": ["sim=http://127.0.0.1:8000"],
        "interval_seconds": 1.0,
        "stall_after_seconds": 60.0,
        "hang_after_seconds": 120.0,
        "unreachable_after_seconds": 30.0,
        "startup_timeout_seconds": 600.0,
        "restart_backoff_seconds": 60.0,
        "restart_backoff_max_seconds": 600.0,
        "state_dir": str(tmp_path / "state"),
        "evidence_dir": str(tmp_path / "evidence"),
        "remedy": remedy_name,
        "pyspy_timeout_seconds": 0.1,
        "process_sample_seconds": 0.1,
    }
    values.update(settings)
    config = Config.model_validate(values)
    stop = asyncio.Event()
    sleeper = FakeSleeper(clock, stop, clock.now + until)
    restarter = FakeRestarter(server, ok=restart_ok)
    deps = Deps(
        clock=clock,
        sleeper=sleeper,
        scraper=FakeScraper(server),
        evidence=FakeEvidence(evidence),
        restarters={} if remedy_name in ("none", "probe") else {"sim": restarter},
        finder=FakeFinder(),
        notifier=FakeNotifier(),
        state_store=store or MemoryStateStore(),
        service=FakeService(),
        registry=CollectorRegistry(),
        serve_http=False,
    )
    return World(
        clock,
        server,
        deps.evidence,  # type: ignore[arg-type]
        restarter,
        deps.notifier,  # type: ignore[arg-type]
        deps.state_store,  # type: ignore[arg-type]
        deps.service,  # type: ignore[arg-type]
        deps.registry,
        stop,
        sleeper,
        config,
        deps,
    )


async def play(
    world: World, *, capture_timeout_seconds: float | None = None
) -> tuple[Daemon, list[dict[str, Any]]]:
    """Run the daemon in the world until its end time; return it and every log line."""
    daemon = Daemon(world.config, world.deps)
    if capture_timeout_seconds is not None:
        daemon.capture_timeout_seconds = capture_timeout_seconds
    daemon.restore()
    world.sleeper.daemon = daemon
    with structlog.testing.capture_logs() as logs:
        await daemon.run(world.stop)
    return daemon, logs


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == name]


def wedge_at(onset: float, mode: str = "wedged") -> Callable[[float], str]:
    return lambda t: "healthy" if t < onset else mode


# -- detection ------------------------------------------------------------------------------------


async def test_wedge_is_detected_at_the_threshold(tmp_path: Path) -> None:
    """A deferred stall that starts at t=100 s is wedged one threshold later, not before."""
    world = make_world(tmp_path, wedge_at(100), until=400, remedy_name="none")
    _, logs = await play(world)
    (suspect,) = events(logs, "stall_suspected")
    assert world.evidence.requests[0].verdict["since_timestamp"] == pytest.approx(
        T0_WALL + 1000 + 100, abs=1.0
    )
    (wedge,) = events(logs, "wedge_detected")
    assert suspect["family"] == "deferred_stall"
    assert wedge["family"] == "deferred_stall"
    assert 60.0 <= wedge["stalled_seconds"] <= 61.0
    assert world.metric("wedgewatch_wedges_total", target="sim", family="deferred_stall") == 1


async def test_observe_mode_captures_once_and_never_restarts(tmp_path: Path) -> None:
    """With remedy none a 30-minute wedge gives one bundle (suspect + wedged) and no restart."""
    world = make_world(tmp_path, wedge_at(60), until=1860, remedy_name="none")
    daemon, logs = await play(world)
    assert [r.phase for r in world.evidence.requests] == ["suspect", "wedged"]
    assert world.restarter.requests == []
    assert len(events(logs, "restart_skipped")) == 1
    assert daemon.snapshot.targets["sim"].state == "wedged"
    assert world.metric("wedgewatch_restarts_total", target="sim", remedy="none") == 0
    # Observe mode says so everywhere: no answer asks for a restart.
    app = make_app(lambda: daemon.snapshot, world.registry, world.clock.monotonic)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        probe = await client.get("/probe")
        status = (await client.get("/status")).json()
    assert probe.status_code == 200
    assert probe.json()["restart_policy"]["decision"] == "observe"
    assert "observe mode" in probe.json()["restart_policy"]["detail"]
    (target,) = status["targets"]
    assert target["episode"]["restart_requested"] is False
    assert target["probe_ok"] is True
    assert target["readiness"]["decision"] == "wedged"
    assert world.metric("wedgewatch_target_ready", target="sim") == 0
    assert "restart" not in {v for v in _strings(probe.json())}


def _strings(value: object) -> Iterator[str]:
    """Every string value inside a JSON document (to show no field says `restart`)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


async def test_the_ready_metric_follows_readiness(tmp_path: Path) -> None:
    """wedgewatch_target_ready is 1 while the server serves and 0 once it is wedged."""
    healthy = make_world(tmp_path / "healthy", lambda t: "healthy", until=60, remedy_name="probe")
    await play(healthy)
    assert healthy.metric("wedgewatch_target_ready", target="sim") == 1
    wedged = make_world(tmp_path / "wedged", wedge_at(10), until=200, remedy_name="probe")
    daemon, _ = await play(wedged)
    assert daemon.snapshot.targets["sim"].state == "wedged"
    assert wedged.metric("wedgewatch_target_ready", target="sim") == 0


async def test_wedged_capture_completes_the_suspect_bundle(tmp_path: Path) -> None:
    """The wedged-phase capture is asked to complete the bundle the suspect capture opened."""
    world = make_world(tmp_path, wedge_at(60), until=300, remedy_name="none")
    await play(world)
    suspect, wedged = world.evidence.requests
    assert suspect.bundle is None
    assert wedged.bundle == f"/evidence/{suspect.episode_id}"
    assert wedged.episode_id == suspect.episode_id
    assert wedged.metrics_body == b"# fake body\n"
    assert len(wedged.history) > 60  # the flight recorder covers the stall
    assert wedged.verdict["state"] == "wedged"
    assert wedged.verdict["thresholds"]["stall_after_seconds"] == 60.0


@pytest.mark.parametrize("mode", ["healthy", "idle", "sleeping"])
async def test_no_false_alarm(tmp_path: Path, mode: str) -> None:
    """Healthy, idle and sleeping engines stay quiet for 30 minutes: no suspect, no capture."""
    world = make_world(tmp_path, lambda t: mode, until=1800)
    daemon, logs = await play(world)
    assert events(logs, "stall_suspected") == []
    assert world.evidence.requests == []
    assert world.restarter.requests == []
    assert daemon.snapshot.targets["sim"].state == {"healthy": "ok"}.get(mode, mode)


async def test_no_info_line_per_tick(tmp_path: Path) -> None:
    """Ten healthy minutes log only a handful of lines at info level or above."""
    world = make_world(tmp_path, lambda t: "healthy" if int(t) % 7 else "idle", until=600)
    _, logs = await play(world)
    loud = [line for line in logs if line["log_level"] != "debug"]
    assert len(loud) <= 3, loud


async def test_suspect_that_recovers_is_resolved(tmp_path: Path) -> None:
    """A short stall opens a suspect bundle, then marks it resolved when the engine recovers."""
    world = make_world(tmp_path, lambda t: "wedged" if 30 <= t < 50 else "healthy", until=120)
    _, logs = await play(world)
    assert [r.phase for r in world.evidence.requests] == ["suspect"]
    assert world.evidence.resolved == [f"/evidence/{world.evidence.requests[0].episode_id}"]
    (closed,) = events(logs, "episode_closed")
    assert closed["outcome"] == "recovered"
    assert events(logs, "engine_recovered")
    assert world.restarter.requests == []


def two_short_stalls(t: float) -> str:
    """Two stalls shorter than stall_after_seconds, 70 s apart, then a wedge at 200 s."""
    return "wedged" if 30 <= t < 50 or 100 <= t < 120 or t >= 200 else "healthy"


async def test_suspect_round_is_rate_limited_per_target(tmp_path: Path) -> None:
    """Within suspect_capture_min_interval_seconds a new suspect episode takes no capture."""
    world = make_world(tmp_path, two_short_stalls, until=300, remedy_name="none")
    _, logs = await play(world)
    phases = [(r.phase, r.bundle) for r in world.evidence.requests]
    # One suspect round (the first episode), none for the second; the wedge in the window
    # still gets its capture, as a one-shot bundle (no suspect bundle to complete).
    assert phases == [("suspect", None), ("wedged", None)]
    skipped = events(logs, "suspect_capture_skipped")
    assert len(skipped) == 2  # once per rate-limited episode, not once per tick
    assert "at most one per 600 s" in skipped[0]["reason"]


async def test_suspect_round_runs_again_once_the_interval_passed(tmp_path: Path) -> None:
    """A shorter limit lets the second episode capture; 0 disables the limit."""
    for limit in (60.0, 0.0):
        world = make_world(
            tmp_path / str(limit),
            two_short_stalls,
            until=150,
            remedy_name="none",
            suspect_capture_min_interval_seconds=limit,
        )
        _, logs = await play(world)
        assert [r.phase for r in world.evidence.requests] == ["suspect", "suspect"], limit
        assert events(logs, "suspect_capture_skipped") == []


async def test_webhook_failures_are_counted(tmp_path: Path) -> None:
    """Notifications the notifier gave up on show in wedgewatch_webhook_failures_total."""
    world = make_world(tmp_path, lambda t: "healthy", until=5)
    world.notifier.failed = 2
    await play(world)
    assert world.metric("wedgewatch_webhook_failures_total") == 2


# -- restarts -------------------------------------------------------------------------------------


async def test_restart_flow(tmp_path: Path) -> None:
    """Wedge -> evidence -> restart -> startup grace -> restart_succeeded -> episode closed."""
    world = make_world(tmp_path, wedge_at(60), until=400)
    daemon, logs = await play(world)
    names = [line["event"] for line in logs]
    order = [
        "stall_suspected",
        "evidence_captured",
        "wedge_detected",
        "evidence_captured",
        "restart_requested",
        "restart_completed",
        "restart_succeeded",
        "episode_closed",
    ]
    remaining = iter(names)
    assert all(name in remaining for name in order), names  # in this order
    (request,) = world.restarter.requests
    assert request.server_pid == 4242
    assert request.family == "deferred_stall"
    assert request.bundle is not None
    assert daemon.snapshot.targets["sim"].state == "ok"
    assert daemon.snapshot.targets["sim"].restarts == 1
    assert daemon.snapshot.targets["sim"].restart_budget_remaining == 2
    (closed,) = events(logs, "episode_closed")
    assert closed["outcome"] == "restarted"
    assert world.metric("wedgewatch_restarts_total", target="sim", remedy="signal") == 1


@pytest.mark.parametrize("behaviour", ["fail", "raise", "hang"])
async def test_failed_capture_does_not_block_the_restart(tmp_path: Path, behaviour: str) -> None:
    """A capture that fails, raises or hangs past its timeout still lets the restart run."""
    world = make_world(tmp_path, wedge_at(60), until=300, evidence=behaviour)
    _, logs = await play(world, capture_timeout_seconds=0.2)
    assert len(world.restarter.requests) == 1
    assert events(logs, "evidence_capture_failed")
    failures = sum(
        world.metric("wedgewatch_evidence_capture_failures_total", target="sim", reason=reason)
        for reason in CAPTURE_FAILURE_REASONS
    )
    assert failures >= 1


async def test_a_wedged_round_cut_off_at_its_limit_is_recorded_in_its_bundle(
    tmp_path: Path,
) -> None:
    """The suspect round opens the bundle; the wedged round hangs past the capture limit: the
    bundle is marked (verdict wedged, the failure kept) before anything ships it, once."""
    world = make_world(tmp_path, wedge_at(60), until=300, evidence="hang-wedged")
    _, logs = await play(world, capture_timeout_seconds=0.2)
    suspect, wedged = world.evidence.requests[:2]
    assert wedged.phase is CapturePhase.WEDGED
    bundle = f"/evidence/{suspect.episode_id}"
    assert wedged.bundle == bundle
    assert world.evidence.cut == [bundle]
    assert events(logs, "evidence_capture_failed")


async def test_budget_then_gave_up(tmp_path: Path) -> None:
    """A server that wedges after every restart gets `restart_budget` restarts, then none."""
    world = make_world(
        tmp_path,
        wedge_at(30),
        until=1800,
        restart_budget=2,
        restart_backoff_seconds=10.0,
        restart_backoff_max_seconds=20.0,
    )
    world.server.after_restart = "wedged"
    daemon, logs = await play(world)
    assert len(world.restarter.requests) == 2
    assert len(events(logs, "gave_up")) == 1
    target = daemon.snapshot.targets["sim"]
    assert target.gave_up
    assert target.state == "wedged"
    assert world.metric("wedgewatch_gave_up", target="sim") == 1
    assert world.metric("wedgewatch_restart_budget_remaining", target="sim") == 0


async def test_backoff_defers_the_second_restart(tmp_path: Path) -> None:
    """A wedge right after a restart waits out the back-off before the next restart."""
    world = make_world(
        tmp_path,
        wedge_at(30),
        until=600,
        stall_after_seconds=10.0,
        restart_backoff_seconds=100.0,
        restart_backoff_max_seconds=200.0,
    )
    world.server.after_restart = "wedged"
    restart_times: list[float] = []
    original = world.restarter.restart

    async def timed(request: restarters.RestartRequest) -> restart_policy.RestartOutcome:
        restart_times.append(world.clock.now)
        return await original(request)

    world.restarter.restart = timed  # type: ignore[method-assign]
    _, logs = await play(world)
    assert len(restart_times) >= 2
    assert restart_times[1] - restart_times[0] >= 100.0
    assert events(logs, "restart_deferred")


async def test_restart_error_is_retried_after_the_backoff(tmp_path: Path) -> None:
    """A failing remedy is restart_failed, retried after the back-off, then gave_up."""
    world = make_world(
        tmp_path,
        wedge_at(60),
        until=1200,
        restart_ok=False,
        restart_budget=3,
        restart_backoff_seconds=50.0,
        restart_backoff_max_seconds=100.0,
    )
    restart_times: list[float] = []
    original = world.restarter.restart

    async def timed(request: restarters.RestartRequest) -> restart_policy.RestartOutcome:
        restart_times.append(world.clock.now)
        return await original(request)

    world.restarter.restart = timed  # type: ignore[method-assign]
    daemon, logs = await play(world)
    assert len(world.restarter.requests) == 3  # the whole budget, no more
    assert restart_times[1] - restart_times[0] >= 50.0  # the back-off is honoured
    assert restart_times[2] - restart_times[1] >= 100.0
    failed = events(logs, "restart_failed")
    assert [line["reason"] for line in failed] == ["remedy_error"] * 3
    assert len(events(logs, "gave_up")) == 1
    assert len(events(logs, "episode_opened")) == 1  # all within one episode
    assert (
        world.metric("wedgewatch_restart_failures_total", target="sim", reason="remedy_error") == 3
    )
    target = daemon.snapshot.targets["sim"]
    assert target.state == "wedged"
    assert target.gave_up


async def test_restart_error_then_success_closes_the_episode(tmp_path: Path) -> None:
    """A remedy that fails once and then works brings the server back within the episode."""
    world = make_world(
        tmp_path, wedge_at(60), until=600, restart_ok=False, restart_backoff_seconds=20.0
    )
    original = world.restarter.restart

    async def flaky(request: restarters.RestartRequest) -> restart_policy.RestartOutcome:
        outcome = await original(request)
        world.restarter.ok = True
        return outcome

    world.restarter.restart = flaky  # type: ignore[method-assign]
    daemon, logs = await play(world)
    assert len(world.restarter.requests) == 2
    assert len(events(logs, "restart_failed")) == 1
    assert len(events(logs, "restart_succeeded")) == 1
    assert events(logs, "episode_closed")[0]["outcome"] == "restarted"
    assert daemon.snapshot.targets["sim"].state == "ok"


async def test_server_that_never_returns_is_not_recovered(tmp_path: Path) -> None:
    """A restart after which the server never answers ends in restart_failed (not_recovered)."""
    world = make_world(tmp_path, wedge_at(60), until=1200, startup_timeout_seconds=300.0)
    world.server.down_after_restart_seconds = 10_000.0
    daemon, logs = await play(world)
    (failed,) = events(logs, "restart_failed")
    assert failed["reason"] == "not_recovered"
    assert len(world.restarter.requests) == 1
    assert daemon.snapshot.targets["sim"].state == "unreachable"
    assert events(logs, "episode_closed")[0]["outcome"] == "restart_failed"


async def test_startup_grace_hides_the_restart_outage(tmp_path: Path) -> None:
    """While the restarted server loads, the target is starting (probe 200), not unreachable."""
    world = make_world(tmp_path, wedge_at(60), until=400, unreachable_after_seconds=5.0)
    world.server.down_after_restart_seconds = 120.0
    states: list[str] = []
    daemon_box: list[Daemon] = []

    def watch(now: float) -> None:
        if daemon_box and world.server.restarted_at is not None:
            states.append(daemon_box[0].snapshot.targets["sim"].state)

    world.sleeper.on_tick = watch
    daemon = Daemon(world.config, world.deps)
    daemon_box.append(daemon)
    world.sleeper.daemon = daemon
    with structlog.testing.capture_logs() as logs:
        await daemon.run(world.stop)
    assert states
    assert set(states) <= {"starting", "ok", "wedged", "unreachable"}
    assert "unreachable" not in states[1:]
    assert events(logs, "restart_succeeded")


async def test_scrape_of_the_old_server_does_not_end_the_grace(tmp_path: Path) -> None:
    """A scrape begun before the restart finished saw the old server and is not its comeback."""
    world = make_world(tmp_path, wedge_at(10), until=60, stall_after_seconds=10.0)
    world.sleeper.settle = False
    world.deps.scraper.lag_seconds = 0.02  # type: ignore[attr-defined]
    world.restarter.delay_seconds = 0.05
    _, logs = await play(world)
    names = [line["event"] for line in logs]
    completed, succeeded = names.index("restart_completed"), names.index("restart_succeeded")
    assert "scrape_failed" in names[completed:succeeded], names[completed:]


# -- persistence ----------------------------------------------------------------------------------


async def test_budget_survives_a_wedgewatch_restart(tmp_path: Path) -> None:
    """Restarts recorded by one daemon count against the budget of the next one."""
    store = MemoryStateStore()
    first = make_world(tmp_path, wedge_at(30), until=300, store=store, restart_budget=2)
    await play(first)
    assert len(first.restarter.requests) == 1
    second = make_world(tmp_path, wedge_at(30), until=300, store=store, restart_budget=2)
    second.clock.now = first.clock.now + 5  # same boot: the clocks moved on together
    second.server.start = second.clock.now
    second.sleeper.until = second.clock.now + 300
    second.server.after_restart = "wedged"
    daemon, logs = await play(second)
    assert len(second.restarter.requests) == 1  # 2 - 1 left from the first daemon
    assert events(logs, "gave_up")
    assert daemon.snapshot.targets["sim"].gave_up


async def test_state_is_saved_on_shutdown(tmp_path: Path) -> None:
    """The saved state holds the detector state and the open episode with its bundle."""
    world = make_world(tmp_path, wedge_at(30), until=200, remedy_name="none")
    await play(world)
    record = world.store.saved.targets["sim"]
    (episode,) = record.open_episodes
    assert episode.family == "deferred_stall"
    assert episode.bundle_path == f"/evidence/{episode.episode_id}"
    assert record.detector is not None
    assert record.detector["state"]["engines"][0]["state"] == "wedged"


async def test_restored_episode_is_not_captured_twice(tmp_path: Path) -> None:
    """After a wedgewatch restart mid-wedge, the same episode gets no second bundle or restart."""
    store = MemoryStateStore()
    first = make_world(tmp_path, wedge_at(30), until=200, store=store, remedy_name="none")
    await play(first)
    second = make_world(tmp_path, lambda t: "wedged", until=300, store=store, remedy_name="none")
    second.clock.now = first.clock.now + 2
    second.sleeper.until = second.clock.now + 300
    second.server.counter = first.server.counter
    daemon, logs = await play(second)
    assert second.evidence.requests == []
    assert events(logs, "wedge_detected") == []
    assert daemon.snapshot.targets["sim"].state == "wedged"


async def test_operator_reset_clears_gave_up(tmp_path: Path) -> None:
    """A reset request re-arms restarts after the daemon gave up."""
    world = make_world(
        tmp_path, wedge_at(20), until=900, restart_budget=1, restart_backoff_seconds=5.0
    )
    world.server.after_restart = "wedged"
    resets_at = world.clock.now + 600

    def maybe_reset(now: float) -> None:
        if resets_at <= now < resets_at + 1:
            world.store.resets.append(statefile.ResetRequests(everything=True))

    world.sleeper.on_tick = maybe_reset
    _, logs = await play(world)
    assert events(logs, "gave_up")
    assert events(logs, "gave_up_cleared")


# -- scrape failures ------------------------------------------------------------------------------


async def test_scrape_failures_log_on_change_of_reason(tmp_path: Path) -> None:
    """Repeated failures with one reason log once; a new reason logs again; recovery logs once."""

    def script(t: float) -> str:
        if t < 10:
            return "healthy"
        if t < 20:
            return "down"
        if t < 25:
            return "timeout"
        return "healthy"

    world = make_world(tmp_path, script, until=60)
    _, logs = await play(world)
    assert [line["reason"] for line in events(logs, "scrape_failed")] == ["refused", "timeout"]
    assert len(events(logs, "scrape_recovered")) == 1
    assert events(logs, "wedge_detected") == []
    assert world.metric("wedgewatch_scrape_failures_total", target="sim", reason="refused") == 10


@pytest.mark.parametrize(("mode", "reason"), [("down", "refused"), ("timeout", "timeout")])
async def test_unreachable_says_why(tmp_path: Path, mode: str, reason: str) -> None:
    """A crashed server (refused) and a hung one (timeout) differ in the log line and /status."""
    world = make_world(tmp_path, wedge_at(30, mode), until=120, remedy_name="none")
    daemon, logs = await play(world)
    (line,) = events(logs, "target_unreachable")
    assert line["family"] == "unreachable"
    assert line["scrape_failure"] == reason
    assert line["triage"] == "scheduler_wedge"  # the suspect bundle's triage (fake evidence)
    (captured, *_) = events(logs, "evidence_captured")
    assert captured["scrape_failure"] == reason
    target = daemon.snapshot.targets["sim"]
    assert target.episode is not None
    assert target.episode["scrape_failure"] == reason
    assert target.last_scrape_error is not None
    assert target.last_scrape_error.startswith(reason)


async def test_never_up_target_is_starting_then_unreachable(tmp_path: Path) -> None:
    """A target that never answers is starting until startup_timeout_seconds, then unreachable."""
    world = make_world(tmp_path, lambda t: "down", until=200, startup_timeout_seconds=100.0)
    daemon, logs = await play(world)
    assert daemon.snapshot.targets["sim"].state == "unreachable"
    assert len(events(logs, "target_unreachable")) == 1
    assert world.restarter.requests == []  # nothing known to restart


# -- surfaces -------------------------------------------------------------------------------------


async def test_endpoints_read_the_daemon_snapshot(tmp_path: Path) -> None:
    """/probe is 503 with the reason while wedged; /status shows the bundle and the episode."""
    world = make_world(tmp_path, wedge_at(30), until=200, remedy_name="probe")
    daemon, _ = await play(world)
    app = make_app(lambda: daemon.snapshot, world.registry, world.clock.monotonic)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://w") as client:
        probe = await client.get("/probe")
        status = (await client.get("/status")).json()
        health = await client.get("/health")
        metrics = await client.get("/metrics")
    assert probe.status_code == 503
    assert "deferred" in probe.json()["reason"]
    (target,) = status["targets"]
    assert target["last_bundle"].startswith("/evidence/")
    assert target["episode"]["family"] == "deferred_stall"
    assert target["engines"][0]["last_reading"]["waiting_by_reason"]["deferred"] == 4.0
    assert health.status_code == 200
    assert 'wedgewatch_engine_state{engine="0",model_name="m",state="wedged",target="sim"} 1.0' in (
        metrics.text
    )


async def test_systemd_ready_watchdog_stopping(tmp_path: Path) -> None:
    """run() sends READY once, WATCHDOG every tick and STOPPING at the end."""
    world = make_world(tmp_path, lambda t: "healthy", until=10)
    with structlog.testing.capture_logs():
        assert await run(world.config, world.deps, stop=world.stop) == 0
    calls = [c for c in world.service.calls if not c.startswith("STATUS")]
    assert calls[0] == "READY"
    assert calls[-1] == "STOPPING"
    assert calls.count("WATCHDOG") >= 10
    assert world.deps.scraper.closed  # type: ignore[attr-defined]


async def test_webhooks_get_the_story(tmp_path: Path) -> None:
    """Notifications go out for the wedge, the restart and its success, with the target."""
    world = make_world(tmp_path, wedge_at(60), until=300)
    await play(world)
    names = [name for name, _ in world.notifier.events]
    for expected in ("wedge_detected", "restart_requested", "restart_succeeded"):
        assert expected in names
    payload = dict(world.notifier.events[names.index("wedge_detected")][1])
    assert payload["target"] == "sim"
    assert payload["family"] == "deferred_stall"
    succeeded = dict(world.notifier.events[names.index("restart_succeeded")][1])
    assert succeeded["engine"] == "0"
    assert succeeded["model_name"] == "m"
    assert succeeded["family"] == "deferred_stall"
    assert succeeded["bundle"].startswith("/evidence/")


async def test_gave_up_webhook_names_the_engine_family_and_bundle(tmp_path: Path) -> None:
    """The gave_up notification carries the episode's engine, family and bundle."""
    world = make_world(tmp_path, wedge_at(30), until=600, restart_ok=False, restart_budget=1)
    await play(world)
    (payload,) = [dict(p) for name, p in world.notifier.events if name == "gave_up"]
    assert payload["engine"] == "0"
    assert payload["family"] == "deferred_stall"
    assert payload["bundle"].startswith("/evidence/")
    assert payload["reason"] == "budget_exhausted"


async def test_shutdown_lets_an_inflight_capture_finish(tmp_path: Path) -> None:
    """Stopping while a capture runs waits for it, then saves the state."""
    world = make_world(tmp_path, wedge_at(5), until=10_000, remedy_name="none", evidence="slow")
    world.sleeper.settle = False
    daemon = Daemon(world.config, world.deps)
    world.sleeper.daemon = daemon

    def stop_when_capturing(now: float) -> None:
        if world.evidence.requests:
            world.stop.set()

    world.sleeper.on_tick = stop_when_capturing
    with structlog.testing.capture_logs() as logs:
        await daemon.run(world.stop)
    assert world.evidence.finished == ["suspect"]
    assert events(logs, "evidence_captured")
    assert world.store.saves >= 1


GONE = ("processes: no process listens on TCP port 8000", "metrics_wedged.prom: no body")


@pytest.mark.parametrize(
    ("bundle", "failures", "ptrace_denied", "deadline", "expected", "gone"),
    [
        pytest.param(Path("/b"), (), 0, False, (), False, id="complete"),
        pytest.param(Path("/b"), ("py-spy: x",), 3, False, ("ptrace_denied",), False, id="ptrace"),
        pytest.param(Path("/b"), ("x",), 0, True, ("timeout",), False, id="deadline"),
        pytest.param(None, ("cannot create",), 0, False, ("write_failed",), False, id="no-bundle"),
        pytest.param(Path("/b"), ("nvidia-smi: x",), 0, False, ("incomplete",), False, id="other"),
        # A crashed or stopped server (#24): its missing parts are not capture failures...
        pytest.param(Path("/b"), GONE, 0, False, (), True, id="server-gone"),
        # ...but a bundle that could not be written or a capture out of time still are.
        pytest.param(None, GONE, 0, False, ("write_failed",), True, id="gone-no-bundle"),
        pytest.param(Path("/b"), GONE, 0, True, ("timeout",), True, id="gone-deadline"),
    ],
)  # fmt: skip
def test_capture_failure_reasons(  # noqa: PLR0917 - one parameter per column of the table
    bundle: Path | None,
    failures: tuple[str, ...],
    ptrace_denied: int,
    deadline: bool,
    expected: tuple[str, ...],
    gone: bool,
) -> None:
    """Bundle results map onto the closed set of capture failure reasons of the metric."""
    from wedgewatch.core.detection.states import CapturePhase
    from wedgewatch.core.evidence.triage import Triage, TriageKind
    from wedgewatch.daemon.adapters import capture_failure_reasons
    from wedgewatch.io import evidence

    result = evidence.BundleResult(
        bundle=bundle,
        phase=CapturePhase.WEDGED,
        verdict="wedged",
        triage=Triage(TriageKind.UNKNOWN, "n/a"),
        failures=failures,
        ptrace_denied=ptrace_denied,
        deadline_exceeded=deadline,
        server_gone=gone,
    )
    assert capture_failure_reasons(result) == expected


def test_json_log_lines_keep_the_traceback() -> None:
    """`log.exception` in the JSON log (not a terminal) carries the traceback text."""
    code = (
        "import structlog\n"
        "from wedgewatch.cli import configure_logging\n"
        "configure_logging()\n"
        "try:\n"
        "    {}['missing_key']\n"
        "except KeyError:\n"
        "    structlog.get_logger('t').exception('worker_error', target='sim')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=60, check=True
    )
    line = json.loads(result.stderr.decode().strip().splitlines()[-1])
    assert line["event"] == "worker_error"
    assert line["level"] == "error"
    assert "Traceback (most recent call last)" in line["exception"]
    assert "KeyError: 'missing_key'" in line["exception"]


class RecordingWebhooks:
    """Stands in for `notify.WebhookNotifier` at its boundary: keeps what would be POSTed."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.stats = NotifyStats(sent=0, failed=0, dropped=0, retried=0)

    def start(self) -> None:
        return None

    def notify(self, notification: Notification) -> None:
        self.bodies.append(webhook_payload(notification, version="0.1.0", host="gpu-node-7"))


async def test_gave_up_webhook_body_is_the_documented_one(tmp_path: Path) -> None:
    """The POSTed gave_up body has the documented keys and names engine, family, state, bundle."""
    world = make_world(tmp_path, wedge_at(30), until=600, restart_ok=False, restart_budget=1)
    hooks = RecordingWebhooks()
    world.deps = replace(world.deps, notifier=WebhookNotifications(hooks))  # type: ignore[arg-type]
    await play(world)
    (body,) = [b for b in hooks.bodies if b["event"] == "gave_up"]
    assert set(body) == {
        "event", "target", "engine", "model_name", "family", "state", "reason", "bundle",
        "wedgewatch_version", "host", "timestamp", "text",
    }  # fmt: skip
    assert body["engine"] == "0"
    assert body["model_name"] == "m"
    assert body["family"] == "deferred_stall"
    assert body["state"] == "wedged"
    assert body["reason"].startswith("budget_exhausted: 1 restarts within the last")
    assert body["bundle"].startswith("/evidence/")
    assert body["text"].startswith("wedgewatch on gpu-node-7: gave_up for sim (m engine 0)")


async def test_nan_gauges_are_unknown_and_never_stop_the_state_from_saving(tmp_path: Path) -> None:
    """A NaN/Inf fault mid-run: engine unknown, no stall, no restart, the state file saves."""
    script = lambda t: "nan" if 20 <= t < 80 else "healthy"  # noqa: E731
    world = make_world(tmp_path, script, until=120)
    daemon, logs = await play(world)
    assert [line["state"] for line in events(logs, "engine_unknown")] == ["unknown"]
    assert events(logs, "stall_suspected") == []
    assert world.restarter.requests == []
    assert world.store.saves >= 2
    saved = statefile.decode(statefile.encode(world.store.saved, T0_WALL))
    assert isinstance(saved, statefile.SavedState)
    assert daemon.snapshot.targets["sim"].state == "ok"


def test_flight_recorder_is_bounded_in_bytes_and_entries() -> None:
    """The recorder drops the oldest entries past either bound and always keeps the newest."""
    from wedgewatch.daemon.report import FlightRecorder

    entry = {"timestamp": 1000.0, "engines": [{"engine": str(i)} for i in range(50)]}
    size = len(json.dumps(entry, sort_keys=True)) + 1
    recorder = FlightRecorder(max_entries=1000, max_bytes=10 * size)
    for n in range(100):
        recorder.append({**entry, "timestamp": float(1000 + n)})  # every entry `size` bytes
        assert recorder.size_bytes <= 10 * size
    assert len(recorder) == 10
    assert [e["timestamp"] for e in recorder.entries()] == [float(n) for n in range(1090, 1100)]
    by_count = FlightRecorder(max_entries=3, max_bytes=10**9)
    for n in range(5):
        by_count.append({"timestamp": float(n)})
    assert [e["timestamp"] for e in by_count.entries()] == [2.0, 3.0, 4.0]
    huge = FlightRecorder(max_entries=10, max_bytes=1024)
    huge.append(entry)
    huge.append({**entry, "timestamp": 2.0})
    assert [e["timestamp"] for e in huge.entries()] == [2.0]  # bigger than the bound, kept alone
