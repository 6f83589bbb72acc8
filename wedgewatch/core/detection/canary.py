"""The canary decision: when to send a tiny request through the real queue, and what its
outcome means. Pure: time is passed in, the request itself is `io.canary`'s.

Some hangs are invisible in `/metrics` (vLLM #46811: EngineCore blocks inside a step and
every published value freezes, often at "idle"). A canary is a one-token completion sent
through the same queue real requests take; when it gets no token while the metrics show no
progress, the engine is stalled (`canary_stall`), whatever the gauges say.
"""

# RULES (the contract of this module; tests/core/test_canary.py checks them row by row)
# ===================================================================================
#
# Terms
#   progress mark   the tuple of every engine's progress counters in a verdict, by key
#                   (`vllm.semantics.progress_counters`). Progress is seen when the mark of a
#                   good scrape differs from the previous one (a busy server proves itself).
#   quiet since     max(last progress seen, last canary sent, first verdict noted).
#
#   N1  `note(state, verdict)` on every verdict: a good scrape whose mark differs from the
#       previous mark sets last_progress_at = verdict.at and clears a standing stall
#       (tokens flow again: the engine is not stuck). The first noted verdict starts the
#       quiet clock.
#   S1  `decide` sends only when every one holds, else it says which one failed:
#         the canary is on (interval_seconds > 0);
#         no canary is in flight (one at a time, ever);
#         the engine is not being restarted (the shell says so);
#         the latest verdict is a good scrape with at least one engine, and no engine is
#         SLEEPING or STARTING and the target is not STARTING (never wake or load a model);
#         the target has been quiet for interval_seconds (`quiet since`).
#   S2  `sent(state, at)` marks the canary in flight since `at` and remembers the mark.
#   J1  `judge(state, result, mark)`: a token arrived within timeout_seconds -> `ok`
#       (clears a standing stall). The canary's own tokens are not progress: the next noted
#       mark is a new base, so an idle target gets one canary per interval.
#   J2  no token within timeout_seconds ("timeout") and the mark at judgement equals the
#       mark at sending (no progress while it waited) -> `stall`: the stall stands from the
#       send instant until N1 or J1 clears it. The detector turns it into `canary_stall`.
#   J3  no token within timeout_seconds but the mark moved -> `latency`: recorded (failure
#       metric, log line), never acted upon: a queue is slow, tokens flow.
#   J4  any other failure (refused, http_status, bad_response, no_model, connect_error) ->
#       `error`: recorded, never acted upon (the passive detector judges an unreachable
#       server; a 4xx is a configuration problem, not a wedge).
#   R1  `reset()` after a restart of the server: forget everything (a fresh quiet clock).

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal, get_args

from wedgewatch.core.detection.detect import CanaryStall, DetectionPolicy, TargetVerdict
from wedgewatch.core.detection.states import EngineState
from wedgewatch.core.values import immutable
from wedgewatch.vllm.semantics import progress_counters
from wedgewatch.vllm.signals import EngineKey

__all__ = [
    "CANARY_FAILURE_REASONS",
    "CanaryFailureReason",
    "CanaryPolicy",
    "CanaryResult",
    "CanaryStall",
    "CanaryState",
    "Decision",
    "Judgement",
    "Mark",
    "decide",
    "judge",
    "mark_of",
    "note",
    "reset",
    "sent",
]

#: Why a canary got no token: a closed set.
CanaryFailureReason = Literal[
    "timeout", "refused", "connect_error", "http_status", "bad_response", "no_model"
]
CANARY_FAILURE_REASONS: tuple[CanaryFailureReason, ...] = get_args(CanaryFailureReason)

#: Every engine's progress counters, by key, sorted.
Mark = tuple[tuple[EngineKey, tuple[float, ...]], ...]


@immutable
class CanaryPolicy:
    """How often the canary may be sent (`interval_seconds` 0 = off) and how long it waits."""

    interval_seconds: float = 0.0
    timeout_seconds: float = DetectionPolicy().canary_timeout_seconds  # the detector's K1 threshold

    def __post_init__(self) -> None:
        """Reject negative, NaN or infinite seconds, and a zero timeout."""
        for name in ("interval_seconds", "timeout_seconds"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"CanaryPolicy.{name} must be finite and >= 0, got {value!r}")
        if self.timeout_seconds == 0:
            raise ValueError("CanaryPolicy.timeout_seconds must be > 0")

    @property
    def enabled(self) -> bool:
        """The canary is on."""
        return self.interval_seconds > 0


@immutable
class CanaryResult:
    """What one canary request did (from `io.canary`); times are monotonic seconds.

    `first_token_seconds` is None when no token arrived; `reason` is None on success.
    """

    sent_at: float
    first_token_seconds: float | None
    total_seconds: float
    reason: CanaryFailureReason | None
    detail: str = ""

    def __post_init__(self) -> None:
        """Reject a reason outside the closed set (a bug in the caller, not in the server)."""
        if self.reason is not None and self.reason not in CANARY_FAILURE_REASONS:
            raise ValueError(f"CanaryResult.reason must be one of {CANARY_FAILURE_REASONS}")


@immutable
class CanaryState:
    """Everything the canary core keeps about one target."""

    quiet_since: float | None = None  # N1: first verdict, last progress, last send
    mark: Mark | None = None  # the latest good scrape's mark
    in_flight_since: float | None = None
    mark_at_send: Mark | None = None
    stall: CanaryStall | None = None
    last_success_at: float | None = None


@immutable
class Decision:
    """Send now or not, and why (one human sentence)."""

    send: bool
    reason: str


Verdict = Literal["ok", "stall", "latency", "error"]


@immutable
class Judgement:
    """What a finished canary means (J1-J4) and one human sentence."""

    verdict: Verdict
    reason: str


def mark_of(verdict: TargetVerdict) -> Mark | None:
    """The progress mark of a good scrape's verdict, or None (failed scrape, no reading)."""
    if verdict.failure is not None:
        return None
    readings = [(e.key, progress_counters(e.reading)) for e in verdict.engines if e.reading]
    return tuple(sorted(readings)) if readings else None


def note(state: CanaryState, verdict: TargetVerdict) -> CanaryState:
    """Rule N1: fold one verdict into the canary state."""
    at = verdict.at
    if state.quiet_since is None:
        state = replace(state, quiet_since=at)
    mark = mark_of(verdict)
    if mark is None:
        return state
    if state.mark is not None and mark != state.mark:
        return replace(state, mark=mark, quiet_since=max(at, state.quiet_since or at), stall=None)
    return replace(state, mark=mark)


def decide(
    state: CanaryState,
    policy: CanaryPolicy,
    verdict: TargetVerdict | None,
    at: float,
    *,
    restarting: bool,
) -> Decision:
    """Rule S1: whether to send a canary now."""
    if not policy.enabled:
        return Decision(False, "the canary is off (canary_interval_seconds = 0)")
    if state.in_flight_since is not None:
        return Decision(False, "a canary is already in flight")
    if restarting:
        return Decision(False, "the server is being restarted")
    if verdict is None or verdict.failure is not None or not verdict.engines:
        return Decision(False, "no good scrape with an engine to judge by")
    if verdict.state is EngineState.STARTING or any(
        e.state in (EngineState.SLEEPING, EngineState.STARTING) for e in verdict.engines
    ):
        return Decision(False, "an engine is sleeping or starting")
    quiet_since = state.quiet_since if state.quiet_since is not None else at
    quiet = at - quiet_since
    if quiet < policy.interval_seconds:
        return Decision(
            False,
            f"quiet for {quiet:.1f}s only (canary_interval_seconds {policy.interval_seconds:g})",
        )
    return Decision(True, f"no progress seen and no canary sent for {quiet:.1f}s")


def sent(state: CanaryState, at: float) -> CanaryState:
    """Rule S2: a canary is in flight since `at`."""
    return replace(state, in_flight_since=at, quiet_since=at, mark_at_send=state.mark)


def judge(
    state: CanaryState, policy: CanaryPolicy, result: CanaryResult
) -> tuple[CanaryState, Judgement]:
    """Rules J1-J4: fold a finished canary into the state and say what it means."""
    done = replace(state, in_flight_since=None, mark_at_send=None)
    ttft = result.first_token_seconds
    if ttft is not None and ttft <= policy.timeout_seconds:
        reason = f"first token after {ttft:.3f}s"
        ok = replace(done, stall=None, mark=None, last_success_at=result.sent_at + ttft)
        return ok, Judgement("ok", reason)
    if result.reason == "timeout" or ttft is not None:
        waited = f"no token within canary_timeout_seconds ({policy.timeout_seconds:g}s)"
        if state.mark_at_send is not None and state.mark == state.mark_at_send:
            stall = state.stall or CanaryStall(
                result.sent_at, f"{waited} while every progress counter stayed flat"
            )
            return replace(done, stall=stall), Judgement(
                "stall", f"{waited} while every progress counter stayed flat"
            )
        return done, Judgement("latency", f"{waited}, but progress counters moved: slow, not stuck")
    return done, Judgement("error", f"{result.reason}: {result.detail}")


def reset() -> CanaryState:
    """Rule R1: a fresh canary state (after a restart of the server)."""
    return CanaryState()
