"""vLLM's own scheduler on a CPU (wedgewatch/sim/vllm_engine.py), in the venvs tests/run.sh builds.

Each test runs `python -m wedgewatch.sim.vllm_engine` with the python of a venv holding a real
vLLM (`.venv-vllm-<version>/`, built by `bash wedgewatch/sim/install-vllm.sh VERSION DIR`), on
the `agentic-burst` plan of seed 16 under the tp2-offload configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def vllm_python(version: str) -> Path:
    """The python of the venv holding vLLM `version`, or skip saying how to build it."""
    for candidate in (
        ROOT / f".venv-vllm-{version}" / "bin" / "python",
        ROOT / ".vllm-venvs" / f"v{version}" / "bin" / "python",
    ):
        if candidate.exists():
            return candidate
    pytest.skip(
        f"no vLLM {version} venv; build it with "
        f"`bash wedgewatch/sim/install-vllm.sh {version} .venv-vllm-{version}`"
    )
    raise AssertionError("unreachable")  # pragma: no cover


def run_real(version: str, *flags: str) -> list[dict[str, object]]:
    """Run the real-scheduler harness; its JSON lines (one per seed, then the total)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run(
        [str(vllm_python(version)), "-m", "wedgewatch.sim.vllm_engine", *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
    assert done.returncode == 0
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_vllm_0_30_0_wedges_with_a_blockless_preempted_request_ahead_of_a_parked_load() -> None:
    """vLLM 0.30.0's real async scheduler (full-ISL off) wedges seed 16 the measured way."""
    lines = run_real(
        "0.30.0", "--seeds", "16", "--no-full-isl", "--max-seconds", "20", "--duration", "12"
    )
    result = lines[0]
    assert result["vllm"] == "0.30.0"
    assert result["wedged"] is True
    state = result["end_state"]
    assert isinstance(state, dict)
    assert state["running"] == 0
    assert state["waiting"] > 0
    assert state["kv_usage"] < 0.5
    skipped = state["skipped_waiting"]
    statuses = [status for _rid, status, _computed in skipped]
    assert statuses[0] == "PREEMPTED"
    assert skipped[0][2] == 0
    assert "WAITING_FOR_REMOTE_KVS" in statuses or "WAITING" in statuses[1:]


@pytest.mark.slow
def test_an_unemulated_connector_is_refused_rather_than_faked_as_a_wedge() -> None:
    """With VLLM_USE_SIMPLE_KV_OFFLOAD the harness names the connector it cannot emulate."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run(
        [
            str(vllm_python("0.30.0")),
            "-m",
            "wedgewatch.sim.vllm_engine",
            "--seeds",
            "1",
            "--simple-offload",
            "--max-seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert "SimpleCPUOffloadConnector" in done.stderr
    assert '"wedged"' not in done.stdout


@pytest.mark.slow
def test_vllm_0_33_0_serves_the_same_plan_to_the_end() -> None:
    """vLLM 0.33.0's real scheduler finishes every request of the plan 0.30.0 wedges on."""
    lines = run_real(
        "0.33.0", "--seeds", "16", "--no-full-isl", "--max-seconds", "40", "--duration", "12"
    )
    result = lines[0]
    assert result["vllm"] == "0.33.0"
    assert result["wedged"] is False
    assert result["finished"] == result["requests"] == 61
    state = result["end_state"]
    assert isinstance(state, dict)
    assert "kv_holding_waiting" in state
    assert "skipped_waiting" not in state


@pytest.mark.slow
def test_vllm_0_30_0_sync_scheduling_serves_the_plan_to_the_end() -> None:
    """Sync scheduling flushes a preempted request's stores first, so 0.30.0 never wedges."""
    lines = run_real(
        "0.30.0",
        "--seeds",
        "16",
        "--sync",
        "--no-full-isl",
        "--max-seconds",
        "40",
        "--duration",
        "12",
    )
    result = lines[0]
    assert result["wedged"] is False
    assert result["finished"] == result["requests"] == 61
