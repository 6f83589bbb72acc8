"""`wedgewatch run` as a real child process, for the end-to-end and safety suites.

Its JSON log lines are read back as events, its HTTP endpoints are one GET away, and it
leads its own session so a test can kill its whole process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without wedgewatch's own settings or systemd's notify socket."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    env.pop("NOTIFY_SOCKET", None)
    env.update(extra)
    return env


class DaemonProcess:
    """A `wedgewatch run` child: its JSON log lines, its endpoints, its memory."""

    def __init__(
        self,
        args: list[str],
        tmp_path: Path,
        name: str = "daemon",
        env: dict[str, str] | None = None,
        command: list[str] | None = None,
    ) -> None:
        """`command` runs wedgewatch (default: this interpreter's `-m wedgewatch`)."""
        self.log_path = tmp_path / f"{name}.log"
        self.evidence_dir = tmp_path / "evidence"
        self.args = [
            *(WEDGEWATCH if command is None else command),
            "run",
            "--listen-port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
            "--evidence-dir",
            str(self.evidence_dir),
            *args,
        ]
        if env is None:
            env = clean_env()
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


@contextlib.contextmanager
def watching(url: str, tmp_path: Path, *args: str) -> Iterator[DaemonProcess]:
    """`wedgewatch run` watching `url` (target `real`), killed with its group at the end."""
    daemon = DaemonProcess(["--target", f"real={url}", *args], tmp_path)
    try:
        yield daemon
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(timeout=30)
