"""Tensor-parallel workers: `VLLM::Worker_TP<r>` processes, and the executors that drive them.

The shape follows vLLM's multiprocessing executor closely enough that a py-spy dump looks
the same: a worker sits in `worker_busy_loop` -> `dequeue` -> `acquire_read` until the
engine broadcasts a step, runs `execute_model` (the simulated forward pass, then an
`all_reduce` across ranks) and answers on its response queue. The engine submits the
step and waits in `future.result()` while an I/O thread collects the answers.

Under the `collective-hang` fault every rank blocks for good inside `ncclAllReduce`, the
way ranks hang when one peer never joins a collective; the engine waits on them forever
(or, with TP > 1, until `VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`, like vLLM's executor).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, ForkProcess

from wedgewatch.lab.sim.proctitle import configure_process_logging, set_process_title

log = logging.getLogger("wedgewatch.lab.sim.worker")

# How often a blocked reader wakes up to check that its parent is still alive.
LIVENESS_POLL_SECONDS = 0.5


class ParentGone(Exception):
    """The process that owns this one has died; the caller should exit quietly."""


@dataclass(frozen=True, slots=True)
class ModelStep:
    """What the engine broadcasts to the workers for one scheduled step."""

    step: int
    num_scheduled_tokens: int
    hang: bool = False  # `collective-hang`: this step's all-reduce never completes
    seconds: float | None = None  # how long this forward pass takes; None: the worker's step time


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """A worker's answer for one step (only the driver rank's is used, as in vLLM)."""

    step: int
    rank: int


class MessageQueue:
    """One direction of an engine<->worker channel (vLLM: `shm_broadcast.MessageQueue`)."""

    def __init__(self, conn: Connection, owner_pid: int | None = None) -> None:
        self._conn = conn
        self._owner_pid = owner_pid  # reader side: the process whose death ends the wait

    def enqueue(self, obj: object) -> None:
        """Send one message."""
        self._conn.send(obj)

    def dequeue(self, timeout: float | None = None) -> object:
        """Wait for the next message and return it."""
        self.acquire_read(timeout)
        return self._conn.recv()

    def acquire_read(self, timeout: float | None = None) -> None:
        """Block until a message can be read (vLLM spins here on shared memory)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._conn.poll(LIVENESS_POLL_SECONDS):
            if self._owner_pid is not None and os.getppid() != self._owner_pid:
                raise ParentGone
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no message within {timeout} seconds")

    def close(self) -> None:
        """Close the underlying connection."""
        self._conn.close()


class Worker:
    """The GPU side of one rank: a forward pass that takes `step_time_seconds`."""

    def __init__(self, rank: int, step_time_seconds: float, owner_pid: int | None) -> None:
        self.rank = rank
        self.step_time_seconds = step_time_seconds
        self._owner_pid = owner_pid

    def execute_model(self, model_step: ModelStep) -> ModelOutput:
        """Run the simulated forward pass, then the tensor-parallel all-reduce."""
        seconds = self.step_time_seconds if model_step.seconds is None else model_step.seconds
        if seconds > 0:
            time.sleep(seconds)
        self.all_reduce(model_step)
        return ModelOutput(step=model_step.step, rank=self.rank)

    def all_reduce(self, model_step: ModelStep) -> None:
        """The collective every rank joins at the end of a layer stack."""
        if model_step.hang:
            self.ncclAllReduce()

    def ncclAllReduce(self) -> None:  # named like the NCCL call it stands for
        """A collective whose peer never arrives: it never returns (`collective-hang`)."""
        log.warning("fault collective-hang: rank %d is stuck in ncclAllReduce", self.rank)
        never = threading.Event()
        while not never.wait(LIVENESS_POLL_SECONDS):
            if self._owner_pid is not None and os.getppid() != self._owner_pid:
                raise ParentGone


class WorkerProc:
    """A worker process's main object (vLLM: `WorkerProc`)."""

    def __init__(
        self,
        worker: Worker,
        rpc_broadcast_mq: MessageQueue,
        worker_response_mq: MessageQueue,
    ) -> None:
        self.worker = worker
        self.rpc_broadcast_mq = rpc_broadcast_mq
        self.worker_response_mq = worker_response_mq

    def worker_busy_loop(self) -> None:
        """Wait for a broadcast, run it, answer; until told to shut down."""
        while True:
            message = self.rpc_broadcast_mq.dequeue()
            if message is None:  # shutdown
                return
            if not isinstance(message, ModelStep):
                raise TypeError(f"unexpected message for a worker: {message!r}")
            output = self.worker.execute_model(message)
            self.worker_response_mq.enqueue(output)


def worker_title(rank: int, tp_size: int, dp_rank: int, dp_size: int) -> str:
    """vLLM's worker title: `Worker` plus `_DP<r>`/`_TP<r>` for each dimension larger than 1."""
    name = "Worker"
    if dp_size > 1:
        name += f"_DP{dp_rank}"
    if tp_size > 1:
        name += f"_TP{rank}"
    return name


def worker_main(
    *,
    rank: int,
    title: str,
    step_time_seconds: float,
    owner_pid: int,
    broadcast_reader: Connection,
    response_writer: Connection,
    close_in_child: Sequence[Connection],
) -> None:
    """Entry point of a worker process (forked from the engine)."""
    for conn in close_in_child:
        conn.close()
    set_process_title(title)
    configure_process_logging(title)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the engine decides when workers stop
    proc = WorkerProc(
        Worker(rank, step_time_seconds, owner_pid),
        MessageQueue(broadcast_reader, owner_pid),
        MessageQueue(response_writer),
    )
    try:
        proc.worker_busy_loop()
    except (ParentGone, EOFError, BrokenPipeError):
        os._exit(0)


class UniProcExecutor:
    """TP=1: the model runs inside the engine process, in the engine's own thread."""

    def __init__(self, step_time_seconds: float) -> None:
        self.worker = Worker(0, step_time_seconds, owner_pid=None)
        self.worker_pids: tuple[int, ...] = ()

    def execute_model(self, model_step: ModelStep) -> Future[ModelOutput]:
        """Run the step now and return a completed future (vLLM's non_block path)."""
        future: Future[ModelOutput] = Future()
        future.set_result(self.worker.execute_model(model_step))
        return future

    def shutdown(self) -> None:
        """Nothing to stop."""


class MultiprocExecutor:
    """TP>1: one forked worker process per rank; the engine broadcasts and collects."""

    def __init__(
        self,
        ctx: ForkContext,
        *,
        tp_size: int,
        dp_rank: int,
        dp_size: int,
        step_time_seconds: float,
        execute_model_timeout_seconds: float | None,
    ) -> None:
        self._timeout = execute_model_timeout_seconds
        self._broadcast: list[MessageQueue] = []
        self._responses: list[MessageQueue] = []
        self._procs: list[ForkProcess] = []
        owner_pid = os.getpid()
        for rank in range(tp_size):
            broadcast_reader, broadcast_writer = ctx.Pipe(duplex=False)
            response_reader, response_writer = ctx.Pipe(duplex=False)
            title = worker_title(rank, tp_size, dp_rank, dp_size)
            proc = ctx.Process(
                target=worker_main,
                name=f"VLLM::{title}",
                kwargs={
                    "rank": rank,
                    "title": title,
                    "step_time_seconds": step_time_seconds,
                    "owner_pid": owner_pid,
                    "broadcast_reader": broadcast_reader,
                    "response_writer": response_writer,
                    "close_in_child": (broadcast_writer, response_reader),
                },
                daemon=False,
            )
            proc.start()
            broadcast_reader.close()
            response_writer.close()
            self._broadcast.append(MessageQueue(broadcast_writer))
            self._responses.append(MessageQueue(response_reader))
            self._procs.append(proc)
        self.worker_pids = tuple(p.pid for p in self._procs if p.pid is not None)
        self.io_thread_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mp_exec_io")

    def execute_model(self, model_step: ModelStep) -> Future[ModelOutput]:
        """Broadcast the step to every rank; the future resolves when all have answered."""
        for mq in self._broadcast:
            mq.enqueue(model_step)
        return self.io_thread_pool.submit(self.get_response)

    def get_response(self) -> ModelOutput:
        """Collect every rank's answer (runs on the I/O thread); the driver's is the result."""
        outputs = []
        for mq in self._responses:
            try:
                output = mq.dequeue(timeout=self._timeout)
            except TimeoutError as exc:
                raise TimeoutError(
                    f"RPC call to execute_model timed out after {self._timeout} seconds "
                    "(VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS)"
                ) from exc
            except EOFError as exc:
                raise RuntimeError("a worker process died during execute_model") from exc
            if not isinstance(output, ModelOutput):
                raise TypeError(f"unexpected worker answer: {output!r}")
            outputs.append(output)
        return outputs[0]

    def shutdown(self) -> None:
        """Stop the workers: ask politely, then terminate, then kill."""
        for mq in self._broadcast:
            with contextlib.suppress(BrokenPipeError, OSError):
                mq.enqueue(None)
        deadline = time.monotonic() + 1.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        self.io_thread_pool.shutdown(wait=False, cancel_futures=True)


Executor = UniProcExecutor | MultiprocExecutor
