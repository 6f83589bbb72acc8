"""Operations on a real `vllm serve` (vLLM's CPU build): restarts, TP=2, the launcher, bundles.

Every server is a real `vllm serve` of the tiny local model (tests/support/real_vllm.py); wedgewatch
runs as a user runs it (`wedgewatch run`, `capture`, `report`, `launch --watch`), and the
tests speak to both only over loopback HTTP and through processes. A real start costs
40-60 s on a quiet 2-core machine (minutes when it is busy), so each test starts as few
servers as its point needs. The measured figures are in docs/real-vllm.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import real_vllm
from ports import free_port

from tests.support.wedgewatch_daemon import DaemonProcess, clean_env
from wedgewatch.core.evidence.bundle_facts import bundle_facts
from wedgewatch.core.evidence.known_issues import match_known_issues, shipped_known_issues

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
REAL_TIMEOUT_S = 1800  # pytest-timeout for one test: starts can take minutes on a busy machine

pytestmark = pytest.mark.timeout(REAL_TIMEOUT_S)


@pytest.fixture
def short_tmp() -> Iterator[dict[str, str]]:
    """A TMPDIR for the server short enough for vLLM's ZMQ sockets (a unix socket path holds
    107 bytes; pytest's tmp_path under xdist is too deep for vLLM's uuid names)."""
    path = tempfile.mkdtemp(prefix="ww-", dir="/tmp")
    try:
        yield {"TMPDIR": path}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_wedgewatch(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """One `wedgewatch ...` command as a user types it (the test run's own WEDGEWATCH_*
    variables, such as run.sh --real's WEDGEWATCH_REQUIRE_VLLM, are not the user's)."""
    return subprocess.run(
        [*WEDGEWATCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=clean_env(),
    )


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def test_tp2_discovery_and_bundle_with_both_ranks_and_the_real_version(
    tmp_path: Path, short_tmp: dict[str, str]
) -> None:
    """TP=2 on a CPU (one core per rank): `wedgewatch capture` finds the API server, the
    EngineCore and both workers, and the bundle holds a py-spy dump of each; its build.json
    has the version the server reported (0.30.0), and the known issues judge that version
    with the server's real configuration (no offloading: not #57841)."""
    with real_vllm.running("0.30.0", tmp_path / "server", tp=2, env=short_tmp) as server:
        server.complete([1, 20, 30], max_tokens=4)
        engine = server.named("VLLM::EngineCore")
        ranks = {title: server.named(title) for title in ("VLLM::Worker_TP0", "VLLM::Worker_TP1")}
        assert len(engine) == 1, [p.cmdline() for p in server.processes()]
        assert all(len(found) == 1 for found in ranks.values()), ranks
        evidence = tmp_path / "evidence"
        done = run_wedgewatch(
            "capture", "--target", server.url, "--evidence-dir", str(evidence), "--json"
        )
        assert done.returncode == 0, done.stdout + done.stderr
        bundles = [p for p in evidence.iterdir() if p.is_dir()]
        assert len(bundles) == 1, bundles
        bundle = bundles[0]
        summary = _read_json(bundle / "summary.json")
        pids = summary["pids"]
        assert pids["api_server"] == [server.proc.pid], pids
        assert pids["engine_core"] == [engine[0].pid], pids
        assert sorted(pids["worker"]) == sorted(p[0].pid for p in ranks.values()), pids
        resource_trackers = [
            p.pid for p in server.processes() if "resource_tracker" in " ".join(p.cmdline())
        ]
        dumped = {p.name for p in (bundle / "pyspy").glob("*.txt")}
        expected = {
            f"api_server-{server.proc.pid}.txt",
            f"engine_core-{engine[0].pid}.txt",
            *(f"worker-{found[0].pid}.txt" for found in ranks.values()),
        }
        assert expected <= dumped, (dumped, summary)
        for pid in resource_trackers:  # the tracker is no vLLM role: listed, never dumped as one
            assert not any(
                name.endswith(f"-{pid}.txt") and not name.startswith("other") for name in dumped
            )
        for found in ranks.values():
            text = (bundle / "pyspy" / f"worker-{found[0].pid}.txt").read_text()
            assert "worker_busy_loop" in text or "Worker" in text or "execute_model" in text, text

    # build.json: the version the real server reported and its real command line
    build = _read_json(bundle / "build.json")
    assert build["version"]["version"] == "0.30.0", build.get("version")  # GET /version
    assert build["flags"]["--tensor-parallel-size"] == "2", build["flags"]
    assert summary.get("vllm_version") in (None, "0.30.0"), summary.get("vllm_version")

    # known issues on this real 0.30.0: told as if its engine had wedged the #57841 way
    # (deferred, running 0), the verdict follows the server's own configuration
    wedged_reading = {
        "engines": [
            {
                "engine": "0",
                "running": 0,
                "waiting": 4,
                "waiting_by_reason": {"deferred": 2, "capacity": 2},
                "kv_cache_usage": 0.95,
            }
        ]
    }
    as_wedged = {**summary, "family": "deferred_stall", "triage": {"kind": "scheduler_wedge"}}

    def refs(flags: dict[str, str]) -> dict[str, str]:
        facts = bundle_facts(as_wedged, {**build, "flags": flags}, [wedged_reading], (), workers=2)
        return {m.issue.ref: m.action for m in match_known_issues(shipped_known_issues(), facts)}

    without = refs(build["flags"])
    assert "#57841" not in without, without
    with_offload = refs({**build["flags"], "--kv-offloading-size": "1"})
    assert "#57841" in with_offload, with_offload
    assert "vLLM 0.30.0 is affected" in with_offload["#57841"], with_offload

    # the report renders the real bundle
    done = run_wedgewatch("report", str(bundle))
    assert done.returncode == 0, done.stdout + done.stderr
    markdown = (bundle / "report.md").read_text()
    assert "0.30.0" in markdown, markdown[:2000]
    for found in ranks.values():
        assert str(found[0].pid) in markdown, markdown[:3000]


# -- restarts: a real hang (SIGSTOP of the worker under load) and the remedies ------------------

RESTART_ALWAYS = Path(__file__).with_name("restart_always.py")
VERSION = "0.32.0"  # restarts do not depend on the version; one is enough
WATCH_ARGS = (
    *("--interval-seconds", "1", "--hang-after-seconds", "20", "--grace-seconds", "10"),
    # a real start takes 40-60 s on a quiet 2-core machine and minutes on a busy one
    *("--startup-timeout-seconds", "600", "--pyspy-timeout-seconds", "20"),
)


def gone(pid: int, create_time: float) -> bool:
    """That process has exited (a zombie counts; a reused pid is another process)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE or proc.create_time() != create_time
    except psutil.NoSuchProcess:
        return True


def titled(procs: list[psutil.Process], title: str) -> list[psutil.Process]:
    """The processes whose title starts with `title` (VLLM::EngineCore, VLLM::Worker)."""
    found = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            words = proc.cmdline()
            if words and words[0].startswith(title):
                found.append(proc)
    return found


def tree(pid: int) -> list[psutil.Process]:
    """A process and everything below it (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def health(url: str) -> int | None:
    """/health's status code, None when nothing answers."""
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return None


def wait_healthy(
    url: str, api: psutil.Process, deadline_s: float = real_vllm.START_DEADLINE_S
) -> float:
    """Wait for /health 200 from the server `api`; its start-up time in seconds."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert api.is_running(), f"the server {api.pid} exited during its start"
        if health(url) == 200:
            return time.time() - api.create_time()
        time.sleep(1)
    raise AssertionError(f"{url} not healthy within {deadline_s} s")


class Load:
    """Completions from a few threads, each sending one request after another until `stop`
    (requests a hung server never answers end when the server goes)."""

    def __init__(self, url: str, threads: int = 4) -> None:
        self.url = url
        self.stopped = threading.Event()
        self.answered = 0
        for _ in range(threads):
            threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        body = {
            "model": real_vllm.MODEL_NAME,
            "prompt": [1, 20, 30],
            "max_tokens": 400,
            "ignore_eos": True,
        }
        with httpx.Client(timeout=900) as client:
            while not self.stopped.is_set():
                try:
                    client.post(f"{self.url}/v1/completions", json=body).raise_for_status()
                except httpx.HTTPError:
                    return
                self.answered += 1

    def stop(self) -> None:
        self.stopped.set()


def hang_worker_under_load(url: str, workers: list[psutil.Process]) -> Load:
    """The real hang: SIGSTOP every worker while requests run (/health stays 200), kept only
    when the frozen /metrics shows them running (tests/real_vllm.stop_while_running)."""
    load = Load(url)
    real_vllm.stop_while_running(url, [w.pid for w in workers])
    load.stop()
    return load


class Supervised:
    """A real `vllm serve` run by restart_always.py (a Restart=always supervisor)."""

    def __init__(self, workdir: Path, mode: str, env: dict[str, str]) -> None:
        python = real_vllm.serve_python(VERSION)
        model = real_vllm.tiny_model(python)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True)
        self.pids_file = workdir / "pids.txt"
        self.log = workdir / "serve.log"
        self.mode = mode
        self.shm_before = real_vllm._shm_entries()
        argv = real_vllm.serve_argv(python, model, self.port)
        extra = {"VLLM_CACHE_ROOT": str(workdir / "vllm-cache"), **env}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(RESTART_ALWAYS),
                mode,
                str(self.pids_file),
                str(self.log),
                "--",
                *argv,
            ],
            env=real_vllm.serve_env(**extra),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def starts(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(x) for x in self.pids_file.read_text().split()]
        return []

    def start_number(self, n: int, deadline_s: float = 300) -> psutil.Process:
        """The API server of the n-th start (1-based), once it exists."""
        end = time.monotonic() + deadline_s
        while len(self.starts()) < n:
            assert self.proc.poll() is None, "the supervisor exited"
            assert time.monotonic() < end, f"no start number {n}"
            time.sleep(0.1)
        return psutil.Process(self.starts()[n - 1])

    def stop(self) -> None:
        """The supervisor first (no more starts), then every server group it started."""
        groups = [self.proc.pid] + (self.starts() if self.mode == "own-group" else [])
        for group in groups:
            for sig in (
                signal.SIGKILL if group == self.proc.pid else signal.SIGCONT,
                signal.SIGTERM,
            ):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)
        self.proc.wait(timeout=30)
        end = time.monotonic() + 30
        while time.monotonic() < end and any(real_vllm._group_alive(g) for g in groups):
            time.sleep(0.2)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        end = time.monotonic() + 30
        while time.monotonic() < end and any(real_vllm._group_alive(g) for g in groups):
            time.sleep(0.2)
        for name in real_vllm._shm_entries() - self.shm_before:
            with contextlib.suppress(OSError):
                (Path("/dev/shm") / name).unlink()


@pytest.fixture
def supervised(tmp_path: Path, short_tmp: dict[str, str]) -> Iterator[Callable[[str], Supervised]]:
    made: list[Supervised] = []

    def make(mode: str) -> Supervised:
        made.append(Supervised(tmp_path / "server", mode, short_tmp))
        return made[-1]

    yield make
    for sup in made:
        sup.stop()


def measured(**figures: object) -> None:
    """A measured figure for docs/real-vllm.md (shown with `pytest -s`)."""
    print("MEASURED", json.dumps(figures))


def restart_through_the_daemon(sup: Supervised, daemon_args: list[str], tmp_path: Path) -> None:
    """Hang the supervised server for real, let `wedgewatch run` restart it, and prove the new
    server: the restart counted once, and only after a new server answered."""
    first = sup.start_number(1)
    first_start = wait_healthy(sup.url, first)
    old = tree(first.pid)
    old_ids = {p.pid: p.create_time() for p in old}
    (old_engine,) = titled(old, "VLLM::EngineCore")
    workers = titled(old, "VLLM::Worker")
    assert workers, [p.cmdline() for p in old]
    trackers = [p.pid for p in old if "resource_tracker" in " ".join(p.cmdline())]
    daemon = DaemonProcess(["--target", f"real={sup.url}", *WATCH_ARGS, *daemon_args], tmp_path)
    try:
        end = time.monotonic() + 120
        while daemon.get("/status").json()["targets"][0]["state"] == "starting":
            assert time.monotonic() < end, "the daemon never scraped the server"
            time.sleep(0.5)
        hung_at = time.monotonic()
        hang_worker_under_load(sup.url, workers)
        assert health(sup.url) == 200  # the real hang: /health stays green
        wedge = daemon.wait_for("wedge_detected", timeout_seconds=600)
        assert wedge["family"] == "progress_stall", wedge
        daemon.wait_for("restart_completed", timeout_seconds=300)
        restarted_at = time.monotonic()
        end = time.monotonic() + 120
        while not all(gone(pid, created) for pid, created in old_ids.items()):
            assert time.monotonic() < end, [p for p, c in old_ids.items() if not gone(p, c)]
            time.sleep(0.2)
        assert sup.proc.poll() is None, "the supervisor was signalled"
        second = sup.start_number(2)
        assert second.pid != first.pid
        if health(sup.url) is None:  # the new server is loading: no success counted yet
            assert not daemon.events("restart_succeeded"), daemon.events("restart_succeeded")
        second_start = wait_healthy(sup.url, second)
        succeeded = daemon.wait_for("restart_succeeded", timeout_seconds=600)
        proven_at = time.monotonic()
        new = tree(second.pid)
        (new_engine,) = titled(new, "VLLM::EngineCore")
        assert new_engine.pid != old_engine.pid
        assert titled(new, "VLLM::Worker")
        body = {"model": real_vllm.MODEL_NAME, "prompt": [1, 20, 30], "max_tokens": 8}
        answer = httpx.post(f"{sup.url}/v1/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"], answer.text
        (target,) = daemon.get("/status").json()["targets"]
        assert target["restarts"] == 1, target
        assert len(daemon.events("restart_requested")) == 1
        assert len(daemon.events("restart_succeeded")) == 1
        assert not daemon.events("restart_failed"), daemon.events("restart_failed")
        assert len(sup.starts()) == 2  # nothing else was started (or killed and restarted)
        # the wedge's bundle names the real processes, not the resource tracker (a slow
        # /metrics while the server is busy may have left a suspect capture beside it)
        bundle = Path(succeeded["bundle"])
        assert bundle.parent == daemon.evidence_dir, bundle
        assert "progress_stall" in bundle.name, bundle
        summary = _read_json(bundle / "summary.json")
        assert summary["pids"]["api_server"] == [first.pid], summary["pids"]
        assert summary["pids"]["engine_core"] == [old_engine.pid], summary["pids"]
        assert sorted(summary["pids"]["worker"]) == sorted(w.pid for w in workers)
        assert not set(trackers) & {
            pid for role in ("api_server", "engine_core", "worker") for pid in summary["pids"][role]
        }
        assert _read_json(bundle / "build.json")["version"]["version"] == VERSION
        measured(
            remedy=daemon_args[1],
            first_start_s=round(first_start, 1),
            second_start_s=round(second_start, 1),
            hang_to_restart_done_s=round(restarted_at - hung_at, 1),
            hang_to_proven_s=round(proven_at - hung_at, 1),
            succeeded_detail=succeeded.get("detail"),
        )
    finally:
        daemon.stop()


def test_signal_remedy_restarts_a_really_hung_server(
    tmp_path: Path, supervised: Callable[[str], Supervised]
) -> None:
    """`remedy = "signal"`: the server shares its supervisor's process group, so wedgewatch
    signals the proven tree (API server, EngineCore, worker, resource tracker) one by one and
    never the supervisor; the supervisor starts a new server, which the daemon proves."""
    sup = supervised("same-group")
    restart_through_the_daemon(sup, ["--remedy", "signal"], tmp_path)


def test_exec_remedy_restarts_a_really_hung_server(
    tmp_path: Path, supervised: Callable[[str], Supervised]
) -> None:
    """`remedy = "exec"`: the operator's command kills the server's group (its pid from the
    supervisor's record); the supervisor starts a new server, which the daemon proves."""
    sup = supervised("own-group")
    kill = ["/bin/sh", "-c", 'kill -KILL "-$(tail -n 1 "$0")"', str(sup.pids_file)]
    restart_through_the_daemon(
        sup, ["--remedy", "exec", "--exec-command", shlex.join(kill)], tmp_path
    )


# -- `wedgewatch launch --watch` with the CPU profile: the `supervise` remedy ------------------


class LaunchProcess(DaemonProcess):
    """`wedgewatch launch ... --watch` as a child in its own session, its JSON log in a file
    (read back as `DaemonProcess` reads `wedgewatch run`'s)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.log_path = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*WEDGEWATCH, "launch", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def server(self) -> psutil.Process:
        """The `vllm serve` the launcher runs now (its one child)."""
        (child,) = psutil.Process(self.proc.pid).children()
        return child

    def stop(self, server_groups: set[int]) -> None:
        """SIGTERM the launcher (it stops its server); then make sure nothing is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=120)
        for group in {self.proc.pid, *server_groups}:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)


def test_launch_watch_cpu_profile_recovers_a_real_hang_then_reports_a_real_crash(
    tmp_path: Path, short_tmp: dict[str, str]
) -> None:
    """`wedgewatch launch --profile cpu-tiny --watch` runs vLLM's CPU build (the profile sets
    VLLM_TARGET_DEVICE=cpu, eager mode and the small KV cache; no GPU is asked for). A real
    hang (worker SIGSTOP under load) is restarted by the `supervise` remedy and proven by a
    new server; then a real crash (kill -9 of the new worker) takes the server down (vLLM
    exits with status 0 then), and the launcher writes a crash bundle and exits with the
    server's status (restarting a crashed server is its own supervisor's job)."""
    python = real_vllm.serve_python(VERSION)
    model = real_vllm.tiny_model(python)
    port, listen = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    shm_before = real_vllm._shm_entries()
    env = {
        k: v
        for k, v in real_vllm.serve_env(
            VLLM_CACHE_ROOT=str(tmp_path / "vllm-cache"), **short_tmp
        ).items()
        if not k.startswith("WEDGEWATCH_")
        and k not in ("VLLM_TARGET_DEVICE", "VLLM_NO_USAGE_STATS")
    }
    env.pop("NOTIFY_SOCKET", None)
    args = [
        *(
            "--model",
            str(model),
            "--profile",
            "cpu-tiny",
            "--vllm-bin",
            str(python.parent / "vllm"),
        ),
        *("--watch", "--listen-port", str(listen), "--state-dir", str(tmp_path / "state")),
        *("--evidence-dir", str(tmp_path / "evidence"), *WATCH_ARGS),
        *("--", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"),
    ]
    launcher = LaunchProcess(args, tmp_path / "launch.log", env)
    groups: set[int] = set()
    try:
        started = launcher.wait_for("server_started", timeout_seconds=300)
        first = psutil.Process(int(started["pid"]))
        groups.add(first.pid)
        assert "--enforce-eager" in first.cmdline()
        assert first.environ()["VLLM_TARGET_DEVICE"] == "cpu"  # from the profile
        first_start = wait_healthy(url, first)
        old = tree(first.pid)
        old_ids = {p.pid: p.create_time() for p in old}
        (old_engine,) = titled(old, "VLLM::EngineCore")
        hung_at = time.monotonic()
        hang_worker_under_load(url, titled(old, "VLLM::Worker"))
        wedge = launcher.wait_for("wedge_detected", timeout_seconds=600)
        assert wedge["family"] == "progress_stall", wedge
        assert wedge["remedy"] == "supervise"
        launcher.wait_for("restart_completed", timeout_seconds=300)
        assert all(gone(pid, created) for pid, created in old_ids.items())
        second = launcher.server()
        groups.add(second.pid)
        assert second.pid != first.pid
        if health(url) is None:  # loading: not counted yet
            assert not launcher.events("restart_succeeded")
        second_start = wait_healthy(url, second)
        launcher.wait_for("restart_succeeded", timeout_seconds=600)
        proven_at = time.monotonic()
        new = tree(second.pid)
        (new_engine,) = titled(new, "VLLM::EngineCore")
        assert new_engine.pid != old_engine.pid
        body = {"model": real_vllm.MODEL_NAME, "prompt": [1, 20, 30], "max_tokens": 8}
        answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        (target,) = httpx.get(f"http://127.0.0.1:{listen}/status", timeout=10).json()["targets"]
        assert target["restarts"] == 1, target
        assert len(launcher.events("restart_succeeded")) == 1

        # a real crash: the new worker killed; vLLM goes down, the launcher reports and exits
        (worker,) = titled(new, "VLLM::Worker")
        worker.send_signal(signal.SIGKILL)
        crashed = launcher.wait_for("crash_bundle_written", timeout_seconds=300)
        status = launcher.proc.wait(timeout=300)  # vLLM 0.32 exits 0 when its engine died
        assert crashed["status"] == status, (crashed, status)
        summary = _read_json(Path(crashed["bundle"]) / "summary.json")
        assert "exited by itself" in json.dumps(summary), summary
        assert len(launcher.events("restart_succeeded")) == 1  # a crash is not restarted here
        measured(
            remedy="supervise",
            first_start_s=round(first_start, 1),
            second_start_s=round(second_start, 1),
            hang_to_proven_s=round(proven_at - hung_at, 1),
            crash_status=status,
        )
    finally:
        launcher.stop(groups)
        for name in real_vllm._shm_entries() - shm_before:
            with contextlib.suppress(OSError):
                (Path("/dev/shm") / name).unlink()
