"""Evidence bundles: one private directory per episode, taken at `suspect`, completed at `wedged`.

Phase 1 (`open_bundle`, at suspect) writes everything: the raw /metrics body, the flight
recorder, the process tree with a short CPU sample, py-spy dumps of the API server, every
EngineCore and every worker, nvidia-smi, the triage and `summary.json`. Phase 2
(`complete_bundle`, at wedged) adds the /metrics body at the wedge, a second round of
stacks under `pyspy/wedged/`, a second process sample, re-runs triage over both rounds
and rewrites `summary.json` (atomically) with the verdict `wedged`. When a wedge arrives
without a suspect bundle, or for `wedgewatch capture`, `capture_bundle` does it in one call.

Every failure inside a capture is recorded in `summary.json` and in the returned
`BundleResult`, never raised: the restart that follows must not wait on evidence. The
whole capture runs under `capture_deadline_seconds`; steps still running then are
cancelled (py-spy runs are killed and their targets checked for SIGSTOP) and recorded.

Directories are created 0700 and files 0600 regardless of the umask. Retention
(`plan_retention`, pure) keeps at most `evidence_keep` bundles under `evidence_max_bytes`
by evicting routine bundles (suspect bundles, resolved or still open, and manual captures)
oldest first. Wedge bundles are evicted only to make room for a newer wedge bundle, oldest
first, never the newest `protected_wedge_bundles`; the bundle just written is never
evicted. A routine bundle never costs a wedge bundle, so when wedge bundles fill the
budget the directory runs over by the newest routine bundle. See docs/evidence.md.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import datetime as dt
import json
import math
import os
import re
import shutil
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from wedgewatch import __version__
from wedgewatch.core.triage import (
    ProcessStacks,
    StackRound,
    Triage,
    TriageKind,
    parse_pyspy_json,
    triage,
)
from wedgewatch.io.atomic import write_atomic
from wedgewatch.io.procs import (
    Discovery,
    ProcessFinder,
    ProcessSelector,
    ProcessStats,
    PsutilProcessFinder,
    ServerProcess,
    combine_samples,
    read_readings,
)
from wedgewatch.io.pyspy import DumpStatus, PySpyRunner, StackDump, StackDumper
from wedgewatch.io.runner import run_command
from wedgewatch.vllm.semantics import Role

SCHEMA = "wedgewatch.evidence/1"
NVIDIA_SMI_NOT_FOUND = "nvidia-smi not found"
#: nvidia-smi's full output is a few KB per GPU; more than this is kept only in part.
NVIDIA_SMI_OUTPUT_BYTES = 1024 * 1024
NVIDIA_SMI_ERROR_BYTES = 2000
NVIDIA_SMI_QUERY = (
    "--query-gpu=index,name,utilization.gpu,power.draw,memory.used",
    "--format=csv",
)
_DIR_MODE = 0o700
_FILE_MODE = 0o600
_NAME_RE = re.compile(r"^(\d{8}T\d{6}Z)_")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# A flag whose last word names a secret: --api-key, --hf-token, --db-password (not
# --max-num-batched-tokens or --ssl-keyfile, whose values are not secrets).
_SECRET_FLAG = re.compile(
    r"(?i)^--?(?:[a-z0-9]+[-_])*(?:key|token|secret|password|passwd|credentials?)(?==|$)"
)
_DUMPED_ROLES = (Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER)


class Phase(StrEnum):
    """Which capture a bundle part belongs to."""

    SUSPECT = "suspect"
    WEDGED = "wedged"
    MANUAL = "manual"


@dataclass(frozen=True, slots=True)
class EvidenceSettings:
    """The evidence slice of the configuration (the daemon narrows `Config` into this)."""

    evidence_dir: Path
    capture_locals: bool = False
    pyspy_path: str = "py-spy"
    pyspy_timeout_seconds: float = 10.0
    evidence_keep: int = 20
    evidence_max_bytes: int = 512 * 1024 * 1024
    process_sample_seconds: float = 0.5
    capture_deadline_seconds: float = 30.0
    nvidia_smi_path: str = "nvidia-smi"
    nvidia_smi_timeout_seconds: float = 5.0
    protected_wedge_bundles: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence_dir", Path(self.evidence_dir))
        for name in ("pyspy_timeout_seconds", "process_sample_seconds", "capture_deadline_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.evidence_keep < 1:
            raise ValueError(f"evidence_keep must be >= 1, got {self.evidence_keep!r}")
        if self.evidence_max_bytes < 1:
            raise ValueError(f"evidence_max_bytes must be >= 1, got {self.evidence_max_bytes!r}")


@dataclass(frozen=True, slots=True)
class CaptureRequest:
    """Who to capture, why, and what the daemon has seen.

    `bundle` names the suspect bundle to complete at `wedged`; without it a `wedged`
    request makes a complete bundle in one call. `verdict_at` is the monotonic instant
    of the verdict, so the result can say how long after it the bundle was complete.
    """

    target: str
    selector: ProcessSelector
    phase: Phase = Phase.MANUAL
    family: str = "manual"
    engine: str | None = None
    model_name: str | None = None
    episode_id: str | None = None
    bundle: Path | None = None
    metrics_body: bytes | None = None
    metrics_error: str | None = None
    history: Sequence[Mapping[str, Any]] = ()
    thresholds: Mapping[str, float] = field(default_factory=dict)
    verdict: Mapping[str, Any] = field(default_factory=dict)
    verdict_at: float | None = None

    def __post_init__(self) -> None:
        # Callers may pass the detector's plain "suspect" / "wedged" strings.
        object.__setattr__(self, "phase", Phase(self.phase))
        if self.bundle is not None:
            object.__setattr__(self, "bundle", Path(self.bundle))


@dataclass(frozen=True, slots=True)
class BundleResult:
    """What a capture produced. `failures` lists every step that did not work, in words."""

    bundle: Path | None
    phase: Phase
    verdict: str
    triage: Triage
    failures: tuple[str, ...] = ()
    ptrace_denied: int = 0
    duration_seconds: float = 0.0
    since_verdict_seconds: float | None = None
    deadline_exceeded: bool = False
    evicted: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """True when every step of the capture succeeded."""
        return self.bundle is not None and not self.failures


@dataclass(frozen=True)
class EvidenceDeps:
    """Everything a capture touches; the daemon builds it once, tests swap parts."""

    settings: EvidenceSettings
    finder: ProcessFinder = field(default_factory=PsutilProcessFinder)
    dumper: StackDumper | None = None
    wall_clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    hostname: str = field(default_factory=socket.gethostname)
    version: str = __version__

    def stack_dumper(self) -> StackDumper:
        """The configured dumper, or py-spy built from the settings."""
        if self.dumper is not None:
            return self.dumper
        s = self.settings
        return PySpyRunner(
            pyspy_path=s.pyspy_path,
            timeout_seconds=s.pyspy_timeout_seconds,
            capture_locals=s.capture_locals,
            clock=self.monotonic,
        )


# --------------------------------------------------------------------------- pure helpers


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


def redact_title(title: str) -> str:
    """A command line with the values of secret-looking flags (`--api-key X`) masked."""
    words = title.split(" ")
    out: list[str] = []
    mask_next = False
    for word in words:
        if mask_next:
            out.append("***")
            mask_next = False
            continue
        match = _SECRET_FLAG.match(word)
        if match and "=" in word:
            out.append(word.split("=", 1)[0] + "=***")
        else:
            out.append(word)
            mask_next = match is not None
    return " ".join(out)


def redact_pyspy_text(text: str) -> str:
    """py-spy's text dump with the command line in its `Process N: ...` header redacted."""
    lines = text.split("\n")
    for index, line in enumerate(lines):
        if line.startswith("Process ") and ": " in line:
            head, _, cmdline = line.partition(": ")
            lines[index] = f"{head}: {redact_title(cmdline)}"
    return "\n".join(lines)


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
    return "".join(
        json.dumps(json_safe(item), sort_keys=True, allow_nan=False) + "\n" for item in history
    ).encode()


def stack_file_stem(process: ServerProcess) -> str:
    """`engine_core-1234`: the file name (without suffix) of a process's dumps."""
    return f"{process.role}-{process.pid}"


# --------------------------------------------------------------------------- retention (pure)


@dataclass(frozen=True, slots=True)
class StoredBundle:
    """A bundle on disk, as retention sees it."""

    name: str
    created_timestamp: float
    size_bytes: int
    wedge: bool


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """Which bundles to delete, and whether the budget still is exceeded after that."""

    evict: tuple[str, ...]
    keep: tuple[str, ...]
    over_budget: bool


def plan_retention(
    bundles: Sequence[StoredBundle],
    keep: int,
    max_bytes: int,
    *,
    protect: Iterable[str] = (),
    protected_wedges: int = 1,
) -> RetentionPlan:
    """Evict until at most `keep` bundles of at most `max_bytes` remain, as far as allowed.

    `protect` names the bundle just written (the trigger); it is never evicted. Routine
    bundles go first, oldest first. Wedge bundles are evicted only when the plan is for a
    wedge bundle (a protected bundle is a wedge bundle), then oldest first, and never the
    newest `protected_wedges` of them: a routine bundle never costs a wedge bundle. What
    cannot be evicted under these rules stays, and `over_budget` says the budget is exceeded.
    """
    newest_first = sorted(bundles, key=lambda b: (b.created_timestamp, b.name), reverse=True)
    protected = set(protect)
    for_wedge = any(b.wedge and b.name in protected for b in bundles)
    protected.update(b.name for b in [b for b in newest_first if b.wedge][:protected_wedges])
    oldest_first = list(reversed(newest_first))
    candidates = [b for b in oldest_first if not b.wedge and b.name not in protected]
    if for_wedge:
        candidates += [b for b in oldest_first if b.wedge and b.name not in protected]
    count = len(bundles)
    total = sum(b.size_bytes for b in bundles)
    evicted: list[str] = []
    for bundle in candidates:
        if count <= keep and total <= max_bytes:
            break
        evicted.append(bundle.name)
        count -= 1
        total -= bundle.size_bytes
    gone = set(evicted)
    kept = tuple(b.name for b in newest_first if b.name not in gone)
    return RetentionPlan(tuple(evicted), kept, count > keep or total > max_bytes)


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
    try:
        summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("verdict") == Phase.WEDGED


def apply_retention(
    settings: EvidenceSettings, protect: Iterable[str] = ()
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Delete the bundles the plan evicts; returns (evicted names, failure messages)."""
    plan = plan_retention(
        scan_bundles(settings.evidence_dir),
        settings.evidence_keep,
        settings.evidence_max_bytes,
        protect=protect,
        protected_wedges=settings.protected_wedge_bundles,
    )
    evicted: list[str] = []
    failures: list[str] = []
    for name in plan.evict:
        path = settings.evidence_dir / name
        if path.is_symlink() or path.parent != settings.evidence_dir:
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
            f" the newest {settings.protected_wedge_bundles})"
        )
    return tuple(evicted), tuple(failures)


# --------------------------------------------------------------------------- private files


def ensure_private_dir(path: Path) -> None:
    """Create a directory 0700 (parents too); an existing one keeps its mode."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, _DIR_MODE)
        os.chmod(path, _DIR_MODE)  # the umask may have taken bits away; set exactly


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


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(json_safe(value), indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


# --------------------------------------------------------------------------- one capture round


@dataclass
class _Round:
    """What one capture round gathered (phase 1 or phase 2), before it is written."""

    phase: Phase
    started_at: float
    started_timestamp: float
    files: dict[str, bytes] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    durations: dict[str, float] = field(default_factory=dict)
    discovery: Discovery | None = None
    dumps: dict[int, StackDump] = field(default_factory=dict)
    stacks: list[dict[str, Any]] = field(default_factory=list)
    stats: tuple[ProcessStats, ...] = ()
    nvidia_smi: dict[str, Any] = field(default_factory=dict)
    deadline_exceeded: bool = False

    @property
    def ptrace_denied(self) -> int:
        return sum(1 for d in self.dumps.values() if d.status is DumpStatus.PERMISSION_DENIED)


def _suffix(phase: Phase, first_round: bool) -> str:
    return "" if first_round else f"_{phase}"


async def _run_command(argv: Sequence[str], timeout_seconds: float) -> tuple[int | None, str, str]:
    """(exit code, -1 if it could not start, None on timeout; stdout; error text)."""
    result = await run_command(
        argv,
        timeout_seconds=timeout_seconds,
        stdout_bytes=NVIDIA_SMI_OUTPUT_BYTES,
        stderr_bytes=NVIDIA_SMI_ERROR_BYTES,
    )
    if result.start_error is not None:
        exc = result.start_error
        return -1, "", f"cannot start {argv[0]}: {exc.strerror or exc}"
    if result.timed_out:
        return None, "", f"{argv[0]} did not finish within {timeout_seconds:g} s; killed"
    return (
        result.returncode,
        result.stdout.decode("utf-8", errors="replace"),
        result.stderr.decode("utf-8", errors="replace"),
    )


async def _nvidia_smi(settings: EvidenceSettings) -> tuple[dict[str, Any], bytes | None]:
    """(summary entry, file contents) for nvidia-smi's utilisation/power query and full output."""
    exe = shutil.which(settings.nvidia_smi_path)
    if exe is None:
        return {"status": "not_found", "message": NVIDIA_SMI_NOT_FOUND}, None
    timeout = settings.nvidia_smi_timeout_seconds
    query, plain = await asyncio.gather(
        _run_command([exe, *NVIDIA_SMI_QUERY], timeout), _run_command([exe], timeout)
    )
    sections: list[str] = []
    errors: list[str] = []
    for title, (code, out, err) in (
        (f"$ nvidia-smi {' '.join(NVIDIA_SMI_QUERY)}", query),
        ("$ nvidia-smi", plain),
    ):
        sections.append(f"{title}\n{out}")
        if code != 0:
            errors.append(f"{title}: " + (err.strip() or f"exit code {code}"))
    entry: dict[str, Any] = {"status": "ok" if not errors else "failed", "path": exe}
    if errors:
        entry["errors"] = errors
    return entry, "\n".join(sections).encode()


async def _sample_processes(
    processes: Sequence[ServerProcess], deps: EvidenceDeps
) -> tuple[ProcessStats, ...]:
    pids = [p.pid for p in processes]
    before = await asyncio.to_thread(read_readings, pids)
    started = deps.monotonic()
    await deps.sleep(deps.settings.process_sample_seconds)
    after = await asyncio.to_thread(read_readings, pids)
    return combine_samples(processes, before, after, deps.monotonic() - started)


def _stack_record(
    process: ServerProcess, dump: StackDump | None, files: Sequence[str], failure: str | None
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "pid": process.pid,
        "role": str(process.role),
        "title": redact_title(process.title),
        "files": list(files),
    }
    if dump is not None:
        record.update(dump.to_json())
    else:
        record.update(status="not_captured", error=failure)
    return record


def _process_stacks(
    discovery: Discovery, dumps: Mapping[int, StackDump], missing: Mapping[int, str]
) -> tuple[ProcessStacks, ...]:
    out: list[ProcessStacks] = []
    for p in discovery.processes:
        dump = dumps.get(p.pid)
        if dump is not None and dump.threads is not None:
            out.append(ProcessStacks(p.pid, p.ppid, p.role, p.title, dump.threads, None, p.status))
        else:
            reason = (
                f"{dump.status}: {dump.error}"
                if dump is not None
                else missing.get(p.pid, "not dumped")
            )
            out.append(ProcessStacks(p.pid, p.ppid, p.role, p.title, None, reason, p.status))
    return tuple(out)


async def _capture_round(
    request: CaptureRequest,
    deps: EvidenceDeps,
    phase: Phase,
    first_round: bool,
    deadline_at: float,
) -> tuple[_Round, StackRound]:
    """Discover, dump, sample and query nvidia-smi under the deadline; nothing raises."""
    rnd = _Round(phase, deps.monotonic(), deps.wall_clock())
    suffix = _suffix(phase, first_round)
    stack_dir = "pyspy" if first_round else f"pyspy/{phase}"

    def remaining() -> float:
        return max(deadline_at - deps.monotonic(), 0.0)

    # Metrics body and flight recorder first: cheap, and they survive anything later.
    metrics_name = f"metrics_{phase}.prom"
    if request.metrics_body is not None:
        rnd.files[metrics_name] = request.metrics_body
    else:
        rnd.failures.append(
            f"{metrics_name}: no /metrics body"
            + (f" ({request.metrics_error})" if request.metrics_error else "")
        )
    if first_round or request.history:
        # At the wedge the daemon's flight recorder is longer: it replaces the suspect one.
        rnd.files["history.jsonl"] = history_lines(request.history)

    started = deps.monotonic()
    try:
        discovery = await asyncio.wait_for(
            asyncio.to_thread(deps.finder.discover, request.selector), remaining()
        )
    except TimeoutError:
        discovery = Discovery(
            request.selector.describe(), None, (), error="process discovery timed out"
        )
        rnd.deadline_exceeded = True
    except Exception as exc:  # a bug in discovery must not cost the rest of the bundle
        discovery = Discovery(
            request.selector.describe(), None, (), error=f"discovery failed: {exc!r}"
        )
    rnd.durations["discovery_seconds"] = deps.monotonic() - started
    rnd.discovery = discovery
    if discovery.error:
        rnd.failures.append(f"processes: {discovery.error}")

    dumper = deps.stack_dumper()
    to_dump = [p for p in discovery.processes if p.role in _DUMPED_ROLES]
    stack_tasks = {p.pid: asyncio.create_task(dumper.dump(p.pid)) for p in to_dump}
    sample_task = asyncio.create_task(_sample_processes(discovery.processes, deps))
    smi_task = asyncio.create_task(_nvidia_smi(deps.settings))
    all_tasks: set[asyncio.Task[Any]] = {*stack_tasks.values(), sample_task, smi_task}
    started = deps.monotonic()
    _done, pending = await asyncio.wait(all_tasks, timeout=remaining())
    if pending:
        rnd.deadline_exceeded = True
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=10.0)
    rnd.durations["stacks_seconds"] = deps.monotonic() - started

    missing: dict[int, str] = {}
    for p in to_dump:
        task = stack_tasks[p.pid]
        stem = stack_file_stem(p)
        files: list[str] = []
        outcome = _task_outcome(task)
        if isinstance(outcome, StackDump):
            rnd.dumps[p.pid] = outcome
            if outcome.json_text is not None:
                files.append(f"{stack_dir}/{stem}.json")
                rnd.files[files[-1]] = outcome.json_text.encode()
            if outcome.text is not None:
                files.append(f"{stack_dir}/{stem}.txt")
                rnd.files[files[-1]] = redact_pyspy_text(outcome.text).encode()
            if outcome.status is not DumpStatus.OK:
                rnd.failures.append(
                    f"py-spy {p.role} {p.pid}: {outcome.status}: {outcome.error}"
                    + (f" (fix: {outcome.fix})" if outcome.fix else "")
                )
            rnd.stacks.append(_stack_record(p, outcome, files, None))
        else:
            missing[p.pid] = outcome
            rnd.failures.append(f"py-spy {p.role} {p.pid}: {outcome}")
            rnd.stacks.append(_stack_record(p, None, files, outcome))
    rnd.durations["pyspy_seconds"] = max(
        (d.duration_seconds for d in rnd.dumps.values()), default=0.0
    )

    sample = _task_outcome(sample_task)
    if isinstance(sample, tuple):
        rnd.stats = sample
    else:
        rnd.failures.append(f"process sample: {sample}")
        rnd.stats = tuple(ProcessStats(p, None, None, sample) for p in discovery.processes)
    rnd.files[f"processes{suffix}.json"] = _json_bytes(
        {
            "discovery": _discovery_json(discovery),
            "sample_seconds": deps.settings.process_sample_seconds,
            "processes": [_stats_json(s) for s in rnd.stats],
        }
    )

    smi = _task_outcome(smi_task)
    if isinstance(smi, tuple):
        entry, text = smi
        rnd.nvidia_smi = entry
        if text is not None:
            rnd.files[f"nvidia-smi{suffix}.txt"] = text
        if entry["status"] == "failed":
            rnd.failures.append("nvidia-smi: " + "; ".join(entry.get("errors", [])))
    else:
        rnd.nvidia_smi = {"status": "failed", "errors": [smi]}
        rnd.failures.append(f"nvidia-smi: {smi}")

    label = str(phase)
    return rnd, StackRound(label, _process_stacks(discovery, rnd.dumps, missing), discovery.error)


def _task_outcome(task: asyncio.Task[Any]) -> Any:
    """The task's result, or a message saying why there is none."""
    if task.cancelled():
        return "cancelled at the capture deadline"
    if not task.done():
        return "still running at the capture deadline"
    exc = task.exception()
    if exc is not None:
        return f"failed: {exc!r}"
    return task.result()


def _discovery_json(discovery: Discovery) -> dict[str, Any]:
    data = discovery.to_json()
    data["processes"] = [
        {**p.to_json(), "title": redact_title(p.title)} for p in discovery.processes
    ]
    return data


def _stats_json(stats: ProcessStats) -> dict[str, Any]:
    data = stats.to_json()
    data["title"] = redact_title(str(data["title"]))
    return data


def _round_summary(rnd: _Round, deps: EvidenceDeps, finished_at: float) -> dict[str, Any]:
    discovery = rnd.discovery
    return {
        "started_timestamp": rnd.started_timestamp,
        "started_at": rnd.started_at,
        "finished_timestamp": deps.wall_clock(),
        "finished_at": finished_at,
        "duration_seconds": round(finished_at - rnd.started_at, 4),
        "durations": {k: round(v, 4) for k, v in rnd.durations.items()},
        "deadline_seconds": deps.settings.capture_deadline_seconds,
        "deadline_exceeded": rnd.deadline_exceeded,
        "discovery": _discovery_json(discovery) if discovery else None,
        "pids": _pids_by_role(discovery),
        "stacks": rnd.stacks,
        "ptrace_denied": rnd.ptrace_denied,
        "nvidia_smi": rnd.nvidia_smi,
        "files": sorted(rnd.files),
        "failures": list(rnd.failures),
    }


def _pids_by_role(discovery: Discovery | None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {str(role): [] for role in Role}
    if discovery is not None:
        for proc in discovery.processes:
            out[str(proc.role)].append(proc.pid)
    return out


# --------------------------------------------------------------------------- the public API


async def open_bundle(request: CaptureRequest, deps: EvidenceDeps) -> BundleResult:
    """Phase 1 (suspect): a new bundle with everything; complete it later with `complete_bundle`."""
    return await _new_bundle(request, deps, Phase.SUSPECT)


async def capture_bundle(request: CaptureRequest, deps: EvidenceDeps) -> BundleResult:
    """The one entry point: open at suspect, complete at wedged (or one-shot), manual captures.

    A `wedged` request with `bundle` set completes that bundle; without it (or when the
    bundle is gone) a complete wedge bundle is written in one call.
    """
    if request.phase is Phase.SUSPECT:
        return await open_bundle(request, deps)
    if request.phase is Phase.WEDGED and request.bundle is not None:
        return await complete_bundle(request.bundle, request, deps)
    return await _new_bundle(request, deps, request.phase)


async def complete_bundle(
    bundle: Path, request: CaptureRequest, deps: EvidenceDeps
) -> BundleResult:
    """Phase 2 (wedged): add the wedge's metrics and a second round of stacks; verdict `wedged`.

    Falls back to a one-shot wedge bundle when `bundle` is missing or not a bundle.
    """
    begun = deps.monotonic()
    summary_path = bundle / "summary.json"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
            raise ValueError("not a wedgewatch evidence summary")
    except (OSError, ValueError) as exc:
        result = await _new_bundle(request, deps, Phase.WEDGED)
        note = f"suspect bundle {bundle} unusable ({exc}); wrote a one-shot wedge bundle"
        return _with_failure(result, note)

    deadline_at = begun + deps.settings.capture_deadline_seconds
    rnd, stack_round = await _capture_round(request, deps, Phase.WEDGED, False, deadline_at)
    first_round = _load_round(bundle, summary)
    rounds = [r for r in (first_round, stack_round) if r is not None]
    verdict = triage(rounds, request.engine)

    failures = list(rnd.failures)
    write_started = deps.monotonic()
    failures.extend(await _write_files(bundle, rnd.files, True, deadline_at, deps))
    rnd.durations["write_seconds"] = deps.monotonic() - write_started
    rnd.failures = failures

    finished_at = deps.monotonic()
    phases = summary.setdefault("phases", {})
    phases[str(Phase.WEDGED)] = _round_summary(rnd, deps, finished_at)
    summary.update(
        verdict=str(Phase.WEDGED),
        family=request.family,
        reason=request.verdict.get("reason", summary.get("reason")),
        verdict_detail=dict(request.verdict),
        thresholds=dict(request.thresholds) or summary.get("thresholds", {}),
        nvidia_smi=rnd.nvidia_smi,
        triage=verdict.to_json(),
        ptrace_denied=sum(
            int(p.get("ptrace_denied", 0)) for p in phases.values() if isinstance(p, dict)
        ),
        updated_timestamp=deps.wall_clock(),
        updated_at=finished_at,
        failures=[*summary.get("failures", []), *failures],
    )
    since_verdict = _since(request, finished_at)
    if since_verdict is not None:
        summary["since_verdict_seconds"] = round(since_verdict, 4)
    failures.extend(await _write_summary(bundle, summary))
    evicted, retention_failures = await _retention(deps, bundle.name)
    return BundleResult(
        bundle=bundle,
        phase=Phase.WEDGED,
        verdict=str(Phase.WEDGED),
        triage=verdict,
        failures=(*failures, *retention_failures),
        ptrace_denied=rnd.ptrace_denied,
        duration_seconds=finished_at - begun,
        since_verdict_seconds=since_verdict,
        deadline_exceeded=rnd.deadline_exceeded,
        evicted=evicted,
    )


def resolve_bundle(bundle: Path, deps: EvidenceDeps, note: str = "episode resolved") -> str | None:
    """Mark a suspect bundle `resolved` (the episode ended without a wedge); an error or None."""
    try:
        summary = json.loads((bundle / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
            return f"{bundle}: not a wedgewatch evidence bundle"
        if summary.get("verdict") == Phase.WEDGED:
            return None
        summary.update(
            verdict="resolved",
            resolution=note,
            resolved_timestamp=deps.wall_clock(),
            resolved_at=deps.monotonic(),
        )
        write_atomic(bundle / "summary.json", _json_bytes(summary))
    except (OSError, ValueError) as exc:
        return f"{bundle}: cannot mark resolved: {exc}"
    return None


async def _new_bundle(request: CaptureRequest, deps: EvidenceDeps, phase: Phase) -> BundleResult:
    begun = deps.monotonic()
    deadline_at = begun + deps.settings.capture_deadline_seconds
    name = bundle_name(deps.wall_clock(), request.target, request.engine, request.family)
    try:
        path = await asyncio.to_thread(make_bundle_dir, deps.settings.evidence_dir, name)
    except OSError as exc:
        message = f"cannot create a bundle in {deps.settings.evidence_dir}: {exc.strerror or exc}"
        return BundleResult(
            bundle=None,
            phase=phase,
            verdict=str(phase),
            triage=Triage(TriageKind.NO_STACKS, "unknown, stacks unavailable: nothing captured"),
            failures=(message,),
            duration_seconds=deps.monotonic() - begun,
        )

    rnd, stack_round = await _capture_round(request, deps, phase, True, deadline_at)
    verdict = triage([stack_round], request.engine)
    failures = list(rnd.failures)
    write_started = deps.monotonic()
    failures.extend(await _write_files(path, rnd.files, False, deadline_at, deps))
    rnd.durations["write_seconds"] = deps.monotonic() - write_started
    rnd.failures = failures

    finished_at = deps.monotonic()
    summary: dict[str, Any] = {
        "schema": SCHEMA,
        "bundle": path.name,
        "wedgewatch_version": deps.version,
        "host": deps.hostname,
        "target": request.target,
        "selector": request.selector.describe(),
        "engine_labels": {"model_name": request.model_name, "engine": request.engine},
        "episode_id": request.episode_id,
        "verdict": str(phase),
        "family": request.family,
        "reason": request.verdict.get("reason"),
        "verdict_detail": dict(request.verdict),
        "thresholds": dict(request.thresholds),
        "verdict_at": request.verdict_at,
        "created_timestamp": rnd.started_timestamp,
        "created_at": rnd.started_at,
        "updated_timestamp": deps.wall_clock(),
        "updated_at": finished_at,
        "capture_locals": deps.settings.capture_locals,
        "pids": _pids_by_role(rnd.discovery),
        "nvidia_smi": rnd.nvidia_smi,
        "triage": verdict.to_json(),
        "ptrace_denied": rnd.ptrace_denied,
        "phases": {str(phase): _round_summary(rnd, deps, finished_at)},
        "failures": failures,
    }
    since_verdict = _since(request, finished_at)
    if since_verdict is not None:
        summary["since_verdict_seconds"] = round(since_verdict, 4)
    failures.extend(await _write_summary(path, summary))
    evicted, retention_failures = await _retention(deps, path.name)
    return BundleResult(
        bundle=path,
        phase=phase,
        verdict=str(phase),
        triage=verdict,
        failures=(*failures, *retention_failures),
        ptrace_denied=rnd.ptrace_denied,
        duration_seconds=finished_at - begun,
        since_verdict_seconds=since_verdict,
        deadline_exceeded=rnd.deadline_exceeded,
        evicted=evicted,
    )


def _since(request: CaptureRequest, finished_at: float) -> float | None:
    return None if request.verdict_at is None else finished_at - request.verdict_at


def _with_failure(result: BundleResult, note: str) -> BundleResult:
    return BundleResult(
        bundle=result.bundle,
        phase=result.phase,
        verdict=result.verdict,
        triage=result.triage,
        failures=(note, *result.failures),
        ptrace_denied=result.ptrace_denied,
        duration_seconds=result.duration_seconds,
        since_verdict_seconds=result.since_verdict_seconds,
        deadline_exceeded=result.deadline_exceeded,
        evicted=result.evicted,
    )


def _write_round_files(bundle: Path, files: Mapping[str, bytes], replace: bool) -> list[str]:
    """Write one round's files under `bundle` (directories 0700, files 0600); failures per file.

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
            if replace:
                write_atomic(path, data)
            else:
                write_private(path, data)
        except OSError as exc:
            failures.append(f"writing {rel}: {exc.strerror or exc}")
    return failures


async def _write_files(
    bundle: Path, files: Mapping[str, bytes], replace: bool, deadline_at: float, deps: EvidenceDeps
) -> list[str]:
    # Writing gets at least a second even past the deadline: the parts are already in memory.
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(_write_round_files, bundle, files, replace),
            max(deadline_at - deps.monotonic(), 1.0),
        )
    except TimeoutError:
        return ["writing files: the disk did not finish before the capture deadline"]


async def _write_summary(bundle: Path, summary: Mapping[str, Any]) -> list[str]:
    try:
        await asyncio.to_thread(write_atomic, bundle / "summary.json", _json_bytes(summary))
    except OSError as exc:
        return [f"writing summary.json: {exc.strerror or exc}"]
    return []


async def _retention(deps: EvidenceDeps, current: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        return await asyncio.to_thread(apply_retention, deps.settings, (current,))
    except OSError as exc:
        return (), (f"retention: {exc.strerror or exc}",)


def _load_round(bundle: Path, summary: Mapping[str, Any]) -> StackRound | None:
    """The first round of stacks, re-read from the bundle (survives a daemon restart)."""
    phases = summary.get("phases")
    if not isinstance(phases, Mapping):
        return None
    for label, phase in phases.items():
        if label == Phase.WEDGED or not isinstance(phase, Mapping):
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
