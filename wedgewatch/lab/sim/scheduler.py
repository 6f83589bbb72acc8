"""A pure, deterministic, discrete-step model of vLLM's v1 scheduler, following a named release.

The model follows the structure of ``vllm/v1/core/sched/scheduler.py`` (and ``async_scheduler.py``)
of the release it names with ``vllm_structure``: ``"0.30"`` (vLLM 0.30.0, the default, the last
release with one mixed ``skipped_waiting`` queue) or ``"0.31+"`` (vLLM 0.31.0 and later, PR
#58947: waiting requests that hold KV blocks sit in ``kv_holding_waiting``, drained before
``waiting``). Its KV connector is ``wedgewatch/lab/sim/offload.py`` (vLLM's ``OffloadingConnector``,
or ``SimpleCPUOffloadConnector``), with the worker side emulated exactly as the real-scheduler
harness ``wedgewatch/lab/real/vllm_engine.py`` emulates it. Nothing reads a clock or a global random
generator; the same requests in the same order give the same results.

One call to :meth:`Scheduler.step` is one EngineCore step. With ``async_scheduling`` off it is
``EngineCore.step``: ``schedule`` -> execute -> ``update_from_output``. With it on (the CUDA
default) it is ``EngineCore.step_with_batch_queue`` with a queue of 2: ``schedule`` runs and the
batch is executed, then the *previous* batch's output (its tokens and its connector report) is
processed. So every ``schedule()`` sees the transfers as they stood one step earlier.

Rules (in the order one step applies them)
------------------------------------------
1. Aborts received since the last step finish their requests ("abort"); an aborted load keeps its
   blocks until its transfer lands.
2. ``schedule()``, running phase: every running request gets its next tokens (the rest of its
   prompt, chunked to the token budget, or one decode token; under async scheduling a decode is
   scheduled on a placeholder before the previous token came back). When blocks run out the
   last running request is preempted (blocks freed, PREEMPTED, prepended to ``waiting``; its
   pending stores are flushed) until the request fits or preempted itself. A preemption skips
   the waiting phase for this step. Under async scheduling with a connector, blocks a batch in
   flight may still write are freed only once its output is processed (vLLM's deferred block
   frees), and a request whose blocks cannot be freed yet is not preempted (the scan stops).
3. ``schedule()``, waiting phase, while the budget lasts and fewer than ``max_num_seqs`` run.
   Queue choice: 0.30 takes the head of ``skipped_waiting`` whenever it is non-empty, else of
   ``waiting``; 0.31+ takes ``kv_holding_waiting`` first, else ``waiting``. Per head:
   * a parked load is promoted once its transfer was reported (its blocks become prefix-cache
     entries, WAITING or PREEMPTED); otherwise it is skipped (``continue``);
   * a request whose preemption output is still in flight (async) is skipped;
   * a request with no computed tokens looks up the GPU prefix cache, then asks the connector
     for the rest. ``None`` (the request still has transfers in flight, or its hit reaches a
     block still being stored or a chunk another request is loading) skips it, holding nothing;
   * a CPU hit becomes an async load: blocks for the hit are allocated only if they fit in
     ``free - reserved`` (``reserved``: what every other in-flight prefill or load still needs,
     the #44560 gate); it is parked holding them;
   * with ``reserve_full_isl`` (``scheduler_reserve_full_isl``, default on) a waiting request is
     admitted only if its whole sequence fits in the free blocks;
   * an allocation that does not fit ends the whole scan (``break``); under the
     ``skip-head-when-idle`` policy (the PR #45406 idea) the head is skipped instead while
     nothing runs.
   Skipped requests go back in front: 0.30 puts them all at the front of ``skipped_waiting``
   (block holders and block-less requests mixed); 0.31+ puts block holders at the front of
   ``kv_holding_waiting`` and the others at the front of ``waiting``.
4. The connector turns the blocks this batch completes into store jobs (stores as blocks are
   computed), issues the loads admitted above and flushes the stores of preempted requests.
5. Execute (emulated GPU): a request whose scheduled tokens reach the end of its sequence
   samples one token; the connector workers move stores and loads (``offload.py``).
6. ``update_from_output`` for the batch whose turn it is: tokens are appended (a request
   finishes with "length" at ``max_tokens`` or ``max_model_len``), the connector's completed
   jobs and landed loads are applied.

"Deferred" (``vllm:num_requests_waiting_by_reason``) means what the release means: in 0.30 the
length of ``skipped_waiting``; in 0.31+ the requests carrying the sticky per-request deferred
flag (set when a scan skips them or they are enqueued blocked, cleared when they run).

Streaming input (vLLM's resumable sessions): a request added with ``streaming_input`` does not
finish when its segment's output is done; it pauses as WAITING_FOR_STREAMING_REQ (deferred),
keeping its KV blocks and its place in the batch limit, and the scan passes over it until
``add_streaming_input`` appends the next input chunk; ``close_streaming_input`` finishes a paused
session ("stop").

No rule looks at the gauges: when the scan keeps breaking at a head that can never fit while the
blocks it needs are held by parked loads behind it, the model schedules nothing forever on its
own. ``docs/simulator.md`` ("Scheduler model") names the interleaving.
"""

from __future__ import annotations

import enum
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import Literal, get_args

from wedgewatch.lab.sim.kvcache import BlockHash, BlockPool
from wedgewatch.lab.sim.offload import (
    ConnectorMeta,
    ConnectorOutput,
    ConnectorWorkers,
    OffloadConnector,
    TransferFault,
)
from wedgewatch.lab.sim.version import EMULATED_RELEASES

SchedulerFix = Literal["stock", "skip-head-when-idle"]
VllmStructure = Literal["0.30", "0.31+"]
VLLM_STRUCTURES: tuple[VllmStructure, ...] = ("0.30", "0.31+")
DEFAULT_VLLM_VERSION = EMULATED_RELEASES["0.30"]
"""The release the model follows by default: the last one with the mixed ``skipped_waiting``."""
FinishReason = Literal["stop", "length", "abort"]
PauseState = Literal["unpaused", "new", "all"]
"""vLLM's ``PauseState`` (``/pause``): ``new`` (PAUSED_NEW: nothing leaves the waiting queues,
running requests go on) or ``all`` (PAUSED_ALL: nothing is scheduled at all)."""

GIB = 1024**3

DEFAULT_BYTES_PER_TOKEN_PER_RANK = 131_072
"""KV bytes one token occupies on one TP rank in the reference model: a Qwen3-32B-like dense model
(64 layers, 8 KV heads, head size 128, K and V, bf16 = 256 KiB per token) split over TP=2."""

DEFAULT_TENSOR_PARALLEL_SIZE = 2


def cpu_blocks_from_gib(
    kv_offloading_size_gib: float,
    block_size: int = 16,
    bytes_per_token_per_rank: int = DEFAULT_BYTES_PER_TOKEN_PER_RANK,
    tensor_parallel_size: int = DEFAULT_TENSOR_PARALLEL_SIZE,
) -> int:
    """Map ``--kv-offloading-size`` (GiB summed over all TP ranks) to CPU-tier blocks.

    60 GiB with the defaults: 60 GiB / (128 KiB x 2 ranks) = 245 760 tokens = 15 360 blocks of 16.
    """
    if kv_offloading_size_gib < 0:
        raise ValueError(f"kv_offloading_size_gib must be >= 0, got {kv_offloading_size_gib}")
    if block_size < 1 or bytes_per_token_per_rank < 1 or tensor_parallel_size < 1:
        raise ValueError(
            "block_size, bytes_per_token_per_rank and tensor_parallel_size must be >= 1, got "
            f"{block_size}, {bytes_per_token_per_rank}, {tensor_parallel_size}"
        )
    bytes_per_token = bytes_per_token_per_rank * tensor_parallel_size
    tokens = int(kv_offloading_size_gib * GIB) // bytes_per_token
    return tokens // block_size


PRODUCTION_KV_OFFLOADING_SIZE_GIB = 60.0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The engine's scheduling and KV-cache settings; defaults are the wedging production profile.

    The profile is the one of vLLM issue #53868 (TP=2, ``--max-num-seqs 6``,
    ``--max-num-batched-tokens 4096``, prefix caching, chunked prefill,
    ``--kv-offloading-size 60``), with a GPU pool of 2048 blocks of 16 tokens: exactly one
    ``max_model_len`` sequence, small enough that a burst of long prompts fills it, as the
    KV headroom left by a large model on two 24 GB cards does.
    """

    num_gpu_blocks: int = 2048
    block_size: int = 16
    num_cpu_blocks: int = cpu_blocks_from_gib(PRODUCTION_KV_OFFLOADING_SIZE_GIB)
    """CPU offload tier capacity in blocks; 0 = no offloading (no KV connector)."""
    max_num_seqs: int = 6
    max_num_batched_tokens: int = 4096
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    kv_load_steps: int = 3
    """Steps from issuing an async CPU->GPU load to the request being promotable."""
    kv_store_blocks_per_step: int = 16
    """GPU->CPU store bandwidth in blocks per step (0 = the whole store pipe drains every step).
    16 blocks of 16 tokens at 128 KiB per token per rank is 32 MiB per rank per step: ~6.7 GB/s
    at 5 ms/step."""
    policy: SchedulerFix = "stock"
    vllm_structure: VllmStructure = "0.30"
    """Whose scheduler structure: vLLM 0.30.0's (one mixed ``skipped_waiting``) or 0.31+'s."""
    async_scheduling: bool = True
    """``--async-scheduling`` (vLLM's default on CUDA): a batch queue of 2."""
    reserve_full_isl: bool = True
    """``scheduler_reserve_full_isl`` (vLLM's default): admit only what fits whole."""
    simple_kv_offload: bool = False
    """``VLLM_USE_SIMPLE_KV_OFFLOAD=1``: ``SimpleCPUOffloadConnector`` instead of
    ``OffloadingConnector``."""
    max_model_len: int = 32768
    early_stop_fraction: float = 0.0
    """Fraction of requests (chosen by a hash of the request id) that finish with "stop" before
    ``max_tokens``; the sim emits no EOS otherwise."""

    def __post_init__(self) -> None:
        positive = {
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_load_steps": self.kv_load_steps,
            "max_model_len": self.max_model_len,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.kv_store_blocks_per_step < 0:
            raise ValueError(
                f"kv_store_blocks_per_step must be >= 0, got {self.kv_store_blocks_per_step}"
            )
        if self.vllm_structure not in VLLM_STRUCTURES:
            raise ValueError(
                f"vllm_structure must be one of {', '.join(VLLM_STRUCTURES)}, "
                f"got {self.vllm_structure!r}"
            )
        if self.policy not in get_args(SchedulerFix):
            raise ValueError(
                f"policy must be one of {', '.join(get_args(SchedulerFix))}, got {self.policy!r}"
            )
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"max_model_len {self.max_model_len} does not fit in the KV cache "
                f"({self.num_gpu_blocks} blocks x {self.block_size} tokens = "
                f"{self.num_gpu_blocks * self.block_size} tokens); vLLM refuses to start"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) "
                f"must be >= max_model_len ({self.max_model_len})"
            )
        if not 0.0 <= self.early_stop_fraction <= 1.0:
            raise ValueError(
                f"early_stop_fraction must be within [0, 1], got {self.early_stop_fraction}"
            )


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One generation request as the engine receives it (token counts only, no token ids)."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    prefix_id: str | None = None
    """Requests with the same prefix_id have identical first ``prefix_tokens`` tokens."""
    prefix_tokens: int = 0
    streaming_input: bool = False
    """A resumable session: more input chunks follow (``add_streaming_input``) until closed."""


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """What vLLM's ``SchedulerStats`` carries: published every step, even an empty one."""

    num_running_reqs: int
    num_waiting_reqs: int
    """``len(waiting)``: reason "capacity"."""
    num_skipped_waiting_reqs: int
    """``len(skipped_waiting)``: reason "deferred"."""
    kv_cache_usage: float
    prefix_cache_queries: int
    """GPU prefix-cache lookups this step, in tokens (a head re-examined every step re-counts)."""
    prefix_cache_hits: int
    num_free_blocks: int
    external_prefix_cache_queries: int = 0
    """CPU-tier (KV connector) lookups this step, in tokens beyond the GPU hit."""
    external_prefix_cache_hits: int = 0


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """A request that finished this step, as vLLM's ``FinishedRequestStats`` sees it."""

    request_id: str
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class IterationStats:
    """Token accounting of a step that produced output for at least one request."""

    num_prompt_tokens: int
    """Total prompt length of prefills that completed this step (their first token was emitted)."""
    num_prompt_tokens_cached: int
    """Of those, tokens found in the GPU prefix cache (``source="local_cache_hit"``)."""
    num_prompt_tokens_computed: int
    """Of those, tokens computed (``source="local_compute"``)."""
    num_prompt_tokens_external: int
    """Of those, tokens loaded from the CPU tier (``source="external_kv_transfer"``)."""
    num_generation_tokens: int
    num_preemptions: int
    """Preemption events delivered this step (vLLM ships them with the request's next output)."""
    first_token_request_ids: tuple[str, ...]
    finished: tuple[FinishedRequest, ...]
    num_iteration_tokens: int
    """What vLLM observes into ``vllm:iteration_tokens_total``: prompt + generation tokens."""


@dataclass(frozen=True, slots=True)
class StepResult:
    """Everything one engine step produced."""

    step: int
    scheduled: bool
    num_scheduled_tokens: int
    scheduler_stats: SchedulerStats
    iteration_stats: IterationStats | None
    token_events: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """One request as the scheduler holds it, for inspection (tests, debugging, evidence)."""

    request_id: str
    status: str
    """"waiting", "preempted", "running", "waiting_for_remote_kvs" or
    "waiting_for_streaming_req"."""
    num_blocks: int
    """GPU blocks the request holds."""
    num_computed_tokens: int
    num_tokens: int
    kv_load_in_flight: bool
    """An async CPU->GPU load has not been reported done (a landed load is promoted only by the
    scan)."""
    transfers_in_flight: bool = False
    """The connector still has a store or load of this request in flight."""


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The scheduler's queues in scan order.

    Under 0.31+ ``skipped_waiting`` lists ``kv_holding_waiting`` (the block holders)."""

    running: tuple[QueuedRequest, ...]
    waiting: tuple[QueuedRequest, ...]
    skipped_waiting: tuple[QueuedRequest, ...]


class _Status(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    WAITING_FOR_STREAMING_REQ = "waiting_for_streaming_req"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class _Request:
    """Mutable scheduler-side state of one request."""

    __slots__ = (
        "_hashes",
        "blocks",
        "cached_external",
        "cached_local",
        "deferred",
        "in_flight",
        "last_sched_seq",
        "load_ready",
        "max_tokens",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_prompt",
        "num_shared_blocks",
        "placeholders",
        "prefill_chunk",
        "prefix_key",
        "request_id",
        "session_closed",
        "stale",
        "status",
        "stop_at",
        "streaming",
        "undelivered_preemptions",
    )

    def __init__(self, spec: SimRequest, block_size: int, stop_at: int) -> None:
        self.request_id = spec.request_id
        self.num_prompt = spec.prompt_tokens
        self.max_tokens = spec.max_tokens
        self.prefix_key = spec.prefix_id or ""
        self.num_shared_blocks = spec.prefix_tokens // block_size if spec.prefix_id else 0
        self.stop_at = stop_at
        self.status = _Status.WAITING
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.num_cached_blocks = 0
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.cached_local = 0
        self.cached_external = 0
        self._hashes: list[BlockHash] = []
        self.load_ready = False
        self.placeholders = 0
        self.in_flight = 0
        self.last_sched_seq = 0
        self.stale = 0
        self.prefill_chunk = True
        self.deferred = False
        self.undelivered_preemptions = 0
        self.streaming = spec.streaming_input
        self.session_closed = False

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + self.num_output

    def block_hash(self, index: int) -> BlockHash:
        if index < self.num_shared_blocks:
            return ("prefix", self.prefix_key, index)
        return ("request", self.request_id, index)

    def block_hashes(self, start: int, stop: int) -> list[BlockHash]:
        return self.hashes(stop)[start:stop]

    def hashes(self, count: int) -> list[BlockHash]:
        """The content keys of the first ``count`` blocks (or more: read only ``[:count]``)."""
        cached = self._hashes
        if len(cached) < count:
            cached.extend(self.block_hash(index) for index in range(len(cached), count))
        return cached

    @property
    def holds_blocks(self) -> bool:
        """vLLM 0.31+'s ``_holds_kv_blocks``: computed tokens, or a load in flight."""
        return self.num_computed > 0 or self.status is _Status.WAITING_FOR_REMOTE_KVS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _stop_point(request: SimRequest, fraction: float) -> int:
    """The output length at which a request finishes with "stop", or 0 for never."""
    if fraction <= 0.0 or request.max_tokens <= 1:
        return 0
    digest = zlib.crc32(request.request_id.encode())
    if (digest % 10_000) / 10_000 >= fraction:
        return 0
    return 1 + (digest // 10_000) % (request.max_tokens - 1)


@dataclass(slots=True)
class _Batch:
    """One scheduled batch between ``schedule()`` and its ``update_from_output``."""

    scheduled: dict[_Request, int]
    sampled: tuple[_Request, ...]
    connector_output: ConnectorOutput
    queries: list[int]


def _final_store_blocks(request: _Request, block_size: int) -> int:
    """Full blocks a finished request stores: up to its last committed token (vLLM clamps to
    ``max(num_prompt_tokens, num_tokens - 1)``)."""
    return min(len(request.blocks), max(request.num_prompt, request.num_tokens - 1) // block_size)


_BLOCKED = (_Status.WAITING_FOR_REMOTE_KVS, _Status.WAITING_FOR_STREAMING_REQ)


class Scheduler:
    """vLLM's v1 FCFS scheduler of one release with its KV connector, stepped by the caller."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self._has_connector = config.num_cpu_blocks > 0
        self._connector = OffloadConnector(config.num_cpu_blocks, simple=config.simple_kv_offload)
        self._workers = ConnectorWorkers(config.kv_load_steps, config.kv_store_blocks_per_step)
        self._v030 = config.vllm_structure == "0.30"
        self._requests: dict[str, _Request] = {}
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        # 0.30: skipped_waiting (mixed); 0.31+: kv_holding_waiting (block holders only).
        self._skipped: deque[_Request] = deque()
        # Requests still prefilling (chunked prefills and parked loads): their remaining blocks
        # are the reservation that gates new async loads (#44560). A dict keeps order stable.
        self._inflight: dict[_Request, None] = {}
        self._pending_aborts: list[str] = []
        # Aborted requests whose async load is still in flight: blocks are freed when it lands.
        self._orphan_loads: list[_Request] = []
        self._finished_for_store: list[_Request] = []
        self._batches: deque[_Batch] = deque()
        self._batch_queue_size = 2 if config.async_scheduling else 1
        self._allocated: list[int] = []
        # Deferred block frees (vLLM: defer_block_free, on with overlapping batches and a KV
        # connector that loads): blocks a batch in flight may still write wait for its output.
        self._defer_free = config.async_scheduling and self._has_connector
        self._sched_seq = 0
        self._processed_seq = 0
        self._deferred_frees: deque[tuple[int, list[int]]] = deque()
        self._step = 0
        self._pause: PauseState = "unpaused"
        # Streaming-input sessions paused between chunks: deferred, yet holding a batch slot.
        self._num_paused_sessions = 0
        self._pending_closes: list[str] = []

    # ------------------------------------------------------------------ public surface

    def add_request(self, request: SimRequest) -> None:
        """Queue a new request at the back of ``waiting`` (reason "capacity")."""
        cfg = self.config
        if request.request_id in self._requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not 1 <= request.prompt_tokens < cfg.max_model_len:
            raise ValueError(
                f"request {request.request_id!r}: prompt_tokens must be within "
                f"[1, {cfg.max_model_len - 1}] (max_model_len {cfg.max_model_len}), "
                f"got {request.prompt_tokens}"
            )
        if request.max_tokens < 1:
            raise ValueError(
                f"request {request.request_id!r}: max_tokens must be >= 1, got {request.max_tokens}"
            )
        if not 0 <= request.prefix_tokens <= request.prompt_tokens:
            raise ValueError(
                f"request {request.request_id!r}: prefix_tokens must be within "
                f"[0, prompt_tokens={request.prompt_tokens}], got {request.prefix_tokens}"
            )
        state = _Request(request, cfg.block_size, _stop_point(request, cfg.early_stop_fraction))
        self._requests[request.request_id] = state
        self._waiting.append(state)

    def abort_request(self, request_id: str) -> None:
        """Ask to abort a request; it finishes with "abort" at the start of the next step.

        Unknown or already finished ids are ignored, as vLLM ignores them.
        """
        self._pending_aborts.append(request_id)

    def arm_fault(self, fault: TransferFault) -> None:
        """From now on, the next store (``lost-store-event``) or load (``hung-load``) that the
        connector workers start never completes on one TP rank."""
        self._workers.arm(fault)

    def add_streaming_input(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """Append an input chunk to a streaming session: `prompt_tokens` more, then up to
        `max_tokens` more output. A paused session becomes schedulable again (status WAITING,
        still in the deferred queue); unknown ids are ignored, as for aborts."""
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError(
                f"streaming input needs prompt_tokens and max_tokens >= 1, got "
                f"{prompt_tokens}, {max_tokens}"
            )
        session = self._requests.get(request_id)
        if session is None or not session.streaming or session.session_closed:
            return
        session.num_prompt += prompt_tokens
        session.max_tokens = session.num_output + max_tokens
        if session.status is _Status.WAITING_FOR_STREAMING_REQ:
            self._num_paused_sessions -= 1
            session.status = _Status.WAITING

    def close_streaming_input(self, request_id: str) -> None:
        """No more input for a session: a paused one finishes ("stop") at the next step, a busy
        one when its current segment ends."""
        session = self._requests.get(request_id)
        if session is not None and session.streaming:
            session.session_closed = True
            self._pending_closes.append(request_id)

    @property
    def pause_state(self) -> PauseState:
        """The pause state `/pause` set ("unpaused" until then)."""
        return self._pause

    def set_pause_state(self, state: PauseState) -> None:
        """vLLM's ``Scheduler.set_pause_state``: under ``new`` the waiting queues are not
        scheduled (new requests queue there until ``unpaused``); under ``all`` nothing is.

        As in vLLM, a paused scheduler does not count waiting requests as work (``all``: not
        even running ones), so the engine loop goes idle once the rest has drained.
        """
        self._pause = state

    def has_work(self) -> bool:
        """Whether the engine loop must keep stepping (vLLM's ``has_requests`` or a batch)."""
        if self._pause == "all":
            return bool(self._pending_aborts or self._batches)
        queued = self._pause == "unpaused" and bool(self._waiting or self._skipped)
        return bool(
            self._running
            or queued
            or self._pending_aborts
            or self._orphan_loads
            or self._batches
            or self._finished_for_store
            or self._connector.jobs
        )

    @property
    def num_running(self) -> int:
        """``len(running)`` (includes requests still in chunked prefill)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Waiting requests of reason "capacity"."""
        return self._num_waiting_and_deferred()[0]

    @property
    def num_free_blocks(self) -> int:
        """GPU blocks no request holds (cached-but-free blocks count as free)."""
        return self._pool.num_free

    def snapshot(self) -> QueueSnapshot:
        """The queues as they stand between steps."""
        connector = self._connector

        def view(requests: Iterable[_Request]) -> tuple[QueuedRequest, ...]:
            return tuple(
                QueuedRequest(
                    request_id=r.request_id,
                    status=r.status.value,
                    num_blocks=len(r.blocks),
                    num_computed_tokens=r.num_computed,
                    num_tokens=r.num_tokens,
                    kv_load_in_flight=(
                        r.status is _Status.WAITING_FOR_REMOTE_KVS and not r.load_ready
                    ),
                    transfers_in_flight=connector.has_jobs(r),
                )
                for r in requests
            )

        return QueueSnapshot(
            running=view(self._running),
            waiting=view(self._waiting),
            skipped_waiting=view(self._skipped),
        )

    # ------------------------------------------------------------------ the step

    def step(self) -> StepResult:
        """One engine step: ``step`` (sync) or ``step_with_batch_queue`` (async, a queue of 2)."""
        self._step += 1
        now = self._step
        finished: list[FinishedRequest] = []
        self._process_aborts(finished)
        self._process_session_closes(finished)
        num_scheduled_tokens = 0
        update: _Batch | None = None
        if self._has_requests():
            batch = self._schedule_and_execute(now)
            num_scheduled_tokens = sum(batch.scheduled.values())
            self._batches.appendleft(batch)
            if len(self._batches) >= self._batch_queue_size or not (
                num_scheduled_tokens > 0 or self._has_requests()
            ):
                update = self._batches.pop()
        elif self._batches:
            update = self._batches.pop()
        iteration: IterationStats | None = None
        token_events: tuple[tuple[str, int], ...] = ()
        queries = [0, 0, 0, 0]
        if update is not None:
            iteration, token_events = self._update_from_output(update, finished)
            queries = update.queries
        elif finished:
            iteration, token_events = self._iteration(
                [], first_tokens=[], prompt=0, cached=0, external=0, finished=finished
            )

        capacity, deferred = self._num_waiting_and_deferred()
        pool = self._pool
        stats = SchedulerStats(
            num_running_reqs=len(self._running),
            num_waiting_reqs=capacity,
            num_skipped_waiting_reqs=deferred,
            kv_cache_usage=pool.usage,
            prefix_cache_queries=queries[0],
            prefix_cache_hits=queries[1],
            num_free_blocks=pool.num_free,
            external_prefix_cache_queries=queries[2],
            external_prefix_cache_hits=queries[3],
        )
        return StepResult(
            step=now,
            scheduled=num_scheduled_tokens > 0,
            num_scheduled_tokens=num_scheduled_tokens,
            scheduler_stats=stats,
            iteration_stats=iteration,
            token_events=token_events,
        )

    def _has_requests(self) -> bool:
        if self._pause == "all":
            return False
        queued = self._pause == "unpaused" and bool(self._waiting or self._skipped)
        return bool(
            self._running
            or queued
            or self._orphan_loads
            or self._finished_for_store
            or self._connector.jobs
        )

    def _num_waiting_and_deferred(self) -> tuple[int, int]:
        if self._v030:
            return len(self._waiting), len(self._skipped)
        total = len(self._waiting) + len(self._skipped)
        deferred = sum(1 for r in self._waiting if r.deferred) + sum(
            1 for r in self._skipped if r.deferred
        )
        return total - deferred, deferred

    # ------------------------------------------------------------------ aborts

    def _process_aborts(self, finished: list[FinishedRequest]) -> None:
        if not self._pending_aborts:
            return
        aborts, self._pending_aborts = self._pending_aborts, []
        for request_id in aborts:
            request = self._requests.get(request_id)
            if request is None:
                continue
            if request.status is _Status.RUNNING:
                self._running.remove(request)
            elif request in self._skipped:
                self._skipped.remove(request)
            else:
                self._waiting.remove(request)
            load_in_flight = (
                request.status is _Status.WAITING_FOR_REMOTE_KVS and not request.load_ready
            )
            self._finish(request, "abort", finished, free_blocks=not load_in_flight)
            if load_in_flight:
                self._orphan_loads.append(request)

    def _process_session_closes(self, finished: list[FinishedRequest]) -> None:
        if not self._pending_closes:
            return
        closes, self._pending_closes = self._pending_closes, []
        for request_id in closes:
            session = self._requests.get(request_id)
            if session is not None and session.status is _Status.WAITING_FOR_STREAMING_REQ:
                self._skipped.remove(session)
                self._finish(session, "stop", finished)

    def _pause_session(self, session: _Request) -> None:
        """A streaming session's segment is done: it waits for input, deferred, holding KV."""
        self._running.remove(session)
        session.status = _Status.WAITING_FOR_STREAMING_REQ
        session.deferred = True
        self._num_paused_sessions += 1
        self._skipped.append(session)

    # ------------------------------------------------------------------ schedule + execute

    def _schedule_and_execute(self, now: int) -> _Batch:
        queries = [0, 0, 0, 0]  # local queries, local hits, external queries, external hits
        self._allocated = []
        scheduled, preempted = self._schedule(queries)
        meta = self._build_connector_meta(scheduled, preempted)
        if self._defer_free and scheduled:
            self._sched_seq += 1
        sampled: list[_Request] = []
        async_scheduling = self.config.async_scheduling
        for request, num_new in scheduled.items():  # vLLM: _update_after_schedule
            request.last_sched_seq = self._sched_seq
            request.num_computed += num_new
            request.in_flight += num_new
            request.prefill_chunk = request.num_computed < request.num_tokens + request.placeholders
            if not request.prefill_chunk:
                self._inflight.pop(request, None)
                sampled.append(request)
                if async_scheduling:
                    request.placeholders += 1
        output = self._workers.execute(meta, now)
        return _Batch(scheduled, tuple(sampled), output, queries)

    def _build_connector_meta(
        self, scheduled: dict[_Request, int], preempted: list[_Request]
    ) -> ConnectorMeta:
        """vLLM's ``build_connector_meta``: flushes, then the stores this batch completes."""
        connector = self._connector
        if not self._has_connector:
            return connector.take_meta()
        for request in preempted:
            connector.flush(request)
        connector.blocks_reallocated(self._allocated)
        block_size = self.config.block_size
        for request, num_new in scheduled.items():
            upto = min(request.num_computed + num_new, request.num_tokens) // block_size
            self._store(request, min(upto, len(request.blocks)), fence=False)
        finished, self._finished_for_store = self._finished_for_store, []
        for request in finished:
            self._store(request, _final_store_blocks(request, block_size), fence=True)
            request.blocks = []
            connector.finished(request)
        return connector.take_meta()

    def _store(self, request: _Request, upto: int, *, fence: bool) -> None:
        job = self._connector.store(
            request, request.hashes(upto), request.blocks, upto, fence=fence
        )
        if job is not None and self.config.simple_kv_offload:
            self._pool.touch(job.gpu_blocks)  # pinned until every rank confirms the store

    def _schedule(self, queries: list[int]) -> tuple[dict[_Request, int], list[_Request]]:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: dict[_Request, int] = {}
        preempted: list[_Request] = []
        running = self._running

        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            if (
                request.placeholders > 0
                and request.num_computed + 2 - request.placeholders
                >= request.num_prompt + request.max_tokens
            ):
                index += 1  # async: the previous step already reached max_tokens
                continue
            num_new = min(
                request.num_tokens + request.placeholders - request.num_computed,
                budget,
                cfg.max_model_len - request.num_computed - 1,
            )
            if num_new <= 0:
                index += 1
                continue
            allocated = True
            while not self._allocate_running(request, num_new):
                victim = running[-1]
                if not self._can_free(victim):
                    allocated = False  # a deferred free would not help now
                    break
                running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    allocated = False
                    break
            if not allocated:
                break
            scheduled[request] = num_new
            budget -= num_new
            index += 1

        if not preempted and self._pause == "unpaused":
            self._schedule_waiting(budget, scheduled, queries)
        return scheduled, preempted

    def _next_queue(self) -> deque[_Request] | None:
        if self._v030:
            return self._skipped or self._waiting or None
        return self._skipped or self._waiting or None

    def _schedule_waiting(
        self, budget: int, scheduled: dict[_Request, int], queries: list[int]
    ) -> None:
        cfg = self.config
        block_size = cfg.block_size
        pool = self._pool
        running = self._running
        v030 = self._v030
        step_skipped: list[_Request] = []
        step_skipped_waiting: list[_Request] = []  # 0.31+: block-less skipped requests

        def skip(queue: deque[_Request]) -> None:
            request = queue.popleft()
            if v030:
                step_skipped.append(request)
                return
            request.deferred = True
            if request.holds_blocks:
                step_skipped.append(request)
            else:
                step_skipped_waiting.append(request)

        while budget > 0:
            queue = self._next_queue()
            if queue is None:
                break
            if len(running) + self._num_paused_sessions >= cfg.max_num_seqs:
                break
            request = queue[0]

            if request.status in _BLOCKED and not self._try_promote(request):
                skip(queue)
                continue
            if request.stale > 0:
                skip(queue)  # async: its preempted step's output has not come back yet
                continue

            local_hits: list[int] = []
            num_external = 0
            load_async = False
            if request.num_computed == 0:
                max_hit_blocks = (request.num_tokens - 1) // block_size
                num_full_blocks = request.num_tokens // block_size
                hashes = request.hashes(num_full_blocks)
                local_hits = pool.find_cached_prefix(islice(hashes, max_hit_blocks))
                if self._has_connector:
                    external_blocks = self._connector.lookup(
                        request, hashes[len(local_hits) : num_full_blocks]
                    )
                    if external_blocks is None:
                        skip(queue)  # the connector cannot tell yet: deferred, holding nothing
                        continue
                    num_external = external_blocks * block_size
                    load_async = num_external > 0
                num_computed = len(local_hits) * block_size + num_external
            else:
                num_computed = request.num_computed

            if load_async:
                num_new = 0
            else:
                num_new = request.num_tokens - num_computed
                if not cfg.enable_chunked_prefill and num_new > budget:
                    break
                num_new = min(num_new, budget)

            reserved = self._reserved_blocks() if load_async else 0
            if not self._allocate_waiting(
                request,
                local_hits,
                num_computed=num_computed,
                num_new=num_new,
                reserved=reserved,
                cache=not load_async,
            ):
                if cfg.policy == "skip-head-when-idle" and not running:
                    skip(queue)
                    continue
                break

            queue.popleft()
            if request.num_computed == 0 and not request.num_preemptions:
                # vLLM records lookups once the request is admitted, and keeps lookups of
                # preempted requests out of these counters.
                queries[0] += request.num_tokens
                queries[1] += len(local_hits) * block_size
                if self._has_connector:
                    queries[2] += request.num_tokens - len(local_hits) * block_size
                    queries[3] += num_external
            if request.num_output == 0 and request.num_computed == 0:
                request.cached_local = len(local_hits) * block_size
                request.cached_external = num_external
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed
            if load_async:
                first = len(local_hits)
                last = num_computed // block_size
                request.num_computed = num_computed
                request.status = _Status.WAITING_FOR_REMOTE_KVS
                request.load_ready = False
                self._connector.issue_load(
                    request, request.block_hashes(first, last), request.blocks[first:last]
                )
                self._inflight[request] = None
                if v030:
                    step_skipped.append(request)
                else:
                    request.deferred = True
                    step_skipped.append(request)
                continue
            request.num_computed = num_computed
            request.deferred = False
            request.status = _Status.RUNNING
            running.append(request)
            scheduled[request] = num_new
            budget -= num_new
            if num_computed + num_new < request.num_tokens:
                self._inflight[request] = None

        if step_skipped:
            self._skipped.extendleft(reversed(step_skipped))
        if step_skipped_waiting:
            self._waiting.extendleft(reversed(step_skipped_waiting))

    def _try_promote(self, request: _Request) -> bool:
        """A blocked request at the head: a reported load is promoted; anything else waits."""
        if request.status is not _Status.WAITING_FOR_REMOTE_KVS or not request.load_ready:
            return False
        self._cache_full_blocks(request, request.num_computed)
        if request.num_computed >= request.num_tokens:
            request.num_computed = request.num_tokens - 1
        request.status = _Status.PREEMPTED if request.num_preemptions else _Status.WAITING
        request.load_ready = False
        return True

    def _reserved_blocks(self) -> int:
        """Blocks that in-flight prefills and loads still need (vLLM: the #44560 reservation)."""
        cfg = self.config
        total = 0
        for request in self._inflight:
            needed = _cdiv(min(request.num_tokens, cfg.max_model_len), cfg.block_size)
            total += max(0, needed - len(request.blocks))
        return total

    # ------------------------------------------------------------------ block accounting

    def _allocate_running(self, request: _Request, num_new: int) -> bool:
        needed = _cdiv(request.num_computed + num_new, self.config.block_size) - len(request.blocks)
        if needed > 0:
            if needed > self._pool.num_free:
                return False
            blocks = self._pool.allocate(needed)
            request.blocks.extend(blocks)
            self._allocated.extend(blocks)
        self._cache_full_blocks(request, min(request.num_computed + num_new, request.num_tokens))
        return True

    def _allocate_waiting(
        self,
        request: _Request,
        local_hits: list[int],
        *,
        num_computed: int,
        num_new: int,
        reserved: int,
        cache: bool,
    ) -> bool:
        """vLLM's ``allocate_slots`` for a waiting request: all or nothing, in free - reserved;
        with full-ISL admission the whole sequence must fit in the free blocks first."""
        cfg = self.config
        pool = self._pool
        held = len(request.blocks) + len(local_hits)
        evictable = pool.num_unreferenced(local_hits)
        if cfg.reserve_full_isl:
            full = _cdiv(min(request.num_tokens, cfg.max_model_len), cfg.block_size)
            if max(full - held, 0) + evictable > pool.num_free:
                return False
        tokens_needing_slots = min(num_computed + num_new, cfg.max_model_len)
        new_blocks = max(_cdiv(tokens_needing_slots, cfg.block_size) - held, 0)
        if new_blocks + evictable > pool.num_free - reserved:
            return False
        if local_hits:
            pool.touch(local_hits)
            request.blocks.extend(local_hits)
            request.num_cached_blocks = len(request.blocks)
        if new_blocks:
            blocks = pool.allocate(new_blocks)
            request.blocks.extend(blocks)
            self._allocated.extend(blocks)
        if cache:
            self._cache_full_blocks(request, min(num_computed + num_new, request.num_tokens))
        return True

    def _cache_full_blocks(self, request: _Request, num_tokens: int) -> None:
        full = min(num_tokens // self.config.block_size, len(request.blocks))
        if full <= request.num_cached_blocks:
            return
        pool = self._pool
        blocks = request.blocks
        for index in range(request.num_cached_blocks, full):
            pool.cache(blocks[index], request.block_hash(index))
        request.num_cached_blocks = full

    def _can_free(self, request: _Request) -> bool:
        """vLLM's ``_request_blocks_can_be_freed``: no in-flight batch may still write them."""
        return not self._defer_free or request.last_sched_seq <= self._processed_seq

    def _return_blocks(self, request: _Request, blocks: list[int]) -> None:
        """Free ``blocks`` now, or once the last batch that scheduled ``request`` is processed
        (deferred block frees: async scheduling with a KV connector that loads)."""
        if self._can_free(request):
            self._pool.free(blocks)
        else:
            self._deferred_frees.append((self._sched_seq, blocks))

    def _drain_deferred_frees(self) -> None:
        frees = self._deferred_frees
        while frees and frees[0][0] <= self._processed_seq:
            self._pool.free(frees.popleft()[1])

    def _free_blocks(self, request: _Request) -> None:
        self._return_blocks(request, request.blocks)
        request.blocks = []
        request.num_cached_blocks = 0

    def _preempt(self, request: _Request) -> None:
        self._free_blocks(request)
        self._connector.next_stored.pop(request, None)
        self._inflight.pop(request, None)
        request.status = _Status.PREEMPTED
        request.num_computed = 0
        request.stale = request.in_flight
        request.placeholders = 0
        request.num_preemptions += 1
        request.undelivered_preemptions += 1
        self._waiting.appendleft(request)

    def _finish(
        self,
        request: _Request,
        reason: FinishReason,
        finished: list[FinishedRequest],
        free_blocks: bool = True,
    ) -> None:
        if request.status is _Status.WAITING_FOR_STREAMING_REQ:
            self._num_paused_sessions -= 1
        cfg_block = self.config.block_size
        if free_blocks:
            if (
                self._has_connector
                and request.status is _Status.RUNNING
                and not self.config.simple_kv_offload
            ):
                # The final blocks are stored by the next schedule (vLLM: finished_req_ids);
                # the GPU blocks go back to the pool now, fenced by those stores.
                self._finished_for_store.append(request)
                self._return_blocks(request, list(request.blocks))
                request.num_cached_blocks = 0
            else:
                if self._has_connector and request.status is _Status.RUNNING:
                    self._store(request, _final_store_blocks(request, cfg_block), fence=False)
                self._free_blocks(request)
                self._connector.finished(request)
        self._inflight.pop(request, None)
        request.status = _Status.FINISHED
        del self._requests[request.request_id]
        finished.append(
            FinishedRequest(
                request_id=request.request_id,
                finish_reason=reason,
                num_prompt_tokens=request.num_prompt,
                num_generation_tokens=request.num_output,
                num_cached_tokens=max(request.num_cached_tokens, 0),
                num_preemptions=request.num_preemptions,
                max_tokens=request.max_tokens,
            )
        )

    # ------------------------------------------------------------------ update from output

    def _update_from_output(
        self, batch: _Batch, finished: list[FinishedRequest]
    ) -> tuple[IterationStats | None, tuple[tuple[str, int], ...]]:
        cfg = self.config
        if self._defer_free and batch.scheduled:
            self._processed_seq += 1
            self._drain_deferred_frees()
        sampled = set(batch.sampled)
        emitted: list[_Request] = []
        first_tokens: list[str] = []
        prompt = cached = external = 0
        done: list[_Request] = []

        for request, num_new in batch.scheduled.items():
            if request.status is _Status.FINISHED:
                continue
            request.in_flight -= num_new
            stale = request.stale > 0
            if stale:
                request.stale = max(request.stale - num_new, 0)
            if request not in sampled:
                continue  # a prefill chunk: no output yet
            if not stale and request.placeholders:
                request.placeholders -= 1
            if request.num_output == 0:
                first_tokens.append(request.request_id)
                prompt += request.num_prompt
                cached += request.cached_local
                external += request.cached_external
            request.num_output += 1
            emitted.append(request)
            if request.status is _Status.RUNNING:
                self._cache_full_blocks(request, request.num_computed - request.placeholders)
            if (
                request.num_output >= request.max_tokens
                or request.num_tokens >= cfg.max_model_len
                or request.num_output == request.stop_at
            ):
                done.append(request)

        for request in done:
            if request.status is _Status.RUNNING:
                if (
                    request.streaming
                    and not request.session_closed
                    and request.num_tokens < cfg.max_model_len
                ):
                    self._pause_session(request)
                    continue
                self._running.remove(request)
            elif request in self._waiting:
                self._waiting.remove(request)  # a preempted request whose stale token ended it
            elif request in self._skipped:
                self._skipped.remove(request)
            else:
                continue
            reason: FinishReason = "stop" if request.num_output == request.stop_at else "length"
            self._finish(request, reason, finished)

        self._apply_connector_output(batch.connector_output)
        return self._iteration(
            emitted,
            first_tokens=first_tokens,
            prompt=prompt,
            cached=cached,
            external=external,
            finished=finished,
        )

    def _apply_connector_output(self, output: ConnectorOutput) -> None:
        for store in self._connector.update(output):
            if self.config.simple_kv_offload:
                self._pool.free(store.gpu_blocks)
        for owner in output.finished_recving:
            if not isinstance(owner, _Request):
                continue
            if owner.status is _Status.WAITING_FOR_REMOTE_KVS:
                owner.load_ready = True
            elif owner in self._orphan_loads:
                self._orphan_loads.remove(owner)
                self._free_blocks(owner)

    def _iteration(
        self,
        emitted: list[_Request],
        *,
        first_tokens: list[str],
        prompt: int,
        cached: int,
        external: int,
        finished: list[FinishedRequest],
    ) -> tuple[IterationStats | None, tuple[tuple[str, int], ...]]:
        if not emitted and not finished:
            return None, ()
        preemptions = 0
        for request in emitted:
            # vLLM ships a preemption event with the request's next output.
            preemptions += request.undelivered_preemptions
            request.undelivered_preemptions = 0
        generation = len(emitted)
        iteration = IterationStats(
            num_prompt_tokens=prompt,
            num_prompt_tokens_cached=cached,
            num_prompt_tokens_computed=prompt - cached - external,
            num_prompt_tokens_external=external,
            num_generation_tokens=generation,
            num_preemptions=preemptions,
            first_token_request_ids=tuple(first_tokens),
            finished=tuple(finished),
            num_iteration_tokens=prompt + generation,
        )
        return iteration, tuple((r.request_id, 1) for r in emitted)
