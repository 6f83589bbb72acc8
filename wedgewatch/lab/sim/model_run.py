"""Batch runs of the built-in scheduler model, in the CLI and JSON shape of ``vllm_engine``.

``python -m wedgewatch.lab.sim.model_run --seeds 1-30 ...`` feeds ``sim load`` plans to the model
(``wedgewatch/lab/sim/scheduler.py``) exactly as ``python -m wedgewatch.lab.real.vllm_engine``
feeds them
to vLLM's own scheduler: requests arrive at their planned instants, every step counts
``step_seconds`` of simulated time, and a stall of ``wedge_steps`` steps with nothing running,
nothing scheduled and requests waiting is a wedge. One JSON line per seed, then the total, so
``tests/lab/sim/test_fidelity.py`` compares the two line by line. ``--jobs N`` runs seeds in N
processes; no dependency beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from wedgewatch.lab.real.vllm_engine import WEDGE_STEPS, RunResult, parse_seeds
from wedgewatch.lab.sim.load import PROFILE_NAMES, ProfileName, plan_requests
from wedgewatch.lab.sim.offload import TransferFault
from wedgewatch.lab.sim.scheduler import (
    DEFAULT_VLLM_VERSION,
    VLLM_STRUCTURES,
    Scheduler,
    SchedulerConfig,
    SimRequest,
    VllmStructure,
)

STEP_SECONDS = 0.005


@dataclass(frozen=True, slots=True)
class ModelRun:
    """One condition: the model's configuration, the plan and the horizon."""

    config: SchedulerConfig
    profile: ProfileName = "agentic-burst"
    duration_seconds: float = 12.0
    max_seconds: float = 60.0
    wedge_steps: int = WEDGE_STEPS
    fault: TransferFault | None = None
    fault_at_seconds: float = 0.0


def run_seed(run: ModelRun, seed: int) -> RunResult:
    """Run one seed's plan through the model until done, wedged or out of time (pure)."""
    plan = plan_requests(run.profile, seed, run.duration_seconds)
    scheduler = Scheduler(run.config)
    pending = deque(plan)
    max_steps = int(run.max_seconds / STEP_SECONDS)
    fault_step = int(run.fault_at_seconds / STEP_SECONDS) if run.fault else None
    stall_from: int | None = None
    finished = 0
    step = 0
    for step in range(1, max_steps + 1):
        if fault_step is not None and run.fault is not None and step >= fault_step:
            scheduler.arm_fault(run.fault)
            fault_step = None
        now = step * STEP_SECONDS
        while pending and pending[0].send_at_seconds <= now:
            planned = pending.popleft()
            scheduler.add_request(
                SimRequest(
                    f"req-{planned.index}",
                    planned.prompt_tokens,
                    planned.max_tokens,
                    planned.prefix_id,
                    planned.prefix_tokens,
                )
            )
        if not scheduler.has_work():
            if not pending:
                break
            continue
        result = scheduler.step()
        if result.iteration_stats is not None:
            finished += len(result.iteration_stats.finished)
        stats = result.scheduler_stats
        waiting = stats.num_waiting_reqs + stats.num_skipped_waiting_reqs
        if stats.num_running_reqs == 0 and waiting > 0 and not result.scheduled:
            if stall_from is None:
                stall_from = step
            elif step - stall_from >= run.wedge_steps:
                return RunResult(
                    seed=seed,
                    wedged=True,
                    wedge_at_seconds=round(stall_from * STEP_SECONDS, 3),
                    steps=step,
                    finished=finished,
                    requests=len(plan),
                    end_state=end_state(scheduler),
                )
        else:
            stall_from = None
    return RunResult(
        seed=seed,
        wedged=False,
        wedge_at_seconds=None,
        steps=step,
        finished=finished,
        requests=len(plan),
        end_state=end_state(scheduler),
    )


def end_state(scheduler: Scheduler) -> dict[str, Any]:
    """The queues and the pool, in the shape of ``vllm_engine.RealEngine.end_state``."""
    snapshot = scheduler.snapshot()
    queue = "skipped_waiting" if scheduler.config.vllm_structure == "0.30" else "kv_holding_waiting"
    pool_blocks = scheduler.config.num_gpu_blocks
    return {
        "running": len(snapshot.running),
        "waiting": len(snapshot.waiting),
        "kv_usage": round(1.0 - scheduler.num_free_blocks / max(pool_blocks - 1, 1), 4),
        "free_blocks": scheduler.num_free_blocks,
        queue: [
            (r.request_id, r.status.upper(), r.num_computed_tokens)
            for r in snapshot.skipped_waiting
        ],
    }


def _run_one(args: tuple[ModelRun, int]) -> tuple[RunResult, float]:
    started = time.process_time()
    result = run_seed(*args)
    return result, time.process_time() - started


def run_seeds(run: ModelRun, seeds: Sequence[int], jobs: int = 1) -> list[tuple[RunResult, float]]:
    """Every seed's result and CPU seconds, in seed order, over ``jobs`` processes."""
    work = [(run, seed) for seed in seeds]
    if jobs <= 1:
        return [_run_one(item) for item in work]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_run_one, work))


def model_label(structure: VllmStructure) -> str:
    """What the JSON lines put under "vllm": the release structure the model follows."""
    return f"model-{structure}"


def main(argv: list[str] | None = None) -> int:
    """Run ``sim load`` plans through the built-in model; one JSON line per seed."""
    parser = argparse.ArgumentParser(prog="python -m wedgewatch.lab.sim.model_run")
    parser.add_argument("--profile", default="agentic-burst", choices=PROFILE_NAMES)
    parser.add_argument("--seeds", default="1-30")
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--wedge-steps", type=int, default=WEDGE_STEPS)
    parser.add_argument("--sync", action="store_true", help="sync scheduling (default async)")
    parser.add_argument("--no-full-isl", action="store_true")
    parser.add_argument("--simple-offload", action="store_true")
    parser.add_argument("--load-steps", type=int, default=3)
    parser.add_argument("--store-blocks-per-step", type=int, default=16)
    parser.add_argument(
        "--vllm-structure",
        choices=VLLM_STRUCTURES,
        default="0.30",
        help=f"whose scheduler structure (default: {DEFAULT_VLLM_VERSION}'s)",
    )
    parser.add_argument("--fault", choices=("lost-store-event", "hung-load"))
    parser.add_argument("--fault-at-seconds", type=float, default=0.0)
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args(argv)
    structure: VllmStructure = args.vllm_structure
    run = ModelRun(
        config=SchedulerConfig(
            async_scheduling=not args.sync,
            reserve_full_isl=not args.no_full_isl,
            simple_kv_offload=args.simple_offload,
            kv_load_steps=args.load_steps,
            kv_store_blocks_per_step=args.store_blocks_per_step,
            vllm_structure=structure,
        ),
        profile=args.profile,
        duration_seconds=args.duration,
        max_seconds=args.max_seconds,
        wedge_steps=args.wedge_steps,
        fault=args.fault,
        fault_at_seconds=args.fault_at_seconds,
    )
    seeds = parse_seeds(args.seeds)
    wedged = 0
    label = model_label(structure)
    for result, cpu_seconds in run_seeds(run, seeds, args.jobs):
        wedged += result.wedged
        line = asdict(result) | {"vllm": label, "cpu_seconds": round(cpu_seconds, 2)}
        sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.write(json.dumps({"vllm": label, "wedged": wedged, "seeds": len(seeds)}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
