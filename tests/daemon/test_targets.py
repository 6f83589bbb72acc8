"""Independent targets: each keeps its own cadence on a virtual clock, whatever another does."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry
from test_loop import (
    FakeClock,
    FakeEvidence,
    FakeFinder,
    FakeNotifier,
    FakeServer,
    FakeService,
    MemoryStateStore,
)

from wedgewatch.config import Config
from wedgewatch.daemon.loop import TARGETS_PER_WAKEUP, Daemon, first_scrape_offsets
from wedgewatch.daemon.roles import Deps, ScrapeResult


class VirtualTime:
    """A sleeper on a virtual clock: time jumps to the next wake-up once everything waits."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self.clock.now + seconds, next(self._seq), future))
        await future

    async def run(self, seconds: float, stop: asyncio.Event) -> None:
        """Advance virtual time by `seconds`, waking sleepers in order, then set `stop`."""
        until = self.clock.now + seconds
        while self.clock.now < until:
            for _ in range(50):  # let every runnable task reach its next wait
                await asyncio.sleep(0)
            if not self._waiters:
                continue
            wake_at, _, future = heapq.heappop(self._waiters)
            self.clock.now = max(self.clock.now, wake_at)
            if not future.done():
                future.set_result(None)
        stop.set()


class SplitScraper:
    """The target named `hung` never answers (nor times out); every other one is healthy."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.servers: dict[str, FakeServer] = {}
        self.scrapes: dict[str, list[float]] = {}

    async def scrape(self, target: Any) -> ScrapeResult:
        self.scrapes.setdefault(target.name, []).append(self.clock.now)
        if target.name == "hung":
            await asyncio.Event().wait()
        server = self.servers.setdefault(target.name, FakeServer(self.clock, lambda t: "healthy"))
        return ScrapeResult(server.observe(self.clock.now), b"# fake body\n", 0.01)

    async def aclose(self) -> None:
        return None


def virtual_daemon(
    tmp_path: Path, targets: list[str], store: MemoryStateStore | None = None
) -> tuple[Daemon, SplitScraper, VirtualTime]:
    """A daemon over `targets` (remedy none, 1 s interval) on a virtual clock, not started."""
    clock = FakeClock()
    time = VirtualTime(clock)
    scraper = SplitScraper(clock)
    config = Config.model_validate(
        {
            "targets": targets,
            "interval_seconds": 1.0,
            "state_dir": str(tmp_path / "state"),
            "evidence_dir": str(tmp_path / "evidence"),
            "remedy": "none",
        }
    )
    deps = Deps(
        clock=clock,
        sleeper=time,
        scraper=scraper,
        evidence=FakeEvidence(),
        restarters={},
        finder=FakeFinder(),
        notifier=FakeNotifier(),
        state_store=store if store is not None else MemoryStateStore(),
        service=FakeService(),
        registry=CollectorRegistry(),
        serve_http=False,
    )
    return Daemon(config, deps), scraper, time


async def run_daemon(
    tmp_path: Path,
    targets: list[str],
    seconds: float,
    *,
    store: MemoryStateStore | None = None,
) -> tuple[Daemon, SplitScraper, float]:
    """Run a daemon over `targets` for `seconds` of virtual time: it, its scraper, its start."""
    daemon, scraper, time = virtual_daemon(tmp_path, targets, store)
    start = time.clock.now
    stop = asyncio.Event()
    with structlog.testing.capture_logs():
        await asyncio.gather(daemon.run(stop), time.run(seconds, stop))
    return daemon, scraper, start


async def test_a_hung_target_never_delays_another(tmp_path: Path) -> None:
    """Beside a target whose scrape never returns, the others keep their 1 s cadence."""
    targets = ["a=http://127.0.0.1:8001", "hung=http://127.0.0.1:8002", "b=http://127.0.0.1:8003"]
    daemon, scraper, _ = await run_daemon(tmp_path, targets, 30.0)
    for name in ("a", "b"):
        times = scraper.scrapes[name]
        assert len(times) >= 30
        assert max(b - a for a, b in itertools.pairwise(times)) == 1.0
        assert daemon.snapshot.targets[name].state == "ok"
    assert len(scraper.scrapes["hung"]) == 1  # one scrape, still in flight
    assert daemon.snapshot.targets["hung"].state == "starting"
    assert daemon.snapshot.ticks >= 30  # the heartbeat kept going


def test_targets_share_wakeups_in_slots_spread_over_the_interval() -> None:
    """Up to 16 targets start together; more are dealt round-robin into evenly spaced slots."""
    assert first_scrape_offsets(1, 1.0) == [0.0]
    assert first_scrape_offsets(16, 2.0) == [0.0] * 16
    assert first_scrape_offsets(5, 1.0, per_wakeup=2) == [0.0, 1 / 3, 2 / 3, 0.0, 1 / 3]
    for targets in (17, 40, 1000):
        offsets = first_scrape_offsets(targets, 1.0)
        slots = sorted(set(offsets))
        assert len(slots) == -(-targets // TARGETS_PER_WAKEUP)
        assert slots == [i / len(slots) for i in range(len(slots))]  # evenly over one interval
        shares = [offsets.count(slot) for slot in slots]
        assert max(shares) <= TARGETS_PER_WAKEUP
        assert max(shares) - min(shares) <= 1


async def test_many_targets_scrape_in_slots_each_on_its_own_cadence(tmp_path: Path) -> None:
    """40 targets: three instants a third of a second apart, each target every 1 s after."""
    targets = [f"t{i}=http://127.0.0.1:{8001 + i}" for i in range(40)]
    _, scraper, start = await run_daemon(tmp_path, targets, 10.0)
    firsts = [round(scraper.scrapes[f"t{i}"][0] - start, 6) for i in range(40)]
    assert sorted(set(firsts)) == [0.0, round(1 / 3, 6), round(2 / 3, 6)]
    assert sorted(firsts.count(t) for t in set(firsts)) == [13, 13, 14]
    for i in range(40):
        times = scraper.scrapes[f"t{i}"]
        assert len(times) >= 9
        assert all(abs(b - a - 1.0) < 1e-9 for a, b in itertools.pairwise(times))


async def test_quiet_targets_do_not_rewrite_the_state_file(tmp_path: Path) -> None:
    """With nothing notable happening the state file is written every 30 s, not every tick."""
    store = MemoryStateStore()
    targets = [f"t{i}=http://127.0.0.1:{8001 + i}" for i in range(5)]
    _, scraper, _ = await run_daemon(tmp_path, targets, 120.0, store=store)
    assert all(len(scraper.scrapes[f"t{i}"]) >= 120 for i in range(5))
    assert store.saves <= 1 + 120 // 30 + 1  # the first save, the refreshes, the last one
    assert set(store.saved.targets) == {f"t{i}" for i in range(5)}
