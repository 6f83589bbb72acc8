"""The family wedgewatch's detector gives each upstream wedge variant, with the /metrics
shape vLLM's own metric code shows in that state (docs/vllm-coverage.md).

Shapes marked "vLLM's code" are the exposition vLLM's `PrometheusStatLogger` writes for the
scheduler state (tests/lab/test_variants_real.py drives it on 0.30.0 and 0.33.0 and checks
the same judgement on the real body); the others are the issue's own scrape or the state's
queue membership read in the release code. Each test fails if the judgement it pins changes,
including the blind spots: a shape that is *not* flagged stays pinned as not flagged.
"""

from __future__ import annotations

from collections.abc import Callable

from wedgewatch.core.detection.detect import DetectionPolicy, Scraped, TargetState, new_state, step
from wedgewatch.core.detection.states import EngineState, Family
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition

KEY = EngineKey("org/model", "0")
POLICY = DetectionPolicy()  # the shipped defaults: stall 60 s, hang 120 s, deferred-only 600 s
INTERVAL = 10.0


def reading(
    *,
    running: float = 0,
    capacity: float = 0,
    deferred: float = 0,
    kv: float = 0.3,
    gen: float = 1000,
    aborts: float = 0,
) -> EngineReading:
    """One engine's reading in the shape vLLM's logger writes (both waiting reasons)."""
    return EngineReading(
        key=KEY,
        running=running,
        waiting=capacity + deferred,
        waiting_by_reason={"capacity": capacity, "deferred": deferred},
        kv_cache_usage=kv,
        awake=True,
        prompt_tokens=gen * 4,
        generation_tokens=gen,
        request_success=10 + aborts,
        preemptions=0,
        iterations=100,
        finished_by_reason={"stop": 10, "abort": aborts},
    )


Timeline = Callable[[float], EngineReading]


def judge(timeline: Timeline, seconds: float) -> list[tuple[float, EngineState, Family | None]]:
    """Scrape `timeline` every INTERVAL seconds from 0 to `seconds`: (at, state, family)."""
    state: TargetState = new_state()
    out: list[tuple[float, EngineState, Family | None]] = []
    at = 0.0
    while at <= seconds:
        state, verdict = step(state, Scraped(at, Exposition({KEY: timeline(at)}, 1.0)), POLICY)
        (engine,) = verdict.engines
        out.append((at, engine.state, engine.family))
        at += INTERVAL
    return out


def first_wedged(judged: list[tuple[float, EngineState, Family | None]]) -> tuple[float, Family]:
    """When the engine was first WEDGED, and the family."""
    for at, state, family in judged:
        if state is EngineState.WEDGED:
            assert family is not None
            return at, family
    raise AssertionError("never wedged")


def never_wedged(judged: list[tuple[float, EngineState, Family | None]]) -> bool:
    """Whether no step was WEDGED."""
    return all(state is not EngineState.WEDGED for _, state, _ in judged)


def healthy_then(wedge: EngineReading, start: float = 30.0) -> Timeline:
    """Tokens flow until `start`, then the wedge's reading for ever."""
    return lambda at: reading(running=2, gen=1000 + 10 * at) if at < start else wedge


# --------------------------------------------------------------------------- #56640


def test_56640_parked_request_on_a_quiet_server_is_a_deferred_only_wedge_at_600_s() -> None:
    """#56640 (vLLM's code, 0.30.0 and 0.33.0): /metrics is not idle, it shows the request
    as deferred with nothing running; wedged as deferred_only_stall 600 s after it started."""
    wedge = reading(deferred=1, kv=0.42, gen=1300)
    at, family = first_wedged(judge(healthy_then(wedge), 700))
    assert family is Family.DEFERRED_ONLY_STALL
    assert at == 30.0 + POLICY.deferred_only_after_seconds


def test_56640_parked_request_on_a_busy_server_is_a_blind_spot() -> None:
    """#56640 while the server keeps serving others: one more deferred request beside
    flowing tokens never makes a family fire (documented blind spot: only a request age would
    show it)."""
    judged = judge(lambda at: reading(running=3, deferred=1, kv=0.6, gen=1000 + 20 * at), 1800)
    assert all(state is EngineState.OK for _, state, _ in judged[1:])


# --------------------------------------------------------------------------- #53859


def test_53859_frozen_loop_with_requests_running_is_a_progress_stall() -> None:
    """#53859: the loop blocks in the KV-event publisher inside a step, /metrics freezes at
    its last values (running > 0): progress_stall after hang_after_seconds."""
    frozen = reading(running=3, capacity=2, kv=0.7, gen=1300)
    at, family = first_wedged(judge(healthy_then(frozen), 400))
    assert family is Family.PROGRESS_STALL
    assert at == 30.0 + POLICY.hang_after_seconds


# --------------------------------------------------------------------------- #57104


def test_57104_on_0_30_is_deferred_only_until_new_requests_queue() -> None:
    """#57104 on 0.30.0: both stuck requests sit in skipped_waiting (deferred 2, capacity 0,
    KV full): deferred_only_stall at 600 s; once new requests queue behind them (capacity >
    0) it is a deferred_stall at 60 s."""
    quiet = reading(deferred=2, kv=0.99, gen=1300)
    at, family = first_wedged(judge(healthy_then(quiet), 700))
    assert (at, family) == (630.0, Family.DEFERRED_ONLY_STALL)
    busy = reading(capacity=4, deferred=2, kv=0.99, gen=1300)
    at, family = first_wedged(judge(healthy_then(busy), 700))
    assert (at, family) == (30.0 + POLICY.stall_after_seconds, Family.DEFERRED_STALL)


# --------------------------------------------------------------------------- #49829


def test_49829_one_request_whose_client_gives_up_at_300_s_is_never_flagged() -> None:
    """#49829 (vLLM's code): a request deferred for ever by HIT_PENDING; its client aborts at
    300 s, the queue empties (idle resets the clock) before the 600 s deferred-only threshold:
    never wedged (documented blind spot)."""

    def timeline(at: float) -> EngineReading:
        if at < 30:
            return reading(running=1, gen=1000 + 10 * at)
        if at < 330:
            return reading(deferred=1, kv=0.0, gen=1300)
        return reading(kv=0.0, gen=1300, aborts=1)

    assert never_wedged(judge(timeline, 1200))


def test_49829_requests_that_keep_arriving_and_deferring_are_wedged_at_600_s() -> None:
    """#49829 when every new request needs the lost chunk: aborts rotate the requests but the
    queue never empties (an aborted finish is never progress): deferred_only_stall at 600 s."""

    def timeline(at: float) -> EngineReading:
        if at < 30:
            return reading(running=1, gen=1000 + 10 * at)
        return reading(deferred=2, kv=0.0, gen=1300, aborts=(at - 30) // 300)

    at, family = first_wedged(judge(timeline, 700))
    assert (at, family) == (30.0 + POLICY.deferred_only_after_seconds, Family.DEFERRED_ONLY_STALL)


# --------------------------------------------------------------------------- vllm-metal #479


def test_metal_479_capacity_only_livelock_is_an_admission_stall() -> None:
    """vllm-metal #479 (the issue's scrape): running 0, waiting 6 all on capacity, deferred 0,
    KV 0 %: admission_stall after stall_after_seconds."""
    wedge = reading(capacity=6, kv=0.0, gen=1300)
    at, family = first_wedged(judge(healthy_then(wedge), 200))
    assert (at, family) == (30.0 + POLICY.stall_after_seconds, Family.ADMISSION_STALL)


# ----------------------------------------------------------------- local-inference-lab #191


def test_lil_191_a_six_minute_stall_that_the_next_request_ends_is_not_flagged() -> None:
    """local-inference-lab/vllm #191: the rescheduled request waits (deferred, nothing
    running) 6 minutes until another request arrives: under the 600 s deferred-only threshold,
    never wedged (documented blind spot; a canary request would have woken it)."""

    def timeline(at: float) -> EngineReading:
        if at < 30:
            return reading(running=1, gen=1000 + 10 * at)
        if at < 390:
            return reading(deferred=1, kv=0.1, gen=1300)
        return reading(running=2, gen=1300 + 10 * (at - 390))

    judged = judge(timeline, 900)
    assert never_wedged(judged)
    assert any(family is Family.DEFERRED_ONLY_STALL for _, _, family in judged)
