"""A stand-in for the kubelet: one container, its startup, liveness and readiness probes, its
restarts.

`Kubelet` runs a container (a command, started in its own session as a container's
processes share one cgroup) and probes it the way the kubelet does:

* the startup probe runs every `startup.period_seconds` until it succeeds; liveness waits
  for it (Kubernetes suspends liveness and readiness until the startup probe passed);
* the liveness probe runs every `liveness.period_seconds`; a probe fails on an HTTP status
  outside 200-399, a non-zero exit of an exec probe, or no answer within
  `timeout_seconds`; after `failure_threshold` consecutive failures the container is
  killed (SIGTERM to its process group, SIGKILL after `termination_grace_seconds`) and
  started again, and `restarts` goes up, as `restartCount` does. A success resets the
  count of consecutive failures.
* the readiness probe (optional) runs every `readiness.period_seconds` once the startup
  probe of the current container passed, on its own schedule as the kubelet's prober
  workers do: a container starts not ready, is ready after one success (successThreshold
  1), and not ready again after `failure_threshold` consecutive failures; a restarted
  container is not ready until its startup probe passed and its readiness probe succeeded.
  `ready` is the pod's state as an Endpoints controller would see it; `readiness_results`
  and `readiness_changes` record every probe and every change.

Probes are real: HTTP GETs over loopback, or exec'd commands. The kubelet's crash back-off
(10 s doubling) is left out: it does not apply to liveness restarts before the container
ran 10 minutes, and a test waits for the budget, not for the back-off.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass(frozen=True, slots=True)
class HttpGet:
    """An httpGet probe."""

    url: str


@dataclass(frozen=True, slots=True)
class Exec:
    """An exec probe: the command runs, exit status 0 is success."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Probe:
    """A probe and its timing, with the kubelet's field names."""

    action: HttpGet | Exec
    period_seconds: float = 10.0
    timeout_seconds: float = 1.0
    failure_threshold: int = 3


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe run: when (monotonic), of which container start, and what it said."""

    at: float
    start: int
    ok: bool
    detail: str


@dataclass
class Kubelet:
    """Runs `command` as a container with a startup and a liveness probe; see the module."""

    command: Sequence[str]
    liveness: Probe
    startup: Probe
    log_dir: Path
    env: Mapping[str, str] | None = None
    termination_grace_seconds: float = 5.0
    readiness: Probe | None = None
    restarts: int = 0
    ready: bool = False
    liveness_results: list[ProbeResult] = field(default_factory=list)
    readiness_results: list[ProbeResult] = field(default_factory=list)
    readiness_changes: list[tuple[float, int, bool]] = field(default_factory=list)
    _started: int | None = None  # the container start whose startup probe passed
    _readiness_thread: threading.Thread | None = None
    restart_times: list[float] = field(default_factory=list)
    _proc: subprocess.Popen[bytes] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _error: BaseException | None = None

    def start(self) -> Kubelet:
        """Start the container and the probing thread."""
        self._start_container()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        self._thread.start()
        if self.readiness is not None:
            self._readiness_thread = threading.Thread(
                target=self._run_readiness, name="kubelet-readiness", daemon=True
            )
            self._readiness_thread.start()
        return self

    @property
    def pid(self) -> int | None:
        """The container's main process."""
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        """Stop probing and kill the container's whole process group."""
        self._stop.set()
        for thread in (self._thread, self._readiness_thread):
            if thread is not None:
                thread.join(timeout=60)
        self._kill_container(grace_seconds=0.0)
        if self._error is not None:
            raise self._error

    def _start_container(self) -> None:
        log = (self.log_dir / f"container-{self.restarts}.log").open("wb")
        try:
            self._proc = subprocess.Popen(
                list(self.command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=None if self.env is None else dict(self.env),
                start_new_session=True,
            )
        finally:
            log.close()

    def _kill_container(self, grace_seconds: float) -> None:
        proc = self._proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(grace_seconds, 0.01))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the rest of the cgroup, as the runtime does
        proc.wait(timeout=30)

    def _probe(self, probe: Probe) -> tuple[bool, str]:
        action = probe.action
        if isinstance(action, HttpGet):
            try:
                response = httpx.get(action.url, timeout=probe.timeout_seconds)
            except httpx.HTTPError as exc:
                return False, f"{type(exc).__name__}: {exc}"
            return (
                200 <= response.status_code < 400,
                f"HTTP {response.status_code} {response.text[:8000]}",
            )
        try:
            done = subprocess.run(
                list(action.argv),
                capture_output=True,
                text=True,
                timeout=probe.timeout_seconds,
                env=None if action.env is None else dict(action.env),
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, f"timed out after {probe.timeout_seconds} s"
        return done.returncode == 0, f"exit {done.returncode}: {done.stdout.strip()[:8000]}"

    def _sleep_until(self, instant: float) -> bool:
        """Sleep until `instant`; False when stopped meanwhile."""
        return not self._stop.wait(max(0.0, instant - time.monotonic()))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._one_container_life()
        except BaseException as exc:  # re-raised in stop()
            self._error = exc

    def _one_container_life(self) -> None:
        start = self.restarts
        next_at = time.monotonic()
        while True:  # the startup probe: liveness is suspended until it passes
            if not self._sleep_until(next_at):
                return
            next_at += self.startup.period_seconds
            if self._probe(self.startup)[0]:
                self._started = start
                break
        failures = 0
        next_at = time.monotonic() + self.liveness.period_seconds
        while True:
            if not self._sleep_until(next_at):
                return
            next_at += self.liveness.period_seconds
            ok, detail = self._probe(self.liveness)
            self.liveness_results.append(ProbeResult(time.monotonic(), start, ok, detail))
            failures = 0 if ok else failures + 1
            if failures >= self.liveness.failure_threshold:
                self._started = None
                self._set_ready(False, start)
                self._kill_container(self.termination_grace_seconds)
                self.restarts += 1
                self.restart_times.append(time.monotonic())
                self._start_container()
                return

    def _set_ready(self, ready: bool, start: int) -> None:
        if ready != self.ready:
            self.ready = ready
            self.readiness_changes.append((time.monotonic(), start, ready))

    def _run_readiness(self) -> None:
        try:
            self._readiness_loop()
        except BaseException as exc:  # re-raised in stop()
            self._error = exc

    def _readiness_loop(self) -> None:
        probe = self.readiness
        assert probe is not None
        failures = 0
        next_at = time.monotonic()
        while self._sleep_until(next_at):
            next_at += probe.period_seconds
            start = self.restarts
            if self._started != start:  # starting or restarting: not probed, not ready
                failures = 0
                self._set_ready(False, start)
                continue
            ok, detail = self._probe(probe)
            self.readiness_results.append(ProbeResult(time.monotonic(), start, ok, detail))
            failures = 0 if ok else failures + 1
            if ok:
                self._set_ready(True, start)
            elif failures >= probe.failure_threshold:
                self._set_ready(False, start)


def wait_for(predicate: Callable[[], bool], timeout_seconds: float, what: str) -> None:
    """Poll `predicate` every 0.2 s; fail with `what` after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_seconds} s waiting for {what}")
