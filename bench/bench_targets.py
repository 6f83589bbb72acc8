"""Benchmark `wedgewatch run` watching many targets: CPU per target-scrape and cadence.

    .venv/bin/python bench/bench_targets.py [--sizes 10,100,1000] [--seconds 30]
        [--warmup-seconds 15] [--json out.json]

`--sizes` lists target counts; the goal is judged at the SAME interval for every size
(default 1 s, `--interval`). A size may name its own interval
(`1000@20`) to explore a machine that cannot give the daemon a whole core; such a row is
not the goal's measurement.

For each size N, `--servers` child processes (default 2; `python bench/bench_targets.py
--serve ...`, each its own asyncio event loop with HTTP/1.1 keep-alive) serve a real vLLM
0.33.0 /metrics body (`tests/fixtures/vllm-0.33.0/healthy_busy.prom`, or `--body
FILE`) on N loopback ports between them, plus one port that accepts connections, reads
the request and never answers (a hung /metrics). Serving happens outside this process
and outside the daemon, so what is measured is the daemon. A `wedgewatch run` child
watches all N + 1 targets at the interval with the 5 s scrape timeout. After
`--warmup-seconds`, for `--seconds`, the bench measures

- daemon CPU per target-scrape: the daemon's user + system CPU time (from /proc via
  psutil) divided by the number of requests the healthy ports answered;
- how long the daemon waited for a CPU while runnable (its threads' run-queue wait from
  `/proc/PID/task/*/schedstat`, as a share of the window): on a loaded machine, whether
  the daemon kept up with its work or was starved of a core;
- the worst cadence of a healthy target: the longest gap between two consecutive requests
  on any healthy port (the hung port beside them never answers), from the servers' own
  `time.monotonic()` stamps (one clock for every process on Linux).

Goals (docs/benchmarks.md): under 1 ms of daemon CPU per target-scrape, flat from 10 to
1000 targets, and no healthy target scraped less often than every interval + 0.5 s. The
progress counters of the served body move with every request, as on a busy server.
Everything runs on 127.0.0.1 with fresh state and evidence directories.

The daemon must never py-spy a server process: a target that turns suspect would have its
"server" (the child serving hundreds of ports, found as the port's listener) paused by
py-spy, stalling all its ports at once. The bench's config therefore points `pyspy_path`
at a program that does not exist (stack capture fails as data, nothing is attached) and
keeps `remedy = "none"` (nothing is signalled); process discovery only reads /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

WEDGEWATCH = [sys.executable, *os.environ.get("BENCH_PYTHON_ARGS", "").split(), "-m", "wedgewatch"]
DEFAULT_BODY = (
    Path(__file__).resolve().parent.parent / "tests/fixtures/vllm-0.33.0/healthy_busy.prom"
)
INTERVAL_SECONDS = 1.0
MOVING = (
    b"vllm:prompt_tokens_total{",
    b"vllm:generation_tokens_total{",
    b'vllm:request_success_total{engine="0",finished_reason="stop"',
    b"vllm:iteration_tokens_total_count{",
)
SCRAPE_TIMEOUT_SECONDS = 5.0


class Ports:
    """Healthy /metrics ports and perhaps one hung one, served by one event loop (a child)."""

    def __init__(self, body: bytes) -> None:
        # The progress counters move with every request, as on a busy healthy server.
        self._parts: list[bytes] = []  # text, then (name+labels, base value) pairs
        self._counters: list[tuple[bytes, float]] = []
        text = b""
        for line in body.splitlines(keepends=True):
            if line.startswith(MOVING):
                name, _, value = line.rstrip().rpartition(b" ")
                self._parts.append(text)
                self._counters.append((name, float(value)))
                text = b""
            else:
                text += line
        self._tail = text
        self.hits: dict[int, list[float]] = {}
        self._servers: list[asyncio.Server] = []
        self._held: list[asyncio.StreamWriter] = []

    def response(self, n: int) -> bytes:
        """The HTTP response to the n-th request of a port."""
        chunks: list[bytes] = []
        for text, (name, base) in zip(self._parts, self._counters, strict=True):
            chunks += [text, name, b" ", str(base + 16.0 * n).encode(), b"\n"]
        body = b"".join([*chunks, self._tail])
        head = (
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body

    async def _serve(
        self, port_index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        hits = self.hits.setdefault(port_index, [])
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            while True:
                await reader.readuntil(b"\r\n\r\n")
                hits.append(time.monotonic())
                writer.write(self.response(len(hits)))
                await writer.drain()
        writer.close()

    async def _hang(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.append(writer)  # read the request, never answer, never close
        with contextlib.suppress(
            ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
        ):
            while await reader.read(65536):
                pass

    async def start(self, count: int, *, hung: bool) -> tuple[list[int], int | None]:
        """Listen on `count` healthy ports and perhaps a hung one; their port numbers."""
        ports: list[int] = []
        for index in range(count):

            async def handler(
                r: asyncio.StreamReader, w: asyncio.StreamWriter, i: int = index
            ) -> None:
                await self._serve(i, r, w)

            server = await asyncio.start_server(handler, "127.0.0.1", 0)
            self._servers.append(server)
            ports.append(server.sockets[0].getsockname()[1])
        if not hung:
            return ports, None
        hung_server = await asyncio.start_server(self._hang, "127.0.0.1", 0)
        self._servers.append(hung_server)
        return ports, hung_server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every listener and held connection."""
        for writer in self._held:
            writer.close()
        for server in self._servers:
            server.close()


def write_config(path: Path, ports: list[int], hung: int, workdir: Path, interval: float) -> None:
    lines = [
        f"interval_seconds = {interval}",
        f"scrape_timeout_seconds = {SCRAPE_TIMEOUT_SECONDS}",
        'remedy = "none"',
        # Never py-spy a server child (it serves many ports): see the module docstring.
        f'pyspy_path = "{workdir / "no-py-spy-in-the-bench"}"',
        f'state_dir = "{workdir / "state"}"',
        f'evidence_dir = "{workdir / "evidence"}"',
        "listen_port = 0",
        "",
    ]
    for index, port in enumerate(ports):
        lines += ["[[targets]]", f'name = "t{index:04d}"', f'url = "http://127.0.0.1:{port}"', ""]
    lines += ["[[targets]]", 'name = "hung"', f'url = "http://127.0.0.1:{hung}"', ""]
    path.write_text("\n".join(lines))


def runqueue_wait_seconds(pid: int) -> float:
    """Time the process's threads spent runnable but waiting for a CPU (/proc schedstat).

    On a loaded machine this says whether the daemon kept up with its own work or waited
    for a core: the second field of `/proc/PID/task/TID/schedstat`, in nanoseconds.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def start_daemon(config: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """`wedgewatch run --config CONFIG`, its output in `log_path`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    env.pop("NOTIFY_SOCKET", None)
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*WEDGEWATCH, "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def stop_daemon(child: subprocess.Popen[bytes], log_path: Path) -> None:
    """SIGTERM, wait, SIGKILL if it hangs; keep the log when BENCH_KEEP_LOG names a file."""
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    keep = os.environ.get("BENCH_KEEP_LOG")
    if keep:
        Path(keep).write_bytes(log_path.read_bytes())


async def serve(args: argparse.Namespace, body: bytes) -> list[list[float]]:
    """Child mode: serve `--serve` ports (and a hung one with `--hung`) until SIGTERM.

    Prints {"ports": [...], "hung": port or null} on one line once listening; on SIGTERM
    writes the monotonic time of every request, by port index, to `--hits-file`.
    """
    ports_server = Ports(body)
    ports, hung = await ports_server.start(args.serve, hung=args.hung)
    print(json.dumps({"ports": ports, "hung": hung}), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await ports_server.stop()
    return [ports_server.hits.get(index, []) for index in range(len(ports))]


class Servers:
    """`count` healthy ports and one hung one, spread over `processes` child processes."""

    def __init__(self, count: int, processes: int, body: Path, workdir: Path) -> None:
        self.children: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.ports: list[int] = []
        self.hung = 0
        shares = [
            count // processes + (1 if i < count % processes else 0) for i in range(processes)
        ]
        for index, share in enumerate(shares):
            hits_file = workdir / f"hits-{index}.json"
            argv = [sys.executable, __file__, "--serve", str(share), "--body", str(body)]
            argv += ["--hits-file", str(hits_file), *(["--hung"] if index == 0 else [])]
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
            self.children.append((child, hits_file))
        for child, _ in self.children:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise RuntimeError("a server child exited before listening")
            listening = json.loads(line)
            self.ports += listening["ports"]
            self.hung = listening["hung"] or self.hung

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server children so far."""
        return sum(cpu_seconds(psutil.Process(child.pid)) for child, _ in self.children)

    def stop(self) -> list[list[float]]:
        """SIGTERM every child; the request times of every healthy port, in port order."""
        hits: list[list[float]] = []
        for child, _ in self.children:
            child.send_signal(signal.SIGTERM)
        for child, hits_file in self.children:
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            hits += json.loads(hits_file.read_text()) if hits_file.exists() else []
        return hits


async def measure(size: int, interval: float, args: argparse.Namespace) -> dict[str, Any]:
    """One size: start the servers and the daemon, warm up, measure, stop."""
    with tempfile.TemporaryDirectory(prefix="wedgewatch-bench-targets-") as tmp:
        workdir = Path(tmp)
        servers = Servers(size, min(args.servers, size), Path(args.body), workdir)
        config = workdir / "wedgewatch.toml"
        write_config(config, servers.ports, servers.hung, workdir, interval)
        child = start_daemon(config, workdir / "daemon.log")
        try:
            proc = psutil.Process(child.pid)
            await asyncio.sleep(args.warmup_seconds)
            if child.poll() is not None:
                raise RuntimeError(f"wedgewatch run exited; see {workdir / 'daemon.log'}")
            load0 = os.getloadavg()[0]
            start, cpu0, served0 = time.monotonic(), cpu_seconds(proc), servers.cpu_seconds()
            waited0 = runqueue_wait_seconds(child.pid)
            await asyncio.sleep(args.seconds)
            end, cpu1, served1 = time.monotonic(), cpu_seconds(proc), servers.cpu_seconds()
            waited1 = runqueue_wait_seconds(child.pid)
            load1 = os.getloadavg()[0]
            rss = proc.memory_info().rss
        finally:
            await asyncio.to_thread(stop_daemon, child, workdir / "daemon.log")
            all_hits = await asyncio.to_thread(servers.stop)
    scrapes = 0
    worst_gap = 0.0
    for port_hits in all_hits:
        hits = [t for t in port_hits if start <= t <= end]
        scrapes += len(hits)
        # The gap before the first hit in the window counts too (a target that stopped).
        edges = [start, *hits, end]
        worst_gap = max(worst_gap, *(b - a for a, b in itertools.pairwise(edges)))
    cpu = cpu1 - cpu0
    return {
        "targets": size,
        "interval_seconds": interval,
        "hung_targets": 1,
        "server_processes": len(servers.children),
        "window_seconds": round(end - start, 2),
        "target_scrapes": scrapes,
        "expected_scrapes": int(size * (end - start) / interval),
        "daemon_cpu_seconds": round(cpu, 3),
        "cpu_ms_per_target_scrape": round(1000 * cpu / scrapes, 3) if scrapes else None,
        "daemon_cpu_share_of_one_core": round(cpu / (end - start), 3),
        "daemon_runqueue_wait_share": round((waited1 - waited0) / (end - start), 3),
        "daemon_rss_mib": round(rss / 2**20, 1),
        "servers_cpu_share_of_one_core": round((served1 - served0) / (end - start), 3),
        "worst_healthy_gap_seconds": round(worst_gap, 3),
        "load_average_1min": [round(load0, 2), round(load1, 2)],
    }


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for item in args.sizes.split(","):
        size, _, every = item.partition("@")
        interval = float(every) if every else args.interval
        result = await measure(int(size), interval, args)
        print(json.dumps(result), flush=True)
        results.append(result)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--interval", type=float, default=INTERVAL_SECONDS)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-seconds", type=float, default=15.0)
    parser.add_argument("--body", default=str(DEFAULT_BODY))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--servers", type=int, default=2, help="server child processes")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--hung", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hits-file", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # One listening and one connected socket per target in a server child, one in the
    # daemon; both inherit the limit.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.serve is not None:
        hits = asyncio.run(serve(args, Path(args.body).read_bytes()))
        Path(args.hits_file).write_text(json.dumps(hits))
        return 0
    results = asyncio.run(main_async(args))
    report = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "results": results,
    }
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
