"""Benchmark what the canary costs an idle target: one streamed one-token completion.

    .venv/bin/python bench/bench_canary.py [--count 50] [--json out.json]

Starts `wedgewatch sim serve` on 127.0.0.1 (idle, no load), then sends `--count` canaries
one after another with `io.canary.send` exactly as the daemon does (model from
`/v1/models`, `canary_prompt` default, `max_tokens` 1, streamed), and reports

- time to first token and total time per canary (median and worst);
- wedgewatch's own CPU per canary (this process's user + system time over the canaries);
- what the server did for them: prompt and generated tokens and finished requests, from
  the difference of its `/metrics` counters before and after.

Everything runs on 127.0.0.1; the simulator models the engine's work, not a GPU's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from wedgewatch.config import Config
from wedgewatch.io import canary
from wedgewatch.io.scrape import new_client
from wedgewatch.vllm.semantics import progress_counters
from wedgewatch.vllm.signals import Exposition, parse


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _counters(base_url: str) -> tuple[float, ...]:
    parsed = parse(httpx.get(base_url + "/metrics", timeout=5).content)
    assert isinstance(parsed, Exposition)
    reading = parsed.engines[min(parsed.engines)]
    return progress_counters(reading)


async def _run(base_url: str, count: int) -> tuple[list[float], list[float], float]:
    defaults = Config()
    spec = canary.CanarySpec(
        base_url=base_url,
        model=defaults.canary_model,
        prompt=defaults.canary_prompt,
        max_tokens=defaults.canary_max_tokens,
        timeout_seconds=defaults.canary_timeout_seconds,
    )
    ttft: list[float] = []
    total: list[float] = []
    async with new_client(keepalive=1) as client:
        await canary.send(client, spec, sent_at=time.monotonic())  # warm the connection
        cpu0 = time.process_time()
        for _ in range(count):
            result = await canary.send(client, spec, sent_at=time.monotonic())
            if result.reason is not None or result.first_token_seconds is None:
                raise SystemExit(f"canary failed: {result.reason}: {result.detail}")
            ttft.append(result.first_token_seconds)
            total.append(result.total_seconds)
        cpu = time.process_time() - cpu0
    return ttft, total, cpu


def main() -> int:
    """Run the benchmark and print (and optionally save) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    serve = [sys.executable, "-m", "wedgewatch", "sim", "serve", "Qwen/Qwen3-0.6B"]
    sim = subprocess.Popen(
        [*serve, "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the simulator did not become healthy within 60 s")
            time.sleep(0.2)
        before = _counters(base_url)
        ttft, total, cpu = asyncio.run(_run(base_url, args.count))
        time.sleep(1.0)  # the engine publishes its stats in batches
        after = _counters(base_url)
    finally:
        os.killpg(sim.pid, signal.SIGKILL)
        sim.wait(timeout=30)
    names = ("prompt_tokens", "generation_tokens", "finished", "preemptions", "iterations")
    per_canary = {
        name: (b - a) / (args.count + 1) for name, a, b in zip(names, before, after, strict=True)
    }
    out = {
        "count": args.count,
        "ttft_median_ms": round(statistics.median(ttft) * 1000, 2),
        "ttft_max_ms": round(max(ttft) * 1000, 2),
        "total_median_ms": round(statistics.median(total) * 1000, 2),
        "total_max_ms": round(max(total) * 1000, 2),
        "client_cpu_per_canary_ms": round(cpu / args.count * 1000, 2),
        "server_work_per_canary": per_canary,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
