"""A short sampled profile of a wedged server's EngineCores: `py-spy record`, nonblocking.

A wedged vLLM engine loops: each step calls the scheduler, finds nothing to run, sleeps a
millisecond. A single dump mostly catches the sleep. At the wedge, after the dumps, each
EngineCore (only processes already proven to be the server's: the caller passes them) is
sampled for `profile_seconds` at `profile_rate_hz`:

    py-spy record --pid P --duration D --rate R --nonblocking --format raw --output FILE

`--nonblocking` reads the stacks without pausing the target (the server never waits on
the profiler); py-spy drops idle samples (a thread in `sleep`), so the busy part of the
loop shows. The folded output (one line per distinct stack with its sample count) goes
into the bundle as `profile-enginecore-<pid>.folded`. Every run has a hard timeout (the
bounded runner kills its process group); failures (py-spy missing, permission denied,
process gone, timeout, no time left before the capture deadline) are data. A target found
stopped after the run, that was not before, gets SIGCONT, as after a dump.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from wedgewatch.core.evidence.profile import FoldedProfile, parse_folded
from wedgewatch.core.values import immutable
from wedgewatch.io.pyspy import (
    PTRACE_FIX,
    PYSPY_MISSING_FIX,
    DumpStatus,
    classify_output,
    resolve_pyspy,
    resume_if_stopped,
    stopped_tasks,
)
from wedgewatch.io.runner import CommandResult, run_command

_STDERR_TAIL_BYTES = 2000
#: A folded profile larger than this is cut (a 2 s profile is a few kB).
_FOLDED_MAX_BYTES = 16 * 1024 * 1024


@immutable
class ProfileResult:
    """One EngineCore's sampled profile, or why there is none."""

    pid: int
    status: DumpStatus
    folded: str | None = None
    profile: FoldedProfile | None = None
    error: str | None = None
    fix: str | None = None
    duration_seconds: float = 0.0
    resumed_target: bool = False

    @property
    def file_name(self) -> str:
        """The bundle file of the folded profile."""
        return f"profile-enginecore-{self.pid}.folded"

    def to_json(self, seconds: int, rate_hz: int) -> dict[str, object]:
        """JSON-safe form for the bundle's summary (without the folded text)."""
        record: dict[str, object] = {
            "pid": self.pid,
            "role": "engine_core",
            "status": str(self.status),
            "seconds": seconds,
            "rate_hz": rate_hz,
            "nonblocking": True,
            "file": self.file_name if self.folded is not None else None,
            "error": self.error,
            "fix": self.fix,
            "resumed_target": self.resumed_target,
            "duration_seconds": round(self.duration_seconds, 4),
        }
        if self.profile is not None:
            record.update(self.profile.summary())
        return record


def build_record_argv(
    pyspy: str, pid: int, seconds: int, rate_hz: int, output: Path, *, prefix: Sequence[str] = ()
) -> list[str]:
    """The argv of one nonblocking `py-spy record` to a folded (raw) file."""
    return [
        *prefix,
        pyspy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(seconds),
        "--rate",
        str(rate_hz),
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(output),
    ]


@dataclass
class PySpyProfiler:
    """Samples processes with `py-spy record --nonblocking`; see the module docstring."""

    pyspy_path: str = "py-spy"
    seconds: int = 2
    rate_hz: int = 50
    timeout_seconds: float = 10.0  # on top of `seconds`
    argv_prefix: tuple[str, ...] = ()
    clock: Callable[[], float] = time.monotonic

    async def profile(self, pid: int, budget_seconds: float | None = None) -> ProfileResult:
        """The folded profile of one process; never raises for the process's misbehaviour.

        `budget_seconds` caps the whole run (the capture deadline); a budget shorter than
        the sampling itself is recorded as a timeout without running py-spy.
        """
        started = self.clock()
        pyspy = resolve_pyspy(self.pyspy_path)
        if pyspy is None:
            why = f"py-spy not found (pyspy_path = {self.pyspy_path!r})"
            return ProfileResult(pid, DumpStatus.PYSPY_MISSING, error=why, fix=PYSPY_MISSING_FIX)
        exists, stopped_before = stopped_tasks(pid)
        if not exists:
            return ProfileResult(pid, DumpStatus.NO_PROCESS, error=f"process {pid} does not exist")
        timeout = self.seconds + self.timeout_seconds
        if budget_seconds is not None and budget_seconds < self.seconds + 1:
            why = f"{budget_seconds:.1f} s left before the capture deadline; not sampled"
            return ProfileResult(pid, DumpStatus.TIMEOUT, error=why)
        if budget_seconds is not None:
            timeout = min(timeout, budget_seconds)
        with tempfile.TemporaryDirectory(prefix="wedgewatch-profile-") as scratch:  # 0700
            output = Path(scratch) / "profile.folded"
            argv = build_record_argv(
                pyspy, pid, self.seconds, self.rate_hz, output, prefix=self.argv_prefix
            )
            try:
                result = await run_command(
                    argv,
                    timeout_seconds=timeout,
                    stdout_bytes=4096,
                    stderr_bytes=_STDERR_TAIL_BYTES,
                )
            finally:  # nonblocking never stops the target; a misbehaving py-spy might
                resumed = False if stopped_before else resume_if_stopped(pid)
            folded = _read(output)
        elapsed = self.clock() - started
        status, error = _classify(result, timeout, folded)
        if status is DumpStatus.OK and folded is not None:
            return ProfileResult(
                pid, status, folded, parse_folded(folded), None, None, elapsed, resumed
            )
        fix = PTRACE_FIX if status is DumpStatus.PERMISSION_DENIED else None
        return ProfileResult(pid, status, None, None, error, fix, elapsed, resumed)


def _read(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return f.read(_FOLDED_MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


def _classify(
    result: CommandResult, timeout: float, folded: str | None
) -> tuple[DumpStatus, str | None]:
    if result.start_error is not None:
        return DumpStatus.FAILED, f"cannot start: {result.start_error}"
    if result.timed_out:
        return DumpStatus.TIMEOUT, f"py-spy record did not finish within {timeout:g} s; killed"
    stdout = result.stdout.decode("utf-8", errors="replace")
    stderr = result.stderr.decode("utf-8", errors="replace")
    if result.returncode == 0 and folded is not None:
        return DumpStatus.OK, None  # an empty file: every sample was idle; still an answer
    status, error = classify_output(result.returncode or 1, stdout, stderr)
    return (DumpStatus.FAILED if status is DumpStatus.OK else status), error


@dataclass
class ProfileRound:
    """What profiling the EngineCores of one capture round produced."""

    files: dict[str, bytes] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    records: list[dict[str, object]] = field(default_factory=list)
    profiles: dict[int, FoldedProfile] = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the round (the profiles run at once)


async def profile_engines(
    pids: Sequence[int], profiler: PySpyProfiler, budget_seconds: float
) -> ProfileRound:
    """Profile the given (proven) EngineCore pids at once; files, failures, summary records.

    Nothing runs (and no time is counted) when the profiler's `seconds` is 0 (the setting
    that turns profiles off) or there is no EngineCore to profile.
    """
    out = ProfileRound()
    if profiler.seconds <= 0 or not pids:
        return out
    started = profiler.clock()
    results = await asyncio.gather(*(profiler.profile(pid, budget_seconds) for pid in pids))
    out.seconds = profiler.clock() - started
    for result in results:
        out.records.append(result.to_json(profiler.seconds, profiler.rate_hz))
        if result.folded is not None and result.profile is not None:
            out.files[result.file_name] = result.folded.encode()
            out.profiles[result.pid] = result.profile
        else:
            out.failures.append(
                f"py-spy record engine_core {result.pid}: {result.status}: {result.error}"
                + (f" (fix: {result.fix})" if result.fix else "")
            )
    return out
