"""`wedgewatch demo --real` as a user runs it: the story against a real vLLM 0.30.0.

The serving venv is the real tier's (built by `bash tests/run.sh --real`); the demo builds it
itself on first use, after saying its size and time (tests/lab/test_demo_real.py checks what it
says). Here the whole story must happen on a real server: the seed's wedge reached through the
API, detected as a deferred_stall, a wedged bundle, a real restart and recovery.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import real_vllm
from wedgewatch_daemon import WEDGEWATCH, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]  # two real start-ups under load


def test_the_real_demo_tells_the_whole_story(tmp_path: Path) -> None:
    real_vllm.serve_python("0.30.0")  # the venv the demo would otherwise build (and the marker)
    directory = tmp_path / "d"
    done = subprocess.run(
        [*WEDGEWATCH, "demo", "--real", "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=2300,
        check=False,
        env=clean_env(),
        start_new_session=True,
    )
    out = done.stdout
    assert done.returncode == 0, (out[-6000:], done.stderr[-3000:])
    assert "a real vLLM 0.30.0" in out, out[:3000]
    assert "deferred_stall" in out, out[-6000:]
    assert "RECOVERED" in out, out[-6000:]
    assert "#57841" in out, out[-6000:]
    bundles = [p for p in (directory / "evidence").rglob("summary.json")]
    assert bundles, sorted(str(p) for p in directory.rglob("*"))[:50]
    events = (directory / "connector-events.jsonl").read_text()
    assert '"deferred"' in events, events
    assert '"load"' in events, events
