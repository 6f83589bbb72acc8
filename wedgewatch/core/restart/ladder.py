"""The cure ladder: which cure a wedge gets first, and whether the abort cure worked. Pure.

A *scheduler* wedge (the EngineCore loop runs, nothing is scheduled) can be emptied without
stopping the process: vLLM aborts every in-flight request on `POST /abort_requests`. A
*frozen loop* (no step at all, a stopped or collective-hung worker) is out of an abort's
reach. With `abort_first` the ladder tries the abort first where it can work, proves it by
progress, and escalates to the configured restart remedy when it does not.

# RULES (tests/core/test_ladder.py checks them)
#
#   L1  The abort rung opens at the wedged verdict (the episode's rule R1) only with
#       `abort_first`, never in observe mode (`remedy = "none"`: it acts on nothing).
#   L2  Families: `deferred_stall`, `admission_stall`, `deferred_only_stall` are scheduler
#       wedges (the abort applies) unless the triage read a frozen loop: `process_stopped`,
#       `worker_dead`, `collective_hang`, `engine_dead`, or `api_hang` (an HTTP call cannot
#       reach an engine whose API loop hangs). `output_stall` (counters move, no output: a
#       preemption livelock) applies only when the triage saw the engine loop run
#       (`scheduler_wedge`, `busy`). `progress_stall`, `canary_stall`, `unreachable`: never
#       (straight to the restart rung). The family part is judged at the wedged verdict,
#       the triage part when the cure is due (the bundle, with its triage, is complete by
#       then: evidence first).
#   L3  At most one abort per episode.
#   L4  Its own budget: no abort while the target's previous abort is less than
#       `reset_after_seconds` old (the restart policy's stretch of health, 900 s by
#       default). A server that wedges again right after an abort is escalated, not
#       aborted again and again.
#   L5  Proof: once the abort call returned, recovery is proven by a scrape that reads every
#       engine calm and either some engine `ok` (its counters moved) or the canary sent
#       after the abort completed, before `sent_at + proof_seconds`. Serving again is dated
#       by the earlier of the canary's completion and that scrape.
#   L6  Past `sent_at + proof_seconds` without proof, or an abort call that failed (no
#       endpoint, an HTTP error or redirect, a server not proven to be the watched vLLM),
#       the abort did not cure: the ladder moves to the restart rung at once.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from wedgewatch.core.detection.states import CALM, EngineState, Family
from wedgewatch.core.values import immutable

#: Families whose wedge is a scheduler state an abort can empty (L2).
SCHEDULER_FAMILIES: frozenset[str] = frozenset(
    {Family.DEFERRED_STALL, Family.ADMISSION_STALL, Family.DEFERRED_ONLY_STALL}
)
#: Triage kinds that show a loop an abort cannot reach (L2).
FROZEN_TRIAGE: frozenset[str] = frozenset(
    {"process_stopped", "worker_dead", "collective_hang", "engine_dead", "api_hang"}
)
#: Triage kinds that show the engine loop running (L2, for `output_stall`).
RUNNING_TRIAGE: frozenset[str] = frozenset({"scheduler_wedge", "busy"})
#: How long an abort has to prove itself (L5, L6).
PROOF_SECONDS = 30.0


class Rung(StrEnum):
    """A rung of the ladder, and the `cure` label of `wedgewatch_recoveries_total`."""

    ABORT = "abort"
    RESTART = "restart"


class Outcome(StrEnum):
    """How a cure ended: the `outcome` label of `wedgewatch_recoveries_total`.

    `recovered`: serving again, proven. `failed`: the cure could not be applied or its
    server never came back. `escalated`: the abort was applied but progress did not return,
    so the restart rung followed.
    """

    RECOVERED = "recovered"
    FAILED = "failed"
    ESCALATED = "escalated"


def family_may_abort(family: str) -> bool:
    """L2, the family part: could an abort cure a wedge of this family at all?"""
    return family in SCHEDULER_FAMILIES or family == Family.OUTPUT_STALL


def abort_refusal(family: str, triage_kind: str | None) -> str | None:
    """Rule L2: None when the abort cure may work on this wedge, else why it cannot."""
    if family in SCHEDULER_FAMILIES:
        if triage_kind in FROZEN_TRIAGE:
            return f"the triage reads {triage_kind}: a frozen loop that an abort cannot reach"
        return None
    if family == Family.OUTPUT_STALL:
        if triage_kind in RUNNING_TRIAGE:
            return None
        return (
            f"output_stall with triage {triage_kind or 'none'}: nothing shows the engine loop "
            "running (an abort needs scheduler_wedge or busy)"
        )
    return f"{family} is a frozen loop or a server gone: an abort cannot reach it"


@immutable
class AbortProof:
    """An abort sent and being proven (monotonic instants)."""

    sent_at: float
    deadline_at: float
    done: bool = False  # the abort call (and its canary) returned
    aborted: int | None = None  # vLLM's count of aborted requests, when it said
    canary_ok_at: float | None = None  # when the canary sent after the abort completed


@immutable
class LadderState:
    """One target's ladder: the open rung of the current episode and the abort's history."""

    rung: Rung | None = None  # None: no wedge is being cured
    wedged_at: float | None = None  # the wedged verdict the cure answers
    tried: bool = False  # L3: an abort was sent in this episode
    abort: AbortProof | None = None  # L5: an abort sent and not yet judged
    last_abort_at: float | None = None  # L4


def opened(
    state: LadderState,
    family: str,
    at: float,
    *,
    abort_first: bool,
    observe: bool,
    reset_after_seconds: float,
) -> tuple[LadderState, str | None]:
    """L1, L2 (family), L4 at the wedged verdict: the rung to start from, and why the abort
    rung was passed over (None when it is open, or when `abort_first` is off)."""
    why: str | None = None
    if not abort_first or observe:
        rung = Rung.RESTART
    elif not family_may_abort(family):
        rung, why = Rung.RESTART, abort_refusal(family, None)
    elif state.last_abort_at is not None and at - state.last_abort_at < reset_after_seconds:
        rung = Rung.RESTART
        why = (
            f"the last abort was {at - state.last_abort_at:.0f} s ago (less than "
            f"{reset_after_seconds:g} s of health since): the wedge came back, so it escalates"
        )
    else:
        rung = Rung.ABORT
    return replace(state, rung=rung, wedged_at=at, tried=False, abort=None), why


def ended(state: LadderState) -> LadderState:
    """The episode is over: forget its rung (the abort's date stays for L4)."""
    if state.rung is None and state.abort is None and not state.tried:
        return state
    return LadderState(last_abort_at=state.last_abort_at)


def sent(state: LadderState, at: float, proof_seconds: float) -> LadderState:
    """An abort goes out at `at` (L3, L4, L5)."""
    proof = AbortProof(sent_at=at, deadline_at=at + proof_seconds)
    return replace(state, tried=True, abort=proof, last_abort_at=at)


def escalated(state: LadderState) -> LadderState:
    """L6: the abort did not cure; the restart rung is open."""
    return replace(state, rung=Rung.RESTART, abort=None)


def proven_at(proof: AbortProof, states: tuple[EngineState, ...], at: float) -> float | None:
    """Rule L5: the instant serving was proven again by a scrape at `at`, or None."""
    if not proof.done or not states or any(s not in CALM for s in states):
        return None
    if any(s is EngineState.OK for s in states):
        return at if proof.canary_ok_at is None else min(proof.canary_ok_at, at)
    return proof.canary_ok_at


def holds_probe(state: LadderState) -> str | None:
    """Why the abort rung holds a restart back (for `/probe`, rule P1a), or None."""
    if state.rung is not Rung.ABORT:
        return None
    if state.abort is None:
        return "the abort cure runs first, once the evidence is captured (abort_first)"
    return "an abort was sent; waiting for progress to prove it (abort_first)"
