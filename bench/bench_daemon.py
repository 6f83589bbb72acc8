"""Benchmark `wedgewatch run` against the simulator: detection latency, bundle time, CPU, RSS.

    .venv/bin/python bench/bench_daemon.py [--runs 5] [--idle-seconds 60] [--json out.json]

1. Detection latency of the real scheduler wedge (TP=2 offload profile, `agentic-burst`
   load) over `--runs` fresh simulators: from the wedge's onset (the last change of any
   progress counter, seen by an independent 5 Hz poller) to the daemon's
   `wedge_detected` line, against `stall_after_seconds` (+ one interval).
2. The same for `collective-hang` (a progress stall, `hang_after_seconds`).
3. Time from `wedge_detected` to the completed wedge bundle (`evidence_captured`,
   phase `wedged`), with py-spy of the API server, the EngineCore and both workers.
4. CPU (average share of one core) and RSS (peak) of the daemon watching one healthy
   simulator at a 1 s interval for `--idle-seconds`, measured from /proc via psutil.

Goals (docs/benchmarks.md): < 1% of one core, < 80 MB RSS, bundle within 5 s of the verdict.
Everything runs on 127.0.0.1; each trial starts from fresh processes and directories.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

from wedgewatch.vllm.profiles import builtin_profiles
from wedgewatch.vllm.semantics import progress_counters
from wedgewatch.vllm.signals import Exposition, parse

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
# The launcher's production profile, exactly as `wedgewatch launch --profile tp2-offload` runs it.
TP2_OFFLOAD = list(builtin_profiles()["tp2-offload"].args)
# vLLM 0.30.0's scheduler (the simulator's model) wedges on agentic-burst with full-ISL admission
# off (30 of 30 seeds, for the real scheduler too); with vLLM's default (on) on 1 of 30
# (docs/simulator.md, "Fidelity").
TP2_WEDGE = [*TP2_OFFLOAD, "--no-scheduler-reserve-full-isl"]
# agentic-burst under this load seed wedges the stock scheduler ~7 s into the load in the pure
# model (tests/lab/sim/test_burst.py); over HTTP, arrival timing can occasionally let a burst
# through.
WEDGING_SEED = "16"
STALL_AFTER_SECONDS = 5.0
HANG_AFTER_SECONDS = 5.0
INTERVAL_SECONDS = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def timestamp_of(line: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


class Group:
    """A child started in its own process group, killed with its whole group."""

    def __init__(self, argv: list[str], log: Path) -> None:
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.log = log

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def start_sim(work: Path, name: str, flags: list[str]) -> tuple[Group, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [*WEDGEWATCH, "sim", "serve", "Qwen/Qwen3-0.6B", "--host", "127.0.0.1"]
    sim = Group([*argv, "--port", str(port), *flags], work / f"sim-{name}.log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return sim, url
        time.sleep(0.1)
    sim.kill()
    raise RuntimeError(f"simulator {name} did not come up; see {sim.log}")


def start_load(work: Path, url: str, profile: str, seconds: float, seed: str = "7") -> Group:
    argv = [*WEDGEWATCH, "sim", "load", "--url", url, "--profile", profile, "--seed", seed]
    argv += ["--duration", str(seconds), "--request-timeout-seconds", "300"]
    return Group(argv, work / f"load-{profile}.log")


class Daemon:
    """`wedgewatch run` with JSON logs in a file."""

    def __init__(self, work: Path, url: str, extra: list[str]) -> None:
        self.group = Group(
            [
                *WEDGEWATCH,
                "run",
                "--target",
                f"sim={url}",
                "--listen-port",
                "0",
                "--state-dir",
                str(work / "state"),
                "--evidence-dir",
                str(work / "evidence"),
                "--interval-seconds",
                str(INTERVAL_SECONDS),
                *extra,
            ],
            work / "daemon.log",
        )

    def wait_for(self, event: str, timeout: float, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for raw in self.group.log.read_text(errors="replace").splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    line = json.loads(raw)
                    if line.get("event") == event and all(
                        line.get(k) == v for k, v in match.items()
                    ):
                        return dict(line)
            if self.group.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"no {event} within {timeout} s; see {self.group.log}")

    def stop(self) -> None:
        if self.group.proc.poll() is None:
            self.group.proc.send_signal(signal.SIGTERM)
            try:
                self.group.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.group.kill()


class ProgressWatch:
    """Polls /metrics at 5 Hz; remembers when engine 0's progress counters last changed."""

    def __init__(self, url: str) -> None:
        self.url = url + "/metrics"
        self.last_change: float | None = None
        self._last: tuple[float, ...] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                parsed = parse(httpx.get(self.url, timeout=2).content)
            except httpx.HTTPError:
                continue
            if isinstance(parsed, Exposition) and parsed.engines:
                progress = progress_counters(parsed.engines[min(parsed.engines)])
                if progress != self._last:
                    self._last, self.last_change = progress, time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def workdir(name: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix=f"wedgewatch-bench-{name}-") as path:
        yield Path(path)


def wedge_trial(kind: str) -> dict[str, Any]:
    """One fresh simulator, daemon and load; latency of detection and of the bundle."""
    with workdir(kind) as work:
        if kind == "scheduler_wedge":
            sim, url = start_sim(work, kind, TP2_WEDGE)
            profile, family, seed, seconds = "agentic-burst", "deferred_stall", WEDGING_SEED, 12
        else:
            sim, url = start_sim(work, kind, [*TP2_OFFLOAD, "--fault", "collective-hang@15"])
            profile, family, seed, seconds = "steady", "progress_stall", "7", 150
        watch = ProgressWatch(url)
        daemon = Daemon(
            work,
            url,
            [
                "--stall-after-seconds",
                str(STALL_AFTER_SECONDS),
                "--hang-after-seconds",
                str(HANG_AFTER_SECONDS),
            ],
        )
        load = start_load(work, url, profile, seconds, seed)
        try:
            wedge = daemon.wait_for("wedge_detected", 180)
            onset = watch.last_change
            if wedge.get("family") != family or onset is None:
                raise RuntimeError(f"unexpected detection: {wedge}")
            captured = daemon.wait_for("evidence_captured", 90, phase="wedged")
            summary = json.loads((Path(captured["bundle"]) / "summary.json").read_text())
            return {
                "detection_seconds": timestamp_of(wedge) - onset,
                "bundle_after_verdict_seconds": timestamp_of(captured) - timestamp_of(wedge),
                "bundle_since_verdict_seconds": float(summary.get("since_verdict_seconds", 0.0)),
                "triage": summary["triage"]["kind"],
            }
        finally:
            load.kill()
            daemon.stop()
            watch.close()
            sim.kill()


def footprint(idle_seconds: float) -> dict[str, float]:
    """CPU and RSS of the daemon watching one healthy simulator at a 1 s interval."""
    with workdir("footprint") as work:
        sim, url = start_sim(work, "healthy", ["--scheduler-fix", "skip-head-when-idle"])
        daemon = Daemon(work, url, [])
        load = start_load(work, url, "agentic", idle_seconds + 30)
        try:
            daemon.wait_for("engine_discovered", 60)
            time.sleep(5)  # past start-up: imports, first scrapes
            proc = psutil.Process(daemon.group.proc.pid)
            cpu_before = proc.cpu_times()
            wall_before = time.monotonic()
            rss: list[int] = []
            while time.monotonic() - wall_before < idle_seconds:
                rss.append(proc.memory_info().rss)
                time.sleep(1)
            cpu_after = proc.cpu_times()
            wall = time.monotonic() - wall_before
            cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
            return {
                "seconds": wall,
                "cpu_share_of_one_core": cpu / wall,
                "rss_peak_bytes": float(max(rss)),
                "rss_mean_bytes": statistics.fmean(rss),
            }
        finally:
            load.kill()
            daemon.stop()
            sim.kill()


def describe(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (
        f"min {ordered[0]:.2f} / median {statistics.median(ordered):.2f} / "
        f"p90 {p90:.2f} / max {ordered[-1]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="wedge trials per kind")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument(
        "--parts",
        default="scheduler_wedge,collective_hang,footprint",
        help="comma-separated subset of scheduler_wedge, collective_hang, footprint",
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))

    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "python": platform.python_version(),
        "stall_after_seconds": STALL_AFTER_SECONDS,
        "hang_after_seconds": HANG_AFTER_SECONDS,
        "interval_seconds": INTERVAL_SECONDS,
    }
    for kind in ("scheduler_wedge", "collective_hang"):
        if kind not in parts:
            continue
        trials = [wedge_trial(kind) for _ in range(args.runs)]
        results[kind] = trials
        print(f"{kind}: {len(trials)} trials, triage {sorted({t['triage'] for t in trials})}")
        print(f"  detection after onset (s): {describe([t['detection_seconds'] for t in trials])}")
        bundle = [t["bundle_after_verdict_seconds"] for t in trials]
        print(f"  wedge bundle complete after the verdict (s): {describe(bundle)}")
    if "footprint" in parts:
        results["footprint"] = fp = footprint(args.idle_seconds)
        print(
            f"footprint over {fp['seconds']:.0f} s at 1 s interval: "
            f"CPU {100 * fp['cpu_share_of_one_core']:.2f}% of one core, "
            f"RSS peak {fp['rss_peak_bytes'] / 2**20:.1f} MiB "
            f"(mean {fp['rss_mean_bytes'] / 2**20:.1f})"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
