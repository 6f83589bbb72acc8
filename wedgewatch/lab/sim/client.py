"""The serving process's side of the engines (vLLM: `AsyncLLM` and its core client).

`EngineClient` forks one EngineCore process per data-parallel rank, routes requests to
the least loaded one, turns the engines' output batches into per-request progress, and
records them into the metrics with wall-clock latencies measured here. It notices an
engine's death at once (process sentinel), fails every request in flight, and reports
`errored` so `/health` turns 503 and the watchdog loop can stop the server.

Threads: one reader per engine (pipe -> event loop), one sender (event loop -> pipes,
so a stuck engine can never block the HTTP event loop), one death monitor. All request
state is touched on the event loop thread only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkProcess
from typing import Protocol

from wedgewatch.lab.sim.engine import (
    AbortRequest,
    AddRequest,
    CloseStreamingInput,
    EngineConfig,
    EngineDead,
    EngineInput,
    EngineOutputs,
    EngineReady,
    Shutdown,
    StartFaultClock,
    StreamingInputChunk,
    UtilityCall,
    UtilityResult,
    run_engine_core,
)
from wedgewatch.lab.sim.metrics import FinishedTimes, IterationTimes, MetricsPage
from wedgewatch.lab.sim.scheduler import (
    FinishedRequest,
    SchedulerConfig,
    SchedulerStats,
    SimRequest,
)

log = logging.getLogger("wedgewatch.lab.sim.client")

ENGINE_READY_TIMEOUT_SECONDS = 30.0
LOG_STATS_INTERVAL_SECONDS = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10"))


class Frontend(Protocol):
    """vLLM's own request bookkeeping in the serving process (`--scheduler vllm`)."""

    def add_request(self, request: SimRequest, arrival_time: float) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def record(self, engine_index: int, outputs: tuple[object, ...]) -> None: ...
    def record_sleep_state(self, sleep: int, level: int) -> None: ...


class EngineDeadError(RuntimeError):
    """An engine process died; nothing more will be served."""


class EngineStartError(RuntimeError):
    """An engine process did not come up."""


@dataclass(frozen=True, slots=True)
class TokenDelta:
    """New tokens for one request (one step)."""

    num_tokens: int


@dataclass(slots=True)
class RequestState:
    """One request in flight, as the serving process tracks it (event-loop thread only)."""

    request: SimRequest
    engine: int
    arrival_time: float  # wall clock when the HTTP request arrived
    events: asyncio.Queue[TokenDelta | FinishedRequest] = field(default_factory=asyncio.Queue)
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_generation_tokens: int = 0


def finished_times(
    finished: FinishedRequest,
    *,
    arrival_time: float,
    first_token_time: float | None,
    last_token_time: float,
    now: float,
    step_time_seconds: float,
    max_num_batched_tokens: int,
) -> FinishedTimes:
    """Split a finished request's wall-clock life into vLLM's phases (pure).

    The engine reports when a request produced tokens, not when it was first scheduled,
    so the start of the prefill phase is estimated as the first token minus the prefill
    steps the model needs (computed tokens / token budget) at the configured step time.
    """
    e2e = max(now - arrival_time, 0.0)
    if first_token_time is None:  # aborted before its first token: it only ever waited
        return FinishedTimes(e2e, e2e, 0.0, 0.0, 0.0, 0.0)
    computed = max(finished.num_prompt_tokens - finished.num_cached_tokens, 1)
    prefill_estimate = math.ceil(computed / max_num_batched_tokens) * step_time_seconds
    scheduled_time = min(max(first_token_time - prefill_estimate, arrival_time), first_token_time)
    decode = max(last_token_time - first_token_time, 0.0)
    tpot = (
        decode / (finished.num_generation_tokens - 1) if finished.num_generation_tokens > 1 else 0.0
    )
    return FinishedTimes(
        e2e_latency=e2e,
        queued_time=max(scheduled_time - arrival_time, 0.0),
        prefill_time=max(first_token_time - scheduled_time, 0.0),
        inference_time=max(last_token_time - scheduled_time, 0.0),
        decode_time=decode,
        mean_time_per_output_token=tpot,
    )


@dataclass(slots=True)
class _EngineHandle:
    index: int
    process: ForkProcess
    input_conn: Connection
    output_conn: Connection
    pid: int = 0
    worker_pids: tuple[int, ...] = ()
    latest_stats: SchedulerStats | None = None
    in_flight: int = 0
    sleeping: bool = False
    # for the periodic log line
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0


class EngineClient:
    """Starts the engines and serves requests through them (see the module docstring)."""

    def __init__(
        self,
        engine_configs: Sequence[EngineConfig],
        scheduler_config: SchedulerConfig,
        step_time_seconds: float,
        exposition: Callable[[], MetricsPage | None] = lambda: None,
        frontend: Frontend | None = None,
    ) -> None:
        self._configs = tuple(engine_configs)
        self._frontend = frontend
        self._scheduler_config = scheduler_config
        self._step_time_seconds = step_time_seconds
        self._exposition_source = exposition
        self._engines: list[_EngineHandle] = []
        self._requests: dict[str, RequestState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._send_queue: queue.Queue[tuple[int, EngineInput] | None] = queue.Queue()
        self._calls: dict[int, asyncio.Future[bool]] = {}
        self._call_ids = itertools.count(1)
        self._turns = itertools.count()
        self._closing = False
        self.errored = False
        self.dead_reason = ""

    # ------------------------------------------------------------ lifecycle

    @property
    def engine_indexes(self) -> tuple[int, ...]:
        """The DP ranks, in order."""
        return tuple(c.engine_index for c in self._configs)

    @property
    def worker_pids(self) -> tuple[tuple[int, ...], ...]:
        """Worker process ids per engine (empty with TP=1)."""
        return tuple(e.worker_pids for e in self._engines)

    def start(self) -> None:
        """Fork the engines and wait for each to report ready (call before any thread starts)."""
        ctx = multiprocessing.get_context("fork")
        pipes = [(ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)) for _ in self._configs]
        owner_pid = os.getpid()
        for config, ((in_reader, in_writer), (out_reader, out_writer)) in zip(
            self._configs, pipes, strict=True
        ):
            # The child keeps only its own ends; everything else it inherited is closed.
            others = tuple(
                conn
                for (a, b), (c, d) in pipes
                for conn in (a, b, c, d)
                if conn not in (in_reader, out_writer)
            )
            process = ctx.Process(
                target=run_engine_core,
                args=(config, in_reader, out_writer, owner_pid, others),
                name=f"VLLM::{config.title}",
                daemon=False,
            )
            process.start()
            self._engines.append(_EngineHandle(config.engine_index, process, in_writer, out_reader))
        for (in_reader, _), (_, out_writer) in pipes:
            in_reader.close()
            out_writer.close()
        deadline = time.monotonic() + ENGINE_READY_TIMEOUT_SECONDS
        for engine in self._engines:
            remaining = deadline - time.monotonic()
            if not engine.output_conn.poll(max(remaining, 0.0)):
                self.shutdown()
                raise EngineStartError(f"engine {engine.index} did not start within 30 s")
            try:
                message = engine.output_conn.recv()
            except EOFError as exc:
                self.shutdown()
                raise EngineStartError(
                    f"engine {engine.index} exited during start-up "
                    f"(exit code {engine.process.exitcode})"
                ) from exc
            if not isinstance(message, EngineReady):
                self.shutdown()
                raise EngineStartError(f"engine {engine.index} sent {message!r} instead of ready")
            engine.pid = message.pid
            engine.worker_pids = message.worker_pids

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the reader, sender and monitor threads, delivering to `loop`."""
        self._loop = loop
        for engine in self._engines:
            threading.Thread(
                target=self._read_outputs, args=(engine, loop), name=f"EngineOutput{engine.index}",
                daemon=True,
            ).start()  # fmt: skip
        threading.Thread(target=self._send_inputs, name="EngineInput", daemon=True).start()
        threading.Thread(target=self._monitor, name="EngineMonitor", daemon=True).start()

    def start_fault_clock(self, origin_at: float) -> None:
        """Tell every engine that the server is ready: its fault times count from `origin_at`."""
        for index in range(len(self._engines)):
            self._send_queue.put((index, StartFaultClock(origin_at)))

    def shutdown(self) -> None:
        """Stop every engine: ask, then SIGTERM, then SIGKILL."""
        self._closing = True
        self._send_queue.put(None)
        for engine in self._engines:
            with contextlib.suppress(BrokenPipeError, OSError):
                engine.input_conn.send(Shutdown())
        deadline = time.monotonic() + 2.0
        for engine in self._engines:
            engine.process.join(max(0.0, deadline - time.monotonic()))
        for engine in self._engines:
            if engine.process.is_alive():
                engine.process.terminate()
                engine.process.join(2.0)
            if engine.process.is_alive():
                engine.process.kill()
                engine.process.join(2.0)

    # ------------------------------------------------------------ requests

    def in_flight(self) -> int:
        """Requests accepted and not yet finished."""
        return len(self._requests)

    def is_pending(self, request_id: str) -> bool:
        """Whether `request_id` is still in flight."""
        return request_id in self._requests

    def queued(self) -> tuple[int, int]:
        """Requests (and their prompt tokens) that have not produced a first token yet."""
        waiting = [s for s in self._requests.values() if s.first_token_time is None]
        return len(waiting), sum(s.request.prompt_tokens for s in waiting)

    def add_request(self, request: SimRequest, arrival_time: float) -> RequestState:
        """Route `request` to the least loaded engine and start tracking it."""
        if self.errored:
            raise EngineDeadError(self.dead_reason or "engine dead")
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        # Least loaded; ties go round-robin so sequential requests spread over the engines.
        count = len(self._engines)
        turn = next(self._turns)
        engine = min(self._engines, key=lambda e: (e.in_flight, (e.index - turn) % count))
        state = RequestState(request=request, engine=engine.index, arrival_time=arrival_time)
        self._requests[request.request_id] = state
        engine.in_flight += 1
        if self._frontend is not None:
            self._frontend.add_request(request, arrival_time)
        self._send_queue.put((engine.index, AddRequest(request)))
        return state

    def abort_request(self, request_id: str) -> None:
        """Abort a request whose client went away (it finishes with reason "abort")."""
        state = self._requests.get(request_id)
        if state is not None:
            if self._frontend is not None:
                self._frontend.abort_request(request_id)
            self._send_queue.put((state.engine, AbortRequest(request_id)))

    def abort_requests(self, request_ids: Sequence[str] | None = None) -> int:
        """vLLM's `/abort_requests`: abort `request_ids`, or every request in flight when None.

        The count is what vLLM answers: the ids given (known or not), else those in flight.
        Each aborted request finishes with reason "abort" at its engine's next step.
        """
        ids = list(self._requests) if request_ids is None else list(request_ids)
        for request_id in ids:
            self.abort_request(request_id)
        return len(ids)

    async def pause(self, mode: str) -> None:
        """vLLM's `pause_generation(mode)`: "abort" aborts every request in flight first; the
        engines then pause (new requests wait until `resume`) and this returns once each has
        gone idle ("keep": at once)."""
        if mode == "abort":
            self.abort_requests()
        await self.call_utility("pause", mode=mode)

    async def resume(self) -> None:
        """vLLM's `resume_generation`."""
        await self.call_utility("resume")

    async def is_paused(self) -> bool:
        """Whether any engine is paused."""
        return any(await self.call_utility("is_paused"))

    def add_streaming_input(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """Send the next input chunk of a streaming-input session to its engine."""
        state = self._requests.get(request_id)
        if state is not None:
            self._send_queue.put(
                (state.engine, StreamingInputChunk(request_id, prompt_tokens, max_tokens))
            )

    def close_streaming_input(self, request_id: str) -> None:
        """Tell a streaming-input session's engine that no more input follows."""
        state = self._requests.get(request_id)
        if state is not None:
            self._send_queue.put((state.engine, CloseStreamingInput(request_id)))

    async def call_utility(self, method: str, level: int = 1, mode: str = "abort") -> list[bool]:
        """Run a utility call (`sleep`, `wake_up`, `is_sleeping`, `pause`, `resume`,
        `is_paused`) on every engine; their answers, by rank."""
        if self.errored:
            raise EngineDeadError(self.dead_reason or "engine dead")
        loop = asyncio.get_running_loop()
        futures = []
        for engine in self._engines:
            call_id = next(self._call_ids)
            future: asyncio.Future[bool] = loop.create_future()
            self._calls[call_id] = future
            futures.append(future)
            self._send_queue.put((engine.index, UtilityCall(call_id, method, level, mode)))
        answers = list(await asyncio.gather(*futures))
        exposition = self._exposition_source()
        if method in ("sleep", "wake_up"):
            for engine in self._engines:
                engine.sleeping = method == "sleep"
                if exposition is not None and exposition.stats is not None:
                    exposition.stats.record_sleep_state(
                        engine.index, awake=method == "wake_up", level=level
                    )
            if self._frontend is not None:  # vLLM's own logger sets every engine at once
                self._frontend.record_sleep_state(int(method == "sleep"), level)
        return answers

    # ------------------------------------------------------------ threads

    def _send_inputs(self) -> None:
        while True:
            item = self._send_queue.get()
            if item is None:
                return
            index, message = item
            try:
                self._engines[index].input_conn.send(message)
            except (BrokenPipeError, OSError):
                continue  # the monitor reports the dead engine

    def _read_outputs(self, engine: _EngineHandle, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                message = engine.output_conn.recv()
            except (EOFError, OSError):
                return
            try:
                loop.call_soon_threadsafe(self._on_output, message)
            except RuntimeError:  # the loop is closed: shutting down
                return

    def _monitor(self) -> None:
        sentinels = {e.process.sentinel: e for e in self._engines}
        ready = wait(list(sentinels))
        engine = sentinels[ready[0]]  # type: ignore[index]
        engine.process.join(1.0)
        if self._closing or self._loop is None:
            return
        reason = (
            f"Engine core proc {engine.process.name} (pid {engine.pid}) died unexpectedly "
            f"with exit code {engine.process.exitcode}"
        )
        try:
            self._loop.call_soon_threadsafe(self._on_engine_died, reason)
        except RuntimeError:
            return

    # ------------------------------------------------------------ on the event loop

    def _on_engine_died(self, reason: str) -> None:
        if self.errored:
            return
        self.errored = True
        self.dead_reason = reason
        log.error("%s, shutting down client.", reason)
        for state in list(self._requests.values()):
            state.events.put_nowait(
                FinishedRequest(
                    request_id=state.request.request_id,
                    finish_reason="abort",
                    num_prompt_tokens=state.request.prompt_tokens,
                    num_generation_tokens=state.num_generation_tokens,
                    num_cached_tokens=0,
                    num_preemptions=0,
                    max_tokens=state.request.max_tokens,
                )
            )
        self._requests.clear()
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        self._calls.clear()

    def _on_output(self, message: object) -> None:
        if isinstance(message, EngineOutputs):
            self._on_engine_outputs(message)
        elif isinstance(message, UtilityResult):
            future = self._calls.pop(message.call_id, None)
            if future is not None and not future.done():
                future.set_result(message.value)
        elif isinstance(message, EngineDead):
            self._on_engine_died(
                f"Engine core proc EngineCore_DP{message.engine_index} hit a fatal error: "
                f"{message.reason}"
            )
        elif not isinstance(message, EngineReady):
            log.error("unexpected engine output %r", message)

    def _on_engine_outputs(self, batch: EngineOutputs) -> None:
        engine = self._engines[batch.engine_index]
        exposition = self._exposition_source()
        stats_logger = exposition.stats if exposition is not None else None
        if batch.vllm_outputs and self._frontend is not None:
            self._frontend.record(batch.engine_index, batch.vllm_outputs)
        if batch.scheduler_stats is not None:
            engine.latest_stats = batch.scheduler_stats
            if stats_logger is not None:
                stats_logger.record(batch.engine_index, batch.scheduler_stats, None)
        now = time.time()
        for step in batch.steps:
            iteration = step.iteration_stats
            engine.prompt_tokens += iteration.num_prompt_tokens
            engine.generation_tokens += iteration.num_generation_tokens
            engine.preemptions += iteration.num_preemptions
            ttfts: list[float] = []
            itls: list[float] = []
            first = set(iteration.first_token_request_ids)
            for request_id, num_tokens in step.token_events:
                state = self._requests.get(request_id)
                if state is None:
                    continue
                if request_id in first or state.first_token_time is None:
                    state.first_token_time = step.timestamp
                    ttfts.append(max(step.timestamp - state.arrival_time, 0.0))
                elif state.last_token_time is not None:
                    itls.append(max(step.timestamp - state.last_token_time, 0.0))
                state.last_token_time = step.timestamp
                state.num_generation_tokens += num_tokens
                state.events.put_nowait(TokenDelta(num_tokens))
            phases: dict[str, FinishedTimes] = {}
            for finished in iteration.finished:
                state = self._requests.pop(finished.request_id, None)
                if state is None:
                    continue
                engine.in_flight -= 1
                phases[finished.request_id] = finished_times(
                    finished,
                    arrival_time=state.arrival_time,
                    first_token_time=state.first_token_time,
                    last_token_time=state.last_token_time or step.timestamp,
                    now=max(now, step.timestamp),
                    step_time_seconds=self._step_time_seconds,
                    max_num_batched_tokens=self._scheduler_config.max_num_batched_tokens,
                )
                state.events.put_nowait(finished)
            if stats_logger is not None:
                stats_logger.record(
                    batch.engine_index,
                    None,
                    iteration,
                    IterationTimes(tuple(ttfts), tuple(itls), phases),
                )

    async def log_stats_loop(self) -> None:
        """vLLM's periodic `Engine 000: Avg prompt throughput: ...` line, per engine."""
        last = time.monotonic()
        previous = {e.index: (0, 0) for e in self._engines}
        quiet = {e.index: 0 for e in self._engines}
        while True:
            await asyncio.sleep(LOG_STATS_INTERVAL_SECONDS)
            now = time.monotonic()
            elapsed = max(now - last, 1e-9)
            last = now
            for engine in self._engines:
                stats = engine.latest_stats
                if stats is None:
                    continue
                old_prompt, old_generation = previous[engine.index]
                prompt_rate = (engine.prompt_tokens - old_prompt) / elapsed
                generation_rate = (engine.generation_tokens - old_generation) / elapsed
                previous[engine.index] = (engine.prompt_tokens, engine.generation_tokens)
                quiet[engine.index] = (
                    0 if prompt_rate or generation_rate else quiet[engine.index] + 1
                )
                level = logging.DEBUG if quiet[engine.index] >= 2 else logging.INFO
                deferred = (
                    f"Deferred: {stats.num_skipped_waiting_reqs} reqs, "
                    if stats.num_skipped_waiting_reqs
                    else ""
                )
                log.log(
                    level,
                    "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation "
                    "throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, %sGPU KV "
                    "cache usage: %.1f%%",
                    engine.index,
                    prompt_rate,
                    generation_rate,
                    stats.num_running_reqs,
                    stats.num_waiting_reqs + stats.num_skipped_waiting_reqs,
                    deferred,
                    stats.kv_cache_usage * 100,
                )
