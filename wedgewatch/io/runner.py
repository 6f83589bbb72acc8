"""The one way wedgewatch runs a short-lived command: a deadline, bounded output, and the
whole process group killed when the deadline passes or the caller is cancelled.

py-spy, nvidia-smi, `systemctl restart`, an `exec` remedy and the launcher's `vllm --version`
all run through `run_command` (sync callers through `blocking`):

* **Own session.** The command leads a new session and process group, so a timeout or a
  cancellation reaches everything it started (SIGKILL to the group), never wedgewatch.
* **Deadline.** `timeout_seconds` bounds the wait for the command to exit. A command that
  outlives it is killed and reported as `timed_out`; nothing is raised.
* **Bounded output.** stdout and stderr go to unlinked temporary files (a child never blocks
  on a full pipe, and a background process it leaves behind never gets SIGPIPE); afterwards
  at most `stdout_bytes` / `stderr_bytes` of each is read back, the head or the tail as
  asked, with a flag saying that more was written.
* **Failures are data.** A program that cannot be started comes back with `start_error`.
  Cancellation is the one exception that passes through, after the group is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Literal, TypeVar

from wedgewatch.core.values import immutable

T = TypeVar("T")

#: How long a killed command may take to be reaped before we stop waiting for it.
REAP_SECONDS = 5.0

Keep = Literal["head", "tail"]


@immutable
class CommandResult:
    """What one command did: data, never an exception."""

    returncode: int | None  # None: it could not be started, or it timed out and was killed
    timed_out: bool
    start_error: OSError | None  # why it could not be started
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool  # it wrote more than was kept
    stderr_truncated: bool

    @property
    def started(self) -> bool:
        """True when the program ran at all."""
        return self.start_error is None


def _read(file: IO[bytes], limit: int, keep: Keep) -> tuple[bytes, bool]:
    """At most `limit` bytes of what was written to `file`, and whether more was written."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(size - limit, 0) if keep == "tail" else 0)
    return file.read(limit), size > limit


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by `pid`; gone already or not ours is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    kill_group(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()  # the leader, should it have left its group
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(proc.wait()), REAP_SECONDS)


async def run_command(
    argv: Sequence[str],
    *,
    timeout_seconds: float,
    env: Mapping[str, str] | None = None,
    stdout_bytes: int,
    stderr_bytes: int,
    stdout_keep: Keep = "head",
    stderr_keep: Keep = "tail",
) -> CommandResult:
    """Run `argv` (no shell, stdin from /dev/null) under the deadline; see the module docstring.

    `env` replaces the environment when given (None: inherit wedgewatch's).
    """
    if not argv:
        raise ValueError("run_command needs a program to run")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=None if env is None else dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            return CommandResult(None, False, exc, b"", b"", False, False)
        timed_out = False
        try:
            async with asyncio.timeout(timeout_seconds):
                returncode: int | None = await proc.wait()
        except TimeoutError:
            timed_out, returncode = True, None
            await _kill_and_reap(proc)
        except asyncio.CancelledError:
            await _kill_and_reap(proc)
            raise
        stdout, stdout_cut = _read(out, stdout_bytes, stdout_keep)
        stderr, stderr_cut = _read(err, stderr_bytes, stderr_keep)
        return CommandResult(returncode, timed_out, None, stdout, stderr, stdout_cut, stderr_cut)


def blocking(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` (a `run_command` or a caller of it) to completion from synchronous code.

    It runs on a private event loop in a worker thread, so a sync caller works the same
    whether or not an event loop is already running in its own thread (the launcher's checks
    run before `asyncio.run`, the demo's from inside its loop).
    """
    with ThreadPoolExecutor(1, thread_name_prefix="wedgewatch-runner") as pool:
        return pool.submit(asyncio.run, coro).result()
