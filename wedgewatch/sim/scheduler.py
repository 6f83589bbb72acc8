"""A pure, deterministic, discrete-step model of vLLM's v1 scheduler (FCFS) with a CPU KV tier.

One call to :meth:`Scheduler.step` is one EngineCore step: ``schedule`` -> "execute" (every
scheduled token is computed at once) -> ``update_from_output``. Nothing reads a clock or a global
random generator; the same requests in the same order give the same results. The model keeps the
pieces of ``vllm/v1/core/sched/scheduler.py`` that decide admission, and that make it wedge:

Rules (in the order one step applies them)
------------------------------------------
1. Aborts received since the last step finish their requests ("abort"). An async load that is
   still in flight keeps its blocks until the transfer lands.
2. A load lands ``kv_load_steps`` steps after it was issued. An aborted load releases its blocks
   then; a live one stays parked and is *promoted* only when the waiting scan reaches it.
3. Running phase: every running request gets its next tokens (the rest of its prompt, chunked to
   the token budget, or one decode token). When blocks run out, the last running request is
   preempted (blocks freed, status PREEMPTED, prepended to ``waiting``) until the request fits or
   preempted itself. A preemption skips the waiting phase for this step.
4. Waiting phase, while a queue is non-empty, the budget lasts and fewer than ``max_num_seqs``
   requests run. The head is taken from ``skipped_waiting`` whenever it is non-empty, else from
   ``waiting``:
   * a load still in flight is parked in the step's skipped list (``continue``); a landed load is
     promoted (its blocks become prefix-cache entries, status WAITING or PREEMPTED) and handled on;
   * a request with no computed tokens looks up the GPU prefix cache, then the CPU tier; if the CPU
     hit reaches a block whose store has not landed, the tier cannot say how much matches: the
     request is parked in the step's skipped list holding no blocks (``continue``);
   * a CPU hit beyond the GPU hit becomes an async load: blocks for the whole hit are allocated
     only if they fit in ``free - reserved``, where ``reserved`` is what every other in-flight
     prefill or load still needs to finish (the #44560 gate); it is then parked, holding them;
   * otherwise the next prompt chunk is allocated and the request joins ``running``;
   * an allocation that does not fit ends the whole scan (``break``). Under the
     ``skip-head-when-idle`` policy (the PR #45406 idea) the head is instead parked in the step's
     skipped list and the scan continues, but only while nothing is running.
   At the end of the scan the step's skipped list is put back at the front of ``skipped_waiting``.
5. Execute: scheduled tokens are computed; a request whose prompt is complete emits one token per
   step and finishes with "length" at ``max_tokens`` (or at ``max_model_len``). Finished and
   preempted requests' full blocks are offloaded to the CPU tier through a store pipe of
   ``kv_store_blocks_per_step``; each block is readable once it has gone through.

Streaming input (vLLM's resumable sessions): a request added with ``streaming_input`` does not
finish when its segment's output is done; it pauses as WAITING_FOR_STREAMING_REQ in
``skipped_waiting`` (reason "deferred"), keeping its KV blocks and its place in the batch limit,
and the scan passes over it (``continue``) until ``add_streaming_input`` appends the next input
chunk; ``close_streaming_input`` finishes a paused session ("stop").

No rule looks at the gauges: when the scan keeps breaking at a head that can never fit while the
blocks it needs are held by parked loads behind it, the model schedules nothing forever on its
own. ``docs/simulator.md`` ("Scheduler model") names the interleaving.
"""

from __future__ import annotations

import enum
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from wedgewatch.sim.kvcache import BlockHash, BlockPool, CpuTier

Policy = Literal["stock", "skip-head-when-idle"]
FinishReason = Literal["stop", "length", "abort"]

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
    """GPU->CPU store bandwidth in blocks per step (0 = stores land at once). 16 blocks of 16
    tokens at 128 KiB per token per rank is 32 MiB per rank per step: ~6.7 GB/s at 5 ms/step."""
    policy: Policy = "stock"
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
        if self.policy not in get_args(Policy):
            raise ValueError(
                f"policy must be one of {', '.join(get_args(Policy))}, got {self.policy!r}"
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
    """An async CPU->GPU load is still running (a landed load is promoted only by the scan)."""


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The scheduler's three queues in scan order."""

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
        "blocks",
        "cached_external",
        "cached_local",
        "load_done_at",
        "max_tokens",
        "num_cached_blocks",
        "num_cached_tokens",
        "num_computed",
        "num_output",
        "num_preemptions",
        "num_prompt",
        "num_shared_blocks",
        "prefix_key",
        "request_id",
        "session_closed",
        "status",
        "stop_at",
        "streaming",
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
        self.load_done_at = 0
        self.streaming = spec.streaming_input
        self.session_closed = False

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + self.num_output

    def block_hash(self, index: int) -> BlockHash:
        if index < self.num_shared_blocks:
            return ("prefix", self.prefix_key, index)
        return ("request", self.request_id, index)

    def block_hashes(self, start: int, stop: int) -> Iterator[BlockHash]:
        for index in range(start, stop):
            yield self.block_hash(index)


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


class Scheduler:
    """vLLM's v1 FCFS scheduler with async CPU->GPU KV loads, stepped by the caller."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._pool = BlockPool(config.num_gpu_blocks, config.enable_prefix_caching)
        self._cpu = CpuTier(config.num_cpu_blocks, config.kv_store_blocks_per_step)
        self._has_connector = config.num_cpu_blocks > 0
        self._requests: dict[str, _Request] = {}
        self._running: list[_Request] = []
        self._waiting: deque[_Request] = deque()
        self._skipped: deque[_Request] = deque()
        # Requests still prefilling (chunked prefills and parked loads): their remaining blocks
        # are the reservation that gates new async loads (#44560). A dict keeps order stable.
        self._inflight: dict[_Request, None] = {}
        self._pending_aborts: list[str] = []
        # Aborted requests whose async load is still in flight: blocks are freed when it lands.
        self._orphan_loads: list[_Request] = []
        self._pending_preemption_events = 0
        self._step = 0
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

    def add_streaming_input(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """Append an input chunk to a streaming session: `prompt_tokens` more, then up to
        `max_tokens` more output. A paused session becomes schedulable again (status WAITING,
        still in ``skipped_waiting``); unknown ids are ignored, as for aborts."""
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

    def has_work(self) -> bool:
        """Whether the engine loop must keep stepping (vLLM's ``has_requests``)."""
        return bool(
            self._running
            or self._waiting
            or self._skipped
            or self._pending_aborts
            or self._orphan_loads
        )

    @property
    def num_running(self) -> int:
        """``len(running)`` (includes requests still in chunked prefill)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """``len(waiting)``: new and preempted requests (reason "capacity")."""
        return len(self._waiting)

    @property
    def num_free_blocks(self) -> int:
        """GPU blocks no request holds (cached-but-free blocks count as free)."""
        return self._pool.num_free

    def snapshot(self) -> QueueSnapshot:
        """The queues as they stand between steps."""
        now = self._step

        def view(requests: Iterable[_Request]) -> tuple[QueuedRequest, ...]:
            return tuple(
                QueuedRequest(
                    request_id=r.request_id,
                    status=r.status.value,
                    num_blocks=len(r.blocks),
                    num_computed_tokens=r.num_computed,
                    num_tokens=r.num_tokens,
                    kv_load_in_flight=(
                        r.status is _Status.WAITING_FOR_REMOTE_KVS and r.load_done_at > now
                    ),
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
        """One engine step: abort, land transfers, schedule, execute, update from output."""
        self._step += 1
        now = self._step
        finished: list[FinishedRequest] = []
        queries = [0, 0, 0, 0]  # local queries, local hits, external queries, external hits

        self._process_aborts(finished)
        self._process_session_closes(finished)
        self._land_orphan_loads(now)
        scheduled = self._schedule(now, queries)
        num_scheduled_tokens = sum(scheduled.values())
        iteration, token_events = self._update_from_output(scheduled, finished)

        pool = self._pool
        stats = SchedulerStats(
            num_running_reqs=len(self._running),
            num_waiting_reqs=len(self._waiting),
            num_skipped_waiting_reqs=len(self._skipped),
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

    # ------------------------------------------------------------------ aborts and transfers

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
                request.status is _Status.WAITING_FOR_REMOTE_KVS
                and request.load_done_at > self._step
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
        """A streaming session's segment is done: it waits for input in ``skipped_waiting``."""
        self._running.remove(session)
        session.status = _Status.WAITING_FOR_STREAMING_REQ
        self._num_paused_sessions += 1
        self._skipped.append(session)

    def _land_orphan_loads(self, now: int) -> None:
        if not self._orphan_loads:
            return
        still: list[_Request] = []
        for request in self._orphan_loads:
            if request.load_done_at <= now:
                self._pool.free(request.blocks)
                request.blocks = []
            else:
                still.append(request)
        self._orphan_loads = still

    # ------------------------------------------------------------------ schedule

    def _schedule(self, now: int, queries: list[int]) -> dict[_Request, int]:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        scheduled: dict[_Request, int] = {}
        running = self._running
        preempted = False

        index = 0
        while index < len(running) and budget > 0:
            request = running[index]
            num_new = min(
                request.num_tokens - request.num_computed,
                budget,
                cfg.max_model_len - request.num_computed - 1,
            )
            if num_new <= 0:
                index += 1
                continue
            while not self._allocate_running(request, num_new):
                victim = running.pop()
                self._preempt(victim, now)
                preempted = True
                if victim is request:
                    break
            if request.status is not _Status.RUNNING:
                break
            scheduled[request] = num_new
            budget -= num_new
            index += 1

        if not preempted:
            self._schedule_waiting(now, budget, scheduled, queries)
        return scheduled

    def _schedule_waiting(
        self, now: int, budget: int, scheduled: dict[_Request, int], queries: list[int]
    ) -> None:
        cfg = self.config
        block_size = cfg.block_size
        pool = self._pool
        running = self._running
        waiting = self._waiting
        skipped = self._skipped
        step_skipped: list[_Request] = []

        while (waiting or skipped) and budget > 0:
            if len(running) + self._num_paused_sessions >= cfg.max_num_seqs:
                break
            queue = skipped if skipped else waiting
            request = queue[0]

            if request.status is _Status.WAITING_FOR_STREAMING_REQ:
                step_skipped.append(queue.popleft())  # blocked status: skipped, as in vLLM
                continue

            if request.status is _Status.WAITING_FOR_REMOTE_KVS:
                if request.load_done_at > now:
                    step_skipped.append(queue.popleft())
                    continue
                self._promote(request)

            local_hits: list[int] = []
            num_external = 0
            load_async = False
            if request.num_computed == 0:
                max_hit_blocks = (request.num_tokens - 1) // block_size
                local_hits = pool.find_cached_prefix(request.block_hashes(0, max_hit_blocks))
                if request.num_preemptions == 0:
                    queries[0] += request.num_tokens
                    queries[1] += len(local_hits) * block_size
                if self._has_connector:
                    external_blocks = self._cpu.match(
                        request.block_hashes(len(local_hits), max_hit_blocks), now
                    )
                    if external_blocks is None:
                        # HIT_PENDING: the tier cannot tell yet how many tokens match.
                        step_skipped.append(queue.popleft())
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
                    step_skipped.append(queue.popleft())
                    continue
                break

            queue.popleft()
            if self._has_connector and request.num_computed == 0 and not request.num_preemptions:
                # vLLM records the connector lookup once the request is admitted, and keeps
                # lookups of preempted requests out of these counters (as for the GPU cache).
                queries[2] += request.num_tokens - len(local_hits) * block_size
                queries[3] += num_external
            if request.num_output == 0 and request.num_computed == 0:
                request.cached_local = len(local_hits) * block_size
                request.cached_external = num_external
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_computed
            request.num_computed = num_computed
            if load_async:
                request.status = _Status.WAITING_FOR_REMOTE_KVS
                request.load_done_at = now + cfg.kv_load_steps
                self._cpu.touch(request.block_hashes(len(local_hits), num_computed // block_size))
                self._inflight[request] = None
                step_skipped.append(request)
                continue
            request.status = _Status.RUNNING
            running.append(request)
            scheduled[request] = num_new
            budget -= num_new
            if num_computed + num_new < request.num_tokens:
                self._inflight[request] = None

        if step_skipped:
            skipped.extendleft(reversed(step_skipped))

    def _promote(self, request: _Request) -> None:
        """A landed load: its blocks become prefix-cache entries; it is schedulable again."""
        self._cache_full_blocks(request, request.num_computed)
        if request.num_computed >= request.num_tokens:
            request.num_computed = request.num_tokens - 1
        request.status = _Status.PREEMPTED if request.num_preemptions else _Status.WAITING

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
            request.blocks.extend(self._pool.allocate(needed))
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
        """vLLM's ``allocate_slots`` for a waiting request: all or nothing, in free - reserved."""
        pool = self._pool
        tokens_needing_slots = min(num_computed + num_new, self.config.max_model_len)
        new_blocks = (
            _cdiv(tokens_needing_slots, self.config.block_size)
            - len(request.blocks)
            - len(local_hits)
        )
        new_blocks = max(new_blocks, 0)
        if new_blocks + pool.num_unreferenced(local_hits) > pool.num_free - reserved:
            return False
        if local_hits:
            pool.touch(local_hits)
            request.blocks.extend(local_hits)
            request.num_cached_blocks = len(request.blocks)
        if new_blocks:
            request.blocks.extend(pool.allocate(new_blocks))
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

    def _release_blocks(self, request: _Request, now: int) -> None:
        """Free a request's blocks and offload its computed full blocks to the CPU tier."""
        if self._has_connector:
            computed_blocks = min(
                request.num_computed // self.config.block_size, len(request.blocks)
            )
            self._cpu.store(request.block_hashes(0, computed_blocks), now)
        self._pool.free(request.blocks)
        request.blocks = []
        request.num_cached_blocks = 0

    def _preempt(self, request: _Request, now: int) -> None:
        self._release_blocks(request, now)
        self._inflight.pop(request, None)
        request.status = _Status.PREEMPTED
        request.num_computed = 0
        request.num_preemptions += 1
        self._pending_preemption_events += 1
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
        if free_blocks:
            self._release_blocks(request, self._step)
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
        self, scheduled: dict[_Request, int], finished: list[FinishedRequest]
    ) -> tuple[IterationStats | None, tuple[tuple[str, int], ...]]:
        cfg = self.config
        token_events: list[tuple[str, int]] = []
        first_tokens: list[str] = []
        prompt = cached = external = 0
        done: list[_Request] = []

        for request, num_new in scheduled.items():
            request.num_computed += num_new
            if request.num_computed < request.num_tokens:
                continue  # a prefill chunk: no output yet
            self._inflight.pop(request, None)
            if request.num_output == 0:
                first_tokens.append(request.request_id)
                prompt += request.num_prompt
                cached += request.cached_local
                external += request.cached_external
            request.num_output += 1
            token_events.append((request.request_id, 1))
            if (
                request.num_output >= request.max_tokens
                or request.num_tokens >= cfg.max_model_len
                or request.num_output == request.stop_at
            ):
                done.append(request)

        for request in done:
            if (
                request.streaming
                and not request.session_closed
                and request.num_tokens < cfg.max_model_len
            ):
                self._pause_session(request)
                continue
            self._running.remove(request)
            reason: FinishReason = "stop" if request.num_output == request.stop_at else "length"
            self._finish(request, reason, finished)

        if not token_events and not finished:
            return None, ()
        preemptions, self._pending_preemption_events = self._pending_preemption_events, 0
        generation = len(token_events)
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
        return iteration, tuple(token_events)
