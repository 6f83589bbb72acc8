"""`vllm serve`-compatible argument parsing for the simulator."""

from __future__ import annotations

import pytest

from wedgewatch.lab.sim.args import (
    ArgsError,
    HelpRequested,
    ServeArgs,
    parse_serve_args,
)
from wedgewatch.lab.sim.faults import FaultSpec

LAUNCHER_FLAGS = [
    "Qwen/Qwen3-32B",
    "--host",
    "127.0.0.1",
    "--port",
    "8001",
    "--tensor-parallel-size",
    "2",
    "--kv-offloading-size",
    "60",
    "--kv-offloading-backend",
    "native",
    "--max-num-seqs",
    "6",
    "--max-num-batched-tokens",
    "4096",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
]


def parsed(argv: list[str]) -> ServeArgs:
    result = parse_serve_args(argv)
    assert isinstance(result, ServeArgs), result
    return result


def error(argv: list[str]) -> str:
    result = parse_serve_args(argv)
    assert isinstance(result, ArgsError), result
    return result.message


def test_the_launchers_command_line_parses_into_the_modelled_settings() -> None:
    """Every flag the launcher passes to `vllm serve` lands in its field."""
    args = parsed(LAUNCHER_FLAGS)
    assert args.model == "Qwen/Qwen3-32B"
    assert args.model_name == "Qwen/Qwen3-32B"
    assert (args.host, args.port) == ("127.0.0.1", 8001)
    assert args.tensor_parallel_size == 2
    assert args.kv_offloading_size == 60.0
    assert args.kv_offloading_backend == "native"
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (6, 4096)
    assert args.enable_prefix_caching
    assert args.enable_chunked_prefill
    assert args.ignored_flags == ()
    assert args.scheduler_fix == "stock"
    assert not args.multiprocess_metrics


def test_defaults_are_vllms_where_vllm_has_one() -> None:
    """No flags: vLLM's default model, port, batch limits; all interfaces; the stock policy."""
    args = parsed([])
    assert args.model == "Qwen/Qwen3-0.6B"
    assert args.host is None
    assert args.port == 8000
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (256, 8192)
    assert args.kv_offloading_size is None
    assert args.step_time_seconds == 0.005


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--port=9000"], "port", 9000),
        (["-tp", "4"], "tensor_parallel_size", 4),
        (["-dp", "2"], "data_parallel_size", 2),
        (["--no-enable-prefix-caching"], "enable_prefix_caching", False),
        (["--no-enable-chunked-prefill", "--max-num-batched-tokens", "32768"],
         "enable_chunked_prefill", False),
        (["--max-model-len", "16k"], "max_model_len", 16000),
        (["--max-model-len", "16K"], "max_model_len", 16384),
        (["--num-gpu-blocks-override", "512"], "num_gpu_blocks", 512),
        (["--num-gpu-blocks", "64"], "num_gpu_blocks", 64),
        (["--step-time-seconds", "0.001"], "step_time_seconds", 0.001),
        (["--scheduler-fix", "skip-head-when-idle"], "scheduler_fix", "skip-head-when-idle"),
        (["--kv-load-steps", "0"], "kv_load_steps", 0),
        (["--seed", "-3"], "seed", -3),
        (["--served-model-name", "a", "b"], "served_model_name", ("a", "b")),
        (["--disable-log-stats"], "disable_log_stats", True),
    ],
    ids=str,
)  # fmt: skip
def test_each_modelled_flag_sets_its_field(argv: list[str], field: str, value: object) -> None:
    """Long, `=`, short-alias, negated and human-size forms all reach the right field."""
    assert getattr(parsed(argv), field) == value


def test_served_model_name_is_the_metrics_and_response_name() -> None:
    """The first served name wins over the model path."""
    args = parsed(["org/model", "--served-model-name", "short", "alias"])
    assert args.model == "org/model"
    assert args.model_name == "short"


def test_unknown_vllm_flags_are_accepted_and_reported_with_their_values_skipped() -> None:
    """Unmodelled flags are ignored (for a warning), their values do not become MODEL."""
    args = parsed(
        ["--trust-remote-code", "--dtype", "bfloat16", "org/m", "--enforce-eager", "--x=1"]
    )
    assert args.model == "org/m"
    assert args.ignored_flags == ("--trust-remote-code", "--dtype", "--enforce-eager", "--x")


def test_data_parallel_defaults_to_multiprocess_metrics_like_api_server_count() -> None:
    """DP > 1 means DP API servers in vLLM, hence multiprocess-style /metrics."""
    assert parsed(["-dp", "2"]).multiprocess_metrics
    assert not parsed(["-dp", "2", "--api-server-count", "1"]).multiprocess_metrics
    assert parsed(["--api-server-count", "2"]).multiprocess_metrics


def test_faults_are_repeatable_and_parsed() -> None:
    """`--fault` may be given several times, with an optional DP rank."""
    args = parsed(["-dp", "2", "--fault", "collective-hang@20:1", "--fault=api-hang@5"])
    assert args.faults == (
        FaultSpec("collective-hang", 20.0, 1),
        FaultSpec("api-hang", 5.0, None),
    )


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--port", "x"], "--port expects an integer"),
        (["--port", "70000"], "0..65535"),
        (["--tensor-parallel-size", "0"], "positive integer"),
        (["--kv-offloading-backend", "nfs"], "native, lmcache"),
        (["--kv-offloading-size", "0"], "positive number of GiB"),
        (["--gpu-memory-utilization", "1.5"], "in [0.0, 1.0]"),
        (["--scheduler-fix", "magic"], "stock, skip-head-when-idle"),
        (["--fault", "meteor@1"], "unknown fault 'meteor'"),
        (["--fault", "api-hang@soon"], "not a number"),
        (["--fault", "api-hang@1:0"], "takes no ':RANK'"),
        (["--fault", "engine-crash@1:3"], "--data-parallel-size is 1"),
        (["--port"], "--port expects a value"),
        (["a", "b"], "at most one positional MODEL"),
        (["a", "--model", "b"], "MODEL given twice"),
        (["--enable-prefix-caching=yes"], "takes no value"),
        (["-x"], "unknown short option"),
        (["--no-enable-chunked-prefill"], "with chunked prefill disabled"),
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "must be >= --max-num-seqs"),
    ],
    ids=str,
)  # fmt: skip
def test_bad_command_lines_get_a_specific_message(argv: list[str], fragment: str) -> None:
    """Each mistake is named, with the offending flag or value."""
    assert fragment in error(argv)


def test_help_is_a_request_not_an_error() -> None:
    """-h/--help anywhere asks for the help text."""
    assert isinstance(parse_serve_args(["m", "--help"]), HelpRequested)
    assert isinstance(parse_serve_args(["-h"]), HelpRequested)
