"""`wedgewatch doctor` and the start-up check: read the facts the core judges (IO).

Every lookup is a field of `Lookups`, so a test can put this machine's ptrace scope at 3, take
py-spy away or deny a signal without touching the machine. The probes act on nothing: py-spy
dumps the server once with `--nonblocking` (it does not pause it), the signal right is tested
with signal 0, `systemctl show` reads a unit, and the abort endpoint is looked up in
`/openapi.json` (or, when the server hides its docs, with `GET /is_paused`), never called.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import psutil
import structlog

from wedgewatch.core.restart import doctor
from wedgewatch.core.restart.doctor import (
    DevRoutes,
    Finding,
    HostFacts,
    Plan,
    Probe,
    TargetFacts,
    exit_code,
    render,
)
from wedgewatch.core.text.redact import redact_url
from wedgewatch.io import http_get as http_get_io
from wedgewatch.io import procs, pyspy, scrape_rules
from wedgewatch.io.canary import base_url_of, endpoint
from wedgewatch.io.procs import ProcessFinder, ProcessSelector, PsutilProcessFinder
from wedgewatch.vllm.semantics import Role

log = structlog.get_logger("wedgewatch.doctor")


class Target(Protocol):
    """A watched server as the configuration names it (`wedgewatch.config.Target`)."""

    @property
    def name(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def metrics_url(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def pid_file(self) -> Path | None: ...
    @property
    def systemd_unit(self) -> str | None: ...


class Settings(Protocol):
    """What the doctor reads of the configuration (`wedgewatch.config.Config`)."""

    @property
    def remedy(self) -> str: ...
    @property
    def pyspy_path(self) -> str: ...
    @property
    def exec_command(self) -> tuple[str, ...]: ...
    @property
    def systemd_unit(self) -> str: ...
    @property
    def abort_first(self) -> bool: ...
    @property
    def targets(self) -> Sequence[Target]: ...


PTRACE_SCOPE_FILE = Path("/proc/sys/kernel/yama/ptrace_scope")
PROBE_TIMEOUT_SECONDS = 5.0
PROBE_BODY_BYTES = 4 * 1024 * 1024
"""vLLM's /openapi.json is a few hundred KiB; anything past this is not a vLLM answer."""
ATTACH_TIMEOUT_SECONDS = 30.0


def read_ptrace_scope(path: Path = PTRACE_SCOPE_FILE) -> int | None:
    """`kernel.yama.ptrace_scope`, or None without the Yama LSM."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def read_effective_caps(status: Path = Path("/proc/self/status")) -> int:
    """This process's effective capability mask (`CapEff`), 0 when unreadable."""
    with contextlib.suppress(OSError, ValueError):
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def run_command(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
    """Run `argv` without a shell: (exit code, stdout, stderr); 127 when it cannot start."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError as exc:
        return 127, "", str(exc)
    except subprocess.TimeoutExpired:
        return 124, "", f"no answer within {timeout:g} s"
    except OSError as exc:
        return 126, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def signal_probe(pid: int) -> Probe:
    """Whether this process may signal `pid`'s process group (signal 0 sends nothing)."""
    try:
        pgid = os.getpgid(pid)
        os.killpg(pgid, 0)
    except PermissionError:
        return Probe(False, f"not allowed to signal the server's process group (pid {pid})")
    except ProcessLookupError:
        return Probe(False, f"pid {pid} is gone")
    return Probe(True, f"may signal the server's process group {pgid}")


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """GET `url` under one total deadline, reading at most `PROBE_BODY_BYTES`: (status, body),
    or (0, the error) when it does not answer (a trickling or huge answer is cut off)."""
    result = http_get_io.fetch(url, timeout_seconds=timeout, max_body_bytes=PROBE_BODY_BYTES)
    if isinstance(result, scrape_rules.Fetched):
        return result.status, result.body.decode("utf-8", errors="replace")
    if result.reason == "http_status":
        words = result.detail.split(" ", 2)
        if len(words) > 1 and words[1].isdigit():
            return int(words[1]), result.detail
    return 0, result.detail


def listen_addresses(pids: Sequence[int], port: int | None) -> tuple[str, ...]:
    """The addresses the server's processes listen on (on `port` when known)."""
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                wanted = port is None or (conn.laddr and conn.laddr.port == port)
                if conn.status == psutil.CONN_LISTEN and conn.laddr and wanted:
                    found.add(conn.laddr.ip)
    return tuple(sorted(found))


@dataclass(frozen=True, slots=True)
class Lookups:
    """Every way the doctor reads the machine; tests replace any of them."""

    ptrace_scope: Callable[[], int | None] = read_ptrace_scope
    effective_caps: Callable[[], int] = read_effective_caps
    euid: Callable[[], int] = os.geteuid
    resolve_pyspy: Callable[[str], str | None] = pyspy.resolve_pyspy
    run: Callable[[Sequence[str], float], tuple[int, str, str]] = run_command
    finder: ProcessFinder = field(default_factory=PsutilProcessFinder)
    signal: Callable[[int], Probe] = signal_probe
    get: Callable[[str, float], tuple[int, str]] = http_get
    listens: Callable[[Sequence[int], int | None], tuple[str, ...]] = listen_addresses
    which: Callable[[str], str | None] = shutil.which


def one_pass_lookups() -> Lookups:
    """The machine's lookups for one pass over the targets: its listening sockets read
    once for every target's discovery and listen addresses, not once per target."""
    finder = PsutilProcessFinder(keep_sockets=True)
    return Lookups(finder=finder, listens=finder.listen_addresses)


def plan_of(config: Settings) -> Plan:
    """What `config` relies on."""
    return Plan(
        remedy=config.remedy,
        abort_first=config.abort_first,
        pyspy_path=config.pyspy_path,
        exec_command=tuple(config.exec_command),
        systemd_unit=config.systemd_unit,
    )


def host_facts(plan: Plan, lookups: Lookups) -> HostFacts:
    """This machine's and this process's facts."""
    return HostFacts(
        euid=lookups.euid(),
        effective_caps=lookups.effective_caps(),
        ptrace_scope=lookups.ptrace_scope(),
        pyspy=lookups.resolve_pyspy(plan.pyspy_path),
    )


def dev_routes(base_url: str, lookups: Lookups) -> tuple[DevRoutes, str]:
    """Whether the server serves vLLM's abort endpoint, asked without acting on anything."""
    status, body = lookups.get(endpoint(base_url, "/openapi.json"), PROBE_TIMEOUT_SECONDS)
    if status == 200:
        try:
            paths = json.loads(body).get("paths", {})
        except (ValueError, AttributeError):
            paths = None
        if isinstance(paths, dict):
            if "/abort_requests" in paths:
                return "on", "/openapi.json lists /abort_requests"
            return "off", "/openapi.json does not list /abort_requests"
    if status == 0:
        return "unknown", f"the server did not answer: {body}"
    status, _ = lookups.get(endpoint(base_url, "/is_paused"), PROBE_TIMEOUT_SECONDS)
    if status == 200:
        return "on", "GET /is_paused answers"
    if status == 404:
        return "off", "GET /is_paused is 404 (no dev mode)"
    return "unknown", f"GET /is_paused answered {status}"


def _remedy_probe(plan: Plan, target: Target, lookups: Lookups) -> Probe | None:
    if plan.remedy == "exec":
        program = plan.exec_command[0] if plan.exec_command else ""
        if os.sep in program:
            ok = Path(program).is_file() and os.access(program, os.X_OK)
            return Probe(ok, f"{program} {'is executable' if ok else 'is not an executable file'}")
        found = lookups.which(program) if program else None
        return Probe(
            found is not None,
            f"{program} is {found}" if found else f"{program!r} is not on PATH",
        )
    if plan.remedy == "systemd":
        unit = target.systemd_unit or plan.systemd_unit
        code, out, err = lookups.run(
            ("systemctl", "show", "--property=LoadState", "--value", unit), PROBE_TIMEOUT_SECONDS
        )
        if code == 127:
            return Probe(False, "systemctl is not on PATH")
        state = out.strip()
        if code == 0 and state == "loaded":
            return Probe(True, f"unit {unit} is loaded")
        return Probe(False, f"unit {unit}: LoadState={state or '?'} {err.strip()[:200]}".strip())
    return None


def target_facts(
    plan: Plan,
    host: HostFacts,
    target: Target,
    lookups: Lookups,
    *,
    attach: bool = True,
    ancestor: bool = False,
) -> TargetFacts:
    """One server's facts."""
    selector = ProcessSelector(
        url=target.url, pid=target.pid, pid_file=target.pid_file, systemd_unit=target.systemd_unit
    )
    discovery = lookups.finder.discover(selector)
    root = discovery.root_pid if discovery.processes else None
    engine = (discovery.pids(Role.ENGINE_CORE) or (root,))[0] if root is not None else None
    uid: int | None = None
    if root is not None:
        with contextlib.suppress(psutil.Error):
            uid = psutil.Process(root).uids().effective
    attached: Probe | None = None
    refusal = procs.dump_refusal(discovery) if root is not None else None
    if refusal is not None:  # never py-spy (ptrace) a process not proven to be the server
        attached = Probe(False, refusal, refused=True)
    elif attach and engine is not None and host.pyspy is not None:
        code, out, err = lookups.run(
            (host.pyspy, "dump", "--nonblocking", "--pid", str(engine)), ATTACH_TIMEOUT_SECONDS
        )
        status, message = pyspy.classify_output(code, out, err)
        attached = Probe(status == pyspy.DumpStatus.OK, message or str(status))
    base = base_url_of(target.metrics_url)
    routes, routes_detail = dev_routes(base, lookups)
    port = urlsplit(target.url).port
    host_name = urlsplit(target.url).hostname or ""
    return TargetFacts(
        name=target.name,
        url=redact_url(target.url),
        server_pid=root,
        server_uid=uid,
        discovery_error=discovery.error,
        ancestor=ancestor,
        attach=attached,
        signal=lookups.signal(root) if root is not None and plan.remedy == "signal" else None,
        remedy=_remedy_probe(plan, target, lookups),
        dev_routes=routes,
        dev_routes_detail=routes_detail,
        listen_addresses=lookups.listens([p.pid for p in discovery.processes], port)
        if root is not None
        else (),
        url_is_loopback=host_name in ("localhost", "::1") or host_name.startswith("127."),
    )


def examine(
    config: Settings,
    *,
    only: str | None = None,
    lookups: Lookups | None = None,
    attach: bool = True,
    ancestor: bool = False,
) -> list[Finding]:
    """Every finding for `config` (only the target named or with URL `only`, when given)."""
    lookups = lookups or one_pass_lookups()
    plan = plan_of(config)
    host = host_facts(plan, lookups)
    targets = [t for t in config.targets if only is None or only in (t.name, t.url, t.metrics_url)]
    facts = [
        target_facts(plan, host, t, lookups, attach=attach, ancestor=ancestor) for t in targets
    ]
    return doctor.judge(plan, host, facts)


def log_problems(findings: Sequence[Finding]) -> None:
    """At daemon start: one log line per problem (nothing when all is well)."""
    for finding in doctor.problems(findings):
        emit = log.error if finding.status == "fail" else log.warning
        emit(
            "doctor_" + finding.status,
            check=finding.check,
            target=finding.target,
            message=finding.message,
            fix=finding.fix or None,
        )


def check_in_background(
    config: Settings, *, ancestor: bool = False, lookups: Lookups | None = None
) -> threading.Thread:
    """The start-up check: `examine` in a thread (a slow server must not hold the daemon's
    start), then a log line per problem."""

    def run() -> None:
        try:
            log_problems(examine(config, lookups=lookups, ancestor=ancestor))
        except Exception as exc:  # the check must never take the daemon down
            log.warning("doctor_error", error=f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="wedgewatch-doctor", daemon=True)
    thread.start()
    return thread


__all__ = [
    "Lookups",
    "check_in_background",
    "examine",
    "exit_code",
    "log_problems",
    "render",
]
