"""The canary end to end: `wedgewatch run` against simulators on 127.0.0.1 (slow).

The `frozen-step` fault reproduces vLLM #46811 (the engine blocks inside a step, every
published value freezes at idle, /health and /metrics stay 200): only the canary sees it.
Healthy servers (busy, idle, sleeping, a slow queue) must never be wedged by it.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import test_e2e_daemon as e2e
from test_e2e_daemon import DaemonProcess, Sim

pytestmark = pytest.mark.slow
daemons, sims = e2e.daemons, e2e.sims  # the fixtures that start and always stop the processes

CANARY_LINE = re.compile(r"user=wedgewatch-canary x-request-id=wedgewatch-canary-[0-9a-f]{16}")
INTERVAL, CANARY_INTERVAL, CANARY_TIMEOUT = 1.0, 3.0, 5.0
CANARY_FLAGS = [
    "--interval-seconds",
    str(INTERVAL),
    "--canary-interval-seconds",
    str(CANARY_INTERVAL),
    "--canary-timeout-seconds",
    str(CANARY_TIMEOUT),
    "--remedy",
    "probe",  # /probe fails for the wedge (observe mode, "none", would never fail it)
]


def canaries(sim: Sim) -> list[str]:
    """The canary requests in the simulator's request log."""
    return CANARY_LINE.findall(sim.log_path.read_text(errors="replace"))


def test_frozen_step_is_a_canary_stall_and_invisible_without_it(
    daemons: Callable[..., DaemonProcess], sims: Callable[..., Sim], tmp_path: Path
) -> None:
    """#46811: the canary wedges the frozen engine in time with its stack; without it, idle."""
    fault_after = 8.0
    frozen = sims("frozen", ["--fault", f"frozen-step@{fault_after:g}"])
    # The simulator's fault clock starts when it is ready, which `sims` waited for: the freeze
    # comes at most `fault_after` from now (a reference taken before the simulator started
    # would charge its start-up, seconds on a busy machine, to the detection).
    armed_at = time.time() + fault_after
    on = daemons(["--target", f"frozen={frozen.base_url}", *CANARY_FLAGS], name="on")
    off = daemons(
        [
            "--target",
            f"frozen={frozen.base_url}",
            "--interval-seconds",
            "1",
            "--remedy",
            "none",
            "--state-dir",
            str(tmp_path / "state-off"),
        ],
        name="off",
    )
    wedge = on.wait_for("wedge_detected", timeout_seconds=90, target="frozen")
    assert wedge["family"] == "canary_stall", wedge
    detected_at = time.time()
    bound = CANARY_INTERVAL + CANARY_TIMEOUT + INTERVAL + 1.0
    assert detected_at - armed_at <= bound + 1.0, f"{detected_at - armed_at:.1f} s > {bound}"

    captured = on.wait_for("evidence_captured", timeout_seconds=60, phase="wedged")
    bundle = Path(captured["bundle"])
    summary = json.loads((bundle / "summary.json").read_text())
    core_pids = summary["pids"]["engine_core"]
    stacks = "".join(
        p.read_text(errors="replace")
        for p in (bundle / "pyspy").iterdir()
        if any(str(pid) in p.name for pid in core_pids)
    )
    assert "_blocked_step" in stacks, stacks[:2000]
    assert "step" in stacks

    # The metrics still read idle and /health is 200: the daemon without canary sees nothing.
    assert httpx.get(frozen.base_url + "/health", timeout=5).status_code == 200
    time.sleep(CANARY_TIMEOUT)
    off_status = {t["name"]: t for t in off.get("/status").json()["targets"]}
    assert off_status["frozen"]["state"] == "idle", off_status
    assert off.events("wedge_detected") == []
    assert off.get("/probe").status_code == 200
    assert on.get("/probe").status_code != 200

    status = {t["name"]: t for t in on.get("/status").json()["targets"]}
    canary = status["frozen"]["canary"]
    assert canary["stall_since_timestamp"] is not None, canary
    assert canary["last"]["failure"] == "timeout", canary
    metrics = on.get("/metrics").text
    assert 'wedgewatch_canary_failures_total{reason="timeout",target="frozen"}' in metrics
    # Never two in flight: each token-less canary waited its whole timeout before the next.
    # Canaries before the freeze got their token and may follow each other at the interval:
    # count from the first token-less one, sent a timeout before the first canary_stall line.
    arrivals = [
        int(h) * 3600 + int(m) * 60 + int(sec)
        for h, m, sec in re.findall(
            r"(\d\d):(\d\d):(\d\d) \[api.py\] request \S+ user=wedgewatch-canary",
            frozen.log_path.read_text(errors="replace"),
        )
    ]
    first_stall = e2e._timestamp(on.events("canary_stall")[0]) - CANARY_TIMEOUT - 1
    since = time.gmtime(first_stall)
    token_less = [
        a for a in arrivals if a >= since.tm_hour * 3600 + since.tm_min * 60 + since.tm_sec
    ]
    assert len(token_less) >= 2, (arrivals, token_less)
    gaps = [b - a for a, b in itertools.pairwise(token_less)]
    assert min(gaps) >= CANARY_TIMEOUT - 1, gaps  # the log has whole seconds
    assert len(canaries(frozen)) == len(arrivals)
    assert on.stop() == 0
    assert off.stop() == 0


def test_healthy_servers_are_never_wedged_by_the_canary(
    daemons: Callable[..., DaemonProcess], sims: Callable[..., Sim]
) -> None:
    """Busy: no canary. Idle: one per interval, stays idle. Sleeping: none. Slow queue: no wedge."""
    duration = 40.0
    busy = sims("busy", ["--scheduler-fix", "skip-head-when-idle"])
    idle = sims("idle", [])
    sleeping = sims("sleeping", [])
    assert httpx.post(sleeping.base_url + "/sleep", timeout=10).status_code == 200
    # Whole 4 s prefill steps: counters stay flat for seconds, so a canary goes out, and it
    # queues behind long prompts past its timeout while tokens still flow.
    slow = sims(
        "slow",
        [
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "32768",
            "--max-num-seqs",
            "1",
            "--step-time-seconds",
            "4",
        ],
    )
    loads = [busy.load("agentic", duration), slow.load("long-prefill", duration)]
    try:
        time.sleep(2)  # the load is flowing before the daemon's first look
        daemon = daemons(
            [
                *(f"--target={s.name}={s.base_url}" for s in (busy, idle, sleeping, slow)),
                *CANARY_FLAGS,
                "--hang-after-seconds",
                "60",
            ]
        )
        started = time.monotonic()
        time.sleep(duration - 4)
        elapsed = time.monotonic() - started
        status = {t["name"]: t for t in daemon.get("/status").json()["targets"]}
        assert canaries(busy) == [], "a busy server proves itself: no canary"
        assert status["busy"]["canary"]["sent"] == 0
        assert canaries(sleeping) == []
        assert status["sleeping"]["state"] == "sleeping"
        sent_idle = len(canaries(idle))
        # One per interval, on the scrape grid: every 3 s, or 4 s when a scrape comes early.
        most, least = elapsed / CANARY_INTERVAL, elapsed / (CANARY_INTERVAL + INTERVAL)
        assert least - 1 <= sent_idle <= most + 1, (sent_idle, least, most)
        assert status["idle"]["state"] == "idle"
        assert status["idle"]["canary"]["last"]["verdict"] == "ok", status["idle"]["canary"]
        # The slow queue really made canaries late while tokens flowed (so this case can fail).
        late = daemon.events("canary_failed", target="slow", verdict="latency")
        assert late, canaries(slow)
        assert status["slow"]["state"] != "wedged"
        assert daemon.events("wedge_detected") == []
        assert daemon.events("restart_requested") == []
        assert daemon.stop() == 0
    finally:
        for load in loads:
            load.kill()
