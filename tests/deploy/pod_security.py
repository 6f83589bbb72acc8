"""The Pod Security Standards' controls (kubernetes.io/docs/concepts/security/
pod-security-standards), evaluated on a pod spec: which controls of `baseline` and
`restricted` it breaks, so the tests can name the level each variant needs.

Only what a Deployment's pod template can set is checked; Windows HostProcess, AppArmor
and SELinux options are checked for being unset or default, as the manifests leave them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

#: Capabilities `baseline` allows to add; `restricted` allows only NET_BIND_SERVICE.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
        "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
    }
)  # fmt: skip
#: Volume types `restricted` allows.
RESTRICTED_VOLUMES = frozenset(
    {
        "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
        "projected", "secret",
    }
)  # fmt: skip
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    }
)  # fmt: skip


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(field, [])


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """The `baseline` controls the pod breaks, one sentence each."""
    found = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append(f"host namespaces: {field}")
    pod_context = pod.get("securityContext", {})
    if pod_context.get("windowsOptions", {}).get("hostProcess"):
        found.append("hostProcess")
    for sysctl in pod_context.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append(f"sysctls: {sysctl['name']}")
    if pod_context.get("seccompProfile", {}).get("type") == "Unconfined":
        found.append("seccomp: pod Unconfined")
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            found.append(f"hostPath volume {volume['name']}")
    for container in _containers(pod):
        name = container["name"]
        context = container.get("securityContext", {})
        if context.get("privileged"):
            found.append(f"privileged container {name}")
        if context.get("windowsOptions", {}).get("hostProcess"):
            found.append(f"hostProcess container {name}")
        added = set(context.get("capabilities", {}).get("add", []))
        for capability in sorted(added - BASELINE_CAPABILITIES):
            found.append(f"capabilities: {name} adds {capability}")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                found.append(f"host ports: {name}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"procMount: {name}")
        if context.get("seccompProfile", {}).get("type") == "Unconfined":
            found.append(f"seccomp: {name} Unconfined")
        if context.get("appArmorProfile", {}).get("type") == "Unconfined":
            found.append(f"AppArmor: {name} Unconfined")
    return found


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The `restricted` controls the pod breaks (those of `baseline` included)."""
    found = baseline_violations(pod)
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume types: {volume['name']} is {sorted(kinds)}")
    pod_context = pod.get("securityContext", {})
    for container in _containers(pod):
        name = container["name"]
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"privilege escalation: {name} does not set it false")
        non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"running as non-root: {name} does not set runAsNonRoot")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"running as non-root user: {name} runs as UID 0")
        seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append(f"seccomp: {name} sets no RuntimeDefault or Localhost profile")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append(f"capabilities: {name} does not drop ALL")
        for capability in sorted(set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}):
            found.append(f"capabilities: {name} adds {capability} (restricted)")
    return found


def level(pod: dict[str, Any]) -> str:
    """The strictest Pod Security level that admits the pod."""
    if not restricted_violations(pod):
        return "restricted"
    if not baseline_violations(pod):
        return "baseline"
    return "privileged"
