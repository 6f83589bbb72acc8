"""Commands that cannot do their job exit non-zero: a capture or a reference onto a disk
that refuses the bytes says so and exits 1.

The full disk is real to the process: `ulimit -f` (RLIMIT_FSIZE) makes the kernel refuse
every write past 1 KiB with EFBIG, as a full disk refuses them with ENOSPC, without root
or a mounted filesystem.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _wedgewatch(args: list[str], *, file_limit_kib: int | None) -> subprocess.CompletedProcess[str]:
    """`wedgewatch ARGS`, its files limited to `file_limit_kib` KiB when given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    command = [sys.executable, "-m", "wedgewatch", *args]
    if file_limit_kib is not None:
        command = ["bash", "-c", f'ulimit -f {file_limit_kib} && exec "$@"', "bash", *command]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=120, check=False
    )


@pytest.fixture
def server_pid() -> Iterator[int]:
    """A process to capture (a plain Python child; the bundle notes what it lacks)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    yield child.pid
    child.kill()
    child.wait()


def test_capture_onto_a_full_disk_exits_1_and_says_what_failed(
    tmp_path: Path, server_pid: int
) -> None:
    """Writes refused by the kernel: the failure is printed and the exit is 1, not 0."""
    args = ["capture", "--pid", str(server_pid), "--evidence-dir", str(tmp_path / "ev")]
    done = _wedgewatch(args, file_limit_kib=1)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "failed: writing " in done.stderr
    assert "File too large" in done.stderr
    whole = _wedgewatch(args, file_limit_kib=None)  # the same capture with room succeeds
    assert whole.returncode == 0, whole.stderr[-2000:]


def test_config_reference_onto_a_full_disk_exits_1_without_a_traceback(tmp_path: Path) -> None:
    """`config reference -o FILE` that cannot write FILE: one line, exit 1."""
    done = _wedgewatch(["config", "reference", "-o", str(tmp_path / "ref.md")], file_limit_kib=1)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip() == f"wedgewatch: cannot write {tmp_path / 'ref.md'}: File too large"
