"""What the daemon shows and keeps of one target: its `/status` snapshot and its state record.

Both are built per target, only when that target changed, so the cost of a tick does not
grow with the number of targets that did nothing (`daemon.Daemon` assembles them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from wedgewatch.core.detection.detect import (
    TargetState,
    TargetVerdict,
)
from wedgewatch.core.detection.readiness import ready_verdict
from wedgewatch.core.detection.states import STALLED, EngineState
from wedgewatch.core.episode import episode as episode_core
from wedgewatch.core.episode import episode_store
from wedgewatch.core.episode.episode import EpisodeState
from wedgewatch.core.restart import probe_policy, restart_policy
from wedgewatch.core.restart.probe_policy import ProbeVerdict
from wedgewatch.core.values import immutable
from wedgewatch.daemon.report import shown_url, wall
from wedgewatch.io import statefile
from wedgewatch.vllm.signals import EngineReading

if TYPE_CHECKING:
    from wedgewatch.config import Target


@immutable
class EngineSnapshot:
    """One engine as the endpoints show it (wall-clock times, JSON-friendly values)."""

    model_name: str
    engine: str
    state: str
    family: str | None
    since_timestamp: float | None
    stalled_seconds: float
    last_progress_timestamp: float | None
    reason: str
    missing: bool
    reading: EngineReading | None


@immutable
class TargetSnapshot:
    """One watched server after the latest tick."""

    name: str
    url: str
    state: str
    reason: str
    up: bool
    last_scrape_timestamp: float | None
    last_scrape_error: str | None
    engines: tuple[EngineSnapshot, ...]
    remedy: str
    restarts: int
    restart_budget_remaining: int
    gave_up: bool
    restart_in_progress: bool
    next_restart_allowed_timestamp: float | None
    last_bundle: str | None
    episode: Mapping[str, Any] | None = None
    probe: ProbeVerdict | None = None  # the loop's probe verdict (None: judge by state alone)
    # The latest restart_failed: {"reason", "detail", "timestamp"} (not_vllm, not_replaced, ...)
    last_restart_failure: Mapping[str, Any] | None = None
    # Set while a supervisor (systemd) is already restarting the server: why no restart now.
    waiting_for_supervisor: str | None = None
    canary: Mapping[str, Any] | None = None  # None when the canary is off
    # How the cures of this target ended, newest last (the cure ladder's rule K1).
    recoveries: tuple[Mapping[str, Any], ...] = ()


def target_snapshot(
    target: Target,
    core: EpisodeState,
    policy: restart_policy.RestartPolicy,
    *,
    remedy_name: str,
    failure_text: str | None,
    last_scrape_timestamp: float | None,
    restart_running: bool,
    now_at: float,
    now: float,
    canary: Mapping[str, Any] | None = None,
) -> TargetSnapshot:
    """One target as /status, /probe and /metrics show it now."""
    verdict = core.verdict
    engines = tuple(
        EngineSnapshot(
            model_name=e.key.model_name,
            engine=e.key.engine,
            state=str(e.state),
            family=str(e.family) if e.family else None,
            since_timestamp=wall(e.since_at, now_at, now),
            stalled_seconds=e.stalled_seconds if e.state in STALLED else 0.0,
            last_progress_timestamp=wall(e.last_progress_at, now_at, now),
            reason=e.reason,
            missing=e.missing,
            reading=e.reading,
        )
        for e in (verdict.engines if verdict else ())
    )
    episode = core.episode
    not_before = core.policy.not_before_at
    return TargetSnapshot(
        name=target.name,
        url=shown_url(target.metrics_url),
        state=str(verdict.state if verdict else EngineState.STARTING),
        reason=target_reason(core, verdict),
        up=failure_text is None and verdict is not None,
        last_scrape_timestamp=last_scrape_timestamp,
        last_scrape_error=failure_text,
        engines=engines,
        remedy=remedy_name,
        restarts=core.restarts,
        restart_budget_remaining=restart_policy.budget_remaining(core.policy, policy, now_at),
        gave_up=core.policy.phase is restart_policy.Phase.GAVE_UP,
        restart_in_progress=restart_in_progress(core, restart_running=restart_running),
        next_restart_allowed_timestamp=(
            wall(not_before, now_at, now)
            if not_before is not None and not_before > now_at
            else None
        ),
        last_bundle=core.last_bundle,
        probe=core.probe_answer,
        canary=canary,
        episode=(
            {
                "id": episode.episode_id,
                "engine": episode.key.engine,
                "model_name": episode.key.model_name,
                "family": episode.family,
                "opened_timestamp": episode.opened_timestamp,
                "bundle": episode.bundle,
                "triage": episode.triage,
                "scrape_failure": episode.scrape_failure,
                # Observe mode requests nothing (the episode core still notes the ask once).
                "restart_requested": episode.restart_asked and remedy_name != "none",
            }
            if episode
            else None
        ),
        last_restart_failure=core.last_restart_failure,
        waiting_for_supervisor=core.waiting_for_supervisor,
        recoveries=tuple(r.to_json() for r in core.recoveries),
    )


def restart_in_progress(core: EpisodeState, *, restart_running: bool) -> bool:
    """Whether the server is being restarted: the remedy runs, or the policy waits for the
    restarted server (phase restarting or starting)."""
    return restart_running or core.policy.phase in (
        restart_policy.Phase.RESTARTING,
        restart_policy.Phase.STARTING,
    )


def target_ready(core: EpisodeState, *, restart_running: bool) -> bool:
    """The readiness verdict (`core.readiness`) of the target now: /ready and the metric."""
    verdict = core.verdict
    return ready_verdict(
        str(verdict.state if verdict else EngineState.STARTING),
        gave_up=core.policy.phase is restart_policy.Phase.GAVE_UP,
        restarting=restart_in_progress(core, restart_running=restart_running),
    ).ready


def target_reason(core: EpisodeState, verdict: TargetVerdict | None) -> str:
    """One sentence for /probe: why the target is in its state."""
    if verdict is None:
        return "not scraped yet"
    if core.policy.phase is restart_policy.Phase.STARTING:
        return "restarted; waiting for the first good scrape (startup grace)"
    worst = [e for e in verdict.engines if e.state is verdict.state]
    if worst:
        return "; ".join(
            f"engine {e.key.engine} ({e.key.model_name}) {e.state}: {e.reason}" for e in worst
        )
    if verdict.failure is not None:
        prefix = "unreachable" if verdict.state is EngineState.UNREACHABLE else "starting"
        return f"{prefix}: {verdict.failure.reason}: {verdict.failure.detail}"
    return f"{verdict.state}: no engine reported yet"


def target_record(
    target: Target, core: EpisodeState, detector: TargetState, at: float, now: float
) -> statefile.TargetRecord:
    """What the state file keeps of one target (S1 of the episode rules, plus the detector)."""
    policy_record, episodes = episode_store.saved(core, at, now)
    return statefile.TargetRecord(
        restart_policy=policy_record,
        open_episodes=episodes,
        detector=episode_store.saved_detector(detector, target.metrics_url, at, now),
        probe=probe_policy.memory_to_record(core.probe, at, now),
    )


def restored_core(
    record: statefile.TargetRecord,
    rules: episode_core.Rules,
    at: float,
    now: float,
    *,
    url: str,
) -> episode_store.Restored:
    """The episode core's state (and the detector's) from a saved record (rule S1)."""
    back = episode_store.restored(
        record.restart_policy,
        record.open_episodes,
        rules,
        at,
        now,
        saved_detector=record.detector,
        url=url,
    )
    # The liveness probe's served failures survive any restart of wedgewatch (they carry
    # their own server identity, so a new boot does not make them meaningless).
    probe = probe_policy.memory_from_record(record.probe, at, now)
    return replace(back, state=replace(back.state, probe=probe))
