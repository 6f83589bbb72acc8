"""The liveness-probe verdict under the restart policy: one rule for `/probe` and `check`.

In Kubernetes the kubelet restarts vLLM when its liveness probe fails; wedgewatch only
answers the probe (`/probe` of the sidecar, or `wedgewatch check --state-file` as an exec
probe). For the restart budget, backoff and `gave_up` to hold there too, the probe fails
only while the restart policy would allow a restart, and each restart the probe caused is
counted against the budget once it is proven. Pure: time is passed in, results are data.

# RULES (tests/core/test_probe_policy.py checks them)
#
# Verdict (`probe_verdict`)
#   P0  Observe mode (`remedy = "none"`): the probe always passes, decision `observe`, for
#       every state: nothing is to be restarted, so no answer may ask for a restart.
#   P1  A target that is not wedged or unreachable passes (decision `healthy`).
#   P1a The abort cure is being tried (`core.restart.ladder`: the abort rung is open, its
#       call is queued, running or proving itself): a wedged target passes (decision
#       `abort`), so the kubelet restarts the server only after the abort failed or was not
#       applicable.
#   P2  probe_respects_budget off: a wedged or unreachable target fails (decision
#       `restart`), whatever the budget says (the behaviour before the budget applied).
#   P3  Otherwise the restart policy is asked (`decide`) without committing to a restart:
#       Allow -> fail (decision `restart`); Deny -> pass, the decision being the deny
#       reason (`budget_exhausted` reads `gave_up`, `backoff`, `in_grace`, `in_progress`),
#       with the policy's sentence why. A spent budget moves the policy to gave_up (one
#       `gave_up` event), exactly as when a remedy asks.
#
# Proof of a probe-driven restart (`served_failure`, `observe_server`)
#   R1  A failing answer that was actually served (the HTTP 503 went out, the exec probe
#       exited non-zero) is remembered with the identity of the server it judged: its
#       `process_start_time_seconds` and each engine's sum of progress counters.
#   R2  A restart is counted only when a failing answer was served and afterwards a good
#       scrape shows a *different* server: another process start time (both known), or an
#       engine present in both whose progress counters went backwards. Counters are
#       monotonic within one server, so either is proof; nothing else is. It counts at the
#       instant of the last failing answer, and arms the backoff as a restart that came
#       back does (event `restart_succeeded`, reason `probe_restart`).
#   R3  A good scrape of the *same* server that is not failing forgets the served
#       failures: the wedge cleared by itself, and a later restart (an operator's, a
#       deploy) was not caused by the probe.
#   R4  While the policy's own restart is in flight (phase restarting or starting: a
#       remedy other than `none` restarted the server) a new server is that restart's, and
#       is not counted again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from wedgewatch.core.detection.detect import TargetState
from wedgewatch.core.detection.states import ACTED_ON
from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.restart.replacement import engine_counters
from wedgewatch.core.restart.restart_policy import (
    Allow,
    DenyReason,
    Phase,
    PolicyEvent,
    PolicyState,
    RestartPolicy,
    Step,
    budget_remaining,
    decide,
    seconds_text,
)
from wedgewatch.core.values import immutable

#: Target states in which a liveness probe would ask for a restart: the acted-on states.
FAILING_STATES = ACTED_ON

Decision = Literal[
    "healthy", "observe", "abort", "restart", "gave_up", "backoff", "in_grace", "in_progress"
]
_DENIED: Mapping[DenyReason, Decision] = {
    DenyReason.BUDGET_EXHAUSTED: "gave_up",
    DenyReason.BACKOFF: "backoff",
    DenyReason.IN_GRACE: "in_grace",
    DenyReason.IN_PROGRESS: "in_progress",
}


@immutable
class ServerMark:
    """Who a server is: its process start time and each engine's summed progress counters.

    Read from the detector's memory (`of`), so a probe that fails while scrapes fail still
    names the server it judged, with non-finite counters already replaced by the last finite
    ones; persisted (`memory_to_record`, `core.restart_codec`) in the state files of the
    daemon and of `wedgewatch check --state-file`, hence one finite sum per engine.
    `core.replacement.ServerIdentity` describes the same server for rule N1 (did our own
    restart replace it?) from a good scrape, per counter and with the port's listener; both
    take their counters from `core.replacement.engine_counters`.
    """

    process_start_time_seconds: float | None
    progress: Mapping[str, float]  # "model_name|engine" -> sum of the engine's counters

    @classmethod
    def of(cls, detector: TargetState) -> ServerMark:
        """The mark of the server the detector last read (readings survive failed scrapes)."""
        counters = engine_counters(m.reading for m in detector.engines)
        return cls(
            process_start_time_seconds=detector.process_start_time_seconds,
            progress={
                f"{key.model_name}|{key.engine}": math.fsum(values)
                for key, values in counters.items()
            },
        )

    def replaced_by(self, other: ServerMark) -> str | None:
        """Rule R2: why `other` is a different server than this one, or None if unproven."""
        before, now = self.process_start_time_seconds, other.process_start_time_seconds
        if before is not None and now is not None and before != now:
            return f"process start time changed from {before:.3f} to {now:.3f}"
        for engine, counters in sorted(self.progress.items()):
            later = other.progress.get(engine)
            if later is not None and later < counters:
                return f"progress counters of engine {engine} went backwards"
        return None


@immutable
class ProbeMemory:
    """Failing answers served since the server last looked healthy (monotonic instants)."""

    first_failed_at: float | None = None
    last_failed_at: float | None = None
    failures: int = 0
    server: ServerMark | None = None  # the server the failures judged

    @property
    def pending(self) -> bool:
        """Whether a served failure may yet be proven to have caused a restart."""
        return self.failures > 0 and self.server is not None


@immutable
class ProbeVerdict:
    """What the probe answers: pass or fail, which decision, and why."""

    ok: bool
    decision: Decision
    detail: str
    gave_up: bool
    restarts: int  # restarts in the budget window
    budget_remaining: int

    def to_json(self) -> dict[str, Any]:
        """The `restart_policy` object of the probe's body."""
        return {
            "decision": self.decision,
            "detail": self.detail,
            "restarts_in_window": self.restarts,
            "restart_budget_remaining": self.budget_remaining,
        }


def probe_verdict(
    policy_state: PolicyState,
    policy: RestartPolicy,
    target_state: str,
    at: float,
    timestamp: float,
    *,
    respects_budget: bool = True,
    observe: bool = False,
    hold: str | None = None,
) -> tuple[ProbeVerdict, Step]:
    """Rules P0-P3: the probe's answer for a target in `target_state`, and the policy step.

    The step is the policy state to keep: unchanged, or moved to gave_up with its event. An
    Allow is never committed here: a restart counts only once it is proven (rule R2).
    `observe`: observe mode (`remedy = "none"`, rule P0). `hold`: why the abort cure holds
    the restart back (rule P1a), None when it does not.
    """
    if observe:  # P0
        detail = (
            'remedy = "none" (observe mode): the probe never asks for a restart'
            if target_state in FAILING_STATES
            else ""
        )
        return _verdict(True, "observe", detail, state=policy_state, policy=policy, at=at), Step(
            policy_state
        )
    if target_state not in FAILING_STATES:
        return _verdict(True, "healthy", "", state=policy_state, policy=policy, at=at), Step(
            policy_state
        )
    if hold is not None:  # P1a
        return _verdict(True, "abort", hold, state=policy_state, policy=policy, at=at), Step(
            policy_state
        )
    if not respects_budget:
        detail = "probe_respects_budget is off: every wedge fails the probe"
        return _verdict(False, "restart", detail, state=policy_state, policy=policy, at=at), Step(
            policy_state
        )
    decision, step = decide(policy_state, policy, at, timestamp)
    if isinstance(decision, Allow):
        used = len(step.state.restarts_at) - 1
        remaining = max(policy.restart_budget - used, 0)
        detail = (
            f"a restart is allowed ({remaining} of restart_budget = {policy.restart_budget} "
            f"left within {seconds_text(policy.restart_budget_window_seconds)})"
        )
        return _verdict(False, "restart", detail, state=policy_state, policy=policy, at=at), Step(
            policy_state
        )
    detail = decision.detail
    if decision.reason is DenyReason.BUDGET_EXHAUSTED and "restart_budget =" not in detail:
        window = policy.restart_budget_window_seconds
        used = sum(1 for r in step.state.restarts_at if r > at - window)
        detail += (
            f" (restart_budget = {policy.restart_budget} within {seconds_text(window)}; "
            f"{used} in the window now)"
        )
    verdict = _verdict(
        True, _DENIED[decision.reason], detail, state=step.state, policy=policy, at=at
    )
    return verdict, step


def _verdict(
    ok: bool,
    decision: Decision,
    detail: str,
    *,
    state: PolicyState,
    policy: RestartPolicy,
    at: float,
) -> ProbeVerdict:
    remaining = budget_remaining(state, policy, at)
    return ProbeVerdict(
        ok=ok,
        decision=decision,
        detail=detail,
        gave_up=state.phase is Phase.GAVE_UP,
        restarts=sum(1 for r in state.restarts_at if r > at - policy.restart_budget_window_seconds),
        budget_remaining=remaining,
    )


def served_failure(memory: ProbeMemory, mark: ServerMark, at: float) -> ProbeMemory:
    """Rule R1: a failing answer went out at `at` about the server `mark` (the last read)."""
    if memory.server is not None and memory.server.replaced_by(mark) is None:
        # The same server as the failures already remembered: keep their identity, which
        # was taken before the failure and cannot have moved since.
        return replace(memory, last_failed_at=at, failures=memory.failures + 1)
    return ProbeMemory(first_failed_at=at, last_failed_at=at, failures=1, server=mark)


def observe_server(
    memory: ProbeMemory,
    policy_state: PolicyState,
    policy: RestartPolicy,
    now: ServerMark,
    *,
    scraped: bool,
    target_state: str,
    at: float,
    timestamp: float,
) -> tuple[ProbeMemory, Step]:
    """Rules R2-R4 after one scrape: count a proven probe-driven restart, or forget failures.

    `now` is the server the detector has read last (`ServerMark.of`); `scraped` says this
    scrape was good (only a good scrape shows who the server is now).
    """
    if not scraped or not memory.pending or memory.server is None:
        return memory, Step(policy_state)
    why = memory.server.replaced_by(now)
    if why is None:
        if target_state in FAILING_STATES:
            return memory, Step(policy_state)
        return ProbeMemory(), Step(policy_state)  # rule R3
    if policy_state.phase in (Phase.RESTARTING, Phase.STARTING):
        return ProbeMemory(), Step(policy_state)  # rule R4
    restarted_at = memory.last_failed_at if memory.last_failed_at is not None else at
    return ProbeMemory(), count_probe_restart(
        policy_state,
        policy,
        at,
        timestamp,
        restarted_at=restarted_at,
        failures=memory.failures,
        why=why,
    )


def count_probe_restart(
    state: PolicyState,
    policy: RestartPolicy,
    at: float,
    timestamp: float,
    *,
    restarted_at: float,
    failures: int,
    why: str,
) -> Step:
    """Count a proven restart at `restarted_at` and arm the backoff from `at` (rule R2)."""
    attempts = tuple(sorted((*state.restarts_at, min(restarted_at, at))))
    consecutive = state.consecutive + 1
    phase = Phase.GAVE_UP if state.phase is Phase.GAVE_UP else Phase.ARMED
    counted = replace(
        state,
        phase=phase,
        restarts_at=attempts,
        consecutive=consecutive,
        not_before_at=at + policy.backoff_after(consecutive),
        phase_since_at=at if phase is not state.phase else state.phase_since_at,
        healthy_since_at=None,
    )
    detail = (
        f"the server was restarted after {failures} failed liveness probe"
        f"{'s' if failures != 1 else ''} ({why}); counted against the restart budget"
    )
    event = PolicyEvent(
        kind=ReportEvent.RESTART_SUCCEEDED,
        at=at,
        timestamp=timestamp,
        reason="probe_restart",
        detail=detail,
    )
    return Step(counted, (event,))


# -- persistence (Unix timestamps, as the state files hold them; `core.restart_codec`) ------


@immutable
class ProbeRecord:
    """A `ProbeMemory` with a pending failure, in wall-clock form (Unix seconds)."""

    first_failed_timestamp: float | None
    last_failed_timestamp: float | None
    failures: int
    process_start_time_seconds: float | None
    progress: Mapping[str, float]


def memory_to_record(memory: ProbeMemory, at: float, timestamp: float) -> ProbeRecord | None:
    """The memory with monotonic instants as Unix timestamps; None when nothing is pending."""
    if not memory.pending or memory.server is None:
        return None

    def wall(instant: float | None) -> float | None:
        return None if instant is None else timestamp - (at - instant)

    return ProbeRecord(
        first_failed_timestamp=wall(memory.first_failed_at),
        last_failed_timestamp=wall(memory.last_failed_at),
        failures=memory.failures,
        process_start_time_seconds=memory.server.process_start_time_seconds,
        progress=dict(sorted(memory.server.progress.items())),
    )


def memory_from_record(record: ProbeRecord | None, at: float, timestamp: float) -> ProbeMemory:
    """Rebase a stored memory onto this process's monotonic clock (a future stamp is now)."""
    if record is None or record.failures < 1:
        return ProbeMemory()

    def past(value: float | None) -> float | None:
        return None if value is None else at - max(timestamp - value, 0.0)

    return ProbeMemory(
        first_failed_at=past(record.first_failed_timestamp),
        last_failed_at=past(record.last_failed_timestamp),
        failures=record.failures,
        server=ServerMark(
            process_start_time_seconds=record.process_start_time_seconds,
            progress=dict(record.progress),
        ),
    )
