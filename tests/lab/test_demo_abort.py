"""`wedgewatch demo --abort-first` end to end: both acts happen as told.

Act 2 (a frozen loop) is called a hang after the demo's `hang_after_seconds`, at least
`demo.HANG_FLOOR_SECONDS` (30 s). The default tier runs the same command with that floor
lowered in the demo's own process, so the hang is called at twice the stall threshold (20 s);
the demo's own timings run in the heavy tier (`soak`), and tests/lab/test_demo.py pins the
settings the demo uses.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# `python -m wedgewatch ARGS` with the demo's hang floor set first (the CLI, unchanged).
WITH_FLOOR = """\
import sys
from wedgewatch.lab import demo
demo.HANG_FLOOR_SECONDS = float(sys.argv.pop(1))
from wedgewatch.entry import main
main()
"""


@pytest.mark.parametrize(
    "hang_floor_seconds",
    [
        pytest.param(0.0, id="floor-lowered"),
        pytest.param(
            None,
            id="demo-timings",
            marks=pytest.mark.soak,  # a minute of real time: the heavy tier (tests/run.sh --real)
        ),
    ],
)
def test_demo_abort_first_cures_without_a_restart_then_restarts_a_frozen_loop(
    tmp_path: Path, hang_floor_seconds: float | None
) -> None:
    """Act 1: cure abort recovered, same pids, restarts 0; act 2: cure restart, new pids."""
    command = [sys.executable, "-m", "wedgewatch"]
    if hang_floor_seconds is not None:
        command = [sys.executable, "-c", WITH_FLOOR, f"{hang_floor_seconds:g}"]
    done = subprocess.run(
        [*command, "demo", "--abort-first", "--dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "VLLM_SERVER_DEV_MODE=1" in out
    assert "cure abort: recovered" in out
    assert "OK same pids before and after" in out
    assert "restarts 0, serving again: yes" in out
    assert "cure restart: recovered" in out
    assert "OK new pids" in out
    assert "act 1, the abort cure:   happened as told" in out
    assert "act 2, the restart:      happened as told" in out
    assert list((tmp_path / "demo" / "evidence").iterdir()), "no bundle"
