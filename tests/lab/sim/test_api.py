"""The serving process's pure parts: request validation, config mapping, latency phases."""

from __future__ import annotations

import pytest
from test_metrics import FIXTURE_CACHE_LABELS

from wedgewatch.lab.sim.api import (
    BadRequest,
    cache_config_info,
    count_prompt_tokens,
    parse_completion,
    scheduler_config_from_args,
)
from wedgewatch.lab.sim.args import ServeArgs, parse_serve_args
from wedgewatch.lab.sim.client import finished_times
from wedgewatch.lab.sim.scheduler import FinishedRequest, SchedulerConfig

NAMES = ("tiny",)


@pytest.mark.parametrize(
    ("body", "tokens"),
    [
        ({"prompt": "abcd"}, 1),
        ({"prompt": "abcde"}, 2),
        ({"prompt": "x" * 400}, 100),
        ({"prompt": [1, 2, 3]}, 3),
        ({"prompt": ["hello world!"]}, 3),
        ({"prompt": "ignored", "prompt_tokens": 5000}, 5000),
        ({"prompt_tokens": "12"}, 12),
    ],
    ids=lambda v: str(v)[:40],
)
def test_prompt_tokens_come_from_the_extension_field_or_the_prompt(
    body: dict[str, object], tokens: int
) -> None:
    """Text counts ceil(chars/4), a token list its length, `prompt_tokens` wins."""
    assert count_prompt_tokens(body) == tokens


@pytest.mark.parametrize(
    ("body", "fragment", "status"),
    [
        ([], "JSON object", 400),
        ({"prompt": ""}, "must not be empty", 400),
        ({"prompt": ["a", "b"]}, "batched prompts", 400),
        ({"prompt": 5}, "string or a list", 400),
        ({"prompt_tokens": 0}, ">= 1", 400),
        ({"prompt_tokens": True}, "must be an integer", 400),
        ({"prompt": "hi", "model": "other"}, "`other` does not exist", 404),
        ({"prompt": "hi", "max_tokens": 0}, "at least 1", 400),
        ({"prompt": "hi", "max_tokens": "9"}, "max_tokens must be an integer", 400),
        ({"prompt_tokens": 2000, "max_tokens": 100}, "maximum context length is 2048", 400),
        ({"prompt": "hi", "n": 2}, "n=1 only", 400),
        ({"prompt": "hi", "prefix_id": 3}, "prefix_id must be a string", 400),
        ({"prompt_tokens": 10, "prefix_id": "p", "prefix_tokens": 11}, "within [0, 10]", 400),
        ({"prompt": "hi", "stream": "yes"}, "stream must be a boolean", 400),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_completion_requests_are_refused_like_vllm(
    body: object, fragment: str, status: int
) -> None:
    """Each invalid body names what is wrong, with vLLM's status code."""
    with pytest.raises(BadRequest) as caught:
        parse_completion(body, served_names=NAMES, max_model_len=2048)
    assert fragment in str(caught.value)
    assert caught.value.status_code == status


def test_a_valid_completion_request_has_defaults() -> None:
    """max_tokens defaults to 16; a prefix_id without prefix_tokens shares the whole prompt."""
    params = parse_completion(
        {"prompt_tokens": 100, "prefix_id": "p"}, served_names=NAMES, max_model_len=2048
    )
    assert (params.model, params.prompt_tokens, params.max_tokens) == ("tiny", 100, 16)
    assert (params.prefix_id, params.prefix_tokens, params.stream) == ("p", 100, False)
    unlimited = parse_completion(
        {"prompt_tokens": 48, "max_tokens": None}, served_names=NAMES, max_model_len=2048
    )
    assert unlimited.max_tokens == 2000


def test_the_launcher_flags_map_to_the_production_scheduler_profile() -> None:
    """TP=2, 60 GiB offload, 6 seqs, 4096 tokens: the scheduler model's defaults."""
    args = parse_serve_args(
        [
            "m",
            "--tensor-parallel-size", "2",
            "--kv-offloading-size", "60",
            "--kv-offloading-backend", "native",
            "--max-num-seqs", "6",
            "--max-num-batched-tokens", "4096",
            "--enable-prefix-caching",
            "--enable-chunked-prefill",
        ]
    )  # fmt: skip
    assert isinstance(args, ServeArgs)
    config = scheduler_config_from_args(args)
    assert config == SchedulerConfig()


def test_no_offloading_means_no_cpu_tier_and_the_fix_flag_sets_the_policy() -> None:
    """Without --kv-offloading-size there is no CPU tier (no KV connector)."""
    args = parse_serve_args(["--scheduler-fix", "skip-head-when-idle", "--num-gpu-blocks", "4096"])
    assert isinstance(args, ServeArgs)
    config = scheduler_config_from_args(args)
    assert config.num_cpu_blocks == 0
    assert config.policy == "skip-head-when-idle"
    assert config.num_gpu_blocks == 4096


def test_an_impossible_pool_is_a_configuration_error() -> None:
    """A pool smaller than one max_model_len sequence is refused, as vLLM refuses to start."""
    args = parse_serve_args(["--num-gpu-blocks", "16"])
    assert isinstance(args, ServeArgs)
    with pytest.raises(ValueError, match="does not fit in the KV cache"):
        scheduler_config_from_args(args)


def test_cache_config_info_has_the_real_label_set_and_the_sims_values() -> None:
    """The label names are vLLM 0.33.0's CacheConfig fields; values describe the sim."""
    args = parse_serve_args(["--kv-offloading-size", "60", "--tensor-parallel-size", "2"])
    assert isinstance(args, ServeArgs)
    info = cache_config_info(args, scheduler_config_from_args(args))
    assert set(info) == FIXTURE_CACHE_LABELS
    assert info["num_gpu_blocks"] == "2048"
    assert info["num_cpu_blocks"] == "15360"
    assert info["kv_offloading_size"] == "60.0"
    assert info["kv_offloading_backend"] == "native"


FINISHED = FinishedRequest("r", "length", 8192, 101, 0, 0, 101)


def test_latency_phases_add_up_and_respect_arrival() -> None:
    """queue + prefill = TTFT; prefill is the modelled prefill; decode covers the tokens."""
    phases = finished_times(
        FINISHED,
        arrival_time=100.0,
        first_token_time=103.0,
        last_token_time=104.0,
        now=104.01,
        step_time_seconds=0.005,
        max_num_batched_tokens=4096,
    )
    assert phases.e2e_latency == pytest.approx(4.01)
    assert phases.prefill_time == pytest.approx(0.010)  # two 4096-token chunks
    assert phases.queued_time + phases.prefill_time == pytest.approx(3.0)
    assert phases.decode_time == pytest.approx(1.0)
    assert phases.inference_time == pytest.approx(1.01)
    assert phases.mean_time_per_output_token == pytest.approx(0.01)


def test_a_request_aborted_before_its_first_token_only_queued() -> None:
    """No first token: the whole life was queue time."""
    phases = finished_times(
        FINISHED,
        arrival_time=10.0,
        first_token_time=None,
        last_token_time=10.0,
        now=12.0,
        step_time_seconds=0.005,
        max_num_batched_tokens=4096,
    )
    assert (phases.e2e_latency, phases.queued_time, phases.prefill_time) == (2.0, 2.0, 0.0)
