"""End to end: a real Prometheus scrapes the simulator and `wedgewatch run`, the simulator wedges,
the alerts fire, and every dashboard and Grafana alerting query runs against that Prometheus.

One scene, shared by the tests of this module (it takes a minute or two to build):

- `burst`: the simulator started like the Deployment's vLLM container, through `wedgewatch
  launch` (with the simulator's `vllm` shim), but with the reproduction profile `tp2-offload`
  in place of the manifest's production `tp2-mitigated`, and wedged
  by agentic-burst traffic: the real scheduler mechanism, no fault injection (a burst that
  did not wedge is retried with the next seed, see WEDGE_SEEDS);
- `dp`: a data-parallel simulator (two engines) under the same kind of traffic whose engine 0
  hangs in a collective after a while (`--fault collective-hang`): every value of that
  engine freezes, engine 1 keeps serving;
- `wedgewatch run` with the ConfigMap of deploy/kubernetes/base (listening on 127.0.0.1
  and with short thresholds through `WEDGEWATCH_*` variables), watching both;
- Prometheus with a 1 s scrape and evaluation interval and the shipped rules with every
  duration divided by TIME_FACTOR (five minutes become ten seconds).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ports import free_port

from deploy.prometheus_server import (
    PrometheusServer,
    ScrapeJob,
    scale_expr,
    scale_rules,
)
from deploy.repo import BASE, GRAFANA, RULES, load_generate
from deploy.test_grafana import substitute

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus is not installed"),
]

generate = load_generate()
WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
TIME_FACTOR = 30.0
SCRAPE = 1.0  # seconds: Prometheus' scrape and evaluation interval
STALL_AFTER_SECONDS = 5.0
HANG_AFTER_SECONDS = 8.0
MODEL = "Qwen/Qwen3-0.6B"
HANG_AT_SECONDS = 25  # after the dp simulator starts
# The agentic-burst profile sends its long prompts 3-8 s after the load starts; whether the
# burst wedges the scheduler depends on how arrivals and steps interleave in wall-clock
# time (about every other try here). A try that has not wedged 45 s after the load started
# never will: the burst sim and its load are then restarted with the next seed.
WEDGE_SEEDS = ("7", "13", "3", "11", "5", "17", "2")
WEDGE_TRY_SECONDS = 45.0


def _rfc3339(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Scene:
    """The running processes and what the tests need to know about them."""

    directory: Path
    prometheus: PrometheusServer
    burst: str  # host:port of the wedging simulator
    dp: str  # host:port of the data-parallel simulator
    wedgewatch: str  # host:port of wedgewatch
    started_at: float
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a child in its own process group, logging to DIR/<name>.log."""
        with (self.directory / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """Kill one child's whole process group (a simulator has engine and worker children)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        self.processes.remove(process)

    def logs(self) -> str:
        """The tail of every log, for failure messages."""
        parts = []
        for path in sorted(self.directory.glob("*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every child process group we started (TERM, then KILL), then Prometheus."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        self.prometheus.stop()


def _wait_http(url: str, timeout_seconds: float, scene: Scene) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer 200 in {timeout_seconds:g} s\n{scene.logs()}")


def _firing(scene: Scene, alertname: str, **labels: str) -> list[dict[str, Any]]:
    return [
        alert
        for alert in scene.prometheus.alerts()
        if alert["labels"]["alertname"] == alertname
        and alert["state"] == "firing"
        and all(alert["labels"].get(k) == v for k, v in labels.items())
    ]


def _wait_until(
    what: str, predicate: Callable[[], bool], timeout_seconds: float, scene: Scene
) -> None:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(
        f"{what}: not within {timeout_seconds:g} s; active alerts:\n"
        f"{json.dumps(scene.prometheus.alerts(), indent=1)[:4000]}\n{scene.logs()}"
    )


def _sidecar_environment(scene_dir: Path, port: int, burst: str, dp: str) -> dict[str, str]:
    """The ConfigMap's settings, with what a loopback test must change put in variables."""
    return {
        **os.environ,
        "WEDGEWATCH_LISTEN_HOST": "127.0.0.1",
        "WEDGEWATCH_LISTEN_PORT": str(port),
        "WEDGEWATCH_TARGETS": f"burst=http://{burst},dp=http://{dp}",
        "WEDGEWATCH_STATE_DIR": str(scene_dir / "state"),
        "WEDGEWATCH_EVIDENCE_DIR": str(scene_dir / "evidence"),
        "WEDGEWATCH_STALL_AFTER_SECONDS": str(STALL_AFTER_SECONDS),
        "WEDGEWATCH_HANG_AFTER_SECONDS": str(HANG_AFTER_SECONDS),
    }


def _load_argv(address: str, seed: str) -> list[str]:
    return [
        *WEDGEWATCH,
        "sim",
        "load",
        "--url",
        f"http://{address}",
        "--profile",
        "agentic-burst",
        "--seed",
        seed,
        "--duration",
        "600",
        # Clients that give up abort their requests, and aborting the parked ones frees
        # the wedge; these clients wait, as agents that retry do.
        "--request-timeout-seconds",
        "3600",
    ]


def _wait_for_wedge(sidecar: str, target: str, timeout_seconds: float) -> bool:
    """True once wedgewatch's /status reports the target wedged within the time given."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            status = httpx.get(f"http://{sidecar}/status", timeout=2).json()
            for entry in status["targets"]:
                if entry["name"] == target and entry["state"] == "wedged":
                    return True
        time.sleep(0.5)
    return False


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    """Simulators, wedgewatch and Prometheus running; both kinds of wedge alert firing."""
    directory = tmp_path_factory.mktemp("e2e")
    burst, dp = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    sidecar = f"127.0.0.1:{free_port()}"
    rules = scale_rules(generate.load_rules(RULES.read_text(encoding="utf-8")), TIME_FACTOR)
    prometheus = PrometheusServer(
        PROMETHEUS,
        directory=directory / "prometheus",
        port=free_port(),
        jobs=[ScrapeJob("vllm", [burst, dp]), ScrapeJob("wedgewatch", [sidecar])],
        rules=rules,
        interval=f"{SCRAPE:g}s",
    )
    scene = Scene(directory, prometheus, burst, dp, sidecar, started_at=time.time())
    try:
        prometheus.wait_ready(60)

        # The Deployment's vLLM command, with the simulator as `vllm`.
        deployment = yaml.safe_load((BASE / "deployment.yaml").read_text(encoding="utf-8"))
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        subprocess.run(
            [*WEDGEWATCH, "sim", "install-vllm-shim", str(directory / "bin")],
            check=True,
            capture_output=True,
            timeout=60,
        )
        extra = command[command.index("--") + 1 :]
        extra[extra.index("--host") + 1] = "127.0.0.1"
        extra[extra.index("--port") + 1] = burst.rsplit(":", 1)[1]
        # vLLM 0.30.0 (the simulator's model) wedges on agentic-burst with full-ISL admission
        # off (30 of 30 seeds), on 1 of 30 with its default (docs/simulator.md, "Fidelity").
        extra.append("--no-scheduler-reserve-full-isl")
        launch = [
            *WEDGEWATCH,
            *command[1 : command.index("--model") + 1],
            MODEL,
            # The manifest runs the production profile; the wedge needs the reproduction one.
            "--profile",
            "tp2-offload",
            "--vllm-bin",
            str(directory / "bin" / "vllm"),
            "--",
            *extra,
            "--disable-uvicorn-access-log",
        ]
        dp_port = dp.rsplit(":", 1)[1]
        scene.spawn(
            "dp",
            [
                *WEDGEWATCH,
                "sim",
                "serve",
                MODEL,
                "--host",
                "127.0.0.1",
                "--port",
                dp_port,
                "--data-parallel-size",
                "2",
                "--seed",
                WEDGE_SEEDS[0],
                "--fault",
                f"collective-hang@{HANG_AT_SECONDS}:0",
                "--disable-uvicorn-access-log",
            ],
        )
        _wait_http(f"http://{dp}/health", 90, scene)
        scene.spawn("load-dp", _load_argv(dp, WEDGE_SEEDS[0]))

        config_file = directory / "wedgewatch.toml"
        configmap = yaml.safe_load((BASE / "configmap.yaml").read_text(encoding="utf-8"))
        config_file.write_text(configmap["data"]["wedgewatch.toml"], encoding="utf-8")
        port = int(sidecar.rsplit(":", 1)[1])
        scene.spawn(
            "wedgewatch",
            [*WEDGEWATCH, "run", "--config", str(config_file)],
            env=_sidecar_environment(directory, port, burst, dp),
        )
        _wait_http(f"http://{sidecar}/health", 60, scene)

        for seed in WEDGE_SEEDS:
            server = scene.spawn("burst", [*launch, "--seed", seed])
            _wait_http(f"http://{burst}/health", 90, scene)
            load = scene.spawn("load-burst", _load_argv(burst, seed))
            if _wait_for_wedge(sidecar, "burst", WEDGE_TRY_SECONDS):
                break
            scene.kill(load)
            scene.kill(server)
        else:
            raise AssertionError(f"no agentic burst wedged the simulator\n{scene.logs()}")

        _wait_until(
            "the alerts fire for both simulators",
            lambda: (
                bool(_firing(scene, "WedgeWatchEngineWedged", target="burst"))
                and bool(_firing(scene, "VLLMEngineWedged", instance=burst))
                and bool(_firing(scene, "VLLMEngineNoOutput", instance=dp))
            ),
            60,
            scene,
        )
        yield scene
    finally:
        scene.stop()


# -- the alerts ------------------------------------------------------------------------


def _first_firing_timestamp(scene: Scene, alertname: str, instance_label: str, value: str) -> float:
    # The range ends in the future: a sample written less than a step ago is after the last
    # step that ends before now, and the alert may have turned firing just now.
    series = scene.prometheus.query_range(
        f'ALERTS{{alertname="{alertname}", alertstate="firing", {instance_label}="{value}"}}',
        scene.started_at,
        time.time() + 2 * SCRAPE,
        "1s",
    )
    assert series, f"no firing {alertname} in the range"
    return min(float(point[0]) for s in series for point in s["values"])


def _last_progress_timestamp(scene: Scene, instance: str) -> float:
    """When the engine's progress counters last moved, from Prometheus' own samples."""
    series = scene.prometheus.query_range(
        f'sum(vllm:generation_tokens_total{{instance="{instance}", engine="0"}})'
        f' + sum(vllm:prompt_tokens_total{{instance="{instance}", engine="0"}})'
        f' + sum(vllm:request_success_total{{instance="{instance}", engine="0"}})',
        scene.started_at,
        time.time(),
        "1s",
    )
    (points,) = [s["values"] for s in series]
    last_change = float(points[0][0])
    for (_t0, v0), (t1, v1) in itertools.pairwise(points):
        if v1 != v0:
            last_change = float(t1)
    return last_change


def test_scheduler_wedge_fires_vllm_engine_wedged_in_time(scene: Scene) -> None:
    """VLLMEngineWedged fires for the burst engine one window plus `for:` after progress stopped."""
    (alert,) = _firing(scene, "VLLMEngineWedged", instance=scene.burst)
    assert alert["labels"]["engine"] == "0"
    assert alert["labels"]["model_name"] == MODEL
    assert alert["labels"]["severity"] == "critical"
    assert "restart the server" in alert["annotations"]["runbook"]
    assert float(alert["value"]) > 0  # requests waiting
    onset = _last_progress_timestamp(scene, scene.burst)
    fired = _first_firing_timestamp(scene, "VLLMEngineWedged", "instance", scene.burst)
    window, hold = 300 / TIME_FACTOR, 60 / TIME_FACTOR
    # Never before the window and `for:` have passed (one scrape of slack for sampling),
    # and not much later (scrape, evaluation and the pending evaluation).
    assert fired >= onset + window + hold - SCRAPE, (onset, fired)
    assert fired <= onset + window + hold + 10 * SCRAPE, (onset, fired)


def test_wedgewatch_alert_fires_after_stall_after_seconds(scene: Scene) -> None:
    """WedgeWatchEngineWedged fires for the burst engine once stall_after_seconds have passed."""
    (alert,) = _firing(scene, "WedgeWatchEngineWedged", target="burst")
    assert alert["labels"]["engine"] == "0"
    assert alert["labels"]["job"] == "wedgewatch"
    assert float(alert["value"]) >= STALL_AFTER_SECONDS
    onset = _last_progress_timestamp(scene, scene.burst)
    fired = _first_firing_timestamp(scene, "WedgeWatchEngineWedged", "target", "burst")
    assert fired >= onset + STALL_AFTER_SECONDS - SCRAPE, (onset, fired)
    assert fired <= onset + STALL_AFTER_SECONDS + 10 * SCRAPE, (onset, fired)


def test_hung_engine_of_a_data_parallel_server_alerts_alone(scene: Scene) -> None:
    """Only engine 0 of the dp server (hung, values frozen) alerts; engine 1 keeps serving."""
    (no_output,) = _firing(scene, "VLLMEngineNoOutput", instance=scene.dp)
    assert no_output["labels"]["engine"] == "0"
    _wait_until(
        "wedgewatch judges dp engine 0 wedged (progress stall)",
        lambda: bool(_firing(scene, "WedgeWatchEngineWedged", target="dp")),
        30,
        scene,
    )
    engines = {a["labels"]["engine"] for a in _firing(scene, "WedgeWatchEngineWedged", target="dp")}
    assert engines == {"0"}
    for alert in scene.prometheus.alerts():
        labels = alert["labels"]
        assert not (labels.get("instance") == scene.dp and labels.get("engine") == "1"), alert
        assert not (labels.get("target") == "dp" and labels.get("engine") == "1"), alert
    # Engine 1 still produces tokens.
    (rate,) = scene.prometheus.query(
        f'rate(vllm:generation_tokens_total{{instance="{scene.dp}", engine="1"}}[5s])'
    )
    assert float(rate["value"][1]) > 0


def test_no_alert_fires_that_should_not(scene: Scene) -> None:
    """Nothing about wedgewatch itself or restarts fires; the dp server is not 'wedged'."""
    unexpected = {
        "WedgeWatchDown",
        "WedgeWatchLoopStalled",
        "WedgeWatchRestartBudgetExhausted",
        "WedgeWatchRestartFailed",
        "WedgeWatchRestartStorm",
        "WedgeWatchTargetUnreachable",
        "WedgeWatchTargetUnknown",
        "VLLMContainerRestartStorm",
    }
    names = {alert["labels"]["alertname"] for alert in scene.prometheus.alerts()}
    assert names & unexpected == set()
    assert not _firing(scene, "VLLMEngineWedged", instance=scene.dp)
    assert not _firing(scene, "VLLMEngineNoOutput", instance=scene.burst)


# -- the dashboard -----------------------------------------------------------------------


def _builtins(scene: Scene) -> dict[str, str]:
    elapsed = int(time.time() - scene.started_at) + 1
    return {"__rate_interval": f"{4 * SCRAPE:g}s", "__range": f"{elapsed}s", "__interval": "1s"}


def _run_dashboard_query(scene: Scene, expr: str, kind: str) -> list[dict[str, Any]]:
    if kind in ("stat", "bargauge"):
        return scene.prometheus.query(expr)
    return scene.prometheus.query_range(expr, scene.started_at, time.time(), "1s")


def _dashboard_queries() -> list[tuple[str, str, str]]:
    board = json.loads((GRAFANA / "dashboard.json").read_text(encoding="utf-8"))
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            found.append((f"{panel['title']} {target['refId']}", panel["type"], target["expr"]))
    for annotation in board["annotations"]["list"]:
        if "expr" in annotation:
            found.append((f"annotation {annotation['name']}", "timeseries", annotation["expr"]))
    return found


def _variable_values(scene: Scene, chosen: dict[str, str]) -> dict[str, list[str]]:
    """Each query variable's values, as Grafana's label_values() would list them."""
    board = json.loads((GRAFANA / "dashboard.json").read_text(encoding="utf-8"))
    values: dict[str, list[str]] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        definition = variable["definition"]
        inner, label = definition[len("label_values(") : -1].rsplit(", ", 1)
        selector = substitute(inner, {**chosen, **_builtins(scene)})
        series = scene.prometheus.api(
            "series", **{"match[]": selector, "start": f"{scene.started_at:.3f}"}
        )
        values[variable["name"]] = sorted({s[label] for s in series if label in s})
    return values


def test_dashboard_variables_list_values(scene: Scene) -> None:
    """Every selector variable's label_values() query finds values in the real Prometheus."""
    values = _variable_values(scene, {})
    assert values["job"] == ["vllm"]
    assert set(values["instance"]) == {scene.burst, scene.dp}
    assert values["model_name"] == [MODEL]
    assert values["engine"] == ["0", "1"]
    assert values["target"] == ["burst", "dp"]


@pytest.mark.parametrize(
    "selection",
    [{}, {"job": "vllm", "model_name": MODEL, "engine": "0", "target": "burst"}],
    ids=["all", "one-engine"],
)
def test_every_dashboard_query_returns_data(scene: Scene, selection: dict[str, str]) -> None:
    """Each panel and annotation query, variables substituted, returns series from Prometheus."""
    chosen = dict(selection)
    if chosen:
        chosen["instance"] = scene.burst
    empty = []
    for where, kind, expr in _dashboard_queries():
        result = _run_dashboard_query(scene, substitute(expr, {**chosen, **_builtins(scene)}), kind)
        if not result:
            empty.append(where)
    assert empty == []


# -- Grafana alerting ----------------------------------------------------------------------


def _grafana_rules() -> dict[str, dict[str, Any]]:
    alerting = yaml.safe_load((GRAFANA / "alerting.yaml").read_text(encoding="utf-8"))
    return {rule["title"]: rule for group in alerting["groups"] for rule in group["rules"]}


def _label_set(labels: dict[str, str], drop: set[str]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k not in drop)


def test_grafana_alert_queries_match_the_prometheus_alerts(scene: Scene) -> None:
    """Each Grafana alert query returns exactly the series the Prometheus alert is active for."""
    grafana = _grafana_rules()
    pending: dict[str, tuple[set[Any], set[Any]]] = {}
    deadline = time.monotonic() + 30
    while True:
        pending.clear()
        rules = scene.prometheus.alerting_rules()
        for name, rule in grafana.items():
            prom = rules[name]
            at = _rfc3339(prom["lastEvaluation"])
            expr = scale_expr(rule["data"][0]["model"]["expr"], TIME_FACTOR)
            got = {_label_set(r["metric"], {"__name__"}) for r in scene.prometheus.query(expr, at)}
            want = {
                _label_set(a["labels"], {"alertname", *prom.get("labels", {})})
                for a in prom["alerts"]
            }
            if got != want:
                pending[name] = (got, want)
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert pending == {}
    # The alerts the scene provokes are answered with data.
    rules = scene.prometheus.alerting_rules()
    for name in ("VLLMEngineWedged", "VLLMEngineNoOutput", "WedgeWatchEngineWedged"):
        expr = scale_expr(grafana[name]["data"][0]["model"]["expr"], TIME_FACTOR)
        assert scene.prometheus.query(expr, _rfc3339(rules[name]["lastEvaluation"])), name
