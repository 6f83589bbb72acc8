"""Issue #10 traffic shapes from the simulator's mechanism: sessions, prefills, NaN, retries."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
from test_metrics import exposition, stats, value

from wedgewatch.lab.sim.engine import EngineConfig, model_step_seconds
from wedgewatch.lab.sim.faults import ENGINE_FAULTS, FaultClock, FaultSpec, parse_fault
from wedgewatch.lab.sim.load import (
    LONG_PROMPT_TOKENS_ONE,
    SESSION_CHUNK_INTERVAL_SECONDS,
    PlannedRequest,
    plan_requests,
    run_load,
)
from wedgewatch.lab.sim.scheduler import Scheduler, SchedulerConfig, SimRequest, StepResult


def small(**overrides: object) -> SchedulerConfig:
    base: dict[str, object] = {
        "num_gpu_blocks": 257,  # 256 usable plus vLLM's null block
        "async_scheduling": False,  # vLLM's step(): a step's tokens come out of that step
        "reserve_full_isl": False,
        "block_size": 16,
        "num_cpu_blocks": 0,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 512,
        "max_model_len": 4096,
    }
    base.update(overrides)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def run(scheduler: Scheduler, steps: int) -> list[StepResult]:
    return [scheduler.step() for _ in range(steps)]


def finished_reasons(results: list[StepResult]) -> list[tuple[str, str]]:
    return [
        (f.request_id, f.finish_reason)
        for r in results
        if r.iteration_stats is not None
        for f in r.iteration_stats.finished
    ]


# -- streaming input -------------------------------------------------------------------------


def test_a_streaming_session_pauses_deferred_holding_its_blocks_then_resumes() -> None:
    """After its segment a session waits as deferred with its KV, nothing else queued."""
    scheduler = Scheduler(small())
    scheduler.add_request(SimRequest("s", 100, 3, streaming_input=True))
    results = run(scheduler, 10)
    assert finished_reasons(results) == []  # a session does not finish with its segment
    snap = scheduler.snapshot()
    assert snap.running == ()
    assert snap.waiting == ()
    (paused,) = snap.skipped_waiting
    assert paused.status == "waiting_for_streaming_req"
    assert paused.num_blocks == math.ceil(102 / 16)  # its KV stays allocated
    idle = run(scheduler, 50)
    assert all(not r.scheduled and r.iteration_stats is None for r in idle)
    last = idle[-1].scheduler_stats
    assert (last.num_running_reqs, last.num_waiting_reqs, last.num_skipped_waiting_reqs) == (
        0,
        0,
        1,
    )
    assert last.kv_cache_usage > 0
    assert scheduler.has_work()  # the engine keeps stepping, as vLLM's does

    scheduler.add_streaming_input("s", 40, 2)
    resumed = run(scheduler, 5)
    generated = sum(r.iteration_stats.num_generation_tokens for r in resumed if r.iteration_stats)
    assert generated == 2
    assert scheduler.snapshot().skipped_waiting[0].status == "waiting_for_streaming_req"
    scheduler.close_streaming_input("s")
    closed = run(scheduler, 2)
    assert finished_reasons(closed) == [("s", "stop")]
    assert not scheduler.has_work()
    assert closed[-1].scheduler_stats.kv_cache_usage == 0


def test_a_paused_session_keeps_its_batch_slot_and_is_skipped_by_the_scan() -> None:
    """Paused sessions count against max_num_seqs (vLLM) and never block the queue behind them."""
    scheduler = Scheduler(small(max_num_seqs=2))
    scheduler.add_request(SimRequest("s", 64, 1, streaming_input=True))
    run(scheduler, 3)
    scheduler.add_request(SimRequest("a", 64, 50))
    scheduler.add_request(SimRequest("b", 64, 50))
    scheduler.step()
    snap = scheduler.snapshot()
    assert [r.request_id for r in snap.running] == ["a"]  # one slot is the session's
    assert [r.request_id for r in snap.waiting] == ["b"]
    assert [r.request_id for r in snap.skipped_waiting] == ["s"]


def test_aborting_a_paused_session_frees_its_blocks_and_its_slot() -> None:
    """A client that goes away ends its session with "abort"."""
    scheduler = Scheduler(small(max_num_seqs=1))
    scheduler.add_request(SimRequest("s", 64, 1, streaming_input=True))
    run(scheduler, 3)
    scheduler.abort_request("s")
    scheduler.add_request(SimRequest("a", 64, 2))
    results = run(scheduler, 4)
    assert finished_reasons(results) == [("s", "abort"), ("a", "length")]


def test_a_chunk_sent_while_the_segment_runs_extends_it() -> None:
    """Input that arrives mid-segment is computed next and ends that segment's output."""
    scheduler = Scheduler(small())
    scheduler.add_request(SimRequest("s", 64, 5, streaming_input=True))
    scheduler.step()
    scheduler.add_streaming_input("s", 32, 3)
    scheduler.add_streaming_input("unknown", 32, 3)  # ignored, like an unknown abort
    results = run(scheduler, 12)
    generated = sum(r.iteration_stats.num_generation_tokens for r in results if r.iteration_stats)
    assert generated == 3  # after the new input: its own max_tokens, no more of the old segment
    with pytest.raises(ValueError, match="streaming input"):
        scheduler.add_streaming_input("s", 0, 1)


# -- long chunked prefill -------------------------------------------------------------------


def test_a_long_chunked_prefill_grows_kv_every_step_and_moves_no_counter() -> None:
    """Chunk after chunk KV usage rises while no token, prompt or finish is reported."""
    scheduler = Scheduler(small(num_gpu_blocks=257, max_num_batched_tokens=256))
    scheduler.add_request(SimRequest("long", 4000, 2))
    results = run(scheduler, 16)
    usages = [r.scheduler_stats.kv_cache_usage for r in results[:15]]
    assert usages == sorted(usages)
    assert len(set(usages)) == 15
    assert all(r.iteration_stats is None for r in results[:15])
    assert all(r.scheduler_stats.num_running_reqs == 1 for r in results)
    first = results[15].iteration_stats
    assert first is not None
    assert first.num_prompt_tokens == 4000


def _engine_config(prefill: float | None) -> EngineConfig:
    return EngineConfig(
        engine_index=0,
        data_parallel_size=1,
        tensor_parallel_size=1,
        scheduler=small(),
        step_time_seconds=0.005,
        faults=FaultClock(0.0, ()),
        prefill_step_time_seconds=prefill,
    )


def test_a_step_that_computes_a_prefill_chunk_takes_the_prefill_step_time() -> None:
    """Prefill chunks take --prefill-step-time-seconds; decode steps the normal step time."""
    scheduler = Scheduler(small(max_num_batched_tokens=256))
    scheduler.add_request(SimRequest("long", 600, 3))
    results = run(scheduler, 6)
    config = _engine_config(2.5)
    seconds = [model_step_seconds(r, config) for r in results]
    assert seconds == [2.5, 2.5, 2.5, None, None, None]  # 600 = 256 + 256 + 88, then decodes
    assert all(model_step_seconds(r, _engine_config(None)) is None for r in results)


# -- NaN gauges -----------------------------------------------------------------------------


def test_nan_gauges_is_a_serving_process_fault() -> None:
    """`--fault nan-gauges@T` parses like the other faults and belongs to the serving process."""
    assert parse_fault("nan-gauges@30") == FaultSpec("nan-gauges", 30.0)
    assert "nan-gauges" not in ENGINE_FAULTS
    assert isinstance(parse_fault("nan-gauges@1:0"), str)  # no rank: not an engine fault


def test_an_abort_only_batch_moves_the_abort_and_iteration_counts_but_no_token() -> None:
    """As vLLM records it: request_success{abort} +1, iteration count +1, every token sum +0."""
    scheduler = Scheduler(small())
    scheduler.add_request(SimRequest("s", 64, 1, streaming_input=True))
    run(scheduler, 3)  # its segment is done: paused, nothing runs
    scheduler.abort_request("s")
    result = scheduler.step()
    assert not result.scheduled
    aborted = result.iteration_stats
    assert aborted is not None
    assert [(f.request_id, f.finish_reason) for f in aborted.finished] == [("s", "abort")]
    assert (aborted.num_generation_tokens, aborted.num_iteration_tokens) == (0, 0)
    expo = exposition()
    assert expo.stats is not None
    expo.stats.record(0, None, aborted)
    text = expo.render().decode()
    assert value(text, "vllm:request_success_total", finished_reason="abort") == 1
    assert value(text, "vllm:iteration_tokens_total_count") == 1
    assert value(text, "vllm:iteration_tokens_total_sum") == 0
    assert value(text, "vllm:generation_tokens_total") == 0
    assert value(text, "vllm:prompt_tokens_total") == 0


def test_nan_gauges_poison_the_queue_and_kv_gauges_for_good_and_nothing_else() -> None:
    """Running, waiting (by reason) and KV usage read NaN, also after later steps; counters stay."""
    expo = exposition()
    assert expo.stats is not None
    expo.stats.record(0, stats(running=2, capacity=1, usage=0.5), None)
    expo.stats.write_nan_gauges()
    expo.stats.record(0, stats(running=3, capacity=4, deferred=1, usage=0.7), None)
    text = expo.render().decode()
    for name, labels in (
        ("vllm:num_requests_running", {}),
        ("vllm:num_requests_waiting", {}),
        ("vllm:num_requests_waiting_by_reason", {"reason": "capacity"}),
        ("vllm:num_requests_waiting_by_reason", {"reason": "deferred"}),
        ("vllm:kv_cache_usage_perc", {}),
    ):
        assert math.isnan(value(text, name, **labels)), name
    assert "NaN" in text
    assert value(text, "vllm:engine_sleep_state", sleep_state="awake") == 1.0
    assert value(text, "vllm:generation_tokens_total") == 0.0


# -- load profiles and retrying clients ------------------------------------------------------


def test_long_prompt_is_one_long_request() -> None:
    """The long-prompt profile sends one 30k-token prompt at the start, whatever the duration."""
    (only,) = plan_requests("long-prompt", 1, 600)
    assert (only.send_at_seconds, only.prompt_tokens) == (0.0, LONG_PROMPT_TOKENS_ONE)
    assert plan_requests("long-prompt", 1, 5) == (only,)


def test_streaming_session_plans_a_chunk_a_minute() -> None:
    """One session; its later chunks every 60 s within the duration; shorter runs are prefixes."""
    (session,) = plan_requests("streaming-session", 0, 200)
    assert session.streaming_input
    assert [c[0] for c in session.input_chunks] == [
        SESSION_CHUNK_INTERVAL_SECONDS * k for k in (1, 2, 3)
    ]
    (short,) = plan_requests("streaming-session", 0, 40)
    assert short.input_chunks == ()


def _slow_then_fast(answer_after: int, log: list[int]) -> httpx.MockTransport:
    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served"}]})
        log.append(json.loads(request.content)["max_tokens"])
        if len(log) <= answer_after:
            await asyncio.sleep(5)
        return httpx.Response(200, json={"ok": True})

    return httpx.MockTransport(handle)


async def test_a_timed_out_request_is_sent_again_up_to_retries() -> None:
    """Two timeouts, then an answer: three sends, one completed request, two retries."""
    sent: list[int] = []
    summary = await run_load(
        "http://sim.test",
        [PlannedRequest(0, 0.0, 10, 7)],
        profile="t",
        seed=0,
        duration_seconds=10.0,
        request_timeout_seconds=0.2,
        retries=5,
        retry_backoff_seconds=0.05,
        transport=_slow_then_fast(2, sent),
    )
    assert sent == [7, 7, 7]
    assert summary.count("completed") == 1
    assert summary.outcomes[0].attempts == 3
    assert summary.retries == 2
    assert "retries 2" in summary.render()
    assert summary.as_dict()["retries"] == 2


async def test_retries_stop_when_they_run_out_or_the_duration_ends() -> None:
    """No more than `retries` resends, and none once the duration is over."""
    sent: list[int] = []
    summary = await run_load(
        "http://sim.test",
        [PlannedRequest(0, 0.0, 10, 7)],
        profile="t",
        seed=0,
        duration_seconds=10.0,
        request_timeout_seconds=0.1,
        retries=2,
        retry_backoff_seconds=0.0,
        transport=_slow_then_fast(99, sent),
    )
    assert len(sent) == 3
    assert summary.count("timed_out") == 1
    sent.clear()
    summary = await run_load(
        "http://sim.test",
        [PlannedRequest(0, 0.0, 10, 7)],
        profile="t",
        seed=0,
        duration_seconds=0.5,
        request_timeout_seconds=0.2,
        retries=100,
        retry_backoff_seconds=0.0,
        transport=_slow_then_fast(99, sent),
    )
    assert 2 <= len(sent) <= 3  # 0.2 s per attempt within a 0.5 s run
    with pytest.raises(ValueError, match="retries"):
        await run_load(
            "http://sim.test",
            [],
            profile="t",
            seed=0,
            duration_seconds=1.0,
            retries=-1,
            transport=_slow_then_fast(0, sent),
        )
