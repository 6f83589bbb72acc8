"""`wedgewatch launch` as a real process: exec without --watch, a supervised child with it.

A small fake `vllm` (written per test into tmp_path) stands in for the server where the
launcher's own behaviour is tested: it answers `--version`, serves a fixture `/metrics`
body (a deferred wedge on the first start, an idle engine after a restart), starts a
child like an EngineCore, and exits with a chosen status on SIGTERM. The last test runs
the real simulator through the `vllm` shim and wedges it with agentic-burst traffic.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from ports import free_port

pytestmark = pytest.mark.slow

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
FIXTURES = Path(__file__).parents[1] / "fixtures"
UPLOAD = Path(__file__).parents[2] / "deploy" / "hooks" / "upload-bundle.sh"
# The traffic that wedges the simulator's stock scheduler on most tries (see wedgewatch demo).
BURST_LOAD = (
    *("--profile", "agentic-burst", "--seed", "16", "--duration", "30"),
    *("--request-timeout-seconds", "600"),  # clients that give up would end the wedge
)

FAKE_VLLM = r'''#!{python}
"""A fake `vllm`: `--version`, or `serve MODEL ... --port P` serving a fixture body."""
import http.server, os, signal, subprocess, sys, threading
from pathlib import Path

if sys.argv[1:] == ["--version"]:
    print("0.33.0")
    sys.exit(0)
state = Path({state!r})
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
starts = len(list(state.glob("start-*.json")))
first = starts == 0
# Written whole, then renamed: a test that sees start-N.json can read it.
(state / f"start-{{starts}}.tmp").write_text(__import__("json").dumps({{
    "pid": os.getpid(), "argv": sys.argv,
    "offload_env": os.environ.get("VLLM_USE_SIMPLE_KV_OFFLOAD"),
}}))
(state / f"start-{{starts}}.tmp").replace(state / f"start-{{starts}}.json")
body = Path({wedged!r} if first else {idle!r}).read_bytes()
# An "EngineCore" child in the server's process group, as vLLM has.
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
(state / f"engine-{{starts}}.pid").write_text(str(engine.pid))

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        data = body if self.path == "/metrics" else b"ok"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)

def on_term(signum, frame):
    engine.terminate()
    os._exit({term_status})

signal.signal(signal.SIGTERM, on_term)
exit_after = {exit_after}
if exit_after is not None:
    threading.Timer(exit_after, lambda: os._exit({exit_status})).start()
server.serve_forever()
'''


def fake_vllm(
    tmp_path: Path,
    *,
    term_status: int = 0,
    exit_after_seconds: float | None = None,
    exit_status: int = 5,
) -> tuple[Path, Path]:
    """Write the fake vllm; returns (executable, directory where each start is recorded)."""
    state = tmp_path / "fake-state"
    state.mkdir()
    path = tmp_path / "bin" / "vllm"
    path.parent.mkdir()
    path.write_text(
        FAKE_VLLM.format(
            python=sys.executable,
            state=str(state),
            wedged=str(FIXTURES / "deferred_wedge.prom"),
            idle=str(FIXTURES / "idle.prom"),
            term_status=term_status,
            exit_after=exit_after_seconds,
            exit_status=exit_status,
        )
    )
    path.chmod(0o755)
    return path, state


class Launcher:
    """A `wedgewatch launch` child process with its JSON log on stderr."""

    def __init__(self, args: list[str], tmp_path: Path, env: dict[str, str] | None = None):
        self.log_path = tmp_path / "launch.log"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
        clean.pop("NOTIFY_SOCKET", None)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [*WEDGEWATCH, "launch", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**clean, "CUDA_VISIBLE_DEVICES": "0,1", **(env or {})},
                start_new_session=True,
            )

    def lines(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (other lines as {'event': '<text>'})."""
        out = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                out.append({"event": "<text>", "text": raw})
        return out

    def wait_for(self, event: str, timeout_seconds: float = 60) -> dict[str, Any]:
        """The first log line named `event`, waiting up to the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            found = [line for line in self.lines() if line.get("event") == event]
            if found:
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no {event} within {timeout_seconds} s; log tail:\n{self.tail()}")

    def tail(self) -> str:
        """The log's last 40 lines (for a failure's message)."""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])

    def exit_status(self, timeout_seconds: float = 60) -> int:
        """Wait for the launcher to end; its exit status."""
        return self.proc.wait(timeout=timeout_seconds)


@pytest.fixture
def launchers(tmp_path: Path) -> Iterator[list[Launcher]]:
    """Launchers started by a test; any still running at the end is killed with its group."""
    started: list[Launcher] = []
    yield started
    for launcher in started:
        if launcher.proc.poll() is None:
            os.killpg(launcher.proc.pid, signal.SIGKILL)
            launcher.proc.wait(timeout=30)


def watchdog_args(tmp_path: Path, listen_port: int) -> list[str]:
    """Fast thresholds and private directories for the watchdog part of --watch."""
    return [
        *("--state-dir", str(tmp_path / "state"), "--evidence-dir", str(tmp_path / "evidence")),
        *("--listen-port", str(listen_port), "--interval-seconds", "0.5"),
        *("--stall-after-seconds", "2", "--grace-seconds", "5"),
        *("--pyspy-timeout-seconds", "5", "--process-sample-seconds", "0.2"),
    ]


def launch_args(vllm: Path, *options: str, server: tuple[str, ...] = ()) -> list[str]:
    """`launch --model m --vllm-bin VLLM OPTIONS -- SERVER`."""
    return ["--model", "m", "--vllm-bin", str(vllm), *options, "--", *server]


def recorded_starts(state: Path) -> list[dict[str, Any]]:
    """Every start of the fake server, in order."""
    return [
        json.loads((state / f"start-{i}.json").read_text())
        for i in range(len(list(state.glob("start-*.json"))))
    ]


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(predicate: Any, timeout_seconds: float, what: str) -> None:
    """Poll `predicate` until it is true."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_seconds} s")


def test_without_watch_the_launcher_becomes_the_server(tmp_path: Path) -> None:
    """`launch` execs vllm: same pid, the user's flags and nothing else, its exit status."""
    vllm, state = fake_vllm(tmp_path, term_status=7)
    port = free_port()
    log = tmp_path / "exec.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*WEDGEWATCH, "launch", *launch_args(vllm, server=("--port", str(port)))],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**clean, "CUDA_VISIBLE_DEVICES": "0,1"},
            start_new_session=True,
        )
    try:
        wait_until((state / "start-0.json").exists, 30, "the server start")
        (start,) = recorded_starts(state)
        assert start["pid"] == proc.pid
        assert start["offload_env"] is None  # the default profile adds no variable...
        assert start["argv"][1:] == ["serve", "m", "--port", str(port)]  # ...and no flag
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200,
            30,
            "the health check",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 7
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the server and anything it started
        proc.wait(timeout=30)
    assert '"event": "server_exec"' in log.read_text()


def test_too_few_gpus_for_real_vllm_is_refused_before_start(tmp_path: Path) -> None:
    """TP=2 with one visible GPU: exit 2 with the reason, nothing started."""
    vllm, state = fake_vllm(tmp_path)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    server = ("--port", str(free_port()))
    done = subprocess.run(
        [*WEDGEWATCH, "launch", *launch_args(vllm, "--profile", "tp2-offload", server=server)],
        capture_output=True,
        text=True,
        env={**clean, "CUDA_VISIBLE_DEVICES": "0"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "tensor parallel size 2 needs 2 GPUs but 1 are visible" in done.stderr
    assert recorded_starts(state) == []


def test_watch_restarts_a_wedged_server_with_the_same_command(
    tmp_path: Path, launchers: list[Launcher]
) -> None:
    """--watch: wedge -> evidence -> the whole group stopped -> same command again -> recovered."""
    vllm, state = fake_vllm(tmp_path, term_status=0)
    port, listen = free_port(), free_port()
    launcher = Launcher(
        launch_args(
            vllm,
            "--watch",
            *watchdog_args(tmp_path, listen),
            server=("--host", "127.0.0.1", "--port", str(port)),
        ),
        tmp_path,
    )
    launchers.append(launcher)
    started = launcher.wait_for("server_started")
    assert started["target"] == f"http://127.0.0.1:{port}/metrics"
    wedge = launcher.wait_for("wedge_detected", timeout_seconds=60)
    assert wedge["family"] == "deferred_stall"
    assert wedge["remedy"] == "supervise"
    launcher.wait_for("evidence_captured", timeout_seconds=60)
    launcher.wait_for("restart_completed", timeout_seconds=60)
    succeeded = launcher.wait_for("restart_succeeded", timeout_seconds=60)
    assert succeeded["target"] == f"127.0.0.1:{port}"
    first, second = recorded_starts(state)
    assert first["argv"] == second["argv"]  # the same command, flags and all
    assert second["pid"] != first["pid"]
    first_engine = int((state / "engine-0.pid").read_text())
    assert gone(first_engine), "the old server's EngineCore outlived the restart"
    status = httpx.get(f"http://127.0.0.1:{listen}/status", timeout=5).json()
    (target,) = status["targets"]
    assert target["restarts"] == 1
    assert target["state"] == "idle"
    bundles = list((tmp_path / "evidence").iterdir())
    assert bundles, "no evidence bundle"
    summary = json.loads((bundles[0] / "summary.json").read_text())
    assert summary["verdict"] == "wedged"
    assert summary["pids"], summary
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.exit_status(60) == 0, launcher.tail()
    second_engine = int((state / "engine-1.pid").read_text())
    assert gone(second_engine)
    stopped = launcher.wait_for("server_stopped")
    assert stopped["restarts"] == 1


def test_sigterm_stops_the_server_group_and_exits_with_its_status(
    tmp_path: Path, launchers: list[Launcher]
) -> None:
    """SIGTERM to `launch --watch`: the server and its children stop; its status is ours."""
    vllm, state = fake_vllm(tmp_path, term_status=7)
    port, listen = free_port(), free_port()
    launcher = Launcher(
        launch_args(
            vllm,
            "--watch",
            *watchdog_args(tmp_path, listen),
            *("--stall-after-seconds", "600"),
            server=("--port", str(port)),
        ),
        tmp_path,
    )
    launchers.append(launcher)
    launcher.wait_for("http_listening")
    wait_until((state / "engine-0.pid").exists, 30, "the server start")
    engine = int((state / "engine-0.pid").read_text())
    server = recorded_starts(state)[0]["pid"]
    assert psutil.Process(server).ppid() == launcher.proc.pid
    assert os.getpgid(server) == server  # its own process group
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.exit_status(60) == 7, launcher.tail()
    assert gone(server)
    assert gone(engine)
    assert launcher.wait_for("launcher_stopping")["signal"] == "SIGTERM"


@pytest.mark.parametrize("code", [5, 0])
def test_a_server_that_exits_by_itself_ends_the_launcher_with_its_status(
    tmp_path: Path, launchers: list[Launcher], code: int
) -> None:
    """The server dying on its own is not a wedge: the launcher exits with its status, and
    leaves a crash bundle with the watchdog's flight recorder up to the exit. Status 0 too:
    vLLM 0.32 exits 0 when its engine died (kill -9 of a worker, docs/real-vllm.md)."""
    vllm, state = fake_vllm(tmp_path, exit_after_seconds=3, exit_status=code)
    port, listen = free_port(), free_port()
    shipped = tmp_path / "shipped"
    launcher = Launcher(
        launch_args(
            vllm,
            "--watch",
            *watchdog_args(tmp_path, listen),
            *("--stall-after-seconds", "600"),
            *("--on-bundle", f"{UPLOAD} {shipped}"),
            server=("--port", str(port)),
        ),
        tmp_path,
    )
    launchers.append(launcher)
    assert launcher.exit_status(60) == code, launcher.tail()
    assert launcher.wait_for("server_exited")["status"] == code
    engine = int((state / "engine-0.pid").read_text())
    assert gone(engine), "the orphaned EngineCore was left running"
    assert len(recorded_starts(state)) == 1
    written = launcher.wait_for("crash_bundle_written")
    assert (written["status"], written["server_gone"]) == (code, True), written
    bundle = Path(written["bundle"])
    assert bundle.parent == tmp_path / "evidence"
    summary = json.loads((bundle / "summary.json").read_text())
    assert f"exited by itself with status {code}" in summary["reason"], summary
    history = (bundle / "history.jsonl").read_text().splitlines()
    assert len(history) >= 2, history  # the scrapes before the crash (every 0.5 s for 3 s)
    entries = [json.loads(line) for line in history]
    assert any(entry["engines"] and "running" in entry["engines"][0] for entry in entries), history
    assert (bundle / "metrics_manual.prom").read_bytes() == (
        FIXTURES / "deferred_wedge.prom"
    ).read_bytes()
    hooked = launcher.wait_for("bundle_hook_finished")  # on_bundle ran before the exit
    assert (hooked["result"], hooked["bundle"]) == ("ok", str(bundle)), hooked
    assert (shipped / bundle.name / "history.jsonl").read_text() == "\n".join(history) + "\n"


def test_watch_refuses_a_busy_watchdog_port_before_starting_the_server(tmp_path: Path) -> None:
    """The watchdog's own port is checked first, so no unwatched server is left running."""
    vllm, state = fake_vllm(tmp_path)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        done = subprocess.run(
            [
                *WEDGEWATCH,
                "launch",
                *launch_args(
                    vllm,
                    "--watch",
                    *watchdog_args(tmp_path, taken),
                    server=("--port", str(free_port())),
                ),
            ],
            capture_output=True,
            text=True,
            env={**clean, "CUDA_VISIBLE_DEVICES": "0,1"},
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert f"wedgewatch's own endpoints: port {taken} is already in use" in done.stderr
    assert recorded_starts(state) == []


def test_watch_restarts_the_wedged_simulator_and_its_whole_tree(
    tmp_path: Path, launchers: list[Launcher]
) -> None:
    """The real wedge through the vllm shim: EngineCore and both workers replaced, not orphaned."""
    shim = tmp_path / "shim"
    subprocess.run(
        [*WEDGEWATCH, "sim", "install-vllm-shim", str(shim)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    for attempt in range(3):  # whether a burst wedges depends on timing; a fresh try each time
        try_dir = tmp_path / f"try{attempt}"
        try_dir.mkdir()
        port, listen = free_port(), free_port()
        launcher = Launcher(
            launch_args(
                shim / "vllm",
                *("--profile", "tp2-offload", "--watch"),
                *watchdog_args(try_dir, listen),
                *("--stall-after-seconds", "5", "--hang-after-seconds", "30"),
                # vLLM 0.30.0 (the simulator's model) wedges on this traffic with full-ISL
                # admission off (30 of 30 seeds), on 1 of 30 with its default.
                server=(
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--no-scheduler-reserve-full-isl",
                ),
            ),
            try_dir,
        )
        launchers.append(launcher)
        launcher.wait_for("engine_discovered", timeout_seconds=60)
        load = subprocess.Popen(
            [*WEDGEWATCH, "sim", "load", "--url", f"http://127.0.0.1:{port}", *BURST_LOAD],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wedge = launcher.wait_for("wedge_detected", timeout_seconds=45)
        except AssertionError:
            load.kill()
            load.wait(timeout=30)
            launcher.proc.send_signal(signal.SIGTERM)
            launcher.proc.wait(timeout=60)
            continue
        break
    else:
        pytest.fail("no agentic burst wedged the simulator in three tries")
    assert wedge["family"] == "deferred_stall"
    # The clients stay connected until the restart: a client that gives up aborts its
    # requests, which frees the parked loads' blocks and ends the wedge (as in vLLM).
    try:
        restarted = launcher.wait_for("restart_completed", 120)
    finally:
        load.kill()
        load.wait(timeout=30)
    captured = [
        line
        for line in (restarted, *launcher.lines())
        if line.get("event") == "evidence_captured" and line.get("phase") == "wedged"
    ]
    summary = json.loads((Path(captured[0]["bundle"]) / "summary.json").read_text())
    old_tree = [*summary["pids"]["engine_core"], *summary["pids"]["worker"]]
    assert len(old_tree) == 3
    launcher.wait_for("restart_succeeded", timeout_seconds=60)
    assert all(gone(pid) for pid in old_tree), "a process of the wedged server survived"
    status = httpx.get(f"http://127.0.0.1:{listen}/status", timeout=5).json()
    assert status["targets"][0]["restarts"] == 1
    launcher.proc.send_signal(signal.SIGTERM)
    launcher.proc.wait(timeout=60)
    assert launcher.wait_for("server_stopped")["restarts"] == 1
