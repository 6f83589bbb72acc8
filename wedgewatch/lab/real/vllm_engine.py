"""vLLM's own v1 scheduler on a CPU, with only the GPU side emulated (runs in a vLLM venv).

This module imports the installed ``vllm`` (built by ``wedgewatch/lab/real/install-vllm.sh``) and
drives, step by step, the real objects a vLLM engine core drives:

* ``Scheduler`` or ``AsyncScheduler`` (``--async-scheduling``, the CUDA default), with its
  ``KVCacheManager`` and prefix cache, built from a real ``VllmConfig``;
* the scheduler side of the KV connector vLLM itself picks from the serve flags and the
  environment in ``VllmConfig._post_init_kv_transfer_config`` (``OffloadingConnector`` for
  ``--kv-offloading-backend native``, ``SimpleCPUOffloadConnector`` with
  ``VLLM_USE_SIMPLE_KV_OFFLOAD=1``);
* the engine loop of ``EngineCore.step`` (sync) or ``EngineCore.step_with_batch_queue`` (async,
  a batch queue of 2).

Emulated, and only this: the model (one sampled token when a request's scheduled tokens reach
the end of its sequence, i.e. a finished prefill or a decode), the connector workers of every TP
rank (loads land ``load_steps`` steps after they start; stores are deferred to the next step,
as vLLM's worker does, then drain ``store_blocks_per_step`` blocks per step in FIFO order;
stores named in ``jobs_to_flush`` complete at once, as the worker's ``wait`` does; the simple
connector's store events start in the step that names them, and ``need_flush`` completes every
copy), and the step time (every step counts ``step_seconds`` of simulated time). Faults
(``RealSettings.fault``): one TP rank never reports a store (``lost-store-event``) or a load
(``hung-load``), nor, polling in order as both real workers do, any later one.

``python -m wedgewatch.lab.real.vllm_engine --seeds 1-30 ...`` runs ``sim load`` plans through it
and prints, per seed, whether and when the engine wedged (a stall of at least
``wedge_steps`` steps with nothing running and requests waiting).

mypy does not see vLLM (it lives in another venv): its objects are typed ``Any`` here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from wedgewatch.lab.sim.load import PlannedRequest, plan_requests

WEDGE_STEPS = 2000
"""A stall of this many steps with nothing running and requests waiting is a wedge (10 s)."""

BYTES_PER_TOKEN_PER_RANK = 131_072
"""The reference model's KV bytes per token per rank at TP=2 (64 layers, 4 KV heads per rank,
head size 128, K and V, bf16); 60 GiB of CPU tier is then 15 360 blocks of 16 tokens."""
NUM_LAYERS = 64
HEAD_SIZE = 128
NUM_KV_HEADS_TOTAL = 8
EMULATED_CONNECTORS = ("OffloadingConnector", "SimpleCPUOffloadConnector", "none")
"""Connectors whose worker side this module emulates."""
FAULTS = ("lost-store-event", "hung-load")
"""Transfer faults of the emulated worker side (``RealSettings.fault``)."""
TOKEN_ID = 1000
"""The token the emulated model samples (never EOS: requests end at ``max_tokens``)."""


@dataclass(frozen=True, slots=True)
class RealSettings:
    """The serve configuration (the tp2-offload profile by default) and the emulated GPU side."""

    tensor_parallel_size: int = 2
    max_num_seqs: int = 6
    max_num_batched_tokens: int = 4096
    num_gpu_blocks: int = 2048
    block_size: int = 16
    max_model_len: int = 32768
    enable_prefix_caching: bool = True
    kv_offloading_size_gib: float | None = 60.0
    simple_kv_offload: bool = False
    """``VLLM_USE_SIMPLE_KV_OFFLOAD=1``: vLLM picks ``SimpleCPUOffloadConnector``."""
    async_scheduling: bool = True
    reserve_full_isl: bool = True
    load_steps: int = 3
    store_blocks_per_step: int = 16
    step_seconds: float = 0.005
    fault: str | None = None
    """``lost-store-event``: the last TP rank never reports one store (and, polling in order,
    none after it); ``hung-load``: it never finishes one load (nor any after it)."""
    fault_after_seconds: float = 0.0
    """The fault takes the first store (or load) that starts at or after this simulated time."""

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known: {', '.join(FAULTS)}")


@dataclass(slots=True)
class StepStats:
    """What one engine step left behind (vLLM's own counts)."""

    step: int
    num_running: int
    num_waiting: int
    num_scheduled_tokens: int
    num_finished: int
    kv_usage: float


@dataclass(slots=True)
class RunResult:
    """One plan run through the real scheduler."""

    seed: int
    wedged: bool
    wedge_at_seconds: float | None
    steps: int
    finished: int
    requests: int
    end_state: dict[str, Any] = field(default_factory=dict)


def _own_token_ids(request_id: str, count: int) -> list[int]:
    base = zlib.crc32(request_id.encode())
    return [200_000 + (base + i * 7919) % 100_000 for i in range(count)]


def _prefix_token_ids(prefix_id: str, count: int) -> list[int]:
    base = zlib.crc32(prefix_id.encode())
    return [10_000 + (base + i * 104_729) % 100_000 for i in range(count)]


def token_ids(request_id: str, planned: PlannedRequest) -> list[int]:
    """Deterministic prompt token ids: the shared prefix's ids, then the request's own."""
    prefix = (
        _prefix_token_ids(planned.prefix_id, planned.prefix_tokens) if planned.prefix_id else []
    )
    return prefix + _own_token_ids(request_id, planned.prompt_tokens - len(prefix))


class _ModelConfigStandIn:
    """The few ``ModelConfig`` facts the scheduler side reads, for a text-only dense model.

    A real ``ModelConfig`` reads a Hugging Face config from disk or the hub; the scheduler, the
    KV-cache manager and the connectors only ask it these questions.
    """

    def __init__(self, max_model_len: int) -> None:
        self.max_model_len = max_model_len
        self.uses_mrope = False
        self.is_encoder_decoder = False
        self.is_diffusion = False
        self.is_multimodal_model = False
        self.enable_return_routed_experts = False
        self.return_sampling_mask = False
        self.runner_type = "generate"
        self.multimodal_config = None
        self.hf_config = None
        self.model = "wedgewatch/emulated-dense-64L"
        self.served_model_name = self.model
        self.dtype = "bfloat16"
        self.use_mla = False
        self.skip_tokenizer_init = True
        self.supports_multimodal_inputs = False

    def get_num_layers(self, _parallel_config: object = None) -> int:
        return NUM_LAYERS

    def get_total_num_kv_heads(self) -> int:
        return NUM_KV_HEADS_TOTAL

    def get_head_size(self) -> int:
        return HEAD_SIZE


def _kv_cache_tensor(cls: Any, page: int, num_blocks: int, layer: str) -> Any:
    """One layer's KV tensor, in the field names of the installed version."""
    fields = getattr(cls, "__dataclass_fields__", {})
    if "shared_by" in fields:
        return cls(size=page * num_blocks, shared_by=[layer])
    return cls(
        size=page * num_blocks,
        layers=[layer],
        layer_stride=page * num_blocks,
        block_stride=page,
    )


class RealEngine:
    """One EngineCore: vLLM's scheduler and connector scheduler side, an emulated GPU side."""

    def __init__(self, settings: RealSettings) -> None:
        self.settings = settings
        if settings.simple_kv_offload:
            os.environ["VLLM_USE_SIMPLE_KV_OFFLOAD"] = "1"
        else:
            os.environ.pop("VLLM_USE_SIMPLE_KV_OFFLOAD", None)
        import torch  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.config import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
            CacheConfig,
            DeviceConfig,
            ParallelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.sampling_params import SamplingParams  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.utils.hashing import get_hash_fn_by_name  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.v1.core.kv_cache_utils import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
            get_request_block_hasher,
            init_none_hash,
        )
        from vllm.v1.kv_cache_interface import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            KVCacheTensor,
        )
        from vllm.v1.request import Request  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

        self._Request = Request
        self._SamplingParams = SamplingParams
        cache_kwargs: dict[str, Any] = {
            "block_size": settings.block_size,
            "enable_prefix_caching": settings.enable_prefix_caching,
        }
        if settings.kv_offloading_size_gib is not None:
            cache_kwargs["kv_offloading_size"] = settings.kv_offloading_size_gib
            cache_kwargs["kv_offloading_backend"] = "native"
        sched_kwargs: dict[str, Any] = {
            "max_model_len": settings.max_model_len,
            "is_encoder_decoder": False,
            "max_num_seqs": settings.max_num_seqs,
            "max_num_batched_tokens": settings.max_num_batched_tokens,
            "enable_chunked_prefill": True,
            "async_scheduling": settings.async_scheduling,
        }
        if hasattr(SchedulerConfig, "scheduler_reserve_full_isl") or (
            "scheduler_reserve_full_isl" in getattr(SchedulerConfig, "__dataclass_fields__", {})
        ):
            sched_kwargs["scheduler_reserve_full_isl"] = settings.reserve_full_isl
        vllm_config = VllmConfig(
            cache_config=CacheConfig(**cache_kwargs),
            scheduler_config=SchedulerConfig(**sched_kwargs),
            parallel_config=ParallelConfig(tensor_parallel_size=settings.tensor_parallel_size),
            device_config=DeviceConfig(device="cpu"),
        )
        vllm_config.model_config = _ModelConfigStandIn(settings.max_model_len)
        vllm_config.cache_config.num_gpu_blocks = settings.num_gpu_blocks
        self.vllm_config = vllm_config
        heads_per_rank = max(1, NUM_KV_HEADS_TOTAL // settings.tensor_parallel_size)
        spec = FullAttentionSpec(
            block_size=settings.block_size,
            num_kv_heads=heads_per_rank,
            head_size=HEAD_SIZE,
            dtype=torch.bfloat16,
        )
        layers = [f"model.layers.{i}.self_attn.attn" for i in range(NUM_LAYERS)]
        kv_cache_config = KVCacheConfig(
            num_blocks=settings.num_gpu_blocks,
            kv_cache_tensors=[
                _kv_cache_tensor(KVCacheTensor, spec.page_size_bytes, settings.num_gpu_blocks, n)
                for n in layers
            ],
            kv_cache_groups=[KVCacheGroupSpec(layers, spec)],
        )
        self.kv_cache_config = kv_cache_config
        hash_fn = get_hash_fn_by_name(vllm_config.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self._block_hasher = get_request_block_hasher(settings.block_size, hash_fn)
        if settings.async_scheduling:
            from vllm.v1.core.sched.async_scheduler import AsyncScheduler as SchedulerClass  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        else:
            from vllm.v1.core.sched.scheduler import Scheduler as SchedulerClass  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.v1.structured_output import StructuredOutputManager  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

        self.scheduler: Any = SchedulerClass(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=settings.block_size,
            log_stats=True,
        )
        self.connector: Any = self.scheduler.connector
        self.connector_name = type(self.connector).__name__ if self.connector else "none"
        if self.connector_name not in EMULATED_CONNECTORS:
            raise NotImplementedError(
                f"vLLM picked {self.connector_name}, whose worker side is not emulated yet "
                f"(emulated: {', '.join(EMULATED_CONNECTORS)}); without it its transfers "
                "would never complete and every run would look wedged"
            )
        self.workers = _ConnectorWorkers(settings, self.connector_name)
        self.batch_queue: deque[tuple[Any, Any]] = deque()
        self.batch_queue_size = 2 if settings.async_scheduling else 1
        self.step_count = 0

    # ------------------------------------------------------------ requests

    def add_request(self, request_id: str, planned: PlannedRequest) -> None:
        """Queue a request as ``EngineCore.add_request`` does (block hashes included)."""
        params = self._SamplingParams(max_tokens=planned.max_tokens, ignore_eos=True)
        request = self._Request(
            request_id=request_id,
            prompt_token_ids=token_ids(request_id, planned),
            sampling_params=params,
            pooling_params=None,
            arrival_time=self.step_count * self.settings.step_seconds,
            block_hasher=self._block_hasher,
        )
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> None:
        """Finish a request as aborted (the client went away)."""
        from vllm.v1.request import RequestStatus  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

        self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)

    def has_work(self) -> bool:
        """``has_requests`` or batches still in flight."""
        return bool(self.scheduler.has_requests() or self.batch_queue)

    # ------------------------------------------------------------ the engine step

    def step(self) -> tuple[Any, int]:
        """One ``step`` / ``step_with_batch_queue``: (engine core outputs or None, tokens)."""
        self.step_count += 1
        if self.batch_queue_size == 1:
            output = self.scheduler.schedule()
            model_output = self._execute(output)
            outputs = self.scheduler.update_from_output(output, model_output)
            return outputs, output.total_num_scheduled_tokens
        scheduled = 0
        if self.scheduler.has_requests():
            output = self.scheduler.schedule()
            scheduled = output.total_num_scheduled_tokens
            self.batch_queue.appendleft((output, self._execute(output)))
            if len(self.batch_queue) < self.batch_queue_size and (
                scheduled > 0 or self.scheduler.has_requests()
            ):
                return None, scheduled
        elif not self.batch_queue:
            return None, 0
        output, model_output = self.batch_queue.pop()
        return self.scheduler.update_from_output(output, model_output), scheduled

    def _execute(self, scheduler_output: Any) -> Any:
        """The emulated workers: sample a token where a sequence ends, run the connector."""
        from vllm.v1.outputs import ModelRunnerOutput  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

        req_ids: list[str] = []
        sampled: list[list[int]] = []
        requests = self.scheduler.requests
        for req_id in scheduler_output.num_scheduled_tokens:
            request = requests.get(req_id)
            req_ids.append(req_id)
            if request is None or getattr(request, "is_prefill_chunk", False):
                sampled.append([])
            else:
                sampled.append([TOKEN_ID])
        kv_output = self.workers.execute(scheduler_output, self.step_count)
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=kv_output,
        )

    # ------------------------------------------------------------ inspection

    def counts(self) -> tuple[int, int]:
        """(running, waiting) as vLLM's ``get_request_counts`` reports them."""
        running, waiting = self.scheduler.get_request_counts()
        return int(running), int(waiting)

    def end_state(self) -> dict[str, Any]:
        """The queues and the pool, for a wedge's report."""
        sched = self.scheduler
        state: dict[str, Any] = {
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "kv_usage": round(float(sched.kv_cache_manager.usage), 4),
            "free_blocks": int(sched.kv_cache_manager.block_pool.get_num_free_blocks()),
        }
        fired = self.workers.fault_fired_at_step
        if fired is not None:
            state["fault_fired_at_seconds"] = round(fired * self.settings.step_seconds, 3)
        for name in ("skipped_waiting", "kv_holding_waiting", "deferred_waiting"):
            queue = getattr(sched, name, None)
            if queue is not None:
                state[name] = [
                    (r.request_id, r.status.name, r.num_computed_tokens) for r in list(queue)
                ]
        return state


@dataclass(slots=True)
class _Transfer:
    """One store or load job (OffloadingConnector) or event (SimpleCPUOffloadConnector)."""

    job_id: int
    is_store: bool
    blocks_left: int = 0
    req_ids: tuple[str, ...] = ()
    due_step: int = 0
    done: bool = False
    stuck: bool = False
    """The faulty rank never reports this copy (the fault's copy, or one queued behind it)."""


class _ConnectorWorkers:
    """The worker side of the connector on every TP rank, following its protocol.

    Every rank runs the same copies in the same order, so one queue per direction stands for
    all ranks. A fault makes the last rank lose one copy's completion; both real workers poll
    their copy streams in order (``_transfers[0].end_event.query()`` in the offloading worker,
    a high-water mark in the simple worker), so every later copy of that direction on that
    rank stays unreported too. A flush completes the copies on the healthy ranks only (a real
    flush would wait on the lost copy; here the step goes on and the completions stay missing).
    """

    def __init__(self, settings: RealSettings, connector_name: str) -> None:
        self.settings = settings
        self.connector_name = connector_name
        self.ranks = settings.tensor_parallel_size
        self._deferred_stores: list[_Transfer] = []
        self._stores: deque[_Transfer] = deque()
        self._loads: deque[_Transfer] = deque()
        self._stuck = {True: False, False: False}  # per direction (is_store), faulty rank
        self.fault_fired_at_step: int | None = None

    def execute(self, scheduler_output: Any, step: int) -> Any:
        """One step of every rank's worker side: flush, start copies, report completions."""
        meta = getattr(scheduler_output, "kv_connector_metadata", None)
        if meta is None or self.connector_name == "none":
            return None
        flushed: set[int] | bool
        if self.connector_name == "OffloadingConnector":
            flushed, stores, loads = self._offloading_jobs(meta)
        else:
            flushed, stores, loads = self._simple_events(meta)
        # handle_preemptions: the flushed copies complete now (the worker waits for them).
        if flushed:
            for transfer in (*self._stores, *self._deferred_stores, *self._loads, *stores):
                if flushed is True or transfer.job_id in flushed:
                    transfer.done = transfer.done or transfer.is_store or flushed is True
        # start_kv_transfers / start_load_kv: last step's stores enter the pipe; loads start.
        self._stores.extend(self._deferred_stores)
        self._deferred_stores = []
        for transfer in loads:
            transfer.due_step = step + self.settings.load_steps
            self._submit(transfer, step)
            self._loads.append(transfer)
        for transfer in stores:
            self._submit(transfer, step)
            if self.connector_name == "OffloadingConnector" and not transfer.done:
                # prepare_store_kv (after the forward): this step's stores wait a step.
                self._deferred_stores.append(transfer)
            else:
                # wait_for_save: the simple worker launches the copy at once.
                self._stores.append(transfer)
        # get_finished: the store pipe drains in order; loads that are due land.
        budget = self.settings.store_blocks_per_step
        for transfer in self._stores:
            if transfer.done:
                continue
            if transfer.blocks_left > 0:
                if budget <= 0:
                    break
                taken = min(budget, transfer.blocks_left)
                transfer.blocks_left -= taken
                budget -= taken
                if transfer.blocks_left > 0:
                    break
            transfer.done = True
        for transfer in self._loads:
            transfer.done = transfer.done or transfer.due_step <= step
        return self._report()

    def _submit(self, transfer: _Transfer, step: int) -> None:
        """Mark ``transfer`` lost on the faulty rank: the fault's copy, or one behind it."""
        settings = self.settings
        if (
            settings.fault is not None
            and self.fault_fired_at_step is None
            and (settings.fault == "lost-store-event") == transfer.is_store
            and step * settings.step_seconds >= settings.fault_after_seconds
        ):
            self.fault_fired_at_step = step
            self._stuck[transfer.is_store] = True
        transfer.stuck = self._stuck[transfer.is_store]

    def _report(self) -> Any:
        """What the ranks' ``get_finished`` report, aggregated as vLLM's executor does."""
        from vllm.v1.outputs import KVConnectorOutput  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

        completed: dict[bool, dict[int, int]] = {True: {}, False: {}}
        finished_recving: set[str] = set()
        for queue in (self._stores, self._loads):
            for transfer in queue:
                if transfer.done:
                    ranks = self.ranks - 1 if transfer.stuck else self.ranks
                    if ranks > 0:
                        completed[transfer.is_store][transfer.job_id] = ranks
                    if not transfer.is_store and not transfer.stuck:
                        # The executor reports a load once every rank has finished it.
                        finished_recving.update(transfer.req_ids)
            kept = [transfer for transfer in queue if not transfer.done]
            queue.clear()
            queue.extend(kept)
        return KVConnectorOutput(
            finished_sending=set(),
            finished_recving=finished_recving,
            kv_connector_worker_meta=self._worker_meta(completed[True], completed[False]),
        )

    def _worker_meta(self, stores: dict[int, int], loads: dict[int, int]) -> Any:
        """The per-rank completion counts, summed over the ranks (``aggregate``)."""
        if self.connector_name == "OffloadingConnector":
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
                OffloadingWorkerMetadata,
            )

            jobs = stores | loads
            return OffloadingWorkerMetadata(completed_jobs=jobs) if jobs else None
        from vllm.v1.simple_kv_offload.metadata import (  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
            SimpleCPUOffloadWorkerMetadata,
        )

        # Loads are reported through finished_recving only.
        return SimpleCPUOffloadWorkerMetadata(completed_store_events=stores) if stores else None

    @staticmethod
    def _offloading_jobs(meta: Any) -> tuple[set[int], list[_Transfer], list[_Transfer]]:
        """(jobs to flush, new stores, new loads) of an ``OffloadingConnectorMetadata``."""
        stores = [
            _Transfer(job_id, True, len(entry.src_spec.block_ids))
            for job_id, entry in meta.store_jobs.items()
        ]
        loads = [
            _Transfer(job_id, False, req_ids=(entry.req_id,))
            for job_id, entry in meta.load_jobs.items()
        ]
        return set(meta.jobs_to_flush or ()), stores, loads

    @staticmethod
    def _simple_events(meta: Any) -> tuple[bool, list[_Transfer], list[_Transfer]]:
        """(flush all, new stores, new loads) of a ``SimpleCPUOffloadMetadata``."""
        stores: list[_Transfer] = []
        loads: list[_Transfer] = []
        if meta.store_event >= 0:
            stores.append(_Transfer(meta.store_event, True, len(meta.store_gpu_blocks)))
        if meta.load_event >= 0:
            req_ids = tuple(meta.load_event_to_reqs.get(meta.load_event, ()))
            loads.append(_Transfer(meta.load_event, False, req_ids=req_ids))
        return bool(meta.need_flush), stores, loads


def run_plan(
    settings: RealSettings,
    plan: tuple[PlannedRequest, ...],
    seed: int,
    *,
    max_seconds: float = 60.0,
    wedge_steps: int = WEDGE_STEPS,
) -> RunResult:
    """Feed ``plan`` at its planned instants (step time each step) until done or wedged."""
    engine = RealEngine(settings)
    pending = deque(plan)
    max_steps = int(max_seconds / settings.step_seconds)
    stall_from: int | None = None
    finished = 0
    step = 0
    for step in range(1, max_steps + 1):
        now = step * settings.step_seconds
        while pending and pending[0].send_at_seconds <= now:
            planned = pending.popleft()
            engine.add_request(f"req-{planned.index}", planned)
        if not engine.has_work():
            if not pending:
                break
            engine.step_count += 1
            continue
        outputs, scheduled = engine.step()
        if outputs:
            for engine_outputs in outputs.values():
                for out in engine_outputs.outputs:
                    if out.finish_reason is not None:
                        finished += 1
        running, waiting = engine.counts()
        if running == 0 and waiting > 0 and scheduled == 0:
            if stall_from is None:
                stall_from = step
            elif step - stall_from >= wedge_steps:
                return RunResult(
                    seed=seed,
                    wedged=True,
                    wedge_at_seconds=round(stall_from * settings.step_seconds, 3),
                    steps=step,
                    finished=finished,
                    requests=len(plan),
                    end_state=engine.end_state(),
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
        end_state=engine.end_state(),
    )


def parse_seeds(text: str) -> list[int]:
    """`1-30`, `3,5,7-9`: the seeds named."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def main(argv: list[str] | None = None) -> int:
    """Run ``sim load`` plans through the real scheduler; one JSON line per seed."""
    parser = argparse.ArgumentParser(prog="python -m wedgewatch.lab.real.vllm_engine")
    parser.add_argument("--profile", default="agentic-burst")
    parser.add_argument("--seeds", default="1-30")
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    parser.add_argument("--sync", action="store_true", help="sync scheduling (default async)")
    parser.add_argument("--no-full-isl", action="store_true")
    parser.add_argument("--simple-offload", action="store_true")
    parser.add_argument("--load-steps", type=int, default=3)
    parser.add_argument("--store-blocks-per-step", type=int, default=16)
    parser.add_argument("--wedge-steps", type=int, default=WEDGE_STEPS)
    parser.add_argument("--fault", choices=FAULTS, default=None)
    parser.add_argument(
        "--fault-after-seconds",
        type=float,
        default=0.0,
        help="the fault takes the first store (or load) starting at or after this simulated time",
    )
    args = parser.parse_args(argv)
    settings = RealSettings(
        async_scheduling=not args.sync,
        reserve_full_isl=not args.no_full_isl,
        simple_kv_offload=args.simple_offload,
        load_steps=args.load_steps,
        store_blocks_per_step=args.store_blocks_per_step,
        fault=args.fault,
        fault_after_seconds=args.fault_after_seconds,
    )
    import vllm  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    wedged = 0
    seeds = parse_seeds(args.seeds)
    for seed in seeds:
        started = time.monotonic()
        cpu_started = time.process_time()
        plan = plan_requests(args.profile, seed, args.duration)
        try:
            result = run_plan(
                settings, plan, seed, max_seconds=args.max_seconds, wedge_steps=args.wedge_steps
            )
        except NotImplementedError as exc:
            sys.stderr.write(f"error: {exc}\n")
            return 2
        wedged += result.wedged
        line = asdict(result) | {
            "vllm": vllm.__version__,
            "wall_seconds": round(time.monotonic() - started, 2),
            "cpu_seconds": round(time.process_time() - cpu_started, 2),
        }
        sys.stdout.write(json.dumps(line) + "\n")
        sys.stdout.flush()
    sys.stdout.write(
        json.dumps({"vllm": vllm.__version__, "wedged": wedged, "seeds": len(seeds)}) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
