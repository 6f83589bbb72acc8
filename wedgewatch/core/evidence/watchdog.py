"""vLLM's own stack-dump watchdog as evidence: its dump files and its timeout counter. Pure.

vLLM's watchdog (``--watchdog-config '{"dump_dir": "...", "timeout": 300}'``, released in
0.34.0 as ``vllm/utils/watch_dog.py``; RFC #56816, PR #55700) runs one thread per EngineCore
and worker. When the process's loop has not fed it for ``timeout`` seconds it appends a
numbered dump of every thread's stack to ``<dump_dir>/VLLM_STACK_DUMP_for_<name>_<pid>.log``
(``name`` is ``engine_<dp rank>`` or ``worker_<rank>``; the PR's first version used
``engine`` and ``worker``):

    >>> Call stack dump #<n> at <time.ctime()> due to <reason>
    <blank line>
    <faulthandler.dump_traceback(all_threads=True)>
    <blank line>
    ================================================================

``faulthandler`` prints each thread as ``Thread 0x<id> (most recent call first):`` (the
calling one as ``Current thread ...``) followed by ``  File "<path>", line <n> in <func>``
lines, innermost first. The loop feeds the watchdog before each engine step, so a scheduler
that steps without scheduling anything (the admission wedges) keeps feeding it and it never
dumps; a loop blocked inside a step (a collective, a device sync, the KV-event publisher's
``Queue.put``) stops feeding it and it dumps. A dump is therefore evidence of a blocked
loop, and its absence says nothing.

``parse_dump_name`` and ``parse_dump_text`` read one file; the threads come out as triage's
``Thread`` objects, so the known-issue matcher reads them as it reads py-spy's frames.
"""

from __future__ import annotations

import re

from wedgewatch.core.evidence.triage import Frame, Thread, digest
from wedgewatch.core.values import immutable
from wedgewatch.vllm.semantics import Role

DUMP_FILE_GLOB = "VLLM_STACK_DUMP_for_*.log"
"""What the watchdog names its files (``fnmatch`` pattern)."""
MAX_DUMP_FILES = 16
"""The newest dump files a bundle carries (a directory of a long-lived host keeps one file
per process that ever dumped)."""
MAX_DUMP_BYTES = 256 * 1024
"""The tail of each dump file a bundle carries (the newest dumps are at the end)."""

_NAME = re.compile(r"^VLLM_STACK_DUMP_for_(?P<name>[A-Za-z0-9_.-]+?)_(?P<pid>\d+)\.log$")
_HEADER = re.compile(r"^>>> Call stack dump #(?P<seq>\d+) at (?P<at>.*?) due to (?P<reason>.*)$")
_THREAD = re.compile(
    r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-fA-F]+)"
    r"(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):$"
)
_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')


@immutable
class DumpName:
    """What a dump file's name says: the watchdog's process name, its role and pid."""

    name: str
    role: Role
    pid: int


@immutable
class StackDumpRecord:
    """One numbered dump in a file: when, why, and every thread (innermost frame first)."""

    seq: int
    at: str
    reason: str
    threads: tuple[Thread, ...]

    @property
    def main(self) -> Thread | None:
        """The thread a reader looks at first: the process's loop (vLLM's engine or worker
        loop), else the first thread in vLLM's code that is not the watchdog's own, else the
        first thread."""
        for thread in self.threads:
            if _LOOP_ANCHORS & {f.bare for f in thread.frames}:
                return thread
        for thread in self.threads:
            if _in_vllm(thread) and not _is_watchdog(thread):
                return thread
        return self.threads[0] if self.threads else None


_LOOP_ANCHORS = frozenset(
    {"run_engine_core", "run_busy_loop", "_process_engine_step", "worker_busy_loop", "worker_main"}
)


def _in_vllm(thread: Thread) -> bool:
    return any("vllm" in f.filename for f in thread.frames)


def _is_watchdog(thread: Thread) -> bool:
    return any(f.bare == "_check_loop" or "watch_dog" in f.filename for f in thread.frames)


def role_of(name: str) -> Role:
    """The role of a watchdog's process name (``engine_0`` -> EngineCore, ``worker_3``)."""
    head = name.split("_", 1)[0]
    if head == "engine":
        return Role.ENGINE_CORE
    if head == "worker":
        return Role.WORKER
    return Role.OTHER


def parse_dump_name(filename: str) -> DumpName | None:
    """``VLLM_STACK_DUMP_for_engine_0_42.log`` -> (engine_0, engine_core, 42); else None."""
    match = _NAME.match(filename)
    if match is None:
        return None
    name = match.group("name")
    return DumpName(name, role_of(name), int(match.group("pid")))


def parse_dump_text(text: str) -> tuple[StackDumpRecord, ...]:
    """Every dump in a file's text, oldest first. A dump cut off at the start of a tail (the
    capture keeps the last `MAX_DUMP_BYTES`) is read from its first whole thread on; lines
    that are not faulthandler's are skipped."""
    dumps: list[StackDumpRecord] = []
    seq, at, reason = 0, "", "unknown (the tail of the file starts inside a dump)"
    threads: list[Thread] = []
    current: tuple[int, str | None, bool] | None = None  # id, name, active
    frames: list[Frame] = []

    def close_thread() -> None:
        nonlocal current, frames
        if current is not None:
            tid, name, active = current
            threads.append(Thread(tid, None, name, active, tuple(frames)))
        current, frames = None, []

    def close_dump() -> None:
        nonlocal threads
        close_thread()
        if threads:
            dumps.append(StackDumpRecord(seq, at, reason, tuple(threads)))
        threads = []

    for line in text.splitlines():
        header = _HEADER.match(line)
        if header is not None:
            close_dump()
            seq, at, reason = int(header["seq"]), header["at"], header["reason"]
            continue
        thread = _THREAD.match(line)
        if thread is not None:
            close_thread()
            # faulthandler marks the dumping thread "Current thread"; py-spy's `active` (on a
            # CPU) has no counterpart, so every thread is read as not active.
            current = (int(thread["id"], 16), thread["name"], False)
            continue
        frame = _FRAME.match(line)
        if frame is not None and current is not None:
            frames.append(Frame(frame["func"], frame["file"], int(frame["line"])))
            continue
        if line.startswith("=" * 16):
            close_dump()
    close_dump()
    return tuple(dumps)


def dump_summary(filename: str, text: str) -> dict[str, object]:
    """The JSON a bundle's summary keeps for one dump file: who, how many dumps, the last one."""
    name = parse_dump_name(filename)
    dumps = parse_dump_text(text)
    last = dumps[-1] if dumps else None
    main = last.main if last is not None else None
    return {
        "file": filename,
        "name": name.name if name else None,
        "role": str(name.role) if name else str(Role.OTHER),
        "pid": name.pid if name else None,
        "dumps": len(dumps),
        "last_seq": last.seq if last else None,
        "last_at": last.at if last else None,
        "last_reason": last.reason if last else None,
        "threads": len(last.threads) if last else 0,
        "digest": digest(main, depth=6) if main is not None else None,
    }
