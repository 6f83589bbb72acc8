"""The EngineCore busy loop and the worker plumbing, driven in-process with a fake executor."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from concurrent.futures import Future

import pytest

from wedgewatch.lab.sim.engine import (
    AddRequest,
    EngineConfig,
    EngineCoreProc,
    EngineCrash,
    EngineInput,
    EngineOutput,
    EngineOutputs,
    StartFaultClock,
    UtilityCall,
    UtilityResult,
)
from wedgewatch.lab.sim.faults import FaultClock, FaultSpec
from wedgewatch.lab.sim.scheduler import SchedulerConfig, SimRequest
from wedgewatch.lab.sim.worker import (
    MessageQueue,
    ModelOutput,
    ModelStep,
    ParentGone,
    Worker,
    worker_title,
)


class RecordingExecutor:
    """The GPU side, faked: records every step it is asked to run and finishes it at once."""

    worker_pids: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.steps: list[ModelStep] = []

    def execute_model(self, model_step: ModelStep) -> Future[ModelOutput]:
        self.steps.append(model_step)
        future: Future[ModelOutput] = Future()
        future.set_result(ModelOutput(model_step.step, 0))
        return future

    def shutdown(self) -> None:
        pass


def make_engine(
    faults: tuple[FaultSpec, ...] = (), origin_at: float | None = None
) -> tuple[
    EngineCoreProc, RecordingExecutor, queue.Queue[EngineInput], queue.Queue[EngineOutput | None]
]:
    config = EngineConfig(
        engine_index=0,
        data_parallel_size=1,
        tensor_parallel_size=1,
        scheduler=SchedulerConfig(num_gpu_blocks=2048, num_cpu_blocks=0),
        step_time_seconds=0.0,
        faults=FaultClock(time.monotonic() if origin_at is None else origin_at, faults),
    )
    executor = RecordingExecutor()
    inputs: queue.Queue[EngineInput] = queue.Queue()
    outputs: queue.Queue[EngineOutput | None] = queue.Queue()
    engine = EngineCoreProc(config, executor, inputs, outputs)  # type: ignore[arg-type]
    return engine, executor, inputs, outputs


def drain(outputs: queue.Queue[EngineOutput | None]) -> list[EngineOutput]:
    items = []
    while True:
        try:
            item = outputs.get_nowait()
        except queue.Empty:
            return items
        assert item is not None
        items.append(item)


def run_until_idle(engine: EngineCoreProc, max_steps: int = 10_000) -> None:
    for _ in range(max_steps):
        if not engine.scheduler.has_work():
            engine._flush_outputs()
            return
        engine._process_engine_step()
    raise AssertionError("engine did not go idle")


def test_a_request_runs_to_completion_and_every_token_is_published() -> None:
    """Steps go to the executor; batches carry token steps and the newest scheduler stats."""
    engine, executor, inputs, outputs = make_engine()
    inputs.put(AddRequest(SimRequest("r1", prompt_tokens=100, max_tokens=5)))
    engine._process_input_queue()
    run_until_idle(engine)
    batches = [o for o in drain(outputs) if isinstance(o, EngineOutputs)]
    steps = [s for b in batches for s in b.steps]
    assert sum(n for s in steps for _, n in s.token_events) == 5
    assert [f.request_id for s in steps for f in s.iteration_stats.finished] == ["r1"]
    assert len(executor.steps) == 5
    # Async scheduling (the default): the 6th step schedules nothing and processes the 5th
    # batch's output (the last token), the 7th drains the empty 6th batch.
    assert sum(b.num_steps for b in batches) == 7
    last = batches[-1].scheduler_stats
    assert last is not None
    assert last.num_running_reqs == 0


def test_batches_sum_the_per_step_prefix_cache_counters() -> None:
    """Batching never loses a counter increment: prefix-cache queries add up across steps."""
    engine, _, inputs, outputs = make_engine()
    for i in range(3):
        inputs.put(AddRequest(SimRequest(f"r{i}", 64, 2, prefix_id="p", prefix_tokens=48)))
    engine._process_input_queue()
    run_until_idle(engine)
    batches = [o for o in drain(outputs) if isinstance(o, EngineOutputs)]
    queries = sum(b.scheduler_stats.prefix_cache_queries for b in batches if b.scheduler_stats)
    assert queries == 3 * 64


def test_sleep_stops_scheduling_and_answers_the_call() -> None:
    """A sleeping engine has no work to step (it would block on its input); wake_up resumes."""
    engine, executor, _, outputs = make_engine()
    engine._handle_client_request(UtilityCall(1, "sleep", level=1))
    engine._handle_client_request(AddRequest(SimRequest("r1", 10, 2)))
    assert engine.sleeping
    assert not engine._has_work()
    assert not engine._process_engine_step()
    assert executor.steps == []
    assert UtilityResult(1, True) in drain(outputs)
    engine._handle_client_request(UtilityCall(2, "wake_up"))
    assert engine._process_engine_step()
    assert UtilityResult(2, False) in drain(outputs)


def test_engine_crash_fires_at_its_time_after_publishing_what_it_has() -> None:
    """The crash fault raises in the busy loop; outputs collected so far are flushed first."""
    engine, _, _, outputs = make_engine(faults=(FaultSpec("engine-crash", 0.3),))
    engine._handle_client_request(AddRequest(SimRequest("r1", 100, 50)))
    engine._process_engine_step()
    assert drain(outputs) == []  # batched, not yet flushed
    time.sleep(0.35)
    with pytest.raises(EngineCrash, match="illegal memory access"):
        engine._process_engine_step()
    (batch,) = drain(outputs)
    assert isinstance(batch, EngineOutputs)
    assert batch.num_steps == 1


def test_collective_hang_is_requested_only_once_requests_were_seen_running() -> None:
    """A hang step follows a published step with running > 0, so the gauges freeze there."""
    engine, executor, inputs, outputs = make_engine(
        faults=(FaultSpec("collective-hang", 0.0),), origin_at=time.monotonic() - 1
    )
    inputs.put(AddRequest(SimRequest("r1", 100, 50)))
    engine._process_input_queue()
    engine._process_engine_step()  # first step: nothing published yet, no hang
    assert [s.hang for s in executor.steps] == [False]
    engine._flush_outputs()  # running = 1 is now what the serving process saw
    engine._process_engine_step()
    assert executor.steps[-1].hang
    published = [o for o in drain(outputs) if isinstance(o, EngineOutputs)]
    assert published[-1].scheduler_stats is not None
    assert published[-1].scheduler_stats.num_running_reqs == 1


def test_fault_times_count_from_the_ready_server_not_from_the_engine_start() -> None:
    """Before the server says it is ready (StartFaultClock) no fault fires, however long the
    start takes; `engine-crash@0` fires as soon as the clock has started."""
    engine, _, inputs, _ = make_engine()
    engine._set_fault_clock(FaultClock(None, (FaultSpec("engine-crash", 0.0),)))
    engine._check_crash()  # not started: no crash
    assert not engine._process_engine_step()
    inputs.put(StartFaultClock(time.monotonic()))
    with pytest.raises(EngineCrash):
        engine._process_input_queue()


def test_engine_titles_follow_vllms_naming() -> None:
    """EngineCore alone, EngineCore_DP<n> with data parallelism; workers per dimension > 1."""
    config = make_engine()[0].config
    assert config.title == "EngineCore"
    assert EngineConfig(1, 2, 2, config.scheduler, 0.0, config.faults).title == "EngineCore_DP1"
    assert worker_title(1, 2, 0, 1) == "Worker_TP1"
    assert worker_title(0, 2, 1, 2) == "Worker_DP1_TP0"
    assert worker_title(0, 1, 0, 1) == "Worker"


def test_acquire_read_times_out_and_notices_a_dead_owner() -> None:
    """A reader waits in acquire_read; a deadline or an owner other than its parent ends it."""
    reader, writer = multiprocessing.Pipe(duplex=False)
    with pytest.raises(TimeoutError):
        MessageQueue(reader).acquire_read(timeout=0.1)
    with pytest.raises(ParentGone):
        MessageQueue(reader, owner_pid=os.getpid()).acquire_read()  # not our parent
    writer.send("hello")
    assert MessageQueue(reader).dequeue(timeout=1.0) == "hello"


def test_a_worker_step_takes_the_step_time() -> None:
    """execute_model sleeps for the simulated forward pass and answers with its rank."""
    worker = Worker(rank=1, step_time_seconds=0.02, owner_pid=None)
    started = time.monotonic()
    assert worker.execute_model(ModelStep(7, 10)) == ModelOutput(7, 1)
    assert time.monotonic() - started >= 0.02
