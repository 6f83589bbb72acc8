"""The one command runner, against real child processes: status, bounded output, deadline,
the whole group killed on timeout and on cancellation, failures as data."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from wedgewatch.io.runner import run_command

PY = sys.executable


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pid_in(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text.strip() else None


async def _wait_for_pid(path: Path) -> int:
    for _ in range(200):
        pid = _pid_in(path)
        if pid is not None:
            return pid
        await asyncio.sleep(0.025)
    raise AssertionError(f"{path} was never written")


def _with_grandchild(pid_file: Path, then: str) -> list[str]:
    """A command that starts a long-sleeping grandchild (pid to `pid_file`), then runs `then`."""
    return [
        PY,
        "-c",
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n" + then,
    ]


async def test_exit_status_and_both_outputs_come_back() -> None:
    """A command's exit status, stdout and stderr are returned as data."""
    result = await run_command(
        [PY, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
        timeout_seconds=30,
        stdout_bytes=1000,
        stderr_bytes=1000,
    )
    assert (result.returncode, result.timed_out, result.start_error) == (3, False, None)
    assert (result.stdout, result.stderr) == (b"out\n", b"err\n")
    assert (result.stdout_truncated, result.stderr_truncated) == (False, False)


async def test_output_is_bounded_head_or_tail_as_asked() -> None:
    """Only the asked-for head or tail of a large output is kept, and the cut is reported."""
    script = (
        "import sys\n"
        "sys.stdout.write('a' * 5_000_000 + 'END')\n"
        "sys.stderr.write('b' * 5_000_000 + 'LAST')\n"
    )
    head = await run_command(
        [PY, "-c", script], timeout_seconds=60, stdout_bytes=10, stderr_bytes=6
    )
    assert (head.stdout, head.stdout_truncated) == (b"a" * 10, True)
    assert (head.stderr, head.stderr_truncated) == (b"bbLAST", True)
    tail = await run_command(
        [PY, "-c", script],
        timeout_seconds=60,
        stdout_bytes=5,
        stderr_bytes=4,
        stdout_keep="tail",
        stderr_keep="head",
    )
    assert (tail.stdout, tail.stderr) == (b"aaEND", b"bbbb")


async def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """At the deadline the command and everything it started are killed, and it says so."""
    pid_file = tmp_path / "grandchild"
    started = time.monotonic()
    result = await run_command(
        _with_grandchild(pid_file, "time.sleep(60)"),
        timeout_seconds=1.0,
        stdout_bytes=100,
        stderr_bytes=100,
    )
    assert time.monotonic() - started < 10
    assert (result.returncode, result.timed_out) == (None, True)
    grandchild = int(pid_file.read_text())
    for _ in range(100):
        if not _alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not _alive(grandchild)


async def test_cancellation_kills_the_group_and_propagates(tmp_path: Path) -> None:
    """A cancelled caller leaves nothing running: the group is killed, CancelledError goes on."""
    pid_file = tmp_path / "grandchild"
    task = asyncio.create_task(
        run_command(
            _with_grandchild(pid_file, "time.sleep(60)"),
            timeout_seconds=60,
            stdout_bytes=100,
            stderr_bytes=100,
        )
    )
    grandchild = await _wait_for_pid(pid_file)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if not _alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not _alive(grandchild)


async def test_a_background_process_left_by_a_finished_command_is_left_alone(
    tmp_path: Path,
) -> None:
    """A command that exits normally returns at once; what it started in the background lives.

    An `exec` remedy may start the new server in the background; that server must survive.
    """
    pid_file = tmp_path / "grandchild"
    started = time.monotonic()
    result = await run_command(
        _with_grandchild(pid_file, "print('started')"),
        timeout_seconds=30,
        stdout_bytes=100,
        stderr_bytes=100,
    )
    grandchild = int(pid_file.read_text())
    try:
        assert time.monotonic() - started < 10
        assert (result.returncode, result.stdout) == (0, b"started\n")
        assert _alive(grandchild)
    finally:
        os.kill(grandchild, 9)


async def test_the_command_leads_its_own_session() -> None:
    """The command runs in a new session and process group, never in wedgewatch's."""
    result = await run_command(
        [PY, "-c", "import os; print(os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid())"],
        timeout_seconds=30,
        stdout_bytes=100,
        stderr_bytes=100,
    )
    assert result.stdout == b"True True\n"


async def test_env_replaces_the_environment_and_stdin_is_empty() -> None:
    """`env` is the command's whole environment; stdin reads as empty, never our terminal."""
    result = await run_command(
        [
            PY,
            "-c",
            "import os, sys; print(sorted(k for k in os.environ if k.startswith('WW_')),"
            " repr(sys.stdin.read()))",
        ],
        timeout_seconds=30,
        env={"WW_ONLY": "1", "PATH": os.environ.get("PATH", "")},
        stdout_bytes=200,
        stderr_bytes=100,
    )
    assert result.stdout == b"['WW_ONLY'] ''\n"


@pytest.mark.parametrize(
    ("make", "error"),
    [
        pytest.param(lambda d: d / "missing", FileNotFoundError, id="missing"),
        pytest.param(lambda d: d, PermissionError, id="not-executable"),
    ],
)
async def test_a_program_that_cannot_start_is_data(
    tmp_path: Path, make: Callable[[Path], Path], error: type[OSError]
) -> None:
    """A missing or non-executable program comes back as `start_error`, nothing raised."""
    program = make(tmp_path)
    result = await run_command(
        [str(program)], timeout_seconds=30, stdout_bytes=100, stderr_bytes=100
    )
    assert isinstance(result.start_error, error)
    assert (result.returncode, result.timed_out, result.started) == (None, False, False)
