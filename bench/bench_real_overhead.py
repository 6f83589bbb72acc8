"""What a real `vllm serve` loses to wedgewatch: its decode throughput with and without.

    .venv/bin/python bench/bench_real_overhead.py [--version 0.32.0] [--window-seconds 10]
        [--pairs 2] [--json out.json]

A real CPU vLLM (vLLM's CPU build, tests/support/real_vllm.py: the tiny local model, a 64 MiB KV
cache,
API server, EngineCore, Worker) decodes for four clients without a pause (each re-sends a
500-token completion as soon as one ends), so every engine step emits tokens. Its throughput
(generated tokens per second, `vllm:generation_tokens_total`; engine steps per second,
`vllm:iteration_tokens_total_count`) is measured over windows of `--window-seconds`,
interleaved so drifting machine load hits every condition alike:

* `none`: nothing watches it (the baseline);
* `scrape`: a real `wedgewatch run` watches it at 1 Hz (scrapes, detector, its own server;
  no restart), started before the window so its start-up is not counted;
* `suspect`: suspect-round captures (`evidence.capture_bundle`, phase suspect: py-spy
  `--json --nonblocking` of every process, process sample) back to back for the whole window;
* `wedged`: full wedge-round captures (phase wedged, one-shot: py-spy `--native` JSON and text
  dumps, each pausing its target, then the EngineCore's sampled profile) back to back.

The captures run in this process, as the daemon runs them. Back to back is far more than the
daemon ever does (one suspect round per target per `suspect_capture_min_interval_seconds`,
600 s; one wedge round per episode); the bench derives the tokens one round costs and the loss
at that cadence. Needs the serving venv (`bash wedgewatch/lab/real/install-vllm.sh --serve
VERSION`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [
    str(ROOT),
    str(ROOT / "tests" / "support"),
]  # tests/support/real_vllm.py imports tests.support.vllm_venvs

import real_vllm  # noqa: E402  # tests/support/real_vllm.py: the real server's harness

from wedgewatch.config.model import Config  # noqa: E402
from wedgewatch.core.detection.states import CapturePhase  # noqa: E402
from wedgewatch.io.evidence import (  # noqa: E402
    CaptureRequest,
    EvidenceDeps,
    EvidenceSettings,
    capture_bundle,
)
from wedgewatch.io.procs import ProcessSelector  # noqa: E402

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
DECODERS = 4
MAX_TOKENS = 500
CADENCE_SECONDS = Config.model_fields["suspect_capture_min_interval_seconds"].default
MODES = ("scrape", "suspect", "wedged")


def counters(url: str) -> tuple[float, float]:
    """(generated tokens, engine steps that emitted tokens) so far."""
    tokens = steps = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:generation_tokens_total{"):
            tokens += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:iteration_tokens_total_count{"):
            steps += float(line.rsplit(" ", 1)[1])
    return tokens, steps


def keep_decoding(url: str, stop: threading.Event) -> None:
    """One client that always has a long decode running (re-sent as soon as it ends)."""
    body = {
        "model": real_vllm.MODEL_NAME,
        "prompt": [1, 20, 30],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
    }
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json=body, timeout=900)


@contextlib.contextmanager
def daemon(url: str, work: Path) -> Any:
    """A real `wedgewatch run` scraping `url` at 1 Hz, for one window."""
    work.mkdir(parents=True, exist_ok=True)
    with (work / "daemon.log").open("ab") as log:
        proc = subprocess.Popen(
            [
                *WEDGEWATCH, "run", "--target", f"bench={url}", "--interval-seconds", "1",
                "--remedy", "none", "--listen-port", "0",
                "--state-dir", str(work / "state"), "--evidence-dir", str(work / "evidence"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while b'"http_listening"' not in (work / "daemon.log").read_bytes():  # warm: not its import
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"wedgewatch run did not start: {(work / 'daemon.log').read_text()}")
        time.sleep(0.1)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


async def measure(
    url: str, mode: str, window: float, deps: EvidenceDeps, work: Path
) -> dict[str, float]:
    """Tokens and steps per second over one window while `mode` runs; rounds and their time."""
    selector = ProcessSelector(url=url + "/metrics")
    rounds = 0
    incomplete = 0
    durations: list[float] = []
    with contextlib.ExitStack() as stack:
        if mode == "scrape":
            stack.enter_context(daemon(url, work / "daemon"))
        tokens0, steps0 = await asyncio.to_thread(counters, url)
        started = time.monotonic()
        while time.monotonic() - started < window:
            if mode in {"none", "scrape"}:
                await asyncio.sleep(window - (time.monotonic() - started))
                break
            t0 = time.monotonic()
            phase = CapturePhase.SUSPECT if mode == "suspect" else CapturePhase.WEDGED
            result = await capture_bundle(
                CaptureRequest(target="bench", selector=selector, phase=phase, family="bench"),
                deps,
            )
            durations.append(time.monotonic() - t0)
            if result.bundle is None:
                raise RuntimeError(f"capture failed: {result.failures}")
            incomplete += any(f.startswith("py-spy") for f in result.failures)
            rounds += 1
        elapsed = time.monotonic() - started
        tokens1, steps1 = await asyncio.to_thread(counters, url)
    return {
        "tokens_per_second": (tokens1 - tokens0) / elapsed,
        "steps_per_second": (steps1 - steps0) / elapsed,
        "rounds": rounds,
        "rounds_missing_stacks": incomplete,
        "round_seconds": statistics.mean(durations) if durations else 0.0,
        "elapsed": elapsed,
    }


async def measure_all(
    url: str, args: argparse.Namespace, deps: EvidenceDeps, work: Path
) -> dict[str, list[dict[str, float]]]:
    """Interleaved windows: none, scrape, none, suspect, none, wedged; `--pairs` times."""
    windows: dict[str, list[dict[str, float]]] = {m: [] for m in ("none", *MODES)}
    for _ in range(args.pairs):
        for mode in ("none", "scrape", "none", "suspect", "none", "wedged"):
            windows[mode].append(await measure(url, mode, args.window_seconds, deps, work))
            print(mode, {k: round(v, 3) for k, v in windows[mode][-1].items()}, flush=True)
    return windows


def summarize(
    windows: dict[str, list[dict[str, float]]], args: argparse.Namespace
) -> dict[str, Any]:
    base = statistics.median(w["tokens_per_second"] for w in windows["none"])
    out: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
        "vllm": args.version,
        "window_seconds": args.window_seconds,
        "pairs": args.pairs,
        "baseline_tokens_per_second": round(base, 1),
        "baseline_steps_per_second": round(
            statistics.median(w["steps_per_second"] for w in windows["none"]), 2
        ),
        "cadence_seconds": CADENCE_SECONDS,
    }
    for mode in MODES:
        rate = statistics.median(w["tokens_per_second"] for w in windows[mode])
        elapsed = sum(w["elapsed"] for w in windows[mode])
        rounds = sum(int(w["rounds"]) for w in windows[mode])
        entry: dict[str, Any] = {
            "tokens_per_second": round(rate, 1),
            "ratio_to_none": round(rate / base, 3),
            "loss_percent": round(100 * (base - rate) / base, 2),
        }
        if rounds:
            lost_per_round = max(base - rate, 0.0) * elapsed / rounds
            entry |= {
                "rounds": rounds,
                "round_seconds": round(
                    statistics.mean(w["round_seconds"] for w in windows[mode]), 3
                ),
                "tokens_lost_per_round": round(lost_per_round, 1),
                "rounds_missing_stacks": sum(
                    int(w["rounds_missing_stacks"]) for w in windows[mode]
                ),
                "loss_at_cadence_percent": round(
                    100 * lost_per_round / (base * CADENCE_SECONDS), 4
                ),
            }
        out[mode] = entry
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    stop = threading.Event()
    with real_vllm.running(args.version, work / "v") as server:
        url = server.url
        threads = [
            threading.Thread(target=keep_decoding, args=(url, stop), daemon=True)
            for _ in range(DECODERS)
        ]
        for thread in threads:
            thread.start()
        try:
            tokens = counters(url)[0]
            while counters(url)[0] < tokens + 4 * MAX_TOKENS:  # warmed up, decoding
                time.sleep(0.5)
            deps = EvidenceDeps(
                EvidenceSettings(
                    evidence_dir=work / "evidence",
                    evidence_keep=10_000,
                    evidence_max_bytes=10 * 1024**3,
                    nvidia_smi_path="nvidia-smi-not-here",
                )
            )
            windows = asyncio.run(measure_all(url, args, deps, work))
        finally:
            stop.set()
    return summarize(windows, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--version", default="0.32.0", choices=real_vllm.SERVE_VERSIONS)
    parser.add_argument("--window-seconds", type=float, default=10.0)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wedgewatch-bench-") as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
