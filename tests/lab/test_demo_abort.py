"""`wedgewatch demo --abort-first` end to end: both acts happen as told."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from simproc import WEDGEWATCH

pytestmark = pytest.mark.slow


def test_demo_abort_first_cures_without_a_restart_then_restarts_a_frozen_loop(
    tmp_path: Path,
) -> None:
    """Act 1: cure abort recovered, same pids, restarts 0; act 2: cure restart, new pids."""
    done = subprocess.run(
        [*WEDGEWATCH, "demo", "--abort-first", "--dir", str(tmp_path / "demo")],
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
