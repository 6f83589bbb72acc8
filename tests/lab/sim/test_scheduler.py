"""The scheduler model: it wedges by vLLM's mechanism under an agentic burst, and only then."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from wedgewatch.lab.sim.scheduler import (
    FinishedRequest,
    Scheduler,
    SchedulerConfig,
    SimRequest,
    StepResult,
    cpu_blocks_from_gib,
)

Arrivals = list[tuple[int, SimRequest]]

# A seed whose burst wedges the stock scheduler; any seed is deterministic, this one wedges early.
WEDGING_SEED = 13
WEDGE_STEPS = 2000


def agentic_arrivals(seed: int, burst: bool = True) -> Arrivals:
    """An agentic workload: steady short prompts on 8 shared prefixes, then long prompts.

    Steady phase: about one request per 40 steps, 85 % of them on one of 8 agent prefixes
    (1-3 k tokens) plus 64-1024 tokens of their own. Burst phase (800 steps, about one request
    per 15 steps): the same prefixes plus 12-24 k tokens of their own, which drives KV usage to
    100 % and forces preemptions. Then the steady phase again.
    """
    rng = random.Random(seed)
    prefixes = [(f"agent-{i}", rng.randint(1024, 3072)) for i in range(8)]
    arrivals: Arrivals = []

    def arrive(step: int, unique: tuple[int, int]) -> None:
        prefix_id: str | None = None
        prefix_tokens = 0
        if rng.random() < 0.85:
            prefix_id, prefix_tokens = rng.choice(prefixes)
        request_id = f"req-{len(arrivals)}"
        prompt = prefix_tokens + rng.randint(*unique)
        max_tokens = rng.randint(32, 256)
        arrivals.append(
            (step, SimRequest(request_id, prompt, max_tokens, prefix_id, prefix_tokens))
        )

    for step in range(500):
        if rng.random() < 1 / 40:
            arrive(step, (64, 1024))
    if burst:
        for step in range(500, 1300):
            if rng.random() < 1 / 15:
                arrive(step, (12_000, 24_000))
    for step in range(1300, 2300):
        if rng.random() < 1 / 40:
            arrive(step, (64, 1024))
    return arrivals


@dataclass
class Run:
    """What driving a scheduler through arrivals produced."""

    results: list[StepResult]
    finished: list[FinishedRequest]
    wedge_started_at: int | None
    scheduler: Scheduler


def is_wedged_step(result: StepResult, scheduler: Scheduler) -> bool:
    """The wedge signature of one step: nothing ran, nothing runs, requests wait on both reasons."""
    stats = result.scheduler_stats
    return (
        not result.scheduled
        and not result.token_events
        and stats.num_running_reqs == 0
        and stats.num_skipped_waiting_reqs >= 1
        and stats.num_waiting_reqs >= 1
        and scheduler.has_work()
    )


def drive(
    config: SchedulerConfig,
    arrivals: Arrivals,
    max_steps: int,
    stop_after_wedge_steps: int | None = None,
) -> Run:
    """Step a scheduler, adding each request at its step, until done or wedged long enough."""
    scheduler = Scheduler(config)
    results: list[StepResult] = []
    finished: list[FinishedRequest] = []
    streak_start: int | None = None
    index = 0
    for step in range(max_steps):
        while index < len(arrivals) and arrivals[index][0] <= step:
            scheduler.add_request(arrivals[index][1])
            index += 1
        result = scheduler.step()
        results.append(result)
        if result.iteration_stats is not None:
            finished.extend(result.iteration_stats.finished)
        if is_wedged_step(result, scheduler):
            streak_start = result.step if streak_start is None else streak_start
            if (
                stop_after_wedge_steps is not None
                and result.step - streak_start + 1 >= stop_after_wedge_steps
            ):
                return Run(results, finished, streak_start, scheduler)
        else:
            streak_start = None
        if index == len(arrivals) and not scheduler.has_work():
            break
    return Run(results, finished, None, scheduler)


def small_config(**overrides: Any) -> SchedulerConfig:
    """A pool of 64 usable blocks of 16 tokens (plus vLLM's null block) without a CPU tier:
    easy to reason about by hand. Sync scheduling (vLLM's ``step``: a step's tokens come out
    of the same step) and no full-ISL gate, so each test sees one mechanism at a time."""
    base = SchedulerConfig(
        num_gpu_blocks=65,
        async_scheduling=False,
        reserve_full_isl=False,
        block_size=16,
        num_cpu_blocks=0,
        max_num_seqs=4,
        max_num_batched_tokens=1024,
        max_model_len=1024,
    )
    return replace(base, **overrides)


def run_until_idle(scheduler: Scheduler, max_steps: int = 10_000) -> list[StepResult]:
    """Step until the scheduler has no work left."""
    results: list[StepResult] = []
    for _ in range(max_steps):
        if not scheduler.has_work():
            return results
        results.append(scheduler.step())
    raise AssertionError(f"scheduler still busy after {max_steps} steps")


def finished_in(results: Iterable[StepResult]) -> list[FinishedRequest]:
    """Every FinishedRequest in these steps, in order."""
    return [f for r in results if r.iteration_stats for f in r.iteration_stats.finished]


def first_with_output(results: Sequence[StepResult]) -> StepResult:
    """The first step that produced IterationStats."""
    return next(r for r in results if r.iteration_stats is not None)


# ------------------------------------------------------------------ acceptance


def test_agentic_burst_wedges_the_stock_scheduler_within_a_minute_of_steps() -> None:
    """vLLM 0.30.0's async scheduler with full-ISL admission off wedges for good on a burst."""
    run = drive(
        SchedulerConfig(reserve_full_isl=False),
        agentic_arrivals(WEDGING_SEED),
        max_steps=8000,
        stop_after_wedge_steps=WEDGE_STEPS,
    )
    assert run.wedge_started_at is not None, "no 2000-step wedge"
    # At ~5 ms per step the wedge starts well within 60 s of wall time.
    assert run.wedge_started_at <= 6000
    wedged = run.results[-WEDGE_STEPS:]
    assert all(is_wedged_step(r, run.scheduler) for r in wedged)
    assert all(r.iteration_stats is None for r in wedged)
    assert max(r.scheduler_stats.kv_cache_usage for r in run.results) > 0.8
    # The mechanism: the deferred head holds no blocks and a landed load behind it does.
    deferred = run.scheduler.snapshot().skipped_waiting
    assert deferred[0].num_blocks == 0
    assert any(r.num_blocks > 0 and not r.kv_load_in_flight for r in deferred[1:])
    assert run.scheduler.num_free_blocks > 0


def test_skip_head_when_idle_finishes_every_request_of_the_same_burst() -> None:
    """With the PR #45406 idea the same arrivals never wedge and every request finishes."""
    arrivals = agentic_arrivals(WEDGING_SEED)
    run = drive(
        SchedulerConfig(policy="skip-head-when-idle"),
        arrivals,
        max_steps=40_000,
        stop_after_wedge_steps=WEDGE_STEPS,
    )
    assert run.wedge_started_at is None
    assert not run.scheduler.has_work()
    assert sorted(f.request_id for f in run.finished) == sorted(r.request_id for _, r in arrivals)
    assert {f.finish_reason for f in run.finished} <= {"length", "stop"}
    assert all(f.num_generation_tokens == f.max_tokens for f in run.finished)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_healthy_agentic_load_never_wedges_the_stock_scheduler(seed: int) -> None:
    """Without the burst the stock scheduler serves everything and never stalls."""
    arrivals = agentic_arrivals(seed, burst=False)
    run = drive(SchedulerConfig(), arrivals, max_steps=20_000, stop_after_wedge_steps=50)
    assert run.wedge_started_at is None
    assert not run.scheduler.has_work()
    assert len(run.finished) == len(arrivals)
    assert all(f.finish_reason == "length" for f in run.finished)


# ------------------------------------------------------------------ the interleaving, by hand


def hand_built_wedge(policy: str) -> tuple[Scheduler, list[StepResult]]:
    """The exact interleaving that wedges, on a 64-block pool (see docs/simulator.md).

    Steps 1-2 put prefixes x (32 blocks) and y (30 blocks) on the CPU tier through a store
    pipe of 4 blocks per step and evict them from the GPU. At step 15 request b (prefix x) finds
    x still being stored: deferred, holding nothing. Request l (prefix y plus 400 tokens of its
    own) loads y behind it: 30 blocks held, 25 more reserved. At step 17 x has landed and b
    wants to load 32 blocks, but only 34 - 25 = 9 are free beyond the reservation.
    """
    config = small_config(
        num_cpu_blocks=1000,
        kv_store_blocks_per_step=4,
        kv_load_steps=3,
        policy=policy,
    )
    scheduler = Scheduler(config)
    results: list[StepResult] = []
    scheduler.add_request(SimRequest("y1", 496, 1, "y", 480))
    scheduler.add_request(SimRequest("x1", 528, 1, "x", 512))
    results.append(scheduler.step())
    scheduler.add_request(SimRequest("evictor", 1008, 1))
    results.extend(scheduler.step() for _ in range(13))
    scheduler.add_request(SimRequest("b", 528, 1, "x", 512))
    scheduler.add_request(SimRequest("l", 880, 1, "y", 480))
    results.extend(scheduler.step() for _ in range(2))
    scheduler.add_request(SimRequest("w", 64, 1))
    return scheduler, results


def test_hand_built_interleaving_wedges_stock_forever() -> None:
    """A block-less deferred head ahead of a landed load breaks every scan once nothing runs."""
    scheduler, results = hand_built_wedge("stock")
    assert [r.scheduler_stats.num_skipped_waiting_reqs for r in results[-2:]] == [2, 2]
    assert all(r.scheduled for r in results[:2])
    deferred = scheduler.snapshot().skipped_waiting
    assert [(r.request_id, r.num_blocks) for r in deferred] == [("b", 0), ("l", 30)]
    after = [scheduler.step() for _ in range(500)]
    assert all(is_wedged_step(r, scheduler) for r in after)
    snapshot = scheduler.snapshot()
    assert [r.request_id for r in snapshot.skipped_waiting] == ["b", "l"]
    assert not snapshot.skipped_waiting[1].kv_load_in_flight
    assert [r.request_id for r in snapshot.waiting] == ["w"]
    assert after[-1].scheduler_stats.num_free_blocks == 34


def test_hand_built_interleaving_is_cleared_by_skip_head_when_idle() -> None:
    """Skipping the unallocatable head while idle promotes the load, and everyone finishes."""
    scheduler, _ = hand_built_wedge("skip-head-when-idle")
    results = run_until_idle(scheduler, max_steps=100)
    assert sorted(f.request_id for f in finished_in(results)) == ["b", "l", "w"]


# ------------------------------------------------------------------ units


def test_stats_are_published_every_step_and_iteration_stats_only_with_output() -> None:
    """An empty step still carries SchedulerStats; IterationStats need an output."""
    scheduler = Scheduler(small_config())
    empty = scheduler.step()
    assert not empty.scheduled
    assert empty.iteration_stats is None
    assert empty.scheduler_stats.num_free_blocks == 64
    assert empty.scheduler_stats.kv_cache_usage == 0.0


def test_prefix_cache_hits_are_counted_in_full_blocks_and_split_by_source() -> None:
    """A second request on a cached prefix hits its full blocks and reports them as cached."""
    scheduler = Scheduler(small_config())
    scheduler.add_request(SimRequest("a", 100, 1, "p", 64))
    first = scheduler.step()
    assert (
        first.scheduler_stats.prefix_cache_queries,
        first.scheduler_stats.prefix_cache_hits,
    ) == (
        100,
        0,
    )
    scheduler.add_request(SimRequest("b", 90, 1, "p", 64))
    second = scheduler.step()
    assert second.scheduler_stats.prefix_cache_queries == 90
    assert second.scheduler_stats.prefix_cache_hits == 64
    stats = second.iteration_stats
    assert stats is not None
    assert (stats.num_prompt_tokens, stats.num_prompt_tokens_cached) == (90, 64)
    assert (stats.num_prompt_tokens_computed, stats.num_prompt_tokens_external) == (26, 0)
    assert stats.finished[0].num_cached_tokens == 64


def test_a_full_prompt_hit_still_computes_the_last_block() -> None:
    """The cache hit stops one token short of the prompt, so the last block is recomputed."""
    scheduler = Scheduler(small_config())
    scheduler.add_request(SimRequest("a", 64, 1, "p", 64))
    scheduler.step()
    scheduler.add_request(SimRequest("b", 64, 1, "p", 64))
    assert scheduler.step().scheduler_stats.prefix_cache_hits == 48


def test_prefix_caching_off_never_hits() -> None:
    """With prefix caching disabled the same prefix is computed again."""
    scheduler = Scheduler(small_config(enable_prefix_caching=False))
    scheduler.add_request(SimRequest("a", 100, 1, "p", 64))
    scheduler.step()
    scheduler.add_request(SimRequest("b", 100, 1, "p", 64))
    assert scheduler.step().scheduler_stats.prefix_cache_hits == 0


def test_chunked_prefill_counts_prompt_tokens_only_with_the_first_token() -> None:
    """A 1000-token prompt in 256-token chunks moves no counter until its prefill completes."""
    scheduler = Scheduler(small_config(max_num_batched_tokens=256))
    scheduler.add_request(SimRequest("a", 1000, 3))
    results = [scheduler.step() for _ in range(4)]
    assert [r.num_scheduled_tokens for r in results] == [256, 256, 256, 232]
    assert [r.iteration_stats is None for r in results] == [True, True, True, False]
    assert all(r.scheduler_stats.num_running_reqs == 1 for r in results)
    stats = results[-1].iteration_stats
    assert stats is not None
    assert stats.num_prompt_tokens == 1000
    assert stats.num_generation_tokens == 1
    assert stats.first_token_request_ids == ("a",)
    assert stats.num_iteration_tokens == 1001
    assert results[-1].token_events == (("a", 1),)


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget() -> None:
    """With chunking off, a prompt larger than the remaining budget waits for the next step."""
    config = small_config(
        enable_chunked_prefill=False, num_gpu_blocks=128, max_num_batched_tokens=1024
    )
    scheduler = Scheduler(config)
    scheduler.add_request(SimRequest("a", 600, 2))
    scheduler.add_request(SimRequest("b", 600, 2))
    first = scheduler.step()
    assert first.num_scheduled_tokens == 600
    assert (scheduler.num_running, scheduler.num_waiting) == (1, 1)
    second = scheduler.step()
    assert second.num_scheduled_tokens == 601


def test_decode_emits_one_token_per_step_and_finishes_with_length() -> None:
    """After the prefill a request emits exactly one token per step up to max_tokens."""
    scheduler = Scheduler(small_config())
    scheduler.add_request(SimRequest("a", 10, 5))
    results = run_until_idle(scheduler)
    assert [r.token_events for r in results] == [(("a", 1),)] * 5
    (finished,) = finished_in(results)
    assert (finished.finish_reason, finished.num_generation_tokens) == ("length", 5)
    assert scheduler.num_free_blocks == 64


def test_generation_stops_at_max_model_len() -> None:
    """A request that reaches max_model_len finishes with "length" before max_tokens."""
    scheduler = Scheduler(small_config(max_model_len=256, num_gpu_blocks=17))
    scheduler.add_request(SimRequest("a", 250, 100))
    (finished,) = finished_in(run_until_idle(scheduler))
    assert (finished.finish_reason, finished.num_generation_tokens) == ("length", 6)


def test_preemption_requeues_the_last_running_request_as_capacity() -> None:
    """When decode runs out of blocks the last running request is preempted, then completes."""
    config = small_config(num_gpu_blocks=9, max_model_len=128, max_num_batched_tokens=128)
    scheduler = Scheduler(config)
    scheduler.add_request(SimRequest("a", 60, 40))
    scheduler.add_request(SimRequest("b", 60, 40))
    results = run_until_idle(scheduler)
    preempting = next(r for r in results if r.scheduler_stats.num_waiting_reqs == 1)
    assert preempting.scheduler_stats.num_running_reqs == 1
    assert preempting.iteration_stats is not None
    assert preempting.iteration_stats.num_preemptions == 0  # the event rides on b's next output
    carrying = [r for r in results if r.iteration_stats and r.iteration_stats.num_preemptions]
    assert len(carrying) == 1
    assert carrying[0].iteration_stats is not None
    assert carrying[0].iteration_stats.num_preemptions == 1
    assert ("b", 1) in carrying[0].token_events
    by_id = {f.request_id: f for f in finished_in(results)}
    assert by_id["a"].num_preemptions == 0
    assert by_id["b"].num_preemptions == 1
    assert by_id["b"].num_generation_tokens == 40
    # b resumed: its recomputed prefill emitted a token without counting its prompt again.
    assert sum(r.iteration_stats.num_prompt_tokens for r in results if r.iteration_stats) == 120


def test_max_num_seqs_caps_the_running_batch() -> None:
    """No more than max_num_seqs requests run at once; the rest wait as capacity."""
    scheduler = Scheduler(small_config(max_num_seqs=2))
    for index in range(5):
        scheduler.add_request(SimRequest(f"r{index}", 32, 4))
    results = run_until_idle(scheduler)
    assert max(r.scheduler_stats.num_running_reqs for r in results) == 2
    assert results[0].scheduler_stats.num_waiting_reqs == 3
    assert len(finished_in(results)) == 5


def test_same_inputs_give_identical_steps() -> None:
    """Two schedulers fed the same arrivals produce identical StepResult sequences."""
    arrivals = agentic_arrivals(7)
    first = drive(SchedulerConfig(), arrivals, max_steps=2500)
    second = drive(SchedulerConfig(), arrivals, max_steps=2500)
    assert first.results == second.results
    assert any(r.scheduler_stats.external_prefix_cache_hits for r in first.results)


def test_abort_of_a_waiting_request_finishes_it_on_the_next_step() -> None:
    """An aborted waiting request leaves the queue with finish reason "abort"."""
    scheduler = Scheduler(small_config(max_num_seqs=1))
    scheduler.add_request(SimRequest("a", 32, 50))
    scheduler.add_request(SimRequest("b", 32, 50))
    scheduler.step()
    scheduler.abort_request("b")
    scheduler.abort_request("no-such-request")
    result = scheduler.step()
    assert result.iteration_stats is not None
    (aborted,) = result.iteration_stats.finished
    assert (aborted.request_id, aborted.finish_reason) == ("b", "abort")
    assert aborted.num_generation_tokens == 0
    assert result.scheduler_stats.num_waiting_reqs == 0


def test_abort_of_a_running_request_frees_its_blocks() -> None:
    """Aborting mid-decode reports the tokens so far and returns every block."""
    scheduler = Scheduler(small_config())
    scheduler.add_request(SimRequest("a", 100, 50))
    for _ in range(3):
        scheduler.step()
    scheduler.abort_request("a")
    result = scheduler.step()
    assert result.iteration_stats is not None
    (aborted,) = result.iteration_stats.finished
    assert (aborted.finish_reason, aborted.num_generation_tokens) == ("abort", 3)
    assert result.token_events == ()
    assert result.scheduler_stats.num_free_blocks == 64
    assert not scheduler.has_work()


def cpu_config(**overrides: Any) -> SchedulerConfig:
    """The small pool with a CPU tier whose stores land at once."""
    return small_config(num_cpu_blocks=1000, kv_store_blocks_per_step=0, **overrides)


def offload_prefix(scheduler: Scheduler) -> None:
    """Compute prefix p (480 tokens) once, then evict it from the GPU but not from the CPU."""
    scheduler.add_request(SimRequest("seed", 496, 1, "p", 480))
    scheduler.step()
    scheduler.add_request(SimRequest("evictor", 1023, 1))
    scheduler.step()


def test_a_cpu_hit_is_loaded_asynchronously_as_a_deferred_request() -> None:
    """A prefix found only on the CPU tier parks the request, holding blocks, for the load."""
    scheduler = Scheduler(cpu_config(kv_load_steps=3))
    offload_prefix(scheduler)
    scheduler.add_request(SimRequest("r", 600, 2, "p", 480))
    parked = [scheduler.step() for _ in range(3)]
    assert [r.scheduler_stats.num_skipped_waiting_reqs for r in parked] == [1, 1, 1]
    assert [r.scheduled for r in parked] == [False, False, False]
    assert parked[0].scheduler_stats.external_prefix_cache_hits == 480
    assert parked[0].scheduler_stats.num_free_blocks == 64 - 30
    results = run_until_idle(scheduler)
    stats = first_with_output(results).iteration_stats
    assert stats is not None
    assert (stats.num_prompt_tokens, stats.num_prompt_tokens_external) == (600, 480)
    assert stats.num_prompt_tokens_computed == 120
    (finished,) = finished_in(results)
    assert finished.num_cached_tokens == 480


def test_a_hit_on_a_store_still_in_flight_defers_without_blocks() -> None:
    """While its prefix is still being stored to the CPU, a request waits deferred, blockless."""
    scheduler = Scheduler(
        small_config(num_cpu_blocks=1000, kv_store_blocks_per_step=2, kv_load_steps=1)
    )
    offload_prefix(scheduler)
    scheduler.add_request(SimRequest("r", 600, 2, "p", 480))
    result = scheduler.step()
    assert result.scheduler_stats.num_skipped_waiting_reqs == 1
    assert result.scheduler_stats.num_free_blocks == 64
    assert scheduler.snapshot().skipped_waiting[0].num_blocks == 0
    results = run_until_idle(scheduler)
    assert [f.request_id for f in finished_in(results)] == ["r"]
    assert sum(r.scheduler_stats.external_prefix_cache_hits for r in results) == 480


def test_abort_of_a_load_in_flight_keeps_its_blocks_until_the_load_lands() -> None:
    """Aborting a parked load finishes it at once but frees its blocks only after the transfer."""
    scheduler = Scheduler(cpu_config(kv_load_steps=5))
    offload_prefix(scheduler)
    scheduler.add_request(SimRequest("r", 600, 2, "p", 480))
    scheduler.step()
    scheduler.abort_request("r")
    aborted = scheduler.step()
    assert aborted.iteration_stats is not None
    assert aborted.iteration_stats.finished[0].finish_reason == "abort"
    assert aborted.scheduler_stats.num_free_blocks == 34
    assert scheduler.has_work()
    results = run_until_idle(scheduler)
    assert results[-1].scheduler_stats.num_free_blocks == 64


def test_a_step_that_preempts_admits_nothing_from_the_queues() -> None:
    """The waiting phase is skipped in a preempting step, so a landed load waits one more step."""
    scheduler = Scheduler(cpu_config(max_num_seqs=2, kv_load_steps=1))
    offload_prefix(scheduler)
    scheduler.add_request(SimRequest("l", 496, 5, "p", 480))
    scheduler.add_request(SimRequest("a", 200, 100))
    scheduler.add_request(SimRequest("b", 300, 100))
    scheduler.step()
    snapshot = scheduler.snapshot()
    assert [(r.request_id, r.num_blocks) for r in snapshot.skipped_waiting] == [("l", 30)]
    assert [r.request_id for r in snapshot.running] == ["a", "b"]
    preempting = scheduler.step()
    while scheduler.num_waiting == 0:
        preempting = scheduler.step()
    assert preempting.scheduler_stats.num_waiting_reqs == 1
    snapshot = scheduler.snapshot()
    assert [r.request_id for r in snapshot.running] == ["a"]
    assert [r.request_id for r in snapshot.waiting] == ["b"]
    assert [r.request_id for r in snapshot.skipped_waiting] == ["l"]
    scheduler.step()
    assert [r.request_id for r in scheduler.snapshot().running] == ["a", "l"]


def test_early_stop_fraction_finishes_requests_with_stop_deterministically() -> None:
    """With early_stop_fraction 1 every request stops before max_tokens, the same way twice."""
    outcomes = []
    for _ in range(2):
        scheduler = Scheduler(small_config(early_stop_fraction=1.0))
        for index in range(4):
            scheduler.add_request(SimRequest(f"r{index}", 16, 100))
        outcomes.append(finished_in(run_until_idle(scheduler)))
    assert outcomes[0] == outcomes[1]
    assert all(f.finish_reason == "stop" and f.num_generation_tokens < 100 for f in outcomes[0])


def test_cpu_blocks_from_gib_uses_the_documented_bytes_per_token() -> None:
    """60 GiB over two ranks of 128 KiB per token is 15 360 blocks of 16 tokens."""
    assert cpu_blocks_from_gib(60) == 15_360
    assert cpu_blocks_from_gib(60, tensor_parallel_size=1) == 30_720
    assert cpu_blocks_from_gib(0) == 0
    assert SchedulerConfig().num_cpu_blocks == 15_360
    with pytest.raises(ValueError, match="kv_offloading_size_gib must be >= 0"):
        cpu_blocks_from_gib(-1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_gpu_blocks": 0}, "num_gpu_blocks must be >= 1"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks must be >= 0"),
        ({"kv_store_blocks_per_step": -1}, "kv_store_blocks_per_step must be >= 0"),
        ({"policy": "lifo"}, "policy must be one of stock, skip-head-when-idle"),
        ({"max_model_len": 40_000}, "max_model_len 40000 does not fit in the KV cache"),
        ({"enable_chunked_prefill": False}, "without chunked prefill"),
        ({"early_stop_fraction": 1.5}, "early_stop_fraction must be within"),
    ],
    ids=["gpu-blocks", "cpu-blocks", "store-rate", "policy", "model-len", "chunking", "stop"],
)
def test_bad_config_is_refused_with_a_specific_message(
    overrides: dict[str, Any], message: str
) -> None:
    """Each invalid setting names itself in the error."""
    with pytest.raises(ValueError, match=message):
        replace(SchedulerConfig(), **overrides)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (SimRequest("a", 0, 1), "prompt_tokens must be within"),
        (SimRequest("a", 1024, 1), "prompt_tokens must be within"),
        (SimRequest("a", 10, 0), "max_tokens must be >= 1"),
        (SimRequest("a", 10, 1, "p", 11), "prefix_tokens must be within"),
    ],
    ids=["empty-prompt", "prompt-at-max-model-len", "no-tokens", "prefix-longer-than-prompt"],
)
def test_bad_requests_are_refused(request_: SimRequest, message: str) -> None:
    """A request the engine could never serve is refused when added."""
    scheduler = Scheduler(small_config())
    with pytest.raises(ValueError, match=message):
        scheduler.add_request(request_)


def test_duplicate_request_ids_are_refused() -> None:
    """Two live requests cannot share an id."""
    scheduler = Scheduler(small_config())
    scheduler.add_request(SimRequest("a", 10, 1))
    with pytest.raises(ValueError, match="duplicate request id 'a'"):
        scheduler.add_request(SimRequest("a", 10, 1))


# ------------------------------------------------------------------ transfer faults


def test_a_lost_store_event_defers_every_request_that_needs_its_blocks_forever() -> None:
    """lost-store-event: one rank never confirms the prefix's store, so a later request on
    that prefix is deferred for good holding no blocks, while other requests still run."""
    scheduler = Scheduler(cpu_config())
    scheduler.arm_fault("lost-store-event")
    scheduler.add_request(SimRequest("seed", 496, 1, "p", 480))
    run_steps = [scheduler.step() for _ in range(3)]
    assert any(r.token_events for r in run_steps)
    scheduler.add_request(SimRequest("evictor", 1023, 1))
    scheduler.add_request(SimRequest("b", 600, 2, "p", 480))
    scheduler.add_request(SimRequest("w", 64, 2))
    results = [scheduler.step() for _ in range(300)]
    done = {f.request_id for f in finished_in(results)}
    assert {"evictor", "w"} <= done
    assert "b" not in done
    snapshot = scheduler.snapshot()
    assert [(r.request_id, r.num_blocks) for r in snapshot.skipped_waiting] == [("b", 0)]
    assert results[-1].scheduler_stats.num_skipped_waiting_reqs == 1
    assert results[-1].scheduler_stats.num_running_reqs == 0
    assert scheduler.has_work()


def test_a_hung_load_parks_its_request_forever_holding_its_blocks() -> None:
    """hung-load: the load never finishes on one rank; the request stays parked with its
    blocks, and nothing is freed for it."""
    scheduler = Scheduler(cpu_config(kv_load_steps=2))
    offload_prefix(scheduler)
    scheduler.arm_fault("hung-load")
    scheduler.add_request(SimRequest("r", 600, 2, "p", 480))
    results = [scheduler.step() for _ in range(200)]
    assert "r" not in {f.request_id for f in finished_in(results)}
    (parked,) = scheduler.snapshot().skipped_waiting
    assert (parked.request_id, parked.status, parked.num_blocks) == (
        "r",
        "waiting_for_remote_kvs",
        30,
    )
    assert parked.kv_load_in_flight
    assert results[-1].scheduler_stats.num_free_blocks == 64 - 30


def test_without_a_fault_the_same_load_lands_and_the_request_finishes() -> None:
    """The control for the hung load: the same request finishes within a few steps."""
    scheduler = Scheduler(cpu_config(kv_load_steps=2))
    offload_prefix(scheduler)
    scheduler.add_request(SimRequest("r", 600, 2, "p", 480))
    results = [scheduler.step() for _ in range(20)]
    assert "r" in {f.request_id for f in finished_in(results)}
