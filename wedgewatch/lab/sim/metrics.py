"""The simulator's `/metrics`: vLLM 0.33.0's families, recorded the way vLLM records them.

`VllmStatLogger` mirrors vLLM's `PrometheusStatLogger`: every per-engine series is created
at start-up, gauges (and the prefix-cache counters) are set from `SchedulerStats` on every
step, and everything else (token counters, preemptions, finished requests, latency
histograms) only from `IterationStats`, i.e. only on steps that produced output. Names,
types, label names, HELP texts and buckets follow the real exposition in
`tests/fixtures/vllm-0.33.0/healthy_busy.prom`.

Every server keeps its metrics on its own `CollectorRegistry`; nothing registers globally.
`MetricsPage` renders the registry either like a single API server (`_created` samples,
`process_*` and `python_*` families) or like vLLM's multiprocess mode (`--api-server-count
> 1`: neither, histogram `_sum` first, and `GET /metrics/?name[]=...` filters to nothing).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from wedgewatch.lab.sim.scheduler import IterationStats, SchedulerStats

_M = TypeVar("_M", Counter, Gauge, Histogram)

ENGINE_LABELS = ("model_name", "engine")
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_PROMPT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")

ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
HTTP_HIGHR_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5,
    3.0, 3.5, 4.0, 4.5, 5.0, 7.5, 10.0, 30.0, 60.0,
)  # fmt: skip
HTTP_LOWR_BUCKETS = (0.1, 0.5, 1.0)
# vLLM's instrumentator does not record these handlers.
HTTP_EXCLUDED_HANDLERS = frozenset(
    {"/metrics", "/health", "/load", "/ping", "/version", "/server_info"}
)

_MFU_HELP = "(for Model Flops Utilization calculations)."


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to and including `max_value` (vLLM's token buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_value:
                return tuple(buckets)
            buckets.append(value)
        scale *= 10


@dataclass(frozen=True, slots=True)
class FinishedTimes:
    """Wall-clock phases of one finished request, measured by the serving process (seconds)."""

    e2e_latency: float
    queued_time: float
    prefill_time: float
    inference_time: float
    decode_time: float
    mean_time_per_output_token: float


@dataclass(frozen=True, slots=True)
class IterationTimes:
    """The latencies one step produced: TTFTs, inter-token gaps and finished-request phases."""

    time_to_first_tokens: tuple[float, ...] = ()
    inter_token_latencies: tuple[float, ...] = ()
    finished: Mapping[str, FinishedTimes] | None = None  # request_id -> phases


class VllmStatLogger:
    """vLLM's `PrometheusStatLogger` for the simulator: one series per engine, pre-created."""

    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        engine_indexes: Sequence[int],
        max_model_len: int,
    ) -> None:
        self._registry = registry
        self._model_name = model_name
        self._engines = tuple(engine_indexes)
        self.non_finite_gauges = False
        token_buckets = build_1_2_5_buckets(max_model_len)

        def labels_per_engine(metric: _M) -> dict[int, _M]:
            return {i: metric.labels(model_name, str(i)) for i in self._engines}

        def counter(name: str, help_text: str) -> dict[int, Counter]:
            return labels_per_engine(Counter(name, help_text, ENGINE_LABELS, registry=registry))

        def gauge(name: str, help_text: str) -> dict[int, Gauge]:
            return labels_per_engine(
                Gauge(name, help_text, ENGINE_LABELS, multiprocess_mode="mostrecent",
                      registry=registry)
            )  # fmt: skip

        def histogram(name: str, help_text: str, buckets: Sequence[float]) -> dict[int, Histogram]:
            return labels_per_engine(
                Histogram(name, help_text, ENGINE_LABELS, buckets=buckets, registry=registry)
            )

        self.estimated_flops = counter(
            "vllm:estimated_flops_per_gpu",
            f"Estimated number of floating point operations per GPU {_MFU_HELP}",
        )
        self.estimated_read_bytes = counter(
            "vllm:estimated_read_bytes_per_gpu",
            f"Estimated number of bytes read from memory per GPU {_MFU_HELP}",
        )
        self.estimated_write_bytes = counter(
            "vllm:estimated_write_bytes_per_gpu",
            f"Estimated number of bytes written to memory per GPU {_MFU_HELP}",
        )
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        waiting_by_reason = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            (*ENGINE_LABELS, "reason"),
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.waiting_capacity = {
            i: waiting_by_reason.labels(model_name, str(i), "capacity") for i in self._engines
        }
        self.waiting_deferred = {
            i: waiting_by_reason.labels(model_name, str(i), "deferred") for i in self._engines
        }
        sleep_state = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is "
            "awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            (*ENGINE_LABELS, "sleep_state"),
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.sleep_state = {
            (i, state): sleep_state.labels(model_name, str(i), state)
            for i in self._engines
            for state in SLEEP_STATES
        }
        for i in self._engines:
            self.sleep_state[(i, "awake")].set(1)
        self.kv_cache_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.external_prefix_cache_queries = counter(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in "
            "terms of number of queried tokens.",
        )
        self.external_prefix_cache_hits = counter(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in "
            "terms of number of cached tokens.",
        )
        self.mm_cache_queries = counter(
            "vllm:mm_cache_queries",
            "Multi-modal cache queries, in terms of number of queried items.",
        )
        self.mm_cache_hits = counter(
            "vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items."
        )
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        prompt_by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            (*ENGINE_LABELS, "source"),
            registry=registry,
        )
        self.prompt_tokens_by_source = {
            (i, source): prompt_by_source.labels(model_name, str(i), source)
            for i in self._engines
            for source in PROMPT_SOURCES
        }
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        cached_by_source = Counter(
            "vllm:prompt_tokens_cached_by_source",
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), "
            "host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
            "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
            "vllm:external_prefix_cache_hits.",
            (*ENGINE_LABELS, "source"),
            registry=registry,
        )
        self.prompt_tokens_cached_by_source = {
            (i, source): cached_by_source.labels(model_name, str(i), source)
            for i in self._engines
            for source in CACHED_PROMPT_SOURCES
        }
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*ENGINE_LABELS, "finished_reason"),
            registry=registry,
        )
        self.request_success = {
            (i, reason): request_success.labels(model_name, str(i), reason)
            for i in self._engines
            for reason in FINISH_REASONS
        }
        admission_rejections = Counter(
            "vllm:admission_rejections",
            "Number of admission attempts rejected by a queue limit, by reason.",
            ("model_name", "reason"),
            registry=registry,
        )
        self.admission_rejections = {
            reason: admission_rejections.labels(model_name, reason)
            for reason in ADMISSION_REJECTION_REASONS
        }
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            token_buckets,
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.request_max_num_generation_tokens = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            token_buckets,
        )
        self.request_params_n = histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", PARAMS_N_BUCKETS
        )
        self.request_params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            token_buckets,
        )
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_BUCKETS,
        )
        self.time_per_output_token = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_BUCKETS,
        )
        self.e2e_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_num_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            NUM_PREEMPTIONS_BUCKETS,
        )
        self.prefill_kv_computed_tokens = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            token_buckets,
        )

    def log_engine_initialized(self, cache_config_info: Mapping[str, str]) -> None:
        """Register `vllm:cache_config_info` (vLLM does this once the engines are up)."""
        label_names = sorted({*cache_config_info, "engine"})
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            label_names,
            multiprocess_mode="mostrecent",
            registry=self._registry,
        )
        for i in self._engines:
            info.labels(**{**cache_config_info, "engine": str(i)}).set(1)

    def record(
        self,
        engine: int,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        times: IterationTimes | None = None,
    ) -> None:
        """Record one step of one engine, exactly as vLLM's stat logger does."""
        if scheduler_stats is not None and self.non_finite_gauges:
            self.write_nan_gauges()
        elif scheduler_stats is not None:
            self.running[engine].set(scheduler_stats.num_running_reqs)
            self.waiting[engine].set(
                scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs
            )
            self.waiting_capacity[engine].set(scheduler_stats.num_waiting_reqs)
            self.waiting_deferred[engine].set(scheduler_stats.num_skipped_waiting_reqs)
            self.kv_cache_usage[engine].set(scheduler_stats.kv_cache_usage)
            self.prefix_cache_queries[engine].inc(scheduler_stats.prefix_cache_queries)
            self.prefix_cache_hits[engine].inc(scheduler_stats.prefix_cache_hits)
            self.external_prefix_cache_queries[engine].inc(
                scheduler_stats.external_prefix_cache_queries
            )
            self.external_prefix_cache_hits[engine].inc(scheduler_stats.external_prefix_cache_hits)
            self.prompt_tokens_cached_by_source[(engine, "device")].inc(
                scheduler_stats.prefix_cache_hits
            )
            self.prompt_tokens_cached_by_source[(engine, "host")].inc(
                scheduler_stats.external_prefix_cache_hits
            )
        if iteration_stats is None:
            return
        stats = iteration_stats
        self.num_preemptions[engine].inc(stats.num_preemptions)
        self.prompt_tokens[engine].inc(stats.num_prompt_tokens)
        self.prompt_tokens_by_source[(engine, "local_compute")].inc(
            stats.num_prompt_tokens_computed
        )
        self.prompt_tokens_by_source[(engine, "local_cache_hit")].inc(
            stats.num_prompt_tokens_cached
        )
        self.prompt_tokens_by_source[(engine, "external_kv_transfer")].inc(
            stats.num_prompt_tokens_external
        )
        self.prompt_tokens_cached[engine].inc(
            stats.num_prompt_tokens_cached + stats.num_prompt_tokens_external
        )
        self.generation_tokens[engine].inc(stats.num_generation_tokens)
        self.iteration_tokens[engine].observe(stats.num_iteration_tokens)
        times = times or IterationTimes()
        for ttft in times.time_to_first_tokens:
            self.time_to_first_token[engine].observe(ttft)
        for itl in times.inter_token_latencies:
            self.inter_token_latency[engine].observe(itl)
        finished_times = times.finished or {}
        for finished in stats.finished:
            self.request_success[(engine, finished.finish_reason)].inc()
            self.request_prompt_tokens[engine].observe(finished.num_prompt_tokens)
            self.request_generation_tokens[engine].observe(finished.num_generation_tokens)
            self.request_max_num_generation_tokens[engine].observe(finished.max_tokens)
            self.request_params_n[engine].observe(1)
            self.request_params_max_tokens[engine].observe(finished.max_tokens)
            self.request_num_preemptions[engine].observe(finished.num_preemptions)
            self.prefill_kv_computed_tokens[engine].observe(
                max(finished.num_prompt_tokens - finished.num_cached_tokens, 0)
            )
            phases = finished_times.get(finished.request_id)
            if phases is None:
                continue
            self.e2e_latency[engine].observe(phases.e2e_latency)
            self.queue_time[engine].observe(phases.queued_time)
            self.prefill_time[engine].observe(phases.prefill_time)
            self.inference_time[engine].observe(phases.inference_time)
            self.decode_time[engine].observe(phases.decode_time)
            if finished.num_generation_tokens > 1:
                self.time_per_output_token[engine].observe(phases.mean_time_per_output_token)

    def write_nan_gauges(self) -> None:
        """The `nan-gauges` fault: from now on the queue and KV-usage gauges read NaN.

        Counters, histograms and the sleep and info gauges keep their real values, so the
        exposition stays valid and only the values a 0/0 in a stats path would poison change.
        """
        self.non_finite_gauges = True
        nan = math.nan
        for engine in self._engines:
            for gauge in (
                self.running[engine],
                self.waiting[engine],
                self.waiting_capacity[engine],
                self.waiting_deferred[engine],
                self.kv_cache_usage[engine],
            ):
                gauge.set(nan)

    def record_sleep_state(self, engine: int, *, awake: bool, level: int) -> None:
        """Set `vllm:engine_sleep_state` (level 1 offloads weights, level 2 discards all)."""
        self.sleep_state[(engine, "awake")].set(1 if awake else 0)
        self.sleep_state[(engine, "weights_offloaded")].set(1 if not awake and level == 1 else 0)
        self.sleep_state[(engine, "discard_all")].set(1 if not awake and level == 2 else 0)

    def record_admission_rejection(self, reason: str) -> None:
        """Count a request refused by `--max-num-queued-reqs` / `--max-num-queued-tokens`."""
        self.admission_rejections[reason].inc()


class HttpMetrics:
    """The `http_*` families of prometheus-fastapi-instrumentator, as vLLM configures it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            ("method", "status", "handler"),
            registry=registry,
        )
        self.request_size = Summary(
            "http_request_size_bytes",
            "Content length of incoming requests by handler. Only value of header is respected. "
            "Otherwise ignored. No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self.response_size = Summary(
            "http_response_size_bytes",
            "Content length of outgoing responses by handler. Only value of header is "
            "respected. Otherwise ignored. No percentile calculated. ",
            ("handler",),
            registry=registry,
        )
        self.duration_highr = Histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels. Made for more accurate "
            "percentile calculations. ",
            buckets=HTTP_HIGHR_BUCKETS,
            registry=registry,
        )
        self.duration_lowr = Histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler. Made to be only used if aggregation by "
            "handler is important. ",
            ("method", "handler"),
            buckets=HTTP_LOWR_BUCKETS,
            registry=registry,
        )

    def observe(
        self,
        *,
        method: str,
        handler: str,
        status_code: int,
        request_bytes: int,
        response_bytes: int,
        duration_seconds: float,
    ) -> None:
        """Record one finished HTTP request (status grouped as `2xx`, like vLLM's setup)."""
        if handler in HTTP_EXCLUDED_HANDLERS:
            return
        status = f"{status_code // 100}xx"
        self.requests.labels(method, status, handler).inc()
        self.request_size.labels(handler).observe(request_bytes)
        self.response_size.labels(handler).observe(response_bytes)
        self.duration_highr.observe(duration_seconds)
        self.duration_lowr.labels(method, handler).observe(duration_seconds)


def _multiprocess_histogram_order(samples: Sequence[Sample]) -> list[Sample]:
    """MultiProcessCollector prints each histogram series as `_sum`, the buckets, `_count`."""
    series: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for sample in samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        series.setdefault(key, []).append(sample)

    def rank(sample: Sample) -> int:
        if sample.name.endswith("_sum"):
            return 0
        return 2 if sample.name.endswith("_count") else 1

    return [s for group in series.values() for s in sorted(group, key=rank)]


class _MultiprocessStyle(Collector):
    """Presents another registry the way prometheus_client's MultiProcessCollector does.

    No `_created` samples, histogram `_sum` before the buckets, and no `describe()`, so a
    `name[]`-restricted view of it is empty (exactly vLLM's multiprocess-mode behaviour).
    """

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        for family in self._source.collect():
            samples = [s for s in family.samples if not s.name.endswith("_created")]
            if family.type == "histogram":
                samples = _multiprocess_histogram_order(samples)
            clone = Metric(family.name, family.documentation, family.type, family.unit)
            clone.samples = samples
            yield clone


class MetricsPage:
    """What the simulator's `/metrics` serves: the vLLM, HTTP and (single mode) process families.

    Families register in the order of the real exposition: process and Python collectors
    (single mode only), the per-engine vLLM families, `vllm:cache_config_info` (vLLM adds
    it once the engines are up), then the HTTP instrumentator's families.
    """

    def __init__(
        self,
        *,
        model_name: str,
        engine_indexes: Sequence[int],
        max_model_len: int,
        cache_config_info: Mapping[str, str],
        multiprocess: bool,
        log_stats: bool = True,
    ) -> None:
        self.multiprocess = multiprocess
        # vLLM's single-server registry is prometheus_client's REGISTRY, which auto-describes
        # collectors, so `name[]` can select `process_*` too. Ours is private but alike.
        source = CollectorRegistry(auto_describe=not multiprocess)
        if not multiprocess:
            GCCollector(registry=source)
            PlatformCollector(registry=source)
            ProcessCollector(registry=source)
        self.stats: VllmStatLogger | None = None
        if log_stats:
            self.stats = VllmStatLogger(source, model_name, engine_indexes, max_model_len)
            self.stats.log_engine_initialized(cache_config_info)
        self.http = HttpMetrics(source)
        if multiprocess:
            self.registry = CollectorRegistry()
            self.registry.register(_MultiprocessStyle(source))
        else:
            self.registry = source

    @classmethod
    def of_registry(cls, registry: CollectorRegistry) -> MetricsPage:
        """`--scheduler vllm`: vLLM's own stat logger already registered its families there.

        `registry` is prometheus_client's REGISTRY, as in a single vLLM API server; the HTTP
        instrumentator's families join it, and the simulator records nothing of its own.
        """
        exposition = cls.__new__(cls)
        exposition.multiprocess = False
        exposition.stats = None
        exposition.http = HttpMetrics(registry)
        exposition.registry = registry
        return exposition

    def render(self) -> bytes:
        """The full exposition (`GET /metrics`, which ignores `name[]`)."""
        return generate_latest(self.registry)

    def render_filtered(self, names: Iterable[str]) -> bytes:
        """`GET /metrics/?name[]=...`: a sample-name filter; empty in multiprocess mode."""
        wanted = list(names)
        if not wanted:
            return self.render()
        return generate_latest(self.registry.restricted_registry(wanted))
