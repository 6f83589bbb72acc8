"""The seed's wedge (#57841) in a real `vllm serve`: caught on 0.30.0, absent on 0.32.0.

A real CPU vLLM serves the tiny model with an out-of-tree KV connector (a CPU tier emulated in
memory, wedgewatch/lab/real/real_connector.py) and a 15-block KV pool;
wedgewatch/lab/real/real_wedge.py
sends the #57841 sequence through the OpenAI API. On 0.30.0 the engine ends with nothing
running, requests deferred and waiting for capacity, /health 200 and the EngineCore spinning
in vLLM's own engine loop: `wedgewatch run` and `wedgewatch check` call it a deferred_stall,
the bundle shows the EngineCore in vLLM's step loop, and a 250 Hz profile catches it in
`Scheduler.schedule`. On 0.32.0 the same sequence completes and
wedgewatch gives no verdict (docs/real-vllm.md, "The seed's wedge").
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import real_vllm
from prometheus_client.parser import text_string_to_metric_families
from wedgewatch_daemon import WEDGEWATCH, DaemonProcess, clean_env, watching

from wedgewatch.lab.real import real_wedge

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a cold start under load is minutes

DEADLINE_S = 300.0  # generous: the machine may be busy; never a timed assertion
WATCH = [
    "--interval-seconds", "1",
    "--stall-after-seconds", "20",
    "--hang-after-seconds", "20",
    "--unreachable-after-seconds", "20",
    "--remedy", "none",
]  # fmt: skip
"""20 s: longer than any legitimate pause of the sequence (an emulated load takes 8 s)."""


def queues(url: str) -> dict[str, float]:
    """running, capacity and deferred of the server's /metrics now."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = {"running": 0.0, "capacity": 0.0, "deferred": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:num_requests_running":
                out["running"] += s.value
            elif s.name == "vllm:num_requests_waiting_by_reason":
                out[s.labels["reason"]] = out.get(s.labels["reason"], 0.0) + s.value
    return out


def wait_until(what: str, condition: Callable[[], bool]) -> None:
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {DEADLINE_S:.0f} s: {what}")


def daemon_state(daemon: DaemonProcess) -> str:
    (target,) = daemon.get("/status").json()["targets"]
    return str(target["state"])


def check(url: str) -> tuple[int, dict[str, Any]]:
    """`wedgewatch check URL --json --for 8` as a user runs it: (exit code, its JSON)."""
    done = subprocess.run(
        [*WEDGEWATCH, "check", url, "--json", "--for", "8"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=clean_env(),
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"check said: {done.stdout!r} {done.stderr[-2000:]!r}") from None


def scheduler_seen(pid: int, workdir: Path, attempts: int = 3) -> bool:
    """Whether a sampled profile of `pid` (py-spy record, 250 Hz for 8 s) holds
    Scheduler.schedule; up to `attempts` profiles. Measured on a wedged 0.30.0: about 1 % of
    the main thread's samples (23 of 1998), the step loop's 1 ms sleep most of the rest."""
    pyspy = Path(sys.executable).with_name("py-spy")
    for attempt in range(attempts):
        out = workdir / f"engine-core-{attempt}.txt"
        subprocess.run(
            [str(pyspy), "record", "--nonblocking", "--idle", "-r", "250", "-d", "8",
             "-f", "raw", "-o", str(out), "--pid", str(pid)],
            capture_output=True,
            timeout=120,
            check=False,
        )  # fmt: skip
        if (
            out.is_file()
            and "Scheduler.schedule (vllm/v1/core/sched/scheduler.py" in out.read_text()
        ):
            return True
    return False


def serve(version: str, tmp_path: Path) -> contextlib.AbstractContextManager[real_vllm.RealServer]:
    log = tmp_path / "connector.jsonl"
    return real_vllm.running(version, tmp_path / "v", extra_args=real_wedge.serve_args(log))


def test_seed_wedge_on_0_30_0(tmp_path: Path) -> None:
    """Caught by run and check as a deferred_stall; the bundle shows vLLM's scheduler frames."""
    with serve("0.30.0", tmp_path) as server, watching(server.url, tmp_path, *WATCH) as daemon:
        run = real_wedge.drive(server.url, tmp_path / "connector.jsonl", timeout_s=DEADLINE_S)
        wait_until(
            "running 0, H and L deferred, W waiting for capacity",
            lambda: queues(server.url) == {"running": 0.0, "capacity": 1.0, "deferred": 2.0},
        )
        wedge = daemon.wait_for("wedge_detected", timeout_seconds=DEADLINE_S, target="real")
        assert wedge["family"] == "deferred_stall", wedge
        captured = daemon.wait_for(
            "evidence_captured", timeout_seconds=DEADLINE_S, target="real", phase="wedged"
        )
        bundle = Path(captured["bundle"])
        (engine_core,) = server.named("VLLM::EngineCore")
        (engine_dump,) = (bundle / "pyspy" / "wedged").glob(f"engine_core-{engine_core.pid}.txt")
        profiles = "\n".join(
            p.read_text(errors="replace") for p in bundle.glob("profile-enginecore-*.folded")
        )
        # The EngineCore keeps stepping vLLM's own engine loop: each step schedules nothing and
        # then sleeps 1 ms (vLLM's yield when a step executed nothing but requests remain).
        loop = "EngineCoreProc._process_engine_step (vllm/v1/engine/core.py"
        assert loop in engine_dump.read_text() + profiles, (engine_dump.read_text(), profiles)
        # Each step runs Scheduler.schedule, briefly: a denser profile than the bundle's catches it.
        assert scheduler_seen(engine_core.pid, tmp_path), "no profile showed Scheduler.schedule"
        summary = json.loads((bundle / "summary.json").read_text())
        assert summary["verdict"] == "wedged", summary
        # Still wedged, still healthy: no request came back; /health says 200.
        assert run.completed() == [], run.completed()
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        assert queues(server.url) == {"running": 0.0, "capacity": 1.0, "deferred": 2.0}
        code, said = check(server.url)
        assert code == 2, said
        assert said["status"] == "wedged", said
        assert [e.get("family") for e in said["engines"]] == ["deferred_stall"], said


def test_seed_sequence_on_0_32_0(tmp_path: Path) -> None:
    """The same sequence completes on 0.32.0 and wedgewatch gives no verdict."""
    with serve("0.32.0", tmp_path) as server, watching(server.url, tmp_path, *WATCH) as daemon:
        run = real_wedge.drive(server.url, tmp_path / "connector.jsonl", timeout_s=DEADLINE_S)
        assert run.wait(DEADLINE_S), [f.result for f in run.flights]
        assert sorted(run.completed()) == ["H", "L", "W"], [f.result for f in run.flights]
        events = [e["event"] for e in real_wedge.read_events(tmp_path / "connector.jsonl")]
        assert "deferred" in events, events  # the sequence did take the path
        assert "load" in events, events
        # The daemon has judged the finished sequence: idle (or ok), and no wedge on the way.
        wait_until(
            "the daemon's /status says idle or ok", lambda: daemon_state(daemon) in {"idle", "ok"}
        )
        assert daemon.events("wedge_detected") == [], daemon.events("wedge_detected")
        code, said = check(server.url)
        assert code == 0, said
        assert said["status"] in {"ok", "idle"}, said
