"""Signals reach exactly the process that was proven, never whatever now holds its pid.

Real children. The pid race is made real: the proven child exits, and the next child is
handed the same pid (through `/proc/sys/kernel/ns_last_pid`, where this process may write
it) in the same clock tick, so that psutil's own pid-reuse check (the create time, in
ticks of 10 ms) is fooled. A signal through the pidfd opened before must not reach it.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from wedgewatch.io.procs import PinnedProcess, pidfds_available, pin
from wedgewatch.io.restarters import _send

NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")
ATTEMPTS = 30


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "300"])


def _reuse_after(
    victim: subprocess.Popen[bytes], seen: psutil.Process
) -> subprocess.Popen[bytes] | None:
    """Kill and reap `victim`, then start a child with its pid and create time (or None)."""
    victim.kill()
    victim.wait()
    try:
        NS_LAST_PID.write_text(str(victim.pid - 1))
    except OSError:
        pytest.skip("this process may not set the next pid (ns_last_pid)")
    successor = _sleeper()
    if successor.pid == victim.pid and seen.is_running():  # psutil is fooled
        return successor
    successor.kill()
    successor.wait()
    return None


@pytest.fixture
def reused() -> Iterator[tuple[PinnedProcess, psutil.Process, subprocess.Popen[bytes]]]:
    """(a pin of a child that has exited, psutil's handle of it, the child now on its pid)."""
    if not pidfds_available():
        pytest.skip("no pidfds here: the psutil fallback is in use")
    for _ in range(ATTEMPTS):
        victim = _sleeper()
        seen = psutil.Process(victim.pid)
        pinned = pin(seen)
        assert pinned is not None
        successor = _reuse_after(victim, seen)
        if successor is None:
            pinned.close()
            continue
        try:
            yield pinned, seen, successor
        finally:
            pinned.close()
            successor.kill()
            successor.wait()
        return
    pytest.skip(f"no pid reused within one clock tick in {ATTEMPTS} attempts")


def test_a_pinned_process_that_exited_is_never_confused_with_its_pid_successor(
    reused: tuple[PinnedProcess, psutil.Process, subprocess.Popen[bytes]],
) -> None:
    """The pidfd refuses the signal (the process it names is gone); the successor lives."""
    pinned, _, successor = reused
    assert pinned.send_signal(signal.SIGTERM) is False
    assert successor.poll() is None


def test_the_signal_restarter_signals_through_the_pins_made_before_the_proof(
    reused: tuple[PinnedProcess, psutil.Process, subprocess.Popen[bytes]],
) -> None:
    """`_send` with the pins taken before the proof: the successor on the reused pid (which
    psutil's check takes for the proven process) gets no SIGKILL."""
    pinned, seen, successor = reused
    errors: list[str] = []
    _send([seen], None, signal.SIGKILL, errors, pins={seen.pid: pinned})
    assert errors == []
    assert successor.poll() is None


def test_a_pinned_live_process_is_signalled() -> None:
    """Pinned while alive, the signal arrives (pidfd, or the psutil fallback alike)."""
    child = _sleeper()
    try:
        pinned = pin(psutil.Process(child.pid))
        assert pinned is not None
        assert (pinned.pidfd is not None) == pidfds_available()
        fallback = PinnedProcess(psutil.Process(child.pid), None)
        assert pinned.send_signal(0) is True
        assert fallback.send_signal(signal.SIGTERM) is True
        assert child.wait(timeout=30) == -signal.SIGTERM
        pinned.close()
    finally:
        child.kill()
        child.wait()


def test_a_process_gone_before_the_pin_is_not_pinned() -> None:
    """A child that exited (and was reaped) before `pin` gives None: nothing to signal."""
    child = _sleeper()
    seen = psutil.Process(child.pid)
    child.kill()
    child.wait()
    assert pin(seen) is None
