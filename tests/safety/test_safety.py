"""Adversarial safety suite (issue #11): real processes and servers on 127.0.0.1 (slow).

Each test attacks one promise: wedgewatch never signals or py-spies a process that is not
proven to be the watched vLLM server; never accepts `signal` for a server on another host;
never counts a restart that did not replace the server; never restarts a server its
supervisor is already restarting; never prints a secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from scripted_http import Reply, ScriptedServer, always
from wedgewatch_daemon import WEDGEWATCH, DaemonProcess, clean_env

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures"
SERVER = Path(__file__).parents[1] / "support" / "safety_server.py"
WEDGED = (FIXTURES / "deferred_wedge.prom").read_bytes()
IDLE = (FIXTURES / "idle.prom").read_bytes()
# Fast thresholds: a wedge within about a second, restarts a second apart.
FAST = [
    "--interval-seconds", "0.2",
    "--stall-after-seconds", "1",
    "--hang-after-seconds", "1",
    "--unreachable-after-seconds", "1",
    "--restart-backoff-seconds", "1",
    "--restart-backoff-max-seconds", "1",
    "--pyspy-timeout-seconds", "5",
]  # fmt: skip


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemons; none outlives the test (each leads its own session: the whole group)."""
    started: list[DaemonProcess] = []

    def start(args: list[str], env: dict[str, str] | None = None) -> DaemonProcess:
        daemon = DaemonProcess(args, tmp_path, env=env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        if daemon.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(daemon.proc.pid, signal.SIGKILL)
            daemon.proc.wait(timeout=30)


class StandIn:
    """A server process started by `safety_server.py`: its pid, port and /metrics body."""

    def __init__(self, directory: Path, proc: subprocess.Popen[bytes]) -> None:
        self.directory = directory
        self.proc = proc
        deadline = time.monotonic() + 30
        while not (directory / "port").exists():
            assert time.monotonic() < deadline, "the stand-in server did not start"
            assert proc.poll() is None, "the stand-in server exited"
            time.sleep(0.02)
        self.port = int((directory / "port").read_text())
        self.pid = proc.pid

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT."""
        return f"http://127.0.0.1:{self.port}"

    def serve(self, body: bytes) -> None:
        """What /metrics answers from now on."""
        tmp = self.directory / "body.tmp"
        tmp.write_bytes(body)
        tmp.rename(self.directory / "body.prom")

    def alive(self) -> bool:
        """Still running (not a zombie)."""
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def crash(self) -> None:
        """Exit at once: the port is refused from now on."""
        (self.directory / "exit").touch()
        self.proc.wait(timeout=10)


@pytest.fixture
def stand_ins(tmp_path: Path) -> Iterator[Callable[..., StandIn]]:
    """Starts stand-in server processes (own sessions); kills them and their children after."""
    started: list[StandIn] = []

    def start(
        body: bytes, *args: str, env: dict[str, str] | None = None, name: str = "server"
    ) -> StandIn:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "body.prom").write_bytes(body)
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(directory), *args],
            env=env if env is not None else clean_env(),
            start_new_session=True,
        )
        stand_in = StandIn(directory, proc)
        started.append(stand_in)
        return stand_in

    yield start
    for stand_in in started:
        if stand_in.proc.poll() is None:
            os.killpg(stand_in.pid, signal.SIGKILL)
            stand_in.proc.wait(timeout=10)


def _bundle_files(evidence_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(evidence_dir)): p.read_bytes()
        for p in evidence_dir.rglob("*")
        if p.is_file()
    }


def _metric(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


# -- wrong process -----------------------------------------------------------------------------


def test_a_non_vllm_process_on_the_target_port_is_never_signalled_nor_dumped(
    daemons: Callable[..., DaemonProcess], stand_ins: Callable[..., StandIn]
) -> None:
    """Whatever answers on the port, without an EngineCore it is not signalled nor py-spied."""
    impostor = stand_ins(WEDGED)  # a wedged-looking /metrics, but no vLLM process tree
    daemon = daemons(
        ["--target", f"t={impostor.base_url}", "--remedy", "signal", *FAST, "--restart-budget", "2"]
    )
    failed = daemon.wait_for("restart_failed", timeout_seconds=60, reason="not_vllm")
    assert "not proven to be the vLLM server" in failed["detail"]
    assert str(impostor.pid) in failed["detail"]
    daemon.wait_for("evidence_captured", timeout_seconds=30, phase="wedged")
    time.sleep(1.5)  # the retry after the back-off is refused too
    assert impostor.alive()
    status = daemon.get("/status").json()["targets"][0]
    assert status["last_restart_failure"]["reason"] == "not_vllm"
    metrics = daemon.get("/metrics").text
    assert (_metric(metrics, "wedgewatch_restart_failures_total", reason="not_vllm") or 0) >= 1
    files = _bundle_files(daemon.evidence_dir)
    assert files, "a bundle is still written (metrics, history, processes)"
    assert not [name for name in files if "/pyspy/" in name]
    assert not [name for name in files if "/profile-" in name]  # nor sampled (py-spy record)
    summaries = [json.loads(data) for name, data in files.items() if name.endswith("summary.json")]
    assert any("stacks skipped" in json.dumps(s) for s in summaries)
    wedge_rounds = [s["phases"]["wedged"] for s in summaries if "wedged" in s["phases"]]
    assert wedge_rounds
    assert all(r["profiles"] == [] for r in wedge_rounds)
    assert daemon.stop() == 0
    assert impostor.alive()


def test_a_remote_target_with_signal_is_refused_at_config_time(tmp_path: Path) -> None:
    """`remedy = "signal"` for a server on another host: exit 2 naming the target, no start."""
    config = tmp_path / "wedgewatch.toml"
    config.write_text(
        'remedy = "signal"\n[[targets]]\nname = "far"\nurl = "http://192.0.2.7:8000"\n'
    )
    checked = subprocess.run(
        [*WEDGEWATCH, "config", "check", str(config)],
        capture_output=True, text=True, timeout=60, env=clean_env(), check=False,
    )  # fmt: skip
    assert checked.returncode == 2
    assert "target 'far'" in checked.stderr
    assert "192.0.2.7 is not this machine" in checked.stderr
    run = subprocess.run(
        [
            *WEDGEWATCH, "run", "--config", str(config), "--listen-port", "0",
            "--state-dir", str(tmp_path / "state"),
        ],
        capture_output=True, text=True, timeout=60, env=clean_env(), check=False,
    )  # fmt: skip
    assert run.returncode == 2
    assert "target 'far'" in run.stderr


# -- a restart that did not happen ---------------------------------------------------------------


def test_a_fast_exec_remedy_whose_server_never_changes_is_not_replaced(
    daemons: Callable[..., DaemonProcess], stand_ins: Callable[..., StandIn]
) -> None:
    """`exec` returns at once and the old wedged server keeps answering: not_replaced."""
    server = stand_ins(WEDGED, "--engine-child")
    daemon = daemons(
        [
            "--target", f"t={server.base_url}", "--remedy", "exec",
            "--exec-command", "true", "--startup-timeout-seconds", "3", *FAST,
        ]
    )  # fmt: skip
    daemon.wait_for("restart_completed", timeout_seconds=60)
    failed = daemon.wait_for("restart_failed", timeout_seconds=30)
    assert failed["reason"] == "not_replaced", failed
    assert "process_start_time_seconds unchanged" in failed["detail"]
    assert daemon.events("restart_succeeded") == []
    status = daemon.get("/status").json()["targets"][0]
    assert status["last_restart_failure"]["reason"] == "not_replaced"
    assert daemon.stop() == 0


def test_a_replaced_server_counts_as_restarted(
    daemons: Callable[..., DaemonProcess], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """When the remedy brings a new server (new process_start_time_seconds), it succeeds."""
    server = stand_ins(WEDGED, "--engine-child")
    new_body = WEDGED.replace(
        b"process_start_time_seconds 1.79620356444e+09", b"process_start_time_seconds 1.9e+09"
    )
    assert new_body != WEDGED
    swap = tmp_path / "new.prom"
    swap.write_bytes(new_body)
    command = f"cp {swap} {server.directory / 'body.prom'}"
    daemon = daemons(
        [
            "--target", f"t={server.base_url}", "--remedy", "exec",
            "--exec-command", command, "--startup-timeout-seconds", "10", *FAST,
        ]
    )  # fmt: skip
    succeeded = daemon.wait_for("restart_succeeded", timeout_seconds=60)
    assert "process_start_time_seconds changed" in succeeded["detail"]
    assert daemon.stop() == 0


# -- double restarts ----------------------------------------------------------------------


def _fake_systemctl(directory: Path) -> Path:
    """A stand-in `systemctl` first on PATH: `show` prints DIR/state, `restart` is logged."""
    directory.mkdir()
    (directory / "state").write_text("ActiveState=activating\nSubState=auto-restart\n")
    script = directory / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {directory / "calls"}\n'
        'for a in "$@"; do [ "$a" = show ] && exec cat ' + str(directory / "state") + "; done\n"
        "exit 0\n"
    )
    script.chmod(0o755)
    return directory


def _wait_for_restart_call(fake: Path) -> None:
    """Wait (bounded) until the stand-in systemctl was asked to restart the unit."""
    deadline = time.monotonic() + 30
    calls = fake / "calls"  # written by the stand-in's first run, which may still be to come
    while not calls.exists() or not [
        c for c in calls.read_text().splitlines() if "restart" in c.split()
    ]:
        assert time.monotonic() < deadline, "systemctl restart was never run"
        time.sleep(0.1)


def test_a_crashed_server_under_a_restarting_supervisor_gets_no_second_restart(
    daemons: Callable[..., DaemonProcess], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """Refused while systemd says auto-restart: waited out; restarted only once systemd gave up."""
    fake = _fake_systemctl(tmp_path / "bin")
    server = stand_ins(IDLE, "--engine-child")
    env = clean_env(PATH=f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    daemon = daemons(
        [
            "--target", f"t={server.base_url}", "--remedy", "systemd",
            "--systemd-unit", "vllm.service", *FAST,
        ],
        env=env,
    )  # fmt: skip
    daemon.wait_for("engine_discovered", timeout_seconds=30)
    server.crash()
    daemon.wait_for("target_unreachable", timeout_seconds=30, scrape_failure="refused")
    waiting = daemon.wait_for("restart_waiting", timeout_seconds=30)
    assert "systemd is already restarting vllm.service" in waiting["reason"]
    time.sleep(2)
    calls = (fake / "calls").read_text().splitlines()
    assert not [c for c in calls if "restart" in c.split()]
    status = daemon.get("/status").json()["targets"][0]
    assert "already restarting" in (status["waiting_for_supervisor"] or "")
    # systemd gave up (its start limit): now wedgewatch restarts it itself.
    (fake / "state").write_text("ActiveState=failed\nSubState=failed\n")
    daemon.wait_for("restart_requested", timeout_seconds=30)
    _wait_for_restart_call(fake)
    assert daemon.stop() == 0


def test_an_api_hang_is_restarted_whatever_the_supervisor_says(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Up, then it accepts but never answers (timeout, not refused): restarted as before."""
    fake = _fake_systemctl(tmp_path / "bin")
    idle = Reply(200, IDLE, {"Content-Type": "text/plain"})
    hang = Reply(200, IDLE, {"Content-Type": "text/plain"}, headers_pause_seconds=3600)
    with ScriptedServer(lambda n, path: idle if n < 5 else hang) as server:
        env = clean_env(PATH=f"{fake}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        daemon = daemons(
            [
                "--target", f"t={server.base_url}", "--remedy", "systemd",
                "--systemd-unit", "vllm.service", "--scrape-timeout-seconds", "0.5", *FAST,
            ],
            env=env,
        )  # fmt: skip
        unreachable = daemon.wait_for("target_unreachable", timeout_seconds=60, engine="0")
        assert unreachable["scrape_failure"] == "timeout"
        daemon.wait_for("restart_requested", timeout_seconds=60)
        _wait_for_restart_call(fake)
        assert daemon.events("restart_waiting") == []
        assert daemon.stop() == 0


# -- secrets ------------------------------------------------------------------------------


def test_no_secret_reaches_logs_status_config_show_or_a_bundle(
    daemons: Callable[..., DaemonProcess], stand_ins: Callable[..., StandIn], tmp_path: Path
) -> None:
    """Webhook path and query, URL credentials and HF_TOKEN never show up anywhere printed."""
    secrets = ["WEBHOOKPATHSECRET", "WEBHOOKQUERYSECRET", "URLPASSSECRET", "hf_ARGSECRET",
               "hf_FLAGSECRET", "hf_ENVSECRET", "APIKEYSECRET"]  # fmt: skip
    server = stand_ins(
        WEDGED,
        "--engine-child",
        "HF_TOKEN=hf_ARGSECRET",
        "--hf-token",
        "hf_FLAGSECRET",
        "--api-key=APIKEYSECRET",
        env=clean_env(HF_TOKEN="hf_ENVSECRET"),  # noqa: S106 - a planted test secret
    )
    refuse = Reply(500, b"nope", {"Content-Type": "text/plain"})
    with ScriptedServer(always(refuse)) as hook:
        webhook = f"{hook.base_url}/services/T0/WEBHOOKPATHSECRET?token=WEBHOOKQUERYSECRET"
        target = f"t=http://admin:URLPASSSECRET@127.0.0.1:{server.port}"
        args = ["--target", target, "--webhook-url", webhook, "--webhook-retries", "1", *FAST]
        daemon = daemons(args)
        daemon.wait_for("evidence_captured", timeout_seconds=60, phase="wedged")
        daemon.wait_for("webhook_retry", timeout_seconds=30)  # its line names the URL too
        daemon.wait_for("webhook_failed", timeout_seconds=30)
        status = daemon.get("/status").text
        metrics = daemon.get("/metrics").text
        assert daemon.stop() == 0
    shown = subprocess.run(
        [*WEDGEWATCH, "config", "show", "--json", *args],
        capture_output=True, text=True, timeout=60, env=clean_env(), check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    places = {
        "log": daemon.log_path.read_text(errors="replace"),
        "/status": status,
        "/metrics": metrics,
        "config show": shown.stdout + shown.stderr,
        **{
            f"bundle {name}": data.decode("utf-8", "replace")
            for name, data in _bundle_files(daemon.evidence_dir).items()
        },
    }
    assert any(name.startswith("bundle ") for name in places)
    leaks = [(place, s) for place, text in places.items() for s in secrets if s in text]
    assert leaks == []
    # The masked forms are what is shown.
    assert f"{hook.base_url}/***" in places["log"]
    assert "http://admin:***@127.0.0.1" in places["/status"]
    revealed = subprocess.run(
        [*WEDGEWATCH, "config", "show", "--json", "--reveal", *args],
        capture_output=True, text=True, timeout=60, env=clean_env(), check=False,
    )  # fmt: skip
    assert "WEBHOOKPATHSECRET" in revealed.stdout
