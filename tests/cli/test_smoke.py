"""The CLI's smoke tests: each command an operator runs, once, through the installed script.

They run `wedgewatch` from this venv, or from the venv named by WEDGEWATCH_SMOKE_BIN: the
declared-minimum-versions job (tests/support/min_versions.py) points it at a venv holding exactly
the floors of pyproject.toml, so every runtime dependency is exercised at its floor:

- typer: `--help`, `--version`, and check's usage errors (exit 3, JSON with --json);
- pydantic: `config check` of a valid and of a bad file;
- starlette, uvicorn, setproctitle, prometheus-client, psutil: `sim serve` (a real
  simulator on 127.0.0.1), and the daemon's own server (uvicorn with its connection bounds);
- httpx, sniffio, structlog: `check` and `run` against that simulator;
- py-spy, psutil: `capture` of the simulator, then `bundles` and `report` of the bundle;
- stamina: a webhook delivery retried once against a real loopback receiver.

Every command's stderr and log must be free of warnings and tracebacks: a floor that works
but warns on every start (pydantic 2.6-2.9 did) is not an honest floor.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ports import free_port
from scripted_http import Reply, ScriptedServer, in_turn
from wedgewatch_daemon import DaemonProcess, clean_env

from wedgewatch import __version__

pytestmark = pytest.mark.slow

BIN = Path(os.environ.get("WEDGEWATCH_SMOKE_BIN") or Path(sys.executable).parent)
WEDGEWATCH = str(BIN / "wedgewatch")
PYTHON = str(BIN / "python")

#: What no smoke run may print: a traceback, or a warning of Python's or of a library's.
_NOISE = ("Traceback", "Warning:", "warnings.warn")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`wedgewatch ARGS` from BIN; its stderr carries no traceback and no warning."""
    done = subprocess.run(
        [WEDGEWATCH, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(COLUMNS="200"),
        check=False,
    )
    for noise in _NOISE:
        assert noise not in done.stderr, f"wedgewatch {' '.join(args)}:\n{done.stderr}"
    return done


def test_the_smoke_runs_the_chosen_installation() -> None:
    """BIN's interpreter imports its own dependencies, and, in the floors job, its own copy
    of wedgewatch (installed from this checkout; .venv's is this tree, editable)."""
    where = subprocess.run(
        [PYTHON, "-c", "import wedgewatch, typer; print(typer.__file__, wedgewatch.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.split()
    prefix = BIN.parent.resolve()
    checked = where if "WEDGEWATCH_SMOKE_BIN" in os.environ else where[:1]
    assert all(Path(path).resolve().is_relative_to(prefix) for path in checked), (prefix, where)


def test_help_version_and_usage_errors() -> None:
    """typer: the command list, the version, and check's Nagios usage errors (exit 3)."""
    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("check", "run", "capture", "report", "sim", "config"):
        assert command in helped.stdout
    assert run("--version").stdout.strip() == f"wedgewatch {__version__}"

    unknown_flag = run("check", "http://127.0.0.1:9", "--no-such-flag")
    assert unknown_flag.returncode == 3, unknown_flag.stderr
    assert "--no-such-flag" in unknown_flag.stderr

    as_json = run("check", "http://127.0.0.1:9", "--json", "--for", "-1")
    assert as_json.returncode == 3, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["status"] == "unknown"
    assert "--for" in document["error"]


@pytest.mark.parametrize(
    "command",
    ["run", "capture", "reset-restarts", "launch", "demo", "bundles", "report", "sim serve",
     "sim load", "sim install-vllm-shim", "config show", "config check", "config reference"],
)  # fmt: skip
def test_every_command_has_help(command: str) -> None:
    """typer: each command's options and arguments render (typer 0.12.5-0.15.3, with the
    click 8.2+ that pip gives them, fail here on an argument's metavar)."""
    helped = run(*command.split(), "--help")
    assert helped.returncode == 0, helped.stderr
    assert "Usage:" in helped.stdout or "usage:" in helped.stdout


def test_config_check_accepts_a_good_file_and_names_the_bad_setting(tmp_path: Path) -> None:
    """pydantic: a valid file passes; a bad value exits 2 naming the setting and the file."""
    good = tmp_path / "good.toml"
    good.write_text("interval_seconds = 2\nstall_after_seconds = 90\n")
    checked = run("config", "check", str(good))
    assert checked.returncode == 0, checked.stderr
    assert "valid (2 settings set)" in checked.stdout

    bad = tmp_path / "bad.toml"
    bad.write_text('interval_seconds = "soon"\n')
    refused = run("config", "check", str(bad))
    assert refused.returncode == 2
    assert "interval_seconds" in refused.stderr
    assert str(bad) in refused.stderr


@pytest.fixture(scope="module")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`wedgewatch sim serve tiny` from BIN on 127.0.0.1, healthy; its base URL."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("sim") / "sim.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [WEDGEWATCH, "sim", "serve", "tiny", "--host", "127.0.0.1", "--port", str(port),
             "--disable-uvicorn-access-log"],
            stdout=log, stderr=subprocess.STDOUT, env=clean_env(), start_new_session=True,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"the simulator did not become healthy:\n{log_path.read_text()[-3000:]}")
        yield url
        for noise in _NOISE:
            assert noise not in log_path.read_text(errors="replace"), log_path.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_sim_serves_vllm_metrics_with_its_process_titles(simulator: str) -> None:
    """starlette, uvicorn, prometheus-client, setproctitle: vLLM's endpoints and titles."""
    metrics = httpx.get(simulator + "/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "vllm:num_requests_running{" in metrics.text
    models = httpx.get(simulator + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "tiny"
    pids = subprocess.run(
        ["pgrep", "-f", "^VLLM::EngineCore"], capture_output=True, text=True, check=False
    )
    assert pids.stdout.split(), "no process titled VLLM::EngineCore"


def test_check_judges_the_simulator(simulator: str) -> None:
    """httpx and the detector: an idle simulator is OK (exit 0), in text and in JSON."""
    text = run("check", simulator, "--for", "1")
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stdout.startswith("OK: idle")
    as_json = run("check", simulator, "--for", "1", "--json")
    assert as_json.returncode == 0, as_json.stdout + as_json.stderr
    assert json.loads(as_json.stdout)["status"] == "idle"


def test_the_daemon_watches_the_simulator_and_serves_its_endpoints(
    simulator: str, tmp_path: Path
) -> None:
    """uvicorn with the connection bounds, starlette, structlog: /health, /probe, /status,
    /metrics answer while the daemon watches the simulator, a silent connection is closed;
    SIGTERM stops it with exit 0."""
    daemon = DaemonProcess(["--target", simulator], tmp_path, command=[WEDGEWATCH])
    try:
        daemon.wait_for("engine_discovered", timeout_seconds=60)
        assert daemon.get("/health").json()["status"] == "ok"
        assert daemon.get("/probe").status_code == 200
        (target,) = daemon.get("/status").json()["targets"]
        assert target["state"] == "idle"
        assert "wedgewatch_" in daemon.get("/metrics").text
        # uvicorn's protocol hook (daemon/connections.py): a connection that sends nothing
        # is closed by the idle timeout (10 s); plain uvicorn would hold it for ever.
        host, port = daemon.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=120) as silent:
            assert silent.recv(1) == b""
    finally:
        assert daemon.stop() == 0
    log = daemon.log_path.read_text(errors="replace")
    for noise in _NOISE:
        assert noise not in log, log


def test_capture_then_bundles_and_report(simulator: str, tmp_path: Path) -> None:
    """py-spy and psutil: a bundle of the simulator's processes; `bundles` lists it and
    `report` renders it (no matplotlib: tables only)."""
    evidence = tmp_path / "evidence"
    captured = run(
        "capture", "--target", simulator, "--evidence-dir", str(evidence), "--json", timeout=180
    )
    assert captured.returncode == 0, captured.stdout + captured.stderr
    (bundle,) = (path for path in evidence.iterdir() if path.is_dir())
    (engine_core,) = (bundle / "pyspy").glob("engine_core-*.txt")  # py-spy's dump
    assert "Thread " in engine_core.read_text(), engine_core.read_text()[-2000:]

    listed = run("bundles", "--evidence-dir", str(evidence))
    assert listed.returncode == 0, listed.stderr
    assert bundle.name in listed.stdout

    reported = run("report", str(bundle), "--output", str(tmp_path / "out"))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    html = tmp_path / "out" / "report.html"
    assert html.is_file(), reported.stdout
    assert "<html" in html.read_text()


_WEBHOOK_ONCE = """
import asyncio, json, sys
from wedgewatch.io.notify import Notification, WebhookNotifier

async def main() -> None:
    notifier = WebhookNotifier([sys.argv[1]], retries=2, backoff_seconds=0.01,
                               backoff_max_seconds=0.02)
    notifier.start()
    notifier.notify(Notification("wedged", "t", "0", "tiny", "f", "wedged", "smoke", 0.0))
    await notifier.aclose(timeout_seconds=30)
    print(json.dumps({"sent": notifier.stats.sent, "retried": notifier.stats.retried}))

asyncio.run(main())
"""


def test_a_webhook_is_retried_once_and_delivered() -> None:
    """stamina: a 503 is retried (jittered backoff), the 200 that follows is a delivery."""
    with ScriptedServer(in_turn([Reply(status=503), Reply(status=200)])) as receiver:
        done = subprocess.run(
            [PYTHON, "-c", _WEBHOOK_ONCE, receiver.base_url + "/hook"],
            capture_output=True, text=True, timeout=60, env=clean_env(), check=False, cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == {"sent": 1, "retried": 1}
        assert [request.path for request in receiver.requests] == ["/hook", "/hook"]
