"""Read vLLM's own watchdog dumps (`VLLM_STACK_DUMP_for_<name>_<pid>.log`) into a bundle.

When `watchdog_dump_dir` names the directory vLLM's `--watchdog-config` writes to, each
capture copies the newest `MAX_DUMP_FILES` dump files (the last `MAX_DUMP_BYTES` of each,
where the newest dumps are) into the bundle under `watchdog/`, and returns what
`core.evidence.watchdog` reads in them for `summary.json` (`watchdog`) and one stack round
(`watchdog`) for the known-issue matcher. The directory belongs to the server, so it is read
as untrusted: no symlink is followed, only regular files are read, a FIFO never blocks, and
every failure is data (`failures`), never raised.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from wedgewatch.core.evidence.triage import ProcessStacks, StackRound
from wedgewatch.core.evidence.watchdog import (
    DUMP_FILE_GLOB,
    MAX_DUMP_BYTES,
    MAX_DUMP_FILES,
    dump_summary,
    parse_dump_name,
    parse_dump_text,
)

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)

ROUND_LABEL = "watchdog"
"""The stack round the dumps make for the known-issue matcher."""


@dataclass(slots=True)
class WatchdogCapture:
    """What the dump directory held: bundle files, the summary's `watchdog`, one round."""

    files: dict[str, bytes] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    round: StackRound | None = None


def _tail(dir_fd: int, name: str) -> tuple[bytes, int, float] | str:
    """The last MAX_DUMP_BYTES of a regular file, its size and mtime; or why not."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        return f"{name}: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"{name}: not a regular file"
        start = max(0, info.st_size - MAX_DUMP_BYTES)
        os.lseek(fd, start, os.SEEK_SET)
        chunks: list[bytes] = []
        left = MAX_DUMP_BYTES
        while left > 0:
            chunk = os.read(fd, min(left, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), info.st_size, info.st_mtime
    except OSError as exc:
        return f"{name}: {exc.strerror or exc}"
    finally:
        os.close(fd)


def read_watchdog_dumps(directory: str) -> WatchdogCapture:
    """The newest dump files of `directory` ("" = not configured: nothing)."""
    capture = WatchdogCapture()
    if not directory:
        return capture
    failures: list[str] = []
    capture.summary = {"dir": directory, "files": [], "failures": failures}
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        failures.append(f"{directory}: {exc.strerror or exc}")
        return capture
    try:
        entries: list[tuple[float, str]] = []
        for name in os.listdir(dir_fd):
            if not fnmatch.fnmatchcase(name, DUMP_FILE_GLOB) or parse_dump_name(name) is None:
                continue
            try:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                entries.append((info.st_mtime, name))
        entries.sort(reverse=True)
        capture.summary["files_seen"] = len(entries)
        processes: list[ProcessStacks] = []
        for _mtime, name in entries[:MAX_DUMP_FILES]:
            read = _tail(dir_fd, name)
            if isinstance(read, str):
                failures.append(read)
                continue
            data, size, mtime = read
            text = data.decode("utf-8", errors="replace")
            capture.files[f"watchdog/{name}"] = data
            summary = dump_summary(name, text)
            summary.update({"bytes": size, "kept_bytes": len(data), "mtime": mtime})
            capture.summary["files"].append(summary)
            dumped = parse_dump_name(name)
            dumps = parse_dump_text(text)
            if dumped is not None and dumps:
                processes.append(ProcessStacks(dumped.pid, 0, dumped.role, name, dumps[-1].threads))
        if processes:
            capture.round = StackRound(ROUND_LABEL, tuple(processes))
    except OSError as exc:
        failures.append(f"{directory}: {exc.strerror or exc}")
    finally:
        os.close(dir_fd)
    return capture
