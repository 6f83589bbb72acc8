"""vLLM's own scheduler on a CPU (wedgewatch/lab/real/vllm_engine.py), in the cached vLLM venvs.

Each test runs `python -m wedgewatch.lab.real.vllm_engine` with the python of a venv holding a real
vLLM (tests/support/vllm_venvs.py: built in the cache by `bash tests/run.sh --real`), on
the `agentic-burst` plan of seed 16 under the tp2-offload configuration.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vllm_venvs import vllm_env, vllm_python


def run_real(version: str, *flags: str) -> list[dict[str, object]]:
    """Run the real-scheduler harness; its JSON lines (one per seed, then the total)."""
    env = vllm_env(VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run(
        [str(vllm_python(version)), "-m", "wedgewatch.lab.real.vllm_engine", *flags],
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
def test_vllm_0_30_0_with_its_cuda_defaults_wedges_seed_24_the_same_way() -> None:
    """With full-ISL admission on (vLLM's default) 0.30.0 wedges seed 24 (1 of seeds 1-30):
    a preempted request holding nothing ahead of a parked load, as with full-ISL off."""
    lines = run_real("0.30.0", "--seeds", "24", "--max-seconds", "20", "--duration", "12")
    result = lines[0]
    assert result["wedged"] is True
    state = result["end_state"]
    assert isinstance(state, dict)
    assert state["running"] == 0
    skipped = state["skipped_waiting"]
    assert [entry[1:] for entry in skipped[:1]] == [["PREEMPTED", 0]]
    assert skipped[1][1] == "WAITING_FOR_REMOTE_KVS"
    assert skipped[1][2] > 0


def all_queued(state: dict[str, object]) -> list[tuple[str, str, int]]:
    """Every (request id, status, computed tokens) in the version's own waiting queues."""
    queued: list[tuple[str, str, int]] = []
    for name in ("skipped_waiting", "kv_holding_waiting", "deferred_waiting"):
        entries = state.get(name, [])
        assert isinstance(entries, list)
        queued.extend((str(r), str(s), int(c)) for r, s, c in entries)
    return queued


@pytest.mark.slow
@pytest.mark.parametrize(
    "connector", [(), ("--simple-offload",)], ids=["offloading", "simple-cpu-offload"]
)
@pytest.mark.parametrize("fault", ["hung-load", "lost-store-event"])
def test_a_transfer_lost_on_one_rank_wedges_vllm_0_33_0(
    fault: str, connector: tuple[str, ...]
) -> None:
    """A load or store one TP rank never completes wedges 0.33.0 (which serves the plan
    without it): nothing runs, requests wait, the scheduler schedules nothing."""
    lines = run_real(
        "0.33.0",
        "--seeds",
        "16",
        "--fault",
        fault,
        "--fault-after-seconds",
        "3.5",
        "--max-seconds",
        "60",
        *connector,
    )
    result = lines[0]
    state = result["end_state"]
    assert isinstance(state, dict)
    assert result["wedged"] is True, state
    assert state["running"] == 0
    assert state["waiting"] > 0 or all_queued(state)
    assert 3.5 <= state["fault_fired_at_seconds"] < result["wedge_at_seconds"]
    statuses = {status for _rid, status, _computed in all_queued(state)}
    if fault == "hung-load":
        # The load's request is parked, holding its blocks, for ever.
        assert "WAITING_FOR_REMOTE_KVS" in statuses
    elif connector:
        # SimpleCPUOffloadConnector: the unconfirmed stores keep their GPU blocks pinned.
        assert state["kv_usage"] > 0.3
    else:
        # OffloadingConnector: requests whose chunks are still "being stored" are deferred.
        assert "WAITING_FOR_REMOTE_KVS" not in statuses
        assert statuses


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
@pytest.mark.parametrize(
    "flag",
    ["--sync", "--simple-offload"],
    ids=["sync-scheduling", "simple-cpu-offload-connector"],
)
def test_vllm_0_30_0_serves_the_plan_without_async_offloading_connector(flag: str) -> None:
    """0.30.0 finishes the plan it wedges on (seed 16, full-ISL off) with sync scheduling (a
    preempted request's stores are flushed first) or with SimpleCPUOffloadConnector (its
    lookup never answers "not yet", so nothing is deferred holding no blocks)."""
    lines = run_real(
        "0.30.0", "--seeds", "16", flag, "--no-full-isl", "--max-seconds", "40", "--duration", "12"
    )
    result = lines[0]
    assert result["wedged"] is False
    assert result["finished"] == result["requests"] == 61
