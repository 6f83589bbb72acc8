"""Run `py-spy dump` on a server's processes: hard timeouts, native fallback, no stopped target.

For each pid the runner takes a JSON dump (`--json`, for triage) and a text dump (for
people), first with `--native` and, if that fails for any reason other than permissions or
a missing process, again without it (native unwinding fails on some builds). Every py-spy
run has a hard timeout; on timeout its whole process group is killed. After every run
the target's `/proc/<pid>/stat` (and its threads') state is checked: a target left in
state `T` (stopped) gets SIGCONT, and the dump records that it did.

Before any run the target's /proc state is read (`io/procs.read_proc_state`: read only,
never a signal). A zombie or gone process is not dumped. A target that is already stopped
(state `T`/`t`, or a SIGSTOP pending) is left as found and never ptrace-attached: a
blocking py-spy fails on it ("Failed to suspend process ... unexpected waitpid result
PtraceEvent(..., SIGSTOP, ...)"), so it gets the gentle `--nonblocking` read below, and the
dump's `why` says in words that it is stopped (with its wchan and kernel stack).

Failures are data (`DumpStatus`), never exceptions. Several pids may be dumped at once.

`nonblocking` (the suspect round, while the engine may still be healthy) is the gentle mode:
ONE py-spy dump per process, `dump --json --nonblocking` (py-spy reads the stacks without
pausing the target; it refuses `--native` in that mode, so there is no native run), and the
text form is rendered from that JSON instead of taken by a second dump. Reading a running
process can tear (py-spy: "Failed to copy PyFrameObject"); such a failed read is repeated,
still nonblocking, up to `NONBLOCKING_ATTEMPTS` runs in all: it costs the target nothing.
The blocking mode (the wedge round: the engine is stuck anyway) is the full sequence above.

`argv_prefix` runs py-spy through a wrapper (`setpriv --reuid=...`, `nsenter ...`); tests
use it to get a real "Permission Denied" from an unprivileged py-spy.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from wedgewatch.core.evidence.proc_state import ProcState, parse_stat_state, sigstop_pending
from wedgewatch.core.evidence.triage import Thread, parse_pyspy_json
from wedgewatch.core.values import immutable
from wedgewatch.io.procs import read_proc_state
from wedgewatch.io.runner import run_command

PTRACE_FIX = (
    "run as root or grant CAP_SYS_PTRACE; in Kubernetes add SYS_PTRACE to the sidecar's "
    "capabilities and set shareProcessNamespace: true"
)
PYSPY_MISSING_FIX = (
    "install py-spy (`pip install py-spy`; it is a wedgewatch dependency) or set pyspy_path "
    "to the py-spy executable"
)
_STDERR_TAIL_BYTES = 2000
#: A py-spy dump (JSON with locals of every thread) larger than this is cut, and unusable.
_STDOUT_BYTES = 64 * 1024 * 1024
NONBLOCKING_ATTEMPTS = 3


class DumpStatus(StrEnum):
    """Outcome of dumping one process."""

    OK = "ok"
    PERMISSION_DENIED = "permission_denied"
    NO_PROCESS = "no_process"
    TIMEOUT = "timeout"
    PYSPY_MISSING = "pyspy_missing"
    FAILED = "failed"
    CANCELLED = "cancelled"


# A failure with one of these will not go away without --native: do not retry.
_FINAL = frozenset({DumpStatus.PERMISSION_DENIED, DumpStatus.NO_PROCESS, DumpStatus.CANCELLED})


@immutable
class Attempt:
    """One py-spy run."""

    output: str  # "json" or "text"
    native: bool
    status: DumpStatus
    exit_code: int | None
    duration_seconds: float
    error: str | None = None
    resumed_target: bool = False
    nonblocking: bool = False  # `--nonblocking`: the target was not paused

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {
            "output": self.output,
            "native": self.native,
            "status": str(self.status),
            "exit_code": self.exit_code,
            "duration_seconds": round(self.duration_seconds, 4),
            "error": self.error,
            "resumed_target": self.resumed_target,
            "nonblocking": self.nonblocking,
        }


@immutable
class StackDump:
    """Everything py-spy produced for one process, and how it went."""

    pid: int
    status: DumpStatus
    text: str | None = None
    json_text: str | None = None
    threads: tuple[Thread, ...] | None = None
    native: bool = False
    attempts: tuple[Attempt, ...] = ()
    resumed_target: bool = False
    notes: tuple[str, ...] = ()
    error: str | None = None
    fix: str | None = None
    duration_seconds: float = 0.0
    process_state: ProcState | None = None  # /proc at the dump: stopped, zombie, gone, ...

    @property
    def why(self) -> str | None:
        """In words, why the process could not be dumped normally (stopped, zombie, gone, D),
        from /proc; None when its state says nothing unusual."""
        state = self.process_state
        if state is None or state.word in ("running", "sleeping"):
            return None
        return f"process {self.pid} {state.describe()}"

    def to_json(self) -> dict[str, object]:
        """JSON-safe form (without the dumps themselves)."""
        return {
            "pid": self.pid,
            "status": str(self.status),
            "why": self.why,
            "process_state": None if self.process_state is None else self.process_state.to_json(),
            "native": self.native,
            "have_json": self.json_text is not None,
            "have_text": self.text is not None,
            "resumed_target": self.resumed_target,
            "error": self.error,
            "fix": self.fix,
            "notes": list(self.notes),
            "duration_seconds": round(self.duration_seconds, 4),
            "attempts": [a.to_json() for a in self.attempts],
        }


class StackDumper(Protocol):
    """Dumps the Python stacks of a process (py-spy in production)."""

    async def dump(self, pid: int) -> StackDump:
        """The process's stacks; never raises for the process's misbehaviour."""
        ...


# --------------------------------------------------------------------------- pure parts


def classify_output(exit_code: int, stdout: str, stderr: str) -> tuple[DumpStatus, str | None]:
    """Status and error message of a finished py-spy run."""
    if exit_code == 0 and stdout.strip():
        return DumpStatus.OK, None
    combined = f"{stderr}\n{stdout}"
    lowered = combined.lower()
    message = first_error_line(stderr) or first_error_line(stdout) or f"exit code {exit_code}"
    if "permission denied" in lowered or "operation not permitted" in lowered:
        return DumpStatus.PERMISSION_DENIED, message
    if (
        "failed to get process executable name" in lowered
        or "no such process" in lowered
        or "check that the process is running" in lowered
    ):
        return DumpStatus.NO_PROCESS, message
    if exit_code == 0:
        return DumpStatus.FAILED, "py-spy printed nothing"
    return DumpStatus.FAILED, message


def first_error_line(text: str) -> str | None:
    """The meaningful part of py-spy's error output: the lines before its Rust backtrace."""
    head = text.split("Stack backtrace:", 1)[0]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    if not lines:
        return None
    return " | ".join(lines)[:500]


def build_argv(
    pyspy: str,
    pid: int,
    *,
    output: str,
    native: bool,
    capture_locals: bool,
    prefix: Sequence[str] = (),
    nonblocking: bool = False,
) -> list[str]:
    """The argv of one py-spy run."""
    argv = [*prefix, pyspy, "dump", "--pid", str(pid)]
    if output == "json":
        argv.append("--json")
    if nonblocking:
        argv.append("--nonblocking")
    if native:
        argv.append("--native")
    if capture_locals:
        argv.append("--locals")
    return argv


def resolve_pyspy(pyspy_path: str) -> str | None:
    """The py-spy executable: a path as given, a name in PATH, or next to this Python.

    The last case covers a venv whose `bin/` is not in the daemon's PATH: installing
    wedgewatch installs py-spy there.
    """
    if os.sep in pyspy_path:
        candidate = Path(pyspy_path)
        return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None
    found = shutil.which(pyspy_path)
    if found:
        return found
    sibling = Path(sys.executable).parent / pyspy_path
    return str(sibling) if sibling.is_file() and os.access(sibling, os.X_OK) else None


# --------------------------------------------------------------------------- stop safety


def stop_pending(pid: int) -> bool:
    """Whether a SIGSTOP was sent to the process and has not taken effect yet: on a busy machine
    a stopped process shows state `T` only once it next runs (its ShdPnd mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            return sigstop_pending(f.read())
    except OSError:
        return False


def stopped_tasks(pid: int) -> tuple[bool, bool]:
    """(process exists, any of its threads is in state `T` or a SIGSTOP is pending) from /proc."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False, False
    except OSError:
        tids = [str(pid)]
    if stop_pending(pid):
        return True, True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8", errors="replace") as f:
                state = parse_stat_state(f.read())
        except OSError:
            continue
        if state == "T":
            return True, True
    return True, False


def resume_if_stopped(pid: int) -> bool:
    """SIGCONT the process if any thread is stopped; True when a signal was sent."""
    exists, stopped = stopped_tasks(pid)
    if not (exists and stopped):
        return False
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True


# --------------------------------------------------------------------------- the runner


@dataclass
class _PySpyRun:
    status: DumpStatus
    stdout: str
    attempt: Attempt


@dataclass
class PySpyRunner:
    """Runs py-spy with a hard timeout per run; see the module docstring."""

    pyspy_path: str = "py-spy"
    timeout_seconds: float = 10.0
    capture_locals: bool = False
    native: bool = True
    argv_prefix: tuple[str, ...] = ()
    clock: Callable[[], float] = time.monotonic
    nonblocking: bool = False
    """The gentle mode: one `--json --nonblocking` run per pid, text rendered from it."""

    async def dump(self, pid: int) -> StackDump:
        """JSON and text dumps of one process; see the module docstring for the sequence."""
        started = self.clock()
        pyspy = resolve_pyspy(self.pyspy_path)
        if pyspy is None:
            return StackDump(
                pid=pid,
                status=DumpStatus.PYSPY_MISSING,
                error=f"py-spy not found (pyspy_path = {self.pyspy_path!r})",
                fix=PYSPY_MISSING_FIX,
            )
        state = read_proc_state(pid)  # /proc only: never changes what it reads
        if state.dead:
            what = "does not exist" if state.gone else f"is {state.word}: nothing to dump"
            return StackDump(
                pid=pid,
                status=DumpStatus.NO_PROCESS,
                error=f"process {pid} {what}",
                process_state=state,
                duration_seconds=self.clock() - started,
            )
        stopped_before = state.stopped
        notes: list[str] = []
        if stopped_before:
            # A blocking py-spy must ptrace-suspend it, which fails on a stopped process (and
            # would meddle with the stop): read its memory without attaching instead.
            notes.append(
                f"process {pid} was already stopped ({state.describe()}) before capture; left "
                "as found, its stacks read without attaching (py-spy --nonblocking)"
            )
        gentle = self.nonblocking or stopped_before
        attempts: list[Attempt] = []
        if gentle:
            runs: list[_PySpyRun] = []
            while len(runs) < NONBLOCKING_ATTEMPTS:
                run = await self._run(pyspy, pid, "json", False, stopped_before, nonblocking=True)
                if run.status is DumpStatus.OK and isinstance(_decode(run.stdout), str):
                    run = _PySpyRun(DumpStatus.FAILED, run.stdout, run.attempt)
                runs.append(run)
                if run.status is not DumpStatus.FAILED:
                    break  # done, or a failure a retry cannot fix (permissions, gone, timeout)
            return self._gentle_result(pid, runs, notes, started, state)
        json_run, native = await self._with_fallback(pyspy, pid, "json", stopped_before, attempts)
        threads: tuple[Thread, ...] | None = None
        json_text: str | None = None
        if json_run.status is DumpStatus.OK:
            parsed = _decode(json_run.stdout)
            if isinstance(parsed, str):
                notes.append(f"py-spy JSON unusable: {parsed}")
            else:
                threads, json_text = parsed, json_run.stdout
        text: str | None = None
        if json_run.status not in (*_FINAL, DumpStatus.TIMEOUT, DumpStatus.PYSPY_MISSING):
            if json_run.status is DumpStatus.OK:
                text_run = await self._run(pyspy, pid, "text", native, stopped_before)
                attempts.append(text_run.attempt)
                if text_run.status is not DumpStatus.OK and native:
                    text_run = await self._run(pyspy, pid, "text", False, stopped_before)
                    attempts.append(text_run.attempt)
            else:
                text_run, _ = await self._with_fallback(
                    pyspy, pid, "text", stopped_before, attempts
                )
            if text_run.status is DumpStatus.OK:
                text = text_run.stdout
        resumed = any(a.resumed_target for a in attempts)
        if resumed:
            notes.append(f"process {pid} was left stopped (state T) by py-spy; sent SIGCONT")
        status = _overall_status(attempts, json_text is not None or text is not None)
        failing = next((a for a in reversed(attempts) if a.status is status), None)
        error = None if status is DumpStatus.OK else (failing.error if failing else None)
        used_native = any(a.native and a.status is DumpStatus.OK for a in attempts)
        return StackDump(
            pid=pid,
            status=status,
            text=text,
            json_text=json_text,
            threads=threads,
            native=used_native,
            attempts=tuple(attempts),
            resumed_target=resumed,
            notes=tuple(notes),
            error=error,
            fix=PTRACE_FIX if status is DumpStatus.PERMISSION_DENIED else None,
            duration_seconds=self.clock() - started,
            process_state=_state_after(pid, state, status),
        )

    def _gentle_result(
        self,
        pid: int,
        runs: Sequence[_PySpyRun],
        notes: list[str],
        started: float,
        state: ProcState,
    ) -> StackDump:
        """The nonblocking JSON dump as a dump; the text is rendered from its threads."""
        run = runs[-1]
        attempts = tuple(r.attempt for r in runs)
        resumed = any(a.resumed_target for a in attempts)
        threads: tuple[Thread, ...] | None = None
        json_text: str | None = None
        text: str | None = None
        status = run.status
        error = run.attempt.error
        if status is DumpStatus.OK:
            parsed = _decode(run.stdout)
            if isinstance(parsed, str):
                status, error = DumpStatus.FAILED, f"py-spy JSON unusable: {parsed}"
            else:
                threads, json_text = parsed, run.stdout
                text = render_text(pid, parsed)
        if resumed:
            notes.append(f"process {pid} was left stopped (state T) by py-spy; sent SIGCONT")
        return StackDump(
            pid=pid,
            status=status,
            text=text,
            json_text=json_text,
            threads=threads,
            native=False,
            attempts=attempts,
            resumed_target=resumed,
            notes=tuple(notes),
            error=None if status is DumpStatus.OK else error,
            fix=PTRACE_FIX if status is DumpStatus.PERMISSION_DENIED else None,
            duration_seconds=self.clock() - started,
            process_state=_state_after(pid, state, status),
        )

    async def _with_fallback(
        self, pyspy: str, pid: int, output: str, stopped_before: bool, attempts: list[Attempt]
    ) -> tuple[_PySpyRun, bool]:
        run: _PySpyRun | None = None
        if self.native:
            run = await self._run(pyspy, pid, output, True, stopped_before)
            attempts.append(run.attempt)
            if (
                run.status is DumpStatus.OK
                and output == "json"
                and isinstance(_decode(run.stdout), str)
            ):
                run = _PySpyRun(DumpStatus.FAILED, run.stdout, run.attempt)
            if run.status is DumpStatus.OK or run.status in _FINAL:
                return run, True
        run = await self._run(pyspy, pid, output, False, stopped_before)
        attempts.append(run.attempt)
        return run, False

    async def _run(
        self,
        pyspy: str,
        pid: int,
        output: str,
        native: bool,
        stopped_before: bool,
        *,
        nonblocking: bool | None = None,
    ) -> _PySpyRun:
        nonblocking = self.nonblocking if nonblocking is None else nonblocking
        argv = build_argv(
            pyspy,
            pid,
            output=output,
            native=native,
            capture_locals=self.capture_locals,
            prefix=self.argv_prefix,
            nonblocking=nonblocking,
        )
        started = self.clock()
        try:
            result = await run_command(
                argv,
                timeout_seconds=self.timeout_seconds,
                stdout_bytes=_STDOUT_BYTES,
                stderr_bytes=_STDERR_TAIL_BYTES,
            )
        except asyncio.CancelledError:
            if not stopped_before:
                resume_if_stopped(pid)
            raise
        status: DumpStatus
        error: str | None
        stdout = ""
        exit_code: int | None = None
        if result.start_error is not None:
            attempt = Attempt(
                output,
                native,
                DumpStatus.FAILED,
                None,
                0.0,
                f"cannot start: {result.start_error}",
                nonblocking=nonblocking,
            )
            return _PySpyRun(DumpStatus.FAILED, "", attempt)
        if result.timed_out:
            status = DumpStatus.TIMEOUT
            error = f"py-spy did not finish within {self.timeout_seconds:g} s; killed"
        else:
            exit_code = result.returncode
            stdout = result.stdout.decode("utf-8", errors="replace")
            stderr = result.stderr.decode("utf-8", errors="replace")
            status, error = classify_output(
                exit_code if exit_code is not None else -1, stdout, stderr
            )
        resumed = False if stopped_before else resume_if_stopped(pid)
        attempt = Attempt(
            output,
            native,
            status,
            exit_code,
            self.clock() - started,
            error,
            resumed,
            nonblocking=nonblocking,
        )
        return _PySpyRun(status, stdout, attempt)


def _state_after(pid: int, before: ProcState, status: DumpStatus) -> ProcState:
    """The state to record: as found, or re-read when the dump failed (it may have died or
    stopped meanwhile: that is the reason then)."""
    if status is DumpStatus.OK or not before.dumpable:
        return before
    return read_proc_state(pid)


def render_text(pid: int, threads: Sequence[Thread]) -> str:
    """py-spy's text dump layout, rendered from the threads of a JSON dump (pure)."""
    lines = [f"Process {pid}: (rendered from py-spy dump --json --nonblocking)", ""]
    for thread in threads:
        ident = thread.os_thread_id if thread.os_thread_id is not None else thread.thread_id
        name = f': "{thread.name}"' if thread.name else ""
        lines.append(f"Thread {ident} ({'active' if thread.active else 'idle'}){name}")
        lines.extend(f"    {frame.name} ({frame.filename}:{frame.line})" for frame in thread.frames)
    return "\n".join(lines) + "\n"


def _decode(stdout: str) -> tuple[Thread, ...] | str:
    try:
        data = json.loads(stdout)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    return parse_pyspy_json(data)


def _overall_status(attempts: Iterable[Attempt], have_output: bool) -> DumpStatus:
    if have_output:
        return DumpStatus.OK
    statuses = [a.status for a in attempts]
    for preferred in (DumpStatus.PERMISSION_DENIED, DumpStatus.NO_PROCESS, DumpStatus.TIMEOUT):
        if preferred in statuses:
            return preferred
    return statuses[-1] if statuses else DumpStatus.FAILED
