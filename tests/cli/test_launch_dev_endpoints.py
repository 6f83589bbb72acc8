"""The launcher turns vLLM's dev endpoints on only when the operator opts in, and says so."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
from simproc import WEDGEWATCH

from wedgewatch.lab.sim.vllm_shim import install_shim
from wedgewatch.launch import (
    DEV_MODE_ENV,
    LaunchCommand,
    build_command,
    dev_mode_notice,
    server_environment,
)
from wedgewatch.vllm.profiles import Profile

PLAIN = Profile()
READY = re.compile(r"Starting vLLM API server 0 on (http://127\.0\.0\.1:\d+)")


def command(*args: str, dev: bool = False, profile: Profile = PLAIN) -> LaunchCommand:
    return build_command(
        vllm_bin="vllm", model="m", profile=profile, extra_args=args, dev_endpoints=dev
    )


def test_dev_mode_is_set_only_by_the_flag_or_the_profile() -> None:
    """`--dev-endpoints` or `dev_endpoints = true` set VLLM_SERVER_DEV_MODE=1; nothing else."""
    assert DEV_MODE_ENV not in command().env
    assert command(dev=True).env[DEV_MODE_ENV] == "1"
    assert command(profile=Profile(dev_endpoints=True)).env[DEV_MODE_ENV] == "1"


def test_an_inherited_dev_mode_is_not_passed_to_the_server() -> None:
    """VLLM_SERVER_DEV_MODE=1 in the launcher's own environment does not reach the server;
    the launcher's note says why."""
    inherited = {"PATH": "/bin", DEV_MODE_ENV: "1"}
    assert DEV_MODE_ENV not in server_environment(command(), inherited)
    assert server_environment(command(dev=True), inherited)[DEV_MODE_ENV] == "1"
    (note,) = dev_mode_notice(command(), inherited)
    assert "not passed to the server" in note


def test_the_notice_lists_what_dev_mode_opens_and_where() -> None:
    """On all interfaces: the routes (abort and /collective_rpc among them) and the warning;
    on 127.0.0.1: loopback only."""
    (exposed,) = dev_mode_notice(command(dev=True), {})
    assert "/abort_requests" in exposed
    assert "/collective_rpc" in exposed
    assert "without --api-key" in exposed
    assert "0.0.0.0: anyone who reaches port 8000" in exposed
    (local,) = dev_mode_notice(command("--host", "127.0.0.1", dev=True), {})
    assert "loopback only" in local


def test_abort_first_without_dev_mode_is_called_out() -> None:
    """--watch --abort-first without --dev-endpoints: the cure cannot be sent; the note says so."""
    (note,) = dev_mode_notice(command(), {}, abort_first=True)
    assert "add --dev-endpoints" in note
    assert dev_mode_notice(command(), {}) == []


def test_launch_with_dev_endpoints_serves_the_abort_route(tmp_path: Path) -> None:
    """`wedgewatch launch --dev-endpoints` (the simulator's vllm shim): the launcher says dev mode
    is on, and the server answers /abort_requests (a 400 without a body, as vLLM)."""
    shim = install_shim(tmp_path / "bin")
    log_path = tmp_path / "launch.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*WEDGEWATCH, "launch", "--model", "tiny", "--vllm-bin", str(shim), "--dev-endpoints",
             "--", "--host", "127.0.0.1", "--port", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        match = None
        while match is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            match = READY.search(log_path.read_text(errors="replace"))
        assert match is not None, log_path.read_text(errors="replace")
        said = log_path.read_text(errors="replace")
        assert "development endpoints are ON" in said
        assert "loopback only" in said
        answer = httpx.post(match.group(1) + "/abort_requests", timeout=10)
        assert (answer.status_code, answer.json()) == (400, {"detail": "Invalid JSON format"})
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_watch_with_abort_first_is_accepted_and_warns_without_dev_endpoints() -> None:
    """`launch --watch --abort-first` (remedy supervise) runs; without --dev-endpoints it says
    the abort cannot be sent; with it, the command carries VLLM_SERVER_DEV_MODE=1."""
    argv = [*WEDGEWATCH, "launch", "--model", "m", "--vllm-bin", "nosuch", "--dry-run", "--watch",
            "--abort-first"]  # fmt: skip
    plain = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode == 0, plain.stderr
    assert "add --dev-endpoints" in plain.stderr
    opted = subprocess.run(
        [*argv, "--dev-endpoints"], capture_output=True, text=True, timeout=60, check=False
    )
    assert opted.returncode == 0, opted.stderr
    assert opted.stdout.startswith("VLLM_SERVER_DEV_MODE=1 ")
    assert "add --dev-endpoints" not in opted.stderr
