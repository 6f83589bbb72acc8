"""`--scheduler vllm` without vLLM: the flags, the settings they stand for, the one-line error.

The engine itself (vLLM's own scheduler over real HTTP) is tested in tests/lab/test_vllm_serve.py,
in the venvs that hold vLLM.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from wedgewatch.lab.real.vllm_core import missing_vllm, real_settings, with_fault
from wedgewatch.lab.real.vllm_engine import RealSettings
from wedgewatch.lab.sim.args import ArgsError, ServeArgs, parse_serve_args
from wedgewatch.lab.sim.faults import TRANSFER_FAULTS

TP2_OFFLOAD = [
    "--tensor-parallel-size", "2",
    "--kv-offloading-size", "60",
    "--kv-offloading-backend", "native",
    "--max-num-seqs", "6",
    "--max-num-batched-tokens", "4096",
]  # fmt: skip
HAS_VLLM = missing_vllm() is None  # (tests/vllm is a package named vllm too: ask for the scheduler)


def parse(*argv: str) -> ServeArgs:
    parsed = parse_serve_args(list(argv))
    assert isinstance(parsed, ServeArgs), parsed
    return parsed


def test_the_tp2_offload_flags_are_the_harness_defaults() -> None:
    """The launcher's flags give exactly the configuration the findings were measured on."""
    args = parse(*TP2_OFFLOAD, "--scheduler", "vllm")
    assert args.scheduler == "vllm"
    assert real_settings(args, simple_kv_offload=False) == RealSettings()
    assert real_settings(args, simple_kv_offload=True).simple_kv_offload


def test_vllm_flags_reach_the_real_settings() -> None:
    """vLLM's own switches and the simulator's knobs map onto `RealSettings`."""
    args = parse(
        *TP2_OFFLOAD,
        "--scheduler=vllm",
        "--no-async-scheduling",
        "--no-scheduler-reserve-full-isl",
        "--kv-load-steps", "20",
        "--num-gpu-blocks", "1024",
        "--step-time-seconds", "0.01",
    )  # fmt: skip
    settings = real_settings(args, simple_kv_offload=False)
    assert not settings.async_scheduling
    assert not settings.reserve_full_isl
    assert (settings.load_steps, settings.num_gpu_blocks, settings.step_seconds) == (20, 1024, 0.01)
    assert parse("--async-scheduling").async_scheduling is True
    assert parse("--scheduler-reserve-full-isl").scheduler_reserve_full_isl is True
    # No offloading flags (or the lmcache backend): no connector, hence no simple offload.
    plain = real_settings(parse("--scheduler", "vllm"), simple_kv_offload=True)
    assert plain.kv_offloading_size_gib is None
    assert not plain.simple_kv_offload


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scheduler", "real"], "--scheduler must be one of sim, vllm"),
        (["--scheduler", "vllm", "--api-server-count", "2"], "single API server"),
        (["--scheduler", "vllm", "--fault", "nan-gauges@3"], "the gauges are vLLM's own"),
    ],
)
def test_bad_combinations_are_refused(argv: list[str], message: str) -> None:
    parsed = parse_serve_args(argv)
    assert isinstance(parsed, ArgsError)
    assert message in parsed.message


def test_connector_faults_parse_with_the_real_scheduler() -> None:
    args = parse("--scheduler", "vllm", "--fault", "hung-load@5:0", "--fault", "lost-store-event")
    assert {f.name for f in args.faults} == set(TRANSFER_FAULTS)
    assert args.faults[0].engine == 0


def test_with_fault_sets_the_workers_fault() -> None:
    """`RealSettings.fault` gets the flag's fault name; the rest of the settings stay."""
    settings = RealSettings(load_steps=7)
    faulty = with_fault(settings, "hung-load")
    assert faulty.fault == "hung-load"
    assert faulty.load_steps == 7
    assert settings.fault is None


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is importable in this venv")
def test_without_vllm_the_server_says_how_to_get_it_in_one_line() -> None:
    message = missing_vllm()
    assert message is not None
    assert "bash wedgewatch/lab/real/install-vllm.sh 0.30.0 .venv-vllm-0.30.0" in message
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "sim", "serve", "--scheduler", "vllm"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: --scheduler vllm needs vLLM in this Python (No module named")
    assert line.endswith(message.split(")", 1)[1])  # the same way to get it
