"""Standard output that cannot take a command's output: one line on stderr and a failing exit.

A command whose output goes to a full disk (`wedgewatch config reference > /mnt/full/x`), a
closed pipe or a broken terminal has not done its job, however well the rest went. Python
would say so with a traceback (a write that fails at once) or, for output still in the buffer
when the interpreter exits, with "Exception ignored" and exit status 120. The entry point
instead puts standard output under `watch` (the same stream, which remembers a write or flush
that failed), asks `output_failure` whether an `OSError` was standard output's, and `finish`
flushes the output before the exit status is given, so either way the command prints one
line naming the problem (`wedgewatch: could not write to standard output: No space left
on device`) and exits with the command's failure status:
`check`'s UNKNOWN (3, like a probe that cannot use its state file: a broken probe is seen),
1 for every other command (silently when a reader closed the pipe, as `| head` does). What
could not be written is dropped, never retried: the descriptor is pointed at /dev/null so
the interpreter's own flush at exit succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys

#: `check`'s exit status when its report cannot be written (Nagios UNKNOWN).
EXIT_CHECK_OUTPUT_FAILED = 3
#: Every other command's.
EXIT_OUTPUT_FAILED = 1


class _WatchedOutput(io.TextIOWrapper):
    """Standard output that remembers the first write or flush that failed."""

    failure: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except OSError as exc:
            self.failure = self.failure or exc
            raise

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            self.failure = self.failure or exc
            raise


def watch() -> None:
    """Standard output, when it is the interpreter's own text stream, replaced by the same
    stream (same buffer, encoding and buffering) that remembers a failed write."""
    stream = sys.stdout
    if type(stream) is not io.TextIOWrapper:  # a test's capture, or already watched
        return
    encoding, errors = stream.encoding, stream.errors
    line_buffering, write_through = stream.line_buffering, stream.write_through
    sys.stdout = _WatchedOutput(
        stream.detach(),
        encoding=encoding,
        errors=errors,
        line_buffering=line_buffering,
        write_through=write_through,
    )


def _flush_fails() -> OSError | None:
    """The error flushing standard output raises now, or None when it is written."""
    stream = sys.stdout
    if stream is None:
        return None
    try:
        stream.flush()
    except OSError as exc:
        return exc
    except ValueError:  # closed by the command itself: nothing is pending
        return None
    return None


def output_failure(exc: BaseException) -> OSError | None:
    """`exc` when it is standard output failing (a watched write failed, or what remains
    buffered cannot be written either), else None: any other `OSError` is the command's own
    and is not hidden."""
    if not isinstance(exc, OSError):
        return None
    if isinstance(sys.stdout, _WatchedOutput) and sys.stdout.failure is not None:
        return exc
    return exc if _flush_fails() is not None else None


def _drop_pending() -> None:
    """Point standard output at /dev/null so what the buffer holds drains without error."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, sys.stdout.fileno())
        finally:
            os.close(null)
        sys.stdout.flush()


def failed(exc: OSError, command: str | None) -> int:
    """Say that the output could not be written; the exit status for `command`."""
    _drop_pending()
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno != errno.EPIPE:  # a reader that closed the pipe (`| head`) left on purpose
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.write(f"wedgewatch: could not write to standard output: {reason}\n")
            sys.stderr.flush()
    return EXIT_CHECK_OUTPUT_FAILED if command == "check" else EXIT_OUTPUT_FAILED


def finish(code: int, command: str | None) -> int:
    """The exit status once the output is flushed: `code`, or the command's failure status
    when the output could not be written."""
    exc = _flush_fails()
    return code if exc is None else failed(exc, command)
