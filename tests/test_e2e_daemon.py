"""`wedgewatch run` as a real process against real servers on 127.0.0.1 (slow).

Misbehaving HTTP servers (garbage, a 200 MB body, a trickling body, a refused port, HTML)
test that bad input is data; a static wedged exposition with an `exec` remedy tests the
restart budget across a `kill -9`; the simulator tests detection, evidence, triage, the
signal remedy under a supervising parent, the fault families and the absence of false
alarms.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from scripted_http import RefusingPort, Reply, ScriptedServer, always, zeros

pytestmark = pytest.mark.slow

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
FIXTURES = Path(__file__).parent / "fixtures"


class DaemonProcess:
    """A `wedgewatch run` child: its JSON log lines, its endpoints, its memory."""

    def __init__(self, args: list[str], tmp_path: Path, name: str = "daemon") -> None:
        self.log_path = tmp_path / f"{name}.log"
        self.args = [
            *WEDGEWATCH,
            "run",
            "--listen-port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
            "--evidence-dir",
            str(tmp_path / "evidence"),
            *args,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
        env.pop("NOTIFY_SOCKET", None)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        listening = self.wait_for("http_listening", timeout_seconds=30)
        self.base_url = f"http://127.0.0.1:{listening['port']}"

    def lines(self) -> list[dict[str, Any]]:
        """Every JSON log line so far (non-JSON lines are kept as {'event': '<text>'})."""
        out = []
        for raw in self.log_path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(raw))
            except json.JSONDecodeError:
                out.append({"event": "<text>", "text": raw})
        return out

    def events(self, name: str, **match: Any) -> list[dict[str, Any]]:
        """Log lines with this event name whose fields match `match`."""
        return [
            line
            for line in self.lines()
            if line.get("event") == name and all(line.get(k) == v for k, v in match.items())
        ]

    def wait_for(self, name: str, timeout_seconds: float = 60, **match: Any) -> dict[str, Any]:
        """The first log line `name` (matching `match`), waiting for it up to the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            found = self.events(name, **match)
            if found:
                return found[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        raise AssertionError(f"no {name} {match} within {timeout_seconds} s; log tail:\n{tail}")

    def get(self, path: str) -> httpx.Response:
        """GET one of the daemon's endpoints."""
        return httpx.get(self.base_url + path, timeout=10)

    def rss_bytes(self) -> int:
        """Resident memory of the daemon process."""
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def stop(self) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill9(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemons and makes sure none outlives the test."""
    started: list[DaemonProcess] = []

    def start(args: list[str], name: str = "daemon") -> DaemonProcess:
        daemon = DaemonProcess(args, tmp_path, name)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.proc.kill()
            daemon.proc.wait(timeout=30)


# -- bad input -----------------------------------------------------------------------------------


def test_bad_targets_are_data_not_crashes(daemons: Callable[..., DaemonProcess]) -> None:
    """Garbage, 200 MB, trickling, refused and HTML targets: a clear reason each, no wedge."""
    garbage = Reply(200, b"this is not prometheus {{{\n\x00\xff\n", {"Content-Type": "text/plain"})
    huge = Reply(200, zeros(200 * 1024 * 1024), {"Content-Type": "text/plain"}, 200 * 1024 * 1024)
    trickle = Reply(
        200,
        (b"# HELP x y\n" for _ in range(100_000)),
        {"Content-Type": "text/plain"},
        chunk_pause_seconds=0.2,
    )
    html = Reply(200, b"<html><body>Login required</body></html>", {"Content-Type": "text/html"})
    idle = Reply(200, (FIXTURES / "idle.prom").read_bytes(), {"Content-Type": "text/plain"})
    with (
        ScriptedServer(always(garbage)) as s_garbage,
        ScriptedServer(always(huge)) as s_huge,
        ScriptedServer(always(trickle)) as s_trickle,
        ScriptedServer(always(html)) as s_html,
        ScriptedServer(always(idle)) as s_idle,
        RefusingPort() as refused,
    ):
        targets = {
            "garbage": s_garbage.base_url,
            "huge": s_huge.base_url,
            "trickle": s_trickle.base_url,
            "html": s_html.base_url,
            "refused": refused.url,
            "idle": s_idle.base_url,
        }
        args = ["--interval-seconds", "1", "--scrape-timeout-seconds", "2"]
        for name, url in targets.items():
            args += ["--target", f"{name}={url}"]
        daemon = daemons(args)
        expected = {
            "garbage": "parse_error",
            "huge": "too_large",
            "trickle": "timeout",
            "html": "parse_error",
            "refused": "refused",
        }
        for name, reason in expected.items():
            line = daemon.wait_for("scrape_failed", timeout_seconds=30, target=name)
            assert line["reason"] == reason, line
        html_line = daemon.events("scrape_failed", target="html")[0]
        assert "text/html" in html_line["detail"]
        peak = 0
        for _ in range(10):  # keep feeding it bad input for a while
            time.sleep(1)
            peak = max(peak, daemon.rss_bytes())
            assert daemon.get("/health").status_code == 200
        status = daemon.get("/status").json()
        states = {t["name"]: t["state"] for t in status["targets"]}
        assert states["idle"] == "idle"
        assert all(states[name] == "starting" for name in expected), states
        for name in expected:  # one line per change of reason, not one per scrape
            assert len(daemon.events("scrape_failed", target=name)) == 1
        assert daemon.events("wedge_detected") == []
        assert peak < 200 * 1024 * 1024, f"RSS peaked at {peak / 2**20:.0f} MiB"
        assert daemon.stop() == 0


# -- restart budget across kill -9 -----------------------------------------------------------------


def test_restart_budget_holds_across_kill_9(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Restarts done before wedgewatch is SIGKILLed count against the budget of the next one."""
    wedged = Reply(
        200, (FIXTURES / "deferred_wedge.prom").read_bytes(), {"Content-Type": "text/plain"}
    )
    restarts = tmp_path / "restarts.txt"
    command = f"sh -c 'echo restarted >> {shlex.quote(str(restarts))}'"
    with ScriptedServer(always(wedged)) as server:
        args = [
            "--target",
            f"sim={server.base_url}",
            "--interval-seconds",
            "0.5",
            "--stall-after-seconds",
            "2",
            "--remedy",
            "exec",
            "--exec-command",
            command,
            "--restart-budget",
            "2",
            "--restart-backoff-seconds",
            "1",
            "--restart-backoff-max-seconds",
            "1",
        ]
        first = daemons(args, name="first")
        first.wait_for("restart_succeeded", timeout_seconds=60)
        first.kill9()
        assert restarts.read_text().count("restarted") == 1

        second = daemons(args, name="second")
        restored = second.wait_for("state_restored", timeout_seconds=30)
        assert restored["restart_budget_remaining"] == 1
        second.wait_for("gave_up", timeout_seconds=60)
        time.sleep(3)  # it stays given up: no further restart
        assert restarts.read_text().count("restarted") == 2
        status = second.get("/status").json()["targets"][0]
        assert status["gave_up"] is True
        assert second.get("/probe").status_code == 503
        assert second.stop() == 0


def test_second_daemon_on_one_state_dir_is_refused(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Two watchdogs on one state_dir would restart one server twice: the second exits 2."""
    with RefusingPort() as refused:
        first = daemons(["--target", refused.url])
        second = subprocess.run(
            [
                *WEDGEWATCH,
                "run",
                "--target",
                refused.url,
                "--listen-port",
                "0",
                "--state-dir",
                str(tmp_path / "state"),
                "--evidence-dir",
                str(tmp_path / "evidence"),
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2
        assert b"in use by another wedgewatch" in second.stderr
        assert first.stop() == 0
