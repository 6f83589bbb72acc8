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
loop (`run_blocking`), so an exec probe imports neither asyncio nor httpx.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from wedgewatch.check_settings import CheckSettings
from wedgewatch.core import nagios, probe_policy
from wedgewatch.core.detect import (
    EngineVerdict,
    Observation,
    Policy,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    step,
)
from wedgewatch.core.detect_state import dump_state, load_state
from wedgewatch.core.escape import safe_line
from wedgewatch.core.redact import redact_url, redact_value
from wedgewatch.core.restart_policy import (
    Phase,
    PolicyEvent,
    PolicyRecord,
    PolicyState,
    RestartPolicy,
    from_record,
    record_tick,
    to_record,
)
from wedgewatch.core.states import ACTED_ON, CALM, STALLED, EngineState, ScrapeFailureReason
from wedgewatch.io import http_get
from wedgewatch.io.atomic import write_atomic
from wedgewatch.io.private_paths import open_lock_file, private_dir, read_private
from wedgewatch.io.scrape_rules import ScrapeLimits

if TYPE_CHECKING:
    import httpx

#: A check's status is the detector's state of the target (`core.states.EngineState`).
Status = EngineState
EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN = 0, 1, 2, 3


def _exit_code(state: EngineState) -> int:
    if state in ACTED_ON:  # what the daemon restarts and /probe fails for
        return EXIT_CRITICAL
    if state in STALLED:  # a stall not (yet) acted on
        return EXIT_WARNING
    return EXIT_UNKNOWN if state is EngineState.UNKNOWN else EXIT_OK


#: The Nagios exit code of each state.
EXIT_CODES: dict[Status, int] = {state: _exit_code(state) for state in EngineState}
# Scrape failures that say the body is not something the detector can judge: UNKNOWN at once.
_NOT_JUDGEABLE: frozenset[ScrapeFailureReason] = frozenset({"parse_error", "too_many_engines"})
_NAGIOS_WORDS = {0: "OK", 1: "WARNING", 2: "CRITICAL", 3: "UNKNOWN"}

STATE_FILE_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # version 1 held the detector only

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]
#: One scrape and parse of a URL within limits, stamped with the clock when it began.
Observe = Callable[[str, ScrapeLimits, Clock], Awaitable[Observation]]
_T = TypeVar("_T")

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_log_level = ["info"]


def set_log_level(level: str) -> None:
    """Log at `level` and above; structlog is imported only when something is logged."""
    _log_level[:] = [level if level in _LEVELS else "info"]


def _log(level: str, event: str, **fields: Any) -> None:
    """One log event; the probe path pays for importing structlog only when it logs."""
    if _LEVELS[level] < _LEVELS[_log_level[0]]:
        return
    from wedgewatch.logsetup import get_logger  # noqa: PLC0415 - kept off the probe path

    getattr(get_logger("wedgewatch.check", _log_level[0]), level)(event, **fields)


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """What one `wedgewatch check` run does."""

    metrics_url: str
    window_seconds: float
    interval_seconds: float
    policy: Policy
    limits: ScrapeLimits
    state_file: Path | None = None
    restart: RestartPolicy | None = None  # probe mode: the restart budget applies
    probe_respects_budget: bool = True
    observe: bool = False  # remedy = "none" set: no run asks for a restart (rule P0)
    settings_cache: Mapping[str, Any] | None = None  # kept in the state file (see `entry`)
    thresholds: StallThresholds | None = None  # -w/-c


@dataclass(frozen=True, slots=True)
class StallThresholds:
    """`-w`/`-c`: Nagios ranges on each engine's stalled seconds."""

    warning: nagios.Range | None = None
    critical: nagios.Range | None = None

    def exit_code(self, stalled_seconds: float) -> int:
        """CRITICAL or WARNING when a range alerts for `stalled_seconds`, else OK."""
        if self.critical is not None and self.critical.alerts(stalled_seconds):
            return EXIT_CRITICAL
        if self.warning is not None and self.warning.alerts(stalled_seconds):
            return EXIT_WARNING
        return EXIT_OK


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The outcome of one check: the worst state, the engines' verdicts, and any error."""

    status: Status
    metrics_url: str
    engines: tuple[EngineVerdict, ...]
    error: str | None
    notes: tuple[str, ...]
    scrapes: int
    at: float | None
    restart_policy: probe_policy.ProbeVerdict | None = None  # probe mode only
    events: tuple[PolicyEvent, ...] = ()
    thresholds: StallThresholds | None = None
    scrape_seconds: float | None = None  # how long the last scrape took
    # The probe itself is broken (its state file cannot be used: refused, unwritable, its
    # lock held past the bounded wait): exit 3 even with --critical-only.
    probe_broken: bool = False

    @property
    def exit_code(self) -> int:
        """The Nagios exit code of `status`; WARNING for a wedge the budget will not restart.

        `-w`/`-c` raise it (never lower it) when an engine's stall crosses their range; an
        UNKNOWN stays UNKNOWN.
        """
        code = EXIT_CODES[self.status]
        if code == EXIT_CRITICAL and self.restart_policy is not None and self.restart_policy.ok:
            code = EXIT_WARNING
        if code == EXIT_UNKNOWN or self.thresholds is None:
            return code
        return max([code, *(self.thresholds.exit_code(e.stalled_seconds) for e in self.engines)])

    def to_json(self) -> dict[str, Any]:
        """`{"status", "engines": [...], "error"}`, the documented `--json` schema.

        In probe mode also `gave_up` and `restart_policy` (the probe verdict's decision).
        """
        document: dict[str, Any] = {
            "status": self.status.value,
            "engines": [_engine_json(verdict) for verdict in self.engines],
            "error": self.error,
        }
        if self.restart_policy is not None:
            document["gave_up"] = self.restart_policy.gave_up
            document["restart_policy"] = self.restart_policy.to_json()
        return dict(redact_value(document))

    def render_text(self) -> str:
        """A Nagios-style summary line with the perfdata after `|`, one line per engine, notes.

        A `|` elsewhere (in a URL or a model name) is printed as `¦`: Nagios reads every `|`
        as the start of performance data.
        """
        word = _NAGIOS_WORDS[self.exit_code]
        count = len(self.engines)
        summary = (
            f"{word}: {self.status.value} - {redact_url(self.metrics_url)}, "
            f"{count} engine{'s' if count != 1 else ''}, "
            f"{self.scrapes} scrape{'s' if self.scrapes != 1 else ''}"
        )
        beyond = self._threshold_crossed()
        if beyond:
            summary += f"; {beyond}"
        lines = [summary]
        lines.extend(_engine_line(verdict, self.at) for verdict in self.engines)
        if self.error:
            lines.append(f"error: {self.error}")
        verdict = self.restart_policy
        # Observe mode says so only about a target it would otherwise have failed.
        if verdict is not None and (
            bool(verdict.detail) if verdict.decision == "observe" else verdict.decision != "healthy"
        ):
            lines.append(
                f"restart policy: {verdict.decision}"
                + (f": {verdict.detail}" if verdict.detail else "")
            )
        lines.extend(f"note: {note}" for note in self.notes)
        # The target's values are data: secrets masked, no control character reaches the
        # terminal, one line stays one line (#21).
        text = "\n".join(safe_line(line) for line in lines)
        text = text.replace("|", "\u00a6")
        perfdata = nagios.render_perfdata(self.perfdata())
        if not perfdata:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first} | {perfdata}{newline}{rest}"

    def perfdata(self) -> list[nagios.PerfDatum]:
        """Per engine: stalled seconds (with -w/-c), running, waiting and waiting by reason;
        then how long the last scrape took. Labels carry the engine (and the model when
        there are several) only where there are several engines; unknown values are left out.
        """
        data: list[nagios.PerfDatum] = []
        models = {verdict.key.model_name for verdict in self.engines}
        warn = crit = ""
        if self.thresholds is not None:
            warn = "" if self.thresholds.warning is None else self.thresholds.warning.text
            crit = "" if self.thresholds.critical is None else self.thresholds.critical.text
        for verdict in self.engines:
            prefix = ""
            if len(self.engines) > 1:
                prefix = f"e{verdict.key.engine}_"
                if len(models) > 1:
                    prefix = f"{verdict.key.model_name}_{prefix}"
            if math.isfinite(verdict.stalled_seconds):
                data.append(
                    nagios.PerfDatum(
                        f"{prefix}stalled", verdict.stalled_seconds, "s", warn, crit, 0.0
                    )
                )
            reading = verdict.reading
            if reading is None:
                continue
            counts = [("running", reading.running), ("waiting", reading.waiting)]
            counts += [
                (f"waiting_{reason}", value)
                for reason, value in sorted(reading.waiting_by_reason.items())
            ]
            data.extend(
                nagios.PerfDatum(f"{prefix}{name}", value, "", "", "", 0.0)
                for name, value in counts
                if math.isfinite(value)
            )
        if self.scrape_seconds is not None:
            data.append(nagios.PerfDatum("scrape_time", self.scrape_seconds, "s", minimum=0.0))
        return data

    def _threshold_crossed(self) -> str:
        """`stalled 42.0 s beyond -c 30` for the worst engine a threshold alerts for, or ''."""
        if self.thresholds is None or EXIT_CODES[self.status] == EXIT_UNKNOWN:
            return ""
        for flag, spec in (("-c", self.thresholds.critical), ("-w", self.thresholds.warning)):
            if spec is None:
                continue
            crossing = [e.stalled_seconds for e in self.engines if spec.alerts(e.stalled_seconds)]
            if crossing:
                return f"stalled {max(crossing):.1f} s beyond {flag} {spec.text}"
        return ""


def one_shot_policy(policy: Policy, window_seconds: float) -> Policy:
    """Cap every threshold at the window: a stall lasting the whole window is a wedge.

    Except `deferred_only_after_seconds`: requests deferred with nothing waiting for capacity
    are routine for minutes (streaming-input sessions, P/D decode nodes), so a short window
    cannot call them wedged; it keeps its configured value (0 still disables it).
    """
    return Policy(
        stall_after_seconds=min(policy.stall_after_seconds, window_seconds),
        hang_after_seconds=min(policy.hang_after_seconds, window_seconds),
        output_stall_after_seconds=min(policy.output_stall_after_seconds, window_seconds),
        unreachable_after_seconds=min(policy.unreachable_after_seconds, window_seconds),
        startup_timeout_seconds=window_seconds,
        deferred_only_after_seconds=policy.deferred_only_after_seconds,
    )


def _max_state_age(policy: Policy) -> float:
    """State older than the shortest wedge threshold could fake a stall across the gap."""
    return min(
        policy.stall_after_seconds, policy.hang_after_seconds, policy.output_stall_after_seconds
    )


async def run_check(
    options: CheckOptions,
    *,
    client: httpx.AsyncClient | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep | None = None,
    wall: Clock = time.time,
) -> CheckReport:
    """`_run_check`, with the `-w`/`-c` thresholds on its report."""
    report = await _run_check(options, client=client, clock=clock, sleep=sleep, wall=wall)
    return replace(report, thresholds=options.thresholds)


async def _run_check(
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
        report, _ = await _scrape_loop(
            options,
            policy=policy,
            state=TargetState.initial(),
            notes=notes,
            observe=observe,
            clock=clock,
            sleep=sleep,
        )
        return report
    path = options.state_file
    try:
        lock = await _lock_beside(path, options, clock, sleep)
    except OSError as exc:
        _log("error", "state_file_unusable", path=str(path), error=str(exc))
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
        saved = _load_state_file(options, clock(), wall(), notes)
        report, detector = await _scrape_loop(
            options,
            policy=options.policy,
            state=saved.detector,
            notes=notes,
            observe=observe,
            clock=clock,
            sleep=sleep,
        )
        at, timestamp = clock(), wall()
        saved = replace(saved, detector=detector)
        if options.restart is not None and report.status is not EngineState.UNKNOWN:
            report, saved = _apply_restart_policy(
                options, options.restart, report, saved=saved, at=at, timestamp=timestamp
            )
        try:
            _save_state_file(path, options, saved, at, timestamp)
        except OSError as exc:
            _log("error", "state_file_unwritable", path=str(path), error=str(exc))
            return replace(
                report,
                status=EngineState.UNKNOWN,
                error=f"cannot write state file {path}: {exc}",
                probe_broken=True,
            )
        for event in report.events:
            _log(
                "error" if event.kind == "gave_up" else "info",
                str(event.kind),
                url=options.metrics_url,
                reason=event.reason,
                detail=event.detail,
            )
        return report
    finally:
        os.close(lock)


def _apply_restart_policy(
    options: CheckOptions,
    restart: RestartPolicy,
    report: CheckReport,
    *,
    saved: _Saved,
    at: float,
    timestamp: float,
) -> tuple[CheckReport, _Saved]:
    """The probe rule of `core.probe_policy`, from and into the state file."""
    events: list[PolicyEvent] = []
    memory, result = probe_policy.observe_server(
        saved.probe,
        saved.restart,
        restart,
        probe_policy.ServerMark.of(saved.detector),
        scraped=report.error is None,
        target_state=report.status,
        at=at,
        timestamp=timestamp,
    )
    events += result.events
    result = record_tick(result.state, restart, at, timestamp, healthy=report.status in CALM)
    events += result.events
    verdict, result = probe_policy.probe_verdict(
        result.state,
        restart,
        report.status,
        at,
        timestamp,
        respects_budget=options.probe_respects_budget,
        observe=options.observe,
    )
    events += result.events
    if not verdict.ok:  # this run's exit status is the failing answer the kubelet gets
        memory = probe_policy.served_failure(memory, probe_policy.ServerMark.of(saved.detector), at)
    saved = replace(saved, restart=result.state, probe=memory)
    return replace(report, restart_policy=verdict, events=tuple(events)), saved


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
    policy: Policy,
    state: TargetState,
    notes: list[str],
    observe: Observe,
    clock: Clock,
    sleep: Sleep,
) -> tuple[CheckReport, TargetState]:
    """Scrape at start, start + interval, ... and finally at (or just after) start + window.

    The last scrape begins no earlier than the end of the window, so a stall that lasted
    the whole window is measured as the whole window whatever each scrape took.
    """
    started_at = clock()
    deadline = started_at + options.window_seconds
    verdict: TargetVerdict | None = None
    scrapes = 0
    while True:
        begun_at = clock()
        observation = await observe(options.metrics_url, options.limits, clock)
        scrape_seconds = max(0.0, clock() - begun_at)
        state, verdict = step(state, observation, policy)
        scrapes += 1
        _log(
            "debug",
            "check_scraped",
            url=options.metrics_url,
            state=verdict.state.value,
            failure=None if verdict.failure is None else verdict.failure.reason,
        )
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
            return report, state
        if begun_at >= deadline:
            break
        now = clock()
        ticks = math.floor((now - started_at) / options.interval_seconds) + 1
        next_at = min(started_at + ticks * options.interval_seconds, deadline)
        if next_at > now:
            await sleep(next_at - now)
    report = _report(options.metrics_url, verdict, notes, scrapes)
    return replace(report, scrape_seconds=scrape_seconds), state


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


# ---------------------------------------------------------------------------------------
# The state file.


#: How often a check waiting for the state file's lock tries again.
LOCK_RETRY_SECONDS = 0.05
#: Slack on top of a check's own bound (window plus one scrape) when waiting for the lock.
LOCK_WAIT_MARGIN_SECONDS = 2.0


async def _lock_beside(path: Path, options: CheckOptions, clock: Clock, sleep: Sleep) -> int:
    """Take an exclusive lock beside the state file, so overlapping probes take turns.

    Returns the lock's file descriptor; closing it releases the lock. Every check ends
    within its window plus one scrape timeout, so a probe waits that long (and a margin)
    at most: a lock held longer is someone else's doing, and the check is UNKNOWN (an
    OSError) rather than blocked for ever. The directory is created 0700 or checked, and
    the lock file is 0600 and never opened through a symlink (`io.private_paths`).
    """
    private_dir(path.parent, "the state file's directory")
    lock = path.with_name(path.name + ".lock")
    fd = open_lock_file(lock)
    wait = options.window_seconds + options.limits.timeout_seconds + LOCK_WAIT_MARGIN_SECONDS
    deadline = clock() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if clock() >= deadline:
                    raise TimeoutError(
                        f"its lock {lock} was held by another process for {wait:g} s, longer "
                        "than any check lasts; is something else holding it?"
                    ) from None
            await sleep(LOCK_RETRY_SECONDS)
    except BaseException:
        os.close(fd)
        raise


@dataclass(frozen=True, slots=True)
class _Saved:
    """What the state file carries from one check to the next."""

    detector: TargetState = field(default_factory=TargetState.initial)
    restart: PolicyState = field(default_factory=PolicyState)
    probe: probe_policy.ProbeMemory = field(default_factory=probe_policy.ProbeMemory)


def _load_state_file(
    options: CheckOptions, now: float, timestamp: float, notes: list[str]
) -> _Saved:
    """The state saved by the previous check, or a fresh one with a note why.

    The restart policy and the served probe failures survive any gap between runs (a
    container restart takes a model load); the detector's history only a short one.
    """
    path = options.state_file
    assert path is not None  # noqa: S101 - only called in probe mode

    def fresh(why: str, kept: _Saved | None = None) -> _Saved:
        note = f"state file {path} {why}; starting a new history"
        notes.append(note)
        _log("warning", "state_file_replaced", path=str(path), reason=why)
        return kept if kept is not None else _Saved()

    try:
        raw = read_private(path)  # never through a symlink, never another user's file
    except FileNotFoundError:
        return _Saved()
    except OSError as exc:
        return fresh(f"cannot be read ({exc.strerror or exc})")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return fresh(f"is not valid JSON ({exc})")
    if not isinstance(data, dict):
        return fresh("does not hold a JSON object")
    if data.get("version") not in _READABLE_VERSIONS:
        return fresh(f"has version {data.get('version')!r}, expected {STATE_FILE_VERSION}")
    if data.get("metrics_url") not in (redact_url(options.metrics_url), options.metrics_url):
        shown = redact_url(options.metrics_url)
        return fresh(f"belongs to {redact_url(str(data.get('metrics_url')))!r}, not {shown}")
    kept = _Saved()
    if options.restart is not None:
        restart = _policy_from_json(data.get("restart_policy"), options.restart, now, timestamp)
        if restart is None:
            return fresh("holds a malformed restart_policy")
        kept = _Saved(
            restart=restart,
            probe=probe_policy.memory_from_json(data.get("probe"), now, timestamp),
        )
    try:
        state = load_state(data.get("detector"))  # type: ignore[arg-type]  # checked by load_state
    except (ValueError, TypeError, AttributeError) as exc:
        return fresh(f"is malformed ({exc})", kept)
    if state.last_at is not None:
        age = now - state.last_at
        limit = _max_state_age(options.policy)
        if age < 0:
            return fresh("is from before this boot (the monotonic clock went backwards)", kept)
        if age > limit:
            return fresh(
                f"is {age:.0f} s old, older than the shortest wedge threshold ({limit:g} s)",
                kept,
            )
    return replace(kept, detector=state)


def _policy_from_json(
    raw: object, policy: RestartPolicy, at: float, timestamp: float
) -> PolicyState | None:
    """The restart policy kept in the file (None when absent: a fresh one), or None if bad."""
    if raw is None:
        return PolicyState()
    try:
        assert isinstance(raw, dict)  # noqa: S101 - caught below as malformed
        record = PolicyRecord(
            phase=Phase(raw["phase"]),
            restart_timestamps=tuple(float(t) for t in raw["restart_timestamps"]),
            consecutive=int(raw["consecutive"]),
            not_before_timestamp=_optional_float(raw.get("not_before_timestamp")),
            phase_since_timestamp=_optional_float(raw.get("phase_since_timestamp")),
        )
        healthy_since = _optional_float(raw.get("healthy_since_timestamp"))
    except (AssertionError, KeyError, TypeError, ValueError):
        return None
    if not all(math.isfinite(t) for t in record.restart_timestamps):
        return None
    state = from_record(record, policy, at, timestamp)
    if healthy_since is not None and healthy_since <= timestamp:
        # A check is a new process every run: unlike the daemon's, its stretch of health
        # must survive between runs, or gave_up and the backoff could never clear.
        state = replace(state, healthy_since_at=at - (timestamp - healthy_since))
    return state


def _optional_float(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _policy_to_json(state: PolicyState, at: float, timestamp: float) -> dict[str, Any]:
    record = to_record(state, at, timestamp)
    return {
        "phase": record.phase.value,
        "restart_timestamps": list(record.restart_timestamps),
        "consecutive": record.consecutive,
        "not_before_timestamp": record.not_before_timestamp,
        "phase_since_timestamp": record.phase_since_timestamp,
        "healthy_since_timestamp": None
        if state.healthy_since_at is None
        else timestamp - (at - state.healthy_since_at),
    }


def _save_state_file(
    path: Path, options: CheckOptions, saved: _Saved, at: float, timestamp: float
) -> None:
    """Write the state atomically (io.atomic.write_atomic: temporary file, fsync, rename)."""
    payload: dict[str, Any] = {
        "version": STATE_FILE_VERSION,
        "metrics_url": redact_url(options.metrics_url),  # no credential on disk (#21)
        "saved_timestamp": timestamp,
        "detector": dump_state(saved.detector),
    }
    if options.restart is not None:
        payload["restart_policy"] = _policy_to_json(saved.restart, at, timestamp)
        payload["probe"] = probe_policy.memory_to_json(saved.probe, at, timestamp)
    if options.settings_cache is not None:
        payload["settings"] = dict(options.settings_cache)
    write_atomic(
        path,
        json.dumps(payload, allow_nan=False, separators=(",", ":")).encode(),
        make_parents=True,
    )


# ---------------------------------------------------------------------------------------
# Output.


def _engine_json(verdict: EngineVerdict) -> dict[str, Any]:
    reading = verdict.reading
    return {
        "model_name": verdict.key.model_name,
        "engine": verdict.key.engine,
        "state": verdict.state.value,
        "family": None if verdict.family is None else verdict.family.value,
        "running": None if reading is None else _json_number(reading.running),
        "waiting": None if reading is None else _json_number(reading.waiting),
        "waiting_by_reason": None
        if reading is None
        else {k: _json_number(v) for k, v in sorted(reading.waiting_by_reason.items())},
        "stalled_seconds": round(verdict.stalled_seconds, 3),
    }


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _num(value: float) -> str:
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _engine_line(verdict: EngineVerdict, at: float | None) -> str:
    family = verdict.family.value if verdict.family is not None else "-"
    where = f"{verdict.key.model_name} engine {verdict.key.engine}"
    reading = verdict.reading
    if reading is None:
        work = "missing from /metrics" if verdict.missing else "no reading (scrape failed)"
    else:
        work = f"running {_num(reading.running)}, waiting {_num(reading.waiting)}"
        if reading.waiting_by_reason:
            reasons = ", ".join(
                f"{reason} {_num(value)}"
                for reason, value in sorted(reading.waiting_by_reason.items())
            )
            work += f" ({reasons})"
    if verdict.state in (EngineState.SUSPECT, EngineState.WEDGED, EngineState.UNREACHABLE):
        since = f"stalled {verdict.stalled_seconds:.1f} s"
    elif (
        verdict.state is not EngineState.UNKNOWN
        and at is not None
        and verdict.last_progress_at is not None
    ):
        since = f"last progress {max(0.0, at - verdict.last_progress_at):.1f} s ago"
    else:
        since = ""
    parts = [f"{verdict.state.value:<11} {family:<15} {where}: {work}"]
    if since:
        parts.append(since)
    if verdict.state is EngineState.UNKNOWN:
        parts.append(verdict.reason)
    return "; ".join(parts)
