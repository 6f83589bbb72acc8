"""`wedgewatch sim serve --scheduler vllm`: vLLM's own scheduler in the EngineCore, end to end.

Real processes on 127.0.0.1 and real HTTP: the simulator runs from a venv holding a real vLLM
(tests/support/vllm_venvs.py: built in the cache by `bash tests/run.sh --real`; this checkout runs
there through PYTHONPATH), `wedgewatch sim load` and `wedgewatch run` from this
venv. The tp2-offload flags (TP 2, 6 sequences, 4096 batched tokens, 60 GiB native offload).

* vLLM 0.30.0, async scheduling (its CUDA default) with full-ISL admission off: the
  `agentic-burst` plan of seed 16 wedges the real scheduler (30 of 30 seeds do: README.md,
  "Which releases wedge"; with full-ISL on only seed 24 of 30 does, until
  the tuned profile lands), the daemon detects it and bundles the engine's and the workers'
  stacks, and the bundle's sampled profile of the engine (`py-spy record --nonblocking` at
  the wedge) shows vLLM's own `Scheduler.schedule` under the busy loop.
* vLLM 0.33.0 with OffloadingConnector: the same traffic completes, and `/metrics` is vLLM
  0.33.0's own exposition (every family of the recorded fixture, same type and help).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from simproc import LAUNCHER_FLAGS, WEDGEWATCH, SimProcess, value
from vllm_venvs import vllm_env, vllm_python
from wedgewatch_daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
SEED = "16"
LOAD = ["--profile", "agentic-burst", "--seed", SEED, "--duration", "12"]
VLLM_FLAGS = [*LAUNCHER_FLAGS, "--scheduler", "vllm", "--no-scheduler-reserve-full-isl"]
# A frame as py-spy prints it: `Class.function (path:line)`, the path relative (text dump) or
# absolute (rendered from a JSON dump).
SCHEDULE_FRAME = re.compile(r"\.schedule \(\S*vllm/v1/core/sched/scheduler\.py:")
BUSY_LOOP_FRAMES = tuple(
    re.compile(pattern)
    for pattern in (
        r"RealScheduler\.step \(\S*wedgewatch/lab/real/vllm_core\.py:",
        r"EngineCoreProc\.step \(\S*wedgewatch/lab/sim/engine\.py:",
        r"EngineCoreProc\._process_engine_step \(\S*wedgewatch/lab/sim/engine\.py:",
        r"EngineCoreProc\.run_busy_loop \(\S*wedgewatch/lab/sim/engine\.py:",
    )
)
START_SECONDS = 180.0  # importing vLLM and torch on a loaded 2-core machine

# Importing torch and vLLM, then a load of ~60 s: 80-100 s a test at load average ~8.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@contextlib.contextmanager
def vllm_sim(tmp_path: Path, version: str) -> Iterator[SimProcess]:
    """`wedgewatch sim serve --scheduler vllm` under vLLM `version`, ready."""
    python = vllm_python(version)
    env = vllm_env(VLLM_LOGGING_LEVEL="WARNING")
    env.pop("VLLM_USE_SIMPLE_KV_OFFLOAD", None)  # OffloadingConnector, whose workers are emulated
    argv = [str(python), "-m", "wedgewatch", "sim", "serve", "tiny"]
    sim = SimProcess(tmp_path / f"sim-{version}.log", VLLM_FLAGS, argv=argv, env=env)
    try:
        yield sim.wait_ready(START_SECONDS)
    finally:
        sim.stop()


def run_load(url: str, out: Path) -> subprocess.Popen[bytes]:
    """`wedgewatch sim load` of the plan, as a child in its own session."""
    with out.open("wb") as sink:
        return subprocess.Popen(
            [*WEDGEWATCH, "sim", "load", "--url", url, *LOAD, "--request-timeout-seconds", "300"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a child's whole session."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def schedule_under_busy_loop(dump: str) -> bool:
    """Whether one thread's stack in `dump` runs vLLM's `schedule` under the sim's busy loop."""
    for thread in dump.split("\nThread "):
        lines = thread.splitlines()
        at = next((i for i, line in enumerate(lines) if SCHEDULE_FRAME.search(line)), None)
        if at is None:
            continue
        below = "\n".join(lines[at:])
        if all(frame.search(below) for frame in BUSY_LOOP_FRAMES):
            return True
    return False


def schedule_stacks(folded: str) -> list[str]:
    """The folded stacks (outermost first) that run vLLM's `schedule` under the busy loop."""
    return [
        line
        for line in folded.splitlines()
        if SCHEDULE_FRAME.search(line) and all(f.search(line) for f in BUSY_LOOP_FRAMES)
    ]


def stacks_text(directory: Path) -> str:
    """Every text stack dump of a bundle (both rounds)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(directory.rglob("*.txt")))


def test_vllm_0_30_0_wedges_over_http_and_the_daemon_catches_it(tmp_path: Path) -> None:
    """The real 0.30.0 wedge over HTTP; `wedgewatch run` bundles stacks with vLLM's schedule."""
    with vllm_sim(tmp_path, "0.30.0") as sim:
        assert sim.get("/version").json() == {"version": "0.30.0"}
        (engine,) = sim.titled("VLLM::EngineCore")
        workers = sorted(" ".join(w.cmdline()).strip() for w in engine.children())
        assert workers == ["VLLM::Worker_TP0", "VLLM::Worker_TP1"]
        daemon: DaemonProcess | None = None
        load: subprocess.Popen[bytes] | None = None
        try:
            daemon = DaemonProcess(
                [
                    "--target", f"sim={sim.url}",
                    "--interval-seconds", "1",
                    "--stall-after-seconds", "5",
                    "--hang-after-seconds", "30",
                    "--remedy", "none",
                ],
                tmp_path,
            )  # fmt: skip
            load = run_load(sim.url, tmp_path / "load-0.30.0.txt")
            wedge = daemon.wait_for("wedge_detected", timeout_seconds=150)
            assert wedge["family"] == "deferred_stall", wedge
            samples = sim.samples()
            assert value(samples, "vllm:num_requests_running") == 0
            assert value(samples, "vllm:num_requests_waiting_by_reason", reason="capacity") >= 1
            assert value(samples, "vllm:num_requests_waiting_by_reason", reason="deferred") >= 1
            assert value(samples, "vllm:kv_cache_usage_perc") < 0.9  # free blocks, nothing runs

            captured = daemon.wait_for("evidence_captured", timeout_seconds=90, phase="wedged")
            bundle = Path(captured["bundle"])
            summary = json.loads((bundle / "summary.json").read_text())
            assert summary["pids"]["engine_core"] == [engine.pid]
            assert len(summary["pids"]["worker"]) == 2
            dumps = stacks_text(bundle / "pyspy")
            assert all(frame.search(dumps) for frame in BUSY_LOOP_FRAMES[2:]), dumps
            # The wedged loop sleeps 1 ms per empty step, as vLLM's does, so a single dump
            # catches `schedule` itself about one time in four (10 of 40 measured) and the
            # bundle's two rounds may miss it. The wedge round's sampled profile of the engine
            # (idle samples dropped) shows it.
            wedge_round = summary["phases"]["wedged"]
            (profile,) = wedge_round["profiles"]
            assert (profile["pid"], profile["status"]) == (engine.pid, "ok"), profile
            folded = (bundle / profile["file"]).read_text()
            assert schedule_stacks(folded), folded
            assert profile["function_share"]["schedule"] > 0, profile
            assert any(d.startswith("profile: engine_core") for d in summary["triage"]["details"])
            sys.stderr.write(
                f"schedule frame in the bundle's own dumps: {schedule_under_busy_loop(dumps)}; "
                f"profile: {profile['samples']} busy samples, schedule in "
                f"{profile['function_share']['schedule']:.0%}, took "
                f"{wedge_round['durations']['profile_seconds']:.2f} s of a "
                f"{wedge_round['duration_seconds']:.2f} s wedge round; triage: "
                f"{summary['triage']['summary']}\n"
            )
            assert daemon.stop() == 0
        finally:
            if load is not None:
                kill_group(load)
            if daemon is not None:  # it leads its own session
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(daemon.proc.pid, signal.SIGKILL)
                daemon.proc.wait(timeout=30)


def test_vllm_0_33_0_completes_the_same_traffic_with_its_own_metrics(tmp_path: Path) -> None:
    """0.33.0's scheduler (kv_holding_waiting first) serves every request of the same plan."""
    with vllm_sim(tmp_path, "0.33.0") as sim:
        assert sim.get("/version").json() == {"version": "0.33.0"}
        out = tmp_path / "load-0.33.0.txt"
        load = run_load(sim.url, out)
        try:
            assert load.wait(timeout=300) == 0, out.read_text()
        finally:
            kill_group(load)
        summary = out.read_text()
        assert " failed 0 " in summary
        assert "timed out 0" in summary
        time.sleep(0.5)  # the last batch of engine outputs
        text = httpx.get(sim.url + "/metrics", timeout=10).text
        ours = {f.name: f for f in text_string_to_metric_families(text)}
        for family in text_string_to_metric_families(FIXTURE.read_text()):
            assert family.name in ours, family.name
            mine = ours[family.name]
            assert (mine.type, mine.documentation) == (family.type, family.documentation)
        samples = sim.samples()
        sent = int(summary.split("sent ")[1].split()[0])
        assert value(samples, "vllm:request_success_total", finished_reason="length") == sent
        assert value(samples, "vllm:num_requests_running") == 0
        assert value(samples, "vllm:num_requests_waiting") == 0
        assert "vllm:kv_offload_store_bytes" in ours  # OffloadingConnector's own families
