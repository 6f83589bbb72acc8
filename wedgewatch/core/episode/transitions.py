"""Episode rule T1: which log line (and so which webhook) each detector transition becomes.

Pure, like the rest of `core/`: the episode core (`core/episode/episode.py`) calls it on every
observation and wraps each answer in a `Report` effect; whether a webhook goes out is then
rule H1 there (`episode_types.notify_event`).
"""

from __future__ import annotations

from typing import Any

from wedgewatch.core.detection.detect import DetectionPolicy, TargetVerdict, Transition
from wedgewatch.core.detection.states import ACTED_ON, CALM, STALLED, EngineState, Family
from wedgewatch.core.episode.episode_types import Episode, EpisodeState, Level, Rules
from wedgewatch.core.episode.events import ReportEvent


def transition_reports(
    state: EpisodeState, verdict: TargetVerdict, rules: Rules, at: float
) -> list[tuple[ReportEvent, Level, dict[str, Any]]]:
    """(event, level, fields) per transition of `verdict`, judged from `state` before it."""
    previous, episode = state.verdict, state.episode
    remedy, thresholds = rules.remedy, rules.detect
    out = [
        _engine(verdict, t, episode=episode, remedy=remedy, thresholds=thresholds, at=at)
        for t in verdict.transitions
    ]
    if (
        not verdict.engines
        and verdict.state is EngineState.UNREACHABLE
        and (previous is None or previous.state is not EngineState.UNREACHABLE)
    ):
        startup = thresholds.startup_timeout_seconds
        reason = (
            f"no good scrape within startup_timeout_seconds ({startup:g} s)"
            if startup is not None
            else "no good scrape yet"
        )
        fields = {
            "remedy": remedy,
            "state": str(verdict.state),
            "reason": reason,
            "detail": verdict.failure.detail if verdict.failure else None,
        }
        out.append((ReportEvent.TARGET_UNREACHABLE, "error", fields))
    return out


def _engine(
    verdict: TargetVerdict,
    transition: Transition,
    *,
    episode: Episode | None,
    remedy: str,
    thresholds: DetectionPolicy,
    at: float,
) -> tuple[ReportEvent, Level, dict[str, Any]]:
    new, old = transition.new, transition.old
    engine = next((e for e in verdict.engines if e.key == transition.key), None)
    fields: dict[str, Any] = {
        "model_name": transition.key.model_name,
        "engine": transition.key.engine,
        "state": str(new),
        "previous": str(old),
    }
    if transition.family is not None:
        fields["family"] = str(transition.family)
    if engine is not None:
        fields["reason"] = engine.reason
        if new in STALLED:
            fields["stalled_seconds"] = round(engine.stalled_seconds, 3)
            fields["threshold_seconds"] = thresholds.threshold(
                transition.family or Family.UNREACHABLE
            )
    if new in ACTED_ON:
        # What tells an engine crash (refused: the server is gone) from an API hang
        # (timeout: the port accepts, nothing answers), and what the stacks said.
        if transition.family is Family.UNREACHABLE and verdict.failure is not None:
            fields["scrape_failure"] = verdict.failure.reason
        if episode is not None and episode.triage is not None:
            fields["triage"] = episode.triage
    if new is EngineState.SUSPECT and old not in STALLED:
        return ReportEvent.STALL_SUSPECTED, "warning", fields
    if new is EngineState.WEDGED:
        return ReportEvent.WEDGE_DETECTED, "error", {"remedy": remedy, **fields}
    if new is EngineState.UNREACHABLE:
        return ReportEvent.TARGET_UNREACHABLE, "error", {"remedy": remedy, **fields}
    if old in STALLED and new in CALM:
        if episode is not None:
            fields["stalled_for_seconds"] = round(at - episode.opened_at, 3)
        return ReportEvent.ENGINE_RECOVERED, "info", fields
    if new is EngineState.UNKNOWN:
        return ReportEvent.ENGINE_UNKNOWN, "warning", fields
    if old is EngineState.STARTING:
        return ReportEvent.ENGINE_DISCOVERED, "info", fields
    if EngineState.SLEEPING in (old, new):
        return ReportEvent.ENGINE_STATE_CHANGED, "info", fields
    return ReportEvent.ENGINE_STATE_CHANGED, "debug", fields
