"""One watched target in the daemon: its own cadence, its worker, and its effect runner.

Each target runs two tasks. The *cadence* task scrapes at the target's own interval, folds
the observation into the detector (`detect.step`) and the episode core
(`core.episode.step`), and performs the effects; a slow or hung scrape delays only this
target. The *worker* task runs the target's queued jobs one at a time, in order (evidence
before restart), each under a timeout, and feeds their outcomes back into the episode core.
Nothing here decides: the shell performs effects and reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, assert_never

import structlog

from wedgewatch.core.detection.detect import (
    DetectionPolicy,
    Scraped,
    ScrapeFailed,
    TargetState,
)
from wedgewatch.core.detection.states import CaptureFailureReason, CapturePhase, EngineState
from wedgewatch.core.episode import episode as core
from wedgewatch.core.restart import restart_policy
from wedgewatch.core.restart.probe_policy import ServerMark
from wedgewatch.core.restart.replacement import ServerIdentity
from wedgewatch.core.text.escape import safe_line
from wedgewatch.core.values import immutable
from wedgewatch.daemon.canary import TargetCanary
from wedgewatch.daemon.publish import TargetSnapshot, target_ready, target_record, target_snapshot
from wedgewatch.daemon.report import (
    FlightRecorder,
    Reporter,
    engine_samples,
    history_entry,
    run_bundle_hook,
)
from wedgewatch.daemon.roles import (
    Aborter,
    AbortOutcome,
    CaptureOutcome,
    CaptureRequest,
    Deps,
    ScrapeResult,
)
from wedgewatch.io import abort, bundles, restarters, statefile
from wedgewatch.io.bundle_hook import BundleHook
from wedgewatch.io.procs import Discovery, ProcessFinder, ProcessSelector
from wedgewatch.io.supervisor import SupervisorProbe
from wedgewatch.vllm.signals import Exposition

if TYPE_CHECKING:
    from wedgewatch.config import Config, Target

log = structlog.get_logger("wedgewatch.daemon")


@dataclass(slots=True)
class Timeouts:
    """How long the worker waits for a capture and for a restart (shared by all targets)."""

    capture_seconds: float
    restart_seconds: float


@immutable
class _CaptureJob:
    effect: core.Capture
    body: bytes | None
    verdict: Mapping[str, Any]


_Job = _CaptureJob | core.Resolve | core.QueueRestart | core.CheckListener


class Host(Protocol):
    """What a target needs from the daemon that owns it (`loop.Daemon`)."""

    def persist_now(self) -> None:
        """Save the state file now (a restart is about to run or just ran)."""
        ...

    async def state_written(self) -> None:
        """Wait until the state handed over last is on disk (or its write failed)."""
        ...

    def target_changed(self, name: str, *, state_changed: bool) -> None:
        """The target's snapshot or record changed; `state_changed`: its state did."""
        ...

    def after_step(self) -> None:
        """A target finished a scrape step: the daemon's heartbeat may be due."""
        ...


class TargetRunner:
    """The shell around one target's detector and episode core; see the module docstring."""

    def __init__(
        self,
        target: Target,
        *,
        config: Config,
        deps: Deps,
        detect_policy: DetectionPolicy,
        rules: core.Rules,
        reporter: Reporter,
        timeouts: Timeouts,
        history_len: int,
        host: Host,
    ) -> None:
        self.target = target
        self.config = config
        self.deps = deps
        self.detect_policy = detect_policy
        self.rules = rules
        self.reporter = reporter
        self.timeouts = timeouts
        self.host = host
        self.detector = TargetState.initial()
        self.core = core.EpisodeState()
        self.history = FlightRecorder(history_len, config.history_max_bytes)
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.worker: asyncio.Task[None] | None = None
        self.busy: str | None = None  # "capture", "resolve" or "restart" while a job runs
        self.last_body: bytes | None = None
        self.last_scrape_timestamp: float | None = None
        self.failure: ScrapeFailed | None = None
        self.failing_since_timestamp: float | None = None
        self.target_state = EngineState.STARTING
        self._snapshot: TargetSnapshot | None = None
        self._published_at: tuple[float, float] | None = None  # (monotonic, wall) of publish
        self.record: statefile.TargetRecord | None = None  # None: rebuild at the next save
        self.steps = 0
        self.hooks: set[asyncio.Task[None]] = set()  # `on_bundle` runs, each bounded in time
        self.canary = TargetCanary.of(target, config, deps, reporter.metrics, lambda: self.busy)

    @property
    def name(self) -> str:
        """The target's name."""
        return self.target.name

    # -- the cadence --------------------------------------------------------------------------

    async def cadence(self, stop: asyncio.Event, offset_seconds: float = 0.0) -> None:
        """Scrape and judge every `interval_seconds` until `stop`; skip, never burst.

        The first scrape waits `offset_seconds` (`loop.first_scrape_offsets`: up to 16
        targets share a wakeup, more are spread over the interval in slots). `stop` is
        looked at between steps; `Daemon.run` cancels the cadence when it is set, which
        ends a sleep at once (a plain sleep: racing it against `stop` cost two tasks per
        step and target).
        """
        clock = self.deps.clock
        sleep = self.deps.sleeper.sleep
        if offset_seconds > 0:
            await sleep(offset_seconds)
        next_at = clock.monotonic()
        while not stop.is_set():
            try:
                result = await self.deps.scraper.scrape(self.target)
                self.observe(result)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug for one target must not stop the others
                log.exception("target_step_error", target=self.name, error=repr(exc))
            self.host.after_step()
            next_at += self.config.interval_seconds
            now_at = clock.monotonic()
            next_at = max(next_at, now_at)
            if next_at > now_at:
                await sleep(next_at - now_at)
            else:
                await asyncio.sleep(0)  # late: let the others run, then scrape at once

    def observe(self, result: ScrapeResult) -> None:
        """Fold one scrape into the detector and the episode core, then perform the effects."""
        obs = result.observation
        if core.is_stale(self.core, obs.at):
            return  # begun before the restart finished: it saw the old server
        clock = self.deps.clock
        now_at, now = clock.monotonic(), clock.wall()
        failure = obs if isinstance(obs, ScrapeFailed) else None
        self.reporter.metrics.observe_scrape(
            self.name,
            duration_seconds=result.duration_seconds,
            failure_reason=failure.reason if failure else None,
        )
        self.failing_since_timestamp = self.reporter.scrape(
            self.target, self.failure, failure, self.failing_since_timestamp, now
        )
        self.failure = failure
        if failure is None:
            self.last_body = result.body
            self.last_scrape_timestamp = now
        self.detector, verdict = self.canary.detect(self.detector, obs, self.detect_policy)
        observed = core.Observed(
            verdict,
            good=isinstance(obs, Scraped),
            worker_idle=not self.busy,
            mark=ServerMark.of(self.detector),
            identity=identity_of(obs.exposition) if isinstance(obs, Scraped) else None,
        )
        self.feed(observed, now_at, now)
        state_changed = verdict.state is not self.target_state
        if state_changed:
            self.target_state = verdict.state
        self.reporter.metrics.set_engines(
            self.name, str(verdict.state), engine_samples(verdict, now_at, now)
        )
        self.history.append(history_entry(verdict, now, failure))
        self.steps += 1
        self.publish(now_at, now, state_changed=state_changed)

    # -- the effect runner --------------------------------------------------------------------

    def feed(self, event: core.Input, now_at: float, now: float) -> core.EpisodeStep:
        """One input into the episode core; performs every effect but RunRestart (the worker's)."""
        step = core.step(self.core, event, self.rules, now_at, now)
        self.core = step.state
        for effect in step.effects:
            if isinstance(effect, core.Report):
                self.reporter.report(self.target, effect, now)
                noted = remedy_note(effect, self.core.episode, now_at, now)
                if noted is not None:  # one small append: the bundle's report tells the end
                    bundles.note_remedy(Path(noted[0]), noted[1])
            elif isinstance(effect, core.Persist):
                self.record = None
                if effect.now:
                    self.host.persist_now()
                else:
                    self.host.target_changed(self.name, state_changed=False)
            elif isinstance(effect, core.Capture):
                verdict = self.core.verdict
                if verdict is None:  # a Capture only follows an observation
                    continue
                engine = next((e for e in verdict.engines if e.key == effect.key), None)
                summary = self.reporter.verdict_summary(self.target, verdict, engine, now_at, now)
                self.queue.put_nowait(_CaptureJob(effect, self.last_body, summary))
            elif isinstance(effect, core.Resolve | core.QueueRestart | core.CheckListener):
                self.queue.put_nowait(effect)
            elif isinstance(effect, core.Recovered):  # K1
                recovery = effect.recovery
                self.reporter.metrics.count_recovery(
                    self.name, str(recovery.cure), str(recovery.outcome)
                )
            elif isinstance(effect, core.ResetDetector):
                self.detector = TargetState.initial()  # and a fresh canary (TargetCanary.detect)
                self.failure = None
        self.reporter.metrics.set_restart_budget(
            self.name,
            remaining=restart_policy.budget_remaining(
                self.core.policy, self.rules.restart_policy, now_at
            ),
            gave_up=self.core.policy.phase is restart_policy.Phase.GAVE_UP,
        )
        self.reporter.metrics.set_ready(
            self.name, target_ready(self.core, restart_running=self.busy == "restart")
        )
        return step

    def probe_failed(self) -> None:
        """/probe sent a 503 about this target: remember it with the server it judged (Q2)."""
        clock = self.deps.clock
        self.feed(core.ProbeServed(ServerMark.of(self.detector)), clock.monotonic(), clock.wall())

    def publish(self, now_at: float, now: float, *, state_changed: bool = False) -> None:
        """Mark this target's snapshot stale (as of `now_at`) and tell the daemon.

        The snapshot itself is rebuilt only when an endpoint reads it (`snapshot`), so a
        step costs nothing for /status, /probe or /metrics that nobody asked for.
        """
        self._snapshot = None
        self._published_at = (now_at, now)
        self.host.target_changed(self.name, state_changed=state_changed)

    @property
    def snapshot(self) -> TargetSnapshot | None:
        """The target as /status, /probe and /metrics show it, as of its last publish."""
        if self._snapshot is None and self._published_at is not None:
            self._snapshot = self._build_snapshot(*self._published_at)
        return self._snapshot

    def _build_snapshot(self, now_at: float, now: float) -> TargetSnapshot:
        failure = self.failure
        return target_snapshot(
            self.target,
            self.core,
            self.rules.restart_policy,
            remedy_name=self.config.remedy,
            failure_text=f"{failure.reason}: {failure.detail}" if failure else None,
            last_scrape_timestamp=self.last_scrape_timestamp,
            restart_running=self.busy == "restart",
            now_at=now_at,
            now=now,
            canary=self.canary.snapshot(),
        )

    def saved_record(self, at: float, now: float, *, refresh: bool) -> statefile.TargetRecord:
        """The target's state record, rebuilt only when it changed (or `refresh`)."""
        if self.record is None or refresh:
            self.record = target_record(self.target, self.core, self.detector, at, now)
        return self.record

    # -- the worker: evidence, then restart -------------------------------------------------

    async def work(self) -> None:
        """Run queued jobs one at a time, in order, until cancelled."""
        while True:
            job = await self.queue.get()
            try:
                if isinstance(job, _CaptureJob):
                    self.busy = "capture"
                    await self._capture(job)
                elif isinstance(job, core.Resolve):
                    self.busy = "resolve"
                    bundle = job.bundle or self.core.last_bundle
                    if bundle is not None:
                        await self.deps.evidence.resolve(bundle, job.note)
                elif isinstance(job, core.CheckListener):
                    self.busy = "listener"
                    found = listener_of(await discover(self.deps.finder, self.target))
                    seen = core.ListenerSeen(*found) if found else core.ListenerSeen(None)
                    self.feed(seen, self.deps.clock.monotonic(), self.deps.clock.wall())
                else:
                    self.busy = "restart"
                    await self._restart(job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a bug in an adapter must not kill the worker
                log.exception("worker_error", target=self.name, error=repr(exc))
            finally:
                self.busy = None
                self.queue.task_done()
                clock = self.deps.clock
                self.publish(clock.monotonic(), clock.wall())

    async def _capture(self, job: _CaptureJob) -> None:
        effect = job.effect
        episode = self.core.episode
        episode_id = episode.episode_id if episode else effect.episode_id
        request = CaptureRequest(
            target=self.target,
            key=effect.key,
            family=effect.family,
            phase=effect.phase,
            episode_id=episode_id,
            bundle=episode.bundle if episode else None,
            metrics_body=job.body,
            history=self.history.entries(),
            verdict=self.canary.add_to(job.verdict),
            verdict_at=effect.verdict_at,
        )
        limit = self.timeouts.capture_seconds
        started = self.deps.clock.monotonic()
        try:
            async with asyncio.timeout(limit):
                outcome = await self.deps.evidence.capture(request)
        except TimeoutError:
            outcome = CaptureOutcome(
                bundle=request.bundle,
                failures=(CaptureFailureReason.TIMEOUT,),
                detail=f"evidence capture did not finish within {limit:g} s",
            )
            if effect.phase is CapturePhase.WEDGED and request.bundle is not None:
                # The last round of the bundle: its summary must not still read `suspect`.
                await self.deps.evidence.cut_off(request.bundle, outcome.detail)
        except (OSError, ValueError) as exc:
            outcome = CaptureOutcome(
                bundle=request.bundle,
                failures=(CaptureFailureReason.ERROR,),
                detail=f"evidence capture failed: {exc}",
            )
        done = core.CaptureDone(
            episode_id,
            effect.phase,
            outcome.bundle,
            outcome.triage,
            outcome.failures,
            key=effect.key,
            family=effect.family,
            detail=outcome.detail,
            duration_seconds=self.deps.clock.monotonic() - started,
            server_gone=outcome.server_gone,
            triage_kind=outcome.triage_kind,
        )
        clock = self.deps.clock
        self.feed(done, clock.monotonic(), clock.wall())
        hook = self.deps.bundle_hook
        if hook is not None and outcome.bundle is not None and effect.phase is CapturePhase.WEDGED:
            # Once per bundle, after its last round (completed, failed or cut off): a suspect
            # round is never the last while a wedged round may follow. Beside the worker: the
            # restart queued after this capture does not wait for it.
            task = asyncio.create_task(self._hook(hook, outcome.bundle, str(effect.phase)))
            self.hooks.add(task)
            task.add_done_callback(self.hooks.discard)

    async def _abort(self, run: core.RunAbort, discovery: Discovery) -> None:
        """K2-K3: prove the server (as for signals), send the abort and its canary, and feed
        the result back (`AbortDone`); the core judges the proof on the next scrapes."""
        self.busy = "abort"
        clock = self.deps.clock
        started = clock.monotonic()
        refusal = abort.abort_refusal(discovery)
        outcome = await _abort_outcome(self.deps.aborter, self.target, refusal, run.proof_seconds)
        now_at = clock.monotonic()
        log.info(
            "abort_sent" if outcome.ok else "abort_not_sent",
            target=self.name,
            detail=outcome.detail,
            aborted=outcome.aborted,
            canary_ok=outcome.canary_ok,
            canary_detail=outcome.canary_detail or None,
            server_pid=discovery.root_pid,
        )
        detail = outcome.detail
        if outcome.ok and not outcome.canary_ok and outcome.canary_detail:
            detail += f"; the canary after it: {outcome.canary_detail}"
        done = core.AbortDone(
            outcome.ok,
            detail,
            aborted=outcome.aborted,
            canary_ok_at=now_at if outcome.canary_ok else None,
            duration_seconds=now_at - started,
        )
        self.feed(done, now_at, clock.wall())
        await self.host.state_written()

    async def _hook(self, hook: BundleHook, bundle: str, phase: str) -> None:
        result = await run_bundle_hook(hook, bundle, target=self.name, phase=phase)
        self.reporter.metrics.count_bundle_hook(self.name, result)

    async def _restart(self, job: core.QueueRestart) -> None:
        restarter = self.deps.restarters.get(self.name)
        if restarter is None and not self.rules.abort_first:
            return
        clock = self.deps.clock
        supervisor = await supervisor_says(self.deps.supervisor_probe, self.name, self.failure)
        discovery = await discover(self.deps.finder, self.target)  # restart_requested names it
        due = core.RestartDue(
            job.key, job.family, job.reason, supervisor, server_pid=discovery.root_pid
        )
        step = self.feed(due, clock.monotonic(), clock.wall())
        cure = next((e for e in step.effects if isinstance(e, core.RunAbort)), None)
        if cure is not None:
            await self.host.state_written()  # the abort is on disk before it is sent
            await self._abort(cure, discovery)
            return
        run = next((e for e in step.effects if isinstance(e, core.RunRestart)), None)
        if run is None or restarter is None:
            return
        await self.host.state_written()  # the attempt is on disk before the remedy runs
        config = self.config
        episode = self.core.episode
        verdict = self.core.verdict
        request = restarters.RestartRequest(
            target=self.name,
            url=self.target.url,
            model_name=run.key.model_name,
            engine=run.key.engine,
            family=run.family,
            state=str(verdict.state) if verdict else "",
            reason=run.reason,
            bundle=Path(episode.bundle) if episode and episode.bundle else None,
            server_pid=discovery.root_pid,
            server_pid_explicit=discovery.explicit,
        )
        limit = self.timeouts.restart_seconds
        started = self.deps.clock.monotonic()
        try:
            async with asyncio.timeout(limit):
                outcome = await restarter.restart(request)
        except TimeoutError:
            outcome = restart_policy.RestartOutcome(
                False,
                f"the {config.remedy} remedy did not finish within {limit:g} s",
                limit,
                restart_policy.FailureReason.TIMEOUT,
            )
        except Exception as exc:  # any failure to run the remedy is a failed attempt
            # Never left "in progress": whatever the remedy raised (a value it could not
            # pass on, a bug), the attempt is over, counted and reported as failed.
            outcome = restart_policy.RestartOutcome(
                False,
                f"the {config.remedy} remedy could not be run: {exception_text(exc)}",
                self.deps.clock.monotonic() - started,
                restart_policy.FailureReason.REMEDY_ERROR,
            )
        done = core.RestartDone(outcome, listener_of(discovery))
        self.feed(done, clock.monotonic(), clock.wall())
        await self.host.state_written()  # and its outcome before the next job


def exception_text(exc: BaseException) -> str:
    """An unexpected exception as an outcome's detail: redacted before it is cut to 500
    characters, so a cut through `user:password@` cannot keep half a password."""
    return safe_line(f"{type(exc).__name__}: {exc}", 500)


async def _abort_outcome(
    aborter: Aborter | None, target: Target, refusal: str | None, proof_seconds: float
) -> AbortOutcome:
    """The abort call (and its canary), bounded; refused for an unproven server."""
    if aborter is None:
        return AbortOutcome(False, "no abort sender is configured (abort_first is off)")
    if refusal is not None:
        return AbortOutcome(False, f"refusing to send the abort: {refusal}")
    try:
        async with asyncio.timeout(proof_seconds + 10.0):
            return await aborter.abort(target, proof_seconds=proof_seconds)
    except TimeoutError:
        return AbortOutcome(False, f"the abort did not finish within {proof_seconds + 10.0:g} s")
    except Exception as exc:  # a bug in the adapter is a failed abort, never a stuck worker
        return AbortOutcome(False, f"the abort could not be sent: {exception_text(exc)}")


async def discover(finder: ProcessFinder, target: Target) -> Discovery:
    """The target's processes, found off the event loop within 10 s."""
    selector = ProcessSelector(target.url, target.pid, target.pid_file, target.systemd_unit)
    try:
        async with asyncio.timeout(10):
            return await asyncio.to_thread(finder.discover, selector)
    except TimeoutError:
        return Discovery(selector.describe(), None, (), error="process discovery timed out")


def listener_of(discovery: Discovery) -> tuple[int, float | None] | None:
    """The (pid, create time) of the process a discovery found on the port, if any."""
    if discovery.root_pid is None:
        return None
    return discovery.root_pid, discovery.root_create_time


async def supervisor_says(
    probe: SupervisorProbe | None, target: str, failure: ScrapeFailed | None
) -> str | None:
    """W1: for a refused server, whether its supervisor is already restarting it."""
    if probe is None or failure is None or failure.reason != "refused":
        return None
    return await probe.restarting(target)


def identity_of(exposition: Exposition) -> ServerIdentity:
    """What a good scrape says about which server answered (see `core.replacement`)."""
    return ServerIdentity.of(exposition)


def remedy_note(
    effect: core.Report, episode: core.Episode | None, at: float, timestamp: float
) -> tuple[str, dict[str, Any]] | None:
    """(bundle, record) for `remedy.jsonl` when a Report says what became of a bundle's
    episode: a restart that completed or failed, or how the episode closed."""
    fields = effect.fields
    bundle = fields.get("bundle") or (episode.bundle if episode is not None else None)
    if not bundle:
        return None
    stamp = {"at": at, "timestamp": timestamp}
    match effect.event:
        case core.ReportEvent.RESTART_COMPLETED:
            record = {"event": "restart", "ok": True, "detail": fields.get("detail"), **stamp}
            record["duration_seconds"] = fields.get("duration_seconds")
        case core.ReportEvent.RESTART_FAILED:
            record = {"event": "restart", "ok": False, "reason": fields.get("reason"), **stamp}
            record["detail"] = fields.get("detail")
        case core.ReportEvent.EPISODE_CLOSED:
            record = {"event": "episode_closed", "outcome": fields.get("outcome"), **stamp}
        case core.ReportEvent.ABORT_REQUESTED:
            record = {"event": "abort_requested", "reason": fields.get("reason"), **stamp}
            record["triage"] = fields.get("triage")
        case core.ReportEvent.ABORT_SUCCEEDED | core.ReportEvent.ABORT_FAILED:
            ok = effect.event is core.ReportEvent.ABORT_SUCCEEDED
            record = {"event": "abort", "ok": ok, "outcome": fields.get("outcome"), **stamp}
            record.update(aborted=fields.get("aborted"), detail=fields.get("detail"))
            record["serving_lost_seconds"] = fields.get("seconds")
        case (
            core.ReportEvent.STALL_SUSPECTED
            | core.ReportEvent.WEDGE_DETECTED
            | core.ReportEvent.TARGET_UNREACHABLE
            | core.ReportEvent.ENGINE_RECOVERED
            | core.ReportEvent.ENGINE_UNKNOWN
            | core.ReportEvent.ENGINE_DISCOVERED
            | core.ReportEvent.ENGINE_STATE_CHANGED
            | core.ReportEvent.EPISODE_OPENED
            | core.ReportEvent.EVIDENCE_CAPTURED
            | core.ReportEvent.EVIDENCE_CAPTURE_FAILED
            | core.ReportEvent.SUSPECT_CAPTURE_SKIPPED
            | core.ReportEvent.RESTART_SKIPPED
            | core.ReportEvent.RESTART_WAITING
            | core.ReportEvent.RESTART_DEFERRED
            | core.ReportEvent.RESTART_REQUESTED
            | core.ReportEvent.RESTART_SUCCEEDED
            | core.ReportEvent.GAVE_UP
            | core.ReportEvent.GAVE_UP_CLEARED
            | core.ReportEvent.BACKOFF_RESET
            | core.ReportEvent.BUDGET_RESET
            | core.ReportEvent.ABORT_SKIPPED
        ):
            return None  # says nothing about what became of the bundle
        case _:
            assert_never(effect.event)
    return str(bundle), record
