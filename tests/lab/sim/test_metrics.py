"""The simulator's /metrics: vLLM 0.33.0's families, recorded the way vLLM records them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from wedgewatch.lab.sim.metrics import (
    FinishedTimes,
    IterationTimes,
    MetricsPage,
    build_1_2_5_buckets,
)
from wedgewatch.lab.sim.scheduler import FinishedRequest, IterationStats, SchedulerStats

FIXTURE = Path(__file__).parents[2] / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
FIXTURE_CACHE_LABELS = {
    "_block_size_resolved", "block_size", "cache_dtype", "cache_hit_alignment_tokens",
    "effective_attention_block_size", "enable_mamba_shared_prefix_checkpoint",
    "enable_prefix_caching", "gpu_memory_utilization", "hash_block_size", "is_attention_free",
    "kv_cache_dtype_skip_layers", "kv_cache_layout", "kv_cache_max_concurrency",
    "kv_cache_memory_bytes", "kv_cache_size_tokens", "kv_offloading_backend",
    "kv_offloading_size", "kv_sharing_fast_prefill", "mamba_block_size", "mamba_cache_dtype",
    "mamba_cache_mode", "mamba_page_size_padded", "mamba_ssm_cache_dtype", "num_cpu_blocks",
    "num_gpu_blocks", "num_gpu_blocks_override", "prefix_cache_retention_interval",
    "prefix_caching_hash_algo", "prefix_match_unit", "replayssm_buffer_len",
    "simple_cpu_offload_num_blocks", "skip_page_size_padded", "sliding_window",
    "swa_bounded_replay", "use_kda_recoverssm", "use_replayssm", "user_specified_block_size",
}  # fmt: skip


@dataclass(frozen=True)
class Family:
    type: str
    labels: frozenset[str]
    help: str
    buckets: frozenset[str]


def families(text: str) -> dict[str, Family]:
    out = {}
    for family in text_string_to_metric_families(text):
        labels: set[str] = set()
        buckets: set[str] = set()
        for sample in family.samples:
            labels |= set(sample.labels) - {"le", "quantile"}
            if "le" in sample.labels:
                buckets.add(sample.labels["le"])
        out[family.name] = Family(
            family.type, frozenset(labels), family.documentation, frozenset(buckets)
        )
    return out


def exposition(*, multiprocess: bool = False, engines: tuple[int, ...] = (0,)) -> MetricsPage:
    return MetricsPage(
        model_name="tiny-llama",
        engine_indexes=engines,
        max_model_len=2048,  # the fixture's model: 1-2-5 buckets up to 2000
        cache_config_info={name: "None" for name in FIXTURE_CACHE_LABELS},
        multiprocess=multiprocess,
    )


def value(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise AssertionError(f"no sample {name}{labels}")


def stats(running: int = 0, capacity: int = 0, deferred: int = 0, **kw: float) -> SchedulerStats:
    return SchedulerStats(
        num_running_reqs=running,
        num_waiting_reqs=capacity,
        num_skipped_waiting_reqs=deferred,
        kv_cache_usage=kw.get("usage", 0.0),
        prefix_cache_queries=int(kw.get("queries", 0)),
        prefix_cache_hits=int(kw.get("hits", 0)),
        num_free_blocks=100,
        external_prefix_cache_queries=int(kw.get("ext_queries", 0)),
        external_prefix_cache_hits=int(kw.get("ext_hits", 0)),
    )


FINISHED = FinishedRequest(
    request_id="r1",
    finish_reason="length",
    num_prompt_tokens=512,
    num_generation_tokens=37,
    num_cached_tokens=128,
    num_preemptions=1,
    max_tokens=37,
)
ITERATION = IterationStats(
    num_prompt_tokens=512,
    num_prompt_tokens_cached=96,
    num_prompt_tokens_computed=384,
    num_prompt_tokens_external=32,
    num_generation_tokens=5,
    num_preemptions=2,
    first_token_request_ids=("r1",),
    finished=(FINISHED,),
    num_iteration_tokens=517,
)


def test_every_fixture_family_is_there_with_its_type_labels_help_and_buckets() -> None:
    """Same families, types, label names, HELP texts and bucket bounds as real vLLM 0.33.0."""
    real = families(FIXTURE.read_text())
    ours = families(exposition().render().decode())
    for name, family in real.items():
        assert name in ours, f"missing family {name}"
        assert ours[name].type == family.type, name
        assert ours[name].help == family.help, name
        if family.labels:  # families without samples in the fixture carry no label names
            assert ours[name].labels == family.labels, name
        if family.buckets:
            assert ours[name].buckets == family.buckets, name


def test_label_order_and_sample_layout_match_the_real_text() -> None:
    """Labels print alphabetically; counters print `_total` and `_created`."""
    text = exposition().render().decode()
    assert (
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny-llama"}'
        in text
    )
    assert (
        'vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="deferred"}'
        in text
    )
    assert "# TYPE vllm:prompt_tokens_created gauge" in text
    assert "# TYPE vllm:iteration_tokens_total histogram" in text


def test_every_series_exists_at_zero_before_the_first_request() -> None:
    """All five finished reasons and every source are pre-created, like vLLM."""
    text = exposition().render().decode()
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert value(text, "vllm:request_success_total", finished_reason=reason) == 0
    for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
        assert value(text, "vllm:prompt_tokens_by_source_total", source=source) == 0
    assert value(text, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert value(text, "vllm:iteration_tokens_total_count") == 0


def test_scheduler_stats_set_gauges_and_prefix_counters_but_no_progress_counter() -> None:
    """A step without output moves gauges and prefix-cache counters only (vLLM 1.7)."""
    exp = exposition()
    assert exp.stats is not None
    exp.stats.record(
        0, stats(running=0, capacity=1, deferred=2, usage=0.5, queries=64, hits=32), None
    )
    exp.stats.record(
        0, stats(running=0, capacity=1, deferred=2, usage=0.5, queries=64, hits=32), None
    )
    text = exp.render().decode()
    assert value(text, "vllm:num_requests_running") == 0
    assert value(text, "vllm:num_requests_waiting") == 3
    assert value(text, "vllm:num_requests_waiting_by_reason", reason="capacity") == 1
    assert value(text, "vllm:num_requests_waiting_by_reason", reason="deferred") == 2
    assert value(text, "vllm:kv_cache_usage_perc") == 0.5
    assert value(text, "vllm:prefix_cache_queries_total") == 128
    assert value(text, "vllm:prompt_tokens_cached_by_source_total", source="device") == 64
    for progress in (
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:iteration_tokens_total_count",
        "vllm:num_preemptions_total",
    ):
        assert value(text, progress) == 0, progress


def test_iteration_stats_move_counters_histograms_and_finished_requests() -> None:
    """Token counters by source, preemptions, one iteration, one finished request with phases."""
    exp = exposition()
    assert exp.stats is not None
    times = IterationTimes(
        time_to_first_tokens=(0.084,),
        inter_token_latencies=(0.02, 0.03),
        finished={"r1": FinishedTimes(1.73, 0.004, 0.081, 1.71, 1.63, 0.045)},
    )
    exp.stats.record(0, stats(ext_hits=32, ext_queries=416), ITERATION, times)
    text = exp.render().decode()
    assert value(text, "vllm:prompt_tokens_total") == 512
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_compute") == 384
    assert value(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 96
    assert value(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 32
    assert value(text, "vllm:prompt_tokens_cached_total") == 128
    assert value(text, "vllm:prompt_tokens_cached_by_source_total", source="host") == 32
    assert value(text, "vllm:external_prefix_cache_queries_total") == 416
    assert value(text, "vllm:generation_tokens_total") == 5
    assert value(text, "vllm:num_preemptions_total") == 2
    assert value(text, "vllm:iteration_tokens_total_sum") == 517
    assert value(text, "vllm:iteration_tokens_total_count") == 1
    assert value(text, "vllm:request_success_total", finished_reason="length") == 1
    assert value(text, "vllm:request_prompt_tokens_sum") == 512
    assert value(text, "vllm:request_generation_tokens_sum") == 37
    assert value(text, "vllm:request_params_max_tokens_sum") == 37
    assert value(text, "vllm:request_num_preemptions_sum") == 1
    assert value(text, "vllm:request_prefill_kv_computed_tokens_sum") == 384
    assert value(text, "vllm:time_to_first_token_seconds_sum") == 0.084
    assert value(text, "vllm:inter_token_latency_seconds_count") == 2
    assert value(text, "vllm:e2e_request_latency_seconds_sum") == 1.73
    assert value(text, "vllm:request_queue_time_seconds_sum") == 0.004
    assert value(text, "vllm:request_decode_time_seconds_sum") == 1.63
    assert value(text, "vllm:request_time_per_output_token_seconds_count") == 1


def test_each_engine_has_its_own_series() -> None:
    """Recording for engine 1 leaves engine 0 untouched."""
    exp = exposition(engines=(0, 1))
    assert exp.stats is not None
    exp.stats.record(1, stats(running=4), None)
    text = exp.render().decode()
    assert value(text, "vllm:num_requests_running", engine="0") == 0
    assert value(text, "vllm:num_requests_running", engine="1") == 4
    assert value(text, "vllm:cache_config_info", engine="1") == 1


def test_sleep_levels_set_the_sleep_state_gauge() -> None:
    """Level 1 offloads weights, level 2 discards all, waking restores awake=1."""
    exp = exposition()
    assert exp.stats is not None
    exp.stats.record_sleep_state(0, awake=False, level=2)
    text = exp.render().decode()
    assert value(text, "vllm:engine_sleep_state", sleep_state="awake") == 0
    assert value(text, "vllm:engine_sleep_state", sleep_state="discard_all") == 1
    assert value(text, "vllm:engine_sleep_state", sleep_state="weights_offloaded") == 0
    exp.stats.record_sleep_state(0, awake=True, level=1)
    text = exp.render().decode()
    assert value(text, "vllm:engine_sleep_state", sleep_state="awake") == 1
    assert value(text, "vllm:engine_sleep_state", sleep_state="discard_all") == 0


def test_single_process_mode_filters_by_sample_name_including_process_families() -> None:
    """`/metrics/?name[]=` keeps exactly the named samples."""
    text = (
        exposition()
        .render_filtered(["vllm:num_requests_running", "process_cpu_seconds_total"])
        .decode()
    )
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == {"vllm:num_requests_running", "process_cpu_seconds"}


def test_multiprocess_mode_looks_like_vllm_with_several_api_servers() -> None:
    """No `_created`, no process/python families, `_sum` first, and name[] filters to nothing."""
    exp = exposition(multiprocess=True, engines=(0, 1))
    text = exp.render().decode()
    assert "_created" not in text
    assert "process_" not in text
    assert "python_" not in text
    assert 'vllm:num_requests_running{engine="1",model_name="tiny-llama"}' in text
    block = text.split("# TYPE vllm:request_num_preemptions histogram\n")[1].splitlines()
    assert block[0].startswith("vllm:request_num_preemptions_sum")
    assert exp.render_filtered(["vllm:num_requests_running"]) == b""
    real = families(FIXTURE.read_text())
    ours = families(text)
    for name, family in real.items():
        if name.startswith(("vllm:", "http_")) and not name.endswith("_created"):
            assert ours[name].type == family.type, name


def test_disabled_log_stats_means_no_vllm_families() -> None:
    """--disable-log-stats: vLLM builds no stat logger, so no `vllm:` family at all."""
    exp = MetricsPage(
        model_name="m",
        engine_indexes=(0,),
        max_model_len=2048,
        cache_config_info={},
        multiprocess=False,
        log_stats=False,
    )
    assert exp.stats is None
    assert "vllm:" not in exp.render().decode()


def test_http_metrics_group_status_and_skip_vllms_excluded_handlers() -> None:
    """Like the instrumentator: handler template, 2xx grouping, /metrics and /health not counted."""
    exp = exposition()
    for handler in ("/v1/completions", "/metrics", "/health"):
        exp.http.observe(
            method="POST",
            handler=handler,
            status_code=201,
            request_bytes=10,
            response_bytes=20,
            duration_seconds=0.2,
        )
    text = exp.render().decode()
    assert value(text, "http_requests_total", handler="/v1/completions", status="2xx") == 1
    assert value(text, "http_request_duration_highr_seconds_count") == 1
    assert 'handler="/metrics"' not in text


def test_token_buckets_follow_max_model_len() -> None:
    """1, 2, 5, 10, ... up to and including max_model_len."""
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(32768)[-1] == 20000
