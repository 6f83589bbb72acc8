"""The canary core (when to send, what an outcome means) and the detector's rule K1."""

from __future__ import annotations

import pytest

from wedgewatch.core.detection import canary
from wedgewatch.core.detection.canary import CanaryPolicy, CanaryResult, CanaryState
from wedgewatch.core.detection.detect import (
    CanaryStall,
    CaptureEvidence,
    DetectionPolicy,
    Restart,
    Scraped,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    step,
)
from wedgewatch.core.detection.states import EngineState, Family
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition

K0 = EngineKey("m", "0")
POLICY = CanaryPolicy(interval_seconds=30, timeout_seconds=10)


def reading(
    *, running: float = 0, waiting: float = 0, gen: float = 0, awake: bool | None = True
) -> EngineReading:
    """One engine's reading whose progress is `gen` tokens."""
    return EngineReading(
        key=K0,
        running=running,
        waiting=waiting,
        waiting_by_reason={},
        kv_cache_usage=0.0,
        awake=awake,
        prompt_tokens=gen,
        generation_tokens=gen,
        request_success=0,
        preemptions=0,
        iterations=gen,
    )


def scraped(at: float, r: EngineReading) -> Scraped:
    """A good scrape of one engine."""
    return Scraped(at, Exposition(engines={K0: r}, process_start_time_seconds=None))


def run(
    readings: list[tuple[float, EngineReading]], stall: CanaryStall | None = None
) -> list[TargetVerdict]:
    """Feed scrapes through the detector with a standing canary stall; return the verdicts."""
    state, verdicts = TargetState.initial(), []
    for at, r in readings:
        state, verdict = step(state, scraped(at, r), DetectionPolicy(), stall)
        verdicts.append(verdict)
    return verdicts


def verdict_at(at: float, r: EngineReading | None = None) -> TargetVerdict:
    """The detector's verdict on a second scrape of `r` at `at` (a judged reading)."""
    r = r if r is not None else reading()
    return run([(at - 1, r), (at, r)])[-1]


def noted(*steps: tuple[float, float]) -> CanaryState:
    """A canary state that noted idle verdicts with (at, generated tokens) pairs."""
    state = CanaryState()
    for at, gen in steps:
        state = canary.note(state, verdict_at(at, reading(gen=gen)))
    return state


# -- S1: when to send -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "policy", "verdict", "at", "restarting", "send", "why"),
    [
        (noted((0, 0)), CanaryPolicy(), verdict_at(40), 40, False, False, "off"),
        (noted((0, 0)), POLICY, verdict_at(40), 40, False, True, "no progress"),
        (noted((0, 0)), POLICY, verdict_at(20), 20, False, False, "quiet for 20.0s only"),
        (noted((0, 0), (25, 5)), POLICY, verdict_at(40), 40, False, False, "quiet for 15.0s"),
        (
            canary.sent(noted((0, 0)), 1),
            POLICY,
            verdict_at(40),
            40,
            False,
            False,
            "already in flight",
        ),
        (noted((0, 0)), POLICY, verdict_at(40), 40, True, False, "being restarted"),
        (
            noted((0, 0)),
            POLICY,
            verdict_at(40, reading(awake=False)),
            40,
            False,
            False,
            "sleeping",
        ),
        (noted((0, 0)), POLICY, None, 40, False, False, "no good scrape"),
    ],
    ids=["off", "quiet", "too-soon", "busy", "in-flight", "restarting", "sleeping", "no-scrape"],
)
def test_decide_table(
    *,
    state: CanaryState,
    policy: CanaryPolicy,
    verdict: TargetVerdict | None,
    at: float,
    restarting: bool,
    send: bool,
    why: str,
) -> None:
    """Rule S1: each condition alone keeps the canary home, and all together send it."""
    decision = canary.decide(state, policy, verdict, at, restarting=restarting)
    assert decision.send is send
    assert why in decision.reason


def test_decide_failed_scrape_and_starting() -> None:
    """Rule S1: a failed scrape or a target with no engine never gets a canary."""
    state, failed = TargetState.initial(), ScrapeFailed(40, "timeout", "slow")
    _, verdict = step(state, failed, DetectionPolicy())
    assert not canary.decide(noted((0, 0)), POLICY, verdict, 40, restarting=False).send


def test_idle_gets_one_canary_per_interval() -> None:
    """Rules S1/S2: an idle target gets one canary per interval, not one per scrape."""
    state, sends = noted((0, 0)), []
    for at in range(1, 101):
        state = canary.note(state, verdict_at(at))
        if canary.decide(state, POLICY, verdict_at(at), at, restarting=False).send:
            sends.append(at)
            state = canary.sent(state, at)
            state, _ = canary.judge(state, POLICY, CanaryResult(at, 0.01, 0.02, None))
    assert sends == [30, 60, 90]


def test_canary_own_tokens_are_not_progress() -> None:
    """Rule J1: the tokens a successful canary generated do not restart the quiet clock."""
    state = canary.sent(noted((0, 0), (30, 0)), 30)
    state, _ = canary.judge(state, POLICY, CanaryResult(30, 0.01, 0.02, None))
    state = canary.note(state, verdict_at(31, reading(gen=2)))  # the canary's own tokens
    assert state.quiet_since == 30
    assert canary.decide(state, POLICY, verdict_at(60, reading(gen=2)), 60, restarting=False).send


def test_busy_target_gets_no_canary() -> None:
    """Rule N1: progress on every scrape keeps the quiet clock at zero: no canary ever."""
    state = CanaryState()
    for at in range(1, 200):
        verdict = verdict_at(at, reading(running=2, gen=at))
        state = canary.note(state, verdict)
        assert not canary.decide(state, POLICY, verdict, at, restarting=False).send


# -- J1-J4: what an outcome means ----------------------------------------------------------


def in_flight(progress_after: float) -> CanaryState:
    """A canary sent at 30 with gen 0; a later scrape saw gen `progress_after`."""
    state = canary.sent(noted((0, 0), (30, 0)), 30)
    return canary.note(state, verdict_at(40, reading(gen=progress_after)))


@pytest.mark.parametrize(
    ("state", "result", "verdict", "stall"),
    [
        (in_flight(0), CanaryResult(30, 0.2, 0.3, None), "ok", False),
        (in_flight(0), CanaryResult(30, None, 10, "timeout", "no token"), "stall", True),
        (in_flight(7), CanaryResult(30, None, 10, "timeout", "no token"), "latency", False),
        (in_flight(0), CanaryResult(30, None, 0.1, "refused", "ECONNREFUSED"), "error", False),
        (in_flight(0), CanaryResult(30, None, 0.1, "http_status", "404"), "error", False),
    ],
    ids=["ok", "stall", "latency", "refused", "http-status"],
)
def test_judge_table(state: CanaryState, result: CanaryResult, verdict: str, stall: bool) -> None:
    """Rules J1-J4: only a token-less canary with flat counters is a stall."""
    new, judgement = canary.judge(state, POLICY, result)
    assert judgement.verdict == verdict
    assert (new.stall is not None) is stall
    assert new.in_flight_since is None
    if stall:
        assert new.stall is not None
        assert new.stall.since_at == 30


def test_stall_clears_on_progress_or_success() -> None:
    """Rules N1 and J1: a standing stall clears when counters move or a canary gets a token."""
    stalled, _ = canary.judge(in_flight(0), POLICY, CanaryResult(30, None, 10, "timeout"))
    assert stalled.stall is not None
    moved = canary.note(stalled, verdict_at(50, reading(gen=3)))
    assert moved.stall is None
    again = canary.sent(stalled, 60)
    ok, judgement = canary.judge(again, POLICY, CanaryResult(60, 0.5, 0.6, None))
    assert judgement.verdict == "ok"
    assert ok.stall is None
    assert ok.last_success_at == 60.5


def test_result_rejects_unknown_reason() -> None:
    """Failures are data with a closed reason set: anything else is a caller bug."""
    with pytest.raises(ValueError, match="reason"):
        CanaryResult(0, None, 0, "boom")  # type: ignore[arg-type]


# -- detector rule K1 --------------------------------------------------------------------------

STALL = CanaryStall(since_at=10, detail="no token within canary_timeout_seconds (10s)")


def test_k1_idle_engine_with_canary_stall_is_wedged_and_acted_on() -> None:
    """Rule K1: an idle engine under a standing canary stall is WEDGED canary_stall, acted once."""
    verdicts = run([(0, reading()), (20, reading()), (21, reading())], STALL)
    assert verdicts[0].state is EngineState.IDLE  # baseline: never a stall
    wedged = verdicts[1]
    assert wedged.state is EngineState.WEDGED
    assert wedged.engines[0].family is Family.CANARY_STALL
    assert wedged.engines[0].stalled_seconds == 10
    assert wedged.actions == (
        CaptureEvidence(K0, Family.CANARY_STALL, "wedged"),
        Restart(K0, Family.CANARY_STALL),
    )
    assert verdicts[2].state is EngineState.WEDGED
    assert verdicts[2].actions == ()


def test_k1_frozen_running_engine_is_wedged() -> None:
    """Rule K1: a running engine whose counters froze is WEDGED canary_stall before hang_after."""
    frozen = reading(running=1, gen=5)
    verdicts = run([(0, frozen), (20, frozen)], STALL)
    assert verdicts[1].state is EngineState.WEDGED
    assert verdicts[1].engines[0].family is Family.CANARY_STALL


@pytest.mark.parametrize(
    ("second", "state"),
    [
        (reading(running=1, gen=9), EngineState.OK),
        (reading(awake=False), EngineState.SLEEPING),
    ],
    ids=["progress-moved", "sleeping"],
)
def test_k1_never_wedges_progress_or_sleep(second: EngineReading, state: EngineState) -> None:
    """Rule K1: an engine whose counters moved, or a sleeping one, ignores the canary stall."""
    verdicts = run([(0, reading(running=1, gen=5)), (20, second)], STALL)
    assert verdicts[1].state is state


def test_k1_without_canary_idle_stays_idle() -> None:
    """Rule K1 needs the input: the frozen-at-idle engine is IDLE forever without a canary."""
    verdicts = run([(at, reading()) for at in range(0, 1000, 50)])
    assert all(v.state is EngineState.IDLE for v in verdicts)


def test_k1_stall_cleared_returns_to_idle() -> None:
    """Rule K1: once the stall no longer stands, the engine is judged by its gauges again."""
    state, _ = step(TargetState.initial(), scraped(0, reading()), DetectionPolicy())
    state, wedged = step(state, scraped(20, reading()), DetectionPolicy(), STALL)
    state, calm = step(state, scraped(21, reading()), DetectionPolicy(), None)
    assert wedged.state is EngineState.WEDGED
    assert calm.state is EngineState.IDLE
