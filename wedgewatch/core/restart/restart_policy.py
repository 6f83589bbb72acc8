"""The restart policy: budget, backoff, startup grace and gave_up, as a pure state machine.

No clock is read here: every call gets `at` (monotonic seconds) and `timestamp` (Unix
seconds). The restarters that act on a server live in `wedgewatch.io.restarters`; each
reports a `RestartOutcome`, which `record_restart` takes.
"""

# RULES OF THE RESTART POLICY (one `PolicyState` per target)
# tests/core/test_restart_policy.py checks them row by row.
# ============================================================================================
#
# Phases
#   armed       restarts may be allowed, subject to the budget and the backoff.
#   restarting  a restart was allowed and the restarter runs; its outcome is awaited.
#   starting    the restarter succeeded; waiting for the server's first good scrape.
#   gave_up     the budget was spent when another restart was needed; report only.
#
# Inputs (functions) and what they do
#   decide(at)                 armed: the budget is spent (restart_budget restarts within the
#                              last restart_budget_window_seconds, half-open window
#                              (at - window, at]) -> gave_up, event gave_up, Deny
#                              budget_exhausted. Else inside the backoff (at < not_before_at)
#                              -> Deny backoff. Else Allow: the attempt is recorded at `at`
#                              (it counts against the budget whatever its outcome), phase
#                              restarting. restarting -> Deny in_progress; starting -> Deny
#                              in_grace; gave_up -> Deny budget_exhausted (no new event).
#   record_restart(outcome)    restarting only. ok -> starting (the startup grace begins at
#                              `at`). Failed -> armed, event restart_failed (reason
#                              remedy_error, timeout or not_vllm), backoff armed.
#   record_good_scrape(at)     a scrape proven to come from a new server (core.replacement):
#                              starting: -> armed, event restart_succeeded, backoff armed.
#                              Other phases: nothing.
#   record_tick(at, healthy)   starting and at - since >= startup_timeout_seconds -> armed,
#                              event restart_failed (reason not_recovered; not_replaced when
#                              the old server still answered), backoff armed.
#                              armed / gave_up: track how long the target has been healthy
#                              without a break. After healthy_reset_seconds of it: armed with a
#                              raised backoff -> backoff reset (event backoff_reset); gave_up ->
#                              armed, backoff reset (event gave_up_cleared, reason healthy).
#   reset(at)                  operator reset: history and backoff forgotten; gave_up ->
#                              armed (event gave_up_cleared, reason operator_reset), else event
#                              budget_reset. A restart in flight keeps its phase.
#
# Backoff ("armed" means: not_before_at = at + delay, at the moment a restart resolves)
#   The n-th restart since the last backoff reset (n >= 1) is followed by a pause of
#   restart_backoff_seconds * 2**(n - 1), capped at restart_backoff_max_seconds, counted
#   from when that restart resolved (succeeded, failed, or not recovered). The first restart
#   is never delayed. The pause and the count reset after healthy_reset_seconds (default:
#   restart_backoff_max_seconds) of uninterrupted health.
#
# gave_up is sticky
#   The budget window freeing up does NOT leave gave_up: a server that used up its budget
#   wedges again after any restart, and resuming "3 per hour" forever is a slow restart storm.
#   gave_up ends when the target is healthy again for healthy_reset_seconds (an operator
#   fixed it by hand), or by an operator reset. The budget still applies after that.
#
# Persistence
#   `to_record` turns monotonic instants into Unix timestamps, `from_record` rebases them onto
#   the new process's monotonic clock. Restarts stamped in the future (the wall clock went
#   back) count as happening now; a backoff is never restored longer than
#   restart_backoff_max_seconds; a restart in flight when wedgewatch died resumes as starting.
#   healthy_since is recorded, and restored only with `keep_health` (a `wedgewatch check`
#   probe is a new process every run, so its stretch of health must survive between runs;
#   the daemon observes health again after its own restart).

from __future__ import annotations

import math
from dataclasses import replace
from enum import StrEnum
from typing import Literal, TypeAlias

from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.values import immutable


class Phase(StrEnum):
    """Where a target is in the restart cycle."""

    ARMED = "armed"
    RESTARTING = "restarting"
    STARTING = "starting"
    GAVE_UP = "gave_up"


class DenyReason(StrEnum):
    """Why a restart is not allowed now."""

    BUDGET_EXHAUSTED = "budget_exhausted"
    BACKOFF = "backoff"
    IN_GRACE = "in_grace"
    IN_PROGRESS = "in_progress"


#: The facts the policy reports: six members of the core's one closed `ReportEvent`.
PolicyEventKind: TypeAlias = Literal[
    ReportEvent.RESTART_SUCCEEDED,
    ReportEvent.RESTART_FAILED,
    ReportEvent.GAVE_UP,
    ReportEvent.GAVE_UP_CLEARED,
    ReportEvent.BACKOFF_RESET,
    ReportEvent.BUDGET_RESET,
]


class FailureReason(StrEnum):
    """Why a restart failed (the `reason` label of wedgewatch_restart_failures_total)."""

    REMEDY_ERROR = "remedy_error"
    TIMEOUT = "timeout"
    NOT_RECOVERED = "not_recovered"
    NOT_REPLACED = "not_replaced"  # the server answered, but it is still the old one
    NOT_VLLM = "not_vllm"  # refused: the process tree is not proven to be the server


@immutable
class RestartPolicy:
    """The safety rules of automatic restarts; see the rules at the top of this module."""

    restart_budget: int = 3
    restart_budget_window_seconds: float = 3600.0
    restart_backoff_seconds: float = 60.0
    restart_backoff_max_seconds: float = 900.0
    startup_timeout_seconds: float = 900.0
    healthy_reset_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.restart_budget < 1:
            raise ValueError(
                f"restart_budget must be at least 1, got {self.restart_budget} "
                '(use remedy = "none" to never restart)'
            )
        for name in (
            "restart_budget_window_seconds",
            "restart_backoff_seconds",
            "restart_backoff_max_seconds",
            "startup_timeout_seconds",
            "healthy_reset_seconds",
        ):
            value = getattr(self, name)
            if value is None:
                continue
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        if self.restart_budget_window_seconds <= 0 or self.startup_timeout_seconds <= 0:
            raise ValueError(
                "restart_budget_window_seconds and startup_timeout_seconds must be > 0"
            )
        if self.restart_backoff_max_seconds < self.restart_backoff_seconds:
            raise ValueError(
                f"restart_backoff_max_seconds ({self.restart_backoff_max_seconds}) must be at "
                f"least restart_backoff_seconds ({self.restart_backoff_seconds})"
            )

    @property
    def reset_after_seconds(self) -> float:
        """Uninterrupted health that resets the backoff and clears gave_up."""
        if self.healthy_reset_seconds is None:
            return self.restart_backoff_max_seconds
        return self.healthy_reset_seconds

    def backoff_after(self, restarts: int) -> float:
        """The pause after the `restarts`-th restart since the last backoff reset."""
        if restarts < 1:
            return 0.0
        exponent = min(restarts - 1, 64)  # 2**64 * any base is past every sane cap
        return min(self.restart_backoff_seconds * 2.0**exponent, self.restart_backoff_max_seconds)


@immutable
class PolicyState:
    """One target's restart bookkeeping; every instant is monotonic seconds."""

    phase: Phase = Phase.ARMED
    restarts_at: tuple[float, ...] = ()  # attempts inside the budget window, oldest first
    consecutive: int = 0  # restarts since the last backoff reset
    not_before_at: float | None = None  # the backoff: no restart before this instant
    phase_since_at: float | None = None  # when the current phase began
    healthy_since_at: float | None = None  # start of the current run of healthy ticks


@immutable
class PolicyEvent:
    """One fact for the log, the metrics and the webhooks."""

    kind: PolicyEventKind
    at: float
    timestamp: float
    reason: str
    detail: str


@immutable
class Step:
    """The policy state after an input and the events the input caused."""

    state: PolicyState
    events: tuple[PolicyEvent, ...] = ()


@immutable
class Allow:
    """Restart now; `attempt` counts the restarts in the window including this one."""

    attempt: int


@immutable
class Deny:
    """Do not restart now; `retry_at` is when asking again may help (None: not by waiting)."""

    reason: DenyReason
    detail: str
    retry_at: float | None = None


Decision = Allow | Deny


@immutable
class RestartOutcome:
    """The result of one restart attempt: data, never an exception."""

    ok: bool
    detail: str
    duration_seconds: float
    failure: FailureReason | None = None  # set when not ok: remedy_error or timeout


def _prune(state: PolicyState, policy: RestartPolicy, at: float) -> PolicyState:
    if not state.restarts_at:  # the steady state: every scrape asks, nothing to forget
        return state
    oldest = at - policy.restart_budget_window_seconds
    kept = tuple(r for r in state.restarts_at if r > oldest)
    return state if len(kept) == len(state.restarts_at) else replace(state, restarts_at=kept)


def budget_remaining(state: PolicyState, policy: RestartPolicy, at: float) -> int:
    """How many restarts the budget still allows at `at`."""
    used = len(_prune(state, policy, at).restarts_at)
    return max(policy.restart_budget - used, 0)


def _event(
    kind: PolicyEventKind, at: float, timestamp: float, reason: str, detail: str
) -> PolicyEvent:
    return PolicyEvent(kind=kind, at=at, timestamp=timestamp, reason=reason, detail=detail)


def seconds_text(value: float) -> str:
    """A duration for a human: `12 s`, `2.5 s`."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def decide(
    state: PolicyState, policy: RestartPolicy, at: float, timestamp: float
) -> tuple[Decision, Step]:
    """May the target be restarted at `at`? An Allow moves the state to `restarting`."""
    state = _prune(state, policy, at)
    if state.phase is Phase.RESTARTING:
        return Deny(DenyReason.IN_PROGRESS, "a restart is already in progress"), Step(state)
    if state.phase is Phase.STARTING:
        since = state.phase_since_at if state.phase_since_at is not None else at
        until = since + policy.startup_timeout_seconds
        detail = (
            f"waiting for the restarted server's first good scrape "
            f"(startup grace ends in {seconds_text(max(until - at, 0.0))})"
        )
        return Deny(DenyReason.IN_GRACE, detail, retry_at=until), Step(state)
    if state.phase is Phase.GAVE_UP:
        detail = "gave up restarting: the restart budget was spent; reset it or fix the server"
        return Deny(DenyReason.BUDGET_EXHAUSTED, detail), Step(state)
    used = len(state.restarts_at)
    if used >= policy.restart_budget:
        detail = (
            f"{used} restarts within the last {seconds_text(policy.restart_budget_window_seconds)} "
            f"(restart_budget = {policy.restart_budget}); giving up, reporting only"
        )
        gave_up = replace(state, phase=Phase.GAVE_UP, phase_since_at=at, healthy_since_at=None)
        event = _event(ReportEvent.GAVE_UP, at, timestamp, "budget_exhausted", detail)
        return Deny(DenyReason.BUDGET_EXHAUSTED, detail), Step(gave_up, (event,))
    if state.not_before_at is not None and at < state.not_before_at:
        detail = (
            f"backing off after {state.consecutive} restart(s): next restart allowed in "
            f"{seconds_text(state.not_before_at - at)}"
        )
        return Deny(DenyReason.BACKOFF, detail, retry_at=state.not_before_at), Step(state)
    restarting = replace(
        state,
        phase=Phase.RESTARTING,
        restarts_at=(*state.restarts_at, at),
        consecutive=state.consecutive + 1,
        not_before_at=None,
        phase_since_at=at,
        healthy_since_at=None,
    )
    return Allow(attempt=used + 1), Step(restarting)


def _resolved(state: PolicyState, policy: RestartPolicy, at: float) -> PolicyState:
    """Back to armed after a restart resolved, with the backoff for the next one."""
    return replace(
        state,
        phase=Phase.ARMED,
        not_before_at=at + policy.backoff_after(state.consecutive),
        phase_since_at=at,
        healthy_since_at=None,
    )


def record_restart(
    state: PolicyState,
    policy: RestartPolicy,
    at: float,
    timestamp: float,
    outcome: RestartOutcome,
) -> Step:
    """The restarter finished with `outcome`; only valid while `restarting`."""
    if state.phase is not Phase.RESTARTING:
        raise ValueError(f"record_restart called in phase {state.phase}, expected restarting")
    state = _prune(state, policy, at)
    if outcome.ok:
        return Step(replace(state, phase=Phase.STARTING, phase_since_at=at))
    reason = outcome.failure or FailureReason.REMEDY_ERROR
    event = _event(ReportEvent.RESTART_FAILED, at, timestamp, reason, outcome.detail)
    return Step(_resolved(state, policy, at), (event,))


def record_good_scrape(
    state: PolicyState, policy: RestartPolicy, at: float, timestamp: float, proof: str = ""
) -> Step:
    """A new server answered a scrape (`proof` says what shows it is new, see
    `core.replacement`); ends the startup grace after a restart."""
    state = _prune(state, policy, at)
    if state.phase is not Phase.STARTING:
        return Step(state)
    since = state.phase_since_at if state.phase_since_at is not None else at
    detail = f"the server answered its first scrape {seconds_text(at - since)} after the restart"
    if proof:
        detail += f"; {proof}"
    event = _event(ReportEvent.RESTART_SUCCEEDED, at, timestamp, "came_back", detail)
    return Step(_resolved(state, policy, at), (event,))


def record_tick(
    state: PolicyState,
    policy: RestartPolicy,
    at: float,
    timestamp: float,
    *,
    healthy: bool,
    not_replaced: str | None = None,
) -> Step:
    """One loop tick; `healthy` is true when no engine of the target is stalled or starting.

    `not_replaced` is set while the server answers after a restart but nothing shows it is a
    new one (the sentence why): the startup timeout then fails the restart as `not_replaced`
    instead of `not_recovered`.
    """
    state = _prune(state, policy, at)
    if state.phase is Phase.STARTING:
        since = state.phase_since_at if state.phase_since_at is not None else at
        if at - since < policy.startup_timeout_seconds:
            return Step(state)
        timeout = seconds_text(policy.startup_timeout_seconds)
        if not_replaced is not None:
            reason = FailureReason.NOT_REPLACED
            detail = (
                f"the server answered, but no new server within startup_timeout_seconds = "
                f"{timeout} after the restart: {not_replaced}"
            )
        else:
            reason = FailureReason.NOT_RECOVERED
            detail = f"no good scrape within startup_timeout_seconds = {timeout} after the restart"
        event = _event(ReportEvent.RESTART_FAILED, at, timestamp, reason, detail)
        return Step(_resolved(state, policy, at), (event,))
    if state.phase is Phase.RESTARTING:
        return Step(state)
    if not healthy:
        return Step(
            state if state.healthy_since_at is None else replace(state, healthy_since_at=None)
        )
    healthy_since = at if state.healthy_since_at is None else state.healthy_since_at
    if state.healthy_since_at is None:
        state = replace(state, healthy_since_at=at)
    healthy_for = at - healthy_since
    if healthy_for < policy.reset_after_seconds:
        return Step(state)
    if state.phase is Phase.GAVE_UP:
        detail = f"the target has been healthy for {seconds_text(healthy_for)}; restarts re-armed"
        cleared = replace(
            state, phase=Phase.ARMED, consecutive=0, not_before_at=None, phase_since_at=at
        )
        event = _event(ReportEvent.GAVE_UP_CLEARED, at, timestamp, "healthy", detail)
        return Step(cleared, (event,))
    if state.consecutive == 0 and state.not_before_at is None:
        return Step(state)
    detail = f"the target has been healthy for {seconds_text(healthy_for)}; restart backoff reset"
    event = _event(ReportEvent.BACKOFF_RESET, at, timestamp, "healthy", detail)
    return Step(replace(state, consecutive=0, not_before_at=None), (event,))


def reset(state: PolicyState, at: float, timestamp: float) -> Step:
    """An operator reset: forget the restart history and the backoff, leave gave_up."""
    cleared = replace(state, restarts_at=(), consecutive=0, not_before_at=None)
    if state.phase is Phase.GAVE_UP:
        detail = "an operator reset the restart budget; restarts re-armed"
        cleared = replace(cleared, phase=Phase.ARMED, phase_since_at=at, healthy_since_at=None)
        event = _event(ReportEvent.GAVE_UP_CLEARED, at, timestamp, "operator_reset", detail)
        return Step(cleared, (event,))
    detail = "an operator reset the restart budget and backoff"
    event = _event(ReportEvent.BUDGET_RESET, at, timestamp, "operator_reset", detail)
    return Step(cleared, (event,))


@immutable
class PolicyRecord:
    """A `PolicyState` in wall-clock form, as the state file holds it (Unix seconds)."""

    phase: Phase
    restart_timestamps: tuple[float, ...]
    consecutive: int
    not_before_timestamp: float | None
    phase_since_timestamp: float | None
    healthy_since_timestamp: float | None = None


def to_record(state: PolicyState, at: float, timestamp: float) -> PolicyRecord:
    """The state with its monotonic instants turned into Unix timestamps (now = at/timestamp)."""

    def wall(instant: float) -> float:
        return timestamp - (at - instant)

    return PolicyRecord(
        phase=state.phase,
        restart_timestamps=tuple(wall(r) for r in state.restarts_at),
        consecutive=state.consecutive,
        not_before_timestamp=None if state.not_before_at is None else wall(state.not_before_at),
        phase_since_timestamp=None if state.phase_since_at is None else wall(state.phase_since_at),
        healthy_since_timestamp=None
        if state.healthy_since_at is None
        else wall(state.healthy_since_at),
    )


def from_record(
    record: PolicyRecord,
    policy: RestartPolicy,
    at: float,
    timestamp: float,
    *,
    keep_health: bool = False,
) -> PolicyState:
    """Rebase a persisted record onto this process's monotonic clock (now = at/timestamp).

    `keep_health`: restore the stretch of health too (one not in the future), as a
    `wedgewatch check` probe must; the daemon observes it again.
    """

    def past(stamp: float) -> float:
        return at - max(timestamp - stamp, 0.0)  # a future stamp (clock went back) is "now"

    not_before = None
    if record.not_before_timestamp is not None:
        remaining = record.not_before_timestamp - timestamp
        not_before = at + min(remaining, policy.restart_backoff_max_seconds)
    phase = Phase.STARTING if record.phase is Phase.RESTARTING else record.phase
    since = None if record.phase_since_timestamp is None else past(record.phase_since_timestamp)
    if phase is not Phase.ARMED and since is None:
        since = at
    restored = PolicyState(
        phase=phase,
        restarts_at=tuple(sorted(past(r) for r in record.restart_timestamps)),
        consecutive=max(record.consecutive, 0),
        not_before_at=not_before,
        phase_since_at=since,
        healthy_since_at=None,
    )
    healthy = record.healthy_since_timestamp
    if keep_health and healthy is not None and healthy <= timestamp:
        restored = replace(restored, healthy_since_at=at - (timestamp - healthy))
    return _prune(restored, policy, at)
