"""`wedgewatch doctor` against a real simulator on 127.0.0.1, dev mode on and off.

The machine's own facts are replaced where a test needs another machine: ptrace_scope 3, no
py-spy, the server listening on every interface.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from simproc import WEDGEWATCH, SimProcess, running
from wedgewatch_daemon import watching

from wedgewatch.config import Config, Target
from wedgewatch.core.restart.doctor import Finding
from wedgewatch.io import doctor

DEV = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
NOT_DEV = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}


@pytest.fixture(scope="module")
def dev_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """A simulator with vLLM's dev endpoints on."""
    with running(tmp_path_factory.mktemp("dev"), "sim", [], env=DEV) as sim:
        yield sim


@pytest.fixture(scope="module")
def plain_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    """A simulator without them."""
    with running(tmp_path_factory.mktemp("plain"), "sim", [], env=NOT_DEV) as sim:
        yield sim


def settings(url: str, **overrides: object) -> Config:
    return Config(
        targets=(Target(name="sim", url=url),),
        **{"remedy": "signal", "abort_first": True, **overrides},  # type: ignore[arg-type]
    )


def of(findings: list[Finding], check: str) -> Finding:
    (found,) = [f for f in findings if f.check == check]
    return found


def test_dev_mode_on_every_cure_works_here(dev_sim: SimProcess) -> None:
    """The abort endpoint is found in /openapi.json, the signal right and a real py-spy attach
    work: exit 0, and the dry probe aborted nothing (no SECURITY line but the start-up one)."""
    findings = doctor.examine(settings(dev_sim.url))
    assert of(findings, "abort").status == "ok"
    assert "/openapi.json lists /abort_requests" in of(findings, "abort").message
    assert of(findings, "remedy").status == "ok"
    assert of(findings, "py-spy attach").status == "ok"
    assert doctor.exit_code(findings) == 0
    assert "/abort_requests" not in dev_sim.log()


def test_dev_mode_off_the_abort_cure_fails(plain_sim: SimProcess) -> None:
    """Without VLLM_SERVER_DEV_MODE=1 abort_first cannot work: a failure with the fix, exit 1."""
    findings = doctor.examine(settings(plain_sim.url))
    abort = of(findings, "abort")
    assert abort.status == "fail"
    assert "does not list /abort_requests" in abort.message
    assert doctor.exit_code(findings) == 1


def test_ptrace_scope_3_and_no_py_spy_are_reported(dev_sim: SimProcess) -> None:
    """Simulated ptrace_scope=3 and a missing py-spy: both fail with their fixes."""
    lookups = replace(doctor.Lookups(), ptrace_scope=lambda: 3, resolve_pyspy=lambda _p: None)
    findings = doctor.examine(settings(dev_sim.url), lookups=lookups)
    assert of(findings, "ptrace").status == "fail"
    assert "reboot" in of(findings, "ptrace").fix
    assert of(findings, "py-spy").status == "fail"
    assert not [f for f in findings if f.check == "py-spy attach"]
    assert doctor.exit_code(findings) == 1


def test_dev_routes_on_every_interface_warn(dev_sim: SimProcess) -> None:
    """The server's listener on 0.0.0.0 (as vLLM binds without --host) with dev routes: warn."""
    lookups = replace(doctor.Lookups(), listens=lambda _pids, _port: ("0.0.0.0",))
    findings = doctor.examine(settings(dev_sim.url), lookups=lookups)
    assert of(findings, "exposure").status == "warn"
    assert doctor.exit_code(findings) == 0


def test_a_server_on_loopback_is_seen_on_loopback(dev_sim: SimProcess) -> None:
    """The real listener lookup finds the simulator's 127.0.0.1: no exposure warning."""
    findings = doctor.examine(settings(dev_sim.url))
    assert not [f for f in findings if f.check == "exposure"]


def test_an_exec_remedy_that_does_not_exist_fails(dev_sim: SimProcess) -> None:
    """remedy exec with a command that is not there: the restart cannot happen."""
    config = settings(dev_sim.url, remedy="exec", exec_command=("/nonexistent/restart-vllm",))
    assert of(doctor.examine(config), "remedy").status == "fail"


def test_the_command_prints_the_truth_and_exits_1(plain_sim: SimProcess, tmp_path: Path) -> None:
    """`wedgewatch doctor URL --abort-first --remedy signal` as an operator runs it."""
    done = subprocess.run(
        [*WEDGEWATCH, "doctor", plain_sim.url, "--abort-first", "--remedy", "signal"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**NOT_DEV, "WEDGEWATCH_STATE_DIR": str(tmp_path)},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL abort:" in done.stdout
    assert "fix: start the server with VLLM_SERVER_DEV_MODE=1" in done.stdout
    assert "ok   remedy:" in done.stdout


def test_run_logs_one_line_per_problem_at_start(plain_sim: SimProcess, tmp_path: Path) -> None:
    """`wedgewatch run --abort-first` against a server without dev mode: at start the daemon
    logs `doctor_fail` for the abort check, with its fix, and keeps running."""
    with watching(plain_sim.url, tmp_path, "--remedy", "signal", "--abort-first") as daemon:
        line = daemon.wait_for("doctor_fail", timeout_seconds=60, check="abort")
        assert "VLLM_SERVER_DEV_MODE=1" in line["fix"]
        assert line["target"] == "real"
        assert daemon.get("/health").status_code == 200
