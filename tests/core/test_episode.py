"""Tests of the episode core (pure): its rule table row by row, and hypothesis invariants."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wedgewatch.core.detection.detect import (
    CaptureEvidence,
    EngineVerdict,
    Restart,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    Transition,
)
from wedgewatch.core.detection.states import (
    SEVERITY,
    CaptureFailureReason,
    CapturePhase,
    EngineState,
    Family,
    NotifyEvent,
)
from wedgewatch.core.episode import episode as core
from wedgewatch.core.episode import episode_store
from wedgewatch.core.episode.episode import (
    Capture,
    CaptureDone,
    Episode,
    EpisodeState,
    EpisodeStep,
    Observed,
    OperatorReset,
    Persist,
    QueueRestart,
    Report,
    ReportEvent,
    ResetDetector,
    Resolve,
    RestartDone,
    RestartDue,
    Rules,
    RunRestart,
)
from wedgewatch.core.restart.probe_policy import ServerMark
from wedgewatch.core.restart.replacement import ServerIdentity
from wedgewatch.core.restart.restart_policy import (
    FailureReason,
    Phase,
    PolicyState,
    RestartOutcome,
    RestartPolicy,
)
from wedgewatch.vllm.signals import EngineKey

KEY0, KEY1 = EngineKey("m", "0"), EngineKey("m", "1")
WALL = 1_800_000_000.0  # Unix time at monotonic 0
AT = 1000.0
POLICY = RestartPolicy(restart_budget=3, restart_backoff_seconds=60.0)
RULES = Rules("sim", "signal", can_restart=True, restart_policy=POLICY)
OBSERVE = Rules("sim", "none", can_restart=False, restart_policy=POLICY)
PROBE = Rules("sim", "probe", can_restart=False, restart_policy=POLICY)  # the kubelet restarts
LIMITED = replace(RULES, suspect_capture_min_interval_seconds=600.0)
OK = RestartOutcome(True, "all exited on SIGTERM", 0.5)
FAILED = RestartOutcome(False, "kill: permission denied", 0.1, FailureReason.REMEDY_ERROR)
DEFERRED = Family.DEFERRED_STALL


def engine(
    state: EngineState, key: EngineKey = KEY0, family: Family | None = None
) -> EngineVerdict:
    stalled = state in core.STALLED
    return EngineVerdict(
        key=key,
        state=state,
        family=(family or DEFERRED) if stalled else None,
        since_at=AT,
        stalled_seconds=60.0 if stalled else 0.0,
        last_progress_at=AT - 60.0,
        reading=None,
        missing=False,
        reason=f"{state} for the test",
    )


def verdict(
    *engines: EngineVerdict,
    actions: Sequence[CaptureEvidence | Restart] = (),
    failure: ScrapeFailed | None = None,
    at: float = AT,
) -> TargetVerdict:
    states = {e.state for e in engines}
    state = next((s for s in SEVERITY if s in states), EngineState.STARTING)
    return TargetVerdict(at, state, tuple(engines), (), tuple(actions), failure)


SUSPECT_V = verdict(
    engine(EngineState.SUSPECT), actions=(CaptureEvidence(KEY0, DEFERRED, "suspect"),)
)
WEDGED_V = verdict(
    engine(EngineState.WEDGED),
    actions=(CaptureEvidence(KEY0, DEFERRED, "wedged"), Restart(KEY0, DEFERRED)),
)
WEDGED_QUIET = verdict(engine(EngineState.WEDGED))  # still wedged, no new action
OK_V = verdict(engine(EngineState.OK))


WEDGE_T = Transition(KEY0, EngineState.SUSPECT, EngineState.WEDGED, DEFERRED, AT)
SUSPECT_T = Transition(KEY0, EngineState.OK, EngineState.SUSPECT, DEFERRED, AT)
RECOVER_T = Transition(KEY0, EngineState.SUSPECT, EngineState.OK, None, AT)


def opened(**changes: object) -> Episode:
    base = Episode(
        episode_id="20270115T080000Z-sim-e0-deferred_stall",
        key=KEY0,
        family="deferred_stall",
        opened_at=AT - 30.0,
        opened_timestamp=WALL + AT - 30.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def with_episode(
    verdict_: TargetVerdict | None = None, policy: PolicyState | None = None, **changes: object
) -> EpisodeState:
    return EpisodeState(policy=policy or PolicyState(), episode=opened(**changes), verdict=verdict_)


def run(
    state: EpisodeState, event: core.Input, rules: Rules = RULES, at: float = AT
) -> EpisodeStep:
    return core.step(state, event, rules, at, WALL + at)


def reports(step: EpisodeStep) -> list[str]:
    return [e.event for e in step.effects if isinstance(e, Report)]


def kinds(step: EpisodeStep) -> list[str]:
    return [type(e).__name__ for e in step.effects]


def report(step: EpisodeStep, event: str) -> Report:
    return next(e for e in step.effects if isinstance(e, Report) and e.event == event)


STARTING = PolicyState(Phase.STARTING, (AT - 10,), 1, None, AT - 10)
OLD_SERVER = ServerIdentity(process_start_time_seconds=1000.0, progress={"0": (5.0, 5.0, 1.0, 0.0)})
UNREACHABLE_REFUSED = verdict(
    engine(EngineState.UNREACHABLE, family=Family.UNREACHABLE),
    failure=ScrapeFailed(AT, "refused", "connection refused by 127.0.0.1:8000"),
)
UNREACHABLE_TIMEOUT = verdict(
    engine(EngineState.UNREACHABLE, family=Family.UNREACHABLE),
    failure=ScrapeFailed(AT, "timeout", "no complete response within 5 s"),
)
RESTARTING = PolicyState(Phase.RESTARTING, (AT - 10,), 1, None, AT - 10)
BACKING_OFF = PolicyState(Phase.ARMED, (AT - 10,), 1, AT + 50.0, AT - 10)
BACKOFF_OVER = PolicyState(Phase.ARMED, (AT - 100,), 1, AT - 1.0, AT - 61)
SPENT = PolicyState(Phase.ARMED, (AT - 300, AT - 200, AT - 100), 3, AT - 1.0, AT - 61)
GAVE_UP = PolicyState(Phase.GAVE_UP, (AT - 300, AT - 200, AT - 100), 3, None, AT - 50)


@dataclass(frozen=True)
class Row:
    state: EpisodeState
    event: core.Input
    check: Callable[[EpisodeStep], object]
    rules: Rules = RULES


def _all(*checks: bool) -> bool:
    return all(checks)


ROWS = {
    # E1
    "E1 first stalled engine opens an episode and asks the suspect capture": Row(
        EpisodeState(),
        Observed(SUSPECT_V, good=True),
        lambda s: _all(
            s.state.episode is not None,
            s.state.episode is not None and s.state.episode.suspect_asked,
            kinds(s) == ["Persist", "Report", "Capture"],
            reports(s) == ["episode_opened"],
            s.state.episode is not None
            and s.state.episode.episode_id == "20270115T081640Z-sim-e0-deferred_stall",
        ),
    ),
    "E1 the worst engine names the episode: wedged before suspect": Row(
        EpisodeState(),
        Observed(verdict(engine(EngineState.SUSPECT), engine(EngineState.WEDGED, KEY1)), good=True),
        lambda s: s.state.episode is not None and s.state.episode.key == KEY1,
    ),
    # E2
    "E2 calm again closes the episode and resolves the suspect bundle": Row(
        with_episode(suspect_asked=True, bundle="/b"),
        Observed(OK_V, good=True),
        lambda s: _all(
            s.state.episode is None,
            report(s, "episode_closed").fields["outcome"] == "recovered",
            Resolve("/b", "the engine recovered") in s.effects,
        ),
    ),
    "E2 a completed wedge bundle is not marked resolved": Row(
        with_episode(suspect_asked=True, wedged_asked=True, bundle="/b"),
        Observed(OK_V, good=True),
        lambda s: s.state.episode is None and not any(isinstance(e, Resolve) for e in s.effects),
    ),
    "E2 no close while the restarted server starts": Row(
        with_episode(policy=STARTING),
        Observed(verdict(engine(EngineState.STARTING)), good=False),
        lambda s: s.state.episode is not None and "episode_closed" not in reports(s),
    ),
    "E2 an idle target with no engines is not calm": Row(
        with_episode(),
        Observed(verdict(), good=True),
        lambda s: s.state.episode is not None,
    ),
    # E3
    "E3 a scrape failure in the episode is remembered": Row(
        with_episode(),
        Observed(
            verdict(
                engine(EngineState.SUSPECT, family=Family.UNREACHABLE),
                failure=ScrapeFailed(AT, "timeout", "no answer"),
            ),
            good=False,
        ),
        lambda s: s.state.episode is not None and s.state.episode.scrape_failure == "timeout",
    ),
    # C1, C2
    "C1 the suspect capture is asked once per episode": Row(
        with_episode(suspect_asked=True),
        Observed(SUSPECT_V, good=True),
        lambda s: not any(isinstance(e, Capture) for e in s.effects),
    ),
    "C1 the suspect capture remembers when it was asked (for C4)": Row(
        with_episode(),
        Observed(SUSPECT_V, good=True),
        lambda s: _all(
            any(isinstance(e, Capture) and e.phase == "suspect" for e in s.effects),
            s.state.last_suspect_capture_at == AT,
        ),
        LIMITED,
    ),
    # C4
    "C4 a suspect capture within the rate limit is skipped and reported once": Row(
        replace(with_episode(), last_suspect_capture_at=AT - 100.0),
        Observed(SUSPECT_V, good=True),
        lambda s: _all(
            not any(isinstance(e, Capture) for e in s.effects),
            "at most one per 600 s" in report(s, "suspect_capture_skipped").fields["reason"],
            s.state.episode is not None and s.state.episode.suspect_skipped,
            s.state.episode is not None and not s.state.episode.suspect_asked,
            s.state.last_suspect_capture_at == AT - 100.0,
        ),
        LIMITED,
    ),
    "C4 the skip is reported once per episode, not every tick": Row(
        replace(with_episode(suspect_skipped=True), last_suspect_capture_at=AT - 100.0),
        Observed(SUSPECT_V, good=True),
        lambda s: not any(isinstance(e, Capture) for e in s.effects) and reports(s) == [],
        LIMITED,
    ),
    "C4 past the interval the suspect capture runs again": Row(
        replace(with_episode(), last_suspect_capture_at=AT - 600.0),
        Observed(SUSPECT_V, good=True),
        lambda s: any(isinstance(e, Capture) for e in s.effects),
        LIMITED,
    ),
    "C4 a limit of 0 never skips": Row(
        replace(with_episode(), last_suspect_capture_at=AT - 1.0),
        Observed(SUSPECT_V, good=True),
        lambda s: any(isinstance(e, Capture) for e in s.effects),
    ),
    "C4 a wedge inside the window still gets its (one-shot) capture": Row(
        replace(with_episode(suspect_skipped=True), last_suspect_capture_at=AT - 100.0),
        Observed(WEDGED_V, good=True),
        lambda s: any(isinstance(e, Capture) and e.phase == "wedged" for e in s.effects),
        LIMITED,
    ),
    "C2 the wedged capture comes before the queued restart": Row(
        with_episode(suspect_asked=True),
        Observed(WEDGED_V, good=True),
        lambda s: _all(
            [type(e).__name__ for e in s.effects if isinstance(e, Capture | QueueRestart)]
            == ["Capture", "QueueRestart"],
            s.state.episode is not None and s.state.episode.wedged_asked,
            s.state.episode is not None and s.state.episode.restart_asked,
        ),
    ),
    "C2 the wedged capture is asked once per episode": Row(
        with_episode(wedged_asked=True, restart_asked=True),
        Observed(WEDGED_V, good=True),
        lambda s: not any(isinstance(e, Capture | QueueRestart) for e in s.effects),
    ),
    "C1 no suspect capture once the wedged one was asked": Row(
        with_episode(WEDGED_QUIET, wedged_asked=True),
        Observed(SUSPECT_V, good=True),
        lambda s: not any(isinstance(e, Capture) for e in s.effects),
    ),
    # R1
    "R1 no restarter for this remedy: skipped, saying which remedy is missing": Row(
        with_episode(),
        Observed(WEDGED_V, good=True),
        lambda s: _all(
            reports(s) == ["restart_skipped"],
            report(s, "restart_skipped").fields["reason"] == "no systemd restarter for this target",
            not any(isinstance(e, QueueRestart) for e in s.effects),
            s.state.episode is not None and s.state.episode.restart_asked,
        ),
        rules=Rules("sim", "systemd", can_restart=False, restart_policy=POLICY),
    ),
    "R1 observe mode skips the restart with its reason and queues nothing": Row(
        with_episode(),
        Observed(WEDGED_V, good=True),
        lambda s: _all(
            not any(isinstance(e, QueueRestart) for e in s.effects),
            "observe mode" in report(s, "restart_skipped").fields["reason"],
        ),
        OBSERVE,
    ),
    # R2
    "R2 a target that recovered before the restart ran is not restarted": Row(
        with_episode(OK_V, restart_asked=True),
        RestartDue(KEY0, "deferred_stall", "stuck"),
        lambda s: reports(s) == ["restart_skipped"] and "RunRestart" not in kinds(s),
    ),
    "R2 allowed: persist first, then run the restart": Row(
        with_episode(WEDGED_QUIET, restart_asked=True),
        RestartDue(KEY0, "deferred_stall", "stuck", server_pid=4242),
        lambda s: _all(
            kinds(s) == ["Persist", "RunRestart", "Report"],
            s.effects[0] == Persist(now=True),
            report(s, "restart_requested").notify,
            report(s, "restart_requested").fields["server_pid"] == 4242,
            report(s, "restart_requested").fields["attempt"] == 1,
            s.state.restarts == 1,
            s.state.policy.phase is Phase.RESTARTING,
        ),
    ),
    "R2 inside the backoff: deferred, pending": Row(
        with_episode(WEDGED_QUIET, policy=BACKING_OFF, restart_asked=True),
        RestartDue(KEY0, "deferred_stall", "stuck"),
        lambda s: _all(
            reports(s) == ["restart_deferred"],
            s.state.episode is not None and s.state.episode.restart_pending_since == AT,
        ),
    ),
    "R2 budget spent: gave_up is reported once and says why, no skip line": Row(
        with_episode(WEDGED_QUIET, policy=SPENT, restart_asked=True, bundle="/b"),
        RestartDue(KEY0, "deferred_stall", "stuck"),
        lambda s: _all(
            reports(s) == ["gave_up"],
            report(s, "gave_up").notify,
            report(s, "gave_up").fields["bundle"] == "/b",
            report(s, "gave_up").fields["state"] == "wedged",
            s.state.policy.phase is Phase.GAVE_UP,
        ),
    ),
    "R2 a restart already in progress: skipped, nothing runs": Row(
        with_episode(WEDGED_QUIET, policy=RESTARTING, restart_asked=True),
        RestartDue(KEY0, "deferred_stall", "stuck"),
        lambda s: _all(
            reports(s) == ["restart_skipped"],
            report(s, "restart_skipped").fields["reason"] == "a restart is already in progress",
            not any(isinstance(e, RunRestart) for e in s.effects),
            s.state.restarts == 0,
        ),
    ),
    "R2 inside the startup grace: skipped with when the grace ends, not pending": Row(
        with_episode(WEDGED_QUIET, policy=STARTING, restart_asked=True),
        RestartDue(KEY0, "deferred_stall", "stuck"),
        lambda s: _all(
            reports(s) == ["restart_skipped"],
            "startup grace" in report(s, "restart_skipped").fields["reason"],
            not any(isinstance(e, RunRestart) for e in s.effects),
            s.state.episode is not None and s.state.episode.restart_pending_since is None,
        ),
    ),
    "R2 already gave up: skipped with the reason": Row(
        with_episode(WEDGED_QUIET, policy=GAVE_UP, restart_asked=True),
        RestartDue(KEY0, "deferred_stall", "stuck"),
        lambda s: reports(s) == ["restart_skipped"],
    ),
    # R3
    "R3 a restart that worked resets the detector and ignores older scrapes": Row(
        with_episode(WEDGED_QUIET, policy=RESTARTING, restart_asked=True),
        RestartDone(OK),
        lambda s: _all(
            ResetDetector() in s.effects,
            s.state.ignore_before_at == AT,
            reports(s) == ["restart_completed"],
            s.effects[-1] == Persist(now=True),
            s.state.policy.phase is Phase.STARTING,
        ),
    ),
    "R3 a failed remedy is reported and the restart becomes pending": Row(
        with_episode(WEDGED_QUIET, policy=RESTARTING, restart_asked=True),
        RestartDone(FAILED),
        lambda s: _all(
            reports(s) == ["restart_failed"],
            report(s, "restart_failed").log_only == {"retry": "after the back-off"},
            s.state.episode is not None and s.state.episode.restart_pending_since == AT,
            ResetDetector() not in s.effects,
        ),
    ),
    # R4
    "R4 a pending restart is queued again once the backoff passed": Row(
        with_episode(policy=BACKOFF_OVER, restart_asked=True, restart_pending_since=AT - 61),
        Observed(WEDGED_QUIET, good=True),
        lambda s: _all(
            QueueRestart(KEY0, "deferred_stall", "wedged for the test") in s.effects,
            s.state.episode is not None and s.state.episode.restart_pending_since is None,
        ),
    ),
    "R4 a pending restart waits out the backoff": Row(
        with_episode(policy=BACKING_OFF, restart_asked=True, restart_pending_since=AT - 10),
        Observed(WEDGED_QUIET, good=True),
        lambda s: not any(isinstance(e, QueueRestart) for e in s.effects),
    ),
    "R4 a pending restart waits while the worker is busy": Row(
        with_episode(policy=BACKOFF_OVER, restart_asked=True, restart_pending_since=AT - 61),
        Observed(WEDGED_QUIET, good=True, worker_idle=False),
        lambda s: not any(isinstance(e, QueueRestart) for e in s.effects),
    ),
    "R4 a pending restart is dropped when the target is no longer acted on": Row(
        with_episode(policy=BACKOFF_OVER, restart_asked=True, restart_pending_since=AT - 61),
        Observed(verdict(engine(EngineState.SUSPECT)), good=True),
        lambda s: _all(
            not any(isinstance(e, QueueRestart) for e in s.effects),
            s.state.episode is not None and s.state.episode.restart_pending_since is None,
        ),
    ),
    # P1, P2
    "P1 the first good scrape after a restart closes the episode as restarted": Row(
        with_episode(policy=STARTING, restart_asked=True, bundle="/b"),
        Observed(OK_V, good=True),
        lambda s: _all(
            reports(s) == ["restart_succeeded", "episode_closed"],
            report(s, "restart_succeeded").fields["bundle"] == "/b",
            report(s, "episode_closed").fields["outcome"] == "restarted",
            s.state.episode is None,
        ),
    ),
    "P2 no good scrape within the startup timeout: not_recovered closes the episode": Row(
        replace(
            with_episode(policy=replace(STARTING, phase_since_at=AT - 900.0)),
            ignore_before_at=AT - 900.0,
        ),
        Observed(verdict(failure=ScrapeFailed(AT, "refused", "down")), good=False),
        lambda s: _all(
            reports(s) == ["restart_failed", "episode_closed"],
            report(s, "restart_failed").fields["reason"] == "not_recovered",
            report(s, "episode_closed").fields["outcome"] == "restart_failed",
            s.state.ignore_before_at is None,
        ),
    ),
    # N1, N2: proof of a new server
    "N1 the old server answering after a restart is not a success": Row(
        replace(with_episode(policy=STARTING, restart_asked=True), old_server=OLD_SERVER),
        Observed(OK_V, good=True, identity=OLD_SERVER),
        lambda s: _all(
            reports(s) == [],
            s.state.policy.phase is Phase.STARTING,
            s.state.not_replaced is not None
            and "process_start_time_seconds unchanged" in s.state.not_replaced,
            s.state.episode is not None,
        ),
    ),
    "N1 with the old listener known, the shell is asked to look at the port": Row(
        replace(
            with_episode(policy=STARTING, restart_asked=True),
            old_server=replace(OLD_SERVER, listener_pid=41, listener_create_time=5.0),
        ),
        Observed(OK_V, good=True, identity=OLD_SERVER),
        lambda s: _all(kinds(s) == ["CheckListener"], s.state.listener_check),
    ),
    "N1 a new start time proves the restart: restart_succeeded with the proof": Row(
        replace(with_episode(policy=STARTING, restart_asked=True), old_server=OLD_SERVER),
        Observed(OK_V, good=True, identity=ServerIdentity(process_start_time_seconds=2000.0)),
        lambda s: _all(
            reports(s) == ["restart_succeeded", "episode_closed"],
            "process_start_time_seconds changed" in report(s, "restart_succeeded").fields["detail"],
            s.state.old_server is None,
        ),
    ),
    "N2 a new listener seen by the shell proves the restart at the next good scrape": Row(
        replace(
            with_episode(policy=STARTING, restart_asked=True),
            old_server=replace(OLD_SERVER, listener_pid=41, listener_create_time=5.0),
            listener_after=(77, 9.0),
        ),
        Observed(OK_V, good=True, identity=OLD_SERVER),
        lambda s: _all(
            reports(s) == ["restart_succeeded", "episode_closed"],
            "pid 41 to pid 77" in report(s, "restart_succeeded").fields["detail"],
        ),
    ),
    "N2 ListenerSeen is kept for the next good scrape": Row(
        replace(with_episode(policy=STARTING), listener_check=True),
        core.ListenerSeen(77, 9.0),
        lambda s: _all(
            s.effects == (), s.state.listener_after == (77, 9.0), not s.state.listener_check
        ),
    ),
    "N1 the old server still answers at the startup timeout: not_replaced closes the episode": Row(
        replace(
            with_episode(policy=replace(STARTING, phase_since_at=AT - 900.0)),
            old_server=OLD_SERVER,
            ignore_before_at=AT - 900.0,
        ),
        Observed(WEDGED_QUIET, good=True, identity=OLD_SERVER),
        lambda s: _all(
            reports(s) == ["restart_failed", "episode_closed"],
            report(s, "restart_failed").fields["reason"] == "not_replaced",
            "process_start_time_seconds unchanged" in report(s, "restart_failed").fields["detail"],
            s.state.last_restart_failure is not None
            and s.state.last_restart_failure["reason"] == "not_replaced",
            s.state.old_server is None,
        ),
    ),
    "N1 outside a restart a good scrape remembers the answering server": Row(
        with_episode(WEDGED_QUIET),
        Observed(WEDGED_QUIET, good=True, identity=OLD_SERVER),
        lambda s: s.state.server == OLD_SERVER,
    ),
    "N1 a restart that ran remembers the server it must replace, with the listener": Row(
        replace(with_episode(WEDGED_QUIET, policy=RESTARTING), server=OLD_SERVER),
        RestartDone(OK, listener=(41, 5.0)),
        lambda s: (
            s.state.old_server == replace(OLD_SERVER, listener_pid=41, listener_create_time=5.0)
        ),
    ),
    # W1: a supervisor already restarting the server
    "W1 refused and systemd restarting: no restart, restart_waiting once": Row(
        with_episode(UNREACHABLE_REFUSED, policy=BACKOFF_OVER, restart_asked=True),
        RestartDue(KEY0, "unreachable", "refused", supervisor="systemd is restarting u"),
        lambda s: _all(
            reports(s) == ["restart_waiting"],
            "RunRestart" not in kinds(s),
            s.state.waiting_for_supervisor == "systemd is restarting u",
            s.state.episode is not None
            and s.state.episode.supervisor_retry_at == AT + core.SUPERVISOR_POLL_SECONDS,
            s.state.policy.restarts_at == BACKOFF_OVER.restarts_at,  # no budget spent
        ),
    ),
    "W1 still waiting: no second restart_waiting line": Row(
        replace(
            with_episode(UNREACHABLE_REFUSED, policy=BACKOFF_OVER, restart_asked=True),
            waiting_for_supervisor="systemd is restarting u",
        ),
        RestartDue(KEY0, "unreachable", "refused", supervisor="systemd is restarting u"),
        lambda s: reports(s) == [] and "RunRestart" not in kinds(s),
    ),
    "W1 an API hang (timeout) is restarted whatever the supervisor says": Row(
        with_episode(UNREACHABLE_TIMEOUT, policy=BACKOFF_OVER, restart_asked=True),
        RestartDue(KEY0, "unreachable", "timeout", supervisor="systemd is restarting u"),
        lambda s: "RunRestart" in kinds(s) and s.state.waiting_for_supervisor is None,
    ),
    "W1 the supervisor gave up: the restart runs": Row(
        replace(
            with_episode(UNREACHABLE_REFUSED, policy=BACKOFF_OVER, restart_asked=True),
            waiting_for_supervisor="systemd is restarting u",
        ),
        RestartDue(KEY0, "unreachable", "refused", supervisor=None),
        lambda s: "RunRestart" in kinds(s) and s.state.waiting_for_supervisor is None,
    ),
    "W1 R4 asks the supervisor again only after the poll interval": Row(
        with_episode(
            UNREACHABLE_REFUSED,
            policy=BACKOFF_OVER,
            restart_asked=True,
            restart_pending_since=AT - 1.0,
            supervisor_retry_at=AT + 1.0,
        ),
        Observed(UNREACHABLE_REFUSED, good=False),
        lambda s: "QueueRestart" not in kinds(s),
    ),
    # C3
    "C3 a bundle becomes the episode's bundle and triage": Row(
        with_episode(suspect_asked=True),
        CaptureDone(opened().episode_id, "suspect", "/b", "scheduler_wedge: deferred"),
        lambda s: _all(
            s.state.episode is not None and s.state.episode.bundle == "/b",
            s.state.episode is not None and s.state.episode.triage == "scheduler_wedge: deferred",
            s.state.last_bundle == "/b",
            kinds(s) == ["Persist", "Report"],
            reports(s) == ["evidence_captured"],
            not report(s, "evidence_captured").notify,
        ),
    ),
    "C3 a capture without triage keeps the triage the episode already has": Row(
        with_episode(suspect_asked=True, wedged_asked=True, bundle="/b", triage="api_hang"),
        CaptureDone(opened().episode_id, "wedged", "/b", None),
        lambda s: s.state.episode is not None and s.state.episode.triage == "api_hang",
    ),
    "C3 a bundle of an ended episode only becomes the last bundle": Row(
        with_episode(),
        CaptureDone("another-episode", "wedged", "/old", None),
        lambda s: (
            s.state.last_bundle == "/old"
            and s.state.episode is not None
            and s.state.episode.bundle is None
        ),
    ),
    "C3 a capture that wrote nothing changes nothing": Row(
        with_episode(restart_asked=True),
        CaptureDone(opened().episode_id, "wedged", None, None, ("write_failed",)),
        lambda s: _all(
            reports(s) == ["evidence_capture_failed"],
            report(s, "evidence_capture_failed").log_only
            == {
                "reasons": ["write_failed"],
                "detail": "",
            },
            s.state == with_episode(restart_asked=True),
        ),
    ),
    "C3 a capture's phase and reasons are reported as plain words, not enum reprs": Row(
        with_episode(restart_asked=True),
        CaptureDone(
            opened().episode_id, CapturePhase.WEDGED, None, None, (CaptureFailureReason.TIMEOUT,)
        ),
        lambda s: _all(
            [type(r) for r in report(s, "evidence_capture_failed").log_only["reasons"]] == [str],
            type(report(s, "evidence_capture_failed").fields["phase"]) is str,
            report(s, "evidence_capture_failed").fields["phase"] == "wedged",
        ),
    ),
    # T1
    "T1 an engine turning wedged is reported wedge_detected, with its threshold, notified": Row(
        EpisodeState(),
        Observed(replace(WEDGED_V, transitions=(WEDGE_T,)), good=True),
        lambda s: _all(
            reports(s)[0] == "wedge_detected",
            report(s, "wedge_detected").notify,
            report(s, "wedge_detected").level == "error",
            report(s, "wedge_detected").fields["threshold_seconds"] == 60.0,
            report(s, "wedge_detected").fields["remedy"] == "signal",
        ),
    ),
    "T1 a suspect engine is logged stall_suspected, not notified": Row(
        EpisodeState(),
        Observed(replace(SUSPECT_V, transitions=(SUSPECT_T,)), good=True),
        lambda s: _all(
            reports(s)[0] == "stall_suspected",
            not report(s, "stall_suspected").notify,
        ),
    ),
    "T1 a stalled engine turning ok is engine_recovered with the episode's length": Row(
        with_episode(),
        Observed(replace(OK_V, transitions=(RECOVER_T,)), good=True),
        lambda s: _all(
            reports(s)[0] == "engine_recovered",
            report(s, "engine_recovered").notify,
            report(s, "engine_recovered").fields["stalled_for_seconds"] == 30.0,
        ),
    ),
    "T1 a target without engines that turns unreachable is target_unreachable, notified": Row(
        EpisodeState(verdict=verdict()),
        Observed(
            TargetVerdict(
                AT, EngineState.UNREACHABLE, (), (), (), ScrapeFailed(AT, "refused", "x")
            ),
            good=False,
        ),
        lambda s: _all(
            reports(s) == ["target_unreachable"],
            report(s, "target_unreachable").notify,
            report(s, "target_unreachable").fields["detail"] == "x",
        ),
    ),
    "T1 a target without engines that stays unreachable is not reported again": Row(
        EpisodeState(verdict=TargetVerdict(AT, EngineState.UNREACHABLE, (), (), (), None)),
        Observed(TargetVerdict(AT, EngineState.UNREACHABLE, (), (), (), None), good=False),
        lambda s: reports(s) == [],
    ),
    # O1
    "O1 an operator reset clears gave_up": Row(
        with_episode(WEDGED_QUIET, policy=GAVE_UP),
        OperatorReset(),
        lambda s: _all(
            reports(s) == ["gave_up_cleared"],
            s.state.policy.phase is Phase.ARMED,
            s.state.policy.restarts_at == (),
        ),
    ),
}


def test_notify_is_exactly_the_notify_events() -> None:
    """H1: a Report notifies for every NotifyEvent and for no other event."""
    for event in NotifyEvent:
        assert Report(ReportEvent(str(event)), "info", {}).notify
    for event in ("backoff_reset", "budget_reset", "evidence_captured", "stall_suspected"):
        assert not Report(ReportEvent(event), "info", {}).notify


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_rule(row: Row) -> None:
    """Each row of the rule table: this state and this input give these effects and state."""
    result = run(row.state, row.event, row.rules)
    assert row.check(result), (kinds(result), reports(result), result.state)


def test_stale_scrape_is_dropped_only_before_the_restart_ended() -> None:
    """S0: a scrape begun before the restart finished is stale; one begun after is not."""
    state = EpisodeState(ignore_before_at=AT)
    assert core.is_stale(state, AT - 0.1)
    assert not core.is_stale(state, AT)
    assert not core.is_stale(EpisodeState(), 0.0)


URL = "http://127.0.0.1:8000/metrics"
SAVED_DETECTOR = episode_store.saved_detector(TargetState.initial(), URL, AT, WALL + AT)


@pytest.mark.parametrize(
    ("saved_detector", "url", "now", "trusted", "problem"),
    [
        pytest.param(SAVED_DETECTOR, URL, (AT + 5, WALL + AT + 5), True, None, id="same-url-boot"),
        pytest.param(SAVED_DETECTOR, URL, (50.0, WALL + AT + 5), False, None, id="another-boot"),
        pytest.param(
            SAVED_DETECTOR,
            "http://10.0.0.2:8000/metrics",
            (AT + 5, WALL + AT + 5),
            False,
            None,
            id="url-changed",
        ),
        pytest.param(None, URL, (AT + 5, WALL + AT + 5), False, None, id="nothing-saved"),
        pytest.param(
            {**SAVED_DETECTOR, "saved_at": "soon"},
            URL,
            (AT + 5, WALL + AT + 5),
            False,
            "x",
            id="malformed",
        ),
    ],
)
def test_restored_trusts_the_detector_and_episode_only_for_the_same_url_and_boot(
    saved_detector: dict[str, object] | None,
    url: str,
    now: tuple[float, float],
    trusted: bool,
    problem: str | None,
) -> None:
    """S1: the detector state, and with it the open episode, come back only when the saved
    state watched this URL in this boot; the budget always comes back; malformed is said."""
    policy, episodes = episode_store.saved(
        with_episode(bundle="/b", policy=BACKING_OFF), AT, WALL + AT
    )
    back = episode_store.restored(
        policy, episodes, RULES, *now, saved_detector=saved_detector, url=url
    )
    assert (back.detector is not None) is trusted
    assert (back.state.episode is not None) is trusted
    assert (back.problem is not None) is (problem is not None)
    assert back.state.policy.restarts_at  # the budget survives any restart of wedgewatch
    if back.state.episode is not None:
        assert back.state.episode.suspect_asked  # its bundle exists: no second suspect capture
        assert back.state.last_bundle == "/b"


def test_the_saved_episode_keeps_no_secret_of_the_model_name() -> None:
    """#21: the state file's episode carries the redacted model name, never the raw one."""
    hostile = EngineKey("m http://PLANTEDtok@h/?apikey=PLANTEDq", "0")
    _, episodes = episode_store.saved(with_episode(key=hostile), AT, WALL + AT)
    assert episodes[0].engine == "0"
    assert "PLANTED" not in episodes[0].model_name
    assert episodes[0].model_name.startswith("m http://")


@pytest.mark.parametrize(
    ("saved_at", "saved_wall", "at", "wall", "same"),
    [
        pytest.param(100.0, WALL + 100, 200.0, WALL + 200, True, id="same-boot"),
        pytest.param(100.0, WALL + 100, 50.0, WALL + 200, False, id="monotonic-went-back"),
        pytest.param(100.0, WALL + 100, 200.0, WALL + 400, False, id="wall-drifted"),
    ],
)
def test_same_boot(saved_at: float, saved_wall: float, at: float, wall: float, same: bool) -> None:
    """A saved detector state is trusted only when both clocks moved on together."""
    assert episode_store.same_boot(saved_at, saved_wall, at, wall) is same


# ---------------------------------------------------------------------------------------------
# Invariants over generated stories: an ideal shell runs the effects in order


@dataclass
class Shell:
    """Performs effects like the daemon: one queue per target, run in order."""

    rules: Rules
    capture_ok: bool
    restart_results: list[bool]
    state: EpisodeState = field(default_factory=EpisodeState)
    log: list[tuple[float, object]] = field(default_factory=list)
    queue: list[object] = field(default_factory=list)

    def feed(self, event: core.Input, at: float) -> EpisodeStep:
        step = core.step(self.state, event, self.rules, at, WALL + at)
        self.state = step.state
        for effect in step.effects:
            self.log.append((at, effect))
            if isinstance(effect, Capture | QueueRestart):
                self.queue.append(effect)
        return step

    def drain(self, at: float) -> None:
        while self.queue:
            job = self.queue.pop(0)
            if isinstance(job, Capture):
                bundle = f"/e/{job.episode_id}" if self.capture_ok else None
                failures = () if self.capture_ok else ("ptrace_denied",)
                self.feed(CaptureDone(job.episode_id, job.phase, bundle, None, failures), at)
            elif isinstance(job, QueueRestart):
                step = self.feed(RestartDue(job.key, job.family, job.reason), at)
                if any(isinstance(e, RunRestart) for e in step.effects):
                    ok = self.restart_results.pop(0) if self.restart_results else True
                    self.feed(RestartDone(OK if ok else FAILED), at + 1.0)


MODES = st.sampled_from(["ok", "suspect", "wedged", "unreachable", "down", "idle"])


def play(modes: Sequence[str], capture_ok: bool, restarts: Sequence[bool]) -> Shell:
    """Feed a story of target states (one per 10 s) through the core like a detector would."""
    shell = Shell(RULES, capture_ok, list(restarts))
    previous = "ok"
    acted = False
    for i, mode in enumerate(modes):
        at = AT + 10.0 * i
        actions: list[CaptureEvidence | Restart] = []
        failure = None
        if mode in ("ok", "idle"):
            engines: tuple[EngineVerdict, ...] = (
                engine(EngineState.OK if mode == "ok" else EngineState.IDLE),
            )
            acted = False
        elif mode == "down":
            engines = ()
            failure = ScrapeFailed(at, "refused", "down")
        else:
            state = {
                "suspect": EngineState.SUSPECT,
                "wedged": EngineState.WEDGED,
                "unreachable": EngineState.UNREACHABLE,
            }[mode]
            family = Family.UNREACHABLE if mode == "unreachable" else DEFERRED
            engines = (engine(state, family=family),)
            if mode == "suspect" and previous in ("ok", "idle", "down"):
                actions = [CaptureEvidence(KEY0, family, "suspect")]
            if mode != "suspect" and not acted:
                actions = [CaptureEvidence(KEY0, family, "wedged"), Restart(KEY0, family)]
                acted = True
        previous = mode
        shell.feed(
            Observed(
                verdict(*engines, actions=actions, failure=failure, at=at), good=failure is None
            ),
            at,
        )
        shell.drain(at)
    return shell


STORIES = st.lists(MODES, min_size=1, max_size=60)
OUTCOMES = st.lists(st.booleans(), max_size=8)


@settings(deadline=None)
@given(STORIES, st.booleans(), OUTCOMES)
def test_evidence_always_precedes_a_restart(
    modes: list[str], capture_ok: bool, restarts: list[bool]
) -> None:
    """Every restart that runs was preceded by a wedged capture asked in its episode."""
    shell = play(modes, capture_ok, restarts)
    asked: set[str] = set()
    episode_of: str | None = None
    for _, effect in shell.log:
        if isinstance(effect, Report) and effect.event == "episode_opened":
            episode_of = str(effect.fields["episode"])
        if isinstance(effect, Capture) and effect.phase == "wedged":
            asked.add(effect.episode_id)
        if isinstance(effect, RunRestart):
            assert episode_of in asked


@settings(deadline=None)
@given(STORIES, OUTCOMES)
def test_a_failed_capture_never_blocks_the_restart(modes: list[str], restarts: list[bool]) -> None:
    """The restarts run at the same instants whether the captures worked or failed."""

    def restart_times(capture_ok: bool) -> list[float]:
        shell = play(modes, capture_ok, restarts)
        return [at for at, e in shell.log if isinstance(e, RunRestart)]

    assert restart_times(True) == restart_times(False)


@settings(deadline=None)
@given(STORIES, st.booleans(), OUTCOMES)
def test_never_more_restarts_than_the_budget(
    modes: list[str], capture_ok: bool, restarts: list[bool]
) -> None:
    """No budget window ever holds more restarts than restart_budget."""
    shell = play(modes, capture_ok, restarts)
    times = [at for at, e in shell.log if isinstance(e, RunRestart)]
    window = POLICY.restart_budget_window_seconds
    for t in times:
        assert sum(1 for u in times if t - window < u <= t) <= POLICY.restart_budget


@settings(deadline=None)
@given(STORIES, st.booleans(), OUTCOMES, st.floats(min_value=0.0, max_value=30.0))
def test_what_survives_a_wedgewatch_restart_round_trips(
    modes: list[str], capture_ok: bool, restarts: list[bool], gap: float
) -> None:
    """Saving then restoring (same boot) keeps the episode, the budget and the backoff."""
    shell = play(modes, capture_ok, restarts)
    end = AT + 10.0 * len(modes)
    policy, episodes = episode_store.saved(shell.state, end, WALL + end)
    back = episode_store.restored(
        policy,
        episodes,
        RULES,
        end + gap,
        WALL + end + gap,
        saved_detector=episode_store.saved_detector(TargetState.initial(), URL, end, WALL + end),
        url=URL,
    ).state
    before, after = shell.state.episode, back.episode
    assert (before is None) == (after is None)
    if before is not None and after is not None:
        assert after.episode_id == before.episode_id
        assert after.key == before.key
        assert after.family == before.family
        assert after.bundle == before.bundle
        assert after.opened_at == pytest.approx(before.opened_at)
    assert episode_store.saved(back, end + gap, WALL + end + gap)[
        0
    ].restart_timestamps == pytest.approx(policy.restart_timestamps)
    old, new = shell.state.policy, back.policy
    assert new.consecutive == old.consecutive
    assert new.phase == (Phase.STARTING if old.phase is Phase.RESTARTING else old.phase)
    if old.not_before_at is not None:
        assert new.not_before_at == pytest.approx(old.not_before_at)


# ---------------------------------------------------------------------------------------------
# Q1, Q2: the liveness probe (core.probe_policy) inside the episode core


MARK_A = ServerMark(process_start_time_seconds=100.0, progress={"m|0": 50.0})
MARK_B = ServerMark(process_start_time_seconds=200.0, progress={"m|0": 0.0})


def test_q2_a_served_probe_failure_is_remembered_and_persisted() -> None:
    """Q2: ProbeServed keeps the server it judged, and asks for a save."""
    result = core.step(core.EpisodeState(), core.ProbeServed(MARK_A), PROBE, AT, WALL + AT)
    assert result.state.probe.failures == 1
    assert result.state.probe.server == MARK_A
    assert core.Persist() in result.effects


def test_q1_a_new_server_after_a_served_failure_counts_and_the_budget_ends_in_gave_up() -> None:
    """Q1: 503 verdict, served, new server -> counted (probe_restart); spent -> 200 gave_up."""
    tight = replace(PROBE, restart_policy=RestartPolicy(restart_budget=1))
    state = core.step(core.EpisodeState(), core.Observed(WEDGED_QUIET, good=True, mark=MARK_A),
                      tight, AT, WALL + AT).state  # fmt: skip
    assert state.probe_answer is not None
    assert not state.probe_answer.ok
    state = core.step(state, core.ProbeServed(MARK_A), tight, AT + 1, WALL + AT + 1).state
    result = core.step(state, core.Observed(OK_V, good=True, mark=MARK_B), tight, AT + 60,
                       WALL + AT + 60)  # fmt: skip
    reports = [e for e in result.effects if isinstance(e, core.Report)]
    assert any(r.event == "restart_succeeded" and r.fields["reason"] == "probe_restart"
               for r in reports)  # fmt: skip
    assert result.state.policy.restarts_at == (AT + 1,)
    wedged_again = core.step(result.state, core.Observed(WEDGED_QUIET, good=True, mark=MARK_B),
                             tight, AT + 200, WALL + AT + 200)  # fmt: skip
    answer = wedged_again.state.probe_answer
    assert answer is not None
    assert answer.ok
    assert answer.gave_up
    assert wedged_again.state.policy.phase is Phase.GAVE_UP


def test_q1_without_a_mark_the_probe_verdict_is_not_kept() -> None:
    """Q1 runs only when the shell passes the server's mark (the check has its own shell)."""
    result = core.step(core.EpisodeState(), core.Observed(WEDGED_QUIET, good=True), PROBE,
                       AT, WALL + AT)  # fmt: skip
    assert result.state.probe_answer is None


def test_q1_observe_mode_never_answers_restart() -> None:
    """P0 inside Q1: with remedy none a wedge passes the probe with decision `observe`."""
    result = core.step(core.EpisodeState(), core.Observed(WEDGED_QUIET, good=True, mark=MARK_A),
                       OBSERVE, AT, WALL + AT)  # fmt: skip
    answer = result.state.probe_answer
    assert answer is not None
    assert answer.ok
    assert answer.decision == "observe"
    assert "observe mode" in answer.detail
