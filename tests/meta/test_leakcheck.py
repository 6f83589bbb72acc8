"""The leak check fails a session that leaves a process behind, and kills the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

TESTS = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # each test runs a pytest session of its own

LEAKY = '''
import subprocess, sys
from pathlib import Path

def test_leaves_a_sleeper_behind() -> None:
    """Starts a process in its own session and never stops it."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path(__file__).with_name("pid").write_text(str(proc.pid))

def test_tidy() -> None:
    """Starts a process and waits for it."""
    subprocess.run(["true"], check=True)
'''

TIDY = '''
import subprocess

def test_tidy() -> None:
    """Starts a process and waits for it."""
    subprocess.run(["true"], check=True)
'''


def _inner_session(tmp_path: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(TESTS / "support")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "leakcheck", "-p", "no:cacheprovider",
         *options, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip


SERIAL_AND_XDIST = pytest.mark.parametrize("options", [(), ("-n", "2")], ids=["serial", "xdist"])


@SERIAL_AND_XDIST
def test_a_session_that_leaks_a_process_fails_and_the_process_is_killed(
    tmp_path: Path, options: tuple[str, ...]
) -> None:
    """Both tests pass, yet the session fails: it left `sleep 300` alive; then it is gone.
    Under xdist the worker that ran the leaky test finds and kills it and the controller
    reports it and fails the run (the other worker's tidy test does not count)."""
    done = _inner_session(tmp_path, LEAKY, *options)
    pid = int((tmp_path / "pid").read_text())
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "still alive" in done.stdout
    assert f"pid {pid}: sleep 300" in done.stdout
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@SERIAL_AND_XDIST
def test_a_tidy_session_passes(tmp_path: Path, options: tuple[str, ...]) -> None:
    """A session whose processes all ended passes unchanged (under xdist: the workers' own
    processes are no leak)."""
    done = _inner_session(tmp_path, TIDY + TIDY.replace("test_tidy", "test_tidy_too"), *options)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "still alive" not in done.stdout
