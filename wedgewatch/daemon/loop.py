"""`wedgewatch run`: the watch loop, the one place where IO meets the decision cores.

Every target runs on its own cadence (`daemon.target.TargetRunner`): every
`interval_seconds` it scrapes the target, folds the observation into the pure detector
(`detect.step`) and the pure episode core (`core.episode.step`), and performs the effects
the core asks for: queue evidence and restarts on the target's worker, report (log line,
metric, webhook), persist. A slow or hung target delays only itself. The worker runs one
job at a time (evidence before restart), each under a timeout, so `/health` stays honest
while py-spy or systemctl take their time.

When and what to capture, restart, retry, give up and keep across a restart of
wedgewatch is decided in `core/episode/episode.py` (its rule table) and
`core/restart/restart_policy.py` (the
restart policy: budget, backoff, startup grace, gave_up); this module owns no decision. The
daemon's heartbeat (watchdog, operator reset requests, the state file, the tick count of
`/health`) runs after whichever target step comes first once half an interval has passed.
Persistence and the published snapshot cost in proportion to what changed: each target
rebuilds its own snapshot after its step, the whole `Snapshot` is assembled only when an
endpoint asks, and the state file reuses the records of targets that did not change.

The state file is written off the loop by one writer thread (`statefile.StateWriter`): a
step hands over a snapshot and goes on, the newest snapshot waiting replaces an older one,
so a slow disk delays no scrape and no `/health`. Where durability is promised the writer
is awaited (off the loop): a restart's remedy runs only once the state counting its attempt
is written ("the attempt counts even if we die"; see `state_written`), and shutdown writes
the last state before it returns. A failed write is logged as `state_save_failed`.

`run(config, deps)` is the composition root; tests pass fakes (a fake clock replays a
30-minute story in milliseconds) and `daemon.adapters.real_deps(config)` builds the real
adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import signal
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from wedgewatch import __version__
from wedgewatch.config.plain import ConfigError, setting_names
from wedgewatch.core.detection.states import SCRAPE_FAILURE_REASONS, EngineState, Family
from wedgewatch.core.episode import episode as episode_core
from wedgewatch.core.restart import restart_policy
from wedgewatch.core.values import immutable
from wedgewatch.daemon.adapters import FileStateStore, capture_deadline_seconds, real_deps
from wedgewatch.daemon.ownmetrics import OwnMetrics
from wedgewatch.daemon.publish import restored_core
from wedgewatch.daemon.report import Reporter, install_secret_scrubber, shown_url
from wedgewatch.daemon.roles import Deps
from wedgewatch.daemon.server import HttpServer, Snapshot, make_app
from wedgewatch.daemon.target import TargetRunner, Timeouts
from wedgewatch.io import restarters, statefile

if TYPE_CHECKING:
    from wedgewatch.config import Config, Target

__all__ = ["Daemon", "Reloader", "changed_settings", "first_scrape_offsets", "run", "serve"]

log = structlog.get_logger("wedgewatch.daemon")

# Up to this many targets share a wakeup: their cadences start at the same instant, so
# their scrapes run back to back while the interpreter's caches are warm. A scrape after a
# sleep costs about 1.3 ms of CPU, one right after another about 0.8 ms
# (bench/bench_targets.py, 2026-12-03, docs/benchmarks.md "Shared wakeups"); a slot of 16
# scrapes is ~10 ms of work, and more targets are spread over more slots, so a thousand
# targets never scrape at one instant.
TARGETS_PER_WAKEUP = 16

# How often the state file is refreshed while nothing notable happens (detector clocks).
_PERSIST_EVERY_SECONDS = 30.0
# How long a restart waits for the state that counts its attempt to reach the disk before
# its remedy runs anyway (logged as state_save_stalled): a hung disk must not keep a wedged
# server wedged, and a failed write (state_save_failed) never held a restart back either.
_WRITE_BEFORE_RESTART_SECONDS = 30.0
# Extra time granted to an evidence capture beyond its py-spy deadlines (process sampling,
# nvidia-smi, writing files) before the daemon gives up waiting for it.
_CAPTURE_SLACK_SECONDS = 15.0


class Daemon:
    """The watch loop over every configured target; see the module docstring."""

    def __init__(self, config: Config, deps: Deps) -> None:
        if not config.targets:
            raise ValueError("no targets to watch: give --target URL or targets in the config")
        self.config = config
        self.deps = deps
        self.policy = config.detection_policy()
        self.restart_policy = config.restart_policy()
        self.metrics = OwnMetrics(
            deps.registry,
            version=__version__,
            states=tuple(EngineState),
            families=tuple(Family),
            scrape_failure_reasons=SCRAPE_FAILURE_REASONS,
        )
        self.timeouts = Timeouts(
            capture_seconds=capture_deadline_seconds(config) + _CAPTURE_SLACK_SECONDS,
            restart_seconds=(
                max(
                    config.grace_seconds + restarters.KILL_WAIT_SECONDS,
                    restarters.COMMAND_TIMEOUT_SECONDS,
                )
                + 30.0
            ),
        )
        reporter = Reporter(config, self.policy, self.metrics, deps.notifier)
        history_len = max(2, math.ceil(config.history_seconds / config.interval_seconds) + 1)
        self._targets = {
            t.name: TargetRunner(
                t,
                config=config,
                deps=deps,
                detect_policy=self.policy,
                rules=episode_core.Rules(
                    target=t.name,
                    remedy=config.remedy,
                    can_restart=t.name in deps.restarters,
                    restart_policy=self.restart_policy,
                    probe_respects_budget=config.probe_respects_budget,
                    suspect_capture_min_interval_seconds=(
                        config.suspect_capture_min_interval_seconds
                    ),
                    detect=self.policy,
                    abort_first=config.abort_first,
                ),
                reporter=reporter,
                timeouts=self.timeouts,
                history_len=history_len,
                host=self,
            )
            for t in config.targets
        }
        clock = deps.clock
        now_at, now = clock.monotonic(), clock.wall()
        self._started_at = now_at
        self._started_timestamp = now
        self._ticks = 0
        self._last_tick_at: float | None = None
        self._last_tick_timestamp: float | None = None
        self._last_persist_at = now_at
        self._writer = statefile.StateWriter(deps.state_store.save, _log_save_failed)
        self.write_before_restart_seconds = _WRITE_BEFORE_RESTART_SECONDS
        self._last_write: Future[statefile.SaveResult] | None = None
        self._dirty = False
        self._status_dirty = False
        self._webhook_failures = 0
        self.health_stale_after_seconds = (
            3 * config.interval_seconds + config.scrape_timeout_seconds
        )
        for rt in self._targets.values():
            rt.publish(now_at, now)
        self._published: Snapshot | None = None

    # -- public surface -------------------------------------------------------------------

    @property
    def capture_timeout_seconds(self) -> float:
        """How long the worker waits for one evidence capture."""
        return self.timeouts.capture_seconds

    @capture_timeout_seconds.setter
    def capture_timeout_seconds(self, seconds: float) -> None:
        self.timeouts.capture_seconds = seconds

    @property
    def snapshot(self) -> Snapshot:
        """The latest snapshot, assembled from the targets' own when something changed."""
        if self._published is None:
            self._published = Snapshot(
                version=__version__,
                started_at=self._started_at,
                started_timestamp=self._started_timestamp,
                health_stale_after_seconds=self.health_stale_after_seconds,
                last_tick_at=self._last_tick_at,
                last_tick_timestamp=self._last_tick_timestamp,
                ticks=self._ticks,
                targets={name: rt.snapshot for name, rt in self._targets.items() if rt.snapshot},
            )
        return self._published

    def flight_records(self) -> list[tuple[Target, tuple[Mapping[str, Any], ...], bytes | None]]:
        """Per target: the flight recorder's entries and the last good /metrics body."""
        return [(rt.target, rt.history.entries(), rt.last_body) for rt in self._targets.values()]

    def jobs_pending(self) -> int:
        """Evidence captures and restarts queued or running, over all targets."""
        return sum(rt.queue.qsize() + (rt.busy is not None) for rt in self._targets.values())

    def probe_failed(self, name: str) -> None:
        """/probe sent a 503 about target `name` (rule Q2 of the episode core)."""
        rt = self._targets.get(name)
        if rt is not None:
            rt.probe_failed()

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
            back = restored_core(record, rt.rules, at, now, url=rt.target.metrics_url)
            if back.problem is not None:
                log.warning("detector_state_ignored", target=name, reason=back.problem)
            detector = back.detector
            if detector is not None:
                rt.detector = detector
            rt.core = back.state
            rt.publish(at, now)
            log.info(
                "state_restored",
                target=name,
                restart_phase=str(rt.core.policy.phase),
                restart_budget_remaining=restart_policy.budget_remaining(
                    rt.core.policy, self.restart_policy, at
                ),
                detector_restored=detector is not None,
                episode=rt.core.episode.episode_id if rt.core.episode else None,
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Run every target's cadence and worker until `stop` is set, then shut down."""
        for name, rt in self._targets.items():
            self.metrics.add_target(
                name,
                state=str(EngineState.STARTING),
                remedy=self.config.remedy,
                budget_remaining=restart_policy.budget_remaining(
                    rt.core.policy, self.restart_policy, self.deps.clock.monotonic()
                ),
            )
            if rt.canary.on:
                self.metrics.add_canary(name)
            rt.worker = asyncio.create_task(rt.work(), name=f"wedgewatch-worker-{name}")
        offsets = first_scrape_offsets(len(self._targets), self.config.interval_seconds)
        cadences = [
            asyncio.create_task(rt.cadence(stop, offset), name=f"wedgewatch-target-{name}")
            for offset, (name, rt) in zip(offsets, self._targets.items(), strict=True)
        ]
        try:
            await stop.wait()
        finally:
            for task in cadences:
                task.cancel()
            await asyncio.gather(*cadences, return_exceptions=True)
            for rt in self._targets.values():
                rt.canary.cancel()  # a canary in flight dies with its cadence
            await self._shutdown()

    # -- Host: what the targets tell the daemon -------------------------------------------

    def target_changed(self, name: str, *, state_changed: bool) -> None:
        """A target's snapshot or record changed."""
        self._published = None
        if state_changed:
            self._status_dirty = True
        if self._targets[name].record is None:
            self._dirty = True

    def persist_now(self) -> None:
        """Save now (before and after a restart: the attempt counts even if we die).

        The snapshot goes to the writer thread at once; `state_written` waits for it.
        """
        clock = self.deps.clock
        self._persist(clock.monotonic(), clock.wall())

    async def state_written(self) -> None:
        """Wait (the loop runs on) until the newest state handed over is written or failed.

        Bounded by `write_before_restart_seconds`: past it a warning `state_save_stalled`
        is logged and the caller goes on (the write stays queued).
        """
        await self._await_write(self.write_before_restart_seconds)

    def after_step(self) -> None:
        """The heartbeat, at most about twice per interval, after any target's step."""
        clock = self.deps.clock
        now_at = clock.monotonic()
        last = self._last_tick_at
        if last is not None and now_at - last < 0.5 * self.config.interval_seconds:
            return
        now = clock.wall()
        resets = self.deps.state_store.take_resets()
        if resets.everything or resets.targets:
            for rt in self._targets.values():
                if resets.covers(rt.name):
                    rt.feed(episode_core.OperatorReset(), now_at, now)
                    rt.publish(now_at, now)
        self._ticks += 1
        self._last_tick_at, self._last_tick_timestamp = now_at, now
        self._published = None
        self.metrics.mark_tick(now)
        failures = self.deps.notifier.failures()
        for _ in range(failures - self._webhook_failures):
            self.metrics.count_webhook_failure()
        self._webhook_failures = failures
        if self._status_dirty:
            self._status_dirty = False
            self.deps.service.status(self._status_line())
        self.deps.service.watchdog()
        if self._dirty or now_at - self._last_persist_at >= _PERSIST_EVERY_SECONDS:
            self._persist(now_at, now)

    # -- shutdown and persistence -----------------------------------------------------------

    async def _shutdown(self) -> None:
        """Let an in-flight capture or restart finish (or time out); drop queued jobs."""
        for rt in self._targets.values():
            dropped = 0
            while not rt.queue.empty():
                rt.queue.get_nowait()
                rt.queue.task_done()
                dropped += 1
            if dropped:
                log.info("jobs_dropped", target=rt.name, count=dropped)
        workers = [rt.worker for rt in self._targets.values() if rt.worker is not None]
        busy = [rt for rt in self._targets.values() if rt.busy is not None]
        if busy:
            log.info("waiting_for_jobs", targets=[rt.name for rt in busy])
            limit = max(self.timeouts.capture_seconds, self.timeouts.restart_seconds)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(limit):
                    await asyncio.gather(*(rt.queue.join() for rt in busy))
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        hooks = [task for rt in self._targets.values() for task in rt.hooks]
        if hooks:  # each is bounded by on_bundle_timeout_seconds; a second signal cuts it short
            log.info("waiting_for_bundle_hooks", count=len(hooks))
            await asyncio.gather(*hooks, return_exceptions=True)
        clock = self.deps.clock
        self._persist(clock.monotonic(), clock.wall(), refresh=True)
        # The last state reaches the disk before we return: `close` writes what is pending
        # and stops the writer thread, waited for off the loop (a second signal cuts it short).
        await asyncio.to_thread(self._writer.close)

    async def _await_write(self, timeout_seconds: float) -> bool:
        """Wait for the newest hand-over's write; False if it did not end in time."""
        future = self._last_write
        if future is None or future.done():
            return True
        try:
            async with asyncio.timeout(timeout_seconds):
                await asyncio.shield(asyncio.wrap_future(future))
        except TimeoutError:
            log.warning(
                "state_save_stalled",
                waited_seconds=timeout_seconds,
                reason="the state file write has not finished; going on without it",
            )
            return False
        return True

    def _persist(self, at: float, now: float, *, refresh: bool = False) -> None:
        """Save every target's record; unchanged ones are reused until the periodic refresh."""
        refresh = refresh or at - self._last_persist_at >= _PERSIST_EVERY_SECONDS
        targets = {
            name: rt.saved_record(at, now, refresh=refresh) for name, rt in self._targets.items()
        }
        self._last_write = self._writer.submit(statefile.SavedState(targets=targets), now)
        if refresh:
            self._last_persist_at = at
        self._dirty = False

    def _status_line(self) -> str:
        states = ", ".join(f"{n}={rt.target_state}" for n, rt in self._targets.items())
        return f"watching {len(self._targets)} target(s): {states}"


def _log_save_failed(failed: statefile.SaveFailed) -> None:
    """On the writer thread: a state file that could not be written (failures as data)."""
    log.error("state_save_failed", reason=failed.message)


# ---------------------------------------------------------------------------------------------
# Entry point


@immutable
class Reloader:
    """How `run` reloads its configuration on SIGHUP (`serve` builds the real one).

    `load` reads the configuration again from its sources (raising `ConfigError` when it
    does not validate); `build` makes the adapters for a configuration (raising
    RuntimeError/ValueError when they cannot work); `release` lets go of what the old
    adapters hold once the loop has stopped with them (the state directory's lock).
    """

    load: Callable[[], Config]
    build: Callable[[Config], Deps]
    release: Callable[[Deps], None]


#: Settings a reload cannot change: the HTTP endpoints stay bound to their address.
FIXED_ON_RELOAD = ("listen_host", "listen_port")


def changed_settings(old: Config, new: Config) -> list[str]:
    """The names of the settings whose values differ (values are not shown: secrets)."""
    return [name for name in setting_names(old) if getattr(old, name) != getattr(new, name)]


class _CurrentRegistry(CollectorRegistry):
    """The registry of the loop running now, for endpoints that outlive a reload."""

    def __init__(self, current: Callable[[], CollectorRegistry]) -> None:
        super().__init__(auto_describe=False)
        self._current = current

    def collect(self) -> Iterator[Metric]:
        """The current loop's metric families."""
        return iter(self._current().collect())


async def run(
    config: Config,
    deps: Deps,
    *,
    stop: asyncio.Event | None = None,
    on_stopped: Callable[[Daemon], Awaitable[None]] | None = None,
    reloader: Reloader | None = None,
) -> int:
    """Run the daemon until SIGTERM/SIGINT (or `stop`); 0 on a clean stop.

    The first SIGTERM/SIGINT stops the loop and lets an in-flight capture or restart finish
    or time out; a second one cancels it at once. `on_stopped` runs once the loop has
    stopped, before the endpoints close (`launch --watch` writes a crash bundle there).

    With a `reloader`, SIGHUP reloads the configuration (`_reload`): when the new one
    validates, the watch loop stops as it does for SIGTERM (the state is written), and
    starts again with the new settings and fresh adapters, the restart budget, detector
    and episode restored from the state file; the HTTP endpoints stay up throughout.
    When it does not validate, the running configuration is kept and the log says why.
    """
    stop_event = stop if stop is not None else asyncio.Event()
    reload_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    main_task = asyncio.current_task()

    def on_signal(sig: signal.Signals) -> None:
        if stop_event.is_set() and main_task is not None:
            main_task.cancel()  # the second signal: do not wait any longer
        stop_event.set()

    daemon = Daemon(config, deps)
    daemon.restore()
    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        if reloader is not None:
            # Only an event is set here; the reload and its log lines happen in the loop.
            loop.add_signal_handler(signal.SIGHUP, reload_requested.set)
            installed.append(signal.SIGHUP)

    def probe_failed(name: str) -> None:  # the daemon running now (a reload replaces it)
        daemon.probe_failed(name)

    server: HttpServer | None = None
    try:
        if deps.serve_http:
            app = make_app(
                lambda: daemon.snapshot,
                _CurrentRegistry(lambda: daemon.deps.registry),
                deps.clock.monotonic,
                on_probe_failed=probe_failed,
            )
            server = HttpServer(app, config.listen_host, config.listen_port)
            await server.start()
            host, port = server.address
            log.info("http_listening", host=host, port=port)
        log.info(
            "daemon_started",
            version=__version__,
            targets={t.name: shown_url(t.metrics_url) for t in config.targets},
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
        while True:
            cycle_stop = asyncio.Event()
            running = asyncio.create_task(daemon.run(cycle_stop), name="wedgewatch-loop")
            reloaded: tuple[Config, Deps] | None = None
            while reloaded is None and not running.done() and not stop_event.is_set():
                waits = [
                    asyncio.ensure_future(stop_event.wait()),
                    asyncio.ensure_future(reload_requested.wait()),
                ]
                try:
                    await asyncio.wait([running, *waits], return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:
                    running.cancel()
                    raise
                finally:
                    for wait in waits:
                        wait.cancel()
                if reload_requested.is_set() and not stop_event.is_set() and reloader:
                    reload_requested.clear()
                    reloaded = await _reload(config, reloader, cycle_stop, running, daemon)
            cycle_stop.set()
            try:
                await running
            except asyncio.CancelledError:
                running.cancel()  # a second signal: the loop's shutdown is cut short too
                raise
            if reloaded is None:
                break
            config, deps = reloaded
            daemon = Daemon(config, deps)
            daemon.restore()
            deps.service.status(daemon._status_line())
        if on_stopped is not None:
            await on_stopped(daemon)
    finally:
        deps = daemon.deps
        deps.service.stopping("stopping")
        log.info("daemon_stopping")
        if server is not None:
            await server.stop()
        await _close_adapters(deps)
        for sig in installed:
            loop.remove_signal_handler(sig)
        log.info("daemon_stopped")
    return 0


async def _close_adapters(deps: Deps) -> None:
    await deps.notifier.aclose(5.0)
    await deps.scraper.aclose()
    if deps.canary is not None:
        await deps.canary.aclose()


async def _reload(
    config: Config,
    reloader: Reloader,
    cycle_stop: asyncio.Event,
    running: asyncio.Task[None],
    daemon: Daemon,
) -> tuple[Config, Deps] | None:
    """SIGHUP: the new configuration and its adapters, with the loop stopped; None (and
    the loop running on) when the running configuration is kept."""
    try:
        # Off the loop: `run` validates in a child process (`daemon.validated`).
        new = await asyncio.to_thread(reloader.load)
    except (ConfigError, ValueError) as exc:
        reasons = exc.messages if isinstance(exc, ConfigError) else (str(exc),)
        log.warning(
            "config_reload_rejected",
            reasons=list(reasons),
            kept="the running configuration: the new one does not validate",
        )
        return None
    changed = changed_settings(config, new)
    fixed = [name for name in FIXED_ON_RELOAD if name in changed]
    problem = (
        "no targets to watch"
        if not new.targets
        else f"{', '.join(fixed)} cannot change without a restart of wedgewatch"
        if fixed
        else None
    )
    if problem is not None:
        log.warning("config_reload_rejected", reasons=[problem], kept="the running configuration")
        return None
    if not changed:
        log.info("config_reload_unchanged", reason="the configuration is the same")
        return None
    log.info("config_reloading", changed=changed)
    cycle_stop.set()
    await running  # a clean stop: in-flight jobs finish, the state is written
    await _close_adapters(daemon.deps)
    reloader.release(daemon.deps)
    try:
        deps = reloader.build(new)
    except (RuntimeError, ValueError) as exc:
        log.error(
            "config_reload_failed",
            reason=str(exc),
            kept="the previous configuration, with fresh adapters",
        )
        return config, reloader.build(config)
    install_secret_scrubber(new)
    log.info("config_reloaded", changed=changed)
    return new, deps


def first_scrape_offsets(
    targets: int, interval_seconds: float, per_wakeup: int = TARGETS_PER_WAKEUP
) -> list[float]:
    """When each target's first scrape starts, in seconds after the daemon started.

    The targets are dealt round-robin into `ceil(targets / per_wakeup)` slots spread evenly
    over one interval: at most `per_wakeup` targets start at the same instant (and keep
    sharing a wakeup, their cadences being equal), and slots hold equal shares.
    """
    slots = max(1, math.ceil(targets / per_wakeup))
    return [(index % slots) * interval_seconds / slots for index in range(targets)]


def serve(
    config: Config,
    *,
    supervisor: restarters.Supervisor | None = None,
    load_config: Callable[[], Config] | None = None,
) -> int:
    """`wedgewatch run`: build the real adapters and run until stopped; the exit code.

    0 after a clean stop, 2 when the settings cannot work (no target, state directory in
    use, unknown remedy setup), 1 when the HTTP port cannot be bound, 130 when a second
    signal cut the shutdown short. With `load_config`, SIGHUP reloads the configuration
    (see `run`).
    """
    if not config.targets:
        log.error(
            "no_targets", reason="give --target URL (repeatable) or [[targets]] in the config"
        )
        return 2
    install_secret_scrubber(config)
    try:
        deps = real_deps(config, supervisor=supervisor)
    except (RuntimeError, ValueError) as exc:
        log.error("startup_failed", reason=str(exc))
        return 2
    current = [deps]

    def build(new: Config) -> Deps:
        current[0] = real_deps(new, supervisor=supervisor)
        return current[0]

    def release(old: Deps) -> None:
        if isinstance(old.state_store, FileStateStore):
            old.state_store.close()

    reloader = None if load_config is None else Reloader(load_config, build, release)
    # What start-up built (modules, the config, the adapters) lives as long as the daemon:
    # moved out of the collector's reach, a full collection no longer walks it again and
    # again (a py-spy profile of bench/bench_targets.py at 100 targets, 2026-12-02, put 6 % of
    # the daemon's samples in such collections: docs/benchmarks.md "Daemon: many targets").
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(run(config, deps, reloader=reloader))
    except OSError as exc:
        log.error("startup_failed", reason=str(exc))
        return 1
    except asyncio.CancelledError:
        log.warning("shutdown_cut_short", reason="a second signal arrived during shutdown")
        return 130
    finally:
        release(current[0])
