"""`wedgewatch doctor`: will every cure and capture the configuration relies on work? (pure)

The IO shell (`wedgewatch/io/doctor.py`) reads the facts: the Yama ptrace scope, the process's
capabilities, py-spy and one real attach, the right to signal the server, the remedy's command
or unit, and whether the server answers the abort endpoint (a dry probe that aborts nothing).
This module judges them: one `Finding` per check, each with what it means and the fix, and
the exit status (non-zero when something the configuration relies on cannot work).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import Literal

from wedgewatch.core.values import immutable

Status = Literal["ok", "warn", "fail"]
DevRoutes = Literal["on", "off", "unknown"]

CAP_SYS_PTRACE = 19
"""The capability bit that lets a process ptrace any other (linux/capability.h)."""

PTRACE_SCOPES = {
    0: "classic: a process may attach to any process of the same user",
    1: "restricted: only to its own descendants, unless it holds CAP_SYS_PTRACE",
    2: "admin-only: only a process holding CAP_SYS_PTRACE may attach",
    3: "no attach: no process may ptrace another, not even root, until the next reboot",
}
"""`kernel.yama.ptrace_scope` (Documentation/admin-guide/LSM/Yama.rst)."""

DEV_MODE_FIX = (
    "start the server with VLLM_SERVER_DEV_MODE=1 (`wedgewatch launch --dev-endpoints`, or "
    "`dev_endpoints = true` in its launch profile), or turn abort_first off"
)
EXPOSURE_FIX = (
    "keep the dev routes off the client path: bind the server to 127.0.0.1 (`--host "
    "127.0.0.1`) behind a proxy that forwards only /v1/, or a NetworkPolicy that lets only "
    "wedgewatch reach the port"
)


@immutable
class Finding:
    """One check's outcome: what will or will not work, and how to fix it."""

    check: str
    status: Status
    message: str
    fix: str = ""
    target: str | None = None

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "fix": self.fix or None,
            "target": self.target,
        }


@immutable
class Plan:
    """What the configuration relies on."""

    remedy: str
    abort_first: bool = False
    pyspy_path: str = "py-spy"
    exec_command: tuple[str, ...] = ()
    systemd_unit: str = "vllm.service"


@immutable
class HostFacts:
    """Facts about this machine and this process."""

    euid: int
    effective_caps: int
    ptrace_scope: int | None  # None: no Yama LSM (the file is absent)
    pyspy: str | None  # the resolved executable, None when not found

    @property
    def can_ptrace_any(self) -> bool:
        """Whether this process holds CAP_SYS_PTRACE (root normally does)."""
        return bool(self.effective_caps >> CAP_SYS_PTRACE & 1)


@immutable
class Probe:
    """The outcome of one real probe: worked, or why not."""

    ok: bool
    detail: str
    refused: bool = False  # not tried: the process is not proven to be the server


@immutable
class TargetFacts:
    """Facts about one watched server."""

    name: str
    url: str  # redacted
    server_pid: int | None = None
    server_uid: int | None = None
    discovery_error: str | None = None
    ancestor: bool = False  # this process started the server (launch --watch)
    attach: Probe | None = None  # a real py-spy dump of the server
    signal: Probe | None = None  # the right to signal the server's processes
    remedy: Probe | None = None  # the remedy's command or unit
    dev_routes: DevRoutes = "unknown"
    dev_routes_detail: str = ""
    listen_addresses: tuple[str, ...] = ()
    url_is_loopback: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def beyond_loopback(self) -> bool:
        """Whether the server can be reached from beyond this machine's loopback."""
        if self.listen_addresses:
            return any(not _loopback(a) for a in self.listen_addresses)
        return not self.url_is_loopback


def _loopback(address: str) -> bool:
    plain = address.strip("[]").split("%", 1)[0]
    return plain.startswith("127.") or plain in ("::1", "localhost", "::ffff:127.0.0.1")


def ptrace_rights(host: HostFacts, *, same_uid: bool | None, ancestor: bool) -> Finding:
    """Whether the kernel lets this process ptrace the server (py-spy's stacks need it)."""
    scope = host.ptrace_scope
    cap = host.can_ptrace_any
    meaning = "no Yama LSM" if scope is None else f"{scope} ({PTRACE_SCOPES.get(scope, '?')})"
    said = f"kernel.yama.ptrace_scope = {meaning}"
    who = "with CAP_SYS_PTRACE" if cap else f"as uid {host.euid} without CAP_SYS_PTRACE"
    grant = (
        "run wedgewatch as root, or give it CAP_SYS_PTRACE (systemd: "
        "AmbientCapabilities=CAP_SYS_PTRACE; Kubernetes: securityContext.capabilities.add: "
        "[SYS_PTRACE])"
    )
    if scope == 3:
        return Finding(
            "ptrace",
            "fail",
            f"{said}: py-spy cannot read any stack here",
            "set kernel.yama.ptrace_scope to 1 or lower in /etc/sysctl.d and reboot (3 cannot "
            "be lowered while the machine runs)",
        )
    if scope == 2 and not cap:
        return Finding("ptrace", "fail", f"{said}; wedgewatch runs {who}", grant)
    if scope == 1 and not cap and not ancestor:
        return Finding(
            "ptrace",
            "fail",
            f"{said}; wedgewatch runs {who} and did not start the server",
            f"{grant}; or `sudo sysctl -w kernel.yama.ptrace_scope=0`; or run the server "
            "under `wedgewatch launch --watch`",
        )
    if not cap and same_uid is False:
        return Finding(
            "ptrace",
            "fail",
            f"{said}; the server runs as another user and wedgewatch {who}",
            f"{grant}, or run wedgewatch as the server's user",
        )
    if not cap and same_uid is None:
        return Finding(
            "ptrace",
            "warn",
            f"{said}; wedgewatch runs {who}: it may attach only to a server of its own user "
            "(the server's user is not known now)",
            grant,
        )
    return Finding("ptrace", "ok", f"{said}; wedgewatch runs {who}: it may attach")


def judge_host(plan: Plan, host: HostFacts) -> list[Finding]:
    """The checks that do not depend on a server: py-spy present."""
    if host.pyspy is None:
        return [
            Finding(
                "py-spy",
                "fail",
                f"py-spy ({plan.pyspy_path!r}) was not found: no stacks in the evidence",
                "install it (`pip install py-spy`, it comes with wedgewatch) or set pyspy_path",
            )
        ]
    return [Finding("py-spy", "ok", f"py-spy found: {host.pyspy}")]


def judge_target(plan: Plan, host: HostFacts, target: TargetFacts) -> list[Finding]:
    """The checks for one server: captures, remedy, abort, exposure."""
    name = target.name
    found: list[Finding] = []

    def add(check: str, status: Status, message: str, fix: str = "") -> None:
        found.append(Finding(check, status, message, fix, name))

    same_uid = None if target.server_uid is None else target.server_uid == host.euid
    rights = ptrace_rights(host, same_uid=same_uid, ancestor=target.ancestor)
    if target.attach is not None and host.pyspy is not None:
        if target.attach.ok:
            add("py-spy attach", "ok", f"py-spy read the stacks of pid {target.server_pid}")
        elif target.attach.refused:
            add(
                "py-spy attach",
                "warn",
                f"pid {target.server_pid} was not attached: {target.attach.detail}",
                "check that the URL reaches the vLLM server, or give the target's pid or pid_file",
            )
        else:
            add(
                "py-spy attach",
                "fail",
                f"py-spy could not read pid {target.server_pid}: {target.attach.detail}",
                rights.fix,
            )
    add(rights.check, rights.status, rights.message, rights.fix)
    if target.server_pid is None:
        add(
            "server",
            "warn",
            f"the server's processes were not found ({target.discovery_error or 'unknown'}): "
            "nothing that needs them could be tried",
            "start the server, or give the target's pid or pid_file",
        )
    found.extend(_judge_remedy(plan, target))
    found.extend(_judge_abort(plan, target))
    return found


def _judge_remedy(plan: Plan, target: TargetFacts) -> list[Finding]:
    name = target.name
    remedy = plan.remedy
    if remedy == "none":
        return [Finding("remedy", "ok", "observe mode: nothing is restarted or aborted", "", name)]
    if remedy == "probe":
        return [
            Finding(
                "remedy",
                "ok",
                "remedy probe: the kubelet restarts the server when /probe fails (give the "
                "container a liveness probe on wedgewatch's /probe)",
                "",
                name,
            )
        ]
    if remedy == "supervise":
        return [Finding("remedy", "ok", "wedgewatch runs the server itself", "", name)]
    probe = target.signal if remedy == "signal" else target.remedy
    fixes = {
        "signal": "run wedgewatch as the server's user or as root (in Kubernetes: "
        "shareProcessNamespace: true and the same runAsUser)",
        "systemd": f"check the unit name (systemd_unit, now {plan.systemd_unit!r}) and that "
        "wedgewatch may restart it (root, or a polkit rule for its user)",
        "exec": "give exec_command an executable (an absolute path, or a name on PATH)",
    }
    if probe is None:
        return [
            Finding(
                "remedy",
                "warn",
                f"remedy {remedy}: not checked (no server process found)",
                "",
                name,
            )
        ]
    if probe.ok:
        return [Finding("remedy", "ok", f"remedy {remedy}: {probe.detail}", "", name)]
    return [
        Finding("remedy", "fail", f"remedy {remedy}: {probe.detail}", fixes.get(remedy, ""), name)
    ]


def _judge_abort(plan: Plan, target: TargetFacts) -> list[Finding]:
    name = target.name
    found: list[Finding] = []
    detail = f" ({target.dev_routes_detail})" if target.dev_routes_detail else ""
    if plan.abort_first:
        if target.dev_routes == "on":
            found.append(Finding("abort", "ok", f"the abort endpoint answers{detail}", "", name))
        elif target.dev_routes == "off":
            found.append(
                Finding(
                    "abort",
                    "fail",
                    f"abort_first is on but the server has no /abort_requests{detail}: every "
                    "wedge goes straight to the restart",
                    DEV_MODE_FIX,
                    name,
                )
            )
        else:
            found.append(
                Finding(
                    "abort",
                    "fail",
                    f"abort_first is on but whether the server answers /abort_requests could "
                    f"not be told{detail}",
                    "start the server, then run `wedgewatch doctor` again",
                    name,
                )
            )
    elif target.dev_routes == "on":
        found.append(
            Finding(
                "abort",
                "ok",
                f"the server has vLLM's dev endpoints{detail}; abort_first is off, so they "
                "are not used",
                "",
                name,
            )
        )
    if target.dev_routes == "on" and target.beyond_loopback:
        where = ", ".join(target.listen_addresses) or target.url
        found.append(
            Finding(
                "exposure",
                "warn",
                f"the dev routes are on and the server listens beyond loopback ({where}): "
                "anyone who reaches the port can abort, pause, sleep or /collective_rpc it "
                "(the API key does not guard them)",
                EXPOSURE_FIX,
                name,
            )
        )
    return found


def judge(plan: Plan, host: HostFacts, targets: Sequence[TargetFacts]) -> list[Finding]:
    """Every finding, host first, then each target's."""
    findings = judge_host(plan, host)
    for target in targets:
        findings.extend(judge_target(plan, host, target))
    return findings


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when something the configuration relies on cannot work, else 0."""
    return 1 if any(f.status == "fail" for f in findings) else 0


def problems(findings: Sequence[Finding]) -> list[Finding]:
    """The findings worth a log line at daemon start (warnings and failures)."""
    return [f for f in findings if f.status != "ok"]


def render(findings: Sequence[Finding]) -> list[str]:
    """Human-readable lines: one per finding, its fix indented below it."""
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}
    lines = []
    for finding in findings:
        where = f"[{finding.target}] " if finding.target else ""
        lines.append(f"{marks[finding.status]} {finding.check}: {where}{finding.message}")
        if finding.fix and finding.status != "ok":
            lines.append(f"     fix: {finding.fix}")
    failing = sum(1 for f in findings if f.status == "fail")
    lines.append(
        "everything the configuration relies on can work"
        if not failing
        else f"{failing} check(s) failed: what they name will not work until fixed"
    )
    return lines
