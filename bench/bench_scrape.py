"""Benchmark one target-scrape's CPU, part by part, against a real loopback server.

    .venv/bin/python bench/bench_scrape.py [--scrapes 2000] [--rounds 5] [--profile N]

A server child (`bench/bench_targets.py --serve 1`, its own process, HTTP/1.1 keep-alive)
serves the real vLLM 0.33.0 body (`tests/fixtures/vllm-0.33.0/healthy_busy.prom`,
50 KiB, progress counters moving with every request). This process scrapes it back to
back and measures its own CPU time (`time.process_time`, user + system of this process
only; the server's CPU is not counted) per scrape for:

- `fetch (httpx)`: `io.scrape.fetch` with the httpx client of `io.scrape.new_client`;
- `fetch (lean)`: `io.scrape.fetch` with the daemon's `ScrapeClient` (`io.http1`);
- `parse`: `vllm.signals.parse` of the body the scrape returned.

The parts run interleaved, round by round (`--rounds`), and the median round is
reported, so the load of a shared machine falls on every part alike. `--profile N` prints
the top N functions of a cProfile run of the lean fetch instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import platform
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from wedgewatch.io.scrape import fetch, new_client, new_scrape_client
from wedgewatch.io.scrape_rules import Fetched
from wedgewatch.vllm import signals

BENCH = Path(__file__).resolve().parent
DEFAULT_BODY = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-0.33.0/healthy_busy.prom"
)
MIB = 1 << 20


async def cpu_per_call(call: Callable[[], Awaitable[object]], count: int) -> float:
    """Milliseconds of this process's CPU per call, over `count` calls back to back."""
    started = time.process_time()
    for _ in range(count):
        await call()
    return 1000 * (time.process_time() - started) / count


async def run(url: str, args: argparse.Namespace) -> dict[str, object]:
    httpx_client = new_client(keepalive=1)
    lean_client = new_scrape_client()
    body = b""

    async def httpx_fetch() -> None:
        result = await fetch(httpx_client, url, timeout_seconds=5, max_body_bytes=16 * MIB)
        if not isinstance(result, Fetched):
            raise RuntimeError(f"httpx scrape failed: {result}")

    async def lean_fetch() -> None:
        nonlocal body
        result = await fetch(lean_client, url, timeout_seconds=5, max_body_bytes=16 * MIB)
        if not isinstance(result, Fetched):
            raise RuntimeError(f"lean scrape failed: {result}")
        body = result.body

    async def parse() -> None:
        if not isinstance(signals.parse(body), signals.Exposition):
            raise RuntimeError("the body did not parse")

    parts = {"fetch (httpx)": httpx_fetch, "fetch (lean)": lean_fetch, "parse": parse}
    for call in parts.values():  # warm up: connections open, code paths imported
        await cpu_per_call(call, 50)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await cpu_per_call(lean_fetch, args.scrapes)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
        return {}
    rounds: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.rounds):
        for name, call in parts.items():
            rounds[name].append(await cpu_per_call(call, args.scrapes // args.rounds))
    await httpx_client.aclose()
    await lean_client.aclose()
    return {
        "cpu_ms_per_call_median_round": {
            k: round(statistics.median(v), 4) for k, v in rounds.items()
        },
        "rounds": {k: [round(x, 4) for x in v] for k, v in rounds.items()},
        "lean_connections_opened": lean_client.lean.connections_opened,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scrapes", type=int, default=2000, help="per part, over all rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0)
    parser.add_argument("--body", default=str(DEFAULT_BODY))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wedgewatch-bench-scrape-") as tmp:
        argv = [sys.executable, str(BENCH / "bench_targets.py"), "--serve", "1"]
        argv += ["--body", args.body, "--hits-file", str(Path(tmp) / "hits.json")]
        server = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert server.stdout is not None
            port = json.loads(server.stdout.readline())["ports"][0]
            result = asyncio.run(run(f"http://127.0.0.1:{port}/metrics", args))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(30)
    if result:
        result["machine"] = {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        }
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
