"""One probe step: what a scrape does to the restart state, for `/probe` and `check`.

The daemon (`core.episode` rules P2 and Q1, answering `/probe`) and `wedgewatch check
--state-file` (an exec probe, `check.run`) both call `step` once per judged scrape, so the
restart policy's clocks (backoff, start-up grace, the stretch of health that clears
`gave_up`) move the same way in both; tests/check/test_probe_same_story.py drives both through one
story and compares the persisted state after every step. Pure: time is passed in.

The order inside a step, and why:

1. `probe_policy.observe_server` (rules R2-R4): a failing answer already served and a new
   server now proves a probe-driven restart; it is counted (which ends any stretch of
   health: a restart happened).
2. `restart_policy.record_tick`: the start-up timeout, and the stretch of health, which
   therefore starts at the very scrape that proved the new server healthy.
3. `probe_policy.probe_verdict` (rules P0-P3): what a probe asked now answers (it may move
   the policy to gave_up). A scrape without a `mark` (no probe is answered from it) stops
   after 2.

A failing answer that was then served is `served` (rule R1).
"""

from __future__ import annotations

from dataclasses import field

from wedgewatch.core.detection.detect import TargetState, TargetVerdict
from wedgewatch.core.detection.states import CALM, EngineState
from wedgewatch.core.restart import probe_policy, restart_policy
from wedgewatch.core.restart.probe_policy import ProbeMemory, ProbeVerdict, ServerMark
from wedgewatch.core.restart.restart_codec import RestartRecord
from wedgewatch.core.restart.restart_policy import PolicyEvent, PolicyState, RestartPolicy
from wedgewatch.core.values import immutable


@immutable
class ProbeState:
    """The restart state a probe keeps between scrapes (monotonic instants)."""

    policy: PolicyState = field(default_factory=PolicyState)
    memory: ProbeMemory = field(default_factory=ProbeMemory)


@immutable
class ProbeScrape:
    """What one judged scrape says, as far as the restart state is concerned."""

    target_state: EngineState
    healthy: bool  # some engine, and every one calm
    scraped: bool  # the scrape itself succeeded (only a good scrape shows who the server is)
    mark: ServerMark | None  # the server the detector read last; None: no probe answered
    not_replaced: str | None = None  # in the start-up grace: why the server is not a new one

    @classmethod
    def of(
        cls, verdict: TargetVerdict, detector: TargetState | None, *, scraped: bool
    ) -> ProbeScrape:
        """From the detector's verdict and state (None: no probe is answered from it)."""
        return cls(
            target_state=verdict.state,
            healthy=bool(verdict.engines) and verdict.state in CALM,
            scraped=scraped,
            mark=None if detector is None else ServerMark.of(detector),
        )


@immutable
class ProbeConfig:
    """The settings a probe step obeys."""

    policy: RestartPolicy
    respects_budget: bool = True
    observe: bool = False  # remedy = "none": never ask for a restart (rule P0)
    hold: str | None = None  # the abort cure holds the restart back (rule P1a): why


@immutable
class ProbeStep:
    """The state after a scrape, the probe's answer (None without a mark), the events."""

    state: ProbeState
    verdict: ProbeVerdict | None
    events: tuple[PolicyEvent, ...] = ()


def step(
    state: ProbeState, scrape: ProbeScrape, at: float, timestamp: float, config: ProbeConfig
) -> ProbeStep:
    """Fold one judged scrape into the restart state; see the order at the top."""
    events: list[PolicyEvent] = []
    memory, policy = state.memory, state.policy
    if scrape.mark is not None:
        memory, result = probe_policy.observe_server(
            memory,
            policy,
            config.policy,
            scrape.mark,
            scraped=scrape.scraped,
            target_state=scrape.target_state,
            at=at,
            timestamp=timestamp,
        )
        policy = result.state
        events += result.events
    result = restart_policy.record_tick(
        policy,
        config.policy,
        at,
        timestamp,
        healthy=scrape.healthy,
        not_replaced=scrape.not_replaced,
    )
    policy = result.state
    events += result.events
    verdict = None
    if scrape.mark is not None:
        verdict, result = probe_policy.probe_verdict(
            policy,
            config.policy,
            scrape.target_state,
            at,
            timestamp,
            respects_budget=config.respects_budget,
            observe=config.observe,
            hold=config.hold,
        )
        policy = result.state
        events += result.events
    return ProbeStep(ProbeState(policy, memory), verdict, tuple(events))


def served(state: ProbeState, mark: ServerMark, at: float) -> ProbeState:
    """Rule R1: a failing answer about the server `mark` went out at `at`."""
    return ProbeState(state.policy, probe_policy.served_failure(state.memory, mark, at))


def to_record(state: ProbeState, at: float, timestamp: float) -> RestartRecord:
    """The state as both state files keep it (`core.restart_codec`)."""
    return RestartRecord(
        policy=restart_policy.to_record(state.policy, at, timestamp),
        probe=probe_policy.memory_to_record(state.memory, at, timestamp),
    )


def from_record(
    record: RestartRecord,
    policy: RestartPolicy,
    at: float,
    timestamp: float,
    *,
    keep_health: bool,
) -> ProbeState:
    """The state rebased onto this process's clock; `keep_health` as in `restart_policy`."""
    restored = PolicyState()
    if record.policy is not None:
        restored = restart_policy.from_record(
            record.policy, policy, at, timestamp, keep_health=keep_health
        )
    return ProbeState(restored, probe_policy.memory_from_record(record.probe, at, timestamp))
