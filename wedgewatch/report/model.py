"""An evidence bundle read into one model for the report renderers.

`load_files` reads the bundle's files (each bounded in size; a file that cannot be read
is an error string). `build_model` is pure: it turns those files into a `BundleModel`
with the timeline, the vLLM build, the stacks of every process and round, the facts
known-issue signatures use and the matches. Every file that is missing or does not parse
adds a line to `problems`, and the rest of the report still renders.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wedgewatch.core.detection.states import STALLED, CapturePhase, EngineState
from wedgewatch.core.evidence.bundle_facts import bundle_facts, engine_entry, seen_frames
from wedgewatch.core.evidence.known_issues import (
    Facts,
    KnownIssue,
    Match,
    match_known_issues,
    shipped_known_issues,
)
from wedgewatch.core.evidence.triage import (
    _ENGINE_ANCHORS,
    _WORKER_ANCHORS,
    ProcessStacks,
    Thread,
    _main_thread,
    _python_frames,
    parse_pyspy_json,
)
from wedgewatch.core.evidence.watchdog import (
    StackDumpRecord,
    parse_dump_name,
    parse_dump_text,
)
from wedgewatch.core.values import immutable
from wedgewatch.io.bundles import (
    UntrustedRead,
    bundle_bytes,
    list_untrusted,
    read_untrusted,
    scan_bundles,
)
from wedgewatch.vllm.build_info import cache_config_labels
from wedgewatch.vllm.semantics import Role

MAX_FILE_BYTES = 32 * 1024 * 1024
_TOP_FILES = (
    "summary.json",
    "history.jsonl",
    "build.json",
    "remedy.jsonl",
    "processes.json",
    "processes_wedged.json",
    "metrics_suspect.prom",
    "metrics_wedged.prom",
    "metrics_manual.prom",
)
_HIGHLIGHT_DEPTH = 4


@immutable
class Point:
    """One flight-recorder reading of the engine, `t` seconds relative to the wedge."""

    t: float
    state: str
    running: float | None = None
    capacity: float | None = None
    deferred: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    generation_rate: float | None = None
    prompt_rate: float | None = None
    failure: str | None = None


@immutable
class StackView:
    """One process's stacks in one round: threads (or why none), text dump, highlighted frames."""

    round: str
    role: str
    pid: int
    title: str
    threads: tuple[Thread, ...] | None
    text: str | None
    problem: str | None
    highlighted: frozenset[tuple[int, int]] = frozenset()  # (thread index, frame index)
    state: str | None = None  # why it could not be dumped normally (/proc: stopped, zombie, ...)


@immutable
class WatchdogView:
    """One of vLLM's own watchdog dump files the bundle carries (`watchdog/`), read."""

    file: str
    name: str
    role: str
    pid: int
    dumps: tuple[StackDumpRecord, ...]

    @property
    def last(self) -> StackDumpRecord | None:
        """The newest dump in the file (the one the report shows)."""
        return self.dumps[-1] if self.dumps else None


@dataclass(frozen=True)
class BundleModel:
    """Everything the report shows about one bundle."""

    name: str
    path: str
    summary: Mapping[str, Any]
    problems: tuple[str, ...]
    points: tuple[Point, ...]
    marks: tuple[tuple[float, str], ...]
    build: Mapping[str, Any]
    processes: tuple[Mapping[str, Any], ...]
    stacks: tuple[StackView, ...]
    remedy: tuple[Mapping[str, Any], ...]
    facts: Facts
    matches: tuple[Match, ...]
    metrics_files: tuple[str, ...] = ()
    files: Mapping[str, int] = field(default_factory=dict)
    watchdog: tuple[WatchdogView, ...] = ()

    @property
    def watchdog_timeouts(self) -> Mapping[str, Any]:
        """`vllm:watchdog_timeouts_total` by label set, as the capture read it ({} if none)."""
        section = self.summary.get("watchdog")
        value = section.get("timeouts_total") if isinstance(section, Mapping) else None
        return value if isinstance(value, Mapping) else {}

    # -- summary fields, with safe defaults ------------------------------------------------
    def text(self, key: str, default: str = "?") -> str:
        """A summary value as text (`default` when missing)."""
        value = self.summary.get(key)
        return default if value is None else str(value)

    @property
    def engine(self) -> str:
        """The engine label of the episode."""
        labels = self.summary.get("engine_labels")
        if isinstance(labels, Mapping) and labels.get("engine") is not None:
            return str(labels["engine"])
        return "?"

    @property
    def model_name(self) -> str:
        """The served model name of the episode's engine."""
        labels = self.summary.get("engine_labels")
        if isinstance(labels, Mapping) and labels.get("model_name") is not None:
            return str(labels["model_name"])
        return str(self.build.get("model") or "?")

    @property
    def triage(self) -> Mapping[str, Any]:
        """`{kind, summary, details}` (empty when the summary has none)."""
        value = self.summary.get("triage")
        return value if isinstance(value, Mapping) else {}

    @property
    def thresholds(self) -> Mapping[str, Any]:
        """wedgewatch's thresholds at the verdict."""
        value = self.summary.get("thresholds")
        detail = self.summary.get("verdict_detail")
        if (not value) and isinstance(detail, Mapping):
            value = detail.get("thresholds")
        return value if isinstance(value, Mapping) else {}

    @property
    def version(self) -> str | None:
        """The vLLM version `GET /version` reported at capture."""
        v = self.build.get("version")
        if isinstance(v, Mapping) and isinstance(v.get("version"), str):
            return str(v["version"])
        summary_version = self.summary.get("vllm_version")
        return str(summary_version) if summary_version else None

    @property
    def verdict_timestamp(self) -> float | None:
        """When the verdict was reached (wall clock): the wedge's, not when the bundle was opened
        at suspect; older bundles without it fall back to the capture's start."""
        detail = self.summary.get("verdict_detail")
        candidates = [
            self.summary.get("verdict_timestamp"),
            detail.get("verdict_timestamp") if isinstance(detail, Mapping) else None,
            self.summary.get("created_timestamp"),
        ]
        return next((n for n in map(_num, candidates) if n is not None), None)

    @property
    def stalled_seconds(self) -> float | None:
        """How long the engine had made no progress at the verdict."""
        detail = self.summary.get("verdict_detail")
        if isinstance(detail, Mapping):
            value = detail.get("stalled_seconds")
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
        return None


# --------------------------------------------------------------------------- reading files


def load_files(path: Path, names: Sequence[str] | None = None) -> dict[str, bytes | str]:
    """The bundle's files by relative name: bytes, or why the file could not be read.

    A bundle is untrusted input: no symlink below it is followed, only regular
    files are read, each at most `MAX_FILE_BYTES` (`io.bundles.read_untrusted`), and what is
    read is redacted again (`io.bundles.bundle_bytes`, the writer's own pass), so a bundle
    written by an older wedgewatch, or edited by hand, leaks no secret into a report.
    """
    files: dict[str, bytes | str] = {}
    if names is None:
        names = [*_TOP_FILES]
        names += [n for n in list_untrusted(path, "pyspy") if n.endswith((".json", ".txt"))]
        names += [n for n in list_untrusted(path, "watchdog") if n.endswith(".log")]
    for rel in names:
        try:
            files[rel] = bundle_bytes(rel, read_untrusted(path, rel, MAX_FILE_BYTES))
        except FileNotFoundError:
            continue
        except UntrustedRead as exc:
            files[rel] = str(exc)
        except OSError as exc:
            files[rel] = f"cannot read: {exc.strerror or exc}"
    return files


def read_bundle(
    path: Path,
    issues: Sequence[KnownIssue] | None = None,
    summary: Mapping[str, Any] | None = None,
) -> BundleModel:
    """Read a bundle directory into a model (`summary` overrides the file, for the capture)."""
    files = load_files(path)
    if summary is not None:
        files["summary.json"] = bundle_bytes(
            "summary.json", json.dumps(summary, default=str).encode()
        )
    if not path.is_dir():
        files = {}
    model = build_model(path.name, str(path), files, issues)
    if not path.is_dir():
        return _with_problem(model, f"{path} is not a directory")
    return model


def _with_problem(model: BundleModel, problem: str) -> BundleModel:
    return replace(model, problems=(problem, *model.problems))


# --------------------------------------------------------------------------- building


def _json(files: Mapping[str, bytes | str], name: str, problems: list[str]) -> Any:
    raw = files.get(name)
    if raw is None:
        return None
    if isinstance(raw, str):
        problems.append(f"{name}: {raw}")
        return None
    try:
        return json.loads(raw)
    except ValueError as exc:
        problems.append(f"{name}: corrupt, not JSON ({exc})")
        return None


def _jsonl(
    files: Mapping[str, bytes | str], name: str, problems: list[str]
) -> list[dict[str, Any]]:
    raw = files.get(name)
    if raw is None:
        return []
    if isinstance(raw, str):
        problems.append(f"{name}: {raw}")
        return []
    out: list[dict[str, Any]] = []
    bad = 0
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(item, dict):
            out.append(item)
        else:
            bad += 1
    if bad:
        problems.append(f"{name}: {bad} corrupt line(s) skipped")
    return out


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def timeline(
    history: Sequence[Mapping[str, Any]], engine: str, wedge_at: float | None
) -> tuple[tuple[Point, ...], tuple[tuple[float, str], ...]]:
    """Points relative to the wedge (or the last reading) and the suspect/wedged marks."""
    stamped = [(h, _num(h.get("timestamp"))) for h in history]
    stamped_ok = [(h, t) for h, t in stamped if t is not None]
    if not stamped_ok:
        return (), ()
    origin = wedge_at if wedge_at is not None else stamped_ok[-1][1]
    points: list[Point] = []
    previous: tuple[float, float | None, float | None] | None = None
    marks: list[tuple[float, str]] = []
    last_state = None
    for entry, t in stamped_ok:
        item = engine_entry(entry, engine)
        failure = entry.get("failure")
        failure_text = None
        if isinstance(failure, Mapping):
            failure_text = f"{failure.get('reason')}: {failure.get('detail')}"
        state = str((item or {}).get("state") or entry.get("state") or "?")
        if state != last_state and state in STALLED:
            marks.append((t - origin, state))
        last_state = state
        if item is None or "running" not in item:
            points.append(Point(t - origin, state, failure=failure_text))
            continue
        reasons = item.get("waiting_by_reason")
        by_reason = reasons if isinstance(reasons, Mapping) else {}
        gen, prompt = _num(item.get("generation_tokens")), _num(item.get("prompt_tokens"))
        gen_rate = prompt_rate = None
        if previous is not None and t > previous[0]:
            dt = t - previous[0]
            if gen is not None and previous[1] is not None:
                gen_rate = max(gen - previous[1], 0.0) / dt
            if prompt is not None and previous[2] is not None:
                prompt_rate = max(prompt - previous[2], 0.0) / dt
        previous = (t, gen, prompt)
        points.append(
            Point(
                t - origin,
                state,
                running=_num(item.get("running")),
                capacity=_num(by_reason.get("capacity")),
                deferred=_num(by_reason.get("deferred")),
                waiting=_num(item.get("waiting")),
                kv_cache_usage=_num(item.get("kv_cache_usage")),
                generation_rate=gen_rate,
                prompt_rate=prompt_rate,
                failure=failure_text,
            )
        )
    return tuple(points), tuple(marks)


def _highlight(view_threads: tuple[Thread, ...], role: str, pid: int) -> frozenset[tuple[int, int]]:
    anchors = {
        str(Role.ENGINE_CORE): _ENGINE_ANCHORS,
        str(Role.WORKER): _WORKER_ANCHORS,
    }.get(role, frozenset())
    stacks = ProcessStacks(pid, 0, Role(role), "", view_threads)
    main = _main_thread(stacks, anchors)
    if main is None:
        return frozenset()
    index = view_threads.index(main)
    python = _python_frames(main)[:_HIGHLIGHT_DEPTH] or main.frames[:_HIGHLIGHT_DEPTH]
    wanted = {id(f) for f in python}
    return frozenset((index, i) for i, f in enumerate(main.frames) if id(f) in wanted)


def _state_text(record: Mapping[str, Any]) -> str | None:
    """The process's state in words (the dump's `why`) and its kernel stack, if recorded."""
    why = record.get("why")
    if not isinstance(why, str) or not why:
        return None
    state = record.get("process_state")
    stack = state.get("kernel_stack") if isinstance(state, Mapping) else None
    if isinstance(stack, list) and stack:
        why += "; kernel stack: " + " < ".join(str(f) for f in stack[:8])
    return why


def _stacks(
    summary: Mapping[str, Any], files: Mapping[str, bytes | str], problems: list[str]
) -> tuple[StackView, ...]:
    phases = summary.get("phases")
    views: list[StackView] = []
    if not isinstance(phases, Mapping):
        return ()
    for label, phase in phases.items():
        if not isinstance(phase, Mapping):
            continue
        for record in phase.get("stacks") or []:
            if not isinstance(record, Mapping):
                continue
            try:
                pid = int(record.get("pid", 0))
            except (TypeError, ValueError):
                continue
            role = str(record.get("role", "other"))
            if role not in {str(r) for r in Role}:
                role = str(Role.OTHER)
            title = str(record.get("title", ""))
            threads: tuple[Thread, ...] | None = None
            text: str | None = None
            problem: str | None = None
            if record.get("status") not in (None, "ok"):
                problem = f"py-spy {record.get('status')}: {record.get('error')}"
            state = _state_text(record)
            for listed in record.get("files") or []:
                rel = str(listed)
                raw = files.get(rel)
                if raw is None:
                    problems.append(f"{rel}: missing (listed in summary.json)")
                    problem = problem or f"{rel} is missing"
                    continue
                if isinstance(raw, str):
                    problems.append(f"{rel}: {raw}")
                    problem = problem or f"{rel}: {raw}"
                    continue
                if rel.endswith(".txt"):
                    text = raw.decode("utf-8", errors="replace")
                    continue
                try:
                    parsed = parse_pyspy_json(json.loads(raw))
                except ValueError as exc:
                    parsed = f"corrupt, not JSON ({exc})"
                if isinstance(parsed, str):
                    problems.append(f"{rel}: {parsed}")
                    problem = problem or f"{rel}: {parsed}"
                else:
                    threads = parsed
            highlighted = _highlight(threads, role, pid) if threads else frozenset()
            views.append(
                StackView(str(label), role, pid, title, threads, text, problem, highlighted, state)
            )
    order = {str(Role.API_SERVER): 0, str(Role.ENGINE_CORE): 1, str(Role.WORKER): 2}
    return tuple(
        sorted(views, key=lambda v: (v.round != CapturePhase.SUSPECT, order.get(v.role, 3), v.pid))
    )


def build_model(
    name: str,
    path: str,
    files: Mapping[str, bytes | str],
    issues: Sequence[KnownIssue] | None = None,
) -> BundleModel:
    """A model of a bundle from its files (pure); problems say what is missing or corrupt."""
    problems: list[str] = []
    summary = _json(files, "summary.json", problems)
    if summary is None and "summary.json" not in files:
        problems.append("summary.json: missing (verdict, triage and stacks index unknown)")
    if summary is not None and not isinstance(summary, dict):
        problems.append("summary.json: corrupt, not a JSON object")
        summary = None
    summary = summary or {}
    history = _jsonl(files, "history.jsonl", problems)
    if "history.jsonl" not in files:
        problems.append("history.jsonl: missing (no timeline)")
    build = _json(files, "build.json", problems)
    if build is None and "build.json" not in files:
        problems.append("build.json: missing (vLLM version, flags and environment unknown)")
    build = build if isinstance(build, dict) else {}
    remedy = tuple(_jsonl(files, "remedy.jsonl", problems))
    processes: list[Mapping[str, Any]] = []
    for proc_file in ("processes.json", "processes_wedged.json"):
        data = _json(files, proc_file, problems)
        if isinstance(data, Mapping):
            for p in data.get("processes") or []:
                if isinstance(p, Mapping):
                    processes.append({**p, "round": proc_file})
    if "processes.json" not in files:
        problems.append("processes.json: missing (no process tree)")
    metrics_files = tuple(sorted(n for n in files if n.endswith(".prom")))
    for name_ in metrics_files:
        error = files[name_]
        if isinstance(error, str):
            problems.append(f"{name_}: {error}")
    cache_config = build.get("cache_config_info")
    if not isinstance(cache_config, Mapping):
        cache_config = {}
        for name_ in metrics_files:
            raw = files[name_]
            if isinstance(raw, bytes):
                cache_config = cache_config_labels(raw.decode("utf-8", errors="replace"))
                if cache_config:
                    break
    build = {**build, "cache_config_info": dict(cache_config)} if cache_config else build

    engine_labels = summary.get("engine_labels")
    engine = "0"
    if isinstance(engine_labels, Mapping) and engine_labels.get("engine") is not None:
        engine = str(engine_labels["engine"])
    wedge_at = _wedge_at(summary, history)
    points, marks = timeline(history, engine, wedge_at)
    origin = wedge_at if wedge_at is not None else None
    for event in remedy:
        if event.get("event") == "abort_requested":
            continue  # the abort's result below marks the timeline
        at = _event_at(event, origin) if origin is not None else None
        if at is not None and origin is not None:
            label = (
                str(event.get("event"))
                if event.get("event") in ("restart", "abort")
                else {"restarted": "back", "recovered": "recovered"}.get(
                    str(event.get("outcome")), "episode ended"
                )
            )
            marks = (*marks, (at - origin, label))

    stacks = _stacks(summary, files, problems)
    watchdog = _watchdog(files)
    workers = {v.pid for v in stacks if v.role == str(Role.WORKER)}
    frames = seen_frames(
        [(v.round, v.role, v.pid, v.threads) for v in stacks]
        + [("watchdog", w.role, w.pid, w.last.threads) for w in watchdog if w.last]
    )
    facts = bundle_facts(
        summary, build, history, frames, workers=len(workers), cache_config=cache_config
    )
    known = shipped_known_issues() if issues is None else issues
    matches = match_known_issues(known, facts)
    sizes = {k: (len(v) if isinstance(v, bytes) else -1) for k, v in files.items()}
    return BundleModel(
        name=name,
        path=path,
        summary=summary,
        problems=tuple(problems),
        points=points,
        marks=marks,
        build=build,
        processes=tuple(processes),
        stacks=stacks,
        remedy=remedy,
        facts=facts,
        matches=matches,
        metrics_files=metrics_files,
        files=sizes,
        watchdog=watchdog,
    )


def _fix_note(match: Mapping[str, Any]) -> str:
    """` (fixed in 0.31.0)`, ` (fix not released)` or ` (no fix known)` for `bundles`."""
    if match.get("fixed_in"):
        return f" (fixed in {match['fixed_in']})"
    if match.get("checked_through"):
        return " (fix not released)"
    return " (no fix known)"


def _watchdog(files: Mapping[str, bytes | str]) -> tuple[WatchdogView, ...]:
    """vLLM's watchdog dump files in the bundle (`watchdog/VLLM_STACK_DUMP_for_*.log`)."""
    views: list[WatchdogView] = []
    for rel, data in sorted(files.items()):
        if not rel.startswith("watchdog/") or not isinstance(data, bytes):
            continue
        file = rel.removeprefix("watchdog/")
        named = parse_dump_name(file)
        if named is None:
            continue
        dumps = parse_dump_text(data.decode("utf-8", errors="replace"))
        views.append(WatchdogView(file, named.name, str(named.role), named.pid, dumps))
    return tuple(views)


def _wedge_at(summary: Mapping[str, Any], history: Sequence[Mapping[str, Any]]) -> float | None:
    """The instant of the wedge capture on the flight recorder's clock (the chart's zero).

    The recorder stamps wall-clock time; older or test bundles may use the monotonic clock.
    The first candidate within a day of the last reading wins.
    """
    last = next(
        (t for t in (_num(h.get("timestamp")) for h in reversed(history)) if t is not None), None
    )
    phases = summary.get("phases")
    wedged = phases.get(CapturePhase.WEDGED) if isinstance(phases, Mapping) else None
    wedged = wedged if isinstance(wedged, Mapping) else {}
    detail = summary.get("verdict_detail")
    detail = detail if isinstance(detail, Mapping) else {}
    candidates = [
        _num(wedged.get("started_timestamp")),
        _num(detail.get("verdict_timestamp")),
        _num(wedged.get("started_at")),
        _num(summary.get("verdict_at")),
    ]
    for candidate in candidates:
        if candidate is not None and (last is None or abs(candidate - last) < 86400):
            return candidate
    for entry in history:
        if entry.get("state") == EngineState.WEDGED:
            return _num(entry.get("timestamp"))
    return last


def _event_at(event: Mapping[str, Any], origin: float) -> float | None:
    """A remedy event's instant on the recorder's clock (wall `timestamp` or monotonic `at`)."""
    options = [v for v in (_num(event.get("timestamp")), _num(event.get("at"))) if v is not None]
    return min(options, key=lambda v: abs(v - origin)) if options else None


# --------------------------------------------------------------------------- listing


@immutable
class BundleRow:
    """One line of `wedgewatch bundles`."""

    name: str
    created_timestamp: float | None
    target: str
    engine: str
    family: str
    verdict: str
    triage: str
    known_issues: str
    remedy: str
    size_bytes: int
    problem: str | None = None


_CLOSED = {
    "restarted": "server back after the restart",
    "recovered": "recovered",
    "restart_failed": "server not back after the restart",
}


def abort_outcome(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The abort cure's part of `remedy.jsonl` in words (None when no abort ran): what it
    cost (requests aborted), whether it worked, and how long serving was lost."""
    aborts = [e for e in events if e.get("event") == "abort"]
    if not aborts:
        return None
    last = aborts[-1]
    count = last.get("aborted")
    cost = f"{count} request(s) aborted" if isinstance(count, int) else "in-flight requests aborted"
    if last.get("ok") is not True:
        return f"abort did not cure ({last.get('outcome') or 'failed'}; {cost})"
    lost = last.get("serving_lost_seconds")
    if isinstance(lost, int | float):
        return f"aborted ({cost}), serving again {lost:.1f} s after the verdict, no restart"
    return f"aborted ({cost}), serving again, no restart"


def remedy_outcome(events: Sequence[Mapping[str, Any]]) -> str:
    """What happened after the capture, from `remedy.jsonl`: `restarted, server back after
    the restart`, `restart failed: ...`, `recovered without restart`, `none recorded`; an
    abort cure comes first (`aborted (3 request(s) aborted), serving again ...`)."""
    aborted = abort_outcome(events)
    text = _restart_outcome(events)
    if aborted is None:
        return text
    if text in ("none recorded", "recovered without restart", "recovered"):
        return aborted
    return f"{aborted}; then {text}"


def _restart_outcome(events: Sequence[Mapping[str, Any]]) -> str:
    restarts = [e for e in events if e.get("event") == "restart"]
    closed = [e for e in events if e.get("event") == "episode_closed"]
    ending = (
        _CLOSED.get(str(closed[-1].get("outcome")), str(closed[-1].get("outcome")))
        if closed
        else None
    )
    if not restarts:
        if ending is None:
            return "none recorded"
        return "recovered without restart" if ending == "recovered" else ending
    last = restarts[-1]
    if last.get("ok") is True:
        text = "restarted" if len(restarts) == 1 else f"restarted x{len(restarts)}"
    else:
        text = f"restart failed: {str(last.get('detail') or '')[:60]}"
    return f"{text}, {ending}" if ending else text


def list_bundles(evidence_dir: Path) -> list[BundleRow]:
    """Every bundle in `evidence_dir`, newest first (directories with a UTC-stamped name)."""
    # The same scan retention uses.

    rows: list[BundleRow] = []
    for stored in scan_bundles(evidence_dir):
        path = evidence_dir / stored.name
        problems: list[str] = []
        files = load_files(path, ("summary.json", "remedy.jsonl"))
        summary = _json(files, "summary.json", problems)
        if "summary.json" not in files:
            problems.append("summary.json missing")
        summary = summary if isinstance(summary, dict) else {}
        events = _jsonl(files, "remedy.jsonl", problems)
        triage = summary.get("triage") if isinstance(summary.get("triage"), Mapping) else {}
        labels = summary.get("engine_labels")
        engine = labels.get("engine") if isinstance(labels, Mapping) else None
        issues = summary.get("known_issues")
        known = (
            ", ".join(
                ("possibly " if m.get("possibility") else "") + str(m.get("id")) + _fix_note(m)
                for m in issues
                if isinstance(m, Mapping)
            )
            if isinstance(issues, list)
            else "?"
        )
        created = _num(summary.get("created_timestamp"))
        rows.append(
            BundleRow(
                name=stored.name,
                created_timestamp=created if created is not None else stored.created_timestamp,
                target=str(summary.get("target", "?")),
                engine="-" if engine is None else str(engine),
                family=str(summary.get("family", "?")),
                verdict=str(summary.get("verdict", "?")),
                triage=str((triage or {}).get("kind", "?")),
                known_issues=known or "none",
                remedy=remedy_outcome(events),
                size_bytes=stored.size_bytes,
                problem="; ".join(problems) or None,
            )
        )
    rows.sort(key=lambda r: (r.created_timestamp or 0.0, r.name), reverse=True)
    return rows


def newest_bundle(evidence_dir: Path) -> Path | None:
    """The newest bundle directory in `evidence_dir`, or None."""
    rows = list_bundles(evidence_dir)
    return evidence_dir / rows[0].name if rows else None
