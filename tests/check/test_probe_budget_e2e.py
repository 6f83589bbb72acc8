"""End to end: the restart budget holds when the kubelet is the restarter.

A simulator that wedges again after every start (`--fault collective-hang@2` under steady
traffic) runs as the "container" of a kubelet stand-in (tests/support/kubelet.py: real HTTP and
exec probes with periodSeconds/failureThreshold semantics, real kills and restarts of the
simulator's process group). Its liveness probe is wedgewatch's verdict:

* exec variant: `wedgewatch check URL --for=0 --state-file=... --critical-only --config=...`
  with the state file on a "volume" that outlives the container;
* sidecar variant: `wedgewatch run` (remedy probe) and an httpGet on its `/probe`, with a
  real Prometheus scraping it and evaluating the shipped alert rules.

Both must stop the restarts after `restart_budget` (2 here) proven restarts and then pass
the probe with `gave_up` while the server stays wedged.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from deploy.prometheus_server import PrometheusServer, ScrapeJob, scale_rules
from deploy.repo import RULES
from kubelet import Exec, HttpGet, Kubelet, Probe, wait_for
from ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
ENTRY = str(Path(sys.executable).with_name("wedgewatch"))
BUDGET = 2
# Thresholds short enough for a test; the state file's detector history is judged too old
# after the shortest wedge threshold, so it must outlast a probe period plus the start-up of
# a probe on a loaded machine (seconds).
SETTINGS = {
    "interval_seconds": 0.5,
    "stall_after_seconds": 8.0,
    "hang_after_seconds": 8.0,
    "output_stall_after_seconds": 8.0,
    "unreachable_after_seconds": 8.0,
    "startup_timeout_seconds": 60.0,
    "scrape_timeout_seconds": 2.0,
    "restart_budget": BUDGET,
    "restart_budget_window_seconds": 3600.0,
    "restart_backoff_seconds": 1.0,
    "restart_backoff_max_seconds": 4.0,
}


def clean_env() -> dict[str, str]:
    """This environment without WEDGEWATCH_* settings (the marker of the leak check stays)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}


def write_config(path: Path, extra: dict[str, object] | None = None) -> Path:
    """A TOML config file with SETTINGS (and `extra`)."""
    lines = []
    for key, value in {**SETTINGS, **(extra or {})}.items():
        lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def sim_container(port: int) -> list[str]:
    """The "vLLM container": a simulator that hangs in a collective 2 s after each start."""
    return [
        *WEDGEWATCH, "sim", "serve", "tiny", "--host", "127.0.0.1", "--port", str(port),
        "--fault", "collective-hang@2", "--disable-uvicorn-access-log",
    ]  # fmt: skip


@pytest.fixture
def traffic(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    """Starts steady traffic at a URL (it keeps sending across restarts); stops it after."""
    started: list[subprocess.Popen[bytes]] = []

    def start(url: str) -> None:
        out = (tmp_path / f"load-{len(started)}.log").open("wb")
        started.append(
            subprocess.Popen(
                [*WEDGEWATCH, "sim", "load", "--url", url, "--profile", "steady",
                 "--duration", "500", "--model", "tiny", "--request-timeout-seconds", "3"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=clean_env(),
            )
        )  # fmt: skip
        out.close()

    yield start
    for proc in started:
        with_group_killed(proc)


def with_group_killed(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of `proc` (it leads its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def json_of(detail: str) -> dict[str, object]:
    """The JSON object a `check --json` probe printed (detail is `exit N: {...}`)."""
    return json.loads(detail.split(": ", 1)[1])


def test_exec_probe_stops_restarting_after_the_budget_and_passes_with_gave_up(
    tmp_path: Path,
    traffic: callable,  # type: ignore[valid-type]
) -> None:
    """Exec probe: two proven restarts, then exit 0 with gave_up while still wedged."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = write_config(tmp_path / "wedgewatch.toml")
    volume = tmp_path / "probe-volume"  # outlives the container, like an emptyDir volume
    probe = Exec(
        [ENTRY, "check", url, "--for=0", f"--state-file={volume / 'probe.json'}",
         "--critical-only", f"--config={config}", "--json"],
        env=clean_env(),
    )  # fmt: skip
    kubelet = Kubelet(
        command=sim_container(port),
        startup=Probe(HttpGet(url + "/health"), period_seconds=0.5, timeout_seconds=2),
        liveness=Probe(probe, period_seconds=1.0, timeout_seconds=15, failure_threshold=2),
        log_dir=tmp_path,
        env=clean_env(),
        termination_grace_seconds=5,
    ).start()
    try:
        traffic(url)
        wait_for(
            lambda: any(
                r.ok and json_of(r.detail).get("gave_up") for r in kubelet.liveness_results
            ),
            300,
            "the exec probe to pass with gave_up",
        )
        assert kubelet.restarts == BUDGET
        gave_up_at = time.monotonic()
        # More probes of a server that is still wedged: three in a row (a restart would need
        # failure_threshold failed ones among them).
        wait_for(
            lambda: len([r for r in kubelet.liveness_results if r.at > gave_up_at]) >= 3,
            120,
            "three more probes",
        )
        assert kubelet.restarts == BUDGET
        late = [r for r in kubelet.liveness_results if r.at > gave_up_at]
        assert len(late) >= 3
        for result in late:
            answer = json_of(result.detail)
            assert result.ok, result.detail
            assert answer["status"] == "wedged"
            assert answer["gave_up"] is True
            policy = answer["restart_policy"]
            assert isinstance(policy, dict)
            assert policy["decision"] == "gave_up"
            assert f"restart_budget = {BUDGET}" in str(policy["detail"])
            assert policy["restarts_in_window"] == BUDGET
        # Every restart was proven: each came after failed probes of the previous start.
        for start in range(BUDGET):
            failed = [r for r in kubelet.liveness_results if r.start == start and not r.ok]
            assert len(failed) >= 2, (start, kubelet.liveness_results)
            assert all(json_of(r.detail)["status"] in ("wedged", "unreachable") for r in failed)
    finally:
        kubelet.stop()


PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


@pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus is not installed")
def test_sidecar_probe_stops_restarting_after_the_budget_and_the_alert_fires(
    tmp_path: Path,
    traffic: callable,  # type: ignore[valid-type]
) -> None:
    """/probe: 503 until two proven restarts, then 200 with gave_up; the alert fires."""
    port, sidecar_port, prometheus_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    sidecar = f"127.0.0.1:{sidecar_port}"
    config = write_config(
        tmp_path / "wedgewatch.toml",
        {
            "remedy": "probe",
            "listen_host": "127.0.0.1",
            "listen_port": sidecar_port,
            "state_dir": str(tmp_path / "state"),
            "evidence_dir": str(tmp_path / "evidence"),
            "pyspy_timeout_seconds": 5.0,
            "process_sample_seconds": 0.1,
        },
    )
    env = {**clean_env(), "WEDGEWATCH_TARGETS": f"vllm={url}"}
    rules = scale_rules(yaml.safe_load(RULES.read_text()), 30.0)
    prometheus = PrometheusServer(
        PROMETHEUS,
        directory=tmp_path / "prometheus",
        port=prometheus_port,
        jobs=[ScrapeJob("wedgewatch", [sidecar])],
        rules=rules,
    )
    with (tmp_path / "sidecar.log").open("wb") as log:
        run = subprocess.Popen(
            [*WEDGEWATCH, "run", f"--config={config}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    kubelet: Kubelet | None = None
    try:
        prometheus.wait_ready(60)
        wait_for(lambda: _answers(f"http://{sidecar}/health"), 60, "the sidecar's /health")
        kubelet = Kubelet(
            command=sim_container(port),
            startup=Probe(HttpGet(url + "/health"), period_seconds=0.5, timeout_seconds=2),
            liveness=Probe(
                HttpGet(f"http://{sidecar}/probe"),
                period_seconds=1.0,
                timeout_seconds=5,
                failure_threshold=2,
            ),
            log_dir=tmp_path,
            env=clean_env(),
            termination_grace_seconds=5,
        ).start()
        traffic(url)
        wait_for(
            lambda: any(r.ok and '"gave_up":true' in r.detail for r in kubelet.liveness_results),
            300,
            "/probe to pass with gave_up",
        )
        assert kubelet.restarts == BUDGET
        gave_up_at = time.monotonic()
        wait_for(
            lambda: any(
                a["labels"]["alertname"] == "WedgeWatchRestartBudgetExhausted"
                and a["state"] == "firing"
                for a in prometheus.alerts()
            ),
            60,
            "WedgeWatchRestartBudgetExhausted to fire",
        )
        (gave_up,) = prometheus.query('wedgewatch_gave_up{target="vllm"}')
        assert gave_up["value"][1] == "1"
        (restarts,) = prometheus.query('wedgewatch_restarts_total{target="vllm",remedy="probe"}')
        assert restarts["value"][1] == str(BUDGET)
        time.sleep(max(0.0, gave_up_at + 8 - time.monotonic()))
        assert kubelet.restarts == BUDGET
        answer = httpx.get(f"http://{sidecar}/probe", timeout=5)
        assert answer.status_code == 200
        body = answer.json()
        assert body["state"] == "wedged"
        assert body["gave_up"] is True
        assert body["restart_policy"]["decision"] == "gave_up"
        assert f"restart_budget = {BUDGET}" in body["restart_policy"]["detail"]
        for start in range(BUDGET):
            failed = [r for r in kubelet.liveness_results if r.start == start and not r.ok]
            assert len(failed) >= 2
            assert all("HTTP 503" in r.detail for r in failed)
    finally:
        if kubelet is not None:
            kubelet.stop()
        with_group_killed(run)  # type: ignore[arg-type]
        prometheus.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
