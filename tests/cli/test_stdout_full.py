"""A command whose standard output cannot take its output has not done its job: one line on
stderr, no traceback, and the command's failure status (`check` 3, every other command 1).

The full disk is `/dev/full`, which refuses every write with ENOSPC as a full filesystem
does; both buffering modes are tried, because a short output sits in the buffer until exit
(where Python would say "Exception ignored" and exit 120) and a long one fails at once.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always

from wedgewatch.io import stdout

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures"
MESSAGE = "wedgewatch: could not write to standard output: No space left on device"
BUFFERING = [pytest.param("", id="buffered"), pytest.param("1", id="unbuffered")]


def _onto_full_disk(args: list[str], unbuffered: str) -> subprocess.CompletedProcess[str]:
    """`wedgewatch ARGS > /dev/full`, as the console script runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    env["PYTHONUNBUFFERED"] = unbuffered
    entry = Path(sys.executable).with_name("wedgewatch")
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [str(entry), *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )


@pytest.mark.parametrize("unbuffered", BUFFERING)
@pytest.mark.parametrize(
    "args", [["--version"], ["config", "reference"], ["config", "show"]], ids=" ".join
)
def test_a_command_onto_a_full_disk_exits_1_with_one_line(args: list[str], unbuffered: str) -> None:
    done = _onto_full_disk(args, unbuffered)
    assert (done.returncode, done.stderr) == (1, MESSAGE + "\n")


@pytest.mark.parametrize("unbuffered", BUFFERING)
def test_check_onto_a_full_disk_is_unknown_in_both_modes(tmp_path: Path, unbuffered: str) -> None:
    """The one-shot check and the exec probe (its fast path, from cached settings, with
    --critical-only) exit UNKNOWN: a probe whose report is lost is broken, not passing."""
    body = (FIXTURES / "vllm-0.33.0" / "healthy_busy.prom").read_bytes()
    state = tmp_path / "probe.json"
    with ScriptedServer(always(Reply(body=body))) as server:
        one_shot = _onto_full_disk(
            ["check", server.url, "--for=0.1", "--interval-seconds=0.1"], unbuffered
        )
        probe = [
            "check",
            server.url,
            "--for=0",
            f"--state-file={state}",
            "--critical-only",
        ]
        first = _onto_full_disk(probe, unbuffered)  # the full CLI, which caches the settings
        fast = _onto_full_disk(probe, unbuffered)  # the entry point's fast path
    for done in (one_shot, first, fast):
        assert (done.returncode, done.stderr) == (3, MESSAGE + "\n")
    assert state.exists()  # the verdict's state was kept; only the report was lost


def test_an_error_of_the_command_itself_is_not_taken_for_the_output() -> None:
    """Standard output that flushes fine: another OSError is the command's own."""
    assert stdout.output_failure(OSError(errno.ENOSPC, "No space left on device")) is None


def test_the_failure_status_is_the_commands() -> None:
    assert stdout.EXIT_CHECK_OUTPUT_FAILED == 3
    assert stdout.EXIT_OUTPUT_FAILED == 1
