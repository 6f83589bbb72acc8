"""wedgewatch's own HTTP/1.1 response parser against h11, side by side, in one run.

    .venv/bin/python bench/bench_http_parser.py [--responses 2000] [--rounds 5] [--probes 20]

The contenders: `io.http_parse.ResponseParser` (home-made, about 290 lines) and h11, the
parser it imitates (installed with httpx), behind the same interface
(`bench/h11_parser.py`). A server child (this file with `--serve`, its own process and
event loop, HTTP/1.1 keep-alive) answers four bodies on 127.0.0.1:

- `50 KB`: the real vLLM 0.33.0 `/metrics` body (`tests/fixtures/vllm-0.33.0/
  healthy_busy.prom`) with `Content-Length`, as vLLM (uvicorn) sends it;
- `50 KB chunked`: the same body in 4 KiB chunks (a proxy or a streaming server);
- `262 KB`: the DP=8 multiprocess body (`tests/fixtures/dp8_multiproc.prom`);
- `4 MB chunked`: the real body 80 times over in 64 KiB chunks (a body near the cap).

Measured, every part interleaved round by round (`--rounds`, the median round reported,
so a shared machine's load falls on both alike), as this process's CPU time per response
(`time.process_time`: the server's CPU is not counted):

1. `parse`: the parser alone, fed the response in 64 KiB pieces (no IO); `h11 bare` is
   h11's own keep-alive cycle without the adapter (send the request, read every event,
   start the next cycle), the least any client built on h11 pays;
2. `lean`: `io.scrape.fetch` through the daemon's `ScrapeClient` (`io.http1`, one kept-alive
   connection), with its parser swapped for h11 in the h11 column;
3. `probe GET`: `io.http_get.fetch`, the exec probe's blocking GET (a new connection each);
4. `probe start-up`: `wedgewatch check URL --for=0 --critical-only --state-file=...` as the
   exec probe runs it, each a fresh `python` (alternating, `--probes` runs each, after a
   warm-up; wall and CPU of the child from `wait4`), with the home-made parser or with
   h11 imported and swapped into `io.http_get`; beside `python -c pass` and `import h11`.

The figures a user sees are derived in the summary: the extra CPU of a 1 Hz scrape of N
targets (as a share of one core) and the probe's extra wall time. Ratios are h11 over
home-made (above 1: h11 costs more).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
REAL_BODY = REPO / "tests" / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
DP8_BODY = REPO / "tests" / "fixtures" / "dp8_multiproc.prom"
MIB = 1 << 20
PIECE = 64 * 1024  # what one read from a socket hands the parser (io.http_get reads 64 KiB)
COUNTER = b'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 37.0'
SHAPES = ("50 KB", "50 KB chunked", "262 KB", "4 MB chunked")
PATHS = {"50 KB": "/metrics", "50 KB chunked": "/c50", "262 KB": "/l262", "4 MB chunked": "/c4m"}
TARGETS = (100, 1000)


def _head(extra: str) -> bytes:
    return (
        "HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 15:00:00 GMT\r\nserver: uvicorn\r\n"
        f"{extra}content-type: text/plain; version=0.0.4; charset=utf-8\r\n\r\n"
    ).encode()


def with_length(body: bytes) -> bytes:
    """A response framed by `Content-Length`."""
    return _head(f"content-length: {len(body)}\r\n") + body


def chunked(body: bytes, size: int) -> bytes:
    """A response framed by `Transfer-Encoding: chunked`, `size` bytes a chunk."""
    parts = [_head("transfer-encoding: chunked\r\n")]
    for start in range(0, len(body), size):
        piece = body[start : start + size]
        parts += [f"{len(piece):x}\r\n".encode(), piece, b"\r\n"]
    return b"".join([*parts, b"0\r\n\r\n"])


def responses() -> dict[str, bytes]:
    """The four responses, by shape."""
    real = REAL_BODY.read_bytes()
    return {
        "50 KB": with_length(real),
        "50 KB chunked": chunked(real, 4096),
        "262 KB": with_length(DP8_BODY.read_bytes()),
        "4 MB chunked": chunked(real * 80, 64 * 1024),
    }


# -- the server child ---------------------------------------------------------------------


async def serve() -> None:
    """Serve the shapes on one port until killed; `/metrics`'s counter moves per request."""
    by_path = {PATHS[shape]: response for shape, response in responses().items()}
    served = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1].decode()
                response = by_path.get(path, by_path["/metrics"])
                if path == "/metrics":  # a busy server: every probe sees progress
                    served += 1
                    moved = COUNTER.replace(b"37.0", f"{37 + served}.0".encode())
                    body = response.split(b"\r\n\r\n", 1)[1].replace(COUNTER, moved)
                    response = with_length(body)
                writer.write(response)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    await server.serve_forever()


# -- in-process parts ---------------------------------------------------------------------


def cpu_ms(call: Callable[[], object], count: int) -> float:
    """Milliseconds of this process's CPU per call, over `count` calls back to back."""
    started = time.process_time()
    for _ in range(count):
        call()
    return 1000 * (time.process_time() - started) / count


def parse_once(parser_class: type, pieces: list[bytes]) -> Callable[[], object]:
    """One response through a fresh parser, fed `pieces`, every event drained."""
    from wedgewatch.io.http_parse import Data, End, NeedData

    def run() -> int:
        parser = parser_class()
        parser.next_response()
        received = 0
        feed = iter(pieces)
        while True:
            event = parser.next_event()
            if isinstance(event, NeedData):
                parser.receive_data(next(feed))
            elif isinstance(event, Data):
                received += len(event.data)
            elif isinstance(event, End):
                return received

    return run


def h11_cycle(pieces: list[bytes]) -> Callable[[], object]:
    """h11's own keep-alive cycle, no adapter: the least any h11 client pays per response."""
    import h11

    connection = h11.Connection(our_role=h11.CLIENT)
    request = h11.Request(method="GET", target="/metrics", headers=[("Host", "bench")])

    def run() -> int:
        connection.send(request)
        connection.send(h11.EndOfMessage())
        received = 0
        feed = iter(pieces)
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(next(feed))
            elif isinstance(event, h11.Data):
                received += len(event.data)
            elif isinstance(event, h11.EndOfMessage):
                connection.start_next_cycle()
                return received

    return run


def in_process(port: int, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Parts 1 to 3: CPU per response, home-made and h11, every shape; median round."""
    sys.path.insert(0, str(BENCH))
    import h11_parser

    from wedgewatch.io import http1, http_get, http_parse
    from wedgewatch.io.scrape import fetch, new_scrape_client
    from wedgewatch.io.scrape_rules import Fetched

    parsers = {"home-made": http_parse.ResponseParser, "h11": h11_parser.H11ResponseParser}
    shaped = responses()
    loop = asyncio.new_event_loop()
    clients = {name: new_scrape_client() for name in parsers}
    parts: dict[str, Callable[[], object]] = {}
    for shape in SHAPES:
        whole = shaped[shape]
        pieces = [whole[i : i + PIECE] for i in range(0, len(whole), PIECE)]
        url = f"http://127.0.0.1:{port}{PATHS[shape]}"
        parts[f"parse|{shape}|h11 bare"] = h11_cycle(pieces)
        for name, parser_class in parsers.items():
            parts[f"parse|{shape}|{name}"] = parse_once(parser_class, pieces)

            def lean(url: str = url, name: str = name, parser_class: type = parser_class) -> None:
                h11_parser.install(http1, parser_class)
                result = loop.run_until_complete(
                    fetch(clients[name], url, timeout_seconds=10, max_body_bytes=16 * MIB)
                )
                if not isinstance(result, Fetched):
                    raise RuntimeError(f"lean scrape of {url} failed: {result}")

            def probe_get(url: str = url, parser_class: type = parser_class) -> None:
                h11_parser.install(http_get, parser_class)
                result = http_get.fetch(url, timeout_seconds=10, max_body_bytes=16 * MIB)
                if not isinstance(result, Fetched):
                    raise RuntimeError(f"probe GET of {url} failed: {result}")

            parts[f"lean|{shape}|{name}"] = lean
            parts[f"probe GET|{shape}|{name}"] = probe_get
    for call in parts.values():  # warm-up: connections open, code paths run
        cpu_ms(call, 5)
    rounds: dict[str, list[float]] = {key: [] for key in parts}
    for _ in range(args.rounds):
        for key, call in parts.items():
            count = args.responses // args.rounds
            if "4 MB" in key:
                count = max(1, count // 40)  # 80 times the body: keep the run short
            rounds[key].append(cpu_ms(call, count))
    for client in clients.values():
        loop.run_until_complete(client.aclose())
    loop.close()
    opened = {name: client.lean.connections_opened for name, client in clients.items()}
    if any(n != 1 for n in opened.values()):
        raise RuntimeError(f"the lean client reconnected: {opened}")
    table: dict[str, dict[str, float]] = {}
    for key, values in rounds.items():
        part, shape, name = key.split("|")
        table.setdefault(f"{part}|{shape}", {})[name] = statistics.median(values)
    return table


# -- part 4: the exec probe's start-up --------------------------------------------------------


def run_child(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child that must exit 0."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def probe_startup(port: int, runs: int) -> dict[str, dict[str, float]]:
    """Part 4: the exec probe as deploy/kubernetes/exec-probe runs it, each parser."""
    python = sys.executable
    url = f"http://127.0.0.1:{port}"
    entry = "from wedgewatch.entry import main; main()"
    h11_entry = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import h11_parser; "
        "from wedgewatch.io import http_get; h11_parser.install(http_get); " + entry
    )
    with tempfile.TemporaryDirectory(prefix="wedgewatch-bench-parser-") as tmp:
        work = Path(tmp)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("WEDGEWATCH_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")  # compiled, as an image has it

        def probe(code: str, state: str) -> list[str]:
            args = ["check", url, "--for=0", "--critical-only", f"--state-file={work / state}"]
            return [python, "-c", code, *args]

        commands = {
            "python -c pass": [python, "-c", "pass"],
            "import h11": [python, "-c", "import h11"],
            "probe, home-made": probe(entry, "home.json"),
            "probe, h11": probe(h11_entry, "h11.json"),
        }
        for argv in commands.values():  # warm-up: bytecode, the settings cache
            run_child(argv, env)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(runs):
            for name, argv in commands.items():
                samples[name].append(run_child(argv, env))
    results = {}
    for name, values in samples.items():
        walls, cpus = sorted(v[0] for v in values), sorted(v[1] for v in values)
        results[name] = {
            "wall_min_ms": 1000 * walls[0],
            "wall_median_ms": 1000 * statistics.median(walls),
            "cpu_min_ms": 1000 * cpus[0],
            "cpu_median_ms": 1000 * statistics.median(cpus),
        }
    return results


# -- the report ------------------------------------------------------------------------------


def report(table: dict[str, dict[str, float]], probes: dict[str, dict[str, float]]) -> None:
    """Print the tables and the figures a user sees."""
    print(
        f"{'CPU per response (ms)':<34} {'home-made':>10} {'h11':>8} {'h11 / home':>11}"
        f" {'h11 bare':>9}"
    )
    for key, row in table.items():
        part, shape = key.split("|")
        ratio = row["h11"] / row["home-made"]
        name = f"{part}, {shape}"
        bare = f"{row['h11 bare']:>9.4f}" if "h11 bare" in row else f"{'':>9}"
        print(f"{name:<34} {row['home-made']:>10.4f} {row['h11']:>8.4f} {ratio:>10.2f}x {bare}")
    print()
    print(f"{'probe start-up (ms)':<20} {'wall min':>9} {'median':>8} {'CPU min':>8} {'median':>8}")
    for name, r in probes.items():
        print(
            f"{name:<20} {r['wall_min_ms']:>9.1f} {r['wall_median_ms']:>8.1f}"
            f" {r['cpu_min_ms']:>8.1f} {r['cpu_median_ms']:>8.1f}"
        )
    print()
    lean = table["lean|50 KB"]
    extra = lean["h11"] - lean["home-made"]
    for n in TARGETS:
        print(
            f"{n} targets at 1 Hz, real 50 KB body: home-made {lean['home-made'] * n / 10:.1f} %"
            f" of a core, h11 {lean['h11'] * n / 10:.1f} % ({extra * n / 10:+.1f} points)"
        )
    home, h11 = probes["probe, home-made"], probes["probe, h11"]
    print(
        f"exec probe: h11 adds {h11['wall_median_ms'] - home['wall_median_ms']:+.1f} ms wall"
        f" (median), {h11['cpu_min_ms'] - home['cpu_min_ms']:+.1f} ms CPU (min) per probe;"
        f" a probe every 10 s: {(h11['cpu_median_ms'] - home['cpu_median_ms']) * 8.64:+.0f} s"
        " of CPU a day"
    )


def main() -> int:
    """Run the benchmark (or, with `--serve`, be its server child)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--responses", type=int, default=2000, help="per part, all rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--probes", type=int, default=20, help="probe start-ups per command")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve())
        return 0
    load_before = os.getloadavg()
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve"]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert server.stdout is not None
        port = json.loads(server.stdout.readline())["port"]
        table = in_process(port, args)
        probes = probe_startup(port, args.probes)
    finally:
        server.terminate()
        server.wait(30)
    load_after = os.getloadavg()
    print(
        f"# Python {platform.python_version()}, h11 {version('h11')}, {os.cpu_count()} CPUs,"
        f" load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    )
    report(table, probes)
    if args.json is not None:
        document = {
            "cpu_ms_per_response": table,
            "probe_startup": probes,
            "load_average": [load_before, load_after],
        }
        args.json.write_text(json.dumps(document, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
