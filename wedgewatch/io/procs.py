"""Find a vLLM server's processes: the pid listening on the target's port, its descendants, titles.

Pure parts (classification from `(pid, ppid, title)` records, pid-file and URL parsing,
CPU-percent arithmetic) sit above the psutil adapter `PsutilProcessFinder`.

Titles come from the command line, not from `/proc/<pid>/comm`: the kernel cuts `comm` to
15 bytes (`VLLM::EngineCor`, and both `VLLM::Worker_TP0` and `_TP1` read `VLLM::Worker_TP`),
while a `setproctitle` title replaces the whole argv area and shows in full there.

A process that vanishes while it is being looked at is a note in the result, never an
exception: the server being examined is often in the middle of dying.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import psutil

from wedgewatch.core.evidence.proc_state import (
    ProcState,
    parse_kernel_stack,
    parse_stat_state,
    sigstop_pending,
)
from wedgewatch.core.restart.server_proof import (
    cgroup_in_unit,
    is_this_machine,
    plain_ip,
    prove_server,
)
from wedgewatch.io.http_parse import port_of
from wedgewatch.vllm.semantics import Role, classify_role

_WILDCARD_IPS = frozenset({"0.0.0.0", "::", "::0"})


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    """The raw facts about one process, as read from the system."""

    pid: int
    ppid: int
    title: str
    status: str = "running"


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """One process of the watched server, with its role."""

    pid: int
    ppid: int
    title: str
    role: Role
    status: str = "running"

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "title": self.title,
            "role": str(self.role),
            "status": self.status,
        }


@dataclass(frozen=True, slots=True)
class ProcessSelector:
    """How the server's root process is found; the first that is set wins: pid, pid_file, url."""

    url: str | None = None
    pid: int | None = None
    pid_file: Path | None = None
    systemd_unit: str | None = None  # a listener in this unit's cgroup counts as named

    def describe(self) -> str:
        """Human-readable source of the root pid, for a bundle's summary (raw: the bundle
        writer redacts it)."""
        if self.pid is not None:
            return f"pid {self.pid}"
        if self.pid_file is not None:
            return f"pid file {self.pid_file}"
        if self.url is not None:
            return f"listener of {self.url}"
        return "nothing (no url, pid or pid file configured)"


@dataclass(frozen=True, slots=True)
class Discovery:
    """The server's processes, or why they could not be found."""

    source: str
    root_pid: int | None
    processes: tuple[ServerProcess, ...]
    error: str | None = None
    notes: tuple[str, ...] = ()
    explicit: bool = False  # the root came from a configured pid or pid file, not a port
    root_create_time: float | None = None  # tells a new root process from an old one
    gone: bool = False  # the server is not there: nothing listens, its pid no longer runs

    def pids(self, role: Role) -> tuple[int, ...]:
        """Pids with the given role, in discovery order."""
        return tuple(p.pid for p in self.processes if p.role is role)

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {
            "source": self.source,
            "root_pid": self.root_pid,
            "error": self.error,
            "notes": list(self.notes),
            "explicit": self.explicit,
            "processes": [p.to_json() for p in self.processes],
        }


class ProcessFinder(Protocol):
    """Finds the processes of a server (psutil in production)."""

    def discover(self, selector: ProcessSelector) -> Discovery:
        """Return the server's processes; failures are data in the result."""
        ...


# --------------------------------------------------------------------------- pure core


def title_from_cmdline(cmdline: Sequence[str], name: str = "") -> str:
    """The process title: the command line joined, or the (15-byte) comm name when it is empty.

    `setproctitle` pads the argv area with NULs, which psutil returns as empty arguments.
    """
    title = " ".join(arg for arg in cmdline if arg).strip()
    return title or name


def descendants(records: Iterable[ProcessRecord], root_pid: int) -> tuple[ProcessRecord, ...]:
    """The root's record followed by all its descendants, breadth first, siblings by pid.

    Records not connected to the root are left out; a cycle in bad input cannot loop.
    """
    by_pid = {r.pid: r for r in records}
    children: dict[int, list[ProcessRecord]] = {}
    for record in by_pid.values():
        if record.pid != root_pid:
            children.setdefault(record.ppid, []).append(record)
    if root_pid not in by_pid:
        return ()
    ordered: list[ProcessRecord] = []
    seen: set[int] = set()
    frontier = [by_pid[root_pid]]
    while frontier:
        nxt: list[ProcessRecord] = []
        for record in frontier:
            if record.pid in seen:
                continue
            seen.add(record.pid)
            ordered.append(record)
            nxt.extend(sorted(children.get(record.pid, ()), key=lambda r: r.pid))
        frontier = nxt
    return tuple(ordered)


def build_tree(
    records: Iterable[ProcessRecord], root_pid: int, listener_pids: Iterable[int] = ()
) -> tuple[ServerProcess, ...]:
    """Classify the root and its descendants; the root and every listener count as listeners."""
    listening = {root_pid, *listener_pids}
    return tuple(
        ServerProcess(
            pid=r.pid,
            ppid=r.ppid,
            title=r.title,
            role=classify_role(r.title, is_listener=r.pid in listening),
            status=r.status,
        )
        for r in descendants(records, root_pid)
    )


def parse_pid_file(text: str, path: Path) -> int | str:
    """The pid in a pid file's text, or a specific error message."""
    stripped = text.strip()
    if not stripped:
        return f"pid file {path} is empty"
    first = stripped.split()[0]
    if not first.isdigit():
        return f"pid file {path} does not start with a process id: {stripped[:40]!r}"
    pid = int(first)
    if pid <= 0:
        return f"pid file {path} holds {pid}, which is not a valid process id"
    return pid


def endpoint_of_url(url: str) -> tuple[str, int] | str:
    """(host, port) of an http(s) URL, with the scheme's default port; or an error message."""
    try:
        parts = urlsplit(url)
        port = port_of(parts)
    except ValueError as exc:
        return f"cannot read a port from {url!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"not an http(s) URL with a host: {url!r}"
    return parts.hostname, port


@dataclass(frozen=True, slots=True)
class ListeningSocket:
    """A TCP socket in LISTEN state."""

    ip: str
    port: int
    pid: int | None


def _same_host(listen_ip: str, host: str, host_ips: Iterable[str] = ()) -> bool:
    if listen_ip in _WILDCARD_IPS:
        return True
    if host == "localhost":
        return listen_ip in ("127.0.0.1", "::1") or listen_ip.startswith("127.")
    candidates = {host, *host_ips}
    try:
        listen = ipaddress.ip_address(listen_ip)
    except ValueError:
        return False
    for candidate in candidates:
        try:
            if ipaddress.ip_address(candidate) == listen:
                return True
        except ValueError:
            continue
    return False


def pick_listeners(
    sockets: Iterable[ListeningSocket], host: str, port: int, host_ips: Iterable[str] = ()
) -> tuple[tuple[int, ...], int]:
    """Pids listening on `port` at `host` (a wildcard address, the host's IP, or one of the
    addresses `host_ips` it resolves to), and how many such sockets had no visible pid
    (another user's process seen without privileges).

    A process on the same port at another address is never picked: it is not the server
    the URL reaches, and a signal or a py-spy dump must not land on it.
    """
    ips = tuple(host_ips)
    matching = [s for s in sockets if s.port == port and _same_host(s.ip, host, ips)]
    pids = tuple(sorted({s.pid for s in matching if s.pid is not None}))
    hidden = sum(1 for s in matching if s.pid is None)
    return pids, hidden


def choose_root(listeners: Sequence[int], parents: Mapping[int, int]) -> int:
    """The listener that is not a descendant of another listener (the lowest pid on a tie).

    With `--api-server-count > 1` vLLM's parent creates the socket and its API-server
    children share it; the parent is the root of the whole server.
    """
    candidates = set(listeners)

    def has_listening_ancestor(pid: int) -> bool:
        seen: set[int] = set()
        current = parents.get(pid)
        while current is not None and current not in seen and current > 1:
            if current in candidates:
                return True
            seen.add(current)
            current = parents.get(current)
        return False

    roots = sorted(pid for pid in candidates if not has_listening_ancestor(pid))
    return roots[0] if roots else min(candidates)


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """Counters of one process at one instant (for CPU percent over a sample)."""

    pid: int
    cpu_user_seconds: float
    cpu_system_seconds: float
    rss_bytes: int
    num_threads: int
    create_time: float
    status: str


@dataclass(frozen=True, slots=True)
class ProcessStats:
    """One process in `processes.json`: identity plus a short CPU sample."""

    process: ServerProcess
    reading: ProcessReading | None
    cpu_percent: float | None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        out = self.process.to_json()
        if self.reading is not None:
            out.update(
                status=self.reading.status,
                cpu_user_seconds=self.reading.cpu_user_seconds,
                cpu_system_seconds=self.reading.cpu_system_seconds,
                cpu_percent=self.cpu_percent,
                rss_bytes=self.reading.rss_bytes,
                num_threads=self.reading.num_threads,
                create_time=self.reading.create_time,
            )
        out["error"] = self.error
        return out


def combine_samples(
    processes: Sequence[ServerProcess],
    before: Mapping[int, ProcessReading | str],
    after: Mapping[int, ProcessReading | str],
    elapsed_seconds: float,
) -> tuple[ProcessStats, ...]:
    """CPU percent of each process over the sample (100 = one core); errors kept per process.

    A pid whose create time changed between the readings was reused: no percent.
    """
    stats: list[ProcessStats] = []
    for proc in processes:
        first, last = before.get(proc.pid), after.get(proc.pid)
        if isinstance(last, ProcessReading):
            percent: float | None = None
            error: str | None = None
            if isinstance(first, ProcessReading) and first.create_time == last.create_time:
                used = (last.cpu_user_seconds + last.cpu_system_seconds) - (
                    first.cpu_user_seconds + first.cpu_system_seconds
                )
                if elapsed_seconds > 0:
                    percent = round(max(used, 0.0) / elapsed_seconds * 100.0, 1)
            elif isinstance(first, str):
                error = f"first sample failed: {first}"
            stats.append(ProcessStats(proc, last, percent, error))
        elif isinstance(first, ProcessReading):
            stats.append(ProcessStats(proc, first, None, f"vanished during the CPU sample: {last}"))
        else:
            stats.append(ProcessStats(proc, None, None, str(last or first or "not read")))
    return tuple(stats)


# --------------------------------------------------------------------------- psutil adapter


class Gone(str):
    """Why the server's processes were not found, when the reason is that it is not there:
    no process listens on its port, its pid no longer runs or its pid file is gone (a crash
    or a stop). Still a `str` wherever a reason is one; `Discovery.gone` records it."""

    __slots__ = ()


def _describe_psutil_error(exc: psutil.Error, pid: int) -> str:
    if isinstance(exc, psutil.ZombieProcess):
        return Gone(f"pid {pid} is a zombie (exited, not yet reaped)")
    if isinstance(exc, psutil.NoSuchProcess):
        return Gone(f"pid {pid} no longer exists")
    if isinstance(exc, psutil.AccessDenied):
        return f"access denied reading pid {pid} (run as the server's user or root)"
    return f"pid {pid}: {exc}"


def read_record(pid: int) -> ProcessRecord | str:
    """One process's record, or why it could not be read."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            ppid = proc.ppid()
            name = proc.name()
            status = proc.status()
            try:
                cmdline = proc.cmdline()
            except (psutil.AccessDenied, psutil.ZombieProcess):
                cmdline = []
        return ProcessRecord(pid, ppid, title_from_cmdline(cmdline, name), status)
    except psutil.Error as exc:
        return _describe_psutil_error(exc, pid)


def read_reading(pid: int) -> ProcessReading | str:
    """One process's counters, or why they could not be read."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            return ProcessReading(
                pid=pid,
                cpu_user_seconds=times.user,
                cpu_system_seconds=times.system,
                rss_bytes=proc.memory_info().rss,
                num_threads=proc.num_threads(),
                create_time=proc.create_time(),
                status=proc.status(),
            )
    except psutil.Error as exc:
        return _describe_psutil_error(exc, pid)


def read_readings(pids: Iterable[int]) -> dict[int, ProcessReading | str]:
    """Counters of several processes."""
    return {pid: read_reading(pid) for pid in pids}


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_proc_state(pid: int, proc: str = "/proc") -> ProcState:
    """The process's state letter, pending SIGSTOP, stopped threads, wchan and kernel stack.

    Only reads /proc: never signals or attaches to the process, so reading it cannot change
    the state it reports. `/proc/PID/stack` needs root (CAP_SYS_ADMIN); without it the
    reason is kept in `kernel_stack_error`.
    """
    stat = _read_text(f"{proc}/{pid}/stat")
    state = parse_stat_state(stat) if stat is not None else None
    if state is None:
        return ProcState(pid, None)
    status = _read_text(f"{proc}/{pid}/status") or ""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        tids = []
    stopped = 0
    for tid in tids:
        task_stat = _read_text(f"{proc}/{pid}/task/{tid}/stat")
        if task_stat is not None and parse_stat_state(task_stat) in ("T", "t"):
            stopped += 1
    wchan = (_read_text(f"{proc}/{pid}/wchan") or "").strip()
    stack: tuple[str, ...] = ()
    stack_error: str | None = None
    try:
        with open(f"{proc}/{pid}/stack", encoding="utf-8", errors="replace") as f:
            stack = parse_kernel_stack(f.read())
    except PermissionError:
        stack_error = "kernel stack not readable (needs root)"
    except OSError as exc:
        stack_error = f"kernel stack not readable ({exc.strerror or exc})"
    return ProcState(
        pid,
        state,
        stop_pending=sigstop_pending(status),
        stopped_threads=stopped,
        threads=len(tids),
        wchan=wchan if wchan and wchan != "0" else None,
        kernel_stack=stack,
        kernel_stack_error=stack_error,
    )


class PsutilProcessFinder:
    """Finds the server's processes with psutil.

    With `keep_sockets`, the machine's listening TCP sockets are read once, at the first
    need, and kept for the finder's life: for one pass over many targets (the doctor's),
    where reading the table anew for each target would cost the pass the square of the
    targets. Without it (the daemon's finder), every discovery reads the table afresh.
    """

    def __init__(self, *, keep_sockets: bool = False) -> None:
        self._keep_sockets = keep_sockets
        self._kept: tuple[list[ListeningSocket], tuple[str, ...]] | None = None

    def listening_sockets(self, notes: list[str]) -> list[ListeningSocket]:
        """The machine's listening TCP sockets (kept with `keep_sockets`); how they were
        read goes into `notes`."""
        if not self._keep_sockets:
            return _listening_sockets(notes)
        if self._kept is None:
            read_notes: list[str] = []
            self._kept = (_listening_sockets(read_notes), tuple(read_notes))
        notes.extend(self._kept[1])
        return self._kept[0]

    def listen_addresses(self, pids: Sequence[int], port: int | None) -> tuple[str, ...]:
        """The addresses `pids` listen on (on `port` when known), from `listening_sockets`."""
        wanted = set(pids)
        return tuple(
            sorted(
                {
                    s.ip
                    for s in self.listening_sockets([])
                    if s.pid in wanted and (port is None or s.port == port)
                }
            )
        )

    def discover(self, selector: ProcessSelector) -> Discovery:
        """Root pid from the selector, then the root's descendants with roles."""
        source = selector.describe()
        root: int | str
        listeners: tuple[int, ...] = ()
        notes: list[str] = []
        explicit = selector.pid is not None or selector.pid_file is not None
        if selector.pid is not None:
            root = selector.pid
        elif selector.pid_file is not None:
            root = _read_pid_file(selector.pid_file)
        elif selector.url is not None:
            found = self._listener_root(selector.url, notes)
            if isinstance(found, str):
                root = found
            else:
                root, listeners = found
        else:
            root = "no url, pid or pid file to find the server's processes from"
        if isinstance(root, str):
            return Discovery(
                source,
                None,
                (),
                error=str(root),
                notes=tuple(notes),
                explicit=explicit,
                gone=isinstance(root, Gone),
            )
        records, tree_notes = _records_under(root)
        notes.extend(tree_notes)
        if not records:
            return Discovery(
                source,
                root,
                (),
                error=str(tree_notes[0]) if tree_notes else None,
                notes=tuple(str(note) for note in notes),
                explicit=explicit,
                gone=bool(tree_notes) and isinstance(tree_notes[0], Gone),
            )
        created: float | None = None
        with contextlib.suppress(psutil.Error):
            created = psutil.Process(root).create_time()
        if not explicit and selector.systemd_unit and _in_unit(root, selector.systemd_unit):
            explicit = True  # the listener runs inside the target's own systemd unit
            notes.append(f"pid {root} runs in the target's systemd unit {selector.systemd_unit}")
        return Discovery(
            source,
            root,
            build_tree(records, root, listeners),
            notes=tuple(notes),
            explicit=explicit,
            root_create_time=created,
        )

    def _listener_root(self, url: str, notes: list[str]) -> tuple[int, tuple[int, ...]] | str:
        endpoint = endpoint_of_url(url)
        if isinstance(endpoint, str):
            return endpoint
        host, port = endpoint
        host_ips = host_addresses(host)
        if not is_this_machine(host_ips, local_addresses()):
            return (
                f"{host} is not this machine (neither loopback nor an address of its "
                "interfaces): no local process is looked up by port for a remote server"
            )
        sockets = self.listening_sockets(notes)
        pids, hidden = pick_listeners(sockets, host, port, host_ips)
        if not pids:
            if hidden:
                return (
                    f"a process listens on port {port} but its pid is not visible to wedgewatch: "
                    "run as root or as the server's user, and in Kubernetes set "
                    "shareProcessNamespace: true"
                )
            return Gone(f"no process listens on TCP port {port}")
        parents: dict[int, int] = {}
        for pid in pids:
            record = read_record(pid)
            if isinstance(record, ProcessRecord):
                parents[pid] = record.ppid
        if len(pids) > 1:
            notes.append(f"{len(pids)} processes listen on port {port}: {list(pids)}")
        return choose_root(pids, _ancestry(parents)), pids


def host_addresses(host: str) -> tuple[str, ...]:
    """The IP addresses of `host`: itself when it is an IP address, else what the system
    resolver says (empty when it cannot resolve it)."""
    try:
        return (str(ipaddress.ip_address(plain_ip(host.strip("[]")))),)
    except ValueError:
        pass
    if host == "localhost":
        return ("127.0.0.1", "::1")
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return ()
    return tuple(sorted({plain_ip(str(info[4][0])) for info in infos}))


def local_addresses() -> tuple[str, ...]:
    """Every address of this machine's network interfaces (psutil.net_if_addrs)."""
    try:
        interfaces = psutil.net_if_addrs()
    except (OSError, psutil.Error):
        return ()
    return tuple(
        plain_ip(a.address)
        for addresses in interfaces.values()
        for a in addresses
        if a.family in (socket.AF_INET, socket.AF_INET6)
    )


def host_is_this_machine(host: str) -> bool:
    """Is `host` (a URL's host) this machine: loopback or one of its interface addresses?"""
    return is_this_machine(host_addresses(host), local_addresses())


def remote_host_reason(url: str) -> str | None:
    """None when the URL's host is this machine; otherwise why no local process is its server."""
    endpoint = endpoint_of_url(url)
    if isinstance(endpoint, str):
        return endpoint
    host, _port = endpoint
    if host_is_this_machine(host):
        return None
    return (
        f"{host} is not this machine (neither loopback nor an address of its interfaces), "
        "so no local process is its server"
    )


def dump_refusal(discovery: Discovery) -> str | None:
    """Why the discovered processes must not be py-spied (not proven to be the server), or
    None. Read-only uses also accept a root whose command line names vLLM (`vllm serve`)."""
    if not discovery.processes:
        return None
    return prove_server(
        [(p.pid, p.title) for p in discovery.processes],
        explicit=discovery.explicit,
        own_pids=own_lineage()[0],
        accept_vllm_command=True,
    )


def own_lineage() -> tuple[set[int], set[int]]:
    """wedgewatch's own pid and its ancestors' pids, and the process groups they are in."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids |= {p.pid for p in me.parents()}
    groups: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    return pids, groups


def _ancestry(parents: dict[int, int]) -> dict[int, int]:
    """Extend a pid -> ppid map up to init, so `choose_root` can walk ancestors."""
    full = dict(parents)
    frontier = list(parents.values())
    while frontier:
        pid = frontier.pop()
        if pid in full or pid <= 1:
            continue
        record = read_record(pid)
        if isinstance(record, ProcessRecord):
            full[pid] = record.ppid
            frontier.append(record.ppid)
    return full


def _in_unit(pid: int, unit: str) -> bool:
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return cgroup_in_unit(text, unit)


def _read_pid_file(path: Path) -> int | str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return Gone(f"pid file {path} does not exist")
    except OSError as exc:
        return f"pid file {path} cannot be read: {exc.strerror or exc}"
    return parse_pid_file(text, path)


def _listening_sockets(notes: list[str]) -> list[ListeningSocket]:
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        # Some platforms refuse the system-wide table to non-root; ask process by process.
        notes.append("system-wide socket table denied; scanned processes one by one")
        return _listening_sockets_per_process()
    return [
        ListeningSocket(c.laddr.ip, c.laddr.port, c.pid)
        for c in conns
        if c.status == psutil.CONN_LISTEN and c.laddr
    ]


def _listening_sockets_per_process() -> list[ListeningSocket]:
    found: list[ListeningSocket] = []
    for proc in psutil.process_iter():
        try:
            conns = proc.net_connections(kind="tcp")
        except psutil.Error:
            continue
        found.extend(
            ListeningSocket(c.laddr.ip, c.laddr.port, proc.pid)
            for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr
        )
    return found


def _records_under(root: int) -> tuple[list[ProcessRecord], list[str]]:
    notes: list[str] = []
    first = read_record(root)
    if isinstance(first, str):
        return [], [first]
    records = [first]
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error as exc:
        return records, [_describe_psutil_error(exc, root)]
    for child in children:
        record = read_record(child.pid)
        if isinstance(record, str):
            notes.append(record)
        else:
            records.append(record)
    return records, notes


# -- signalling exactly the process that was proven ------------------------------------------


class PinnedProcess:
    """A process held by a pidfd, so that a signal reaches it and never a reused pid.

    Between reading a process (its title, to prove it is the server) and signalling it,
    the process may exit and its pid go to another one. A pidfd (Linux 5.3+
    `os.pidfd_open`, signals by `signal.pidfd_send_signal`, 5.1+) names the process
    itself: opened first, then checked to be the process that was read (its create
    time), it can only ever signal that process; once it has exited the signal is
    refused (ESRCH), whatever now holds the pid.

    Without pidfds (another OS, an older kernel, a seccomp filter) the fallback is
    psutil's `send_signal`, which checks the create time just before `kill(2)`: the race
    narrows to that instant, it does not close. `pidfd` says which one is in use.
    """

    def __init__(self, proc: psutil.Process, pidfd: int | None) -> None:
        self.proc = proc
        self.pidfd = pidfd

    @property
    def pid(self) -> int:
        """The process id (as it was when pinned)."""
        return int(self.proc.pid)

    def send_signal(self, sig: int) -> bool:
        """Send `sig` to the pinned process; False when it has exited (nothing was sent).

        Raises PermissionError when the signal is not permitted.
        """
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                return False
            return True
        try:
            self.proc.send_signal(sig)  # psutil refuses a pid reused since the handle was made
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied as exc:
            raise PermissionError(str(exc)) from None
        return True

    def close(self) -> None:
        """Release the pidfd (idempotent)."""
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None


def pin(proc: psutil.Process) -> PinnedProcess | None:
    """Hold `proc` by a pidfd (see `PinnedProcess`); None when it is gone or its pid now
    names another process.

    The pidfd is opened first and the process checked after: if the check passes, the
    pidfd cannot name anything but the process that was read.
    """
    pidfd: int | None = None
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is not None and hasattr(signal, "pidfd_send_signal"):
        try:
            pidfd = pidfd_open(proc.pid)
        except ProcessLookupError:
            return None
        except OSError:  # ENOSYS (older kernel), EPERM (seccomp): the fallback
            pidfd = None
    pinned = PinnedProcess(proc, pidfd)
    try:
        same = proc.is_running()  # psutil compares the create time it read first
    except psutil.Error:
        same = False
    if not same:
        pinned.close()
        return None
    return pinned


def pidfds_available() -> bool:
    """Whether this system signals through pidfds (else the psutil fallback is used)."""
    if not hasattr(os, "pidfd_open") or not hasattr(signal, "pidfd_send_signal"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True
