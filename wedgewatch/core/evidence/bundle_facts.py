"""A bundle's contents in the terms known-issue signatures use (`Facts`). Pure.

Shared by the capture (which writes the matches into `summary.json`) and the report
(which matches again with the installed known-issues file), so both read a bundle alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from wedgewatch.core.evidence.known_issues import Facts, SeenFrame
from wedgewatch.core.evidence.triage import Thread
from wedgewatch.vllm.build_info import features


def engine_entry(entry: Mapping[str, Any], engine: str) -> Mapping[str, Any] | None:
    """The engine's item in one flight-recorder entry (the first engine if the label is absent)."""
    engines = entry.get("engines")
    if not isinstance(engines, list):
        return None
    chosen = None
    for item in engines:
        if isinstance(item, Mapping):
            if str(item.get("engine")) == engine:
                return item
            chosen = chosen or item
    return chosen


def wedge_readings(
    history: Sequence[Mapping[str, Any]], engine: str
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """(last, first) readings of the engine in the recorder; (None, None) without any."""
    readings = [
        r for r in (engine_entry(h, engine) for h in history) if r is not None and "running" in r
    ]
    if not readings:
        return None, None
    return readings[-1], readings[0]


def seen_frames(
    processes: Iterable[tuple[str, str, int, Sequence[Thread] | None]],
) -> tuple[SeenFrame, ...]:
    """Every frame of `(round, role, pid, threads)` as the matcher sees it."""
    return tuple(
        SeenFrame(role, pid, label, frame.name)
        for label, role, pid, threads in processes
        for thread in threads or ()
        for frame in thread.frames
    )


def bundle_version(build: Mapping[str, Any], summary: Mapping[str, Any]) -> str | None:
    """The vLLM version `GET /version` reported (build.json), else the summary's copy."""
    v = build.get("version")
    if isinstance(v, Mapping) and isinstance(v.get("version"), str):
        return str(v["version"])
    value = summary.get("vllm_version")
    return str(value) if value else None


def bundle_facts(
    summary: Mapping[str, Any],
    build: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    frames: tuple[SeenFrame, ...],
    *,
    workers: int,
    cache_config: Mapping[str, str] | None = None,
) -> Facts:
    """The facts of a bundle: family, triage, version, features and frames."""
    labels = summary.get("engine_labels")
    engine = "0"
    if isinstance(labels, Mapping) and labels.get("engine") is not None:
        engine = str(labels["engine"])
    reading, first = wedge_readings(history, engine)
    flags = build.get("flags")
    env = build.get("engine_env")
    cache = build.get("cache_config_info") if cache_config is None else cache_config
    triage = summary.get("triage")
    return Facts(
        family=str(summary["family"]) if summary.get("family") else None,
        triage_kind=str(triage.get("kind")) if isinstance(triage, Mapping) else None,
        version=bundle_version(build, summary),
        features=features(
            flags if isinstance(flags, Mapping) else {},
            env if isinstance(env, Mapping) else {},
            cache if isinstance(cache, Mapping) else {},
            reading,
            first_reading=first,
            workers=workers,
        ),
        frames=frames,
    )
