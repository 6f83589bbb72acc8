"""What wedgewatch's evidence captures cost a healthy, busy engine: its step rate with and without.

    .venv/bin/python bench/bench_capture_cost.py [--window-seconds 20] [--pairs 3] [--json out.json]

A TP=2 simulator (the launcher's tp2-offload profile: API server, EngineCore, two workers)
decodes four long requests without a pause, so every engine step emits tokens and
`vllm:iteration_tokens_total_count` counts engine steps. The step rate is measured over
windows of `--window-seconds`, interleaved so drifting machine load hits every condition alike:

* `idle`: no capture (the baseline);
* `suspect back-to-back`: suspect-round captures (`evidence.capture_bundle`, phase suspect:
  py-spy `--json --nonblocking`, one dump per process, process sample, nvidia-smi attempt)
  one after another for the whole window: the worst case, far beyond what the daemon does;
* `blocking back-to-back`: the same with blocking rounds (phase wedged, one-shot: py-spy
  `--native` JSON and text dumps, each pausing its target), which the suspect round used to be;
* `profile back-to-back`: the wedge round's sampled profile of the EngineCore alone
  (`io.profile`: `py-spy record --nonblocking`, 2 s at 50 Hz), one after another.
  (The `suspect` and `blocking` rounds here run with `profile_seconds = 0`, so they keep
  measuring the dumps alone.)

Each capture runs in this process, as the daemon runs them, on the same machine as the
simulator. From the back-to-back windows the bench derives the steps one round costs, and from
that the loss at the rate limit's cadence (one suspect round per target per
`suspect_capture_min_interval_seconds`, default 600 s), which is what a healthy engine that
keeps looking suspect can lose at most. Goal (docs/benchmarks.md): < 1 % of its steps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from wedgewatch.config.model import Config
from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.io.evidence import (
    CaptureRequest,
    EvidenceDeps,
    EvidenceSettings,
    capture_bundle,
)
from wedgewatch.io.procs import ProcessSelector
from wedgewatch.io.profile import PySpyProfiler
from wedgewatch.vllm.profiles import builtin_profiles
from wedgewatch.vllm.signals import Exposition, parse

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
TP2_OFFLOAD = list(builtin_profiles()["tp2-offload"].args)
STEP_TIME_SECONDS = 0.01
DECODERS = 4
CADENCE_SECONDS = Config.model_fields["suspect_capture_min_interval_seconds"].default
MODES = ("suspect", "blocking", "profile")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def steps_of(url: str) -> float:
    """Engine steps that emitted tokens so far (the iteration histogram's count)."""
    body = httpx.get(url + "/metrics", timeout=10).text
    for line in body.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count{"):
            return float(line.rsplit(" ", 1)[1])
    raise RuntimeError("no vllm:iteration_tokens_total_count sample")


def running_of(url: str) -> float:
    parsed = parse(httpx.get(url + "/metrics", timeout=10).content)
    assert isinstance(parsed, Exposition), parsed
    return sum(r.running for r in parsed.engines.values())


def keep_decoding(url: str, stop: threading.Event) -> None:
    """One client that always has a long decode running (re-sent as soon as it ends)."""
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                url + "/v1/completions",
                json={"prompt_tokens": 16, "max_tokens": 32_000},
                timeout=900,
            )


def engine_pid(sim_pid: int) -> int:
    """The simulator's VLLM::EngineCore process."""
    for child in psutil.Process(sim_pid).children(recursive=True):
        if "VLLM::EngineCore" in " ".join(child.cmdline()):
            return child.pid
    raise RuntimeError("no VLLM::EngineCore under the simulator")


async def measure(
    url: str, mode: str, window: float, deps: EvidenceDeps, engine: int
) -> dict[str, float]:
    """Steps per second over one window while `mode` runs; rounds taken and their mean time."""
    selector = ProcessSelector(url=url + "/metrics")
    rounds = 0
    incomplete = 0
    durations: list[float] = []
    before = await asyncio.to_thread(steps_of, url)
    started = time.monotonic()
    while time.monotonic() - started < window:
        if mode == "idle":
            await asyncio.sleep(window - (time.monotonic() - started))
            break
        t0 = time.monotonic()
        if mode == "profile":
            sampled = await PySpyProfiler(seconds=2, rate_hz=50).profile(engine)
            durations.append(time.monotonic() - t0)
            incomplete += sampled.profile is None
            rounds += 1
            continue
        phase = CapturePhase.SUSPECT if mode == "suspect" else CapturePhase.WEDGED
        result = await capture_bundle(
            CaptureRequest(target="bench", selector=selector, phase=phase, family="bench"), deps
        )
        durations.append(time.monotonic() - t0)
        if result.bundle is None:
            raise RuntimeError(f"capture failed: {result.failures}")
        if any(f.startswith("py-spy") for f in result.failures):
            incomplete += 1  # a process's stacks missing from the round (recorded, counted)
        rounds += 1
    elapsed = time.monotonic() - started
    after = await asyncio.to_thread(steps_of, url)
    return {
        "steps_per_second": (after - before) / elapsed,
        "rounds": rounds,
        "rounds_missing_stacks": incomplete,
        "round_seconds": statistics.mean(durations) if durations else 0.0,
        "elapsed": elapsed,
    }


async def measure_all(
    url: str, args: argparse.Namespace, deps: EvidenceDeps, engine: int
) -> dict[str, list[dict[str, float]]]:
    """Interleaved windows: idle, suspect, idle, blocking, idle, profile; `--pairs` times."""
    windows: dict[str, list[dict[str, float]]] = {m: [] for m in (*MODES, "idle")}
    for _ in range(args.pairs):
        for mode in ("idle", "suspect", "idle", "blocking", "idle", "profile"):
            windows[mode].append(await measure(url, mode, args.window_seconds, deps, engine))
            print(mode, {k: round(v, 3) for k, v in windows[mode][-1].items()}, flush=True)
    return windows


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = work / "sim.log"
    with log.open("wb") as out:
        sim = subprocess.Popen(
            [
                *WEDGEWATCH, "sim", "serve", "Qwen/Qwen3-0.6B", "--host", "127.0.0.1",
                "--port", str(port), "--disable-uvicorn-access-log",
                "--step-time-seconds", str(STEP_TIME_SECONDS), *TP2_OFFLOAD,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.2)
        for _ in range(DECODERS):
            threading.Thread(target=keep_decoding, args=(url, stop), daemon=True).start()
        while running_of(url) < DECODERS:
            time.sleep(0.2)
        time.sleep(2.0)  # past the prefills: decode only
        deps = EvidenceDeps(
            EvidenceSettings(
                evidence_dir=work / "evidence",
                evidence_keep=10_000,
                evidence_max_bytes=10 * 1024**3,
                nvidia_smi_path="nvidia-smi-not-here",
                profile_seconds=0,  # the profile is its own mode
            )
        )
        windows = asyncio.run(measure_all(url, args, deps, engine_pid(sim.pid)))
    finally:
        stop.set()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(sim.pid, signal.SIGKILL)
        sim.wait(timeout=30)

    base = statistics.median(w["steps_per_second"] for w in windows["idle"])
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "window_seconds": args.window_seconds,
        "pairs": args.pairs,
        "step_time_seconds": STEP_TIME_SECONDS,
        "baseline_steps_per_second": round(base, 2),
        "cadence_seconds": CADENCE_SECONDS,
    }
    for mode in MODES:
        rate = statistics.median(w["steps_per_second"] for w in windows[mode])
        rounds_per_second = sum(w["rounds"] for w in windows[mode]) / sum(
            w["elapsed"] for w in windows[mode]
        )
        lost_per_round = max(base - rate, 0.0) / rounds_per_second if rounds_per_second else 0.0
        out[mode] = {
            "back_to_back_steps_per_second": round(rate, 2),
            "back_to_back_loss_percent": round(100 * (base - rate) / base, 2),
            "round_seconds": round(statistics.mean(w["round_seconds"] for w in windows[mode]), 3),
            "steps_lost_per_round": round(lost_per_round, 2),
            "rounds": sum(int(w["rounds"]) for w in windows[mode]),
            "rounds_missing_stacks": sum(int(w["rounds_missing_stacks"]) for w in windows[mode]),
            "loss_at_cadence_percent": round(100 * lost_per_round / (base * CADENCE_SECONDS), 4),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--window-seconds", type=float, default=20.0)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wedgewatch-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
