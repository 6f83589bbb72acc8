"""The Kubernetes manifests: rendered, validated against the schemas, and wired as documented."""

from __future__ import annotations

import copy
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from deploy import pod_security
from deploy.crd_schemas import SCHEMAS
from deploy.repo import BASE, EXEC_PROBE, PERSISTENT_EVIDENCE, REPO
from wedgewatch import config as ww_config
from wedgewatch.launch import flag_value
from wedgewatch.vllm.profiles import builtin_profiles

VARIANTS = {
    "base": BASE,
    "exec-probe": EXEC_PROBE,
    "persistent-evidence": PERSISTENT_EVIDENCE,
}
# Native sidecars (restartPolicy on an init container) are on by default from 1.29.
KUBERNETES_VERSIONS = sorted(
    {v for v in kv_utils.all_versions() if tuple(map(int, v.split(".")[:2])) >= (1, 29)},
    key=lambda v: tuple(map(int, v.split("."))),
)
FIXTURES = REPO / "tests" / "fixtures"
WEDGEWATCH = str(Path(sys.executable).with_name("wedgewatch"))


# -- helpers ---------------------------------------------------------------------------


def _kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    """`kubectl kustomize DIR`: the real renderer (tests/run.sh checks that it is there)."""
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, (
        "kubectl is not installed: the manifests are rendered with `kubectl kustomize` "
        "(kubectl 1.21 or newer; tests/run.sh says how to install it)"
    )
    return subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def object_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    """(apiVersion, kind, name): how kustomize tells objects apart within one namespace."""
    return (obj["apiVersion"], obj["kind"], obj["metadata"]["name"])


@functools.cache
def _rendered(variant: str) -> tuple[dict[str, Any], ...]:
    done = _kustomize(VARIANTS[variant])
    assert done.returncode == 0, done.stderr
    return tuple(obj for obj in yaml.safe_load_all(done.stdout) if obj)


def _objects(variant: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The rendered objects by key (a fresh copy: tests may change it)."""
    return {object_key(obj): obj for obj in copy.deepcopy(_rendered(variant))}


def _one(variant: str, kind: str) -> dict[str, Any]:
    (found,) = [obj for key, obj in _objects(variant).items() if key[1] == kind]
    return found


def _pod(variant: str) -> dict[str, Any]:
    pod: dict[str, Any] = _one(variant, "Deployment")["spec"]["template"]["spec"]
    return pod


def _container(pod: dict[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    (found,) = [
        c for c in pod.get("initContainers" if init else "containers", []) if c["name"] == name
    ]
    return found


def _sidecar_config() -> dict[str, Any]:
    data = _one("base", "ConfigMap")["data"]["wedgewatch.toml"]
    parsed: dict[str, Any] = tomllib.loads(data)
    return parsed


def _port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return int(port)


# -- rendering -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_render_builds_every_kind(variant: str) -> None:
    """Each variant renders a ConfigMap, Deployment, NetworkPolicy, Service, PodMonitor and
    PrometheusRule (and the evidence claim with the persistent-evidence component)."""
    kinds = sorted(key[1] for key in _objects(variant))
    claim = ["PersistentVolumeClaim"] if variant == "persistent-evidence" else []
    assert kinds == sorted(
        [
            "ConfigMap",
            "Deployment",
            "NetworkPolicy",
            "PodMonitor",
            "PrometheusRule",
            "Service",
            *claim,
        ]
    )


def test_json_patch_test_operation_guards_indexes(tmp_path: Path) -> None:
    """The exec-probe patch fails to build on a reordered base instead of misfiring.

    Its JSON patch removes list items by index; `test` operations in front of them make
    `kubectl kustomize` refuse a base whose volumes moved.
    """
    shutil.copytree(BASE, tmp_path / "base")
    shutil.copytree(EXEC_PROBE, tmp_path / "exec-probe")
    assert _kustomize(tmp_path / "exec-probe").returncode == 0
    path = tmp_path / "base" / "deployment.yaml"
    deployment = yaml.safe_load(path.read_text(encoding="utf-8"))
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    volumes[1], volumes[2] = volumes[2], volumes[1]
    path.write_text(yaml.safe_dump(deployment), encoding="utf-8")
    done = _kustomize(tmp_path / "exec-probe")
    assert done.returncode != 0
    assert "test" in done.stderr


# -- schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_builtin_kinds_validate_against_kubernetes_schemas(variant: str, version: str) -> None:
    """Every built-in object passes kubernetes-validate's strict schema of each version."""
    builtin = [obj for key, obj in _objects(variant).items() if (key[0], key[1]) not in SCHEMAS]
    assert builtin
    for obj in builtin:
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_schemas_reject_a_misspelt_field() -> None:
    """The strict schema fails a Deployment with `livenesProbe`: validation can fail."""
    deployment = copy.deepcopy(_one("base", "Deployment"))
    vllm = deployment["spec"]["template"]["spec"]["containers"][0]
    vllm["livenesProbe"] = vllm.pop("livenessProbe")
    with pytest.raises(kv_utils.ValidationError, match="livenesProbe"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_custom_resources_validate_against_crd_schemas(variant: str) -> None:
    """PodMonitor and PrometheusRule pass the monitoring.coreos.com/v1 schemas."""
    custom = [obj for key, obj in _objects(variant).items() if (key[0], key[1]) in SCHEMAS]
    assert len(custom) == 2
    for obj in custom:
        jsonschema.validate(obj, SCHEMAS[(obj["apiVersion"], obj["kind"])])


def _first_alert(rule: dict[str, Any]) -> dict[str, Any]:
    """The first alerting rule of a PrometheusRule (not a recording rule)."""
    first: dict[str, Any] = next(
        r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r
    )
    return first


@pytest.mark.parametrize(
    ("kind", "mutate"),
    [
        ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(intervall="15s")),
        ("PodMonitor", lambda o: o["spec"]["podMetricsEndpoints"][0].update(interval="15 s")),
        ("PrometheusRule", lambda o: _first_alert(o).update(record="x")),
        ("PrometheusRule", lambda o: _first_alert(o).update(four="1m")),
    ],
    ids=["misspelt-field", "bad-duration", "record-and-alert", "unknown-rule-field"],
)
def test_crd_schemas_reject_mistakes(kind: str, mutate: Any) -> None:
    """The CRD schemas fail misspelt fields, bad durations and rules that are both kinds."""
    obj = copy.deepcopy(_one("base", kind))
    mutate(obj)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, SCHEMAS[(obj["apiVersion"], kind)])


def test_prometheus_rule_group_names_are_unique() -> None:
    """The CRD keys groups by name (x-kubernetes-list-map-keys), so names must be unique."""
    names = [g["name"] for g in _one("base", "PrometheusRule")["spec"]["groups"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_volume_mount_has_its_volume(variant: str) -> None:
    """Each volumeMount names a volume of the pod, and each volume is mounted somewhere."""
    pod = _pod(variant)
    volumes = {v["name"] for v in pod["volumes"]}
    containers = pod["containers"] + pod.get("initContainers", [])
    mounted = {m["name"] for c in containers for m in c.get("volumeMounts", [])}
    assert mounted == volumes


@pytest.mark.parametrize("variant", VARIANTS)
def test_resource_quantities_are_kubernetes_quantities(variant: str) -> None:
    """Every resource request and limit is a valid quantity (the schemas do not check)."""
    quantity = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
    pod = _pod(variant)
    for container in pod["containers"] + pod.get("initContainers", []):
        for section in container["resources"].values():
            for name, value in section.items():
                assert quantity.match(str(value)), f"{container['name']} {name}={value!r}"


# -- the sidecar variant: probes, security, resources -----------------------------------


def test_vllm_liveness_probe_asks_the_sidecar() -> None:
    """vLLM's livenessProbe is an httpGet on the sidecar's /probe, on the port it listens on."""
    pod = _pod("base")
    vllm, sidecar = _container(pod, "vllm"), _container(pod, "wedgewatch", init=True)
    probe = vllm["livenessProbe"]
    assert probe["httpGet"] == {"path": "/probe", "port": 9321}
    assert _port(sidecar, "wedgewatch") == 9321
    assert _sidecar_config()["listen_port"] == 9321
    # A restart of the sidecar (a few seconds) must not look like a wedge.
    assert probe["failureThreshold"] >= 2
    assert probe["timeoutSeconds"] <= probe["periodSeconds"]


def test_sidecar_listens_where_the_kubelet_connects() -> None:
    """The kubelet probes the pod IP, so wedgewatch must not listen on 127.0.0.1 only."""
    assert _sidecar_config()["listen_host"] == "0.0.0.0"


def test_vllm_startup_budget_covers_a_model_load() -> None:
    """vLLM's startupProbe allows at least 30 minutes, and wedgewatch waits as long."""
    vllm = _container(_pod("base"), "vllm")
    startup = vllm["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    budget = startup["failureThreshold"] * startup["periodSeconds"]
    assert budget >= 1800
    assert _sidecar_config()["startup_timeout_seconds"] >= budget


def test_vllm_readiness_follows_the_wedge_verdict() -> None:
    """Readiness asks the sidecar's /ready (503 while starting, wedged or given up)."""
    pod = _pod("base")
    vllm, sidecar = _container(pod, "vllm"), _container(pod, "wedgewatch", init=True)
    probe = vllm["readinessProbe"]
    assert probe["httpGet"] == {"path": "/ready", "port": _port(sidecar, "wedgewatch")}
    assert probe["timeoutSeconds"] <= probe["periodSeconds"]
    # The exec-probe variant has no sidecar: vLLM's own /health there.
    exec_vllm = _container(_pod("exec-probe"), "vllm")
    assert exec_vllm["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_the_target_is_named_after_the_pod() -> None:
    """The sidecar's WEDGEWATCH_TARGETS names the target after the pod (downward API), and
    the expanded value is a valid target of this pod's vLLM."""
    sidecar = _container(_pod("base"), "wedgewatch", init=True)
    env = {e["name"]: e for e in sidecar["env"]}
    names = [e["name"] for e in sidecar["env"]]
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # $(VAR) is expanded by the kubelet only from variables defined before it.
    assert names.index("POD_NAME") < names.index("WEDGEWATCH_TARGETS")
    pod_name = "vllm-7d9f8c5b4-x2kqp"
    value = env["WEDGEWATCH_TARGETS"]["value"].replace("$(POD_NAME)", pod_name)
    path = _write_sidecar_config(Path(os.environ.get("TMPDIR", "/tmp")), "named")
    loaded = ww_config.load_config(
        config_file=path, environ={"WEDGEWATCH_TARGETS": value}, flags={}
    )
    (target,) = loaded.config.targets
    assert target.name == pod_name
    vllm_port = _port(_container(_pod("base"), "vllm"), "http")
    assert target.metrics_url == f"http://127.0.0.1:{vllm_port}/metrics"


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_service_account_token_is_mounted(variant: str) -> None:
    """Neither container talks to the Kubernetes API."""
    assert _pod(variant)["automountServiceAccountToken"] is False


def test_persistent_evidence_puts_each_pods_bundles_on_the_claim() -> None:
    """The component swaps the emptyDir for the claim; each pod writes under its own name."""
    objects = _objects("persistent-evidence")
    (claim,) = [o for k, o in objects.items() if k[1] == "PersistentVolumeClaim"]
    pod = _pod("persistent-evidence")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["evidence"] == {
        "name": "evidence",
        "persistentVolumeClaim": {"claimName": claim["metadata"]["name"]},
    }
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    sidecar = _container(pod, "wedgewatch", init=True)
    (mount,) = [m for m in sidecar["volumeMounts"] if m["name"] == "evidence"]
    assert mount["mountPath"] == _sidecar_config()["evidence_dir"]
    assert mount["subPathExpr"] == "$(POD_NAME)"
    assert "POD_NAME" in {e["name"] for e in sidecar["env"]}
    # Everything else is the base.
    base = _pod("base")
    base["volumes"] = [v for v in base["volumes"] if v["name"] != "evidence"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "evidence"]
    for container in (*base["initContainers"], *pod["initContainers"]):
        for m in container["volumeMounts"]:
            m.pop("subPathExpr", None)
    assert pod == base


def test_sidecar_probes_its_own_health() -> None:
    """The sidecar is a native sidecar whose startup and liveness probes use its /health."""
    sidecar = _container(_pod("base"), "wedgewatch", init=True)
    assert sidecar["restartPolicy"] == "Always"
    for probe in ("startupProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"] == {"path": "/health", "port": "wedgewatch"}
    assert sidecar["command"] == [
        "wedgewatch",
        "run",
        "--config",
        "/etc/wedgewatch/wedgewatch.toml",
    ]


def test_sidecar_security_context_grants_only_ptrace() -> None:
    """The sidecar drops every capability but SYS_PTRACE and cannot escalate or write its image."""
    context = _container(_pod("base"), "wedgewatch", init=True)["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    # Added capabilities are only effective for UID 0 (no ambient capabilities in pods).
    assert context["runAsUser"] == 0
    assert context["runAsNonRoot"] is False


def test_vllm_container_gets_no_capabilities() -> None:
    """Only the sidecar is granted SYS_PTRACE; vLLM cannot escalate privileges."""
    vllm = _container(_pod("base"), "vllm")
    assert "capabilities" not in vllm["securityContext"]
    assert vllm["securityContext"]["allowPrivilegeEscalation"] is False


def test_pod_shares_its_process_namespace() -> None:
    """py-spy in the sidecar can only see vLLM's processes with a shared PID namespace."""
    pod = _pod("base")
    assert pod["shareProcessNamespace"] is True
    assert pod["enableServiceLinks"] is False


def test_sidecar_writes_only_to_volumes() -> None:
    """state_dir, evidence_dir and /tmp are volumes: the sidecar's root file system is read-only."""
    pod = _pod("base")
    sidecar = _container(pod, "wedgewatch", init=True)
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    settings = _sidecar_config()
    volumes = {v["name"]: v for v in pod["volumes"]}
    for path in (settings["state_dir"], settings["evidence_dir"], "/tmp"):
        assert path in mounts, path
        assert (
            "emptyDir" in volumes[mounts[path]] or "persistentVolumeClaim" in volumes[mounts[path]]
        )
    assert mounts["/etc/wedgewatch"] == "config"
    assert volumes["config"]["configMap"]["name"] == _one("base", "ConfigMap")["metadata"]["name"]


def test_evidence_retention_fits_its_volume() -> None:
    """evidence_max_bytes stays below the evidence volume's sizeLimit (else eviction)."""
    volumes = {v["name"]: v for v in _pod("base")["volumes"]}
    limit = volumes["evidence"]["emptyDir"]["sizeLimit"]
    assert limit == "1Gi"
    max_bytes = ww_config.parse_byte_size(_sidecar_config()["evidence_max_bytes"])
    assert isinstance(max_bytes, int)
    assert max_bytes < 1024**3


def test_vllm_runs_the_tp2_mitigated_profile_on_two_gpus() -> None:
    """vLLM starts through `wedgewatch launch --profile tp2-mitigated` with one GPU per TP rank:
    the production profile, not `tp2-offload`, which is kept to reproduce the wedge."""
    vllm = _container(_pod("base"), "vllm")
    command = vllm["command"]
    assert command[:2] == ["wedgewatch", "launch"]
    assert flag_value(command, "--profile") == "tp2-mitigated"
    profile = builtin_profiles()[flag_value(command, "--profile") or ""]
    tensor_parallel = int(flag_value(profile.args, "--tensor-parallel-size") or "1")
    assert tensor_parallel == 2
    for section in ("requests", "limits"):
        assert vllm["resources"][section]["nvidia.com/gpu"] == tensor_parallel
    extra = command[command.index("--") + 1 :]
    assert flag_value(extra, "--host") == "0.0.0.0"
    assert int(flag_value(extra, "--port") or "0") == _port(vllm, "http")


def test_vllm_command_renders_the_profile_through_the_launcher() -> None:
    """The container's exact launch command (as a dry run) builds the tp2-mitigated `vllm serve`."""
    vllm = _container(_pod("base"), "vllm")
    env = {e["name"]: e["value"] for e in vllm["env"] if "value" in e}
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in vllm["command"]]
    argv = [WEDGEWATCH, "launch", "--dry-run", *command[2:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rendered = done.stdout.strip()
    assert rendered.startswith("vllm serve Qwen/Qwen3-32B ")
    for flags in ("--tensor-parallel-size 2", "--host 0.0.0.0 --port 8000"):
        assert flags in rendered
    # What wedged in vLLM #53868 stays out of the production command.
    for flag in ("--kv-offloading", "--max-num-seqs", "VLLM_USE_SIMPLE_KV_OFFLOAD"):
        assert flag not in rendered


def test_sidecar_config_is_valid_and_watches_this_pods_vllm() -> None:
    """The ConfigMap's TOML loads with wedgewatch's config model and targets vLLM's port."""
    path = _write_sidecar_config(Path(os.environ.get("TMPDIR", "/tmp")), "check")
    loaded = ww_config.load_config(config_file=path, environ={}, flags={})
    settings = loaded.config
    (target,) = settings.targets
    vllm_port = _port(_container(_pod("base"), "vllm"), "http")
    assert target.metrics_url == f"http://127.0.0.1:{vllm_port}/metrics"
    # The kubelet is the restarter (through /probe); a second one would race it; "none"
    # would be observe mode, in which /probe never fails.
    assert settings.remedy == "probe"
    done = subprocess.run(
        [WEDGEWATCH, "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _write_sidecar_config(directory: Path, name: str) -> Path:
    path = directory / f"wedgewatch-{name}-{os.getpid()}.toml"
    path.write_text(_one("base", "ConfigMap")["data"]["wedgewatch.toml"], encoding="utf-8")
    return path


# -- scraping --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_pod_monitor_scrapes_named_ports_of_the_pods(variant: str) -> None:
    """PodMonitor selects the Deployment's pods and scrapes named container ports as jobs."""
    monitor = _one(variant, "PodMonitor")["spec"]
    labels = _one(variant, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= labels.items()
    pod = _pod(variant)
    ports = {
        p["name"]: c["name"]
        for c in pod["containers"] + pod.get("initContainers", [])
        for p in c.get("ports", [])
    }
    jobs = {}
    for endpoint in monitor["podMetricsEndpoints"]:
        assert endpoint["port"] in ports
        assert endpoint["path"] == "/metrics"
        (job,) = [r["replacement"] for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        jobs[job] = ports[endpoint["port"]]
    expected = (
        {"vllm": "vllm"}
        if variant == "exec-probe"
        else {"vllm": "vllm", "wedgewatch": "wedgewatch"}
    )
    assert jobs == expected


def test_service_exposes_the_api_port() -> None:
    """The Service selects the pods, targets the named API port, and is not called `vllm`."""
    service = _one("base", "Service")
    labels = _one("base", "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "http"
    assert service["metadata"]["name"] != "vllm"


# -- network exposure ------------------------------------------------------------------


def test_network_policy_admits_only_prometheus_to_the_sidecar() -> None:
    """The policy selects the pods; the sidecar's port admits Prometheus only, vLLM's API all."""
    policy = _one("base", "NetworkPolicy")["spec"]
    labels = _one("base", "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["policyTypes"] == ["Ingress"]
    pod = _pod("base")
    sidecar_port = _port(_container(pod, "wedgewatch", init=True), "wedgewatch")
    api_port = _port(_container(pod, "vllm"), "http")
    by_port = {rule["ports"][0]["port"]: rule for rule in policy["ingress"]}
    assert set(by_port) == {sidecar_port, api_port}
    assert all(len(rule["ports"]) == 1 for rule in policy["ingress"])
    assert "from" not in by_port[api_port]  # clients of the API: narrowed by the operator
    (source,) = by_port[sidecar_port]["from"]
    assert source["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
    assert source["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }


def test_sidecar_probes_come_from_the_node_which_the_policy_always_admits() -> None:
    """Every sidecar probe is an httpGet by the kubelet (from the node), never from a pod."""
    sidecar = _container(_pod("base"), "wedgewatch", init=True)
    for probe in ("startupProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["port"] == "wedgewatch"
        assert "host" not in sidecar[probe]["httpGet"]


# -- the exec-probe variant ------------------------------------------------------------


def test_exec_probe_ships_nothing_for_the_absent_sidecar() -> None:
    """No ingress rule for a port nothing serves, no wedgewatch alert group without series."""
    policy = _one("exec-probe", "NetworkPolicy")["spec"]
    ports = [p["port"] for rule in policy["ingress"] for p in rule["ports"]]
    assert ports == [_port(_container(_pod("exec-probe"), "vllm"), "http")]
    groups = [g["name"] for g in _one("exec-probe", "PrometheusRule")["spec"]["groups"]]
    assert "wedgewatch" not in groups
    assert groups == [
        g["name"]
        for g in _one("base", "PrometheusRule")["spec"]["groups"]
        if g["name"] != "wedgewatch"
    ]
    for group in _one("exec-probe", "PrometheusRule")["spec"]["groups"]:
        for rule in group["rules"]:
            assert "wedgewatch_" not in rule["expr"], rule


def test_exec_probe_variant_has_no_sidecar_and_no_ptrace() -> None:
    """Without the daemon there is no sidecar, no shared PID namespace and no SYS_PTRACE."""
    pod = _pod("exec-probe")
    assert "initContainers" not in pod
    assert pod["shareProcessNamespace"] is False
    assert "SYS_PTRACE" not in yaml.safe_dump(pod)


def test_exec_probe_runs_check_with_a_state_file() -> None:
    """The liveness probe runs `wedgewatch check --for=0 --state-file --critical-only`."""
    vllm = _container(_pod("exec-probe"), "vllm")
    probe = vllm["livenessProbe"]
    command = probe["exec"]["command"]
    assert command[:3] == ["wedgewatch", "check", "http://127.0.0.1:8000"]
    assert {"--for=0", "--critical-only"} <= set(command)
    (state_file,) = [a.split("=", 1)[1] for a in command if a.startswith("--state-file=")]
    (config_file,) = [a.split("=", 1)[1] for a in command if a.startswith("--config=")]
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    assert mounts[str(Path(config_file).parent)] == "config"
    # The state file outlives a container restart (the restart budget counts restarts): it
    # is on a pod volume, not in the container's own file system.
    volume = mounts[str(Path(state_file).parent)]
    volumes = {v["name"]: v for v in _pod("exec-probe")["volumes"]}
    assert "emptyDir" in volumes[volume]
    # Runs must come well within the shortest wedge threshold, or the state file is stale.
    assert probe["periodSeconds"] * 2 < _sidecar_config()["stall_after_seconds"]
    assert probe["timeoutSeconds"] > 5  # one scrape (scrape_timeout_seconds) plus start-up
    # Everything else is the base's.
    assert vllm["startupProbe"] == _container(_pod("base"), "vllm")["startupProbe"]


class _FixtureHandler(http.server.BaseHTTPRequestHandler):
    """Serves the body in the server's `body` attribute at /metrics."""

    def do_GET(self) -> None:
        body: bytes = self.server.body  # type: ignore[attr-defined]
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


@pytest.fixture
def metrics_server() -> Iterator[http.server.ThreadingHTTPServer]:
    """A loopback HTTP server whose /metrics body the test sets."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FixtureHandler)
    server.body = b""  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.slow
def test_exec_probe_command_passes_idle_and_fails_a_wedge(
    metrics_server: http.server.ThreadingHTTPServer, tmp_path: Path
) -> None:
    """The probe's exact command exits 0 when idle and 2 once a wedge outlasts its threshold."""
    command = _container(_pod("exec-probe"), "vllm")["livenessProbe"]["exec"]["command"]
    config_file = _write_sidecar_config(tmp_path, "exec")
    port = metrics_server.server_address[1]
    argv = [
        WEDGEWATCH
        if arg == "wedgewatch"
        else arg.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{port}")
        for arg in command
    ]
    argv = [
        f"--state-file={tmp_path / 'probe.json'}" if a.startswith("--state-file=") else a
        for a in argv
    ]
    argv = [f"--config={config_file}" if a.startswith("--config=") else a for a in argv]
    # Thresholds short enough for a test; everything else from the shipped ConfigMap.
    env = {**os.environ, "WEDGEWATCH_STALL_AFTER_SECONDS": "3"}

    def probe() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=60, env=env, check=False
        )

    metrics_server.body = (FIXTURES / "idle.prom").read_bytes()  # type: ignore[attr-defined]
    first = probe()
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.startswith("OK")

    # Requests wait, none runs, counters flat: suspect at once (0 with --critical-only),
    # wedged (CRITICAL, 2) once stall_after_seconds have passed across runs.
    metrics_server.body = (FIXTURES / "deferred_wedge.prom").read_bytes()  # type: ignore[attr-defined]
    codes = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = probe()
        codes.append(done.returncode)
        if done.returncode != 0:
            break
    assert codes[0] == 0
    assert codes[-1] == 2, done.stdout + done.stderr
    assert done.stdout.startswith("CRITICAL: wedged")


# -- Pod Security levels ---------------------------------------------------------------

# What docs/kubernetes.md ("Pod Security levels") says each variant needs.
PSS_LEVELS = {"base": "privileged", "exec-probe": "baseline", "persistent-evidence": "privileged"}


@pytest.mark.parametrize("variant", VARIANTS)
def test_pod_security_level_is_the_documented_one(variant: str) -> None:
    """The strictest Pod Security level admitting the rendered pod is the one the docs name."""
    pod = _pod(variant)
    assert pod_security.level(pod) == PSS_LEVELS[variant]
    if PSS_LEVELS[variant] == "privileged":
        # Only the sidecar's ptrace capability keeps it out of `baseline`.
        assert pod_security.baseline_violations(pod) == ["capabilities: wedgewatch adds SYS_PTRACE"]
    doc = (REPO / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    section = doc.split("## Pod Security levels", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| `{variant}/`"))
    assert f"| `{PSS_LEVELS[variant]}` |" in row


def test_pod_security_evaluator_rejects_what_the_standards_forbid() -> None:
    """The evaluator is not blind: a privileged or host-network pod is not `baseline`, and
    a pod with every restricted field set is `restricted`."""
    pod = _pod("exec-probe")
    assert pod_security.level({**pod, "hostNetwork": True}) == "privileged"
    vllm = _container(pod, "vllm")
    vllm["securityContext"] = {"privileged": True}
    assert pod_security.level(pod) == "privileged"
    vllm["securityContext"] = {
        "allowPrivilegeEscalation": False,
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }
    assert pod_security.level(pod) == "restricted"
    pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    assert pod_security.level(pod) == "privileged"
