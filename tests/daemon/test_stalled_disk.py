"""A disk that hangs delays no scrape and no /health: the state file is written by one
writer thread, the newest snapshot wins, a restart waits (off the loop) for the state that
counts its attempt, and shutdown writes the last state before it returns.

The stand-in for the disk is a state store whose save waits at a gate (a threading.Event)
that the test opens; time is virtual (the daemon's clock and sleeper, as in test_targets),
/health is asked over the daemon's real HTTP server on 127.0.0.1. A save held on the event
loop would stop everything: the gate gives up after SAFETY_SECONDS so that such a bug fails
the test (`gave_up` counts it) rather than hanging it. No assertion depends on how long
anything takes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
import pytest
import structlog
from test_loop import (
    T0_WALL,
    MemoryStateStore,
    events,
    make_world,
    wedge_at,
)
from test_targets import virtual_daemon

from wedgewatch.core.restart import restart_policy
from wedgewatch.daemon.adapters import FileStateStore
from wedgewatch.daemon.loop import Daemon
from wedgewatch.daemon.server import HttpServer, make_app
from wedgewatch.io import restarters, statefile

SAFETY_SECONDS = 10.0


@dataclass
class HangingDisk(MemoryStateStore):
    """A state store whose saves wait at `gate` while it is closed (a hung disk)."""

    gate: threading.Event = field(default_factory=threading.Event)
    holding: threading.Event = field(default_factory=threading.Event)  # a save is held
    written: list[float] = field(default_factory=list)  # timestamps of finished saves
    landed: list[statefile.SavedState] = field(default_factory=list)
    gave_up: int = 0  # saves the gate let through only after SAFETY_SECONDS: a blocked loop
    hang_when: object = None  # a predicate on the state: close the gate for this save

    def __post_init__(self) -> None:
        self.gate.set()
        self._done = threading.Condition()

    def save(self, state: statefile.SavedState, timestamp: float) -> statefile.Saved:
        predicate = self.hang_when
        if callable(predicate) and predicate(state):
            self.hang_when = None
            self.gate.clear()
        if not self.gate.is_set():
            self.holding.set()
            if not self.gate.wait(SAFETY_SECONDS):
                self.gave_up += 1
                self.gate.set()  # once is enough to fail the test
            self.holding.clear()
        saved = super().save(state, timestamp)
        with self._done:
            self.written.append(timestamp)
            self.landed.append(state)
            self._done.notify_all()
        return saved

    def wait_written(self, count: int) -> bool:
        """Block (in a thread) until `count` saves have finished."""
        with self._done:
            return self._done.wait_for(lambda: len(self.written) >= count, SAFETY_SECONDS)


@pytest.fixture
def disk() -> Iterator[HangingDisk]:
    store = HangingDisk()
    yield store
    store.gate.set()  # never leave a writer thread stuck behind a failed test


def counts_an_attempt(state: statefile.SavedState) -> bool:
    """Whether the state of target `sim` counts a restart attempt."""
    record = state.targets["sim"].restart_policy
    return record is not None and bool(record.restart_timestamps)


async def in_thread_wait(event: threading.Event) -> bool:
    return await asyncio.to_thread(event.wait, SAFETY_SECONDS)


async def test_scrapes_and_health_go_on_while_the_disk_hangs(
    tmp_path: Path, disk: HangingDisk
) -> None:
    """70 virtual seconds on a disk that hangs from the first write: both targets keep their
    1 s cadence, the heartbeat ticks, /health answers 200; once the disk comes back the
    newest snapshot lands (the one handed over in between never does), and shutdown waits
    for the last state."""
    daemon, scraper, time = virtual_daemon(
        tmp_path, ["a=http://127.0.0.1:8001", "b=http://127.0.0.1:8002"], disk
    )
    clock, start, registry = time.clock, time.clock.now, daemon.deps.registry
    server = HttpServer(
        make_app(lambda: daemon.snapshot, registry, clock.monotonic), "127.0.0.1", 0
    )
    await server.start()
    host, port = server.address
    stop = asyncio.Event()
    disk.gate.clear()  # the disk hangs from the first write on
    try:
        with structlog.testing.capture_logs() as logs:
            running = asyncio.create_task(daemon.run(stop))
            await time.run(0.5, asyncio.Event())  # the first steps hand over the first state
            assert await in_thread_wait(disk.holding)
            ticks, scrapes = daemon.snapshot.ticks, {n: len(scraper.scrapes[n]) for n in "ab"}

            await time.run(70.0, asyncio.Event())  # refreshes due at 30 s and 60 s
            assert disk.holding.is_set()  # the first write still hangs
            assert disk.written == []
            for name in "ab":
                assert len(scraper.scrapes[name]) >= scrapes[name] + 69  # one per virtual second
            assert daemon.snapshot.ticks >= ticks + 60
            async with httpx.AsyncClient() as client:
                health = await client.get(f"http://{host}:{port}/health")
            assert health.status_code == 200
            assert health.json()["status"] == "ok"
            assert health.json()["ticks"] == daemon.snapshot.ticks
            assert disk.holding.is_set()  # all of it while the disk still hung

            disk.gate.set()  # the disk comes back: the first write, then only the newest
            assert await asyncio.to_thread(disk.wait_written, 2)
            assert disk.written == [T0_WALL + start, T0_WALL + start + 60.0]

            disk.gate.clear()  # hangs again; shutdown must still write the last state
            stop.set()
            assert await in_thread_wait(disk.holding)
            for _ in range(100):
                await asyncio.sleep(0)
            assert not running.done()  # shutdown waits for the last state
            async with httpx.AsyncClient() as client:  # and the loop still serves meanwhile
                assert (await client.get(f"http://{host}:{port}/health")).status_code == 200
            disk.gate.set()
            await running
    finally:
        disk.gate.set()
        await server.stop()
    assert disk.written[-1] == clock.wall()  # the state at shutdown landed
    assert disk.gave_up == 0  # no save ever held the loop
    assert events(logs, "state_save_failed") == []
    assert events(logs, "state_save_stalled") == []


async def test_a_restart_runs_only_once_its_attempt_is_on_disk(
    tmp_path: Path, disk: HangingDisk
) -> None:
    """The disk hangs on the write that counts a restart attempt: scrapes go on meanwhile,
    the remedy waits for that write, then runs (the attempt counts even if we die)."""

    disk.hang_when = counts_an_attempt
    world = make_world(tmp_path, wedge_at(30), until=100_000, store=disk)
    world.sleeper.settle = False  # time goes on while the restart waits for the disk
    seen: dict[str, int] = {"while_held": 0, "restarts_while_held": 0}
    at_restart: list[int] = []
    real_restart = world.restarter.restart

    async def restart(request: restarters.RestartRequest) -> restart_policy.RestartOutcome:
        at_restart.append(len(disk.written))
        return await real_restart(request)

    world.restarter.restart = restart  # type: ignore[method-assign]
    released = False

    def tick(now: float) -> None:
        nonlocal released
        if disk.gave_up:  # the write held the loop: no use going on
            world.stop.set()
        elif disk.holding.is_set():
            seen["while_held"] += 1
            seen["restarts_while_held"] += len(world.restarter.requests)
            if seen["while_held"] >= 50:
                released = True
                disk.gate.set()
        elif released and world.restarter.requests and disk.gate.is_set():
            world.stop.set()

    world.sleeper.on_tick = tick
    daemon = Daemon(world.config, world.deps)
    world.sleeper.daemon = daemon
    with structlog.testing.capture_logs() as logs:
        await daemon.run(world.stop)
    assert seen["while_held"] >= 50  # 50 scrape intervals passed while the write hung
    assert seen["restarts_while_held"] == 0  # and the remedy waited for it
    assert len(world.restarter.requests) == 1
    (written_before,) = at_restart
    assert any(counts_an_attempt(state) for state in disk.landed[:written_before])
    assert disk.gave_up == 0
    assert events(logs, "restart_requested")
    assert events(logs, "state_save_stalled") == []


async def test_a_failed_write_is_logged_and_the_loop_goes_on(tmp_path: Path) -> None:
    """A real state file that cannot be written (a directory stands in its place): every
    write is logged as state_save_failed, from the writer thread, and the daemon goes on."""
    state_dir = tmp_path / "state"
    store = FileStateStore(state_dir)
    try:
        (state_dir / statefile.STATE_FILE_NAME).mkdir()
        world = make_world(tmp_path, wedge_at(30), until=100, remedy_name="none")
        world = replace(world, deps=replace(world.deps, state_store=store))
        daemon = Daemon(world.config, world.deps)
        world.sleeper.daemon = daemon
        with structlog.testing.capture_logs() as logs:
            await daemon.run(world.stop)
    finally:
        store.close()
    failed = events(logs, "state_save_failed")
    assert len(failed) >= 2  # the first save, ..., the one at shutdown
    assert all(line["log_level"] == "error" for line in failed)
    assert all("cannot write state file" in line["reason"] for line in failed)
    assert daemon.snapshot.ticks >= 99  # one heartbeat per virtual second all along
    assert events(logs, "wedge_detected")


async def test_a_restart_goes_ahead_when_the_disk_never_answers(
    tmp_path: Path, disk: HangingDisk
) -> None:
    """A write that does not finish within write_before_restart_seconds does not keep a
    wedged server wedged: state_save_stalled, the remedy runs, the write lands later."""

    disk.hang_when = counts_an_attempt
    world = make_world(tmp_path, wedge_at(30), until=100_000, store=disk)
    world.sleeper.settle = False
    daemon = Daemon(world.config, world.deps)
    daemon.write_before_restart_seconds = 0.05  # real seconds; the gate holds far longer
    world.sleeper.daemon = daemon
    held_at_restart: list[bool] = []
    real_restart = world.restarter.restart

    async def restart(request: restarters.RestartRequest) -> restart_policy.RestartOutcome:
        held_at_restart.append(not any(counts_an_attempt(state) for state in disk.landed))
        disk.gate.set()  # the disk comes back once the remedy ran
        world.stop.set()
        return await real_restart(request)

    world.restarter.restart = restart  # type: ignore[method-assign]
    with structlog.testing.capture_logs() as logs:
        await daemon.run(world.stop)
    assert held_at_restart == [True]  # the remedy ran before the attempt's write landed
    # The first write that waited past the bound says so (a busy machine may stall a later
    # write too, and that one says so as well).
    stalled = events(logs, "state_save_stalled")[0]
    assert stalled["waited_seconds"] == 0.05
    assert stalled["log_level"] == "warning"
    assert any(counts_an_attempt(state) for state in disk.landed)  # it landed after all
    assert disk.gave_up == 0
