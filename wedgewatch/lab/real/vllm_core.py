"""`sim serve --scheduler vllm`: the installed vLLM's own v1 scheduler inside `VLLM::EngineCore`.

The EngineCore process, its busy loop, its TP worker processes, the faults and the HTTP API
stay the simulator's (engine.py, worker.py, api.py); what changes is what the busy loop's
`step` drives and what `/metrics` is made of:

* **Engine side** (`RealEngineCoreProc`, in the EngineCore process): the scheduler is
  `vllm_engine.RealEngine`, i.e. vLLM's `Scheduler` / `AsyncScheduler` (with the batch queue
  of 2 that CUDA runs by default), its `KVCacheManager` and prefix cache, and the scheduler side
  of the KV connector vLLM itself builds from the serve flags and the environment
  (`OffloadingConnector` for `--kv-offloading-backend native`, `SimpleCPUOffloadConnector`
  when `VLLM_USE_SIMPLE_KV_OFFLOAD=1`). Only the GPU side is emulated: the model, the
  per-rank connector workers (vllm_engine.py) and the step time (the TP workers sleep it, as
  for the built-in model). A wedged engine's stack therefore reads
  `run_busy_loop -> _process_engine_step -> step -> ... -> Scheduler.schedule`
  (vllm/v1/core/sched/scheduler.py).
* **Serving side** (`VllmFrontend`, in the API server process): vLLM's own `OutputProcessor`
  turns the engine's real `EngineCoreOutputs` into `IterationStats`, and vLLM's own
  `PrometheusStatLogger` records them with the real `SchedulerStats`, on prometheus_client's
  REGISTRY, as `AsyncLLM`'s output handler does. `/metrics` is that vLLM version's own
  exposition.

The HTTP answers still come from the simulator's bookkeeping: each step's real outputs are
also summarised as the simulator's `StepResult` (tokens per request, finished requests).

mypy does not see vLLM (it lives in another venv): its objects are typed `Any` here.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
from functools import partial
from typing import Any, cast

from wedgewatch.lab.real.vllm_engine import RealEngine, RealSettings, token_ids
from wedgewatch.lab.sim.args import ServeArgs
from wedgewatch.lab.sim.engine import (
    EngineConfig,
    EngineCoreProc,
    EngineInput,
    EngineOutput,
    EngineScheduler,
)
from wedgewatch.lab.sim.load import PlannedRequest
from wedgewatch.lab.sim.scheduler import (
    FinishedRequest,
    FinishReason,
    IterationStats,
    SchedulerStats,
    SimRequest,
    StepResult,
)
from wedgewatch.lab.sim.worker import Executor

log = logging.getLogger("wedgewatch.lab.real.vllm_core")

DEFAULT_VLLM_VERSION = "0.30.0"
"""The release whose real wedge the demo traffic reaches (docs/simulator.md)."""
PREEMPTED_EVENT = 3  # vllm.v1.engine.EngineCoreEventType.PREEMPTED


def missing_vllm() -> str | None:
    """None when vLLM's scheduler imports here; else the one-line way to get it."""
    try:
        import vllm.v1.core.sched.scheduler  # type: ignore[import-not-found, unused-ignore]  # noqa: F401, PLC0415
    except ImportError as exc:
        venv = f".venv-vllm-{DEFAULT_VLLM_VERSION}"
        return (
            f"--scheduler vllm needs vLLM in this Python ({exc.msg}); build a venv with it and "
            f"this checkout in one command: `bash wedgewatch/lab/real/install-vllm.sh "
            f"{DEFAULT_VLLM_VERSION} {venv}`, then run `{venv}/bin/wedgewatch sim serve "
            "--scheduler vllm ...`"
        )
    return None


def real_settings(args: ServeArgs, simple_kv_offload: bool) -> RealSettings:
    """The `RealSettings` a `vllm serve` command line (and the environment) stands for."""
    defaults = RealSettings()
    offload: float | None = None
    if args.kv_offloading_size is not None and args.kv_offloading_backend == "native":
        offload = args.kv_offloading_size
    return RealSettings(
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks=args.num_gpu_blocks or defaults.num_gpu_blocks,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
        kv_offloading_size_gib=offload,
        simple_kv_offload=simple_kv_offload and offload is not None,
        async_scheduling=args.async_scheduling,
        reserve_full_isl=args.scheduler_reserve_full_isl,
        load_steps=defaults.load_steps if args.kv_load_steps is None else args.kv_load_steps,
        step_seconds=args.step_time_seconds,
    )


def with_fault(settings: RealSettings, name: str) -> RealSettings:
    """`settings` with the connector workers' fault `name` (RealSettings.fault)."""
    return dataclasses.replace(settings, fault=name)


def planned_request(request: SimRequest) -> PlannedRequest:
    """The plan entry `RealEngine.add_request` (and `token_ids`) take for an HTTP request."""
    return PlannedRequest(
        index=0,
        send_at_seconds=0.0,
        prompt_tokens=request.prompt_tokens,
        max_tokens=request.max_tokens,
        prefix_id=request.prefix_id,
        prefix_tokens=request.prefix_tokens,
    )


def _freeze_gc_heap() -> None:
    """vLLM's `freeze_gc_heap`: torch's and vLLM's import-time heap leaves the collector's view.

    Without it a full collection walks that heap (seconds on a loaded machine), in steps and
    at shutdown alike.
    """
    from vllm.utils.gc_utils import freeze_gc_heap  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    freeze_gc_heap()


# ---------------------------------------------------------------- the EngineCore process


class RealScheduler:
    """vLLM's scheduler behind the busy loop's `EngineScheduler` interface."""

    def __init__(self, settings: RealSettings) -> None:
        self.engine = RealEngine(settings)
        self._requests: dict[str, SimRequest] = {}
        self._generated: dict[str, int] = {}
        self._preemptions: dict[str, int] = {}
        self._cached: dict[str, int] = {}
        self._finished_here: list[FinishedRequest] = []
        self._stats = SchedulerStats(0, 0, 0, 0.0, 0, 0, settings.num_gpu_blocks)
        self._step = 0
        self.vllm_outputs: list[Any] = []

    # ------------------------------------------------------------ requests

    def has_work(self) -> bool:
        """Requests in vLLM's scheduler, batches in flight, or answers to send."""
        return self.engine.has_work() or bool(self._finished_here)

    def add_request(self, request: SimRequest) -> None:
        """`EngineCore.add_request`: the real `Request`, block hashes included."""
        if request.streaming_input:
            log.warning(
                "request %s: streaming input is not supported with --scheduler vllm; aborted",
                request.request_id,
            )
            self._finished_here.append(self._finished(request, "abort"))
            return
        self._requests[request.request_id] = request
        self._generated[request.request_id] = 0
        self.engine.add_request(request.request_id, planned_request(request))

    def abort_request(self, request_id: str) -> None:
        """`EngineCore.abort_requests`: vLLM frees it and sends nothing back for it."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return
        self.engine.abort_request(request_id)
        self._finished_here.append(self._finished(request, "abort"))

    def add_streaming_input(self, request_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """Not supported (the session was aborted when it arrived)."""

    def close_streaming_input(self, request_id: str) -> None:
        """Not supported (the session was aborted when it arrived)."""

    # ------------------------------------------------------------ the step

    def step(self) -> StepResult:
        """One `EngineCore.step` / `step_with_batch_queue` of vLLM's own scheduler."""
        self._step += 1
        outputs, scheduled = self.engine.step()
        token_events: list[tuple[str, int]] = []
        first: list[str] = []
        finished = self._finished_here
        self._finished_here = []
        prompt_tokens = cached = generated = preemptions = 0
        for engine_outputs in (outputs or {}).values():
            self.vllm_outputs.append(engine_outputs)
            if engine_outputs.scheduler_stats is not None:
                self._stats = self._sim_stats(engine_outputs.scheduler_stats)
            for output in engine_outputs.outputs:
                request = self._requests.get(output.request_id)
                if request is None:
                    continue
                count = len(output.new_token_ids)
                for event in output.events or ():
                    if int(event.type) == PREEMPTED_EVENT:
                        preemptions += 1
                        self._preemptions[request.request_id] = (
                            self._preemptions.get(request.request_id, 0) + 1
                        )
                if count:
                    if self._generated[request.request_id] == 0:
                        first.append(request.request_id)
                        prompt_tokens += request.prompt_tokens
                        stats = output.prefill_stats
                        hit = int(stats.num_cached_tokens) if stats is not None else 0
                        self._cached[request.request_id] = hit
                        cached += hit
                    self._generated[request.request_id] += count
                    generated += count
                    token_events.append((request.request_id, count))
                if output.finish_reason is not None:
                    reason = cast(FinishReason, str(output.finish_reason))
                    finished.append(self._finished(request, reason))
                    del self._requests[request.request_id]
        iteration = None
        if token_events or finished or preemptions:
            iteration = IterationStats(
                num_prompt_tokens=prompt_tokens,
                num_prompt_tokens_cached=cached,
                num_prompt_tokens_computed=prompt_tokens - cached,
                num_prompt_tokens_external=0,
                num_generation_tokens=generated,
                num_preemptions=preemptions,
                first_token_request_ids=tuple(first),
                finished=tuple(finished),
                num_iteration_tokens=scheduled,
            )
        return StepResult(
            step=self._step,
            scheduled=scheduled > 0,
            num_scheduled_tokens=scheduled,
            scheduler_stats=self._stats,
            iteration_stats=iteration,
            token_events=tuple(token_events),
        )

    def _finished(self, request: SimRequest, reason: FinishReason) -> FinishedRequest:
        return FinishedRequest(
            request_id=request.request_id,
            finish_reason=reason,
            num_prompt_tokens=request.prompt_tokens,
            num_generation_tokens=self._generated.pop(request.request_id, 0),
            num_cached_tokens=self._cached.pop(request.request_id, 0),
            num_preemptions=self._preemptions.pop(request.request_id, 0),
            max_tokens=request.max_tokens,
        )

    def _sim_stats(self, stats: Any) -> SchedulerStats:
        """The simulator's summary of vLLM's `SchedulerStats` (for the periodic log line)."""
        pool = self.engine.scheduler.kv_cache_manager.block_pool
        prefix = stats.prefix_cache_stats
        return SchedulerStats(
            num_running_reqs=int(stats.num_running_reqs),
            num_waiting_reqs=int(stats.num_waiting_reqs),
            num_skipped_waiting_reqs=int(stats.num_skipped_waiting_reqs),
            kv_cache_usage=float(stats.kv_cache_usage),
            prefix_cache_queries=int(prefix.queries),
            prefix_cache_hits=int(prefix.hits),
            num_free_blocks=int(pool.get_num_free_blocks()),
        )

    def set_pause_state(self, state: str) -> None:
        """vLLM's own `Scheduler.set_pause_state` (`/pause`, `/resume`); a release without
        pause states logs an error and schedules on."""
        try:
            from vllm.v1.core.sched.interface import PauseState  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        except ImportError:
            log.error("this vLLM release has no scheduler pause states: /pause is not applied")
            return
        names = {"unpaused": "UNPAUSED", "new": "PAUSED_NEW", "all": "PAUSED_ALL"}
        self.engine.scheduler.set_pause_state(getattr(PauseState, names[state]))

    def arm_fault(self, fault: str) -> None:
        """From now on the emulated KV connector workers carry out `fault` (the busy loop
        calls this once the fault is due): the next store (`lost-store-event`) or load
        (`hung-load`) never completes on one TP rank."""
        settings = with_fault(self.engine.settings, fault)
        self.engine.settings = settings
        self.engine.workers.settings = settings  # read at every transfer
        log.warning("fault %s: the emulated KV connector workers now carry it out", fault)


class RealEngineCoreProc(EngineCoreProc):
    """The simulator's EngineCore with vLLM's own scheduler in it."""

    def __init__(
        self,
        settings: RealSettings,
        config: EngineConfig,
        executor: Executor,
        input_queue: queue.Queue[EngineInput],
        output_queue: queue.Queue[EngineOutput | None],
    ) -> None:
        self._real = RealScheduler(settings)
        super().__init__(config, executor, input_queue, output_queue)
        log.info(
            "%s runs vLLM's own %s with %s",
            config.title,
            type(self._real.engine.scheduler).__name__,
            self._real.engine.connector_name,
        )
        _freeze_gc_heap()  # as vLLM's EngineCore does at the end of its __init__

    def _make_scheduler(self) -> EngineScheduler:
        return self._real

    def _take_vllm_outputs(self) -> tuple[object, ...]:
        taken = tuple(self._real.vllm_outputs)
        self._real.vllm_outputs.clear()
        return taken


def core_factory(settings: RealSettings) -> partial[RealEngineCoreProc]:
    """`EngineConfig.core_factory` for `--scheduler vllm` (picklable)."""
    return partial(RealEngineCoreProc, settings)


# ---------------------------------------------------------------- the serving process


class VllmFrontend:
    """`AsyncLLM`'s output handler: vLLM's `OutputProcessor` and `PrometheusStatLogger`."""

    def __init__(
        self, settings: RealSettings, model_name: str, engine_indexes: tuple[int, ...]
    ) -> None:
        import vllm  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.sampling_params import SamplingParams  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.v1.engine import EngineCoreRequest  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.v1.engine.output_processor import OutputProcessor  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.v1.metrics.loggers import PrometheusStatLogger  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
        from vllm.v1.metrics.stats import IterationStats as VllmIterationStats  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

        self.version = str(vllm.__version__)
        # The same VllmConfig (and connector choice) the engines build from these settings.
        probe = RealEngine(settings)
        self.connector_name = probe.connector_name
        self.scheduler_name = type(probe.scheduler).__name__
        config: Any = probe.vllm_config
        config.model_config.served_model_name = model_name
        self._sampling_params = SamplingParams
        self._request_class = EngineCoreRequest
        self._iteration_stats = VllmIterationStats
        self._processor: Any = OutputProcessor(None, log_stats=True)
        self._logger: Any = PrometheusStatLogger(config, list(engine_indexes))
        self._logger.log_engine_initialized()
        _freeze_gc_heap()  # as vLLM's API server does once it is up

    def add_request(self, request: SimRequest, arrival_time: float) -> None:
        """`OutputProcessor.add_request` of the `EngineCoreRequest` the engine schedules."""
        params = self._sampling_params(max_tokens=request.max_tokens, ignore_eos=True)
        engine_request = self._request_class(
            request_id=request.request_id,
            prompt_token_ids=token_ids(request.request_id, planned_request(request)),
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=arrival_time,
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        if "external_req_id" in self._request_class.__struct_fields__:
            engine_request.external_req_id = request.request_id  # the caller-facing id
        self._processor.add_request(engine_request, None)

    def abort_request(self, request_id: str) -> None:
        """`AsyncLLM.abort`: the output processor forgets the request."""
        self._processor.abort_requests([request_id], internal=True)

    def record_sleep_state(self, sleep: int, level: int) -> None:
        """`AsyncLLM.sleep` / `wake_up`: vLLM's `vllm:engine_sleep_state`."""
        self._logger.record_sleep_state(sleep, level)

    def record(self, engine_index: int, outputs: tuple[object, ...]) -> None:
        """What `AsyncLLM`'s output handler does with each `EngineCoreOutputs`."""
        for item in outputs:
            engine_outputs: Any = item
            iteration = self._iteration_stats() if engine_outputs.outputs else None
            self._processor.process_outputs(
                engine_outputs.outputs, engine_outputs.timestamp, iteration
            )
            self._logger.record(
                scheduler_stats=engine_outputs.scheduler_stats,
                iteration_stats=iteration,
                engine_idx=engine_index,
            )
