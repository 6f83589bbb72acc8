"""The wedge detector: a pure, per-engine state machine over scrape observations.

No IO and no clock: every observation carries `at` (monotonic seconds) and `step` returns the
new state with a verdict. The shell logs the verdict's transitions and carries out its actions.
"""

# RULES (the contract of this module; tests/core/test_detect.py checks them row by row)
# =================================================================================
#
# Terms. What counts as progress, output and prefill progress, when a counter moved or went
# backwards, and which readings are non-finite is defined once, in `wedgewatch.vllm.semantics`
# (its docstring); this table only uses those words:
#   progress moved     `semantics.progress_moved`: a progress counter moved since the previous
#                      good reading of the engine.
#   output moved       `semantics.output_moved`.
#   prefill moved      semantics' prefill progress (only ever seen with running > 0); it counts
#                      like progress for the stall clock and is never output.
#   work present       running > 0 or waiting > 0.
#   non-finite         a reading `semantics.non_finite_fields` names fields of.
#   stalled states     SUSPECT, WEDGED, UNREACHABLE. An *episode* runs from the step an engine
#                      enters a stalled state until the step it leaves them.
#   clocks             per engine: last_progress_at, last_output_at. "Reset" sets both to `at`.
#                      They are stall clocks, not observations: a baseline or an idle
#                      sample resets them. What the engine was *seen* doing is
#                      `progressed_at`: the last step whose progress counters or prefill
#                      moved (in any state), None from a baseline until that happens. It
#                      is the "last progress" that /status and the metrics report.
#
# Target level
#   T1  A target with no known engine (never seen up, or a restart that reported no engine)
#       has `engines == ()` and is STARTING, or UNREACHABLE once `startup_timeout_seconds`
#       (when set) have passed since the first observation of that period. A failed scrape
#       then sets `failure`; the detector emits no transition and no action (no engine).
#   T2  Otherwise the target state is the worst engine state, in the order of `SEVERITY`:
#       wedged > unreachable > unknown > suspect > starting > ok > sleeping > idle.
#   T3  Restart of the watched server: some counter of an engine present in this and in the
#       previous good scrape went backwards (finite values only), or the finite
#       process_start_time_seconds changed. Every engine in the exposition is re-baselined (R1)
#       and engines absent from it are dropped (a restart may change the data-parallel size).
#       Never a stall on that step. A non-finite process start time counts as absent.
#   T4  `at` older than the previous observation means the clock was reset (host reboot under
#       a persisted state): the detector forgets everything and starts over.
#   T5  More than one server behind the URL: a process start time comes back to a value seen
#       within the last MULTI_SERVER_WINDOW_SECONDS after another value was seen (A, B, A: a
#       real restart never returns to an old start time). From that scrape, and for as long as
#       more than one start time was seen within the window, every engine of the exposition is
#       UNKNOWN (no family) with the reason MULTI_SERVER_REASON, baselined on its reading (R1
#       clocks) with no transition to a stall and no action; engines absent are dropped. Never
#       a restart, so a load balancer never causes a restart loop.
#
# One engine, on a good scrape that contains it
#   R1  Baseline (first reading, reappearance after going missing, server restart): state from
#       the gauges (R2, N1, R3, else OK), never SUSPECT; clocks reset; the episode ends.
#   R2  Asleep (awake is False): SLEEPING, clocks reset. A sleeping engine is never stalled,
#       whatever its queues say.
#   N1  Non-finite reading: UNKNOWN (no family), the reason names the non-finite fields. It is
#       neither work nor idle: clocks are not reset, but counters and prefill that did move
#       (finite on both sides) still move them, and a non-finite value never replaces the last
#       finite one as the base of the next delta. An engine already WEDGED stays WEDGED (as in
#       U1): a NaN proves nothing about recovery.
#   R3  Idle (running == 0 and waiting == 0): IDLE, clocks reset. Idle never becomes a stall.
#   R4  Work present: if progress or prefill moved, last_progress_at = at; if output moved,
#       last_output_at = at. Two kinds of stall are then candidates:
#         flat    nothing moved this sample (neither progress nor prefill). Family by the
#                 gauges, stalled_seconds = at - last_progress_at (each family's threshold
#                 is the DetectionPolicy field `states.THRESHOLD_SETTING` names):
#                   running > 0                      progress_stall
#                   running 0, deferred, capacity    deferred_stall
#                   running 0, deferred, capacity 0  deferred_only_stall
#                   running 0, no deferred           admission_stall
#                 deferred_only_after_seconds = 0 disables deferred_only_stall (no candidate).
#                 Time spent deferred-only never counts towards another family: a flat sample
#                 of another family right after a deferred-only sample restarts the clock.
#         output  since output last moved, some sample moved progress counters while output
#                 stayed flat (the engine works but emits nothing: preemption livelock).
#                 Prefill alone never makes this candidate. Family output_stall,
#                 stalled_seconds = at - last_output_at.
#       No candidate: OK. A candidate with stalled_seconds >= its threshold: WEDGED with that
#       family (flat first). Otherwise SUSPECT: output_stall if the engine already is in
#       output_stall and that candidate holds, else flat, else output.
#       Consequences: the first flat sample with work present is SUSPECT; progress together
#       with output returns to OK in one step; output_stall clears when output moves; a
#       healthy engine whose counters all move is never SUSPECT; clients that abort and retry
#       during a wedge move nothing that counts; a long prefill whose KV usage grows is never
#       a progress_stall; a family change (e.g. running drops to 0) keeps the clock and takes
#       the threshold of the new family.
#
# One engine, unobserved
#   U1  A failed scrape never counts as idle and never resets clocks. Every known engine is
#       SUSPECT (family unreachable) from the first failure of a run of failures, and
#       UNREACHABLE once the run has lasted unreachable_after_seconds.
#       An engine already WEDGED stays WEDGED (same family, stall clock running) until then:
#       a scrape that fails proves nothing about recovery, and a liveness probe must not see
#       a wedge flicker back to healthy because one scrape timed out.
#   U2  An engine absent from a good exposition is kept and reported with missing=True:
#       SUSPECT (unreachable), then UNREACHABLE after unreachable_after_seconds. Its clock
#       starts at the failure run it vanished in, if any, else at the scrape that lacked it.
#   U3  The next good scrape judges engines by their readings again with clocks intact, so a
#       stall that outlasts an outage includes the outage in stalled_seconds.
#   U4  An engine missing for vanished_engine_expiry_seconds (or twice unreachable_after_seconds
#       if that is longer, so that it was judged UNREACHABLE first) is forgotten, at any step
#       that does not show it again (one that does baselines it as reappeared, R1).
#   U5  A good scrape that would make the engines remembered (U2) and shown more than
#       policy.max_engines is judged as a failed scrape with reason too_many_engines (U1):
#       nothing is added, so a target that names new engines on every scrape never grows
#       the state. A restarted server (T3) starts from its own engines only.
#
# K1 (canary, from core.canary: a standing no-token-while-flat stall) on a good scrape: an engine
#     judged IDLE, or SUSPECT with nothing moved this step, is WEDGED canary_stall, stalled_seconds
#     = at - since_at. Never on R1, SLEEPING, UNKNOWN or another WEDGED family.
# Actions (at most one of each kind per episode; never repeated while a state persists)
#   A1  SUSPECT once stalled_seconds has reached SUSPECT_CAPTURE_FRACTION (a quarter) of the
#       threshold of its family, the first time in the episode and only if the episode has not
#       already acted (A2): CaptureEvidence(phase="suspect"). Not at the first flat sample: a
#       suspect capture pauses the server's processes, and most short stalls clear by then.
#   A2  Entering WEDGED or UNREACHABLE, the first time in the episode:
#       CaptureEvidence(phase="wedged") then Restart. Leaving the stalled states ends the
#       episode, so a later stall emits again.
#   A3  Within one verdict every CaptureEvidence precedes every Restart, so evidence of one
#       engine is taken before any restart tears the server down. The shell decides whether to
#       act at all (observe mode ignores Restart).

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from wedgewatch.core.detection.states import (
    ACTED_ON,
    SCRAPE_FAILURE_REASONS,
    SEVERITY,
    STALLED,
    THRESHOLD_SETTING,
    THRESHOLD_SETTINGS,
    CapturePhase,
    EngineState,
    EpisodePhase,
    Family,
    ScrapeFailureReason,
)
from wedgewatch.core.text.redact import redact_text
from wedgewatch.vllm import semantics
from wedgewatch.vllm.signals import DEFAULT_MAX_ENGINES, EngineKey, EngineReading, Exposition

__all__ = [
    "MULTI_SERVER_REASON",
    "MULTI_SERVER_WINDOW_SECONDS",
    "SUSPECT_CAPTURE_FRACTION",
    "Action",
    "CanaryStall",
    "CaptureEvidence",
    "DetectionPolicy",
    "EngineMemory",
    "EngineVerdict",
    "Observation",
    "Restart",
    "ScrapeFailed",
    "Scraped",
    "TargetState",
    "TargetVerdict",
    "Transition",
    "new_state",
    "step",
]


@dataclass(frozen=True, slots=True)
class Scraped:
    """A good scrape: the parsed exposition, observed at monotonic time `at`."""

    at: float
    exposition: Exposition


@dataclass(frozen=True, slots=True)
class ScrapeFailed:
    """A scrape that produced no exposition, with a reason from a closed set."""

    at: float
    reason: ScrapeFailureReason
    detail: str

    def __post_init__(self) -> None:
        """Reject a reason outside the closed set (a bug in the caller, not in the server)."""
        if self.reason not in SCRAPE_FAILURE_REASONS:
            allowed = ", ".join(sorted(SCRAPE_FAILURE_REASONS))
            raise ValueError(f"ScrapeFailed.reason must be one of {allowed}, got {self.reason!r}")


Observation = Scraped | ScrapeFailed


@dataclass(frozen=True, slots=True)
class DetectionPolicy:
    """Thresholds of the detector, in seconds; `startup_timeout_seconds=None` waits forever.

    `deferred_only_after_seconds = 0` disables the deferred_only_stall family (rule R4).
    These defaults are the product's: `config.Config` takes its defaults from them.
    """

    stall_after_seconds: float = 60.0
    hang_after_seconds: float = 120.0
    output_stall_after_seconds: float = 300.0
    unreachable_after_seconds: float = 30.0
    startup_timeout_seconds: float | None = 900.0
    deferred_only_after_seconds: float = 600.0
    canary_timeout_seconds: float = 120.0
    # Bounds on what a target makes the detector remember (rules U4, U5 of core.detect):
    # engines across scrapes, and how long an engine gone from /metrics is kept.
    max_engines: int = DEFAULT_MAX_ENGINES
    vanished_engine_expiry_seconds: float = 600.0

    def __post_init__(self) -> None:
        """Reject thresholds that are negative, NaN or infinite, and a bound below 1."""
        if isinstance(self.max_engines, bool) or not isinstance(self.max_engines, int):
            raise ValueError(
                f"DetectionPolicy.max_engines must be a whole number, got {self.max_engines!r}"
            )
        if self.max_engines < 1:
            raise ValueError(f"DetectionPolicy.max_engines must be >= 1, got {self.max_engines}")
        names = (*THRESHOLD_SETTINGS, "startup_timeout_seconds", "vanished_engine_expiry_seconds")
        for name in names:
            value = getattr(self, name)
            if value is None and name == "startup_timeout_seconds":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"DetectionPolicy.{name} must be a number of seconds, got {value!r}"
                )
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"DetectionPolicy.{name} must be finite and >= 0, got {value!r}")

    def threshold(self, family: Family) -> float:
        """The number of seconds after which a stall of `family` is WEDGED (or UNREACHABLE)."""
        seconds: float = getattr(self, THRESHOLD_SETTING[family])
        return seconds


@dataclass(frozen=True, slots=True)
class CanaryStall:
    """Rule K1's input: a canary sent at `since_at` got no token while nothing progressed."""

    since_at: float
    detail: str


@dataclass(frozen=True, slots=True)
class CaptureEvidence:
    """Ask the shell to capture evidence about one engine (stacks, metrics, process state)."""

    key: EngineKey
    family: Family
    phase: EpisodePhase


@dataclass(frozen=True, slots=True)
class Restart:
    """Ask the shell to restart the server that runs this engine (subject to its budget)."""

    key: EngineKey
    family: Family


Action = CaptureEvidence | Restart


@dataclass(frozen=True, slots=True)
class Transition:
    """One engine changed state at `at`; `family` is the new state's stall family, if any."""

    key: EngineKey
    old: EngineState
    new: EngineState
    family: Family | None
    at: float


@dataclass(frozen=True, slots=True)
class EngineVerdict:
    """The judgement of one engine at one step.

    `since_at` is when the engine entered `state`; `reading` is what this step's scrape said
    about the engine (None when the scrape failed or the engine was missing); `missing` is
    True while the engine is absent from good scrapes; `reason` is one human sentence.
    """

    key: EngineKey
    state: EngineState
    family: Family | None
    since_at: float
    stalled_seconds: float
    last_progress_at: float | None
    reading: EngineReading | None
    missing: bool
    reason: str


@dataclass(frozen=True, slots=True)
class TargetVerdict:
    """The judgement of one target at one step: its worst state and each engine's verdict.

    `engines` is sorted by key and empty while no engine is known (rule T1); `failure` is the
    observation when the scrape failed. Actions are ordered: every capture before any restart.
    """

    at: float
    state: EngineState
    engines: tuple[EngineVerdict, ...]
    transitions: tuple[Transition, ...]
    actions: tuple[Action, ...]
    failure: ScrapeFailed | None


#: Rule A1: the suspect capture waits until a stall has lasted this share of its threshold.
SUSPECT_CAPTURE_FRACTION: Final = 0.25
#: Rule T5: how long a process start time is remembered to tell a load balancer from a restart.
MULTI_SERVER_WINDOW_SECONDS: Final = 300.0
#: Rule T5: the reason of every engine of a URL that reaches more than one server.
MULTI_SERVER_REASON: Final = (
    "the URL reaches more than one server; point wedgewatch at one pod or process"
)
# Rule T5 keeps at most this many distinct start times (bounded state).
MAX_START_TIMES: Final = 8


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """What the detector remembers about one engine between steps (O(1) per engine).

    `reading` is the base of every delta: the last good reading, with any non-finite counter
    or KV value replaced by the last finite one (rule N1); `output_pending` records that
    other counters moved while output stayed flat since `last_output_at`; `captured` that this
    episode already asked for the suspect capture (A1), `acted` for the wedged capture and the
    restart (A2); `deferred_only` that the last judged sample was a deferred-only flat one;
    `progressed_at` when progress was last seen (None until it has been, since the baseline).
    """

    key: EngineKey
    state: EngineState
    family: Family | None
    since_at: float
    last_progress_at: float
    last_output_at: float
    output_pending: bool
    reading: EngineReading
    missing_since: float | None
    acted: bool
    captured: bool = False
    deferred_only: bool = False
    progressed_at: float | None = None


@dataclass(frozen=True, slots=True)
class TargetState:
    """Everything the detector remembers about one target; start from `TargetState.initial()`.

    `engines` is sorted by key. `starting_since` is the first observation while no engine is
    known; `failing_since` the first failure of the current run of failures; `last_at` the
    latest observation; `process_start_time_seconds` the latest finite one the server
    reported; `start_times` the distinct start times seen within MULTI_SERVER_WINDOW_SECONDS
    as (value, last seen at), newest last; `multi_server_since` when rule T5 began to hold.
    """

    engines: tuple[EngineMemory, ...] = ()
    starting_since: float | None = None
    failing_since: float | None = None
    last_at: float | None = None
    process_start_time_seconds: float | None = None
    start_times: tuple[tuple[float, float], ...] = ()
    multi_server_since: float | None = None

    @classmethod
    def initial(cls) -> TargetState:
        """The state of a target nothing has been observed about yet."""
        return cls()


def new_state() -> TargetState:
    """The state of a target nothing has been observed about yet."""
    return TargetState.initial()


# --------------------------------------------------------------------------------------------
# step


@dataclass(frozen=True, slots=True)
class _Judgement:
    """An engine's state at this step before actions and transitions are derived."""

    state: EngineState
    family: Family | None
    stalled_seconds: float
    reason: str


@dataclass(frozen=True, slots=True)
class _Stall:
    family: Family
    stalled_seconds: float
    threshold: float


@dataclass(slots=True)
class _Outcome:
    """Accumulates one step's engines, verdicts, transitions and actions (local to `step`)."""

    at: float
    policy: DetectionPolicy
    memories: list[EngineMemory] = field(default_factory=list)
    verdicts: list[EngineVerdict] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    captures: list[Action] = field(default_factory=list)
    restarts: list[Action] = field(default_factory=list)

    def record(
        self,
        old: EngineMemory | None,
        memory: EngineMemory,
        judgement: _Judgement,
        reading: EngineReading | None,
    ) -> None:
        """Settle one engine: episode bookkeeping, actions (A1-A2), transition and verdict."""
        at = self.at
        key = memory.key
        old_state = old.state if old is not None else EngineState.STARTING
        was_stalled = old_state in STALLED
        acted = old.acted if old is not None and was_stalled else False
        captured = old.captured if old is not None and was_stalled else False
        family = judgement.family
        if judgement.state in STALLED and family is not None:
            if (
                judgement.state is EngineState.SUSPECT
                and not captured
                and not acted
                and judgement.stalled_seconds
                >= SUSPECT_CAPTURE_FRACTION * self.policy.threshold(family)
            ):
                self.captures.append(CaptureEvidence(key, family, CapturePhase.SUSPECT))
                captured = True
            if judgement.state in ACTED_ON and not acted:
                self.captures.append(CaptureEvidence(key, family, CapturePhase.WEDGED))
                self.restarts.append(Restart(key, family))
                acted = True
        else:
            acted = captured = False
        if old is not None and old_state is judgement.state:
            since_at = old.since_at
        else:
            since_at = at
            self.transitions.append(Transition(key, old_state, judgement.state, family, at))
        memory = replace(
            memory,
            state=judgement.state,
            family=family,
            since_at=since_at,
            acted=acted,
            captured=captured,
        )
        self.memories.append(memory)
        self.verdicts.append(
            EngineVerdict(
                key=key,
                state=judgement.state,
                family=family,
                since_at=since_at,
                stalled_seconds=judgement.stalled_seconds,
                last_progress_at=memory.progressed_at,
                reading=reading,
                missing=memory.missing_since is not None,
                reason=judgement.reason,
            )
        )

    def verdict(self, state: EngineState, failure: ScrapeFailed | None) -> TargetVerdict:
        """The target verdict of this step."""
        return TargetVerdict(
            at=self.at,
            state=state,
            engines=tuple(self.verdicts),
            transitions=tuple(self.transitions),
            actions=(*self.captures, *self.restarts),
            failure=failure,
        )


def step(
    state: TargetState,
    observation: Observation,
    policy: DetectionPolicy,
    canary: CanaryStall | None = None,
) -> tuple[TargetState, TargetVerdict]:
    """Fold one observation (and a standing canary stall, K1) into the state; return the verdict."""
    if not math.isfinite(observation.at):
        raise ValueError(f"observation.at must be finite monotonic seconds, got {observation.at!r}")
    if state.last_at is not None and observation.at < state.last_at:
        state = TargetState.initial()  # rule T4
    if isinstance(observation, ScrapeFailed):
        return _step_failed(
            _expire_vanished(state, observation.at, policy, {}), observation, policy
        )
    shown = observation.exposition.engines
    return _step_scraped(
        _expire_vanished(state, observation.at, policy, shown), observation, policy, canary
    )


def _expire_vanished(
    state: TargetState, at: float, policy: DetectionPolicy, shown: Mapping[EngineKey, EngineReading]
) -> TargetState:
    """Rule U4: forget engines missing for longer than the expiry (unless back in `shown`)."""
    expiry = max(policy.vanished_engine_expiry_seconds, 2 * policy.unreachable_after_seconds)
    kept = tuple(
        m
        for m in state.engines
        if m.missing_since is None or at - m.missing_since < expiry or m.key in shown
    )
    return state if len(kept) == len(state.engines) else replace(state, engines=kept)


def _step_failed(
    state: TargetState, failure: ScrapeFailed, policy: DetectionPolicy
) -> tuple[TargetState, TargetVerdict]:
    at = failure.at
    failing_since = state.failing_since if state.failing_since is not None else at
    out = _Outcome(at, policy)
    what = f"no good scrape of /metrics (last failure: {failure.reason}: {failure.detail})"
    for old in state.engines:
        since = (
            failing_since if old.missing_since is None else min(old.missing_since, failing_since)
        )
        judgement = _hold_wedged(old, _judge_unobserved(what, at, since, policy), at)
        out.record(old, old, judgement, None)
    engines, starting_since, verdict = _finish(state, out, policy, failure)
    new = replace(
        state,
        failing_since=failing_since,
        last_at=at,
        engines=engines,
        starting_since=starting_since,
    )
    return new, verdict


def _step_scraped(
    state: TargetState, scraped: Scraped, policy: DetectionPolicy, canary: CanaryStall | None = None
) -> tuple[TargetState, TargetVerdict]:
    at = scraped.at
    exposition = scraped.exposition
    known = adopt_redacted_keys({m.key: m for m in state.engines}, exposition)
    start = semantics.process_start(exposition.process_start_time_seconds)
    start_times, multi_server_since = _track_start_times(state, start, at)
    out = _Outcome(at, policy)
    if multi_server_since is not None:
        for key in sorted(exposition.engines):
            shown = exposition.engines[key]
            memory, _ = _baseline(key, shown, at, "")
            judgement = _Judgement(EngineState.UNKNOWN, None, 0.0, MULTI_SERVER_REASON)
            out.record(known.get(key), memory, judgement, shown)
    else:
        restart = _restart_cause(state, known, exposition, start)
        keys = (
            set(exposition.engines) if restart is not None else set(known) | set(exposition.engines)
        )
        if len(keys) > policy.max_engines:  # rule U5
            detail = (
                f"the target named {len(keys)} engines across scrapes, more than max_engines "
                f"({policy.max_engines}); new engines are not tracked (a vLLM server has one "
                "per data-parallel rank: is this an aggregated or hostile target?)"
            )
            return _step_failed(state, ScrapeFailed(at, "too_many_engines", detail), policy)
        for key in sorted(keys):
            old = known.get(key)
            reading = exposition.engines.get(key)
            if reading is None:
                if old is None:  # unreachable: keys come from `known` or the exposition
                    continue
                memory, judgement = _missing(old, at, state.failing_since, policy)
            elif old is None:
                memory, judgement = _baseline(key, reading, at, "first reading (baseline)")
            elif restart is not None:
                memory, judgement = _baseline(
                    key, reading, at, f"server restarted ({restart}); new baseline"
                )
            elif old.missing_since is not None or (
                old.state is EngineState.UNKNOWN and state.multi_server_since is not None
            ):
                why = (
                    "engine reappeared in /metrics"
                    if old.missing_since is not None
                    else "one server behind the URL again"
                )
                memory, judgement = _baseline(key, reading, at, f"{why}; new baseline")
            else:
                memory, judgement = _judge_reading(old, reading, at, policy)
                if canary is not None:
                    judgement = _canary_stalled(judgement, old.reading, reading, at, canary)
            out.record(old, memory, judgement, reading)
    engines, starting_since, verdict = _finish(state, out, policy, None)
    new = replace(
        state,
        failing_since=None,
        last_at=at,
        process_start_time_seconds=start if start is not None else state.process_start_time_seconds,
        start_times=start_times,
        multi_server_since=multi_server_since,
        engines=engines,
        starting_since=starting_since,
    )
    return new, verdict


def adopt_redacted_keys(
    known: dict[EngineKey, EngineMemory], exposition: Exposition
) -> dict[EngineKey, EngineMemory]:
    """A state file keeps model names redacted (`detect_state`): an engine restored
    under the redacted form of a live engine's key is that engine, under its live key."""
    for key in sorted(exposition.engines):
        if key in known:  # the steady state: nothing to adopt, nothing to redact
            continue
        stored = EngineKey(redact_text(key.model_name), key.engine)
        live_elsewhere = stored in exposition.engines  # a live engine under that name: its own
        if key not in known and stored != key and stored in known and not live_elsewhere:
            known[key] = replace(known.pop(stored), key=key)
    return known


def _track_start_times(
    state: TargetState, start: float | None, at: float
) -> tuple[tuple[tuple[float, float], ...], float | None]:
    """Rule T5: the start times seen within the window, and since when T5 holds (or None)."""
    horizon = at - MULTI_SERVER_WINDOW_SECONDS
    recent = [(value, seen) for value, seen in state.start_times if seen >= horizon]
    since = state.multi_server_since
    if start is None:
        if since is not None and len({value for value, _ in recent}) <= 1:
            since = None
        return tuple(recent), since
    previous = state.process_start_time_seconds
    returned = (
        previous is not None and start != previous and any(value == start for value, _ in recent)
    )
    recent = [(value, seen) for value, seen in recent if value != start]
    recent.append((start, at))
    recent = recent[-MAX_START_TIMES:]
    if returned and since is None:
        since = at
    elif since is not None and len(recent) <= 1:
        since = None
    return tuple(recent), since


def _finish(
    state: TargetState, out: _Outcome, policy: DetectionPolicy, failure: ScrapeFailed | None
) -> tuple[tuple[EngineMemory, ...], float | None, TargetVerdict]:
    """Apply rules T1 and T2: the engines the new state keeps, the starting clock while no
    engine is known, and the verdict with the target state."""
    if out.memories:
        worst = min(out.memories, key=lambda m: SEVERITY.index(m.state)).state
        return tuple(out.memories), None, out.verdict(worst, failure)
    at = out.at
    starting_since = state.starting_since if state.starting_since is not None else at
    timeout = policy.startup_timeout_seconds
    target = EngineState.STARTING
    if timeout is not None and at - starting_since >= timeout:
        target = EngineState.UNREACHABLE
    return (), starting_since, out.verdict(target, failure)


def _restart_cause(
    state: TargetState,
    known: Mapping[EngineKey, EngineMemory],
    exposition: Exposition,
    start: float | None,
) -> str | None:
    """Rule T3: why this exposition comes from a restarted server, or None."""
    for key in sorted(exposition.engines):
        old = known.get(key)
        if old is None or old.missing_since is not None:
            continue
        evidence = semantics.restart_evidence(old.reading, exposition.engines[key])
        if evidence is not None:
            name, before, now = evidence
            return (
                f"{name} of engine {key.engine} of model {key.model_name} went backwards "
                f"from {_num(before)} to {_num(now)}"
            )
    before_start = state.process_start_time_seconds
    if before_start is not None and start is not None and start != before_start:
        return f"process start time changed from {_num(before_start)} to {_num(start)}"
    return None


def _gauge_state(reading: EngineReading) -> EngineState | None:
    """Rules R2, N1 and R3: SLEEPING, UNKNOWN or IDLE from the gauges alone, else None."""
    if reading.awake is False:
        return EngineState.SLEEPING
    if semantics.non_finite_fields(reading):
        return EngineState.UNKNOWN
    if reading.running == 0 and reading.waiting == 0:
        return EngineState.IDLE
    return None


def _baseline(
    key: EngineKey, reading: EngineReading, at: float, why: str
) -> tuple[EngineMemory, _Judgement]:
    """Rule R1: a reading with nothing to compare against sets the baseline; never a stall."""
    memory = EngineMemory(
        key=key,
        state=EngineState.OK,
        family=None,
        since_at=at,
        last_progress_at=at,
        last_output_at=at,
        output_pending=False,
        reading=reading,
        missing_since=None,
        acted=False,
    )
    state = _gauge_state(reading) or EngineState.OK
    return memory, _Judgement(state, None, 0.0, f"{why}: {_describe_calm(state, reading)}")


def _judge_reading(
    old: EngineMemory, reading: EngineReading, at: float, policy: DetectionPolicy
) -> tuple[EngineMemory, _Judgement]:
    """Rules R2-R4 and N1: judge a good reading against the engine's previous one."""
    calm = _gauge_state(reading)
    if calm is EngineState.UNKNOWN:
        return _judge_non_finite(old, reading, at)
    if calm is not None:
        seen = semantics.movement(old.reading, reading)
        memory = replace(
            old,
            reading=semantics.keep_finite(old.reading, reading),
            progressed_at=at if seen.progress or seen.prefill else old.progressed_at,
            last_progress_at=at,
            last_output_at=at,
            output_pending=False,
            deferred_only=False,
        )
        return memory, _Judgement(calm, None, 0.0, _describe_calm(calm, reading))

    moved = semantics.movement(old.reading, reading)
    working = moved.progress or moved.prefill
    last_progress_at = at if working else old.last_progress_at
    last_output_at = at if moved.output else old.last_output_at
    output_pending = not moved.output and (old.output_pending or moved.progress)

    flat: _Stall | None = None
    deferred_only = False
    if not working:
        family = _flat_family(reading)
        deferred_only = family is Family.DEFERRED_ONLY_STALL
        if old.deferred_only and not deferred_only:
            last_progress_at = at  # deferred-only time never counts towards another family
        threshold = policy.threshold(family)
        if not (deferred_only and threshold == 0):
            flat = _Stall(family, at - last_progress_at, threshold)
    memory = replace(
        old,
        reading=semantics.keep_finite(old.reading, reading),
        progressed_at=at if working else old.progressed_at,
        last_progress_at=last_progress_at,
        last_output_at=last_output_at,
        output_pending=output_pending,
        deferred_only=deferred_only,
    )
    output: _Stall | None = None
    if output_pending:
        output = _Stall(Family.OUTPUT_STALL, at - last_output_at, policy.output_stall_after_seconds)

    work = _describe_work(reading)
    candidates = [s for s in (flat, output) if s is not None]  # flat first
    if not candidates:
        if not working and deferred_only:
            what = "only deferred requests, not judged (deferred_only_after_seconds = 0)"
        elif moved.prefill and not moved.progress:
            what = "prefilling (KV cache usage or prefix-cache queries moved)"
        else:
            what = "progressing"
        return memory, _Judgement(EngineState.OK, None, 0.0, f"{work}, {what}")
    over = [s for s in candidates if s.stalled_seconds >= s.threshold]
    if over:
        chosen, state = over[0], EngineState.WEDGED
    elif output is not None and (flat is None or old.family is Family.OUTPUT_STALL):
        chosen, state = output, EngineState.SUSPECT
    else:
        chosen, state = candidates[0], EngineState.SUSPECT
    if chosen.family is Family.OUTPUT_STALL:
        what = "counters move but no output (generation tokens, completed requests)"
    else:
        what = "no progress"
    reason = (
        f"{work}, {what} for {_num(chosen.stalled_seconds)}s (threshold {_num(chosen.threshold)}s)"
    )
    return memory, _Judgement(state, chosen.family, chosen.stalled_seconds, reason)


def _canary_stalled(
    judgement: _Judgement, before: EngineReading, now: EngineReading, at: float, canary: CanaryStall
) -> _Judgement:
    """Rule K1: a standing canary stall makes an idle or flat engine WEDGED (canary_stall)."""
    moved = semantics.movement(before, now)
    flat = judgement.state is EngineState.SUSPECT and not (moved.progress or moved.prefill)
    if judgement.state is not EngineState.IDLE and not flat:
        return judgement
    why = f"{_describe_work(now)}, metrics show no progress; {canary.detail}"
    return _Judgement(EngineState.WEDGED, Family.CANARY_STALL, max(0.0, at - canary.since_at), why)


def _flat_family(reading: EngineReading) -> Family:
    """Rule R4: the family of a flat sample, from the queue gauges."""
    if reading.running > 0:
        return Family.PROGRESS_STALL
    if reading.deferred > 0:
        return Family.DEFERRED_STALL if reading.capacity > 0 else Family.DEFERRED_ONLY_STALL
    return Family.ADMISSION_STALL


def _judge_non_finite(
    old: EngineMemory, reading: EngineReading, at: float
) -> tuple[EngineMemory, _Judgement]:
    """Rule N1: a non-finite reading is UNKNOWN; what did move still moves the clocks."""
    moved = semantics.movement(old.reading, reading)
    working = moved.progress or moved.prefill
    memory = replace(
        old,
        reading=semantics.keep_finite(old.reading, reading),
        progressed_at=at if working else old.progressed_at,
        last_progress_at=at if working else old.last_progress_at,
        last_output_at=at if moved.output else old.last_output_at,
        output_pending=not moved.output and (old.output_pending or moved.progress),
        deferred_only=False,
    )
    fields = ", ".join(semantics.non_finite_fields(reading))
    reason = (
        f"the server reported non-finite values ({fields}): neither work nor idle, not judged "
        "until they read finite again"
    )
    if old.state is EngineState.WEDGED and not working:
        quiet_since = (
            memory.last_output_at if old.family is Family.OUTPUT_STALL else memory.last_progress_at
        )
        return memory, _Judgement(
            EngineState.WEDGED,
            old.family,
            at - quiet_since,
            f"still wedged ({old.family}); {reason}",
        )
    return memory, _Judgement(EngineState.UNKNOWN, None, 0.0, reason)


def _missing(
    old: EngineMemory, at: float, failing_since: float | None, policy: DetectionPolicy
) -> tuple[EngineMemory, _Judgement]:
    """Rule U2: an engine absent from a good exposition."""
    since = old.missing_since
    if since is None:
        since = failing_since if failing_since is not None else at
    key = old.key
    what = f"engine {key.engine} of model {key.model_name} disappeared from /metrics, unseen"
    judgement = _hold_wedged(old, _judge_unobserved(what, at, since, policy), at)
    return replace(old, missing_since=since), judgement


def _hold_wedged(old: EngineMemory, judgement: _Judgement, at: float) -> _Judgement:
    """Rule U1: a WEDGED engine that goes unobserved stays WEDGED until it is UNREACHABLE."""
    if old.state is not EngineState.WEDGED or judgement.state is not EngineState.SUSPECT:
        return judgement
    quiet_since = old.last_output_at if old.family is Family.OUTPUT_STALL else old.last_progress_at
    stalled = at - quiet_since
    reason = f"still wedged ({old.family}); {judgement.reason}"
    return _Judgement(EngineState.WEDGED, old.family, stalled, reason)


def _judge_unobserved(what: str, at: float, since: float, policy: DetectionPolicy) -> _Judgement:
    """Rules U1 and U2: SUSPECT, then UNREACHABLE once unobserved for the threshold."""
    elapsed = at - since
    threshold = policy.unreachable_after_seconds
    state = EngineState.UNREACHABLE if elapsed >= threshold else EngineState.SUSPECT
    reason = f"{what} for {_num(elapsed)}s (threshold {_num(threshold)}s)"
    return _Judgement(state, Family.UNREACHABLE, elapsed, reason)


def _num(value: float) -> str:
    """A number for a human: integers without a decimal point, others to one decimal."""
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return f"{value:.1f}"


def _describe_work(reading: EngineReading) -> str:
    text = f"running {_num(reading.running)}, waiting {_num(reading.waiting)}"
    if reading.waiting_by_reason:
        text += f" (deferred {_num(reading.deferred)}, capacity {_num(reading.capacity)})"
    return text


def _describe_calm(state: EngineState, reading: EngineReading) -> str:
    if state is EngineState.SLEEPING:
        return f"asleep, stall detection paused ({_describe_work(reading)})"
    if state is EngineState.IDLE:
        return "idle, nothing running or waiting"
    if state is EngineState.UNKNOWN:
        fields = ", ".join(semantics.non_finite_fields(reading))
        return f"non-finite values ({fields}): neither work nor idle"
    return _describe_work(reading)
