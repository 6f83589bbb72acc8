"""The EngineCore process: `VLLM::EngineCore` (or `VLLM::EngineCore_DP<n>`) and its busy loop.

The structure and function names follow vLLM's `EngineCoreProc`, so stacks of a wedged
simulator look like stacks of a wedged vLLM:

    run_engine_core -> run_busy_loop -> _process_input_queue  (blocks while there is no work)
                                     -> _process_engine_step -> step -> scheduler.step()
                                                             -> execute_model, future.result()

An input thread moves client messages from the pipe into `input_queue`, an output thread
moves outputs from `output_queue` to the pipe, so the busy loop never blocks on the
serving process. A step that scheduled nothing while requests exist sleeps 1 ms and loops:
that is the busy, CPU-burning, nothing-scheduled state of a scheduler wedge.

Outputs are batched: one `EngineOutputs` carries every step that produced tokens since the
last flush plus the newest `SchedulerStats` (its prefix-cache counters summed over the
steps in the batch). A batch is flushed at least every `FLUSH_INTERVAL_SECONDS`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext
from types import FrameType
from typing import Protocol

from wedgewatch.lab.sim.faults import TRANSFER_FAULTS, FaultClock, FaultName
from wedgewatch.lab.sim.offload import TransferFault
from wedgewatch.lab.sim.proctitle import configure_process_logging, set_process_title
from wedgewatch.lab.sim.scheduler import (
    IterationStats,
    PauseState,
    Scheduler,
    SchedulerConfig,
    SchedulerStats,
    SimRequest,
    StepResult,
)
from wedgewatch.lab.sim.worker import (
    LIVENESS_POLL_SECONDS,
    Executor,
    ModelOutput,
    ModelStep,
    MultiprocExecutor,
    UniProcExecutor,
)

log = logging.getLogger("wedgewatch.lab.sim.engine")

FLUSH_INTERVAL_SECONDS = 0.01
EMPTY_STEP_SLEEP_SECONDS = 0.001  # vLLM sleeps 1 ms when no model ran but requests exist
ORPHAN_EXIT_GRACE_SECONDS = 3.0


# ---------------------------------------------------------------- messages: client -> engine


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Queue a request in the scheduler."""

    request: SimRequest


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Abort a request (the client went away)."""

    request_id: str


@dataclass(frozen=True, slots=True)
class StreamingInputChunk:
    """The next input chunk of a streaming-input session."""

    request_id: str
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class CloseStreamingInput:
    """A streaming-input session will get no more input."""

    request_id: str


@dataclass(frozen=True, slots=True)
class UtilityCall:
    """A control call answered with `UtilityResult`: `sleep`, `wake_up`, `is_sleeping`, and
    vLLM's `pause_scheduler` (`pause`, with `mode` "abort" | "wait" | "keep"), `resume`,
    `is_paused`."""

    call_id: int
    method: str
    level: int = 1
    mode: str = "abort"


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the engine and its workers."""


@dataclass(frozen=True, slots=True)
class StartFaultClock:
    """The server is ready: fault times count from `origin_at` (monotonic seconds)."""

    origin_at: float


EngineInput = (
    AddRequest
    | AbortRequest
    | StreamingInputChunk
    | CloseStreamingInput
    | UtilityCall
    | StartFaultClock
    | Shutdown
)


# ---------------------------------------------------------------- messages: engine -> client


@dataclass(frozen=True, slots=True)
class EngineReady:
    """The engine and its workers are up."""

    engine_index: int
    pid: int
    worker_pids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepOutput:
    """One step that produced tokens or finished requests."""

    timestamp: float  # wall clock (time.time()) at the end of the step
    iteration_stats: IterationStats
    token_events: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class EngineOutputs:
    """A batch of steps plus the newest scheduler stats (counters summed over the batch)."""

    engine_index: int
    steps: tuple[StepOutput, ...]
    scheduler_stats: SchedulerStats | None
    num_steps: int  # engine steps taken since the previous batch, including empty ones
    vllm_outputs: tuple[object, ...] = ()
    """`--scheduler vllm`: vLLM's own `EngineCoreOutputs` of these steps, for vLLM's own
    output processor and stat logger in the serving process (lab/real/vllm_core.py)."""


@dataclass(frozen=True, slots=True)
class UtilityResult:
    """The answer to a `UtilityCall`."""

    call_id: int
    value: bool


@dataclass(frozen=True, slots=True)
class EngineDead:
    """The engine hit a fatal error and is exiting."""

    engine_index: int
    reason: str


EngineOutput = EngineReady | EngineOutputs | UtilityResult | EngineDead


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything an engine process needs (picklable; fork makes that moot but keeps it honest)."""

    engine_index: int
    data_parallel_size: int
    tensor_parallel_size: int
    scheduler: SchedulerConfig
    step_time_seconds: float
    faults: FaultClock
    log_stats: bool = True
    execute_model_timeout_seconds: float | None = None  # TP>1 only, like vLLM
    prefill_step_time_seconds: float | None = None
    """How long a step that computes a prefill chunk takes (None: `step_time_seconds`)."""
    core_factory: CoreFactory | None = None
    """Builds the engine in place of `EngineCoreProc` (`--scheduler vllm`:
    lab/real/vllm_core.py)."""

    @property
    def title(self) -> str:
        """`EngineCore` or `EngineCore_DP<n>`."""
        if self.data_parallel_size > 1:
            return f"EngineCore_DP{self.engine_index}"
        return "EngineCore"


class EngineScheduler(Protocol):
    """What the busy loop asks of a scheduler (the built-in model, or vLLM's own behind it)."""

    def has_work(self) -> bool: ...
    def add_request(self, request: SimRequest) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def add_streaming_input(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None: ...
    def close_streaming_input(self, request_id: str) -> None: ...
    def step(self) -> StepResult: ...
    def arm_fault(self, fault: TransferFault) -> None: ...
    def set_pause_state(self, state: PauseState) -> None: ...


CoreFactory = Callable[
    [EngineConfig, "Executor", "queue.Queue[EngineInput]", "queue.Queue[EngineOutput | None]"],
    "EngineCoreProc",
]


def model_step_seconds(result: StepResult, config: EngineConfig) -> float | None:
    """How long the forward pass of `result` takes, or None for the workers' step time (pure).

    A step computes a prefill chunk when it scheduled more tokens than it emitted (a decode
    schedules one token and emits one); such a step takes `prefill_step_time_seconds`, so a
    long chunked prefill lasts (prompt / token budget) x that, as on a GPU where a chunk of
    thousands of tokens costs far more than a decode step.
    """
    if config.prefill_step_time_seconds is None:
        return None
    if result.num_scheduled_tokens > len(result.token_events):
        return config.prefill_step_time_seconds
    return None


def _merge_counters(total: SchedulerStats | None, newest: SchedulerStats) -> SchedulerStats:
    """Newest gauges, with the per-step prefix-cache counters summed."""
    if total is None:
        return newest
    return replace(
        newest,
        prefix_cache_queries=total.prefix_cache_queries + newest.prefix_cache_queries,
        prefix_cache_hits=total.prefix_cache_hits + newest.prefix_cache_hits,
        external_prefix_cache_queries=(
            total.external_prefix_cache_queries + newest.external_prefix_cache_queries
        ),
        external_prefix_cache_hits=(
            total.external_prefix_cache_hits + newest.external_prefix_cache_hits
        ),
    )


class EngineCrash(RuntimeError):
    """The `engine-crash` fault."""


class _ShutdownRequested(Exception):
    pass


class EngineCoreProc:
    """One engine: scheduler, executor, and the busy loop between the two queues."""

    def __init__(
        self,
        config: EngineConfig,
        executor: Executor,
        input_queue: queue.Queue[EngineInput],
        output_queue: queue.Queue[EngineOutput | None],
    ) -> None:
        self.config = config
        self.scheduler = self._make_scheduler()
        self.model_executor = executor
        self.input_queue = input_queue
        self.output_queue = output_queue
        self.sleeping = False
        self.pause_state: PauseState = "unpaused"
        # `pause` calls answered once the engine has no work left (vLLM's idle callbacks).
        self._pause_waiters: list[int] = []
        self._faults = config.faults
        self._crash_at: float | None = None
        self._transfer_faults: list[FaultName] = []
        self._set_fault_clock(config.faults)
        self._pending_steps: list[StepOutput] = []
        self._pending_stats: SchedulerStats | None = None
        self._pending_num_steps = 0
        self._last_flush_at = time.monotonic()
        self._last_published_running = 0

    def _set_fault_clock(self, faults: FaultClock) -> None:
        """Use `faults` (started once the server is ready: `StartFaultClock`)."""
        self._faults = faults
        self._crash_at = faults.first_at("engine-crash", self.config.engine_index)
        self._transfer_faults = [
            name for name in TRANSFER_FAULTS if faults.first_at(name) is not None
        ]

    def _make_scheduler(self) -> EngineScheduler:
        return Scheduler(self.config.scheduler)

    def _take_vllm_outputs(self) -> tuple[object, ...]:
        """vLLM's own outputs to send with the next batch (none for the built-in model)."""
        return ()

    # ------------------------------------------------------------ the loop

    def run_busy_loop(self) -> None:
        """Core busy loop of the EngineCore."""
        while True:
            self._process_input_queue()
            self._process_engine_step()

    def _has_work(self) -> bool:
        return not self.sleeping and self.scheduler.has_work()

    def _process_input_queue(self) -> None:
        """Handle client messages; block for one when there is nothing to step."""
        while not self._has_work():
            self._flush_outputs()
            self._answer_pause_waiters()
            timeout = None
            if self._crash_at is not None:
                timeout = max(0.0, self._crash_at - time.monotonic())
            try:
                message = self.input_queue.get(timeout=timeout)
            except queue.Empty:
                self._check_crash()
                continue
            self._handle_client_request(message)
        while True:
            try:
                message = self.input_queue.get_nowait()
            except queue.Empty:
                return
            self._handle_client_request(message)

    def _handle_client_request(self, message: EngineInput) -> None:
        if isinstance(message, AddRequest):
            self.scheduler.add_request(message.request)
        elif isinstance(message, AbortRequest):
            self.scheduler.abort_request(message.request_id)
        elif isinstance(message, StreamingInputChunk):
            self.scheduler.add_streaming_input(
                message.request_id, message.prompt_tokens, message.max_tokens
            )
        elif isinstance(message, CloseStreamingInput):
            self.scheduler.close_streaming_input(message.request_id)
        elif isinstance(message, UtilityCall):
            self._handle_utility(message)
        elif isinstance(message, StartFaultClock):
            self._set_fault_clock(self._faults.started(message.origin_at))
        elif isinstance(message, Shutdown):
            raise _ShutdownRequested
        else:  # pragma: no cover - a programming error in the client
            raise TypeError(f"unknown engine input {message!r}")

    def _handle_utility(self, call: UtilityCall) -> None:
        if call.method in ("pause", "resume", "is_paused"):
            self._handle_pause(call)
            return
        if call.method == "sleep":
            self.sleeping = True
            log.info("engine %d is sleeping (level %d)", self.config.engine_index, call.level)
        elif call.method == "wake_up":
            self.sleeping = False
            log.info("engine %d woke up", self.config.engine_index)
        elif call.method != "is_sleeping":
            raise ValueError(f"unknown utility call {call.method!r}")
        self.output_queue.put(UtilityResult(call_id=call.call_id, value=self.sleeping))

    def _handle_pause(self, call: UtilityCall) -> None:
        """vLLM's `EngineCore.pause_scheduler` / `resume_scheduler` / `is_scheduler_paused`.

        `pause` with mode "abort" (the client sent the aborts just before) or "wait" sets
        PAUSED_NEW and answers once the engine has no work left: the aborts processed, the
        running requests drained ("wait"), an aborted load still in flight landed. "keep" sets
        PAUSED_ALL and answers at once.
        """
        if call.method == "pause":
            if call.mode not in ("abort", "wait", "keep"):
                raise ValueError(f"Invalid pause mode: {call.mode}")
            self.pause_state = "all" if call.mode == "keep" else "new"
            self.scheduler.set_pause_state(self.pause_state)
            log.info(
                "engine %d: setting pause state to %s (mode %s)",
                self.config.engine_index,
                "PAUSED_ALL" if self.pause_state == "all" else "PAUSED_NEW",
                call.mode,
            )
            if call.mode == "keep":
                self.output_queue.put(UtilityResult(call_id=call.call_id, value=True))
            else:
                self._pause_waiters.append(call.call_id)
            return
        if call.method == "resume":
            self.pause_state = "unpaused"
            self.scheduler.set_pause_state("unpaused")
            log.info("engine %d: setting pause state to UNPAUSED", self.config.engine_index)
        self.output_queue.put(
            UtilityResult(call_id=call.call_id, value=self.pause_state != "unpaused")
        )

    def _answer_pause_waiters(self) -> None:
        waiters, self._pause_waiters = self._pause_waiters, []
        for call_id in waiters:
            self.output_queue.put(UtilityResult(call_id=call_id, value=True))

    def _process_engine_step(self) -> bool:
        """Run one step if there is work; sleep 1 ms when nothing could be scheduled."""
        self._check_crash()
        if not self._has_work():
            return False
        result, model_executed = self.step()
        self._collect(result)
        if time.monotonic() - self._last_flush_at >= FLUSH_INTERVAL_SECONDS:
            self._flush_outputs()
        if not model_executed and self.scheduler.has_work():
            time.sleep(EMPTY_STEP_SLEEP_SECONDS)
        return model_executed

    def step(self) -> tuple[StepResult, bool]:
        """Schedule, execute the model for what was scheduled, and update from its output."""
        if self._transfer_faults:
            self._arm_transfer_faults()
        result = self.scheduler.step()
        if not result.scheduled:
            return result, False
        if self._faults.active("frozen-step", time.monotonic(), self.config.engine_index):
            self._blocked_step()
        hang = self._last_published_running > 0 and self._faults.active(
            "collective-hang", time.monotonic(), self.config.engine_index
        )
        if hang:
            self._flush_outputs()  # what was published stays: the gauges freeze here
        future = self.model_executor.execute_model(
            ModelStep(
                step=result.step,
                num_scheduled_tokens=result.num_scheduled_tokens,
                hang=hang,
                seconds=model_step_seconds(result, self.config),
            )
        )
        future.result()
        return result, True

    def _arm_transfer_faults(self) -> None:
        """`lost-store-event` / `hung-load`: once due, the next transfer of that kind is lost."""
        now = time.monotonic()
        for name in list(self._transfer_faults):
            if self._faults.active(name, now, self.config.engine_index):
                log.warning(
                    "fault %s: the next %s on engine %d never completes on one TP rank",
                    name,
                    "store" if name == "lost-store-event" else "load",
                    self.config.engine_index,
                )
                self.scheduler.arm_fault(
                    "lost-store-event" if name == "lost-store-event" else "hung-load"
                )
                self._transfer_faults.remove(name)

    def _blocked_step(self) -> None:
        """`frozen-step` (vLLM #46811): wait for good on a step result that never comes.

        Nothing of this step, or of the steps batched since the last flush, is published:
        the API server keeps serving the last stats it got.
        """
        log.warning(
            "fault frozen-step: engine %d blocks inside a step (future.result() without a "
            "timeout); published stats freeze",
            self.config.engine_index,
        )
        never: Future[ModelOutput] = Future()  # the step's output, which never arrives
        never.result()

    def _check_crash(self) -> None:
        if self._crash_at is not None and time.monotonic() >= self._crash_at:
            self._flush_outputs()
            raise EngineCrash(
                "simulated fault engine-crash: CUDA error: an illegal memory access was encountered"
            )

    # ------------------------------------------------------------ outputs

    def _collect(self, result: StepResult) -> None:
        self._pending_num_steps += 1
        self._pending_stats = _merge_counters(self._pending_stats, result.scheduler_stats)
        if result.iteration_stats is not None:
            self._pending_steps.append(
                StepOutput(
                    timestamp=time.time(),
                    iteration_stats=result.iteration_stats,
                    token_events=result.token_events,
                )
            )

    def _flush_outputs(self) -> None:
        self._last_flush_at = time.monotonic()
        vllm_outputs = self._take_vllm_outputs()
        if self._pending_stats is None and not self._pending_steps and not vllm_outputs:
            return
        if self._pending_stats is not None:
            self._last_published_running = self._pending_stats.num_running_reqs
        self.output_queue.put(
            EngineOutputs(
                engine_index=self.config.engine_index,
                steps=tuple(self._pending_steps),
                scheduler_stats=self._pending_stats if self.config.log_stats else None,
                num_steps=self._pending_num_steps,
                vllm_outputs=vllm_outputs,
            )
        )
        self._pending_steps = []
        self._pending_stats = None
        self._pending_num_steps = 0


# ---------------------------------------------------------------- process plumbing


def process_input_sockets(
    conn: Connection, input_queue: queue.Queue[EngineInput], owner_pid: int
) -> None:
    """Input thread: pipe -> `input_queue`; on the serving process's death, shut down."""
    try:
        while True:
            if not conn.poll(LIVENESS_POLL_SECONDS):
                if os.getppid() != owner_pid:
                    log.warning("the serving process is gone; shutting down")
                    break
                continue
            message = conn.recv()
            input_queue.put(message)
            if isinstance(message, Shutdown):
                return
    except (EOFError, OSError):
        log.warning("the serving process closed the engine's input; shutting down")
    input_queue.put(Shutdown())
    # If the busy loop is stuck (a hung collective), do not linger as an orphan.
    time.sleep(ORPHAN_EXIT_GRACE_SECONDS)
    os._exit(1)


def process_output_sockets(
    conn: Connection, output_queue: queue.Queue[EngineOutput | None]
) -> None:
    """Output thread: `output_queue` -> pipe."""
    try:
        while True:
            message = output_queue.get()
            if message is None:
                return
            conn.send(message)
    except (BrokenPipeError, OSError):
        return


def run_engine_core(
    config: EngineConfig,
    input_conn: Connection,
    output_conn: Connection,
    owner_pid: int,
    close_in_child: tuple[Connection, ...],
) -> None:
    """Entry point of an engine process (forked from the serving process)."""
    for conn in close_in_child:
        conn.close()
    set_process_title(config.title)
    configure_process_logging(config.title)
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C goes to the whole group; the server decides

    def _on_sigterm(_signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _on_sigterm)

    ctx: ForkContext = multiprocessing.get_context("fork")
    executor: Executor
    if config.tensor_parallel_size > 1:
        executor = MultiprocExecutor(
            ctx,
            tp_size=config.tensor_parallel_size,
            dp_rank=config.engine_index,
            dp_size=config.data_parallel_size,
            step_time_seconds=config.step_time_seconds,
            execute_model_timeout_seconds=config.execute_model_timeout_seconds,
        )
    else:
        executor = UniProcExecutor(config.step_time_seconds)

    input_queue: queue.Queue[EngineInput] = queue.Queue()
    output_queue: queue.Queue[EngineOutput | None] = queue.Queue()
    threading.Thread(
        target=process_input_sockets,
        args=(input_conn, input_queue, owner_pid),
        name="EngineCoreInput",
        daemon=True,
    ).start()
    output_thread = threading.Thread(
        target=process_output_sockets,
        args=(output_conn, output_queue),
        name="EngineCoreOutput",
        daemon=True,
    )
    output_thread.start()

    factory = config.core_factory or EngineCoreProc
    engine = factory(config, executor, input_queue, output_queue)
    output_queue.put(
        EngineReady(
            engine_index=config.engine_index, pid=os.getpid(), worker_pids=executor.worker_pids
        )
    )
    log.info(
        "%s ready: %d GPU blocks of %d tokens, %d CPU blocks, policy %s, vLLM %s structure",
        config.title,
        config.scheduler.num_gpu_blocks,
        config.scheduler.block_size,
        config.scheduler.num_cpu_blocks,
        config.scheduler.policy,
        config.scheduler.vllm_structure,
    )
    exit_code = 0
    try:
        engine.run_busy_loop()
    except (_ShutdownRequested, SystemExit):
        log.info("%s shutting down", config.title)
    except BaseException as exc:  # any fatal error ends the engine, as in vLLM
        log.exception("EngineCore encountered a fatal error.")
        output_queue.put(EngineDead(engine_index=config.engine_index, reason=repr(exc)))
        exit_code = 1
    finally:
        executor.shutdown()
        output_queue.put(None)
        output_thread.join(2.0)
        logging.shutdown()
    os._exit(exit_code)
