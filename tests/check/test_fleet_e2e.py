"""End to end: two replicas under the kubelet stand-in, wired as deploy/kubernetes/base wires
them: the sidecar's environment from the rendered Deployment (the target named after the
pod through the downward API), liveness on its /probe, readiness on its /ready.

- `vllm-wedgy`: a simulator that hangs in a collective 2 s after every start, under steady
  traffic. It must leave readiness while wedged, come back after each restart the kubelet
  makes through /probe, and stay out once the restart budget is spent (gave_up), while
  /probe passes again and the kubelet stops restarting it.
- `vllm-healthy`: a simulator under the same traffic, never wedged: ready throughout.

wedgewatch's metrics of the two sidecars tell the replicas apart by their `target` label.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from deploy.repo import BASE
from kubelet import HttpGet, Kubelet, Probe, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_probe_budget_e2e import (
    BUDGET,
    clean_env,
    free_port,
    sim_container,
    traffic,  # noqa: F401 - the fixture
    with_group_killed,
    write_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
WEDGY, HEALTHY = "vllm-wedgy-7d9f8c5b4-x2kqp", "vllm-healthy-7d9f8c5b4-q8wzr"


def _sidecar_env_from_the_manifest(pod_name: str, url: str) -> dict[str, str]:
    """The sidecar's environment as the kubelet builds it from the rendered Deployment:
    fieldRef metadata.name for POD_NAME, $(VAR) expanded from earlier variables. Only the
    vLLM address differs (each replica here listens on its own loopback port)."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None
    rendered = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    (deployment,) = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] == "Deployment"]
    (sidecar,) = deployment["spec"]["template"]["spec"]["initContainers"]
    env: dict[str, str] = {}
    for item in sidecar["env"]:
        if "valueFrom" in item:
            assert item["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            env[item["name"]] = pod_name
            continue
        value = item["value"]
        for name, known in env.items():
            value = value.replace(f"$({name})", known)
        env[item["name"]] = value
    targets = env["WEDGEWATCH_TARGETS"]
    assert targets == f"{pod_name}=http://127.0.0.1:8000"
    env["WEDGEWATCH_TARGETS"] = targets.replace("http://127.0.0.1:8000", url)
    env.pop("HOME", None)
    return env


class Replica:
    """One pod: a simulator run by a kubelet stand-in, and its wedgewatch sidecar."""

    def __init__(self, tmp_path: Path, name: str, *, wedges: bool) -> None:
        self.name = name
        self.dir = tmp_path / name
        self.dir.mkdir()
        port, sidecar_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.sidecar = f"http://127.0.0.1:{sidecar_port}"
        config = write_config(
            self.dir / "wedgewatch.toml",
            {
                "remedy": "probe",
                "listen_host": "127.0.0.1",
                "listen_port": sidecar_port,
                "state_dir": str(self.dir / "state"),
                "evidence_dir": str(self.dir / "evidence"),
                "pyspy_timeout_seconds": 5.0,
                "process_sample_seconds": 0.1,
            },
        )
        env = {**clean_env(), **_sidecar_env_from_the_manifest(name, self.url)}
        with (self.dir / "sidecar.log").open("wb") as log:
            self.run = subprocess.Popen(
                [*WEDGEWATCH, "run", f"--config={config}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        command = sim_container(port)
        if not wedges:
            command = [a for a in command if a not in ("--fault", "collective-hang@2")]
        self.kubelet = Kubelet(
            command=command,
            startup=Probe(HttpGet(self.url + "/health"), period_seconds=0.5, timeout_seconds=2),
            liveness=Probe(
                HttpGet(f"{self.sidecar}/probe"),
                period_seconds=1.0,
                timeout_seconds=5,
                failure_threshold=2,
            ),
            readiness=Probe(
                HttpGet(f"{self.sidecar}/ready"),
                period_seconds=0.5,
                timeout_seconds=5,
                failure_threshold=1,
            ),
            log_dir=self.dir,
            env=clean_env(),
            termination_grace_seconds=5,
        )

    def start(self) -> None:
        wait_for(lambda: _answers(f"{self.sidecar}/health"), 60, f"{self.name}'s sidecar")
        self.kubelet.start()

    def stop(self) -> None:
        try:
            self.kubelet.stop()
        finally:
            with_group_killed(self.run)

    def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        text = httpx.get(f"{self.sidecar}/metrics", timeout=5).text
        found: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return found


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _body(detail: str) -> dict[str, Any]:
    """The JSON body of an HTTP probe's detail (`HTTP 503 {...}`)."""
    return dict(json.loads(detail.split(" ", 2)[2]))


@pytest.fixture
def replicas(
    tmp_path: Path,
    traffic: Any,  # noqa: F811 - the fixture imported above
) -> Iterator[tuple[Replica, Replica]]:
    wedgy = Replica(tmp_path, WEDGY, wedges=True)
    healthy = Replica(tmp_path, HEALTHY, wedges=False)
    try:
        for replica in (wedgy, healthy):
            replica.start()
            traffic(replica.url)
        yield wedgy, healthy
    finally:
        for replica in (wedgy, healthy):
            replica.stop()


def test_a_wedged_replica_leaves_readiness_comes_back_after_restarts_and_stays_out_when_given_up(
    replicas: tuple[Replica, Replica],
) -> None:
    """Readiness follows the verdict; liveness follows the budget; replicas are told apart."""
    wedgy, healthy = replicas
    kubelet = wedgy.kubelet
    wait_for(
        lambda: any(r.ok and '"gave_up":true' in r.detail for r in kubelet.liveness_results),
        300,
        "/probe of the wedged replica to pass with gave_up",
    )
    assert kubelet.restarts == BUDGET
    gave_up_at = time.monotonic()
    # More probes of a server that is still wedged and given up: five readiness answers.
    wait_for(
        lambda: (
            sum(r.at > gave_up_at for r in kubelet.readiness_results) >= 5
            and any(r.at > gave_up_at for r in kubelet.liveness_results)
        ),
        120,
        "five readiness and one liveness result after giving up",
    )

    results = kubelet.readiness_results
    # Each container start was ready, then left readiness because it wedged.
    for start in range(BUDGET + 1):
        mine = [r for r in results if r.start == start]
        assert any(r.ok for r in mine), (start, mine)
        out = [_body(r.detail) for r in mine if not r.ok]
        assert any(b["decision"] in ("wedged", "gave_up") for b in out), (start, out)
    # ... and back after each restart: a ready answer after the first failure of the last.
    for start in range(1, BUDGET + 1):
        first_ok = min(r.at for r in results if r.start == start and r.ok)
        last_out = max(r.at for r in results if r.start == start - 1 and not r.ok)
        assert first_ok > last_out
    # Given up: out of the Service for good while /probe passes and nothing restarts.
    late = [r for r in results if r.at > gave_up_at]
    assert len(late) >= 5
    assert not any(r.ok for r in late)
    assert {_body(r.detail)["decision"] for r in late} == {"gave_up"}
    assert kubelet.restarts == BUDGET
    assert not kubelet.ready
    live = [r for r in kubelet.liveness_results if r.at > gave_up_at]
    assert live
    assert all(r.ok for r in live)

    # The healthy replica never left the Service once it was ready.
    assert healthy.kubelet.restarts == 0
    changes = healthy.kubelet.readiness_changes
    assert [ready for _, _, ready in changes] == [True]
    assert healthy.kubelet.ready

    # Told apart in wedgewatch's metrics: each sidecar names its target after its pod.
    wedgy_metrics, healthy_metrics = wedgy.metrics(), healthy.metrics()
    for metrics, name in ((wedgy_metrics, WEDGY), (healthy_metrics, HEALTHY)):
        targets = {
            labels["target"]
            for samples in metrics.values()
            for labels, _ in samples
            if "target" in labels
        }
        assert targets == {name}
    (gave_up,) = wedgy_metrics["wedgewatch_gave_up"]
    assert gave_up == ({"target": WEDGY}, 1.0)
    assert healthy_metrics["wedgewatch_gave_up"] == [({"target": HEALTHY}, 0.0)]
    wedges = sum(v for _, v in wedgy_metrics["wedgewatch_wedges_total"])
    assert wedges >= BUDGET + 1
    assert sum(v for _, v in healthy_metrics["wedgewatch_wedges_total"]) == 0
