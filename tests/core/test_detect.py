"""The wedge detector as a transition table, as timed scenarios, and its state persistence."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from wedgewatch.core.detection.detect import (
    Action,
    CaptureEvidence,
    DetectionPolicy,
    EngineVerdict,
    Observation,
    Restart,
    Scraped,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    Transition,
    new_state,
    step,
)
from wedgewatch.core.detection.detect_state import dump_state, load_state
from wedgewatch.core.detection.states import SEVERITY, EngineState, Family
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition, parse

MODEL = "org/model-7b"
K0 = EngineKey(MODEL, "0")
K1 = EngineKey(MODEL, "1")
# The defaults (stall 60 s, hang 120 s, output stall 300 s, unreachable 30 s) without a
# start-up timeout.
POLICY = DetectionPolicy(startup_timeout_seconds=None)

S = EngineState
F = Family


def reading(
    key: EngineKey = K0,
    *,
    running: float = 0,
    waiting: float = 0,
    deferred: float | None = None,
    awake: bool | None = True,
    prompt: float = 0,
    gen: float = 0,
    success: float = 0,
    preempt: float = 0,
    iters: float = 0,
    kv: float | None = 0.25,
    finished: dict[str, float] | None = None,
    prefix: float | None = None,
) -> EngineReading:
    """One engine's reading; `deferred=None` models old vLLM without waiting reasons.

    `finished` gives `request_success` by finished_reason (then `success` is their sum).
    """
    by_reason = {} if deferred is None else {"deferred": deferred, "capacity": waiting - deferred}
    return EngineReading(
        key=key,
        running=running,
        waiting=waiting,
        waiting_by_reason=by_reason,
        kv_cache_usage=kv,
        awake=awake,
        prompt_tokens=prompt,
        generation_tokens=gen,
        request_success=success if finished is None else sum(finished.values()),
        preemptions=preempt,
        iterations=iters,
        finished_by_reason=finished or {},
        prefix_cache_queries=prefix,
    )


def busy(n: float, key: EngineKey = K0) -> EngineReading:
    """A decoding engine whose every counter is a function of `n` (n+1 moves all of them)."""
    return reading(
        key, running=2, waiting=1, deferred=0, prompt=100 * n, gen=50 * n, success=n, iters=10 * n
    )


def stuck(n: float, key: EngineKey = K0) -> EngineReading:
    """The deferred wedge: nothing running, requests parked, counters as `busy(n)` left them."""
    return reading(
        key, running=0, waiting=3, deferred=2, prompt=100 * n, gen=50 * n, success=n, iters=10 * n
    )


def unadmitted(n: float, key: EngineKey = K0) -> EngineReading:
    """An admission stall: nothing running, requests waiting for capacity, none deferred."""
    return reading(
        key, running=0, waiting=3, deferred=0, prompt=100 * n, gen=50 * n, success=n, iters=10 * n
    )


def livelock(n: float, preempt: float, key: EngineKey = K0) -> EngineReading:
    """Preemptions climb while output stays where `busy(n)` left it."""
    return reading(
        key,
        running=2,
        waiting=1,
        deferred=0,
        prompt=100 * n,
        gen=50 * n,
        success=n,
        preempt=preempt,
        iters=10 * n,
    )


def idle(n: float, key: EngineKey = K0) -> EngineReading:
    """Nothing running or waiting."""
    return reading(key, prompt=100 * n, gen=50 * n, success=n, iters=10 * n)


def asleep(n: float, key: EngineKey = K0) -> EngineReading:
    """A sleeping engine with requests queued against it."""
    return reading(
        key, waiting=3, deferred=0, awake=False, prompt=100 * n, gen=50 * n, success=n, iters=10 * n
    )


def aborting(n: float, aborts: float, reason: str = "abort", key: EngineKey = K0) -> EngineReading:
    """The deferred wedge while clients time out and retry: only abort (or error) finishes move.

    Each batch that carries an aborted finish is an `IterationStats` with 0 tokens, which vLLM's
    stat logger also observes into `vllm:iteration_tokens_total`: the iteration count climbs
    with the aborts (the simulator does the same; tests/lab/sim/test_shapes.py).
    """
    return reading(
        key,
        running=0,
        waiting=3,
        deferred=2,
        prompt=100 * n,
        gen=50 * n,
        finished={"stop": n, reason: aborts},
        iters=10 * n + aborts,
    )


def prefilling(
    n: float, kv: float, key: EngineKey = K0, prefix: float | None = None
) -> EngineReading:
    """A long chunked prefill: one request running, counters where `busy(n)` left them, KV `kv`."""
    return reading(
        key,
        running=1,
        waiting=0,
        deferred=0,
        prompt=100 * n,
        gen=50 * n,
        success=n,
        iters=10 * n,
        kv=kv,
        prefix=prefix,
    )


def deferred_only(n: float, key: EngineKey = K0, kv: float = 0.25) -> EngineReading:
    """A streaming-input session idle between chunks: one deferred request, no capacity wait."""
    return reading(
        key,
        running=0,
        waiting=1,
        deferred=1,
        prompt=100 * n,
        gen=50 * n,
        success=n,
        iters=10 * n,
        kv=kv,
    )


def nan_gauges(n: float, key: EngineKey = K0, **bad: float) -> EngineReading:
    """Counters as `busy(n)` left them, `running` NaN (or the fields given in `bad`)."""
    fields: dict[str, Any] = {
        "running": math.nan,
        "waiting": 1,
        "deferred": 0,
        "prompt": 100 * n,
        "gen": 50 * n,
        "success": n,
        "iters": 10 * n,
    }
    fields.update(bad)
    return reading(key, **fields)


def scraped(at: float, *readings: EngineReading, start: float | None = None) -> Scraped:
    """A good scrape containing `readings`."""
    return Scraped(at, Exposition({r.key: r for r in readings}, start))


def failed(at: float, reason: Any = "timeout") -> ScrapeFailed:
    """A failed scrape."""
    return ScrapeFailed(at, reason, "read timed out after 5s")


def run(
    observations: Iterable[Observation],
    policy: DetectionPolicy = POLICY,
    state: TargetState | None = None,
) -> tuple[TargetState, list[TargetVerdict]]:
    """Fold observations through the detector, returning the final state and every verdict."""
    state = state if state is not None else new_state()
    verdicts = []
    for observation in observations:
        state, verdict = step(state, observation, policy)
        verdicts.append(verdict)
    return state, verdicts


def engine(verdict: TargetVerdict, key: EngineKey = K0) -> EngineVerdict:
    """The verdict of one engine."""
    (found,) = [e for e in verdict.engines if e.key == key]
    return found


def suspect(family: Family, key: EngineKey = K0) -> tuple[Action, ...]:
    """The actions of entering SUSPECT."""
    return (CaptureEvidence(key, family, "suspect"),)


def wedged(family: Family, key: EngineKey = K0) -> tuple[Action, ...]:
    """The actions of entering WEDGED or UNREACHABLE."""
    return (CaptureEvidence(key, family, "wedged"), Restart(key, family))


# Preludes: observation sequences that leave engine 0 (and 1 for "dp_*") in a known state.
OK_ = (scraped(0, busy(0)), scraped(10, busy(1)))  # last progress at 10
PRELUDES: dict[str, tuple[Observation, ...]] = {
    "fresh": (),
    "starting": (failed(0),),
    "ok": OK_,
    "idle": (scraped(0, busy(0)), scraped(10, idle(1))),
    "idle_long": (scraped(0, busy(0)), scraped(10, idle(1)), scraped(1000, idle(1))),
    "sleeping": (scraped(0, busy(0)), scraped(10, asleep(1))),
    "sleeping_long": (scraped(0, busy(0)), scraped(10, asleep(1)), scraped(1000, asleep(1))),
    # The suspect_* preludes end past a quarter of the threshold: the suspect capture is taken.
    "suspect_deferred": (*OK_, scraped(20, stuck(1)), scraped(30, stuck(1))),
    "wedged_deferred": (*OK_, scraped(20, stuck(1)), scraped(70, stuck(1))),
    "suspect_admission": (*OK_, scraped(20, unadmitted(1)), scraped(30, unadmitted(1))),
    "suspect_progress": (*OK_, scraped(20, busy(1)), scraped(40, busy(1))),
    "wedged_progress": (*OK_, scraped(20, busy(1)), scraped(130, busy(1))),
    "suspect_output": (  # last output at 10
        *OK_,
        scraped(20, livelock(1, preempt=1)),
        scraped(90, livelock(1, preempt=2)),
    ),
    "wedged_output": (*OK_, scraped(20, livelock(1, preempt=1)), scraped(310, livelock(1, 2))),
    "suspect_unreachable": (*OK_, failed(20), failed(28)),
    "unreachable": (*OK_, failed(20), failed(50)),
    "ok_started": (scraped(0, busy(0), start=1000.0), scraped(10, busy(1), start=1000.0)),
    "prefilling": (*OK_, scraped(20, prefilling(1, 0.30)), scraped(25, prefilling(1, 0.35))),
    "suspect_deferred_only": (*OK_, scraped(20, deferred_only(1))),
    "unknown": (*OK_, scraped(20, nan_gauges(1))),
    "two_servers": (  # the URL reached server 1000, then 2000 (read as a restart)
        scraped(0, busy(0), start=1000.0),
        scraped(10, busy(1), start=2000.0),
    ),
    "multi_server": (
        scraped(0, busy(0), start=1000.0),
        scraped(10, busy(1), start=2000.0),
        scraped(20, busy(1), start=1000.0),
    ),
    "dp_ok": (scraped(0, busy(0), busy(0, K1)), scraped(10, busy(1), busy(1, K1))),
    "dp_missing": (
        scraped(0, busy(0), busy(0, K1)),
        scraped(10, busy(1), busy(1, K1)),
        scraped(20, busy(2)),
        scraped(28, busy(3)),
    ),
    "dp_failing": (
        scraped(0, busy(0), busy(0, K1)),
        scraped(10, busy(1), busy(1, K1)),
        failed(20),
        failed(28),
    ),
    "dp_engine1_suspect": (
        scraped(0, busy(0), busy(0, K1)),
        scraped(10, busy(1), busy(1, K1)),
        scraped(20, busy(2), stuck(1, K1)),
    ),
}

TABLE = [
    # (prelude, observation, engine, expected state, expected family, expected actions)
    pytest.param("fresh", scraped(0, busy(0)), K0, S.OK, None, (), id="fresh+busy=ok(baseline)"),
    pytest.param(
        "fresh", scraped(0, stuck(0)), K0, S.OK, None, (), id="fresh+deferred=ok(baseline-no-delta)"
    ),
    pytest.param("fresh", scraped(0, idle(0)), K0, S.IDLE, None, (), id="fresh+idle=idle"),
    pytest.param(
        "fresh", scraped(0, asleep(0)), K0, S.SLEEPING, None, (), id="fresh+asleep=sleeping"
    ),
    pytest.param("starting", scraped(5, busy(0)), K0, S.OK, None, (), id="starting+busy=ok"),
    # ok
    pytest.param("ok", scraped(20, busy(2)), K0, S.OK, None, (), id="ok+progress=ok"),
    pytest.param(
        "ok",
        scraped(20, busy(1)),
        K0,
        S.SUSPECT,
        F.PROGRESS_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="ok+flat-running=suspect(progress)",
    ),
    pytest.param(
        "ok",
        scraped(20, stuck(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="ok+flat-deferred=suspect(deferred)",
    ),
    pytest.param(
        "ok",
        scraped(20, unadmitted(1)),
        K0,
        S.SUSPECT,
        F.ADMISSION_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="ok+flat-capacity=suspect(admission)",
    ),
    pytest.param(
        "ok",
        scraped(20, reading(running=0, waiting=3, prompt=100, gen=50, success=1, iters=10)),
        K0,
        S.SUSPECT,
        F.ADMISSION_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="ok+flat-no-reasons(old-vllm)=suspect(admission)",
    ),
    pytest.param(
        "ok",
        scraped(20, livelock(1, preempt=1)),
        K0,
        S.SUSPECT,
        F.OUTPUT_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="ok+preemptions-only=suspect(output)",
    ),
    pytest.param("ok", scraped(20, idle(1)), K0, S.IDLE, None, (), id="ok+idle=idle"),
    pytest.param(
        "ok", scraped(20, asleep(1)), K0, S.SLEEPING, None, (), id="ok+asleep-with-waiting=sleeping"
    ),
    pytest.param("ok", scraped(20, stuck(0)), K0, S.OK, None, (), id="ok+counters-backwards=ok"),
    pytest.param(
        "ok",
        failed(20),
        K0,
        S.SUSPECT,
        F.UNREACHABLE,
        (),  # no capture at the first suspect sample (A1)
        id="ok+failure=suspect(unreachable)",
    ),
    pytest.param(
        "ok",
        scraped(70, stuck(1)),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        wedged(F.DEFERRED_STALL),
        id="ok+flat-after-long-gap=wedged(no-suspect-capture)",
    ),
    pytest.param(
        "ok_started",
        scraped(20, busy(1), start=2000.0),
        K0,
        S.OK,
        None,
        (),
        id="ok+process-start-changed=ok(rebaseline)",
    ),
    pytest.param("ok", scraped(5, stuck(0)), K0, S.OK, None, (), id="ok+clock-backwards=ok(fresh)"),
    # idle and sleeping
    pytest.param("idle", scraped(1000, idle(1)), K0, S.IDLE, None, (), id="idle+idle-long=idle"),
    pytest.param(
        "idle_long",
        scraped(1005, stuck(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="idle+work-after-long-idle=suspect(clock-from-idle)",
    ),
    pytest.param(
        "sleeping", scraped(1000, asleep(1)), K0, S.SLEEPING, None, (), id="sleeping+long=sleeping"
    ),
    pytest.param(
        "sleeping",
        failed(20),
        K0,
        S.SUSPECT,
        F.UNREACHABLE,
        (),  # no capture at the first suspect sample (A1)
        id="sleeping+failure=suspect(unreachable)",
    ),
    pytest.param(
        "sleeping_long",
        scraped(1005, stuck(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),  # no capture at the first suspect sample (A1)
        id="sleeping+woken-flat=suspect(clock-from-sleep)",
    ),
    # deferred stall
    pytest.param(
        "suspect_deferred",
        scraped(69, stuck(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),
        id="suspect(deferred)+flat-59s=suspect",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(70, stuck(1)),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        wedged(F.DEFERRED_STALL),
        id="suspect(deferred)+flat-60s=wedged",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(30, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(deferred)+progress=ok",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(30, idle(1)),
        K0,
        S.IDLE,
        None,
        (),
        id="suspect(deferred)+idle=idle",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(30, asleep(1)),
        K0,
        S.SLEEPING,
        None,
        (),
        id="suspect(deferred)+asleep=sleeping",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(30, stuck(0)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(deferred)+counters-backwards=ok",
    ),
    pytest.param(
        "suspect_deferred",
        failed(30),
        K0,
        S.SUSPECT,
        F.UNREACHABLE,
        (),
        id="suspect(deferred)+failure=suspect(unreachable,same-episode)",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(
            30, reading(running=0, waiting=3, deferred=0, prompt=100, gen=50, success=1, iters=10)
        ),
        K0,
        S.SUSPECT,
        F.ADMISSION_STALL,
        (),
        id="suspect(deferred)+deferred-cleared-flat=suspect(admission)",
    ),
    pytest.param(
        "wedged_deferred",
        scraped(80, stuck(1)),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        (),
        id="wedged(deferred)+flat=wedged(no-repeat)",
    ),
    pytest.param(
        "wedged_deferred",
        scraped(80, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="wedged(deferred)+progress=ok",
    ),
    pytest.param(
        "wedged_deferred",
        scraped(80, busy(0)),
        K0,
        S.OK,
        None,
        (),
        id="wedged(deferred)+counters-backwards=ok",
    ),
    pytest.param(
        "wedged_deferred",
        failed(80),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        (),
        id="wedged(deferred)+failure=still-wedged(same-episode)",
    ),
    # admission stall
    pytest.param(
        "suspect_admission",
        scraped(70, unadmitted(1)),
        K0,
        S.WEDGED,
        F.ADMISSION_STALL,
        wedged(F.ADMISSION_STALL),
        id="suspect(admission)+flat-60s=wedged",
    ),
    pytest.param(
        "suspect_admission",
        scraped(30, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(admission)+progress=ok",
    ),
    # progress stall
    pytest.param(
        "suspect_progress",
        scraped(129, busy(1)),
        K0,
        S.SUSPECT,
        F.PROGRESS_STALL,
        (),
        id="suspect(progress)+flat-119s=suspect",
    ),
    pytest.param(
        "suspect_progress",
        scraped(130, busy(1)),
        K0,
        S.WEDGED,
        F.PROGRESS_STALL,
        wedged(F.PROGRESS_STALL),
        id="suspect(progress)+flat-120s=wedged",
    ),
    pytest.param(
        "suspect_progress",
        scraped(70, unadmitted(1)),
        K0,
        S.WEDGED,
        F.ADMISSION_STALL,
        wedged(F.ADMISSION_STALL),
        id="suspect(progress)+running-drops-flat-60s=wedged(admission,clock-kept)",
    ),
    pytest.param(
        "suspect_progress",
        scraped(30, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(progress)+progress=ok",
    ),
    pytest.param(
        "wedged_progress",
        scraped(140, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="wedged(progress)+progress=ok",
    ),
    pytest.param(
        "wedged_progress",
        scraped(140, busy(1)),
        K0,
        S.WEDGED,
        F.PROGRESS_STALL,
        (),
        id="wedged(progress)+flat=wedged(no-repeat)",
    ),
    # output stall
    pytest.param(
        "suspect_output",
        scraped(309, livelock(1, preempt=5)),
        K0,
        S.SUSPECT,
        F.OUTPUT_STALL,
        (),
        id="suspect(output)+preemptions-299s=suspect",
    ),
    pytest.param(
        "suspect_output",
        scraped(310, livelock(1, preempt=5)),
        K0,
        S.WEDGED,
        F.OUTPUT_STALL,
        wedged(F.OUTPUT_STALL),
        id="suspect(output)+preemptions-300s=wedged",
    ),
    pytest.param(
        "suspect_output",
        scraped(100, livelock(1, preempt=2)),
        K0,
        S.SUSPECT,
        F.OUTPUT_STALL,
        (),
        id="suspect(output)+flat=suspect(output,sticky)",
    ),
    pytest.param(
        "suspect_output", scraped(30, busy(2)), K0, S.OK, None, (), id="suspect(output)+output=ok"
    ),
    pytest.param(
        "wedged_output", scraped(320, busy(2)), K0, S.OK, None, (), id="wedged(output)+output=ok"
    ),
    # unreachable
    pytest.param(
        "suspect_unreachable",
        failed(49),
        K0,
        S.SUSPECT,
        F.UNREACHABLE,
        (),
        id="suspect(unreachable)+failure-29s=suspect",
    ),
    pytest.param(
        "suspect_unreachable",
        failed(50, "refused"),
        K0,
        S.UNREACHABLE,
        F.UNREACHABLE,
        wedged(F.UNREACHABLE),
        id="suspect(unreachable)+failure-30s=unreachable",
    ),
    pytest.param(
        "suspect_unreachable",
        scraped(30, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(unreachable)+progress=ok",
    ),
    pytest.param(
        "suspect_unreachable",
        scraped(140, busy(1)),
        K0,
        S.WEDGED,
        F.PROGRESS_STALL,
        wedged(F.PROGRESS_STALL),
        id="suspect(unreachable)+flat-through-outage=wedged",
    ),
    pytest.param(
        "unreachable",
        failed(60),
        K0,
        S.UNREACHABLE,
        F.UNREACHABLE,
        (),
        id="unreachable+failure=unreachable(no-repeat)",
    ),
    pytest.param(
        "unreachable", scraped(60, busy(2)), K0, S.OK, None, (), id="unreachable+progress=ok"
    ),
    pytest.param(
        "unreachable",
        scraped(60, busy(0)),
        K0,
        S.OK,
        None,
        (),
        id="unreachable+restarted-server=ok",
    ),
    pytest.param(
        "unreachable",
        scraped(140, busy(1)),
        K0,
        S.WEDGED,
        F.PROGRESS_STALL,
        (),
        id="unreachable+flat-through-outage=wedged(same-episode)",
    ),
    # data parallel: per-engine judgement, missing and new engines
    pytest.param(
        "dp_ok",
        scraped(20, busy(2)),
        K1,
        S.SUSPECT,
        F.UNREACHABLE,
        (),  # no capture at the first suspect sample (A1)
        id="dp+engine1-disappears=suspect(unreachable)",
    ),
    pytest.param(
        "dp_missing",
        scraped(49, busy(3)),
        K1,
        S.SUSPECT,
        F.UNREACHABLE,
        (),
        id="dp-missing+29s=suspect",
    ),
    pytest.param(
        "dp_missing",
        scraped(50, busy(3)),
        K1,
        S.UNREACHABLE,
        F.UNREACHABLE,
        wedged(F.UNREACHABLE, K1),
        id="dp-missing+30s=unreachable",
    ),
    pytest.param(
        "dp_missing",
        scraped(30, busy(3), stuck(1, K1)),
        K1,
        S.OK,
        None,
        (),
        id="dp-missing+reappears=ok(baseline)",
    ),
    pytest.param(
        "dp_missing",
        failed(30),
        K1,
        S.SUSPECT,
        F.UNREACHABLE,
        (),  # engine 0 enters suspect, stalled 0 s: its capture waits (A1)
        id="dp-missing+failure=suspect(engine0-enters-suspect)",
    ),
    pytest.param(
        "dp_missing",
        failed(50),
        K1,
        S.UNREACHABLE,
        F.UNREACHABLE,
        wedged(F.UNREACHABLE, K1),
        id="dp-missing+failure-30s-after-vanishing=unreachable",
    ),
    pytest.param(
        "dp_failing",
        scraped(49, busy(2)),
        K1,
        S.SUSPECT,
        F.UNREACHABLE,
        (),
        id="dp-failing+back-without-engine1-29s=suspect",
    ),
    pytest.param(
        "dp_failing",
        scraped(50, busy(2)),
        K1,
        S.UNREACHABLE,
        F.UNREACHABLE,
        wedged(F.UNREACHABLE, K1),
        id="dp-failing+back-without-engine1-30s=unreachable(clock-from-outage)",
    ),
    pytest.param(
        "dp_engine1_suspect",
        scraped(80, busy(8), stuck(1, K1)),
        K1,
        S.WEDGED,
        F.DEFERRED_STALL,
        wedged(F.DEFERRED_STALL, K1),
        id="dp+engine1-flat-60s=wedged(engine0-unaffected)",
    ),
    pytest.param(
        "dp_engine1_suspect",
        scraped(30, busy(3), stuck(0, K1)),
        K1,
        S.OK,
        None,
        (),
        id="dp+one-engine-backwards=target-restart(rebaseline-all)",
    ),
    pytest.param(
        "ok",
        scraped(20, busy(2), busy(0, K1)),
        K1,
        S.OK,
        None,
        (),
        id="ok+new-engine=ok(added)",
    ),
    # aborted and errored finishes are neither progress nor output
    pytest.param(
        "ok",
        scraped(20, aborting(1, aborts=3)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),
        id="ok+only-aborts-move=suspect(deferred)",
    ),
    pytest.param(
        "ok",
        scraped(20, aborting(1, aborts=3, reason="error")),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),
        id="ok+only-errors-move=suspect(deferred)",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(70, aborting(1, aborts=40)),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        wedged(F.DEFERRED_STALL),
        id="suspect(deferred)+aborts-60s=wedged",
    ),
    pytest.param(
        "ok",
        scraped(
            20,
            reading(
                running=2,
                waiting=1,
                deferred=0,
                prompt=100,
                gen=50,
                iters=10,
                finished={"stop": 2, "abort": 0},
            ),
        ),
        K0,
        S.OK,
        None,
        (),
        id="ok+a-stop-finish=ok",
    ),
    pytest.param(
        "ok",
        scraped(
            20,
            reading(
                running=2,
                waiting=1,
                deferred=0,
                prompt=100,
                gen=50,
                iters=10,
                preempt=1,
                finished={"stop": 1, "abort": 9},
            ),
        ),
        K0,
        S.SUSPECT,
        F.OUTPUT_STALL,
        (),
        id="ok+preemptions-and-aborts=suspect(output,aborts-not-output)",
    ),
    # prefill progress: KV usage growth or prefix-cache queries while running > 0
    pytest.param(
        "ok",
        scraped(20, prefilling(1, 0.5)),
        K0,
        S.OK,
        None,
        (),
        id="ok+kv-grows-running=ok(prefill)",
    ),
    pytest.param(
        "prefilling",
        scraped(30, prefilling(1, 0.35)),
        K0,
        S.SUSPECT,
        F.PROGRESS_STALL,
        (),
        id="prefilling+kv-flat=suspect(progress,clock-from-last-growth)",
    ),
    pytest.param(
        "prefilling",
        scraped(145, prefilling(1, 0.35)),
        K0,
        S.WEDGED,
        F.PROGRESS_STALL,
        wedged(F.PROGRESS_STALL),
        id="prefilling+kv-flat-120s=wedged(progress)",
    ),
    pytest.param(
        "suspect_progress",
        scraped(129, prefilling(1, 0.9)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(progress)+kv-grows=ok",
    ),
    pytest.param(
        "ok",
        scraped(20, prefilling(1, 0.20)),
        K0,
        S.SUSPECT,
        F.PROGRESS_STALL,
        (),
        id="ok+kv-shrinks=suspect(progress)",
    ),
    pytest.param(
        "ok",
        scraped(
            20,
            reading(
                running=0, waiting=3, deferred=2, prompt=100, gen=50, success=1, iters=10, kv=0.9
            ),
        ),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),
        id="ok+kv-grows-running-0=suspect(deferred,never-prefill)",
    ),
    pytest.param(
        "prefilling",
        scraped(30, prefilling(1, 0.35, prefix=4096)),
        K0,
        S.SUSPECT,
        F.PROGRESS_STALL,
        (),
        id="prefilling+prefix-queries-appear=suspect(no-base-to-compare)",
    ),
    pytest.param(
        "ok",
        scraped(
            20,
            reading(
                running=0,
                waiting=3,
                deferred=0,
                prompt=100,
                gen=50,
                success=1,
                iters=10,
                prefix=8192,
            ),
        ),
        K0,
        S.SUSPECT,
        F.ADMISSION_STALL,
        (),
        id="ok+prefix-queries-running-0=suspect(admission,never-prefill)",
    ),
    pytest.param(
        "suspect_output",
        scraped(
            310,
            reading(
                running=2,
                waiting=1,
                deferred=0,
                prompt=100,
                gen=50,
                success=1,
                preempt=2,
                iters=10,
                kv=0.99,
            ),
        ),
        K0,
        S.WEDGED,
        F.OUTPUT_STALL,
        wedged(F.OUTPUT_STALL),
        id="suspect(output)+kv-grows-no-output-300s=wedged(prefill-never-output)",
    ),
    # deferred only (capacity 0): its own family and threshold
    pytest.param(
        "ok",
        scraped(20, deferred_only(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_ONLY_STALL,
        (),
        id="ok+flat-deferred-only=suspect(deferred_only)",
    ),
    pytest.param(
        "suspect_deferred_only",
        scraped(70, deferred_only(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_ONLY_STALL,
        (),
        id="suspect(deferred_only)+60s=suspect(not-stall_after)",
    ),
    pytest.param(
        "suspect_deferred_only",
        scraped(160, deferred_only(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_ONLY_STALL,
        suspect(F.DEFERRED_ONLY_STALL),
        id="suspect(deferred_only)+150s=suspect(capture-at-quarter)",
    ),
    pytest.param(
        "suspect_deferred_only",
        scraped(609, deferred_only(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_ONLY_STALL,
        suspect(F.DEFERRED_ONLY_STALL),
        id="suspect(deferred_only)+599s=suspect",
    ),
    pytest.param(
        "suspect_deferred_only",
        scraped(610, deferred_only(1)),
        K0,
        S.WEDGED,
        F.DEFERRED_ONLY_STALL,
        wedged(F.DEFERRED_ONLY_STALL),
        id="suspect(deferred_only)+600s=wedged(deferred_only)",
    ),
    pytest.param(
        "suspect_deferred_only",
        scraped(500, stuck(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        (),
        id="suspect(deferred_only)+capacity-head-arrives=suspect(deferred,clock-restarts)",
    ),
    pytest.param(
        "suspect_deferred_only",
        scraped(500, busy(2)),
        K0,
        S.OK,
        None,
        (),
        id="suspect(deferred_only)+progress=ok",
    ),
    # non-finite readings: unknown, neither work nor idle
    pytest.param(
        "ok", scraped(20, nan_gauges(1)), K0, S.UNKNOWN, None, (), id="ok+nan-running=unknown"
    ),
    pytest.param(
        "ok",
        scraped(20, nan_gauges(1, running=2, waiting=math.inf)),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="ok+inf-waiting=unknown",
    ),
    pytest.param(
        "ok",
        scraped(20, nan_gauges(1, running=0, waiting=0, deferred=None, gen=math.nan)),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="ok+nan-counter-no-work=unknown(not-idle)",
    ),
    pytest.param(
        "ok",
        scraped(20, nan_gauges(1, awake=False)),
        K0,
        S.SLEEPING,
        None,
        (),
        id="ok+nan-gauge-asleep=sleeping",
    ),
    pytest.param(
        "suspect_deferred",
        scraped(40, nan_gauges(1)),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="suspect(deferred)+nan=unknown",
    ),
    pytest.param(
        "wedged_deferred",
        scraped(80, nan_gauges(1)),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        (),
        id="wedged(deferred)+nan-flat=still-wedged(no-repeat)",
    ),
    pytest.param(
        "wedged_deferred",
        scraped(80, nan_gauges(2)),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="wedged(deferred)+nan-counters-moved=unknown",
    ),
    pytest.param("unknown", scraped(30, busy(2)), K0, S.OK, None, (), id="unknown+progress=ok"),
    pytest.param(
        "unknown",
        scraped(30, stuck(1)),
        K0,
        S.SUSPECT,
        F.DEFERRED_STALL,
        suspect(F.DEFERRED_STALL),
        id="unknown+flat=suspect(clock-kept-through-unknown)",
    ),
    pytest.param(
        "unknown",
        scraped(70, stuck(1)),
        K0,
        S.WEDGED,
        F.DEFERRED_STALL,
        wedged(F.DEFERRED_STALL),
        id="unknown+flat-60s-since-progress=wedged",
    ),
    pytest.param("unknown", scraped(30, idle(1)), K0, S.IDLE, None, (), id="unknown+idle=idle"),
    pytest.param(
        "ok_started",
        scraped(20, busy(2), start=math.nan),
        K0,
        S.OK,
        None,
        (),
        id="ok+nan-process-start=ok(not-a-restart)",
    ),
    # more than one server behind the URL
    pytest.param(
        "two_servers",
        scraped(20, busy(0), start=1000.0),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="two-servers+start-time-returns=unknown(multi-server)",
    ),
    pytest.param(
        "multi_server",
        scraped(30, stuck(0), start=2000.0),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="multi-server+flat-or-backwards=unknown(never-restart)",
    ),
    pytest.param(
        "multi_server",
        scraped(300, stuck(1), start=1000.0),
        K0,
        S.UNKNOWN,
        None,
        (),
        id="multi-server+other-seen-within-300s=unknown",
    ),
    pytest.param(
        "multi_server",
        scraped(400, stuck(1), start=1000.0),
        K0,
        S.OK,
        None,
        (),
        id="multi-server+one-start-time-for-300s=ok(baseline)",
    ),
    pytest.param(
        "ok_started",
        scraped(20, busy(2), start=3000.0),
        K0,
        S.OK,
        None,
        (),
        id="ok+new-start-time=ok(restart-not-multi-server)",
    ),
]


@pytest.mark.parametrize(("prelude", "observation", "key", "state", "family", "actions"), TABLE)
def test_transition_table(
    *,
    prelude: str,
    observation: Observation,
    key: EngineKey,
    state: EngineState,
    family: Family | None,
    actions: tuple[Action, ...],
) -> None:
    """Each row: from a known state, one observation yields the engine state, family and actions."""
    before, verdicts = run(PRELUDES[prelude])
    after, verdict = step(before, observation, POLICY)
    judged = engine(verdict, key)
    assert (judged.state, judged.family) == (state, family)
    assert verdict.actions == actions
    # A transition is listed exactly when the state changed.
    old = engine(verdicts[-1], key).state if verdicts and _has(verdicts[-1], key) else S.STARTING
    if verdict.at < (verdicts[-1].at if verdicts else verdict.at):
        old = S.STARTING  # the clock went backwards: the detector started over
    mine = [t for t in verdict.transitions if t.key == key]
    expected = [] if old is state else [Transition(key, old, state, family, observation.at)]
    assert mine == expected
    assert verdict.failure == (observation if isinstance(observation, ScrapeFailed) else None)
    assert load_state(dump_state(after)) == after


def _has(verdict: TargetVerdict, key: EngineKey) -> bool:
    return any(e.key == key for e in verdict.engines)


def test_dp_server_judges_each_engine_and_reports_the_worst() -> None:
    """A DP server with engine 1 wedged and engine 0 healthy: per-engine verdicts, target wedged."""
    _, verdicts = run([*PRELUDES["dp_engine1_suspect"], scraped(80, busy(8), stuck(1, K1))])
    last = verdicts[-1]
    assert engine(last, K0).state is S.OK
    assert engine(last, K1).state is S.WEDGED
    assert last.state is S.WEDGED
    assert [e.key for e in last.engines] == [K0, K1]


def test_missing_engine_is_reported_not_dropped() -> None:
    """An engine absent from /metrics stays in the verdict, marked missing, with a clear reason."""
    _, verdicts = run(PRELUDES["dp_missing"])
    gone = engine(verdicts[-1], K1)
    assert gone.missing
    assert gone.reading is None
    assert gone.reason == (
        f"engine 1 of model {MODEL} disappeared from /metrics, unseen for 8s (threshold 30s)"
    )
    assert not engine(verdicts[-1], K0).missing


def test_restart_drops_engines_absent_from_the_new_server() -> None:
    """After a restart (counters backwards) engines the new server does not report are forgotten."""
    state, verdicts = run([*PRELUDES["dp_ok"], scraped(20, busy(0))])
    assert [e.key for e in verdicts[-1].engines] == [K0]
    assert [m.key for m in state.engines] == [K0]
    assert engine(verdicts[-1]).reason.startswith(
        f"server restarted (prompt tokens of engine 0 of model {MODEL} went backwards "
        "from 100 to 0)"
    )


# --------------------------------------------------------------------------------------------
# Target level: no engine known yet


@pytest.mark.parametrize(
    ("policy", "observations", "expected"),
    [
        pytest.param(POLICY, [failed(0)], S.STARTING, id="first-failure=starting"),
        pytest.param(
            POLICY, [failed(0), failed(10_000)], S.STARTING, id="no-timeout=starting-forever"
        ),
        pytest.param(
            DetectionPolicy(startup_timeout_seconds=100),
            [failed(0), failed(99)],
            S.STARTING,
            id="timeout-99s",
        ),
        pytest.param(
            DetectionPolicy(startup_timeout_seconds=100),
            [failed(0), failed(100)],
            S.UNREACHABLE,
            id="timeout-100s=unreachable",
        ),
        pytest.param(
            DetectionPolicy(startup_timeout_seconds=100),
            [scraped(0), failed(50), scraped(100)],
            S.UNREACHABLE,
            id="no-engines-reported=never-up",
        ),
        pytest.param(POLICY, [scraped(0)], S.STARTING, id="good-scrape-without-engines=starting"),
    ],
)
def test_target_without_engines(
    policy: DetectionPolicy, observations: list[Observation], expected: EngineState
) -> None:
    """A target never seen up reports no engines, STARTING or UNREACHABLE after startup timeout."""
    _, verdicts = run(observations, policy)
    last = verdicts[-1]
    assert last.state is expected
    assert last.engines == ()
    assert last.transitions == ()
    assert last.actions == ()
    assert last.failure == (
        observations[-1] if isinstance(observations[-1], ScrapeFailed) else None
    )


def test_startup_timeout_then_engines_come_up() -> None:
    """A target that timed out starting becomes OK as soon as it reports engines."""
    policy = DetectionPolicy(startup_timeout_seconds=10)
    _, verdicts = run([failed(0), failed(20), scraped(30, busy(0))], policy)
    assert [v.state for v in verdicts] == [S.STARTING, S.UNREACHABLE, S.OK]
    assert verdicts[-1].transitions == (Transition(K0, S.STARTING, S.OK, None, 30),)


def test_failure_after_seen_up_never_looks_like_starting_or_idle() -> None:
    """Once seen up, failures make an idle engine SUSPECT then UNREACHABLE, never idle."""
    _, verdicts = run([scraped(0, idle(0)), failed(10), failed(39), failed(40)])
    assert [(v.state, engine(v).family) for v in verdicts] == [
        (S.IDLE, None),
        (S.SUSPECT, F.UNREACHABLE),
        (S.SUSPECT, F.UNREACHABLE),
        (S.UNREACHABLE, F.UNREACHABLE),
    ]
    assert engine(verdicts[-1]).reason == (
        "no good scrape of /metrics (last failure: timeout: read timed out after 5s) "
        "for 30s (threshold 30s)"
    )
    assert engine(verdicts[-1]).stalled_seconds == 30


@pytest.mark.parametrize(
    ("history", "states", "worst"),
    [
        pytest.param(
            [scraped(0, idle(0), asleep(0, K1))],
            (S.IDLE, S.SLEEPING),
            S.SLEEPING,
            id="sleeping>idle",
        ),
        pytest.param(
            [scraped(0, busy(0), asleep(0, K1))], (S.OK, S.SLEEPING), S.OK, id="ok>sleeping"
        ),
        pytest.param(
            [scraped(0, busy(0), stuck(0, K1)), scraped(10, busy(1), stuck(0, K1))],
            (S.OK, S.SUSPECT),
            S.SUSPECT,
            id="suspect>ok",
        ),
        pytest.param(
            [scraped(0, busy(0), busy(0, K1)), scraped(10, busy(0)), scraped(40, busy(0))],
            (S.SUSPECT, S.UNREACHABLE),
            S.UNREACHABLE,
            id="unreachable>suspect",
        ),
        pytest.param(
            [scraped(0, stuck(0), busy(0, K1)), scraped(30, stuck(0)), scraped(60, stuck(0))],
            (S.WEDGED, S.UNREACHABLE),
            S.WEDGED,
            id="wedged>unreachable",
        ),
        pytest.param(
            [scraped(0, busy(0), busy(0, K1)), scraped(10, busy(0), nan_gauges(1, K1))],
            (S.SUSPECT, S.UNKNOWN),
            S.UNKNOWN,
            id="unknown>suspect",
        ),
        pytest.param(
            [scraped(0, busy(0), busy(0, K1)), scraped(10, busy(0)), scraped(40, nan_gauges(1))],
            (S.UNKNOWN, S.UNREACHABLE),
            S.UNREACHABLE,
            id="unreachable>unknown",
        ),
    ],
)
def test_target_state_is_the_worst_engine(
    history: list[Observation], states: tuple[EngineState, EngineState], worst: EngineState
) -> None:
    """The documented severity order decides the target state of a DP server."""
    assert SEVERITY == (
        S.WEDGED,
        S.UNREACHABLE,
        S.UNKNOWN,
        S.SUSPECT,
        S.STARTING,
        S.OK,
        S.SLEEPING,
        S.IDLE,
    )
    _, verdicts = run(history)
    assert (engine(verdicts[-1], K0).state, engine(verdicts[-1], K1).state) == states
    assert verdicts[-1].state is worst


# --------------------------------------------------------------------------------------------
# Scenarios on a fake time axis (1 s steps)


def states_of(verdicts: Sequence[TargetVerdict], key: EngineKey = K0) -> list[EngineState]:
    """The state of one engine at every step."""
    return [engine(v, key).state for v in verdicts]


def actions_at(verdicts: Sequence[TargetVerdict]) -> dict[float, tuple[Action, ...]]:
    """The steps that emitted actions, by time."""
    return {v.at: v.actions for v in verdicts if v.actions}


def test_deferred_wedge_suspect_at_first_flat_sample_wedged_exactly_at_threshold() -> None:
    """OK while busy, SUSPECT at the first flat sample (captured at 15 s), WEDGED at 60 s."""
    history: list[Observation] = [scraped(t, busy(t)) for t in range(11)]  # progress until t=10
    history += [scraped(t, stuck(10)) for t in range(11, 101)]
    _, verdicts = run(history)
    states = states_of(verdicts)
    assert states[:11] == [S.OK] * 11
    assert states[11:70] == [S.SUSPECT] * 59  # t=11..69: stalled 1..59 s
    assert states[70:] == [S.WEDGED] * 31  # t=70: stalled 60 s, not one sample earlier
    assert engine(verdicts[69]).stalled_seconds == 59
    assert engine(verdicts[70]).stalled_seconds == 60
    assert engine(verdicts[70]).family is F.DEFERRED_STALL
    assert engine(verdicts[70]).last_progress_at == 10
    assert engine(verdicts[70]).since_at == 70
    # A1: the suspect capture waits for a quarter of the threshold (15 s), not the first sample.
    assert actions_at(verdicts) == {25: suspect(F.DEFERRED_STALL), 70: wedged(F.DEFERRED_STALL)}
    assert engine(verdicts[52]).reason == (
        "running 0, waiting 3 (deferred 2, capacity 1), no progress for 42s (threshold 60s)"
    )


def test_long_prefill_never_wedges_under_the_hang_threshold() -> None:
    """running>0 with flat counters for 100 s, then progress: SUSPECT at most, back to OK."""
    history: list[Observation] = [scraped(0, busy(0))]
    history += [scraped(t, busy(0)) for t in range(1, 101)]
    history += [scraped(101, busy(1))]
    _, verdicts = run(history)
    states = states_of(verdicts)
    assert S.WEDGED not in states
    assert states[1:101] == [S.SUSPECT] * 100
    assert states[-1] is S.OK
    assert actions_at(verdicts) == {30: suspect(F.PROGRESS_STALL)}


def test_preemption_livelock_is_an_output_stall_after_300s() -> None:
    """Preemptions rising, prompt flat or rising, no output: output_stall, wedged at 300 s."""
    history: list[Observation] = [scraped(0, busy(0))]
    for t in range(1, 331):
        prompt_steps = t // 2  # prompt tokens move every other sample
        history.append(
            scraped(
                t,
                reading(running=4, waiting=2, deferred=0, prompt=prompt_steps, preempt=3 * t),
            )
        )
    _, verdicts = run(history)
    families = {engine(v).family for v in verdicts[1:]}
    assert families == {F.OUTPUT_STALL}  # never a progress stall although hang is 120 s
    states = states_of(verdicts)
    assert states[1:300] == [S.SUSPECT] * 299
    assert states[300:] == [S.WEDGED] * 31
    assert engine(verdicts[300]).stalled_seconds == 300
    assert actions_at(verdicts) == {75: suspect(F.OUTPUT_STALL), 300: wedged(F.OUTPUT_STALL)}


def test_frozen_metrics_with_running_requests_is_a_progress_stall_after_120s() -> None:
    """Every vLLM value frozen with running>0 (a GPU hang): progress_stall, wedged at 120 s."""
    frozen = busy(7)
    history: list[Observation] = [scraped(0, busy(6))] + [scraped(t, frozen) for t in range(1, 200)]
    _, verdicts = run(history)
    states = states_of(verdicts)
    assert states[0] is S.OK
    assert states[1] is S.OK  # the counters moved from busy(6) to busy(7) at t=1
    assert states[2:121] == [S.SUSPECT] * 119
    assert states[121:] == [S.WEDGED] * 79
    assert engine(verdicts[121]).family is F.PROGRESS_STALL


def test_healthy_engine_whose_counters_all_move_never_becomes_suspect() -> None:
    """A busy engine with every counter moving each sample stays OK for an hour."""
    _, verdicts = run([scraped(t, busy(t)) for t in range(3600)])
    assert set(states_of(verdicts)) == {S.OK}
    assert all(v.actions == () for v in verdicts)


def test_new_episode_after_recovery_emits_actions_again() -> None:
    """A wedge, a server restart, then a second wedge: each episode asks for its own actions."""
    history: list[Observation] = [scraped(0, busy(5)), scraped(10, stuck(5))]
    history += [scraped(20, stuck(5)), scraped(70, stuck(5)), scraped(80, busy(0))]
    history += [scraped(90, stuck(0)), scraped(100, stuck(0)), scraped(150, stuck(0))]
    _, verdicts = run(history)
    first, second = [S.OK, S.SUSPECT, S.SUSPECT, S.WEDGED], [S.OK, S.SUSPECT, S.SUSPECT, S.WEDGED]
    assert states_of(verdicts) == [*first, *second]
    assert actions_at(verdicts) == {
        20: suspect(F.DEFERRED_STALL),
        70: wedged(F.DEFERRED_STALL),
        100: suspect(F.DEFERRED_STALL),
        150: wedged(F.DEFERRED_STALL),
    }


def test_stall_through_an_outage_counts_the_outage() -> None:
    """A stall that persists across failed scrapes includes the outage in stalled_seconds."""
    history = [
        scraped(0, busy(1)),
        scraped(10, stuck(1)),
        failed(20),
        failed(40),
        scraped(45, stuck(1)),
    ]
    _, verdicts = run(history)
    last = engine(verdicts[-1])
    assert (last.state, last.family, last.stalled_seconds) == (S.SUSPECT, F.DEFERRED_STALL, 45)
    # One episode from t=10 on; the run of failures lasted 20 s < 30 s, so no restart. The
    # suspect capture came at t=40, when the (unreachable) stall had lasted 20 s >= 30 s / 4.
    assert actions_at(verdicts) == {40: suspect(F.UNREACHABLE)}


def test_two_wedged_engines_capture_both_before_any_restart() -> None:
    """When two engines wedge in one step, every capture precedes every restart."""
    history = [
        scraped(0, busy(1), busy(1, K1)),
        scraped(60, stuck(1), stuck(1, K1)),
    ]
    _, verdicts = run(history)
    assert verdicts[-1].actions == (
        CaptureEvidence(K0, F.DEFERRED_STALL, "wedged"),
        CaptureEvidence(K1, F.DEFERRED_STALL, "wedged"),
        Restart(K0, F.DEFERRED_STALL),
        Restart(K1, F.DEFERRED_STALL),
    )


@pytest.mark.parametrize(
    ("observation", "reason"),
    [
        pytest.param(
            scraped(20, busy(2)),
            "running 2, waiting 1 (deferred 0, capacity 1), progressing",
            id="ok",
        ),
        pytest.param(scraped(20, idle(1)), "idle, nothing running or waiting", id="idle"),
        pytest.param(
            scraped(20, asleep(1)),
            "asleep, stall detection paused (running 0, waiting 3 (deferred 0, capacity 3))",
            id="sleeping",
        ),
        pytest.param(
            scraped(12.5, reading(running=1, waiting=2, prompt=100, gen=50, success=1, iters=10)),
            "running 1, waiting 2, no progress for 2.5s (threshold 120s)",
            id="progress-stall-old-vllm",
        ),
        pytest.param(
            scraped(20, livelock(1, preempt=4)),
            "running 2, waiting 1 (deferred 0, capacity 1), counters move but no output "
            "(generation tokens, completed requests) for 10s (threshold 300s)",
            id="output-stall",
        ),
        pytest.param(
            scraped(20, busy(0), start=5.0),
            "server restarted (prompt tokens of engine 0 of model org/model-7b went backwards "
            "from 100 to 0); new baseline: running 2, waiting 1 (deferred 0, capacity 1)",
            id="restart",
        ),
    ],
)
def test_reasons_are_short_human_sentences(observation: Observation, reason: str) -> None:
    """The reason says what the engine does, with the numbers that decided the verdict."""
    before, _ = run([scraped(0, busy(0)), scraped(10, busy(1))])
    _, verdict = step(before, observation, POLICY)
    assert engine(verdict).reason == reason


def test_process_start_time_change_is_a_restart_even_when_counters_climbed_past() -> None:
    """A new process_start_time_seconds re-baselines although every counter is higher."""
    history = [scraped(0, stuck(1), start=100.0), scraped(50, stuck(1), start=100.0)]
    history.append(scraped(70, stuck(9), start=200.0))
    history.append(scraped(71, stuck(9), start=200.0))
    _, verdicts = run(history)
    assert states_of(verdicts) == [S.OK, S.SUSPECT, S.OK, S.SUSPECT]
    assert engine(verdicts[-1]).stalled_seconds == 1
    assert "process start time changed from 100 to 200" in engine(verdicts[2]).reason


def test_step_is_deterministic_and_does_not_mutate_its_input() -> None:
    """The same state and observation always give the same result; the input state is untouched."""
    state, _ = run(PRELUDES["suspect_deferred"])
    snapshot = dump_state(state)
    first = step(state, scraped(70, stuck(1)), POLICY)
    second = step(state, scraped(70, stuck(1)), POLICY)
    assert first == second
    assert dump_state(state) == snapshot


# --------------------------------------------------------------------------------------------
# Input validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {"stall_after_seconds": -1.0}, "stall_after_seconds must be finite and >= 0", id="neg"
        ),
        pytest.param(
            {"hang_after_seconds": math.nan}, "hang_after_seconds must be finite", id="nan"
        ),
        pytest.param(
            {"unreachable_after_seconds": math.inf},
            "unreachable_after_seconds must be finite",
            id="inf",
        ),
        pytest.param(
            {"startup_timeout_seconds": -5.0}, "startup_timeout_seconds must be", id="startup"
        ),
        pytest.param(
            {"output_stall_after_seconds": True}, "must be a number of seconds", id="bool"
        ),
    ],
)
def test_policy_rejects_bad_thresholds(kwargs: dict[str, Any], message: str) -> None:
    """A negative, NaN, infinite or boolean threshold is a configuration error, named."""
    with pytest.raises(ValueError, match=message):
        DetectionPolicy(**kwargs)


def test_scrape_failed_rejects_unknown_reason() -> None:
    """The failure reasons are a closed set."""
    with pytest.raises(ValueError, match=r"ScrapeFailed\.reason must be one of"):
        ScrapeFailed(1.0, "exploded", "boom")  # type: ignore[arg-type]


def test_step_rejects_non_finite_time() -> None:
    """`at` must be a finite monotonic time."""
    with pytest.raises(ValueError, match=r"observation\.at must be finite"):
        step(new_state(), failed(math.nan), POLICY)


# --------------------------------------------------------------------------------------------
# dump_state / load_state


def test_dump_load_round_trips_a_rich_state_through_json() -> None:
    """A state with DP engines, a missing engine, a failure run and an episode survives JSON."""
    history = [
        *PRELUDES["dp_engine1_suspect"],
        scraped(80, busy(8), stuck(1, K1), start=12.5),
        scraped(90, busy(9)),
        failed(95),
    ]
    state, _ = run(history)
    assert state.failing_since == 95
    assert any(m.missing_since is not None for m in state.engines)
    assert any(m.acted for m in state.engines)
    text = json.dumps(dump_state(state), allow_nan=False)
    restored = load_state(json.loads(text))
    assert restored == state
    # The restored state behaves identically.
    assert step(restored, scraped(200, busy(10)), POLICY) == step(
        state, scraped(200, busy(10)), POLICY
    )


def test_a_secret_in_the_model_name_is_never_written_and_the_engine_is_still_matched() -> None:
    """#21: the state keeps the redacted model name; after a restart of wedgewatch the live
    engine (raw name from /metrics) is matched by that form, so the wedge is remembered."""
    hostile = EngineKey("m http://PLANTEDtok@h/?apikey=PLANTEDq", "0")
    state, _ = run(
        [scraped(0, busy(1, hostile)), *(scraped(t, stuck(2, hostile)) for t in (10, 80))]
    )
    assert state.engines[0].state is S.WEDGED
    text = json.dumps(dump_state(state), allow_nan=False)
    assert "PLANTED" not in text
    restored = load_state(json.loads(text))
    assert restored.engines[0].key != hostile  # the redacted form
    after, verdict = step(restored, scraped(90, stuck(2, hostile)), POLICY)
    assert [m.key for m in after.engines] == [hostile]
    assert verdict.engines[0].state is S.WEDGED, verdict  # not a fresh baseline
    assert after.engines[0].acted  # no second capture or restart
    assert step(restored, scraped(90, stuck(2, hostile)), POLICY)[1].engines[0].key == hostile


def test_initial_state_round_trips() -> None:
    """The empty state survives dump and load and equals `TargetState.initial()`."""
    assert load_state(dump_state(TargetState.initial())) == new_state()


def _valid_dump() -> dict[str, Any]:
    state, _ = run(PRELUDES["dp_engine1_suspect"])
    return json.loads(json.dumps(dump_state(state)))  # type: ignore[no-any-return]


def _malformed(edit: str) -> dict[str, Any]:
    data = _valid_dump()
    e0 = data["engines"][0]
    e1 = data["engines"][1]
    if edit == "version":
        data["version"] = 99
    elif edit == "not-a-list":
        data["engines"] = {"0": e0}
    elif edit == "missing-key":
        del e0["last_output_at"]
    elif edit == "unknown-key":
        data["colour"] = "blue"
    elif edit == "bad-state":
        e0["state"] = "napping"
    elif edit == "starting-engine":
        e0["state"] = "starting"
    elif edit == "family-without-stall":
        e0["family"] = "deferred_stall"
    elif edit == "stall-without-family":
        e1["family"] = None
    elif edit == "bool-as-number":
        e0["since_at"] = True
    elif edit == "string-as-number":
        e1["reading"]["running"] = "3"
    elif edit == "unsorted":
        data["engines"] = [e1, e0]
    elif edit == "duplicate":
        data["engines"] = [e0, e0]
    elif edit == "awake":
        e0["reading"]["awake"] = "yes"
    elif edit == "by-reason":
        e0["reading"]["waiting_by_reason"] = [1, 2]
    elif edit == "engine-not-object":
        data["engines"][0] = "engine 0"
    return data


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("version", r"state.version: expected 2, got 99"),
        ("not-a-list", r"state.engines: expected a list, got dict"),
        ("missing-key", r"state.engines\[0\]: missing key 'last_output_at'"),
        ("unknown-key", r"state: unknown key\(s\) 'colour'"),
        ("bad-state", r"state.engines\[0\].state: expected one of starting, ok, .*got 'napping'"),
        ("starting-engine", r"state.engines\[0\].state: an engine is never 'starting'"),
        (
            "family-without-stall",
            r"state.engines\[0\].family: 'deferred_stall' does not fit state 'ok'",
        ),
        ("stall-without-family", r"state.engines\[1\].family: None does not fit state 'suspect'"),
        ("bool-as-number", r"state.engines\[0\].since_at: expected a finite number, got True"),
        ("string-as-number", r"state.engines\[1\].reading.running: expected a number, got '3'"),
        ("unsorted", r"state.engines\[1\]: engines must be sorted"),
        ("duplicate", r"state.engines\[1\]: engines must be sorted .* without duplicates"),
        ("awake", r"state.engines\[0\].reading.awake: expected true, false or null, got 'yes'"),
        (
            "by-reason",
            r"state.engines\[0\].reading.waiting_by_reason: expected an object, got list",
        ),
        ("engine-not-object", r"state.engines\[0\]: expected an object, got str"),
    ],
)
def test_load_state_names_what_is_malformed(edit: str, message: str) -> None:
    """A malformed state dict raises ValueError naming the path and the problem."""
    with pytest.raises(ValueError, match=message):
        load_state(_malformed(edit))


def test_load_state_rejects_a_non_mapping() -> None:
    """Something that is not a JSON object at all is rejected with its type."""
    with pytest.raises(ValueError, match="state: expected an object, got list"):
        load_state([])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Real expositions through signals.parse

FIXTURES = Path(__file__).parents[1] / "fixtures"


def parsed(name: str, at: float) -> Scraped:
    """A good scrape of one fixture body, parsed by `signals.parse`."""
    exposition = parse((FIXTURES / name).read_bytes())
    assert isinstance(exposition, Exposition), exposition
    return Scraped(at, exposition)


def test_real_deferred_wedge_body_wedges_after_stall_after_seconds() -> None:
    """vLLM's deferred-wedge body repeated: OK (baseline), SUSPECT, then WEDGED at 60 s."""
    _, verdicts = run([parsed("deferred_wedge.prom", t) for t in (0, 30, 60)])
    key = EngineKey("Qwen/Qwen3-32B", "0")
    assert [(v.state, engine(v, key).family) for v in verdicts] == [
        (S.OK, None),
        (S.SUSPECT, F.DEFERRED_STALL),
        (S.WEDGED, F.DEFERRED_STALL),
    ]
    assert engine(verdicts[-1], key).reason == (
        "running 0, waiting 3 (deferred 2, capacity 1), no progress for 60s (threshold 60s)"
    )


def test_real_dp2_body_judges_engines_separately() -> None:
    """DP=2 body frozen for 60 s: engine 0 (deferred) wedges, engine 1 (running) is only suspect."""
    _, verdicts = run([parsed("dp2_multiproc.prom", 0), parsed("dp2_multiproc.prom", 60)])
    e0 = engine(verdicts[-1], EngineKey("Qwen/Qwen3-30B-A3B", "0"))
    e1 = engine(verdicts[-1], EngineKey("Qwen/Qwen3-30B-A3B", "1"))
    assert (e0.state, e0.family) == (S.WEDGED, F.DEFERRED_STALL)
    assert (e1.state, e1.family) == (S.SUSPECT, F.PROGRESS_STALL)
    assert verdicts[-1].state is S.WEDGED


@pytest.mark.parametrize(
    ("name", "state"),
    [
        pytest.param("idle.prom", S.IDLE, id="idle"),
        pytest.param("sleeping.prom", S.SLEEPING, id="sleeping"),
        pytest.param("old_vllm_no_reason.prom", S.WEDGED, id="old-vllm-running-flat"),
        pytest.param("nan_inf.prom", S.UNKNOWN, id="non-finite-gauges"),
    ],
)
def test_real_bodies_frozen_for_ten_minutes(name: str, state: EngineState) -> None:
    """A body that never changes for 10 min: idle and asleep stay calm, work present wedges."""
    _, verdicts = run([parsed(name, 0), parsed(name, 600)])
    assert verdicts[-1].state is state


def test_wedged_engine_stays_wedged_through_an_outage_until_unreachable() -> None:
    """A wedge does not flicker to suspect on a failed scrape; a long outage becomes unreachable."""
    state, _ = run(PRELUDES["wedged_deferred"])
    seen = []
    for at in range(71, 112):
        state, verdict = step(state, failed(at), POLICY)
        judged = engine(verdict, K0)
        seen.append((at, judged.state, judged.family))
        assert verdict.actions == ()
    assert seen[0][1:] == (S.WEDGED, F.DEFERRED_STALL)
    assert all(state is S.WEDGED for at, state, _ in seen if at < 101)
    assert seen[-1][1:] == (S.UNREACHABLE, F.UNREACHABLE)


# --------------------------------------------------------------------------------------------
# Issue #10 traffic shapes, as the simulator end-to-end tests produce them (1 s samples)


def test_wedge_under_clients_that_time_out_and_retry_is_wedged_at_stall_after_seconds() -> None:
    """Aborts climb every few seconds during the wedge; it is still wedged at exactly 60 s."""
    history: list[Observation] = [scraped(t, busy(t)) for t in range(11)]  # progress until t=10
    # Each client gives up after 5 s and retries: the abort series moves, the queue churns.
    history += [scraped(t, aborting(10, aborts=(t - 10) // 5)) for t in range(11, 101)]
    _, verdicts = run(history)
    states = states_of(verdicts)
    assert states[11:70] == [S.SUSPECT] * 59  # never flips back to OK on an abort
    assert states[70:] == [S.WEDGED] * 31
    assert engine(verdicts[70]).family is F.DEFERRED_STALL
    assert actions_at(verdicts) == {25: suspect(F.DEFERRED_STALL), 70: wedged(F.DEFERRED_STALL)}


def test_prefill_three_times_hang_after_seconds_is_never_wedged() -> None:
    """A 360 s chunked prefill (KV grows every chunk, no counter moves) is OK, then decodes."""
    history: list[Observation] = [scraped(0, busy(0))]
    # One chunk per 2 s: KV usage grows on every other sample, flat on the ones between.
    history += [scraped(t, prefilling(0, kv=0.01 + 0.002 * (t // 2))) for t in range(1, 361)]
    history += [scraped(361, busy(1))]  # the first token: every counter moves
    _, verdicts = run(history)
    states = states_of(verdicts)
    assert S.WEDGED not in states
    assert set(states[1:361]) <= {S.OK, S.SUSPECT}
    assert max(engine(v).stalled_seconds for v in verdicts) <= 1
    assert states[-1] is S.OK
    assert actions_at(verdicts) == {}  # never long enough for even a suspect capture


def test_collective_hang_with_every_gauge_frozen_is_still_wedged() -> None:
    """A prefill whose KV usage stops growing (the GPU hung) is a progress_stall at 120 s."""
    history: list[Observation] = [scraped(0, busy(0))]
    history += [scraped(t, prefilling(0, kv=0.25 + 0.01 * t)) for t in range(1, 31)]
    history += [scraped(t, prefilling(0, kv=0.55)) for t in range(31, 200)]
    _, verdicts = run(history)
    states = states_of(verdicts)
    assert states[:31] == [S.OK] * 31
    assert states[31:150] == [S.SUSPECT] * 119
    assert states[150] is S.WEDGED
    assert engine(verdicts[150]).family is F.PROGRESS_STALL


def test_thirty_second_prefill_in_a_ten_second_check_window_is_never_wedged() -> None:
    """`check --for 10` (thresholds capped at 10 s) over a prefill whose KV grows each second."""
    from wedgewatch.check import one_shot_policy

    policy = one_shot_policy(POLICY, 10.0)
    for start in range(0, 21, 5):  # windows anywhere inside the 30 s prefill
        window = [scraped(t, prefilling(0, kv=0.01 * t)) for t in range(start, start + 11)]
        _, verdicts = run(window, policy)
        assert {v.state for v in verdicts} == {S.OK}, start


def test_streaming_session_deferred_alone_is_not_a_wedge_at_stall_after_seconds() -> None:
    """A streaming-input session parked between chunks (deferred 1, capacity 0) for 10 min.

    Chunks arrive every 5 minutes: never wedged. Left idle it is only wedged at
    deferred_only_after_seconds (600 s), never at stall_after_seconds (60 s).
    """
    chunked: list[Observation] = []
    n = 0
    for t in range(601):
        if t % 300 == 0:  # a chunk arrives and is prefilled: counters move
            n += 1
            chunked.append(scraped(t, busy(n)))
        else:
            chunked.append(scraped(t, deferred_only(n)))
    _, verdicts = run(chunked)
    assert S.WEDGED not in states_of(verdicts)
    assert {engine(v).family for v in verdicts} <= {None, F.DEFERRED_ONLY_STALL}

    idle_session = [scraped(0, busy(1))] + [scraped(t, deferred_only(1)) for t in range(1, 700)]
    _, verdicts = run(idle_session)
    states = states_of(verdicts)
    assert states[1:600] == [S.SUSPECT] * 599
    assert states[600] is S.WEDGED
    assert actions_at(verdicts) == {
        150: suspect(F.DEFERRED_ONLY_STALL),
        600: wedged(F.DEFERRED_ONLY_STALL),
    }


def test_deferred_only_detection_can_be_disabled() -> None:
    """deferred_only_after_seconds = 0: a lone deferral is OK forever; a blocked head wedges."""
    policy = DetectionPolicy(deferred_only_after_seconds=0)
    history = [scraped(0, busy(1))] + [scraped(t, deferred_only(1)) for t in range(1, 3600, 10)]
    _, verdicts = run(history, policy)
    assert set(states_of(verdicts)) == {S.OK}
    assert engine(verdicts[-1]).reason.endswith(
        "only deferred requests, not judged (deferred_only_after_seconds = 0)"
    )
    # A request that then waits for capacity behind it gets stall_after_seconds from now on.
    state, _ = run(history, policy)
    _, later = run([scraped(3600, stuck(1)), scraped(3660, stuck(1))], policy, state)
    assert [engine(v).state for v in later] == [S.SUSPECT, S.WEDGED]


def test_nan_fault_never_crashes_and_the_state_always_saves() -> None:
    """NaN and Inf gauges mid-load and mid-wedge: never an exception, always strict JSON."""
    history: list[Observation] = [scraped(t, busy(t)) for t in range(5)]
    history += [scraped(t, nan_gauges(t, waiting=math.inf)) for t in range(5, 10)]
    history += [scraped(t, busy(t)) for t in range(10, 15)]
    history += [scraped(t, stuck(15)) for t in range(15, 80)]
    history += [scraped(t, nan_gauges(15, gen=math.nan)) for t in range(80, 90)]
    history += [scraped(t, stuck(15)) for t in range(90, 95)]
    state = new_state()
    seen = []
    for observation in history:
        state, verdict = step(state, observation, POLICY)
        text = json.dumps(dump_state(state), allow_nan=False)
        assert dump_state(load_state(json.loads(text))) == json.loads(text)
        seen.append(engine(verdict).state)
    assert seen[5:10] == [S.UNKNOWN] * 5  # neither work nor idle
    assert seen[10:15] == [S.OK] * 5
    assert seen[75] is S.WEDGED  # 60 s after t=15
    assert seen[80:95] == [S.WEDGED] * 15  # a NaN proves nothing about recovery


def test_nan_counter_neither_hides_nor_fakes_progress() -> None:
    """A counter that reads NaN for a while is compared with its last finite value afterwards."""
    history = [
        scraped(0, busy(1)),
        scraped(10, nan_gauges(1, running=2, gen=math.nan)),  # unknown
        scraped(20, busy(1)),  # flat against busy(1), not against NaN
        scraped(30, nan_gauges(1, running=2, gen=math.nan)),
        scraped(40, busy(2)),  # real progress since busy(1)
    ]
    _, verdicts = run(history)
    assert states_of(verdicts) == [S.OK, S.UNKNOWN, S.SUSPECT, S.UNKNOWN, S.OK]
    assert engine(verdicts[2]).stalled_seconds == 20
    assert "non-finite values (generation tokens)" in engine(verdicts[1]).reason


def test_load_balancer_alternating_servers_is_unknown_not_a_restart_loop() -> None:
    """Scrapes alternate between two servers for an hour: unknown with the reason, no actions."""
    history = [
        scraped(t, busy(t if t % 2 else 0), start=1000.0 if t % 2 else 2000.0)
        for t in range(0, 3600, 5)
    ]
    _, verdicts = run(history)
    assert all(v.actions == () for v in verdicts)
    assert {v.state for v in verdicts[2:]} == {S.UNKNOWN}
    assert engine(verdicts[-1]).reason == (
        "the URL reaches more than one server; point wedgewatch at one pod or process"
    )
    # Pointed at one server again: after the window without the other one, judged normally.
    state, _ = run(history)
    alone = [scraped(3600 + t, busy(5000 + t), start=1000.0) for t in range(0, 400, 5)]
    _, later = run(alone, POLICY, state)
    assert later[0].state is S.UNKNOWN  # server 2000 was seen 5 s ago
    assert later[-1].state is S.OK


def test_too_many_engines_is_a_scrape_failure_reason() -> None:
    """`too_many_engines` is one of the closed set of scrape failure reasons."""
    failure = ScrapeFailed(0, "too_many_engines", "body names more than 256 engines")
    _, verdicts = run([scraped(0, busy(0)), failure])
    assert verdicts[-1].failure == failure
    assert engine(verdicts[-1]).family is F.UNREACHABLE


def test_last_progress_stays_absent_until_progress_is_seen() -> None:
    """The reported last progress is None from the first scrape (a baseline) through idle and
    stalled samples, set only when progress counters move, and None again after a restart."""
    history: list[Observation] = [scraped(t, reading(), start=1.0) for t in range(0, 5)]  # idle
    history += [scraped(t, stuck(0), start=1.0) for t in range(5, 10)]  # waits, nothing moves
    history += [scraped(10, busy(10), start=1.0), scraped(11, busy(11), start=1.0)]  # moved
    done = reading(prompt=1100, gen=550, success=11, iters=110)  # idle, as busy(11) left it
    history += [scraped(t, done, start=1.0) for t in range(12, 15)]
    history += [scraped(15, reading(), start=2.0)]  # a new server: counters back at 0
    _, verdicts = run(history)
    for at in range(0, 10):
        assert engine(verdicts[at]).last_progress_at is None, at
    assert engine(verdicts[11]).last_progress_at == 11
    assert engine(verdicts[14]).last_progress_at == 11  # idle since: no progress seen
    assert engine(verdicts[15]).last_progress_at is None


def test_progressed_at_survives_the_state_file_and_old_files_lack_it() -> None:
    """The detector's state file keeps progressed_at; a file from before it reads None."""
    state, _ = run([scraped(0, busy(0)), scraped(1, busy(1))])
    dumped = dump_state(state)
    assert load_state(dumped) == state
    (memory,) = state.engines
    assert memory.progressed_at == 1
    for raw in dumped["engines"]:
        del raw["progressed_at"]
    (old,) = load_state(dumped).engines
    assert old.progressed_at is None
