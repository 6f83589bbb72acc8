"""The remedy subsystem's one face: a fact in, the state and one decision out. Pure.

The episode core (`core.episode`) hands every fact about curing a target to `step`, once per
input, and reads back the new `RemedyState`, the events to report and what to do. Behind
this face: the restart policy (`restart_policy`: budget, back-off, start-up grace,
gave_up), the liveness probe (`probe_step`, `probe_policy`: what `/probe` answers, proof of a
kubelet's restart) and the cure ladder (`ladder`: the abort cure first where it can work).
The episode never calls those modules itself; it only reads the state it holds.

The facts, and what each does:

- `Scrape` (one per judged scrape): the ladder's episode bookkeeping (a wedged verdict opens
  a rung, L1; a closed episode forgets it), a new server's first good scrape
  (`record_good_scrape`), the abort's proof (L5, L6), then the probe step (`probe_step`:
  a kubelet restart proven, the policy's clocks, what `/probe` answers now, held back while
  the abort rung is open, P1a).
- `CureDue`: the worker reached the queued cure. The abort rung with an applicable wedge
  (L2) and no abort yet in the episode (L3): `RunAbort`. Otherwise the restart rung:
  `restart_policy.decide` (an `Allow` or a `Deny`), or nothing when no restarter exists
  (`remedy = "probe"`: the kubelet restarts through `/probe`).
- `AbortFinished`: the abort call returned; a failure escalates at once (L6).
- `RestartFinished`: `record_restart`.
- `ProbeServed`: a failing `/probe` answer went out (rule R1 of `probe_policy`).
- `OperatorReset`: `restart_policy.reset`.
"""

from __future__ import annotations

from dataclasses import field, replace

from wedgewatch.core.detection.states import EngineState
from wedgewatch.core.restart import ladder, probe_policy, probe_step, restart_policy
from wedgewatch.core.restart.ladder import LadderState, Outcome, Rung
from wedgewatch.core.restart.probe_policy import ProbeMemory, ProbeVerdict, ServerMark
from wedgewatch.core.restart.probe_step import ProbeScrape
from wedgewatch.core.restart.restart_policy import (
    Allow,
    Deny,
    DenyReason,
    FailureReason,
    Phase,
    PolicyEvent,
    PolicyState,
    RestartOutcome,
    RestartPolicy,
)
from wedgewatch.core.values import immutable

#: What the episode reads of the subsystem's words (its state's phase, a decision's reason).
__all__ = [
    "AbortFinished",
    "Allow",
    "CureDue",
    "CureNote",
    "Deny",
    "DenyReason",
    "FailureReason",
    "OperatorReset",
    "Phase",
    "PolicyEvent",
    "ProbeScrape",
    "ProbeServed",
    "RemedyConfig",
    "RemedyState",
    "RemedyStep",
    "RestartFinished",
    "RunAbort",
    "Scrape",
    "step",
]


@immutable
class RemedyConfig:
    """What the remedy subsystem obeys for one target."""

    policy: RestartPolicy
    remedy: str
    can_restart: bool  # a restarter exists (false for "none" and "probe")
    respects_budget: bool = True
    abort_first: bool = False
    abort_proof_seconds: float = ladder.PROOF_SECONDS

    @property
    def observe(self) -> bool:
        """Observe mode (`remedy = "none"`): nothing is ever done to the server."""
        return self.remedy == "none"


@immutable
class RemedyState:
    """Everything the remedy subsystem keeps about one target (monotonic instants)."""

    policy: PolicyState = field(default_factory=PolicyState)
    probe: ProbeMemory = field(default_factory=ProbeMemory)
    ladder: LadderState = field(default_factory=LadderState)


# -- facts ------------------------------------------------------------------------------


@immutable
class Scrape:
    """One judged scrape, as far as curing is concerned."""

    scrape: ProbeScrape
    engines: tuple[EngineState, ...]  # every engine's state in the verdict
    episode_open: bool  # an episode is open after this scrape's episode rules
    wedged_family: str | None = None  # the episode's first wedged verdict came now (R1)
    new_server: str | None = None  # in the start-up grace: the proof that a new server answers


@immutable
class CureDue:
    """The worker reached the queued cure of a wedge of `family`, read by `triage_kind`."""

    family: str
    triage_kind: str | None


@immutable
class AbortFinished:
    """The abort call returned: `ok` with vLLM's count, or why it failed."""

    ok: bool
    detail: str
    aborted: int | None = None
    canary_ok_at: float | None = None  # the canary sent after the abort completed then


@immutable
class RestartFinished:
    """The restarter finished a restart with this outcome."""

    outcome: RestartOutcome


@immutable
class ProbeServed:
    """A failing `/probe` answer about the server `mark` went out."""

    mark: ServerMark


@immutable
class OperatorReset:
    """An operator reset the restart budget."""


Fact = Scrape | CureDue | AbortFinished | RestartFinished | ProbeServed | OperatorReset


# -- decisions --------------------------------------------------------------------------


@immutable
class RunAbort:
    """Send the abort now (L2-L4 hold); prove it within `proof_seconds`."""

    proof_seconds: float


@immutable
class CureNote:
    """A fact of the ladder for the episode to report: an abort asked, passed over, or
    judged (`outcome`), or a restart rung that opened without an abort."""

    rung: Rung
    outcome: Outcome | None  # None: the abort is asked now, or the rung passed over
    detail: str
    seconds: float | None = None  # from the wedged verdict to serving again (recovered)
    aborted: int | None = None


Action = RunAbort | Allow | Deny


@immutable
class RemedyStep:
    """The state after a fact, the events it caused, and what to do."""

    state: RemedyState
    events: tuple[PolicyEvent, ...] = ()
    notes: tuple[CureNote, ...] = ()
    action: Action | None = None
    probe: ProbeVerdict | None = None  # what `/probe` answers now (Scrape with a mark only)


def step(
    state: RemedyState, fact: Fact, config: RemedyConfig, at: float, timestamp: float
) -> RemedyStep:
    """Fold one fact into the target's remedy state; see the module docstring."""
    if isinstance(fact, Scrape):
        return _scrape(state, fact, config, at, timestamp)
    if isinstance(fact, CureDue):
        return _cure_due(state, fact, config, at, timestamp)
    if isinstance(fact, AbortFinished):
        return _abort_finished(state, fact)
    if isinstance(fact, RestartFinished):
        result = restart_policy.record_restart(
            state.policy, config.policy, at, timestamp, fact.outcome
        )
        return RemedyStep(replace(state, policy=result.state), result.events)
    if isinstance(fact, ProbeServed):
        memory = probe_policy.served_failure(state.probe, fact.mark, at)
        return RemedyStep(replace(state, probe=memory))
    result = restart_policy.reset(state.policy, at, timestamp)
    return RemedyStep(replace(state, policy=result.state), result.events)


def _scrape(
    state: RemedyState, fact: Scrape, config: RemedyConfig, at: float, timestamp: float
) -> RemedyStep:
    events: list[PolicyEvent] = []
    notes: list[CureNote] = []
    lad = state.ladder
    if not fact.episode_open:
        lad = ladder.ended(lad)
    elif fact.wedged_family is not None:  # L1, L2 (family), L4
        lad, why = ladder.opened(
            lad,
            fact.wedged_family,
            at,
            abort_first=config.abort_first,
            observe=config.observe,
            reset_after_seconds=config.policy.reset_after_seconds,
        )
        if why is not None:
            notes.append(CureNote(Rung.RESTART, None, f"no abort: {why}"))
    policy = state.policy
    if fact.new_server is not None:
        result = restart_policy.record_good_scrape(
            policy, config.policy, at, timestamp, fact.new_server
        )
        policy = result.state
        events += result.events
    proof = lad.abort
    if proof is not None:  # L5, L6
        serving_at = ladder.proven_at(proof, fact.engines, at)
        if serving_at is not None:
            seconds = None if lad.wedged_at is None else max(serving_at - lad.wedged_at, 0.0)
            how = "the canary completed" if serving_at == proof.canary_ok_at else "counters moved"
            detail = (
                f"serving again {serving_at - proof.sent_at:.1f} s after the abort ({how}; "
                "every engine calm)"
            )
            notes.append(CureNote(Rung.ABORT, Outcome.RECOVERED, detail, seconds, proof.aborted))
            lad = replace(lad, abort=None, rung=None)
        elif at >= proof.deadline_at:
            detail = (
                f"no proof of progress within {config.abort_proof_seconds:g} s of the abort "
                "(engines not calm, or idle without a completed canary): escalating"
            )
            notes.append(CureNote(Rung.ABORT, Outcome.ESCALATED, detail, None, proof.aborted))
            lad = ladder.escalated(lad)
    hold = ladder.holds_probe(lad)
    probe_config = probe_step.ProbeConfig(
        config.policy, config.respects_budget, observe=config.observe, hold=hold
    )
    done = probe_step.step(
        probe_step.ProbeState(policy, state.probe), fact.scrape, at, timestamp, probe_config
    )
    events += done.events
    new = RemedyState(done.state.policy, done.state.memory, lad)
    return RemedyStep(new, tuple(events), tuple(notes), None, done.verdict)


def _cure_due(
    state: RemedyState, fact: CureDue, config: RemedyConfig, at: float, timestamp: float
) -> RemedyStep:
    lad = state.ladder
    notes: list[CureNote] = []
    if lad.rung is Rung.ABORT and not lad.tried and not config.observe:
        refusal = ladder.abort_refusal(fact.family, fact.triage_kind)
        if refusal is None:  # L2, L3
            lad = ladder.sent(lad, at, config.abort_proof_seconds)
            note = CureNote(Rung.ABORT, None, "every in-flight request is aborted")
            action = RunAbort(config.abort_proof_seconds)
            return RemedyStep(replace(state, ladder=lad), (), (note,), action)
        notes.append(CureNote(Rung.RESTART, None, f"no abort: {refusal}"))
        lad = ladder.escalated(lad)
    elif lad.rung is Rung.ABORT:
        # An abort already ran in this episode (L3) and is being proven: nothing new now;
        # its proof or its deadline decides (L5, L6).
        return RemedyStep(state)
    state = replace(state, ladder=lad)
    if not config.can_restart:
        return RemedyStep(state, (), tuple(notes))
    decision, result = restart_policy.decide(state.policy, config.policy, at, timestamp)
    return RemedyStep(replace(state, policy=result.state), result.events, tuple(notes), decision)


def _abort_finished(state: RemedyState, fact: AbortFinished) -> RemedyStep:
    lad = state.ladder
    proof = lad.abort
    if proof is None:  # already judged (its deadline passed): nothing to decide
        return RemedyStep(state)
    if not fact.ok:  # L6
        note = CureNote(Rung.ABORT, Outcome.FAILED, f"the abort failed: {fact.detail}")
        return RemedyStep(replace(state, ladder=ladder.escalated(lad)), (), (note,))
    done = replace(proof, done=True, aborted=fact.aborted, canary_ok_at=fact.canary_ok_at)
    return RemedyStep(replace(state, ladder=replace(lad, abort=done)))


def budget_remaining(state: RemedyState, config: RemedyConfig, at: float) -> int:
    """How many restarts the budget still allows at `at`."""
    return restart_policy.budget_remaining(state.policy, config.policy, at)
