"""Evidence bundles: one private directory per episode, taken at `suspect`, completed at `wedged`.

Phase 1 (`open_bundle`, at suspect): /metrics body, flight recorder, process tree and CPU
sample, py-spy of the API server, EngineCores and workers (`--nonblocking`: a maybe-healthy
engine is never paused), nvidia-smi, triage, `summary.json`. Phase 2 (`complete_bundle`, at
wedged): the body at the wedge, stacks under `pyspy/wedged/`, a second sample, then a
sampled profile of each EngineCore (`io.profile`, nonblocking, `profile_seconds`), triage
over both rounds, `summary.json` rewritten atomically (verdict `wedged`). A wedge without a
suspect bundle, or `wedgewatch capture`: `capture_bundle` does it all in one call.

Every failure inside a capture is recorded in `summary.json` and in the returned
`BundleResult`, never raised: the restart that follows must not wait on evidence. The
whole capture runs under `capture_deadline_seconds`; steps still running then are
cancelled (py-spy runs are killed and their targets checked for SIGSTOP) and recorded.

Directories are created 0700 and files 0600 regardless of the umask (`io.bundles`).
Retention (`core.retention.plan_retention`, pure) keeps at most `evidence_keep` bundles
under `evidence_max_bytes` by evicting routine bundles (suspect bundles, resolved or still
open, and manual captures) oldest first. Wedge bundles are evicted only to make room for a
newer wedge bundle, oldest first, never the newest `protected_wedge_bundles`; the bundle
just written is never evicted. A routine bundle never costs a wedge bundle, so when wedge
bundles fill the budget the directory runs over by the newest routine bundle. See
docs/evidence.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wedgewatch import __version__
from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.evidence.triage import (
    ProcessStacks,
    StackRound,
    Triage,
    TriageKind,
    triage,
)
from wedgewatch.io.build_capture import capture_build
from wedgewatch.io.bundles import (
    apply_retention,
    bundle_name,
    history_lines,
    json_bytes,
    known_issues_of,
    load_first_round,
    make_bundle_dir,
    stack_file_stem,
    write_bundle_file,
    write_round_files,
)
from wedgewatch.io.nvidia_smi import nvidia_smi
from wedgewatch.io.procs import (
    Discovery,
    ProcessFinder,
    ProcessSelector,
    ProcessStats,
    PsutilProcessFinder,
    ServerProcess,
    combine_samples,
    dump_refusal,
    read_readings,
)
from wedgewatch.io.profile import PySpyProfiler, profile_engines
from wedgewatch.io.pyspy import DumpStatus, PySpyRunner, StackDump, StackDumper
from wedgewatch.io.watchdog_dumps import read_watchdog_dumps
from wedgewatch.vllm.semantics import Role
from wedgewatch.vllm.signals import watchdog_timeouts

SCHEMA = "wedgewatch.evidence/1"
_DUMPED_ROLES = (Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER)


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
    profile_seconds: int = 2  # the wedge-time `py-spy record` of each EngineCore; 0 = none
    profile_rate_hz: int = 50
    watchdog_dump_dir: str = ""  # vLLM's --watchdog-config dump_dir; "" = not read

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
    phase: CapturePhase = CapturePhase.MANUAL
    family: str = str(CapturePhase.MANUAL)  # an on-demand capture has no stall family
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
        # A plain "suspect" / "wedged" string (a saved record, a test) becomes the enum.
        object.__setattr__(self, "phase", CapturePhase(self.phase))
        if self.bundle is not None:
            object.__setattr__(self, "bundle", Path(self.bundle))


@dataclass(frozen=True, slots=True)
class BundleResult:
    """What a capture produced. `failures` lists every step that did not work, in words."""

    bundle: Path | None
    phase: CapturePhase
    verdict: str
    triage: Triage
    failures: tuple[str, ...] = ()
    ptrace_denied: int = 0
    duration_seconds: float = 0.0
    since_verdict_seconds: float | None = None
    deadline_exceeded: bool = False
    evicted: tuple[str, ...] = ()
    known_issues: tuple[str, ...] = ()
    server_gone: bool = False  # no server to capture (crashed, stopped): not a failed capture

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

    def stack_dumper(self, *, gentle: bool = False) -> StackDumper:
        """The configured dumper, or py-spy from the settings; `gentle` never pauses a process."""
        if self.dumper is not None:
            return self.dumper
        s = self.settings
        return PySpyRunner(
            pyspy_path=s.pyspy_path,
            timeout_seconds=s.pyspy_timeout_seconds,
            capture_locals=s.capture_locals,
            nonblocking=gentle,  # implies no --native (py-spy refuses both)
            clock=self.monotonic,
        )


# --------------------------------------------------------------------------- one capture round


@dataclass
class _Round:
    """What one capture round gathered (phase 1 or phase 2), before it is written."""

    phase: CapturePhase
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
    build: dict[str, Any] | None = None
    stacks_skipped: str | None = None  # why no process was dumped: not proven to be vLLM
    profiles: list[dict[str, object]] = field(default_factory=list)

    @property
    def ptrace_denied(self) -> int:
        return sum(1 for d in self.dumps.values() if d.status is DumpStatus.PERMISSION_DENIED)

    @property
    def server_gone(self) -> bool:
        return self.discovery is not None and self.discovery.gone


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
        "title": process.title,
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
        # /proc read at the dump is fresher than discovery's (a SIGSTOP pending shows there)
        state = dump.process_state if dump is not None else None
        status = state.word if state is not None else p.status
        note = dump.why if dump is not None else None
        if dump is not None and dump.threads is not None:
            out.append(
                ProcessStacks(p.pid, p.ppid, p.role, p.title, dump.threads, None, status, note)
            )
        else:
            reason = (
                f"{note + '; ' if note else ''}py-spy {dump.status}: {dump.error}"
                if dump is not None
                else missing.get(p.pid, "not dumped")
            )
            out.append(ProcessStacks(p.pid, p.ppid, p.role, p.title, None, reason, status, note))
    return tuple(out)


async def _capture_round(
    request: CaptureRequest,
    deps: EvidenceDeps,
    phase: CapturePhase,
    first_round: bool,
    deadline_at: float,
) -> tuple[_Round, StackRound]:
    """Discover, dump, sample and query nvidia-smi under the deadline; nothing raises."""
    rnd = _Round(phase, deps.monotonic(), deps.wall_clock())
    suffix = "" if first_round else f"_{phase}"
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

    discovery = await _discover(request, deps, rnd, remaining())

    dumper = deps.stack_dumper(gentle=phase is CapturePhase.SUSPECT)
    to_dump = [p for p in discovery.processes if p.role in _DUMPED_ROLES]
    refusal = dump_refusal(discovery)
    if refusal is not None:  # never py-spy (ptrace, as root) a process not proven the server
        to_dump, rnd.stacks_skipped = [], refusal
        rnd.failures.append(f"stacks skipped: {rnd.stacks_skipped}")
    stack_tasks = {p.pid: asyncio.create_task(dumper.dump(p.pid)) for p in to_dump}
    sample_task = asyncio.create_task(_sample_processes(discovery.processes, deps))
    smi_task = asyncio.create_task(
        nvidia_smi(deps.settings.nvidia_smi_path, deps.settings.nvidia_smi_timeout_seconds)
    )
    all_tasks: set[asyncio.Task[Any]] = {*stack_tasks.values(), sample_task, smi_task}
    build_task: asyncio.Task[dict[str, Any]] | None = None
    if first_round:  # the vLLM build: /version, `vllm serve` flags, the engine's environment
        build_task = asyncio.create_task(
            capture_build(request.selector.url, discovery, request.metrics_body)
        )
        all_tasks.add(build_task)
    started = deps.monotonic()
    _done, pending = await asyncio.wait(all_tasks, timeout=remaining())
    if pending:
        rnd.deadline_exceeded = True
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=10.0)
    rnd.durations["stacks_seconds"] = deps.monotonic() - started

    missing = _record_stacks(rnd, to_dump, stack_tasks, stack_dir)
    if build_task is not None:
        build = _task_outcome(build_task)
        rnd.build = build if isinstance(build, dict) else {"error": str(build)}
        rnd.files["build.json"] = json_bytes(rnd.build)
    _record_sample(rnd, discovery, _task_outcome(sample_task), suffix, deps)
    _record_nvidia_smi(rnd, _task_outcome(smi_task), suffix)

    label, s = str(phase), deps.settings
    if refusal is not None:
        return rnd, StackRound(label, (), f"stacks skipped: {rnd.stacks_skipped}")
    # The EngineCores of the tree just proven the server's, sampled at the wedge only.
    profiled = discovery.pids(Role.ENGINE_CORE) if phase is CapturePhase.WEDGED else ()
    profiler = PySpyProfiler(
        s.pyspy_path, s.profile_seconds, s.profile_rate_hz, s.pyspy_timeout_seconds
    )
    taken = await profile_engines(profiled, profiler, remaining())
    rnd.files.update(taken.files)
    rnd.failures.extend(taken.failures)
    rnd.profiles, rnd.durations["profile_seconds"] = taken.records, taken.seconds
    stacks = _process_stacks(discovery, rnd.dumps, missing)
    return rnd, StackRound(label, stacks, discovery.error, taken.profiles)


async def _discover(
    request: CaptureRequest, deps: EvidenceDeps, rnd: _Round, within: float
) -> Discovery:
    """The server's process tree, found within `within` seconds; a failure is a Discovery."""
    started = deps.monotonic()
    try:
        discovery = await asyncio.wait_for(
            asyncio.to_thread(deps.finder.discover, request.selector), within
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
    return discovery


def _record_stacks(
    rnd: _Round,
    dumped: list[ServerProcess],
    tasks: Mapping[int, asyncio.Task[StackDump]],
    stack_dir: str,
) -> dict[int, str]:
    """Each dump's files, record and failure into `rnd`; the pids with no dump, and why."""
    missing: dict[int, str] = {}
    for p in dumped:
        stem = stack_file_stem(p)
        files: list[str] = []
        outcome = _task_outcome(tasks[p.pid])
        if isinstance(outcome, StackDump):
            rnd.dumps[p.pid] = outcome
            if outcome.json_text is not None:
                files.append(f"{stack_dir}/{stem}.json")
                rnd.files[files[-1]] = outcome.json_text.encode()
            if outcome.text is not None:
                files.append(f"{stack_dir}/{stem}.txt")
                rnd.files[files[-1]] = outcome.text.encode()
            if outcome.status is not DumpStatus.OK:
                rnd.failures.append(
                    f"py-spy {p.role} {p.pid}: "
                    + (f"{outcome.why}; py-spy " if outcome.why else "")
                    + f"{outcome.status}: {outcome.error}"
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
    return missing


def _record_sample(
    rnd: _Round, discovery: Discovery, sample: Any, suffix: str, deps: EvidenceDeps
) -> None:
    """The processes' CPU/memory sample (or why there is none) into `rnd`."""
    if isinstance(sample, tuple):
        rnd.stats = sample
    else:
        rnd.failures.append(f"process sample: {sample}")
        rnd.stats = tuple(ProcessStats(p, None, None, sample) for p in discovery.processes)
    rnd.files[f"processes{suffix}.json"] = json_bytes(
        {
            "discovery": discovery.to_json(),
            "sample_seconds": deps.settings.process_sample_seconds,
            "processes": [s.to_json() for s in rnd.stats],
        }
    )


def _record_nvidia_smi(rnd: _Round, smi: Any, suffix: str) -> None:
    """nvidia-smi's answer (or why there is none) into `rnd`."""
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
        "discovery": discovery.to_json() if discovery else None,
        "pids": _pids_by_role(discovery),
        "stacks": rnd.stacks,
        "stacks_skipped": rnd.stacks_skipped,
        "profiles": rnd.profiles,
        "pyspy_mode": "nonblocking" if rnd.phase is CapturePhase.SUSPECT else "blocking",
        "ptrace_denied": rnd.ptrace_denied,
        "server_gone": rnd.server_gone,
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
    return await _new_bundle(request, deps, CapturePhase.SUSPECT)


async def capture_bundle(request: CaptureRequest, deps: EvidenceDeps) -> BundleResult:
    """The one entry point: open at suspect, complete at wedged (or one-shot), manual captures.

    A `wedged` request with `bundle` set completes that bundle; without it (or when the
    bundle is gone) a complete wedge bundle is written in one call.
    """
    if request.phase is CapturePhase.SUSPECT:
        return await open_bundle(request, deps)
    if request.phase is CapturePhase.WEDGED and request.bundle is not None:
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
        result = await _new_bundle(request, deps, CapturePhase.WEDGED)
        note = f"suspect bundle {bundle} unusable ({exc}); wrote a one-shot wedge bundle"
        return dataclasses.replace(result, failures=(note, *result.failures))

    deadline_at = begun + deps.settings.capture_deadline_seconds
    rnd, stack_round = await _take_round(bundle, request, deps, CapturePhase.WEDGED, deadline_at)
    first_round = load_first_round(bundle, summary)
    rounds = [r for r in (first_round, stack_round) if r is not None]
    verdict = triage(rounds, request.engine)
    failures = rnd.failures
    finished_at = deps.monotonic()
    phases = summary.setdefault("phases", {})
    phases[str(CapturePhase.WEDGED)] = _round_summary(rnd, deps, finished_at)
    summary.update(
        verdict=str(CapturePhase.WEDGED),
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
    if request.verdict_at is not None:  # the wedge's verdict, not the suspect's that opened it
        summary["verdict_at"] = request.verdict_at
    summary["verdict_timestamp"] = _verdict_timestamp(request, deps)
    return await _finish(
        bundle,
        summary,
        request=request,
        deps=deps,
        rnd=rnd,
        rounds=rounds,
        verdict=verdict,
        begun=begun,
        finished_at=finished_at,
    )


def resolve_bundle(bundle: Path, deps: EvidenceDeps, note: str = "episode resolved") -> str | None:
    """Mark a suspect bundle `resolved` (the episode ended without a wedge); an error or None."""

    def resolved(summary: dict[str, Any]) -> None:
        summary.update(
            verdict="resolved",
            resolution=note,
            resolved_timestamp=deps.wall_clock(),
            resolved_at=deps.monotonic(),
        )

    return _update_suspect_summary(bundle, resolved, "cannot mark resolved")


def mark_cut_off(bundle: Path, deps: EvidenceDeps, detail: str) -> str | None:
    """Record a wedged round cut off at its time limit: verdict `wedged`, the failure kept.

    The bundle is final then (no round follows), so `on_bundle` ships a summary that says
    what the episode was. An error or None.
    """

    def cut_off(summary: dict[str, Any]) -> None:
        phases = summary.setdefault("phases", {})
        phases[str(CapturePhase.WEDGED)] = {"failures": [detail], "cut_off": True}
        summary.update(
            verdict=str(CapturePhase.WEDGED),
            failures=[*summary.get("failures", []), detail],
            updated_timestamp=deps.wall_clock(),
            updated_at=deps.monotonic(),
        )

    return _update_suspect_summary(bundle, cut_off, "cannot record the cut-off wedged round")


def _update_suspect_summary(
    bundle: Path, change: Callable[[dict[str, Any]], None], failure: str
) -> str | None:
    """Apply `change` to the summary of a bundle not yet wedged and write it back.

    A bundle whose verdict is already `wedged` is left as it is. An error or None."""
    try:
        summary = json.loads((bundle / "summary.json").read_text(encoding="utf-8"))
        if not isinstance(summary, dict) or summary.get("schema") != SCHEMA:
            return f"{bundle}: not a wedgewatch evidence bundle"
        if summary.get("verdict") == CapturePhase.WEDGED:
            return None
        change(summary)
        write_bundle_file(bundle, "summary.json", json_bytes(summary))
    except (OSError, ValueError) as exc:
        return f"{bundle}: {failure}: {exc}"
    return None


async def _new_bundle(
    request: CaptureRequest, deps: EvidenceDeps, phase: CapturePhase
) -> BundleResult:
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

    rnd, stack_round = await _take_round(path, request, deps, phase, deadline_at, first=True)
    verdict = triage([stack_round], request.engine)
    failures = rnd.failures
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
        "verdict_timestamp": _verdict_timestamp(request, deps),
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
    version = (rnd.build or {}).get("version", {})
    summary["vllm_version"] = version.get("version") if isinstance(version, dict) else None
    return await _finish(
        path,
        summary,
        request=request,
        deps=deps,
        rnd=rnd,
        rounds=[stack_round],
        verdict=verdict,
        begun=begun,
        finished_at=finished_at,
    )


async def _take_round(
    bundle: Path,
    request: CaptureRequest,
    deps: EvidenceDeps,
    phase: CapturePhase,
    deadline_at: float,
    *,
    first: bool = False,
) -> tuple[_Round, StackRound]:
    """One capture round, its files written into `bundle` (a later round may overwrite)."""
    rnd, stack_round = await _capture_round(request, deps, phase, first, deadline_at)
    write_started = deps.monotonic()
    rnd.failures.extend(await _write_files(bundle, rnd.files, not first, deadline_at, deps))
    rnd.durations["write_seconds"] = deps.monotonic() - write_started
    return rnd, stack_round


async def _finish(
    bundle: Path,
    summary: dict[str, Any],
    *,
    request: CaptureRequest,
    deps: EvidenceDeps,
    rnd: _Round,
    rounds: Sequence[StackRound],
    verdict: Triage,
    begun: float,
    finished_at: float,
) -> BundleResult:
    """The summary completed (time since the verdict, known issues) and written, retention
    applied, and the result of the capture: the one ending of every capture."""
    failures = rnd.failures
    since_verdict = _since(request, finished_at)
    if since_verdict is not None:
        summary["since_verdict_seconds"] = round(since_verdict, 4)
    watchdog = await asyncio.to_thread(read_watchdog_dumps, deps.settings.watchdog_dump_dir)
    timeouts = watchdog_timeouts(request.metrics_body) if request.metrics_body else {}
    if watchdog.summary or timeouts:
        summary["watchdog"] = {**watchdog.summary, "timeouts_total": timeouts or None}
        failures.extend(await asyncio.to_thread(write_round_files, bundle, watchdog.files, True))
    matched = [*rounds, watchdog.round] if watchdog.round is not None else rounds
    summary["known_issues"] = await asyncio.to_thread(known_issues_of, bundle, summary, matched)
    failures.extend(await _write_summary(bundle, summary))
    evicted, retention_failures = await _retention(deps, bundle.name)
    phase = CapturePhase(summary["verdict"])
    return BundleResult(
        bundle=bundle,
        phase=phase,
        verdict=str(phase),
        triage=verdict,
        failures=(*failures, *retention_failures),
        ptrace_denied=rnd.ptrace_denied,
        duration_seconds=finished_at - begun,
        since_verdict_seconds=since_verdict,
        deadline_exceeded=rnd.deadline_exceeded,
        evicted=evicted,
        known_issues=tuple(str(m.get("id")) for m in summary["known_issues"]),
        server_gone=rnd.server_gone,
    )


def _verdict_timestamp(request: CaptureRequest, deps: EvidenceDeps) -> float | None:
    """The verdict's wall-clock instant: the daemon's stamp, else from `verdict_at`."""
    stamped = request.verdict.get("verdict_timestamp")
    if isinstance(stamped, int | float) and not isinstance(stamped, bool):
        return float(stamped)
    if request.verdict_at is None:
        return None
    return deps.wall_clock() - (deps.monotonic() - request.verdict_at)


def _since(request: CaptureRequest, finished_at: float) -> float | None:
    return None if request.verdict_at is None else finished_at - request.verdict_at


async def _write_files(
    bundle: Path, files: Mapping[str, bytes], replace: bool, deadline_at: float, deps: EvidenceDeps
) -> list[str]:
    # Writing gets at least a second even past the deadline: the parts are already in memory.
    try:
        return await asyncio.wait_for(
            asyncio.to_thread(write_round_files, bundle, files, replace),
            max(deadline_at - deps.monotonic(), 1.0),
        )
    except TimeoutError:
        return ["writing files: the disk did not finish before the capture deadline"]


async def _write_summary(bundle: Path, summary: Mapping[str, Any]) -> list[str]:
    try:
        await asyncio.to_thread(write_bundle_file, bundle, "summary.json", json_bytes(summary))
    except OSError as exc:
        return [f"writing summary.json: {exc.strerror or exc}"]
    return []


async def _retention(deps: EvidenceDeps, current: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    try:
        settings = deps.settings
        return await asyncio.to_thread(
            functools.partial(
                apply_retention,
                settings.evidence_dir,
                settings.evidence_keep,
                settings.evidence_max_bytes,
                protect=(current,),
                protected_wedges=settings.protected_wedge_bundles,
            )
        )
    except OSError as exc:
        return (), (f"retention: {exc.strerror or exc}",)
