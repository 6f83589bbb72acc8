"""`wedgewatch check`: scrape one server for a window, judge it with the detector, report.

Two modes:

* One-shot (no state file): scrape every `interval_seconds` for `window_seconds` and judge
  with every threshold capped at the window, because a stall that lasts the whole window
  is all a one-shot check can see; a target that never answers in the window is
  `unreachable` (no start-up grace: the check is asked about a server that should be up).
* Probe (`--state-file`): the detector state is loaded from the file, the window's
  scrapes are added, and the state is written back atomically, so a Kubernetes exec probe
  that runs every few seconds with `--for 0` judges over a long span without blocking.
  The configured thresholds and start-up grace apply. A corrupt, unreadable, foreign
  (another URL) or outdated state file is reported and replaced, never a crash.

A body that is not vLLM's (`parse_error`, `too_many_engines`), a reading with non-finite
values and a URL that reaches more than one server are UNKNOWN (exit 3) with the reason in
`error`. Any internal error is UNKNOWN too: `wedgewatch check` prints one line (or one
JSON object) and never a traceback.

Exit codes follow the Nagios plugin conventions (`EXIT_CODES`, from the detector's states
in `core.states`). Time comes from an injected clock and sleep so the whole loop runs in
tests without waiting.

`execute` scrapes with the blocking `io.http_get` and runs `run_check` without an event
loop (`run_blocking`), so an exec probe imports neither asyncio nor httpx. The state file
is `check.state`'s, the restart rules are the daemon's own (`core.probe_step.step`, the
same step `/probe` takes), and the output is `check.render`'s.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import wedgewatch.check.state as state_file
from wedgewatch.check.log import log
from wedgewatch.check.render import (
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_WARNING,
    CheckReport,
    StallThresholds,
)
from wedgewatch.check.settings import CheckSettings
from wedgewatch.check.state import Clock, Sleep
from wedgewatch.core.detection.detect import (
    DetectionPolicy,
    Observation,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    step,
)
from wedgewatch.core.detection.states import EngineState, ScrapeFailureReason
from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.restart import probe_step
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.core.values import immutable
from wedgewatch.io import http_get
from wedgewatch.io.scrape_rules import ScrapeLimits

if TYPE_CHECKING:
    import httpx

# Scrape failures that say the body is not something the detector can judge: UNKNOWN at once.
_NOT_JUDGEABLE: frozenset[ScrapeFailureReason] = frozenset({"parse_error", "too_many_engines"})

#: One scrape and parse of a URL within limits, stamped with the clock when it began.
Observe = Callable[[str, ScrapeLimits, Clock], Awaitable[Observation]]
_T = TypeVar("_T")


@immutable
class CheckOptions:
    """What one `wedgewatch check` run does."""

    metrics_url: str
    window_seconds: float
    interval_seconds: float
    policy: DetectionPolicy
    limits: ScrapeLimits
    state_file: Path | None = None
    restart: RestartPolicy | None = None  # probe mode: the restart budget applies
    probe_respects_budget: bool = True
    observe: bool = False  # remedy = "none" set: no run asks for a restart (rule P0)
    settings_cache: Mapping[str, Any] | None = None  # kept in the state file (see `entry`)
    thresholds: StallThresholds | None = None  # -w/-c


@immutable
class _Window:
    """The scrape loop's outcome: the report, the detector's state, the last verdict."""

    report: CheckReport
    detector: TargetState
    verdict: TargetVerdict
    scraped: bool  # the last scrape succeeded


def one_shot_policy(policy: DetectionPolicy, window_seconds: float) -> DetectionPolicy:
    """Cap every threshold at the window: a stall lasting the whole window is a wedge.

    Except `deferred_only_after_seconds`: requests deferred with nothing waiting for capacity
    are routine for minutes (streaming-input sessions, P/D decode nodes), so a short window
    cannot call them wedged; it keeps its configured value (0 still disables it). The bounds
    (`max_engines`, `vanished_engine_expiry_seconds`) and the canary's timeout are kept too.
    """
    return replace(
        policy,
        stall_after_seconds=min(policy.stall_after_seconds, window_seconds),
        hang_after_seconds=min(policy.hang_after_seconds, window_seconds),
        output_stall_after_seconds=min(policy.output_stall_after_seconds, window_seconds),
        unreachable_after_seconds=min(policy.unreachable_after_seconds, window_seconds),
        startup_timeout_seconds=window_seconds,
    )


async def run_check(
    options: CheckOptions,
    *,
    client: httpx.AsyncClient | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep | None = None,
    wall: Clock = time.time,
) -> CheckReport:
    """Scrape `options.metrics_url` for the window, judge every scrape, and report.

    Without a `client` the scrapes and the sleeps between them block (`io.http_get`,
    `time.sleep`): the coroutine never suspends, and `run_blocking` runs it without an event
    loop, which is how `execute` runs a check. With a `client`, the scrapes go through the
    daemon's asynchronous transport (`io.scrape`) and the sleeps default to asyncio's.
    """
    observe, sleep = _transport(client, sleep)
    notes: list[str] = []
    if options.state_file is None:
        policy = one_shot_policy(options.policy, options.window_seconds)
        window = await _scrape_loop(
            options,
            policy=policy,
            state=TargetState.initial(),
            notes=notes,
            observe=observe,
            clock=clock,
            sleep=sleep,
        )
        return replace(window.report, thresholds=options.thresholds)
    store = state_file.StateFile(
        path=options.state_file,
        metrics_url=options.metrics_url,
        policy=options.policy,
        restart=options.restart,
        settings_cache=options.settings_cache,
    )
    report = await _probe(
        options, store, notes, observe=observe, clock=clock, sleep=sleep, wall=wall
    )
    return replace(report, thresholds=options.thresholds)


async def _probe(
    options: CheckOptions,
    store: state_file.StateFile,
    notes: list[str],
    *,
    observe: Observe,
    clock: Clock,
    sleep: Sleep,
    wall: Clock,
) -> CheckReport:
    """Probe mode: the window's scrapes added to the state file's history, one probe step."""
    path = store.path
    try:
        wait = options.window_seconds + options.limits.timeout_seconds
        lock = await state_file.lock_beside(path, wait, clock, sleep)
    except OSError as exc:
        log("error", "state_file_unusable", path=str(path), error=str(exc))
        return CheckReport(
            status=EngineState.UNKNOWN,
            metrics_url=options.metrics_url,
            engines=(),
            error=f"cannot use state file {path}: {exc}",
            notes=(),
            scrapes=0,
            at=None,
            probe_broken=True,
        )
    try:
        saved = state_file.load(store, clock(), wall(), notes)
        window = await _scrape_loop(
            options,
            policy=options.policy,
            state=saved.detector,
            notes=notes,
            observe=observe,
            clock=clock,
            sleep=sleep,
        )
        at, timestamp = clock(), wall()
        report = window.report
        saved = replace(saved, detector=window.detector)
        if options.restart is not None:
            report, saved = _probe_step(
                options, options.restart, window=window, saved=saved, at=at, timestamp=timestamp
            )
        try:
            state_file.save(store, saved, at, timestamp)
        except OSError as exc:
            log("error", "state_file_unwritable", path=str(path), error=str(exc))
            return replace(
                report,
                status=EngineState.UNKNOWN,
                error=f"cannot write state file {path}: {exc}",
                probe_broken=True,
            )
        for event in report.events:
            log(
                "error" if event.kind is ReportEvent.GAVE_UP else "info",
                str(event.kind),
                url=options.metrics_url,
                reason=event.reason,
                detail=event.detail,
            )
        return report
    finally:
        os.close(lock)


def _probe_step(
    options: CheckOptions,
    restart: RestartPolicy,
    *,
    window: _Window,
    saved: state_file.Saved,
    at: float,
    timestamp: float,
) -> tuple[CheckReport, state_file.Saved]:
    """The daemon's probe step (`core.probe_step.step`), from and into the state file.

    The step is taken for every judged window, as the daemon takes it for every scrape; an
    UNKNOWN report carries no restart-policy verdict (it is not a judgement of the server).
    """
    config = probe_step.ProbeConfig(restart, options.probe_respects_budget, options.observe)
    scrape = probe_step.ProbeScrape.of(window.verdict, saved.detector, scraped=window.scraped)
    done = probe_step.step(saved.probe, scrape, at, timestamp, config)
    probe = done.state
    report = window.report
    if done.verdict is not None and not done.verdict.ok:
        # This run's exit status is the failing answer the kubelet gets (rule R1).
        assert scrape.mark is not None  # noqa: S101 - a mark always comes with a verdict
        probe = probe_step.served(probe, scrape.mark, at)
    if report.status is not EngineState.UNKNOWN:
        report = replace(report, restart_policy=done.verdict, events=done.events)
    return report, replace(saved, probe=probe)


def options_for(
    metrics_url: str,
    settings: CheckSettings,
    *,
    window_seconds: float,
    state_file: Path | None,
    settings_cache: Mapping[str, Any] | None = None,
    thresholds: StallThresholds | None = None,
) -> CheckOptions:
    """The options of one run; the restart budget applies in probe mode only."""
    return CheckOptions(
        metrics_url=metrics_url,
        window_seconds=window_seconds,
        interval_seconds=settings.interval_seconds,
        policy=settings.policy,
        limits=settings.limits,
        state_file=state_file,
        restart=settings.restart if state_file is not None else None,
        probe_respects_budget=settings.probe_respects_budget,
        observe=settings.observe,
        settings_cache=settings_cache,
        thresholds=thresholds,
    )


def _transport(client: httpx.AsyncClient | None, sleep: Sleep | None) -> tuple[Observe, Sleep]:
    """How `run_check` scrapes and sleeps: blocking without a client, else asynchronously."""
    if client is None:

        async def observe_blocking(url: str, limits: ScrapeLimits, clock: Clock) -> Observation:
            return http_get.observe(url, limits, clock=clock)

        async def sleep_blocking(seconds: float) -> None:
            time.sleep(seconds)  # noqa: ASYNC251 - no event loop to block: see run_blocking

        return observe_blocking, sleep or sleep_blocking
    import asyncio  # noqa: PLC0415 - only a caller with its own event loop pays for it

    from wedgewatch.io import scrape  # noqa: PLC0415 - ditto, with httpx

    async def observe_async(url: str, limits: ScrapeLimits, clock: Clock) -> Observation:
        return await scrape.observe(client, url, limits, clock=clock)

    return observe_async, sleep or asyncio.sleep


def run_blocking(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """The result of a coroutine whose every wait blocks, run to its end without an event loop.

    Such a coroutine never suspends: its first step runs it to completion. One that does
    suspend (it awaited real asynchronous IO) is a bug, closed and reported.
    """
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast("_T", done.value)
    coroutine.close()
    raise RuntimeError("a blocking check suspended: it awaited asynchronous IO")


def execute(options: CheckOptions, *, as_json: bool, critical_only: bool) -> int:
    """Run one check, print its report to stdout, and return the exit status."""
    report = run_blocking(run_check(options))
    print(json.dumps(report.to_json()) if as_json else report.render_text(), flush=True)
    code = report.exit_code
    # A liveness probe restarts vLLM on any non-zero exit: with --critical-only only a
    # CRITICAL verdict may do that. A measurement that cannot be judged (NaN gauges, a URL
    # reaching two servers, a body that is not vLLM's) is reported on the line, never acted on.
    # A probe that cannot use its state file is broken, not a judgement: it exits 3, so the
    # probe fails visibly instead of passing for ever.
    if critical_only and not report.probe_broken and code in (EXIT_WARNING, EXIT_UNKNOWN):
        return EXIT_OK
    return code


async def _scrape_loop(
    options: CheckOptions,
    *,
    policy: DetectionPolicy,
    state: TargetState,
    notes: list[str],
    observe: Observe,
    clock: Clock,
    sleep: Sleep,
) -> _Window:
    """Scrape at start, start + interval, ... and finally at (or just after) start + window.

    The last scrape begins no earlier than the end of the window, so a stall that lasted
    the whole window is measured as the whole window whatever each scrape took.
    """
    started_at = clock()
    deadline = started_at + options.window_seconds
    scrapes = 0
    while True:
        begun_at = clock()
        observation = await observe(options.metrics_url, options.limits, clock)
        scrape_seconds = max(0.0, clock() - begun_at)
        state, verdict = step(state, observation, policy)
        scrapes += 1
        log(
            "debug",
            "check_scraped",
            url=options.metrics_url,
            state=verdict.state.value,
            failure=None if verdict.failure is None else verdict.failure.reason,
        )
        scraped = not isinstance(observation, ScrapeFailed)
        if isinstance(observation, ScrapeFailed) and observation.reason in _NOT_JUDGEABLE:
            report = CheckReport(
                status=EngineState.UNKNOWN,
                metrics_url=options.metrics_url,
                engines=(),
                error=f"not a vLLM metrics body: {observation.detail}",
                notes=tuple(notes),
                scrapes=scrapes,
                at=observation.at,
                scrape_seconds=scrape_seconds,
            )
            return _Window(report, state, verdict, scraped)
        if begun_at >= deadline:
            break
        now = clock()
        ticks = math.floor((now - started_at) / options.interval_seconds) + 1
        next_at = min(started_at + ticks * options.interval_seconds, deadline)
        if next_at > now:
            await sleep(next_at - now)
    report = _report(options.metrics_url, verdict, notes, scrapes)
    return _Window(replace(report, scrape_seconds=scrape_seconds), state, verdict, scraped)


def _report(
    metrics_url: str, verdict: TargetVerdict, notes: list[str], scrapes: int
) -> CheckReport:
    error: str | None = None
    if verdict.failure is not None:
        error = f"{verdict.failure.reason}: {verdict.failure.detail}"
    elif verdict.state is EngineState.UNKNOWN:
        unknown = next(e for e in verdict.engines if e.state is EngineState.UNKNOWN)
        error = f"{unknown.key.model_name} engine {unknown.key.engine}: {unknown.reason}"
    return CheckReport(
        status=verdict.state,
        metrics_url=metrics_url,
        engines=verdict.engines,
        error=error,
        notes=tuple(notes),
        scrapes=scrapes,
        at=verdict.at,
    )
