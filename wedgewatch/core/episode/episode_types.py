"""The episode core's inputs, outputs and state (see `core/episode/episode.py` for the rules).

Split out of `core/episode/episode.py` so the rule module stays readable; `core.episode`
re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any, Literal, assert_never

from wedgewatch.core.detection.detect import DetectionPolicy, TargetVerdict
from wedgewatch.core.detection.states import CaptureFailureReason, EpisodePhase, NotifyEvent
from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.restart import probe_policy, restart_policy
from wedgewatch.core.restart.ladder import PROOF_SECONDS, LadderState, Outcome, Rung
from wedgewatch.core.restart.replacement import ServerIdentity
from wedgewatch.core.values import immutable
from wedgewatch.vllm.signals import EngineKey

# ---------------------------------------------------------------------------------------------
# State


@immutable
class Rules:
    """What the core needs to know about the target's configuration."""

    target: str
    remedy: str
    can_restart: bool  # a restarter exists for this target (false for "none" and "probe")
    restart_policy: restart_policy.RestartPolicy
    probe_respects_budget: bool = True
    suspect_capture_min_interval_seconds: float = 0.0  # C4; 0 = no rate limit
    detect: DetectionPolicy = field(
        default_factory=DetectionPolicy
    )  # the thresholds the T1 reports quote
    abort_first: bool = False  # the cure ladder's abort rung (core.restart.ladder)
    abort_proof_seconds: float = PROOF_SECONDS  # L5: how long an abort has to prove


@immutable
class Episode:
    """One stall episode of a target: from the first stalled engine until all are calm."""

    episode_id: str
    key: EngineKey
    family: str
    opened_at: float
    opened_timestamp: float
    bundle: str | None = None
    suspect_asked: bool = False
    suspect_skipped: bool = False  # C4: the suspect capture was rate-limited
    wedged_asked: bool = False
    restart_asked: bool = False
    restart_pending_since: float | None = None  # a restart waits for the backoff to pass
    triage: str | None = None
    scrape_failure: str | None = None  # the latest scrape failure reason seen in the episode
    supervisor_retry_at: float | None = None  # W1: ask the supervisor again from then on
    triage_kind: str | None = None  # C3: the triage's kind (the ladder's rule L2 reads it)
    wedged_at: float | None = None  # R1: the wedged verdict a cure answers


@immutable
class EpisodeState:
    """Everything the core keeps about one target between inputs."""

    policy: restart_policy.PolicyState = field(default_factory=restart_policy.PolicyState)
    episode: Episode | None = None
    verdict: TargetVerdict | None = None  # the latest verdict judged
    last_bundle: str | None = None
    restarts: int = 0  # restarts run by this process (for /status)
    ignore_before_at: float | None = None  # S0: scrapes begun before this saw the old server
    last_suspect_capture_at: float | None = None  # C1/C4: when a suspect capture was last asked
    probe: probe_policy.ProbeMemory = field(default_factory=probe_policy.ProbeMemory)
    probe_answer: probe_policy.ProbeVerdict | None = None  # Q1: what /probe answers now
    server: ServerIdentity | None = None  # P1: the answering server, outside restarts
    old_server: ServerIdentity | None = None  # N1: the server a restart has to replace
    listener_after: tuple[int, float | None] | None = None  # N2: the listener after it
    listener_check: bool = False  # N1: a CheckListener runs
    not_replaced: str | None = None  # N1: why the answering server is not proven new
    last_restart_failure: Mapping[str, Any] | None = None  # reason, detail, timestamp
    waiting_for_supervisor: str | None = None  # W1: why no restart runs now
    ladder: LadderState = field(default_factory=LadderState)  # the cure ladder
    recoveries: tuple[Recovery, ...] = ()  # K1: the cures that ended, newest last (/status)


#: How many recoveries a target keeps for /status (K1).
RECOVERIES_KEPT = 10


@immutable
class Recovery:
    """How one cure ended (K1): which cure, its outcome, and how long serving was lost.

    `seconds` runs from the wedged verdict to serving again (None when it did not recover);
    `aborted` is vLLM's count of the requests an abort ended.
    """

    cure: Rung
    outcome: Outcome
    seconds: float | None
    timestamp: float
    episode: str | None
    detail: str
    aborted: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry of `/status`'s `recoveries`."""
        return {
            "cure": str(self.cure),
            "outcome": str(self.outcome),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "timestamp": round(self.timestamp, 3),
            "episode": self.episode,
            "aborted": self.aborted,
            "detail": self.detail,
        }


# ---------------------------------------------------------------------------------------------
# Inputs


@immutable
class Observed:
    """The detector judged a scrape; `good` when the scrape succeeded."""

    verdict: TargetVerdict
    good: bool
    worker_idle: bool = True  # no capture or restart runs for the target right now
    mark: probe_policy.ServerMark | None = None  # the server the detector read last (Q1)
    identity: ServerIdentity | None = None  # what a good scrape says about the server (N1)


@immutable
class CaptureDone:
    """An evidence capture asked by a `Capture` effect finished (well or not)."""

    episode_id: str
    phase: EpisodePhase
    bundle: str | None
    triage: str | None = None
    failures: tuple[CaptureFailureReason, ...] = ()
    key: EngineKey | None = None  # the engine the capture was about
    family: str = ""
    detail: str = ""  # what went wrong, when something did
    duration_seconds: float = 0.0
    server_gone: bool = False  # the server had crashed or stopped: an outcome, not a failure
    triage_kind: str | None = None  # the triage's kind alone (`scheduler_wedge`, ...)


@immutable
class RestartDue:
    """The worker reached a queued restart and asks whether to run it now."""

    key: EngineKey
    family: str
    reason: str
    supervisor: str | None = None  # W1: the supervisor says it is restarting the server
    server_pid: int | None = None  # the server process the restarter would act on, if found


@immutable
class RestartDone:
    """The restarter finished a `RunRestart` with this outcome."""

    outcome: restart_policy.RestartOutcome
    listener: tuple[int, float | None] | None = None  # the port's (pid, create time) before


@immutable
class AbortDone:
    """The worker ran a `RunAbort`: the call's result and the canary sent after it."""

    ok: bool
    detail: str
    aborted: int | None = None  # vLLM's count of aborted requests, when it said
    canary_ok_at: float | None = None  # when the canary sent after the abort completed
    duration_seconds: float = 0.0


@immutable
class ListenerSeen:
    """The port's listener after a restart (None: none found), asked by `CheckListener`."""

    pid: int | None
    create_time: float | None = None


@immutable
class OperatorReset:
    """An operator asked to reset the target's restart budget."""


@immutable
class ProbeServed:
    """/probe sent a failing answer about the server `mark` (Q2)."""

    mark: probe_policy.ServerMark


Input = (
    Observed
    | CaptureDone
    | RestartDue
    | RestartDone
    | AbortDone
    | ListenerSeen
    | OperatorReset
    | ProbeServed
)


# ---------------------------------------------------------------------------------------------
# Effects (data; the shell performs them in order)


@immutable
class Capture:
    """Queue an evidence capture: `suspect` opens the episode's bundle, `wedged` completes it."""

    phase: EpisodePhase
    key: EngineKey
    family: str
    episode_id: str
    verdict_at: float


@immutable
class Resolve:
    """Queue marking a suspect bundle resolved (None: the target's last bundle at that time)."""

    bundle: str | None
    note: str


@immutable
class QueueRestart:
    """Queue a restart behind the captures; the worker sends `RestartDue` when it gets there."""

    key: EngineKey
    family: str
    reason: str


@immutable
class RunRestart:
    """Run the restarter now (the policy allowed it); send `RestartDone` with its outcome."""

    key: EngineKey
    family: str
    reason: str
    attempt: int


@immutable
class RunAbort:
    """Run the abort cure now (the ladder allowed it): prove the server, `POST
    /abort_requests`, send one canary; send `AbortDone`. Bounded by `proof_seconds`."""

    key: EngineKey
    family: str
    reason: str
    proof_seconds: float


@immutable
class Recovered:
    """A cure ended (K1): count it (`wedgewatch_recoveries_total`)."""

    recovery: Recovery


@immutable
class CheckListener:
    """Look up the process listening on the target's port; send `ListenerSeen` (N1)."""


@immutable
class ResetDetector:
    """Start the target's detector afresh: the startup grace after a restart."""


@immutable
class Persist:
    """Save the state: `now` before going on, else with the next routine save."""

    now: bool = False


#: How loud a `Report`'s log line is.
Level = Literal["debug", "info", "warning", "error"]


def notify_event(event: ReportEvent) -> NotifyEvent | None:
    """H1: the webhook event a reported event sends, or None (log line and metrics only)."""
    match event:
        case (
            ReportEvent.WEDGE_DETECTED
            | ReportEvent.TARGET_UNREACHABLE
            | ReportEvent.ENGINE_RECOVERED
            | ReportEvent.RESTART_REQUESTED
            | ReportEvent.RESTART_SUCCEEDED
            | ReportEvent.RESTART_FAILED
            | ReportEvent.GAVE_UP
            | ReportEvent.GAVE_UP_CLEARED
        ):
            return NotifyEvent(event)  # the same name (tests/report/test_report_events.py)
        case (
            ReportEvent.STALL_SUSPECTED
            | ReportEvent.ENGINE_UNKNOWN
            | ReportEvent.ENGINE_DISCOVERED
            | ReportEvent.ENGINE_STATE_CHANGED
            | ReportEvent.EPISODE_OPENED
            | ReportEvent.EPISODE_CLOSED
            | ReportEvent.EVIDENCE_CAPTURED
            | ReportEvent.EVIDENCE_CAPTURE_FAILED
            | ReportEvent.SUSPECT_CAPTURE_SKIPPED
            | ReportEvent.RESTART_SKIPPED
            | ReportEvent.RESTART_WAITING
            | ReportEvent.RESTART_DEFERRED
            | ReportEvent.RESTART_COMPLETED
            | ReportEvent.BACKOFF_RESET
            | ReportEvent.BUDGET_RESET
            | ReportEvent.ABORT_REQUESTED
            | ReportEvent.ABORT_SKIPPED
            | ReportEvent.ABORT_SUCCEEDED
            | ReportEvent.ABORT_FAILED
        ):
            return None
        case _:
            assert_never(event)


@immutable
class Report:
    """One notable fact: a log line (`level`), and a webhook when `notify`.

    `log_only` fields go to the log line but not to the webhook.
    """

    event: ReportEvent
    level: Level
    fields: Mapping[str, Any]
    log_only: Mapping[str, Any] | None = None

    @property
    def notify(self) -> NotifyEvent | None:
        """H1: the webhook this report sends (a `NotifyEvent`), or None."""
        return notify_event(self.event)


Effect = (
    Capture
    | Resolve
    | QueueRestart
    | RunRestart
    | RunAbort
    | Recovered
    | CheckListener
    | ResetDetector
    | Persist
    | Report
)


@immutable
class EpisodeStep:
    """The state after one input and the effects it asks for, in order."""

    state: EpisodeState
    effects: tuple[Effect, ...] = ()
