"""A stand-in for a vLLM TP server's process tree, for evidence-capture tests.

Not the simulator: a small tree of real Python processes whose titles and stacks look
like vLLM's, so py-spy, process discovery and triage can be tested for real.

    api root (listens on 127.0.0.1:PORT, asyncio loop)
     └─ VLLM::EngineCore      run_engine_core > run_busy_loop > _process_engine_step > step
         ├─ VLLM::Worker_TP0  worker_busy_loop > dequeue > acquire_read
         └─ VLLM::Worker_TP1

Modes:
- `scheduler_wedge`: the engine spins (schedule finds nothing, sleeps 1 ms, loops);
  workers wait in `acquire_read`.
- `collective_hang`: the engine blocks in `future.result()` under `execute_model`;
  workers sit inside `all_reduce` > `barrier`.
- `api_hang`: as `scheduler_wedge` but the API server's event loop thread is blocked
  in a request handler (a lock acquired twice).
- `engine_dead`: the EngineCore exits right after start; the API server stays up.

Run directly, the root prints one line when the tree is ready:
`READY port=P api=PID engine=PID workers=PID,PID` (engine=0 when it is dead). Every
child exits when its parent goes away. Tests use `standin_tree(mode)` below.

`python tests/support/standin_tree.py record --mode MODE --out DIR [--native]` records py-spy
JSON dumps of every process of a fresh tree (used for tests/fixtures/stacks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import queue
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve()
MODES = ("scheduler_wedge", "collective_hang", "api_hang", "engine_dead")


def _set_title(title: str) -> None:
    import setproctitle

    setproctitle.setproctitle(title)


def _exit_when_orphaned(parent: int) -> None:
    if os.getppid() != parent:
        os._exit(0)


def _watch_parent(parent: int) -> None:
    """A daemon thread that ends this process when its parent is gone."""

    def watch() -> None:
        while True:
            time.sleep(0.2)
            _exit_when_orphaned(parent)

    threading.Thread(target=watch, name="parent_watch", daemon=True).start()


def _spawn(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def _await_ready(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("READY"):
        raise SystemExit(f"child {child.pid} did not become ready: {line!r}")
    return line.strip()


# ---------------------------------------------------------------------------- worker


class Worker:
    """Stands in for vLLM's WorkerProc (multiproc executor)."""

    def __init__(self, mode: str, parent: int) -> None:
        self.mode = mode
        self.parent = parent

    def worker_busy_loop(self) -> None:
        while True:
            method = self.dequeue()
            self.execute_model(method)

    def dequeue(self) -> str:
        return self.acquire_read()

    def acquire_read(self) -> str:
        # shm_broadcast spins on the ring buffer with short sleeps until a message arrives.
        while True:
            if self.mode == "collective_hang":
                return "execute_model"
            time.sleep(0.001)
            _exit_when_orphaned(self.parent)

    def execute_model(self, method: str) -> None:
        self.all_reduce()

    def all_reduce(self) -> None:
        self.barrier()

    def barrier(self) -> None:
        # A peer never arrives: the collective never completes.
        never = threading.Event()
        while not never.wait(0.5):
            _exit_when_orphaned(self.parent)


def worker_main(mode: str, rank: int) -> None:
    parent = os.getppid()
    _set_title(f"VLLM::Worker_TP{rank}")
    print("READY", flush=True)
    Worker(mode, parent).worker_busy_loop()


# ---------------------------------------------------------------------------- engine


class EngineCore:
    """Stands in for vLLM's EngineCoreProc."""

    def __init__(self, mode: str, parent: int) -> None:
        self.mode = mode
        self.parent = parent
        self.input_queue: queue.Queue[str] = queue.Queue()
        self.waiting = ["req-0", "req-1", "req-2"]  # deferred requests that never get scheduled

    def run_busy_loop(self) -> None:
        while True:
            self._process_input_queue()
            self._process_engine_step()
            _exit_when_orphaned(self.parent)

    def _process_input_queue(self) -> None:
        while not self.input_queue.empty():
            self.waiting.append(self.input_queue.get_nowait())

    def _process_engine_step(self) -> None:
        _outputs, model_executed = self.step()
        if not model_executed:
            time.sleep(0.001)

    def step(self) -> tuple[dict[int, object], bool]:
        scheduled = self.schedule()
        if self.mode == "collective_hang":
            future = self.execute_model(scheduled)
            future.result()
        return {}, bool(scheduled)

    def schedule(self) -> list[str]:
        # Every waiting request is deferred: nothing is admitted. A real scheduler spends a
        # moment on its queues each step; so does this one (about 0.2 ms of the 1.2 ms loop),
        # so a sampling profiler, which drops idle samples, always sees the loop's busy part
        # (with a bare sleep loop, a loaded machine left a 2 s profile with no sample at all).
        until = time.perf_counter() + 0.0002
        while time.perf_counter() < until:
            pass
        return [r for r in self.waiting if r.startswith("admitted")]

    def execute_model(self, scheduled: list[str]) -> Future[object]:
        # The multiproc executor returns a future; the workers never answer.
        return Future()


def process_input_sockets(parent: int) -> None:
    """The engine's input thread: blocks on the front-end socket."""
    idle = threading.Event()
    while not idle.wait(0.5):
        _exit_when_orphaned(parent)


def engine_main(mode: str, workers: int) -> None:
    parent = os.getppid()
    _set_title("VLLM::EngineCore")
    if mode == "engine_dead":
        print("READY", flush=True)
        raise SystemExit(1)
    children = [
        _spawn(["--role", "worker", "--mode", mode, "--rank", str(r)]) for r in range(workers)
    ]
    for child in children:
        _await_ready(child)
    print("READY workers=" + ",".join(str(c.pid) for c in children), flush=True)
    threading.Thread(
        target=process_input_sockets, args=(parent,), name="input_thread", daemon=True
    ).start()
    run_engine_core(mode, parent)


def run_engine_core(mode: str, parent: int) -> None:
    EngineCore(mode, parent).run_busy_loop()


# ---------------------------------------------------------------------------- api server


def render_response() -> None:
    """A handler that deadlocks on the event loop thread (api_hang)."""
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()


async def serve_api(mode: str, workers: int) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, sock=sock)
    port = sock.getsockname()[1]
    engine = _spawn(["--role", "engine", "--mode", mode, "--workers", str(workers)])
    line = _await_ready(engine)
    worker_pids = line.partition("workers=")[2]
    engine_pid = engine.pid
    if mode == "engine_dead":
        engine.wait()
        engine_pid = 0
    print(
        f"READY port={port} api={os.getpid()} engine={engine_pid} workers={worker_pids}",
        flush=True,
    )
    if mode == "api_hang":
        asyncio.get_running_loop().call_later(0.05, render_response)
    async with server:
        await server.serve_forever()


def api_main(mode: str, workers: int) -> None:
    _watch_parent(os.getppid())
    asyncio.run(serve_api(mode, workers))


# ---------------------------------------------------------------------------- test helper


@dataclass(frozen=True)
class StandinTree:
    """The pids and port of a running stand-in tree."""

    port: int
    api_pid: int
    engine_pid: int  # 0 when the engine is dead
    worker_pids: tuple[int, ...]
    mode: str


def _read_ready(proc: subprocess.Popen[str], timeout_seconds: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_seconds)
    if not ready:
        raise RuntimeError(f"stand-in tree did not start within {timeout_seconds} s")
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        raise RuntimeError(f"stand-in tree failed to start: {line!r}")
    return line


def parse_ready(line: str, mode: str) -> StandinTree:
    """Parse the root's READY line."""
    fields = dict(part.split("=", 1) for part in line.split()[1:])
    workers = tuple(int(p) for p in fields["workers"].split(",") if p)
    return StandinTree(
        port=int(fields["port"]),
        api_pid=int(fields["api"]),
        engine_pid=int(fields["engine"]),
        worker_pids=workers,
        mode=mode,
    )


@contextlib.contextmanager
def standin_tree(
    mode: str = "scheduler_wedge", workers: int = 2, timeout_seconds: float = 30.0
) -> Iterator[StandinTree]:
    """Start a stand-in tree in its own session; kill the whole session afterwards."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--mode", mode, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        tree = parse_ready(_read_ready(proc, timeout_seconds), mode)
        time.sleep(0.2)  # let the loops settle into their steady state
        yield tree
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


def record(mode: str, out: Path, native: bool) -> None:
    """Record py-spy JSON dumps of every process of a fresh tree into `out`.

    `recording.json` lists each dump's process (pid, ppid, role, title) so tests can
    rebuild the tree for triage.
    """
    import psutil

    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.mkdir(parents=True, exist_ok=True)
    with standin_tree(mode) as tree:
        names = {tree.api_pid: ("api_server", "api_server")}
        if tree.engine_pid:
            names[tree.engine_pid] = ("engine_core", "engine_core")
        for rank, pid in enumerate(tree.worker_pids):
            names[pid] = (f"worker_tp{rank}", "worker")
        processes = []
        for pid, (name, role) in names.items():
            argv = [pyspy, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
            dump = json.loads(done.stdout)
            (out / f"{name}.json").write_text(json.dumps(dump, indent=1) + "\n")
            proc = psutil.Process(pid)
            title = " ".join(a for a in proc.cmdline() if a)
            processes.append(
                {
                    "file": f"{name}.json",
                    "pid": pid,
                    "ppid": proc.ppid(),
                    "role": role,
                    "title": title,
                }
            )
        meta = {"mode": mode, "native": native, "processes": processes}
        (out / "recording.json").write_text(json.dumps(meta, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs="?", choices=["run", "record"], default="run")
    parser.add_argument("--role", choices=["api", "engine", "worker"], default="api")
    parser.add_argument("--mode", choices=MODES, default="scheduler_wedge")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--native", action="store_true")
    args = parser.parse_args()
    if args.command == "record":
        if args.out is None:
            parser.error("record needs --out DIR")
        record(args.mode, args.out, args.native)
    elif args.role == "worker":
        _watch_parent(os.getppid())
        worker_main(args.mode, args.rank)
    elif args.role == "engine":
        engine_main(args.mode, args.workers)
    else:
        api_main(args.mode, args.workers)


if __name__ == "__main__":
    main()
