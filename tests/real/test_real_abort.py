"""The abort cure on a real vLLM 0.30.0: the seed's wedge cured without a restart.

A real CPU vLLM 0.30.0 with `VLLM_SERVER_DEV_MODE=1` is driven into the seed's wedge (#57841)
by wedgewatch/lab/real/real_wedge.py. `wedgewatch run --abort-first --remedy signal` watches it:
it calls the wedge a deferred_stall, takes the bundle, sends `POST /abort_requests {}` and proves
recovery with a canary. The parked load had landed, so vLLM 0.30.0's `finish_requests` frees its
blocks at once: the stuck requests end with `finish_reason` abort, the API server and EngineCore
keep their pids, and the server serves again (docs/real-vllm.md, "The abort cure").
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import real_vllm
from wedgewatch_daemon import DaemonProcess, watching

from wedgewatch.lab.real import real_wedge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DEADLINE_S = 300.0  # generous: the machine may be busy; never a timed assertion
WATCH = [
    "--interval-seconds", "1",
    "--stall-after-seconds", "20",
    "--hang-after-seconds", "20",
    "--unreachable-after-seconds", "20",
    "--remedy", "signal",
    "--abort-first",
]  # fmt: skip
"""20 s: longer than any legitimate pause of the sequence (an emulated load takes 8 s)."""


def recoveries(daemon: DaemonProcess) -> list[dict[str, Any]]:
    (target,) = daemon.get("/status").json()["targets"]
    return list(target.get("recoveries") or [])


def test_abort_cures_the_seed_wedge_with_the_same_processes(tmp_path: Path) -> None:
    """run --abort-first: the bundle, then the abort (a bodiless POST would be a 400 that aborts
    nothing), the stuck requests end "abort", same API server and EngineCore, serving again."""
    log = tmp_path / "connector.jsonl"
    with real_vllm.running(
        "0.30.0",
        tmp_path / "v",
        extra_args=real_wedge.serve_args(log),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    ) as server:
        (engine_core,) = server.named("VLLM::EngineCore")
        pids = (server.proc.pid, engine_core.pid)
        with watching(server.url, tmp_path, *WATCH) as daemon:
            run = real_wedge.drive(server.url, log, timeout_s=DEADLINE_S)
            # vLLM reads the body first: without one it answers 400 and aborts nothing.
            bodiless = httpx.post(f"{server.url}/abort_requests", timeout=30)
            assert bodiless.status_code == 400, bodiless.text
            wedge = daemon.wait_for("wedge_detected", timeout_seconds=DEADLINE_S, target="real")
            assert wedge["family"] == "deferred_stall", wedge
            assert run.completed() == []
            end = time.monotonic() + DEADLINE_S
            while not recoveries(daemon) and time.monotonic() < end:
                time.sleep(1)
            (recovery,) = recoveries(daemon)
            assert (recovery["cure"], recovery["outcome"]) == ("abort", "recovered"), recovery
            assert recovery["aborted"] == 3, recovery
            captured = daemon.events("evidence_captured", target="real", phase="wedged")
            assert captured, "no bundle before the cure"
            assert run.wait(60), "the stuck requests did not return"
            reasons = [f.result["response"]["choices"][0]["finish_reason"] for f in run.flights]
            assert reasons == ["abort", "abort", "abort"], [f.result for f in run.flights]
        (engine_after,) = server.named("VLLM::EngineCore")
        assert (server.proc.pid, engine_after.pid) == pids
        # Serving again, the wedge's blocks back: a prompt of 13 of the 15 blocks completes.
        answer = server.complete(real_wedge.PROMPT_A, max_tokens=4, ignore_eos=True)
        assert answer["choices"][0]["finish_reason"] == "length"
