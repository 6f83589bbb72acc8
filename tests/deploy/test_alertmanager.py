"""deploy/alertmanager/alertmanager.yml: amtool accepts it, every critical alert routes to the
pager, and a real Alertmanager inhibits exactly the overlapping pairs.

The wedgewatch alerts' label sets are the ones `promtool test rules` expects in
deploy/prometheus/tests/routing.yml (as the PodMonitor scrapes a replica); the vLLM and
kube-state-metrics alerts carry the labels those jobs' series have for the same pods.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from ports import free_port

from deploy.repo import DEPLOY, RULE_TESTS, RULES

CONFIG = DEPLOY / "alertmanager" / "alertmanager.yml"
AMTOOL = shutil.which("amtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def _amtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert AMTOOL is not None
    return subprocess.run([AMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.skipif(AMTOOL is None, reason="amtool is not installed (prometheus-alertmanager)")
def test_amtool_accepts_the_config() -> None:
    """`amtool check-config` accepts the shipped file and counts its inhibit rules."""
    done = _amtool("check-config", str(CONFIG))
    assert done.returncode == 0, done.stdout + done.stderr
    rules = yaml.safe_load(CONFIG.read_text())["inhibit_rules"]
    assert f"{len(rules)} inhibit rules" in done.stdout


@pytest.mark.skipif(AMTOOL is None, reason="amtool is not installed (prometheus-alertmanager)")
def test_every_critical_alert_pages_and_every_warning_does_not() -> None:
    """Each alert of the rules file routes by its severity: critical to `page`."""
    alerts = [
        rule
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    for rule in alerts:
        severity = rule["labels"]["severity"]
        done = _amtool(
            "config",
            "routes",
            "test",
            f"--config.file={CONFIG}",
            f"alertname={rule['alert']}",
            f"severity={severity}",
        )
        assert done.returncode == 0, done.stderr
        expected = "page" if severity == "critical" else "ticket"
        assert done.stdout.strip() == expected, rule["alert"]


def _promtool_labels() -> dict[tuple[str, str], dict[str, str]]:
    """(alertname, pod) -> the labels promtool expects in routing.yml."""
    tests = yaml.safe_load((RULE_TESTS / "routing.yml").read_text())["tests"]
    found: dict[tuple[str, str], dict[str, str]] = {}
    for test in tests:
        for case in test["alert_rule_test"]:
            for alert in case["exp_alerts"]:
                labels = {"alertname": case["alertname"], **alert["exp_labels"]}
                found[(case["alertname"], labels["pod"])] = {k: str(v) for k, v in labels.items()}
    return found


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """A real Alertmanager with the shipped config on a loopback port; its base URL."""
    if ALERTMANAGER is None:
        pytest.skip("Alertmanager is not installed (Debian: prometheus-alertmanager)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "alertmanager.log").open("wb")
    proc = subprocess.Popen(
        [
            ALERTMANAGER,
            f"--config.file={CONFIG}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None, (tmp_path / "alertmanager.log").read_text()
            assert time.monotonic() < deadline, "Alertmanager did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _post(url: str, alerts: list[Mapping[str, str]]) -> None:
    body = [{"labels": dict(labels), "annotations": {}} for labels in alerts]
    response = httpx.post(f"{url}/api/v2/alerts", json=body, timeout=10)
    assert response.status_code == 200, response.text


def _inhibited(url: str, count: int) -> dict[str, list[str]]:
    """alert key -> the fingerprints inhibiting it, once all `count` alerts are in."""
    deadline = time.monotonic() + 30
    while True:
        alerts: list[dict[str, Any]] = httpx.get(f"{url}/api/v2/alerts", timeout=10).json()
        if len(alerts) == count:
            return {_key(a["labels"]): a["status"]["inhibitedBy"] for a in alerts}
        assert time.monotonic() < deadline, alerts
        time.sleep(0.1)


def _key(labels: Mapping[str, str]) -> str:
    return f"{labels['alertname']}/{labels.get('pod', '-')}/{labels.get('engine', '-')}"


def _vllm(alertname: str, pod: str, address: str, engine: str = "0") -> dict[str, str]:
    """A raw-vLLM alert as the `vllm` job's series label it for `pod`."""
    return {
        "alertname": alertname,
        "severity": "critical",
        "job": "vllm",
        "instance": f"{address}:8000",
        "namespace": "llm",
        "pod": pod,
        "model_name": "m",
        "engine": engine,
    }


def test_inhibit_rules_hold_for_the_overlapping_pairs(alertmanager: str) -> None:
    """A firing wedgewatch alert silences its raw-vLLM twin of the same pod and engine, and a
    page silences the warnings about the same target; other pods and engines stay loud."""
    promtool = _promtool_labels()
    wedged_a = promtool[("WedgeWatchEngineWedged", "vllm-a")]
    unhandled_b = promtool[("WedgeWatchEngineWedgedUnhandled", "vllm-b")]
    gave_up_c = promtool[("WedgeWatchRestartBudgetExhausted", "vllm-c")]
    # The same replicas' other alerts, with the labels their rules keep.
    wedged_b = {**unhandled_b, "alertname": "WedgeWatchEngineWedged", "severity": "warning"}
    wedged_c = {
        **gave_up_c,
        "alertname": "WedgeWatchEngineWedged",
        "severity": "warning",
        "model_name": "m",
        "engine": "0",
    }
    storm_c = {**gave_up_c, "alertname": "WedgeWatchRestartStorm"}
    storm_a = {
        "alertname": "WedgeWatchRestartStorm",
        "severity": "critical",
        **{k: wedged_a[k] for k in ("job", "instance", "namespace", "pod", "target")},
    }
    container_storm = {
        "alertname": "VLLMContainerRestartStorm",
        "severity": "warning",
        "job": "kube-state-metrics",
        "instance": "10.1.0.2:8080",
        "namespace": "llm",
        "container": "vllm",
    }
    # Outside Kubernetes: no pod label on either side; must not inhibit.
    plain_wedged = {k: v for k, v in wedged_a.items() if k not in ("pod", "namespace")}
    plain_vllm = {
        k: v
        for k, v in _vllm("VLLMEngineDeferredOnlyStall", "x", "10.9.0.1").items()
        if k not in ("pod", "namespace")
    }
    alerts = [
        wedged_a,
        _vllm("VLLMEngineWedged", "vllm-a", "10.0.0.5"),  # inhibited: same pod and engine
        _vllm("VLLMEngineNoOutput", "vllm-a", "10.0.0.5", engine="1"),  # another engine
        _vllm("VLLMEngineWedged", "vllm-z", "10.0.0.9"),  # another pod
        unhandled_b,
        wedged_b,  # inhibited by the unhandled page
        gave_up_c,
        wedged_c,  # inhibited by the gave_up page
        storm_c,  # inhibited by the gave_up page
        storm_a,
        {**container_storm, "pod": "vllm-a"},  # inhibited: wedgewatch explains it
        {**container_storm, "pod": "vllm-z"},
        {**plain_wedged, "alertname": "WedgeWatchEngineWedged", "target": "plain"},
        plain_vllm,
    ]
    _post(alertmanager, alerts)
    inhibited = {key: bool(by) for key, by in _inhibited(alertmanager, len(alerts)).items()}
    assert inhibited == {
        "WedgeWatchEngineWedged/vllm-a/0": False,
        "VLLMEngineWedged/vllm-a/0": True,
        "VLLMEngineNoOutput/vllm-a/1": False,
        "VLLMEngineWedged/vllm-z/0": False,
        "WedgeWatchEngineWedgedUnhandled/vllm-b/0": False,
        "WedgeWatchEngineWedged/vllm-b/0": True,
        "WedgeWatchRestartBudgetExhausted/vllm-c/-": False,
        "WedgeWatchEngineWedged/vllm-c/0": True,
        "WedgeWatchRestartStorm/vllm-c/-": True,
        "WedgeWatchRestartStorm/vllm-a/-": False,
        "VLLMContainerRestartStorm/vllm-a/-": True,
        "VLLMContainerRestartStorm/vllm-z/-": False,
        "WedgeWatchEngineWedged/-/0": False,
        "VLLMEngineDeferredOnlyStall/-/0": False,
    }
