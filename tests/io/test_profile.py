"""The wedge-time sampled profile: folded parsing (pure), then real `py-spy record` runs.

The real runs sample a child Python process that loops like a wedged vLLM engine: a short
busy function, then a sleep. Failure cases use real conditions (a pid that is gone, an
unprivileged py-spy, a missing executable) or a shell script standing in for a py-spy that
hangs; no Python call is patched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_pyspy import dead_pid, fake_pyspy, gone_or_zombie, unprivileged_prefix

from wedgewatch.core.evidence.profile import parse_folded
from wedgewatch.io.profile import PySpyProfiler, build_record_argv, profile_engines
from wedgewatch.io.pyspy import (
    PTRACE_FIX,
    PYSPY_MISSING_FIX,
    DumpStatus,
    PySpyRunner,
    resolve_pyspy,
)

PYSPY = resolve_pyspy("py-spy")
needs_pyspy = pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed")

# Like a wedged engine: each step does a little work (a fifth of a step), then sleeps.
BUSY_SLEEP = """
import time
def busy_step():
    deadline = time.perf_counter() + 0.0005
    while time.perf_counter() < deadline:
        pass
def engine_loop():
    while True:
        busy_step()
        time.sleep(0.002)
print("ready", flush=True)
engine_loop()
"""

FOLDED = (
    "<module> (e.py:11);engine_loop (e.py:10) 3\n"
    "<module> (e.py:11);engine_loop (e.py:9);Scheduler.schedule (/v/scheduler.py:4) 6\n"
    "<module> (e.py:11);engine_loop (e.py:9);Scheduler.schedule (/v/scheduler.py:5) 1\n"
    "garbage line\n"
)


@pytest.fixture
def busy() -> Iterator[subprocess.Popen[str]]:
    """A child looping `busy_step(); sleep(2 ms)` in its own process group."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY_SLEEP],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()


# ---------------------------------------------------------------- pure


def test_parse_folded_counts_shares_and_top_stacks() -> None:
    """Stacks are innermost first, merged across line numbers, sorted by samples."""
    profile = parse_folded(FOLDED)
    assert profile.samples == 10
    assert profile.share("schedule") == pytest.approx(0.7)
    assert profile.share("engine_loop") == 1.0
    assert profile.share("absent") == 0.0
    assert profile.stacks[0].frames == ("Scheduler.schedule", "engine_loop", "<module>")
    assert profile.stacks[0].files[0] == "/v/scheduler.py"
    summary = profile.summary(top=2)
    assert summary["samples"] == 10
    assert summary["function_share"] == {"schedule": 0.7}
    assert summary["top_stacks"] == [
        {"share": 0.7, "samples": 7, "stack": "Scheduler.schedule < engine_loop < <module>"},
        {"share": 0.3, "samples": 3, "stack": "engine_loop < <module>"},
    ]


def test_an_empty_profile_has_no_share() -> None:
    """Every sample idle: py-spy writes nothing; no division by zero."""
    profile = parse_folded("")
    assert profile.samples == 0
    assert profile.share("schedule") == 0.0
    assert profile.summary()["top_stacks"] == []


def test_record_argv_is_nonblocking_raw() -> None:
    """The exact py-spy record invocation (0.4: whole seconds, --nonblocking, raw format)."""
    argv = build_record_argv("/p", 7, 2, 50, Path("/t/f"), prefix=("setpriv", "-x"))
    assert argv == [
        "setpriv",
        "-x",
        "/p",
        "record",
        "--pid",
        "7",
        "--duration",
        "2",
        "--rate",
        "50",
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        "/t/f",
    ]


# ---------------------------------------------------------------- real py-spy


@needs_pyspy
async def test_profile_shows_the_busy_function_that_single_dumps_mostly_miss(
    busy: subprocess.Popen[str],
) -> None:
    """Idle samples are dropped, so the short busy step shows in the profile.

    py-spy's idle test is the thread's state: under CPU contention a thread just woken
    from its sleep waits runnable and its sleep line is kept too (measured at load 7 on 2
    cores: the busy step in 9-60 % of the kept samples), so only presence is asserted.
    """
    dumper = PySpyRunner(nonblocking=True, timeout_seconds=20)
    dumps = [await dumper.dump(busy.pid) for _ in range(8)]
    caught = [any("busy_step" in f.name for t in d.threads or () for f in t.frames) for d in dumps]
    result = await PySpyProfiler(seconds=2, rate_hz=100, timeout_seconds=20).profile(busy.pid)
    assert result.status is DumpStatus.OK, result.error
    assert result.profile is not None
    assert result.folded is not None
    assert "busy_step (<string>:" in result.folded
    assert result.profile.share("busy_step") > 0, result.folded
    assert result.profile.samples < 2 * 100  # idle samples were dropped
    assert not all(caught), "single dumps catch the sleep most of the time"
    assert busy.poll() is None  # never harmed
    record = result.to_json(2, 100)
    assert record["nonblocking"] is True
    assert record["file"] == f"profile-enginecore-{busy.pid}.folded"


@needs_pyspy
async def test_a_gone_process_is_recorded_without_running_pyspy() -> None:
    """A pid that no longer exists: `no_process`, as data."""
    pid = dead_pid()
    result = await PySpyProfiler(seconds=1).profile(pid)
    assert result.status is DumpStatus.NO_PROCESS
    assert result.error == f"process {pid} does not exist"


async def test_a_missing_pyspy_is_recorded_with_the_fix(busy: subprocess.Popen[str]) -> None:
    """No py-spy: `pyspy_missing` with the fix, and the round lists the failure."""
    profiler = PySpyProfiler(pyspy_path="/nonexistent/py-spy", seconds=1)
    taken = await profile_engines([busy.pid], profiler, 30.0)
    assert taken.files == {}
    assert taken.profiles == {}
    assert taken.records[0]["status"] == "pyspy_missing"
    assert taken.records[0]["fix"] == PYSPY_MISSING_FIX
    assert taken.failures == [
        f"py-spy record engine_core {busy.pid}: pyspy_missing: py-spy not found "
        f"(pyspy_path = '/nonexistent/py-spy') (fix: {PYSPY_MISSING_FIX})"
    ]


@needs_pyspy
async def test_an_unprivileged_pyspy_is_permission_denied(busy: subprocess.Popen[str]) -> None:
    """A py-spy without ptrace rights over the target: `permission_denied` with the fix."""
    prefix = unprivileged_prefix()
    if os.geteuid() != 0 or prefix is None:
        pytest.skip("needs root and setpriv or runuser to drop to nobody")
    result = await PySpyProfiler(seconds=1, argv_prefix=prefix).profile(busy.pid)
    assert result.status is DumpStatus.PERMISSION_DENIED, result.error
    assert result.fix == PTRACE_FIX


async def test_a_hung_pyspy_is_killed_at_its_hard_timeout(
    busy: subprocess.Popen[str], tmp_path: Path
) -> None:
    """A py-spy that never returns is killed (its group too) after seconds + timeout."""
    marker = tmp_path / "pid"
    script = fake_pyspy(tmp_path, f"echo $$ > {marker}\nexec sleep 60\n")
    profiler = PySpyProfiler(pyspy_path=script, seconds=1, timeout_seconds=0.5)
    result = await profiler.profile(busy.pid)
    assert result.status is DumpStatus.TIMEOUT
    assert result.error == "py-spy record did not finish within 1.5 s; killed"
    assert result.duration_seconds < 10
    assert gone_or_zombie(int(marker.read_text()))
    assert busy.poll() is None


async def test_no_time_left_before_the_deadline_is_a_timeout_without_a_run(
    busy: subprocess.Popen[str], tmp_path: Path
) -> None:
    """With less budget than the sampling needs, py-spy is not started at all."""
    marker = tmp_path / "ran"
    script = fake_pyspy(tmp_path, f"touch {marker}\n")
    result = await PySpyProfiler(pyspy_path=script, seconds=2).profile(busy.pid, 2.5)
    assert result.status is DumpStatus.TIMEOUT
    assert result.error == "2.5 s left before the capture deadline; not sampled"
    assert not marker.exists()


async def test_zero_seconds_profiles_nothing(busy: subprocess.Popen[str], tmp_path: Path) -> None:
    """`profile_seconds = 0` turns the profile off: py-spy is never started."""
    marker = tmp_path / "ran"
    script = fake_pyspy(tmp_path, f"touch {marker}\n")
    taken = await profile_engines([busy.pid], PySpyProfiler(script, seconds=0), 30.0)
    assert (taken.files, taken.failures, taken.records, taken.profiles) == ({}, [], [], {})
    assert not marker.exists()


async def test_no_engine_core_profiles_nothing_and_counts_no_time(tmp_path: Path) -> None:
    """No EngineCore proven: no py-spy, and the round's time is 0, not the clock's tick
    between two reads (a busy machine switching threads there made it 0.001 s)."""
    marker = tmp_path / "ran"
    ticks = iter(range(0, 1000, 7))
    profiler = PySpyProfiler(fake_pyspy(tmp_path, f"touch {marker}\n"), clock=lambda: next(ticks))
    taken = await profile_engines([], profiler, 30.0)
    assert (taken.seconds, taken.records, taken.failures) == (0.0, [], [])
    assert not marker.exists()
