"""The `agentic-burst` load plan fed straight into the scheduler model: pure, no clock, no HTTP."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from simproc import LAUNCHER_FLAGS

from wedgewatch.lab.sim.api import RequestIds, scheduler_config_from_args
from wedgewatch.lab.sim.args import ServeArgs, parse_serve_args
from wedgewatch.lab.sim.load import PlannedRequest, plan_requests
from wedgewatch.lab.sim.scheduler import Scheduler, SchedulerFix, SimRequest, StepResult

WEDGING_SEED = 16  # the seed of the docs, the README and the end-to-end test
LOAD_SECONDS = 12.0  # the documented `--duration`
WEDGE_STEPS = 2000
MAX_STEPS = 40_000


def launcher_args() -> ServeArgs:
    """`sim serve tiny` with the launcher's TP=2 offload flags, every sim setting at its default."""
    parsed = parse_serve_args(["tiny", *LAUNCHER_FLAGS])
    assert isinstance(parsed, ServeArgs), parsed
    return parsed


@dataclass
class BurstRun:
    """What driving one plan through the scheduler produced."""

    scheduler: Scheduler
    results: list[StepResult]
    finished: set[str]
    wedge_started_at: int | None


def is_wedged_step(result: StepResult, scheduler: Scheduler) -> bool:
    """Nothing runs or is emitted, requests wait for both reasons, work remains."""
    stats = result.scheduler_stats
    return (
        stats.num_running_reqs == 0
        and stats.num_skipped_waiting_reqs >= 1
        and stats.num_waiting_reqs >= 1
        and result.iteration_stats is None
        and not result.scheduled
        and scheduler.has_work()
    )


def drive(plan: tuple[PlannedRequest, ...], policy: SchedulerFix, **overrides: Any) -> BurstRun:
    """Add each request at the step of its planned instant (default step time) and step on.

    Stops once the wedge has lasted `WEDGE_STEPS` steps, once every request is done, or at
    `MAX_STEPS`.
    """
    args = launcher_args()
    config = replace(scheduler_config_from_args(args), policy=policy, **overrides)
    scheduler = Scheduler(config)
    arrivals = [(round(p.send_at_seconds / args.step_time_seconds), p) for p in plan]
    results: list[StepResult] = []
    finished: set[str] = set()
    wedge_started_at: int | None = None
    pending = 0
    for step in range(MAX_STEPS):
        while pending < len(arrivals) and arrivals[pending][0] <= step:
            planned = arrivals[pending][1]
            scheduler.add_request(
                SimRequest(
                    f"req-{planned.index}",
                    planned.prompt_tokens,
                    planned.max_tokens,
                    planned.prefix_id,
                    planned.prefix_tokens,
                )
            )
            pending += 1
        result = scheduler.step()
        results.append(result)
        if result.iteration_stats is not None:
            finished.update(f.request_id for f in result.iteration_stats.finished)
        if is_wedged_step(result, scheduler):
            wedge_started_at = step if wedge_started_at is None else wedge_started_at
            if step - wedge_started_at + 1 >= WEDGE_STEPS:
                break
        else:
            wedge_started_at = None
        if pending == len(arrivals) and not scheduler.has_work():
            break
    return BurstRun(scheduler, results, finished, wedge_started_at)


def test_the_plan_is_a_function_of_profile_seed_and_duration() -> None:
    """The same seed plans the same requests; another seed plans others; it has its burst."""
    plan = plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    assert plan == plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    assert plan != plan_requests("agentic-burst", WEDGING_SEED + 1, LOAD_SECONDS)
    assert [p.index for p in plan] == list(range(len(plan)))
    assert [p.send_at_seconds for p in plan] == sorted(p.send_at_seconds for p in plan)
    assert any(p.kind == "burst" and p.prompt_tokens > 12_000 for p in plan)


def test_request_ids_are_a_function_of_the_seed() -> None:
    """`--seed` fixes the sequence of request ids a server assigns."""
    first, again, other = RequestIds(16), RequestIds(16), RequestIds(17)
    ids = [first.next() for _ in range(5)]
    assert ids == [again.next() for _ in range(5)]
    assert ids != [other.next() for _ in range(5)]
    assert len(set(ids)) == 5
    assert all(i.startswith("cmpl-") and len(i) == 5 + 32 for i in ids)


def test_the_stock_scheduler_wedges_under_the_seed_16_burst() -> None:
    """The tp2-offload config and the seed-16 burst wedge vLLM 0.30.0's async scheduler with
    full-ISL admission off for good (as the real 0.30.0 scheduler does: 30 of 30 seeds)."""
    plan = plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    run = drive(plan, "stock", reserve_full_isl=False)
    assert run.wedge_started_at is not None, "no 2000-step wedge"
    wedged = run.results[run.wedge_started_at :]
    assert len(wedged) >= WEDGE_STEPS
    assert all(is_wedged_step(r, run.scheduler) for r in wedged)
    before = run.results[: run.wedge_started_at]
    assert max(r.scheduler_stats.kv_cache_usage for r in before) > 0.8
    # At the default 5 ms per step the wedge starts within the first 60 s of the load.
    assert run.wedge_started_at * launcher_args().step_time_seconds < 60


def test_the_wedge_is_a_preempted_request_deferred_ahead_of_a_parked_load() -> None:
    """The mechanism measured on vLLM 0.30.0: a preempted request, deferred holding no blocks
    (its flushed stores were not yet reported when schedule() ran), heads skipped_waiting;
    a load parked behind it holds blocks and is never promoted."""
    plan = plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    run = drive(plan, "stock", reserve_full_isl=False)
    assert run.wedge_started_at is not None
    skipped = run.scheduler.snapshot().skipped_waiting
    assert (skipped[0].status, skipped[0].num_blocks) == ("preempted", 0)
    assert any(r.status == "waiting_for_remote_kvs" and r.num_blocks > 0 for r in skipped[1:])
    assert run.scheduler.num_free_blocks > 0


def test_sync_scheduling_serves_the_same_plan_to_the_end() -> None:
    """Sync scheduling sees the preempted request's flushed stores before the next schedule()."""
    plan = plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    run = drive(plan, "stock", reserve_full_isl=False, async_scheduling=False)
    assert run.wedge_started_at is None
    assert run.finished == {f"req-{p.index}" for p in plan}


def test_vllm_0_31_structure_serves_the_same_plan_to_the_end() -> None:
    """Draining kv_holding_waiting before waiting (PR #58947) promotes the parked load."""
    plan = plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    run = drive(plan, "stock", reserve_full_isl=False, vllm_structure="0.31+")
    assert run.wedge_started_at is None
    assert run.finished == {f"req-{p.index}" for p in plan}


def test_skip_head_when_idle_finishes_every_request_of_the_same_plan() -> None:
    """The same plan under the PR #45406 idea never wedges and every request finishes."""
    plan = plan_requests("agentic-burst", WEDGING_SEED, LOAD_SECONDS)
    run = drive(plan, "skip-head-when-idle", reserve_full_isl=False)
    assert run.wedge_started_at is None
    assert not run.scheduler.has_work()
    assert run.finished == {f"req-{p.index}" for p in plan}
