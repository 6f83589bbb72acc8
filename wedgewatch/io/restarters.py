"""Restarters: the IO edge that restarts (or stops, for its supervisor) a wedged server.

Each remedy (`signal`, `systemd`, `exec`, `supervise`) returns a `RestartOutcome` and never
raises for a restart that did not work. Whether a restart may happen at all is decided by
the pure policy in `wedgewatch.core.restart.restart_policy`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from wedgewatch.core.restart.restart_policy import FailureReason, RestartOutcome, seconds_text
from wedgewatch.core.restart.server_proof import prove_server
from wedgewatch.core.text.escape import neutralise
from wedgewatch.core.text.redact import redact_text, redact_url
from wedgewatch.core.values import immutable
from wedgewatch.io.procs import PinnedProcess, own_lineage, pin, title_from_cmdline
from wedgewatch.io.runner import CommandResult, run_command

#: How long a restarter waits for processes to vanish after SIGKILL before reporting them.
KILL_WAIT_SECONDS = 10.0
#: Default deadline for `systemctl restart` and for an `exec` remedy command.
COMMAND_TIMEOUT_SECONDS = 300.0
#: How much of a command's stderr (and stdout) ends up in a RestartOutcome's detail.
OUTPUT_TAIL_BYTES = 2000
_POLL_SECONDS = 0.05


@immutable
class RestartRequest:
    """What the daemon knows about the server to restart and why."""

    target: str
    url: str
    model_name: str
    engine: str
    family: str
    state: str
    reason: str
    bundle: Path | None = None
    server_pid: int | None = None  # the serving (API server) process, for `signal`
    # True when server_pid came from the target's explicit pid, pid_file or systemd unit
    # (then it is the server by configuration); False when it was found by port.
    server_pid_explicit: bool = False


class Restarter(Protocol):
    """Something that restarts (or stops, for a supervisor to restart) a server."""

    @property
    def name(self) -> str:
        """The remedy name: signal, systemd, exec or supervise."""
        ...

    async def restart(self, request: RestartRequest) -> RestartOutcome:
        """Restart the server of `request`; report failures in the outcome."""
        ...


#: Bound of one `WEDGEWATCH_*` value given to an `exec` remedy (Linux allows 128 KiB).
ENV_VALUE_MAX_CHARS = 4096


def restart_environment(request: RestartRequest) -> dict[str, str]:
    """The `WEDGEWATCH_*` variables an `exec` remedy command receives (URL credentials and
    query masked, the model name redacted by value). Every value is `neutralise`d: the target
    names its models, and a NUL byte (which no environment can hold) or 2 MB (E2BIG) must
    not stop the remedy."""
    variables = {
        "WEDGEWATCH_TARGET": request.target,
        "WEDGEWATCH_URL": redact_url(request.url),
        "WEDGEWATCH_ENGINE": request.engine,
        "WEDGEWATCH_MODEL_NAME": redact_text(request.model_name),  # the target's value
        "WEDGEWATCH_FAMILY": request.family,
        "WEDGEWATCH_STATE": request.state,
        "WEDGEWATCH_REASON": request.reason,
        "WEDGEWATCH_BUNDLE": "" if request.bundle is None else str(request.bundle),
    }
    return {
        name: neutralise(value, ENV_VALUE_MAX_CHARS, newlines=False)
        for name, value in variables.items()
    }


#: The only variables an `exec` remedy inherits from wedgewatch's environment (when set):
#: enough to find programs, speak the locale, and let `kubectl` find the API server from
#: inside a pod. Nothing else: not wedgewatch's settings, not tokens or passwords.
EXEC_INHERITED_VARIABLES = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "XDG_RUNTIME_DIR",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
)
#: PATH for an `exec` remedy when wedgewatch has none.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def inherited_environment(parent: Mapping[str, str]) -> dict[str, str]:
    """What a command wedgewatch runs for the operator (the `exec` remedy, the `on_bundle`
    hook) inherits: the few `EXEC_INHERITED_VARIABLES` of `parent`, PATH always."""
    env = {name: parent[name] for name in EXEC_INHERITED_VARIABLES if name in parent}
    env.setdefault("PATH", DEFAULT_PATH)
    return env


def exec_environment(request: RestartRequest, parent: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of an `exec` remedy command: the few `EXEC_INHERITED_VARIABLES`
    of `parent` (wedgewatch's environment) plus the event's `WEDGEWATCH_*` variables."""
    env = inherited_environment(parent)
    env.update(restart_environment(request))
    return env


# -- process trees -------------------------------------------------------------------------


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (a zombie holds no memory; its parent may never reap it)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # someone else's processes; the scan below still finds them
    members = []
    for proc in psutil.process_iter():
        if _pgid(proc.pid) == pgid and _alive(proc):
            members.append(proc)
    return members


def _describe(proc: psutil.Process) -> str:
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        title = "?"
    return f"{proc.pid} ({title[:60]})"


@immutable
class _Termination:
    signalled: int  # processes tracked
    term_exited: bool  # everything was gone before the grace ran out
    killed: int  # processes that needed SIGKILL
    survivors: tuple[str, ...]  # descriptions of processes alive after SIGKILL
    errors: tuple[str, ...]  # signals that could not be sent


def group_is_still_ours(group: int, leader_create_time: float | None) -> bool:
    """May process group `group` still be signalled as a whole, right now?

    Yes when its leader (pid == group) is the very process seen when the tree was collected
    (same create time), or when no process has that pid any more (the kernel does not hand
    out a pid while a process group of that id has members, so `killpg` can then only reach
    the old group's members). No when the pid now belongs to another process: the old group
    is empty and the pid was reused, possibly by the leader of an unrelated group.
    """
    try:
        created = psutil.Process(group).create_time()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    return leader_create_time is not None and created == leader_create_time


def _send(
    victims: Sequence[psutil.Process],
    group: int | None,
    sig: signal.Signals,
    errors: list[str],
    leader_create_time: float | None = None,
    *,
    pins: dict[int, PinnedProcess] | None = None,
) -> int | None:
    """Send `sig` to `group` (when it is still ours) and to every victim outside it; returns
    the group that was used, None when it was not (then every victim got its own signal).

    Each victim is signalled through its pidfd (`procs.pin`): `pins` holds those opened
    before the proof; a victim found since (a group member) is pinned now.
    """
    pins = {} if pins is None else pins
    if group is not None and not group_is_still_ours(group, leader_create_time):
        errors.append(
            f"process group {group} not signalled: its leader's pid now belongs to another "
            "process (pid reused); signalled the known processes one by one"
        )
        group = None
    if group is not None:
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            errors.append(f"permission denied sending {sig.name} to process group {group}")
    for proc in victims:
        if group is not None and _pgid(proc.pid) == group:
            continue  # already reached through the group
        pinned = pins.get(proc.pid)
        if pinned is None:
            pinned = pin(proc)
            if pinned is None:
                continue  # gone (or its pid reused) since it was listed
            pins[proc.pid] = pinned
        try:
            pinned.send_signal(sig)  # exactly that process, or nothing once it has exited
        except PermissionError:
            errors.append(f"permission denied sending {sig.name} to {_describe(proc)}")
    return group


async def _gone(
    victims: Sequence[psutil.Process], group: int | None, deadline_seconds: float
) -> bool:
    """Wait until every victim and every member of `group` is gone; False at the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_seconds
    while True:
        if not any(_alive(p) for p in victims) and (group is None or not _group_members(group)):
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_POLL_SECONDS)


async def _terminate(
    victims: Sequence[psutil.Process],
    group: int | None,
    grace_seconds: float,
    leader_create_time: float | None = None,
    *,
    pins: dict[int, PinnedProcess] | None = None,
) -> _Termination:
    """SIGTERM the victims (through `group` where they are in it), SIGKILL what outlives grace.

    `leader_create_time` is the create time of the group's leader when the tree was
    collected: the group is signalled only while it still identifies that process.
    """
    errors: list[str] = []
    group = _send(victims, group, signal.SIGTERM, errors, leader_create_time, pins=pins)
    if await _gone(victims, group, grace_seconds):
        return _Termination(len(victims), True, 0, (), tuple(errors))
    stubborn = [p for p in victims if _alive(p)]
    if group is not None:
        stubborn += [p for p in _group_members(group) if p not in stubborn]
    group = _send(stubborn, group, signal.SIGKILL, errors, leader_create_time, pins=pins)
    await _gone(stubborn, group, KILL_WAIT_SECONDS)
    survivors = [p for p in stubborn if _alive(p)]
    if group is not None:
        survivors += [p for p in _group_members(group) if p not in survivors]
    return _Termination(
        len(victims), False, len(stubborn), tuple(_describe(p) for p in survivors), tuple(errors)
    )


def _title(proc: psutil.Process) -> str:
    """The process's full title (command line), '' when it cannot be read."""
    try:
        return title_from_cmdline(proc.cmdline(), proc.name())
    except psutil.Error:
        return ""


def _summarise(what: str, result: _Termination, grace_seconds: float, elapsed: float) -> str:
    if result.term_exited:
        return f"{what}: all {result.signalled} exited on SIGTERM within {seconds_text(elapsed)}"
    text = (
        f"{what}: {result.killed} still running after grace_seconds = "
        f"{seconds_text(grace_seconds)}, sent SIGKILL"
    )
    if result.survivors:
        text += f"; still alive after SIGKILL: {', '.join(result.survivors)}"
    if result.errors:
        text += "; " + "; ".join(result.errors)
    return text


class SignalRestarter:
    """`remedy = "signal"`: stop the server's whole process tree; its supervisor restarts it.

    The tree (the server and every descendant, EngineCore and workers included) is collected
    before any signal, because children are reparented once their parent dies. When the
    server leads its own process group (systemd, a container entry point, the launcher), the
    group receives SIGTERM, which also reaches processes that left the tree; otherwise (the
    server shares a group with its supervising shell or with wedgewatch) each process of the
    tree is signalled alone. Never wedgewatch itself, an ancestor of it, or its process group.
    """

    name = "signal"

    def __init__(
        self, *, grace_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not math.isfinite(grace_seconds) or grace_seconds < 0:
            raise ValueError(f"grace_seconds must be a finite number >= 0, got {grace_seconds}")
        self._grace = grace_seconds
        self._clock = clock

    async def restart(self, request: RestartRequest) -> RestartOutcome:
        """SIGTERM the tree, SIGKILL what is left after the grace; ok once it is all gone."""
        started = self._clock()

        def outcome(
            ok: bool, detail: str, failure: FailureReason = FailureReason.REMEDY_ERROR
        ) -> RestartOutcome:
            return RestartOutcome(ok, detail, self._clock() - started, None if ok else failure)

        pid = request.server_pid
        if pid is None:
            return outcome(False, f"no server process is known for target {request.target}")
        try:
            root = psutil.Process(pid)
            leader_create_time = root.create_time()
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return outcome(True, f"server process {pid} had already exited")
        except psutil.AccessDenied as exc:
            return outcome(False, f"cannot inspect server process {pid}: {exc}")
        # Pin every process (a pidfd each) before proving it: what is proven is then
        # exactly what gets signalled, even if a pid is reused meanwhile.
        pins = {p.pid: pinned for p in tree if (pinned := pin(p)) is not None}
        try:
            if pid not in pins:
                return outcome(True, f"server process {pid} had already exited")
            tree = [p for p in tree if p.pid in pins]
            return await self._prove_and_stop(
                request,
                tree,
                pins=pins,
                leader_create_time=leader_create_time,
                started=started,
                outcome=outcome,
            )
        finally:
            for pinned in pins.values():
                pinned.close()

    async def _prove_and_stop(
        self,
        request: RestartRequest,
        tree: list[psutil.Process],
        *,
        pins: dict[int, PinnedProcess],
        leader_create_time: float,
        started: float,
        outcome: Callable[..., RestartOutcome],
    ) -> RestartOutcome:
        """Prove the pinned tree is the server, then stop it through its pidfds."""
        pid = tree[0].pid
        own_pids, own_groups = own_lineage()
        refusal = prove_server(
            [(p.pid, _title(p)) for p in tree],
            explicit=request.server_pid_explicit,
            own_pids=own_pids,
        )
        if refusal is not None:
            return outcome(
                False,
                f"refusing to signal process {pid}: {refusal}",
                FailureReason.NOT_VLLM,
            )
        pgid = _pgid(pid)
        group = pgid if pgid == pid and pgid not in own_groups else None
        victims = list(tree)
        if group is not None:
            victims += [p for p in _group_members(group) if p not in victims]
            what = f"SIGTERM to process group {group} ({len(victims)} processes)"
        else:
            led = "no" if pgid is None else str(pgid)
            what = (
                f"server {pid} does not lead its process group ({led}); SIGTERM to its "
                f"{len(victims)} processes one by one"
            )
        result = await _terminate(victims, group, self._grace, leader_create_time, pins=pins)
        elapsed = self._clock() - started
        detail = _summarise(what, result, self._grace, elapsed)
        return outcome(not result.survivors, detail)


# -- commands ------------------------------------------------------------------------------


def _start_error(program: str, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"{program!r} was not found"
    if isinstance(exc, PermissionError):
        return f"{program!r} is not executable"
    return f"{program!r} could not be started: {exc}"


def _tail(data: bytes, truncated: bool) -> str:
    text = data.decode("utf-8", "replace").strip()
    return ("..." + text) if truncated else text


async def _run(
    argv: Sequence[str], env: Mapping[str, str], timeout_seconds: float
) -> CommandResult:
    """Run a remedy command; only the tail of its output is kept for the outcome's detail."""
    return await run_command(
        argv,
        timeout_seconds=timeout_seconds,
        env=env,
        stdout_bytes=OUTPUT_TAIL_BYTES,
        stderr_bytes=OUTPUT_TAIL_BYTES,
        stdout_keep="tail",
    )


async def run_operator_command(
    what: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    timeout_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> RestartOutcome:
    """Run an operator's command (no shell, own session, bounded) and describe how it went,
    in the words of the `exec` remedy: exit 0 is success; a failure carries its stderr's tail."""
    started = clock()
    result = await _run(argv, env, timeout_seconds)
    return _command_outcome(what, argv, result, timeout_seconds, clock() - started)


def _status_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def _command_outcome(
    what: str,
    argv: Sequence[str],
    result: CommandResult,
    timeout_seconds: float,
    duration: float,
    *,
    start_hint: str = "",
) -> RestartOutcome:
    output = _tail(result.stderr, result.stderr_truncated) or _tail(
        result.stdout, result.stdout_truncated
    )
    said = f": {output}" if output else ""
    if result.start_error is not None:
        error = _start_error(argv[0], result.start_error)
        return RestartOutcome(
            False, f"{what}: {error}{start_hint}", duration, FailureReason.REMEDY_ERROR
        )
    if result.returncode is None:
        detail = f"{what} did not finish within {seconds_text(timeout_seconds)}, killed{said}"
        return RestartOutcome(False, detail, duration, FailureReason.TIMEOUT)
    if result.returncode == 0:
        return RestartOutcome(True, f"{what} succeeded in {seconds_text(duration)}", duration)
    detail = f"{what} failed with {_status_text(result.returncode)}{said}"
    return RestartOutcome(False, detail, duration, FailureReason.REMEDY_ERROR)


class SystemdRestarter:
    """`remedy = "systemd"`: `systemctl restart UNIT` (systemd stops the whole cgroup)."""

    name = "systemd"

    def __init__(
        self,
        unit: str,
        *,
        user: bool = False,
        timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
        systemctl: str = "systemctl",
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not unit or unit.startswith("-") or any(c.isspace() for c in unit):
            raise ValueError(
                f"systemd_unit {unit!r} is not a unit name (e.g. vllm.service; no spaces, "
                "not starting with '-')"
            )
        if not math.isfinite(timeout_seconds) or timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        self.unit = unit
        self._user = user
        self._timeout = timeout_seconds
        self._systemctl = systemctl
        self._env = env
        self._clock = clock

    @property
    def argv(self) -> tuple[str, ...]:
        """The exact command line run for a restart."""
        scope = ("--user",) if self._user else ()
        return (self._systemctl, *scope, "--no-ask-password", "restart", self.unit)

    async def restart(self, request: RestartRequest) -> RestartOutcome:
        """Run `systemctl restart UNIT` under a deadline; its stderr explains a failure."""
        started = self._clock()
        env = dict(os.environ if self._env is None else self._env)
        result = await _run(self.argv, env, self._timeout)
        what = f"systemctl restart {self.unit}"
        hint = ""
        if self._systemctl == "systemctl":
            hint = (
                f' on PATH; remedy = "systemd" needs systemd\'s systemctl '
                f"(PATH={env.get('PATH', '')})"
            )
        return _command_outcome(
            what, self.argv, result, self._timeout, self._clock() - started, start_hint=hint
        )


class ExecRestarter:
    """`remedy = "exec"`: run a configured command with the verdict in `WEDGEWATCH_*` variables.

    The command runs without a shell, in its own session (a timeout kills its whole group),
    with a minimal environment (`exec_environment`: PATH, HOME, LANG, ... of wedgewatch's,
    never its settings or secrets) plus the event's `WEDGEWATCH_*` variables. Exit status 0
    is success; anything else is a failure whose detail carries the tail of its stderr.
    """

    name = "exec"

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not argv or not argv[0]:
            raise ValueError("exec_command must start with the program to run")
        if not math.isfinite(timeout_seconds) or timeout_seconds <= 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        self.argv = tuple(argv)
        self._timeout = timeout_seconds
        self._env = env
        self._clock = clock

    async def restart(self, request: RestartRequest) -> RestartOutcome:
        """Run the command for `request` under the deadline."""
        started = self._clock()
        env = exec_environment(request, os.environ if self._env is None else self._env)
        result = await _run(self.argv, env, self._timeout)
        what = f"exec_command {self.argv[0]}"
        return _command_outcome(what, self.argv, result, self._timeout, self._clock() - started)


# -- supervise -------------------------------------------------------------------------------


class SupervisorError(Exception):
    """The supervised command could not be started (a configuration problem)."""


class Supervisor:
    """Runs one command as a child in its own session and process group, and restarts it.

    `wait()` returns the exit status of the command when it ends by itself or by `stop()`
    (as Python reports it: negative for a signal); a restart in between does not end it.
    After `wait()` returns, call `stop()` so that nothing of the group is left behind.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not argv or not argv[0]:
            raise ValueError("the supervised command must start with the program to run")
        self.argv = tuple(argv)
        self.env = None if env is None else dict(env)
        self.cwd = cwd
        self._clock = clock
        self._proc: asyncio.subprocess.Process | None = None
        self._settled = asyncio.Event()  # cleared while a restart replaces the child
        self._settled.set()
        self._starts = 0

    @property
    def pid(self) -> int | None:
        """Process id of the current child (None before start)."""
        return None if self._proc is None else self._proc.pid

    @property
    def pgid(self) -> int | None:
        """Process group of the current child: its own pid (it leads a new session)."""
        return self.pid

    @property
    def returncode(self) -> int | None:
        """Exit status of the current child, None while it runs (or before start)."""
        return None if self._proc is None else self._proc.returncode

    @property
    def starts(self) -> int:
        """How many times a child was started."""
        return self._starts

    async def start(self) -> None:
        """Start the command; raises SupervisorError with a clear message when it cannot."""
        if self._proc is not None and self._proc.returncode is None:
            raise SupervisorError(f"already running as pid {self._proc.pid}")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            raise SupervisorError(f"cannot start {self.argv[0]!r}: not found") from exc
        except PermissionError as exc:
            raise SupervisorError(f"cannot start {self.argv[0]!r}: not executable") from exc
        except OSError as exc:
            raise SupervisorError(f"cannot start {self.argv[0]!r}: {exc}") from exc
        self._starts += 1

    async def stop(self, grace_seconds: float) -> int | None:
        """SIGTERM the child's process group, SIGKILL it after the grace; the exit status."""
        stopped = await self._stop(grace_seconds)
        return None if stopped is None else stopped[0]

    async def _stop(self, grace_seconds: float) -> tuple[int, _Termination] | None:
        proc = self._proc
        if proc is None:
            return None
        tree: list[psutil.Process] = []
        leader_create_time: float | None = None
        if proc.returncode is None:  # not reaped yet, so its pid cannot have been reused
            with contextlib.suppress(psutil.NoSuchProcess):
                leader = psutil.Process(proc.pid)
                leader_create_time = leader.create_time()
                tree = [leader, *leader.children(recursive=True)]
        tree += [p for p in _group_members(proc.pid) if p not in tree]
        termination = await _terminate(tree, proc.pid, grace_seconds, leader_create_time)
        return await proc.wait(), termination

    async def restart(self, grace_seconds: float) -> RestartOutcome:
        """Stop the group and start the command again; the outcome, never an exception."""
        started = self._clock()
        self._settled.clear()
        try:
            what = f"stopped process group {self.pid}"
            stopped = await self._stop(grace_seconds)
            if stopped is not None:
                status, termination = stopped
                what = _summarise(what, termination, grace_seconds, self._clock() - started)
                if termination.survivors:
                    detail = f"{what}; not starting a new server while they live"
                    return RestartOutcome(
                        False, detail, self._clock() - started, FailureReason.REMEDY_ERROR
                    )
                what += f" (the server ended with {_status_text(status)})"
            try:
                await self.start()
            except SupervisorError as exc:
                return RestartOutcome(
                    False, f"{what}; {exc}", self._clock() - started, FailureReason.REMEDY_ERROR
                )
            return RestartOutcome(True, f"{what}; started pid {self.pid}", self._clock() - started)
        finally:
            self._settled.set()

    async def wait(self) -> int:
        """Wait until the command ends by itself or by `stop()`; restarts are waited through."""
        while True:
            proc = self._proc
            if proc is None:
                raise SupervisorError("wait() called before start()")
            status = await proc.wait()
            await self._settled.wait()
            if self._proc is proc:
                return status


class SuperviseRestarter:
    """`remedy = "supervise"`: restart the child that `wedgewatch launch --watch` runs."""

    name = "supervise"

    def __init__(self, supervisor: Supervisor, *, grace_seconds: float) -> None:
        if not math.isfinite(grace_seconds) or grace_seconds < 0:
            raise ValueError(f"grace_seconds must be a finite number >= 0, got {grace_seconds}")
        self.supervisor = supervisor
        self._grace = grace_seconds

    async def restart(self, request: RestartRequest) -> RestartOutcome:
        """Stop the supervised process group and start the same command again."""
        return await self.supervisor.restart(self._grace)
