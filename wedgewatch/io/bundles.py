"""An evidence bundle on disk: its name, its private files, reading it back, and retention.

A bundle is one directory per episode under `evidence_dir`, named
`<UTC time>_<target>_engine<engine>_<family>`; directories are created 0700 and files 0600
whatever the umask, and nothing follows a symlink. What goes into a bundle is decided by
`io.evidence`; every file is redacted HERE, by the writer (`bundle_bytes`: JSON and JSON
lines value by value, text as text, see `wedgewatch.core.text.redact`), so no caller can forget.
"""

from __future__ import annotations

import calendar
import contextlib
import datetime as dt
import errno
import json
import math
import os
import re
import shutil
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.evidence.bundle_facts import bundle_facts, seen_frames
from wedgewatch.core.evidence.known_issues import match_known_issues, shipped_known_issues
from wedgewatch.core.evidence.retention import StoredBundle, plan_retention
from wedgewatch.core.evidence.triage import ProcessStacks, StackRound, parse_pyspy_json
from wedgewatch.core.text.escape import neutralise
from wedgewatch.core.text.redact import redact_env, redact_text, redact_value
from wedgewatch.io.atomic import write_atomic
from wedgewatch.io.private_paths import private_dir
from wedgewatch.io.procs import ServerProcess
from wedgewatch.vllm.semantics import Role

_DIR_MODE = 0o700
_SUMMARY_LIMIT = 32 * 1024 * 1024
_FILE_MODE = 0o600
_NAME_RE = re.compile(r"^(\d{8}T\d{6}Z)_")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def sanitise(component: str, limit: int = 48) -> str:
    """A safe path component: letters, digits, `.`, `_`, `-`; never empty, `.` or `..`."""
    cleaned = _UNSAFE.sub("-", component).strip("-.")[:limit].strip("-.")
    return cleaned or "x"


def bundle_name(timestamp: float, target: str, engine: str | None, family: str) -> str:
    """`20261202T101500Z_local_engine0_deferred_stall` (UTC, sanitised)."""
    when = dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    parts = [when, sanitise(target)]
    if engine is not None:
        parts.append(sanitise(f"engine{engine}"))
    parts.append(sanitise(family))
    return "_".join(parts)


def timestamp_of_name(name: str) -> float | None:
    """The UTC time encoded at the start of a bundle name, or None for other names."""
    match = _NAME_RE.match(name)
    if not match:
        return None
    try:
        return float(calendar.timegm(time.strptime(match.group(1), "%Y%m%dT%H%M%SZ")))
    except ValueError:
        return None


def json_safe(value: Any) -> Any:
    """A value that `json.dumps(..., allow_nan=False)` accepts: non-finite floats become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, str | int | bool) or value is None:
        return value
    return str(value)


def history_lines(history: Iterable[Mapping[str, Any]]) -> bytes:
    """The flight recorder as JSON lines."""
    return "".join(_json_line(item) for item in history).encode()


def _json_line(item: Mapping[str, Any]) -> str:
    try:  # the common case, in C: every value already JSON (`json_safe` would change nothing)
        return json.dumps(item, sort_keys=True, allow_nan=False) + "\n"
    except (TypeError, ValueError):  # a non-finite float, or a value json does not know
        return json.dumps(json_safe(item), sort_keys=True, allow_nan=False) + "\n"


def stack_file_stem(process: ServerProcess) -> str:
    """`engine_core-1234`: the file name (without suffix) of a process's dumps."""
    return f"{process.role}-{process.pid}"


# -- directories and files


def ensure_private_dir(path: Path) -> None:
    """Create a directory 0700 (parents too); an existing one must not be writable by other
    users (`io.private_paths.private_dir`; raises `UnsafePath`, an OSError)."""
    private_dir(path, "evidence_dir")


def make_bundle_dir(evidence_dir: Path, name: str) -> Path:
    """Create a new bundle directory 0700; `name-2`, `name-3`, ... when the name is taken."""
    ensure_private_dir(evidence_dir)
    for attempt in range(1, 1000):
        candidate = evidence_dir / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            os.mkdir(candidate, _DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(candidate, _DIR_MODE)
        return candidate
    raise FileExistsError(f"no free bundle name for {name} in {evidence_dir}")


def write_private(path: Path, data: bytes) -> None:
    """Write a new file 0600 (fails if it exists; never follows a symlink)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, _FILE_MODE)
    try:
        os.fchmod(fd, _FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def json_bytes(value: Any) -> bytes:
    """Indented, sorted, strict JSON (non-finite floats as strings) with a final newline."""
    return _json_text(value).encode()


def _json_text(value: Any) -> str:
    return json.dumps(json_safe(value), indent=2, sort_keys=True, allow_nan=False) + "\n"


#: The bundle file that holds the server's argument vector and environment (`io.build_capture`).
BUILD_FILE = "build.json"


def bundle_bytes(rel: str, data: bytes) -> bytes:
    """A bundle file's bytes as written, and as a report reads them: redacted (`.json` as a
    JSON value, `.jsonl` line by line, anything else as UTF-8 text, whose control characters
    but newline and tab become visible escapes); bytes that are not UTF-8 text are kept as
    they are. The one place a bundle file is redacted."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    if rel.endswith(".json"):
        try:
            value = json.loads(text)
        except ValueError:
            return _text(text).encode()
        # Compact stays compact (py-spy's dumps).
        return _redacted_json(rel, value, indent="\n" in text.strip()).encode()
    if rel.endswith(".jsonl"):
        lines = text.splitlines(keepends=True)
        return "".join(_redacted_line(rel, line) for line in lines).encode()
    # Text files are read with `cat` and `less`: no escape sequence from the target in them.
    return _text(text).encode()


def _redacted_json(rel: str, value: Any, *, indent: bool) -> str:
    """A JSON value redacted value by value (`redact_value`), as one line or indented."""
    shown = redact_value(_as_read(rel, value))
    return _json_text(shown) if indent else _json_line(shown)


def _as_read(rel: str, value: Any) -> Any:
    """`build.json` holds an argument vector and an environment read as such: every word of
    the vector as text (so a number after `--api-key` is masked like any other value), and
    the environment masked by its names' rules (`redact_env`: any name holding `TOKEN`,
    `KEY`, `AUTH`, ..., which `redact_value` alone would not read as secret)."""
    if rel != BUILD_FILE or not isinstance(value, dict):
        return value
    out = dict(value)
    argv = out.get("command_line")
    if isinstance(argv, list):
        out["command_line"] = [str(word) for word in argv]
    env = out.get("engine_env")
    if isinstance(env, Mapping):
        out["engine_env"] = redact_env({str(k): str(v) for k, v in env.items()})
    return out


def _text(text: str) -> str:
    """Text redacted, its control characters but newline and tab visible, nothing cut."""
    shown = redact_text(text)
    # An escape is at most 6 characters (`\uXXXX`); an empty file stays empty (limit >= 1).
    return neutralise(shown, 6 * len(shown) + 1)


def _redacted_line(rel: str, line: str) -> str:
    try:
        value = json.loads(line)
    except ValueError:
        return _text(line)
    return _redacted_json(rel, value, indent=False) if line.strip() else line


def write_bundle_file(bundle: Path, rel: str, data: bytes, *, replace: bool = True) -> None:
    """Write one file of a bundle, redacted (`bundle_bytes`): a new file 0600, or with
    `replace` an atomic replacement; raises OSError."""
    path = bundle / rel
    if replace:
        write_atomic(path, bundle_bytes(rel, data))
    else:
        write_private(path, bundle_bytes(rel, data))


def write_round_files(bundle: Path, files: Mapping[str, bytes], replace: bool) -> list[str]:
    """Write one round's files under `bundle` (directories 0700, files 0600, redacted);
    failures per file.

    Phase 1 creates new files; phase 2 replaces atomically, so completing twice is harmless.
    """
    failures: list[str] = []
    for rel, data in sorted(files.items()):
        path = bundle / rel
        try:
            for parent in reversed(path.relative_to(bundle).parents[:-1]):
                directory = bundle / parent
                if not directory.is_dir():
                    os.mkdir(directory, _DIR_MODE)
                    os.chmod(directory, _DIR_MODE)
            write_bundle_file(bundle, rel, data, replace=replace)
        except OSError as exc:
            failures.append(f"writing {rel}: {exc.strerror or exc}")
    return failures


def load_first_round(bundle: Path, summary: Mapping[str, Any]) -> StackRound | None:
    """The first round of stacks, re-read from the bundle (survives a daemon restart)."""
    phases = summary.get("phases")
    if not isinstance(phases, Mapping):
        return None
    for label, phase in phases.items():
        if label == CapturePhase.WEDGED or not isinstance(phase, Mapping):
            continue
        discovery = phase.get("discovery")
        if not isinstance(discovery, Mapping):
            return None
        stacks = {s.get("pid"): s for s in phase.get("stacks", []) if isinstance(s, Mapping)}
        processes: list[ProcessStacks] = []
        for raw in discovery.get("processes", []):
            if not isinstance(raw, Mapping):
                continue
            try:
                pid, ppid = int(raw["pid"]), int(raw["ppid"])
                role = Role(raw["role"])
            except (KeyError, TypeError, ValueError):
                continue
            title, status = str(raw.get("title", "")), str(raw.get("status", "running"))
            record = stacks.get(pid, {})
            threads = None
            failure: str | None = f"{record.get('status', 'not dumped')}: {record.get('error')}"
            for rel in record.get("files", []):
                if str(rel).endswith(".json"):
                    try:
                        parsed = parse_pyspy_json(json.loads((bundle / rel).read_text()))
                    except (OSError, ValueError) as exc:
                        failure = f"cannot re-read {rel}: {exc}"
                        continue
                    if isinstance(parsed, str):
                        failure = f"{rel}: {parsed}"
                    else:
                        threads, failure = parsed, None
            processes.append(ProcessStacks(pid, ppid, role, title, threads, failure, status))
        return StackRound(str(label), tuple(processes), discovery.get("error"))
    return None


# -- reading a bundle back as untrusted input (`report`, `bundles`)

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UntrustedRead(Exception):
    """Why a bundle file was not read: a symlink, a special file, too large, unreadable."""


def _open_inside(bundle: Path, parts: Sequence[str], final_flags: int) -> int:
    """An fd for `bundle/parts...` opened component by component, never following a symlink
    below `bundle` (the bundle directory itself is the one the user named)."""
    fd = os.open(bundle, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for index, part in enumerate(parts):
            if part in ("", ".", "..") or "/" in part:
                raise UntrustedRead(f"not a plain name: {part!r}")
            last = index == len(parts) - 1
            try:
                child = os.open(part, final_flags if last else _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                    raise UntrustedRead("a symlink (not followed)") from exc
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def read_untrusted(bundle: Path, rel: str, limit: int) -> bytes:
    """The bytes of `bundle/rel`, read as untrusted input: no symlink anywhere below the
    bundle is followed, only a regular file is read (a FIFO or a device is refused without
    blocking), at most `limit` bytes. Raises `UntrustedRead` (why) or OSError
    (FileNotFoundError for a missing file)."""
    fd = _open_inside(bundle, rel.split("/"), _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedRead("not a regular file (not read)")
        if info.st_size > limit:
            raise UntrustedRead(f"larger than {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise UntrustedRead(f"larger than {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def list_untrusted(bundle: Path, rel: str) -> list[str]:
    """The regular files under the directory `bundle/rel` (relative to `bundle`, sorted),
    without following a symlink; empty when it is missing, a symlink or not a directory."""
    found: list[str] = []
    try:
        fd = _open_inside(bundle, rel.split("/"), _DIR_FLAGS)
    except (OSError, UntrustedRead):
        return found
    try:
        with os.scandir(fd) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_file(follow_symlinks=False):
                    found.append(f"{rel}/{entry.name}")
                elif entry.is_dir(follow_symlinks=False):
                    found.extend(list_untrusted(bundle, f"{rel}/{entry.name}"))
    finally:
        os.close(fd)
    return found


# -- retention


def scan_bundles(evidence_dir: Path) -> list[StoredBundle]:
    """The bundles in `evidence_dir` (directories whose name starts with a UTC stamp)."""
    found: list[StoredBundle] = []
    try:
        entries = list(os.scandir(evidence_dir))
    except OSError:
        return found
    for entry in entries:
        created = timestamp_of_name(entry.name)
        if created is None or not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        found.append(StoredBundle(entry.name, created, _tree_size(path), _is_wedge(path)))
    return found


def _tree_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _is_wedge(path: Path) -> bool:
    try:  # never blocks on a FIFO, never follows a symlink
        summary = json.loads(read_untrusted(path, "summary.json", _SUMMARY_LIMIT))
    except (OSError, ValueError, UntrustedRead):
        return False
    return isinstance(summary, dict) and summary.get("verdict") == CapturePhase.WEDGED


def apply_retention(
    evidence_dir: Path,
    keep: int,
    max_bytes: int,
    *,
    protect: Iterable[str] = (),
    protected_wedges: int = 1,
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Delete the bundles the plan evicts; returns (evicted names, failure messages)."""
    plan = plan_retention(
        scan_bundles(evidence_dir),
        keep,
        max_bytes,
        protect=protect,
        protected_wedges=protected_wedges,
    )
    evicted: list[str] = []
    failures: list[str] = []
    for name in plan.evict:
        path = evidence_dir / name
        if path.is_symlink() or path.parent != evidence_dir:
            continue
        try:
            shutil.rmtree(path)
        except OSError as exc:
            failures.append(f"retention: cannot delete {name}: {exc.strerror or exc}")
        else:
            evicted.append(name)
    if plan.over_budget:
        failures.append(
            "retention: over evidence_keep or evidence_max_bytes; kept the bundle just written"
            " and the wedge bundles (only a newer wedge bundle evicts a wedge bundle, never"
            f" the newest {protected_wedges})"
        )
    return tuple(evicted), tuple(failures)


REMEDY_LOG = "remedy.jsonl"


def note_remedy(bundle: Path, record: Mapping[str, Any]) -> str | None:
    """Append what the daemon did after this bundle (a restart, how the episode ended) to
    `remedy.jsonl` in the bundle (0600); an error message or None. Never raises."""
    line = bundle_bytes(REMEDY_LOG, _json_line(record).encode())
    try:
        if not (bundle / "summary.json").is_file():
            return f"{bundle}: not an evidence bundle"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(bundle / REMEDY_LOG, flags, _FILE_MODE)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{bundle}: cannot note the remedy: {exc.strerror or exc}"
    return None


def known_issues_of(
    bundle: Path, summary: Mapping[str, Any], rounds: Sequence[StackRound]
) -> list[dict[str, object]]:
    """The shipped known issues that match a bundle being written (JSON for its summary).

    Reads the bundle's `build.json` and `history.jsonl` back (a missing or corrupt file
    counts as empty); the stacks are the rounds in memory.
    """
    build: Any = {}
    with contextlib.suppress(OSError, ValueError):
        build = json.loads((bundle / "build.json").read_text(encoding="utf-8"))
    history: list[dict[str, Any]] = []
    with contextlib.suppress(OSError):
        for line in (bundle / "history.jsonl").read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    history.append(item)
    frames = seen_frames(
        (r.label, str(p.role), p.pid, p.threads) for r in rounds for p in r.processes
    )
    workers = {p.pid for r in rounds for p in r.processes if p.role is Role.WORKER}
    facts = bundle_facts(
        summary, build if isinstance(build, dict) else {}, history, frames, workers=len(workers)
    )
    return [m.to_json() for m in match_known_issues(shipped_known_issues(), facts)]
