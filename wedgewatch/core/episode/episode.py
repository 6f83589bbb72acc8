"""The episode core: what the daemon does about one target's stall, as a pure state machine.

No IO and no clock: every input comes with `at` (monotonic seconds) and `timestamp` (Unix
seconds). `step` folds one input into the target's `EpisodeState` and returns the new state
with the effects the shell must carry out, in order (capture evidence, restart, notify,
persist). The detector (`detect.step`) says what an engine is; this module decides what to do
about it; the remedy subsystem (`core.restart.remedy`, its one face: restart policy, probe
and cure ladder behind it) decides whether and how the server is cured now.
"""

# RULES (the contract of this module; tests/core/test_episode.py checks them row by row)
# ====================================================================================
#
# Terms
#   stalled      an engine state in SUSPECT, WEDGED, UNREACHABLE (detector rule A1/A2 terms).
#   acted on     a target state in WEDGED, UNREACHABLE: the states a restart is for.
#   calm         the verdict has engines and every one is ok, idle or sleeping (an unknown
#                engine, NaN readings or several servers behind the URL, is not calm).
#   episode      one per target: from the first stalled engine until all engines are calm
#                (or a restart resolves). It holds at most one evidence bundle and asks for
#                at most one restart; a remedy that failed is retried inside it.
#   the queue    the shell runs Capture, Resolve and QueueRestart effects of one target in
#                order, one at a time (a per-target worker); evidence therefore always runs
#                before the restart queued behind it, whatever the capture's outcome.
#
# Inputs                      Rule
#   Observed(verdict)          T1  every engine transition is Reported, before the rules below:
#                                  to SUSPECT from a calm state stall_suspected; to WEDGED
#                                  wedge_detected; to UNREACHABLE target_unreachable; from a
#                                  stalled to a calm state engine_recovered; to UNKNOWN
#                                  engine_unknown; from STARTING engine_discovered; else
#                                  engine_state_changed. A target with no engines that becomes
#                                  UNREACHABLE (no good scrape within the startup timeout):
#                                  target_unreachable.
#                              (the shell drops an observation begun before `ignore_before_at`:
#                              S0 `is_stale`, it saw the server a restart just replaced)
#                              E1  no episode and some engine stalled: open one on the worst
#                                  engine (wedged first, then by key); id `<UTC>-<target>-
#                                  e<engine>-<family>`; Report episode_opened; Persist soon.
#                                  The rest of E2 is skipped on that step.
#                              E2  episode open, verdict calm, policy not restarting/starting:
#                                  close it "recovered"; when the suspect capture was asked and
#                                  the wedged one was not, Resolve its bundle (queued behind the
#                                  capture, so it sees the finished bundle).
#                              E3  episode open and the scrape failed: remember the reason.
#                              C1  CaptureEvidence(suspect), no capture asked in the episode:
#                                  Capture(suspect), which opens the bundle, and remember when.
#                              C4  ... unless the target's last suspect capture is less than
#                                  `suspect_capture_min_interval_seconds` (> 0) ago: no capture;
#                                  Report suspect_capture_skipped once per episode. A wedge
#                                  then gets a one-shot bundle (C2).
#                              C2  CaptureEvidence(wedged), not asked yet: Capture(wedged), which
#                                  completes the bundle the suspect capture opened (if any).
#                              R1  Restart, not asked yet in the episode: restart asked. No
#                                  restarter (remedy "none"): Report restart_skipped, nothing
#                                  else. Otherwise QueueRestart (behind the captures, A3).
#                              P1  a good scrape: armed/gave_up: remember its `identity`.
#                                  Starting (N1): judged against the server to replace
#                                  (`core.replacement`): Replaced -> record_good_scrape(proof)
#                                  (P*); NotReplaced -> keep why (not_replaced), and
#                                  CheckListener once when the old listener is known.
#                              P2  always, with Q1 in one `core.probe_step.step` (the step
#                                  `check --state-file` takes too): policy.record_tick(healthy =
#                                  calm, not_replaced) (not_recovered, not_replaced,
#                                  backoff_reset, gave_up_cleared: rule P*).
#                              R4  a restart is pending (R2 backoff, R3 failure), the worker is
#                                  idle and the backoff has passed: still acted on ->
#                                  QueueRestart for the worst acted-on engine; else drop it.
#   RestartDue(key, ...)       R2  the worker reached a queued restart. The latest verdict is no
#                                  longer acted on: Report restart_skipped (recovered).
#                              W1  unreachable, refused, and the supervisor restarts it
#                                  (`supervisor`): no restart; restart_waiting once per wait;
#                                  R4 asks again after SUPERVISOR_POLL_SECONDS. Else
#                                  policy.decide: Deny backoff -> pending (R4 retries it),
#                                  Report restart_deferred; other Deny -> Report restart_skipped
#                                  (unless it just gave up: the gave_up event says why); Allow ->
#                                  RunRestart(attempt), Report restart_requested and Persist now
#                                  (the attempt counts against the budget even if wedgewatch
#                                  dies during it).
#   RestartDone(outcome)       R3  policy.record_restart. ok: ResetDetector (the startup grace:
#                                  the detector reports starting until the first good scrape),
#                                  ignore scrapes begun before now (S0), remember the server to
#                                  replace (identity + `listener`; N1), restart_completed. Failed
#                                  (remedy_error, timeout, not_vllm): the server is still the
#                                  stalled one, the restart becomes pending (R4, within the
#                                  budget). Persist now either way.
#   CaptureDone(...)           C3  a bundle path becomes the target's last bundle and, when the
#                                  episode is still the one asked for, the episode's bundle and
#                                  triage; Report evidence_captured. Failures: Report
#                                  evidence_capture_failed; nothing else (never block R2).
#   ListenerSeen(pid, created) N2  the port's listener after a restart: kept for the next P1.
#   OperatorReset              O1  policy.reset (budget_reset or gave_up_cleared).
#   Observed (with P2)         Q1  the liveness probe (core.probe_policy R2-R4, P1-P3): count a
#                                  proven probe restart (restart_succeeded, probe_restart) before
#                                  P2's tick, then keep what /probe answers until the next scrape.
#   ProbeServed(mark)          Q2  /probe sent a 503 about the server `mark` (R1); Persist soon.
#
# The remedy subsystem (`core.restart.remedy`, its one face): every input above that concerns
#   the restart policy, the probe or the cure ladder is one `remedy.step` call (Observed: one
#   Scrape fact with P1's proof, P2, Q1; RestartDue: CureDue; RestartDone, ProbeServed,
#   OperatorReset, AbortDone: their facts). The rules below are the episode's side of it.
#
# The cure ladder (`core.restart.ladder`, rules L1-L6; with `abort_first`)
#   K1  every cure that ends is kept in `recoveries` (newest last, 10 kept; /status) and
#       counted (`Recovered`): an abort recovered / failed / escalated, a restart whose new
#       server answered (recovered) or never came (failed); `seconds` from the wedged verdict
#       (R1) to serving again.
#   K2  R1 with abort_first (and a remedy other than "none") always queues the cure behind
#       the captures; at RestartDue the ladder decides: RunAbort (Persist now,
#       abort_requested), or the restart rung (R2 as before; "probe": the kubelet via /probe);
#       abort_skipped says why the abort rung was passed over.
#   K3  AbortDone: the call's result (vLLM's count, the canary). While an abort is proven E2
#       does not close the episode; a proof closes it "recovered" (abort_succeeded).
#   K4  an abort that failed or did not cure: abort_failed, and a restart is queued (when a
#       restarter exists; it runs only while the verdict is still acted on, R2).
#
# Notify (H1): a Report sends a webhook exactly when its event is a `NotifyEvent`
# (core/detection/states.py):
#   `episode_types.notify_event` maps every `ReportEvent` (the closed set of reported events).
#
# Policy events (P*), whatever input caused them
#   Every event is Reported with the target's state and the episode's
#   engine, family and bundle, and the state is Persisted soon.
#   restart_failed: kept as last_restart_failure (/status); not_recovered / not_replaced:
#   clear S0 and close the episode "restart_failed".
#   restart_failed remedy_error/timeout/not_vllm: the restart becomes pending (R4).
#   restart_succeeded: close the episode "restarted".
#
# Persistence (S1, `core.episode_store`): `saved` keeps the policy and the open episode;
#   `restored` brings the episode back only with the detector state (same boot), so a
#   restored wedge emits no second capture or restart; a restored episode with a bundle
#   counts its suspect capture as asked. The detector state is trusted only when it was
#   saved for the same URL in the same boot (`trusted_detector`, `same_boot`).
#
# Extension points: a new fact about a restart or a capture is a new input (or a field of
#   RestartDone / CaptureDone) with its own rule row; a new thing to do is a new effect that
#   the shell's effect runner performs. Rules never read the world.

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, assert_never

from wedgewatch.core.detection.detect import CaptureEvidence, Restart, TargetVerdict
from wedgewatch.core.detection.states import ACTED_ON, CALM, STALLED, CapturePhase, EngineState
from wedgewatch.core.episode.episode_types import (
    RECOVERIES_KEPT,
    AbortDone,
    Capture,
    CaptureDone,
    CheckListener,
    Effect,
    Episode,
    EpisodeState,
    EpisodeStep,
    Input,
    Level,
    ListenerSeen,
    Observed,
    OperatorReset,
    Persist,
    ProbeServed,
    QueueRestart,
    Recovered,
    Recovery,
    Report,
    ResetDetector,
    Resolve,
    RestartDone,
    RestartDue,
    Rules,
    RunAbort,
    RunRestart,
)
from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.episode.transitions import transition_reports
from wedgewatch.core.restart import remedy
from wedgewatch.core.restart.ladder import Outcome, Rung
from wedgewatch.core.restart.replacement import (
    NotReplaced,
    ServerIdentity,
    judge_replacement,
    with_listener,
)
from wedgewatch.vllm.signals import EngineKey

__all__ = [
    "ACTED_ON",
    "CALM",
    "STALLED",
    "AbortDone",
    "Capture",
    "CaptureDone",
    "CheckListener",
    "Effect",
    "Episode",
    "EpisodeState",
    "EpisodeStep",
    "Input",
    "ListenerSeen",
    "Observed",
    "OperatorReset",
    "Persist",
    "ProbeServed",
    "QueueRestart",
    "Recovered",
    "Recovery",
    "Report",
    "ReportEvent",
    "ResetDetector",
    "Resolve",
    "RestartDone",
    "RestartDue",
    "Rules",
    "RunAbort",
    "RunRestart",
    "episode_id",
    "is_stale",
    "step",
]

# W1: how often the supervisor is asked again while it restarts the server itself.
SUPERVISOR_POLL_SECONDS = 5.0


# ---------------------------------------------------------------------------------------------
# The rules


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def episode_id(target: str, key: EngineKey, family: str, timestamp: float) -> str:
    """`20260101T120000Z-<target>-e<engine>-<family>`, safe as a directory name."""
    stamp = dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    parts = (stamp, target, f"e{key.engine}", family)
    return "-".join(_UNSAFE.sub("_", p).strip("_") or "_" for p in parts)


def is_stale(state: EpisodeState, observation_at: float) -> bool:
    """S0: a scrape begun before the last restart finished saw the old server."""
    return state.ignore_before_at is not None and observation_at < state.ignore_before_at


def step(
    state: EpisodeState, event: Input, rules: Rules, at: float, timestamp: float
) -> EpisodeStep:
    """Fold one input into the target's episode state; see the rules at the top."""
    run = _StepDraft(state, rules, at, timestamp)
    if isinstance(event, Observed):
        run.observed(event)
    elif isinstance(event, CaptureDone):
        run.capture_done(event)
    elif isinstance(event, RestartDue):
        run.restart_due(event)
    elif isinstance(event, RestartDone):
        run.restart_done(event)
    elif isinstance(event, AbortDone):
        run.abort_done(event)
    elif isinstance(event, ProbeServed):  # Q2
        run.remedy_step(remedy.ProbeServed(event.mark))
        run.effects.append(Persist())
    elif isinstance(event, ListenerSeen):
        run.listener_seen(event)
    else:
        run.remedy_step(remedy.OperatorReset())  # O1
    return EpisodeStep(run.state, tuple(run.effects))


class _StepDraft:
    """One `step`: the state being built and the effects asked so far (private, short-lived)."""

    def __init__(self, state: EpisodeState, rules: Rules, at: float, timestamp: float) -> None:
        self.state = state
        self.rules = rules
        self.at = at
        self.timestamp = timestamp
        self.effects: list[Effect] = []

    # -- helpers --------------------------------------------------------------------------

    def report(
        self,
        event: ReportEvent,
        level: Level,
        log_only: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        self.effects.append(Report(event, level, {"target": self.rules.target, **fields}, log_only))

    def set_episode(self, episode: Episode | None) -> None:
        self.state = replace(self.state, episode=episode)

    def update_episode(self, **changes: Any) -> None:
        episode = self.state.episode
        if episode is not None:
            self.set_episode(replace(episode, **changes))

    # -- Observed ---------------------------------------------------------------------------

    def observed(self, event: Observed) -> None:
        verdict = event.verdict
        for name, level, fields in transition_reports(self.state, verdict, self.rules, self.at):
            self.report(name, level, **fields)  # T1
        self.state = replace(self.state, verdict=verdict)
        self.track_episode(verdict)
        if self.state.episode is not None and verdict.failure is not None:
            self.update_episode(scrape_failure=verdict.failure.reason)  # E3
        wedged_family: str | None = None
        for action in verdict.actions:
            asked = self.on_action(verdict, action)
            wedged_family = asked or wedged_family
        proof = self.good_scrape(event.identity) if event.good else None  # P1
        self.remedy_scrape(event, wedged_family, proof)  # P2, Q1, K2-K4
        if event.worker_idle:
            self.retry_restart(verdict)

    def remedy_scrape(self, event: Observed, wedged_family: str | None, proof: str | None) -> None:
        """P1 (a new server), P2 and Q1 (the probe step `check` takes too), K2-K4 (the
        ladder): the one call into the remedy subsystem for a judged scrape."""
        verdict = event.verdict
        starting = self.state.policy.phase is remedy.Phase.STARTING
        scrape = remedy.ProbeScrape(
            target_state=verdict.state,
            healthy=bool(verdict.engines) and verdict.state in CALM,
            scraped=event.good,
            mark=event.mark,
            not_replaced=self.state.not_replaced if starting else None,
        )
        done = self.remedy_step(
            remedy.Scrape(
                scrape,
                engines=tuple(e.state for e in verdict.engines),
                episode_open=self.state.episode is not None,
                wedged_family=wedged_family,
                new_server=proof,
            )
        )
        if done.probe is not None and done.probe != self.state.probe_answer:
            self.state = replace(self.state, probe_answer=done.probe)

    def good_scrape(self, identity: ServerIdentity | None) -> str | None:
        """P1 and N1: a good scrape ends the startup grace only from a new server: the
        proof that it is one (for the remedy subsystem), or None."""
        phase = self.state.policy.phase
        if phase in (remedy.Phase.ARMED, remedy.Phase.GAVE_UP):
            if identity is not None and identity != self.state.server:
                self.state = replace(self.state, server=identity)
            return None
        if phase is not remedy.Phase.STARTING:
            return None
        old = self.state.old_server or ServerIdentity()
        judged = judge_replacement(old, with_listener(identity, self.state.listener_after))
        if isinstance(judged, NotReplaced):
            self.state = replace(self.state, not_replaced=judged.reason)
            if old.listener_pid is not None and not self.state.listener_check:
                self.state = replace(self.state, listener_check=True)
                self.effects.append(CheckListener())
            return None
        self.state = replace(
            self.state, server=identity, old_server=None, not_replaced=None, listener_after=None
        )
        return judged.proof or ""

    # -- the remedy subsystem (core.restart.remedy): one call per input --------------------

    def remedy_step(self, fact: remedy.Fact) -> remedy.RemedyStep:
        """Hand one fact to the remedy subsystem; keep its state, report its events and notes."""
        state = self.state
        before = remedy.RemedyState(state.policy, state.probe, state.ladder)
        done = remedy.step(before, fact, self.remedy_config, self.at, self.timestamp)
        after = done.state
        if (after.policy, after.probe, after.ladder) != (state.policy, state.probe, state.ladder):
            self.state = replace(state, policy=after.policy, probe=after.probe, ladder=after.ladder)
        if after.probe != before.probe:
            self.effects.append(Persist())
        self.policy_events(done.events)
        for note in done.notes:
            self.cure_note(note)
        return done

    @property
    def remedy_config(self) -> remedy.RemedyConfig:
        """The remedy subsystem's slice of the rules."""
        rules = self.rules
        return remedy.RemedyConfig(
            policy=rules.restart_policy,
            remedy=rules.remedy,
            can_restart=rules.can_restart,
            respects_budget=rules.probe_respects_budget,
            abort_first=rules.abort_first,
            abort_proof_seconds=rules.abort_proof_seconds,
        )

    def cure_note(self, note: remedy.CureNote) -> None:
        """K2-K4: report a fact of the cure ladder; a judged abort is a recovery (K1), and
        one that did not cure escalates to the restart rung."""
        episode = self.state.episode
        fields: dict[str, Any] = {"detail": note.detail}
        if episode is not None:
            fields.update(episode=episode.episode_id, family=episode.family, bundle=episode.bundle)
        if note.outcome is None:
            if note.rung is Rung.RESTART:
                self.report(ReportEvent.ABORT_SKIPPED, "info", **fields)
            return  # abort_requested is reported with the RunAbort (R2)
        self.record_recovery(note.rung, note.outcome, note.seconds, note.detail, note.aborted)
        fields.update(aborted=note.aborted, outcome=str(note.outcome))
        if note.outcome is Outcome.RECOVERED:
            fields["seconds"] = None if note.seconds is None else round(note.seconds, 3)
            self.report(ReportEvent.ABORT_SUCCEEDED, "info", **fields)
            self.close("recovered")
            return
        self.report(ReportEvent.ABORT_FAILED, "warning", **fields)
        self.effects.append(Persist())
        if episode is None or not self.rules.can_restart:
            return  # remedy = "probe": /probe now asks the kubelet (rule P1a no longer holds)
        verdict = self.state.verdict
        worst = next((e for e in verdict.engines if e.state in ACTED_ON), None) if verdict else None
        key = worst.key if worst is not None else episode.key
        reason = worst.reason if worst is not None else episode.family
        self.effects.append(QueueRestart(key, episode.family, reason))

    def record_recovery(
        self,
        cure: Rung,
        outcome: Outcome,
        seconds: float | None,
        detail: str,
        aborted: int | None = None,
    ) -> None:
        """K1: keep how a cure ended (newest last, bounded) and have it counted."""
        episode = self.state.episode
        recovery = Recovery(
            cure=cure,
            outcome=outcome,
            seconds=seconds,
            timestamp=self.timestamp,
            episode=episode.episode_id if episode is not None else None,
            detail=detail,
            aborted=aborted,
        )
        kept = (*self.state.recoveries, recovery)[-RECOVERIES_KEPT:]
        self.state = replace(self.state, recoveries=kept)
        self.effects.append(Recovered(recovery))

    def listener_seen(self, event: ListenerSeen) -> None:  # N2
        seen = None if event.pid is None else (event.pid, event.create_time)
        self.state = replace(self.state, listener_check=False, listener_after=seen)

    def track_episode(self, verdict: TargetVerdict) -> None:
        stalled = [e for e in verdict.engines if e.state in STALLED]
        episode = self.state.episode
        if episode is None and stalled:  # E1
            worst = min(stalled, key=lambda e: (e.state is not EngineState.WEDGED, e.key))
            family = str(worst.family) if worst.family else "unknown"
            opened = Episode(
                episode_id=episode_id(self.rules.target, worst.key, family, self.timestamp),
                key=worst.key,
                family=family,
                opened_at=self.at,
                opened_timestamp=self.timestamp,
            )
            self.set_episode(opened)
            self.effects.append(Persist())
            self.report(
                ReportEvent.EPISODE_OPENED,
                "info",
                episode=opened.episode_id,
                engine=worst.key.engine,
                model_name=worst.key.model_name,
                family=family,
            )
            return
        restart_phases = (remedy.Phase.RESTARTING, remedy.Phase.STARTING)
        # Unknown (non-finite values, several servers) is not calm: the episode stays open.
        calm = bool(verdict.engines) and all(e.state in CALM for e in verdict.engines)
        proving = self.state.ladder.abort is not None  # K3 judges an abort's episode
        if (
            episode is not None
            and calm
            and self.state.policy.phase not in restart_phases
            and not proving
        ):
            self.close("recovered")  # E2

    def close(self, outcome: str) -> None:
        episode = self.state.episode
        if episode is None:
            return
        self.report(
            ReportEvent.EPISODE_CLOSED,
            "info",
            episode=episode.episode_id,
            outcome=outcome,
            duration_seconds=round(self.at - episode.opened_at, 3),
            bundle=episode.bundle,
        )
        if outcome == "recovered" and episode.suspect_asked and not episode.wedged_asked:
            self.effects.append(Resolve(episode.bundle, "the engine recovered"))
        self.set_episode(None)
        self.state = replace(self.state, waiting_for_supervisor=None)
        self.effects.append(Persist())

    def on_action(self, verdict: TargetVerdict, action: CaptureEvidence | Restart) -> str | None:
        """C1, C2, C4 and R1; the family of the wedge when R1 asked for its cure now."""
        episode = self.state.episode
        if episode is None:  # an action always comes with a stalled engine, hence an episode
            return None
        if isinstance(action, CaptureEvidence):
            if action.phase == CapturePhase.SUSPECT:  # C1
                if episode.suspect_asked or episode.wedged_asked:
                    return None
                if self.suspect_capture_too_soon(episode):  # C4
                    return None
                self.update_episode(suspect_asked=True)
                self.state = replace(self.state, last_suspect_capture_at=self.at)
            else:  # C2
                if episode.wedged_asked:
                    return None
                self.update_episode(wedged_asked=True)
            self.effects.append(
                Capture(action.phase, action.key, str(action.family), episode.episode_id, self.at)
            )
            return None
        if episode.restart_asked:  # R1
            return None
        self.update_episode(restart_asked=True, wedged_at=self.at)
        engine = next((e for e in verdict.engines if e.key == action.key), None)
        reason = engine.reason if engine is not None else str(action.family)
        family = str(action.family)
        if self.rules.abort_first and self.rules.remedy != "none":  # K2: the ladder decides
            self.effects.append(QueueRestart(action.key, family, reason))
            return family
        if not self.rules.can_restart:
            why = {
                "none": 'remedy = "none" (observe mode): reporting only',
                "probe": 'remedy = "probe": /probe fails and the kubelet restarts the server',
            }.get(self.rules.remedy, f"no {self.rules.remedy} restarter for this target")
            self.report(ReportEvent.RESTART_SKIPPED, "info", episode=episode.episode_id, reason=why)
            return family
        self.effects.append(QueueRestart(action.key, family, reason))
        return family

    def suspect_capture_too_soon(self, episode: Episode) -> bool:
        why = suspect_rate_limited(self.rules, self.state, self.at)
        if why is not None and not episode.suspect_skipped:  # once, not every tick
            self.update_episode(suspect_skipped=True)
            self.report(
                ReportEvent.SUSPECT_CAPTURE_SKIPPED, "info", episode=episode.episode_id, reason=why
            )
        return why is not None

    def retry_restart(self, verdict: TargetVerdict) -> None:
        episode = self.state.episode
        if episode is None or episode.restart_pending_since is None:  # R4
            return
        not_before = self.state.policy.not_before_at
        if not_before is not None and self.at < not_before:
            return
        if episode.supervisor_retry_at is not None and self.at < episode.supervisor_retry_at:
            return  # W1: the supervisor is asked again later
        self.update_episode(restart_pending_since=None, supervisor_retry_at=None)
        if verdict.state not in ACTED_ON:
            return
        worst = next((e for e in verdict.engines if e.state in ACTED_ON), None)
        key = worst.key if worst is not None else episode.key
        reason = worst.reason if worst is not None else episode.family
        self.effects.append(QueueRestart(key, episode.family, reason))

    # -- the worker's inputs --------------------------------------------------------------

    def capture_done(self, event: CaptureDone) -> None:  # C3
        if event.bundle is not None:
            self.state = replace(self.state, last_bundle=event.bundle)
            episode = self.state.episode
            if episode is not None and episode.episode_id == event.episode_id:
                self.update_episode(
                    bundle=event.bundle,
                    triage=event.triage or episode.triage,
                    triage_kind=event.triage_kind or episode.triage_kind,
                )
            self.effects.append(Persist())
        failure = self.state.episode.scrape_failure if self.state.episode else None
        for name, level, more, fields in capture_reports(event, failure):
            self.report(name, level, log_only=more, **fields)

    def restart_due(self, event: RestartDue) -> None:  # R2
        verdict = self.state.verdict
        if verdict is None or verdict.state not in ACTED_ON:
            self.report(
                ReportEvent.RESTART_SKIPPED,
                "info",
                reason="the target recovered before the restart could run",
            )
            return
        refused = verdict.failure is not None and verdict.failure.reason == "refused"
        if verdict.state is EngineState.UNREACHABLE and refused and event.supervisor is not None:
            if self.state.waiting_for_supervisor is None:  # W1
                self.report(ReportEvent.RESTART_WAITING, "info", reason=event.supervisor)
            self.state = replace(self.state, waiting_for_supervisor=event.supervisor)
            self.update_episode(
                restart_pending_since=self.at,
                supervisor_retry_at=self.at + SUPERVISOR_POLL_SECONDS,
            )
            return
        self.state = replace(self.state, waiting_for_supervisor=None)
        episode = self.state.episode
        triage_kind = episode.triage_kind if episode is not None else None
        done = self.remedy_step(remedy.CureDue(event.family, triage_kind))
        decision = done.action
        if isinstance(decision, remedy.RunAbort):  # K2: the abort rung
            self.effects.append(Persist(now=True))
            self.effects.append(
                RunAbort(event.key, event.family, event.reason, decision.proof_seconds)
            )
            self.report(
                ReportEvent.ABORT_REQUESTED,
                "warning",
                episode=episode.episode_id if episode is not None else None,
                family=event.family,
                engine=event.key.engine,
                model_name=event.key.model_name,
                server_pid=event.server_pid,
                triage=triage_kind,
                reason=event.reason,
                proof_seconds=decision.proof_seconds,
            )
            return
        if decision is None:
            if self.state.ladder.rung is not Rung.ABORT and not self.rules.can_restart:
                self.report(
                    ReportEvent.RESTART_SKIPPED,
                    "info",
                    reason='remedy = "probe": /probe fails and the kubelet restarts the server',
                )
            return
        if isinstance(decision, remedy.Deny):
            if decision.reason is remedy.DenyReason.BACKOFF and self.state.episode:
                self.update_episode(restart_pending_since=self.at)
                self.report(ReportEvent.RESTART_DEFERRED, "info", reason=decision.detail)
            elif not done.events:  # a fresh gave_up was just reported with its reason
                self.report(ReportEvent.RESTART_SKIPPED, "info", reason=decision.detail)
            return
        self.state = replace(self.state, restarts=self.state.restarts + 1)
        self.effects.append(Persist(now=True))
        self.effects.append(RunRestart(event.key, event.family, event.reason, decision.attempt))
        self.report(
            ReportEvent.RESTART_REQUESTED,
            "warning",
            **requested_fields(event, self.rules, decision),
        )

    def restart_done(self, event: RestartDone) -> None:  # R3
        outcome = event.outcome
        self.remedy_step(remedy.RestartFinished(outcome))
        if outcome.ok:
            old = with_listener(self.state.server, event.listener)
            self.state = replace(
                self.state,
                ignore_before_at=self.at,
                old_server=old,
                not_replaced=None,
                listener_after=None,
                listener_check=False,
            )
            self.effects.append(ResetDetector())
            self.report(
                ReportEvent.RESTART_COMPLETED,
                "info",
                detail=outcome.detail,
                duration_seconds=round(outcome.duration_seconds, 3),
                waiting_up_to_seconds=self.rules.restart_policy.startup_timeout_seconds,
            )
        self.effects.append(Persist(now=True))

    def abort_done(self, event: AbortDone) -> None:  # K3, K4
        self.remedy_step(
            remedy.AbortFinished(event.ok, event.detail, event.aborted, event.canary_ok_at)
        )
        self.effects.append(Persist())

    # -- policy events (P*) ---------------------------------------------------------------

    def policy_events(self, events: tuple[remedy.PolicyEvent, ...]) -> None:
        for event in events:
            self.effects.append(Persist())
            fields: dict[str, Any] = {"reason": event.reason, "detail": event.detail}
            if self.state.verdict is not None:
                fields["state"] = str(self.state.verdict.state)
            episode = self.state.episode
            if episode is not None:
                fields.update(
                    episode=episode.episode_id,
                    engine=episode.key.engine,
                    model_name=episode.key.model_name,
                    family=episode.family,
                    bundle=episode.bundle,
                )
            match event.kind:
                case ReportEvent.RESTART_FAILED:
                    self.restart_failed(event, fields)
                case ReportEvent.RESTART_SUCCEEDED:
                    self.report(event.kind, "info", **fields)
                    self.restart_recovery(Outcome.RECOVERED, event.detail)
                    self.close("restarted")
                case ReportEvent.GAVE_UP:
                    self.report(event.kind, "error", **fields)
                case (
                    ReportEvent.GAVE_UP_CLEARED
                    | ReportEvent.BACKOFF_RESET
                    | ReportEvent.BUDGET_RESET
                ):
                    self.report(event.kind, "info", **fields)
                case _:
                    assert_never(event.kind)

    def restart_recovery(self, outcome: Outcome, detail: str) -> None:
        """K1: a restart's cure ended (a new server answered, or none came)."""
        episode = self.state.episode
        wedged_at = episode.wedged_at if episode is not None else None
        recovered = outcome is Outcome.RECOVERED and wedged_at is not None
        seconds = max(self.at - wedged_at, 0.0) if recovered and wedged_at is not None else None
        self.record_recovery(Rung.RESTART, outcome, seconds, detail)

    def restart_failed(self, event: remedy.PolicyEvent, fields: dict[str, Any]) -> None:
        """P*: keep the failure (/status); a server that never came (back) ends the episode."""
        failure = {"reason": event.reason, "detail": event.detail}
        self.state = replace(
            self.state, last_restart_failure={**failure, "timestamp": event.timestamp}
        )
        no_new_server = (
            remedy.FailureReason.NOT_RECOVERED,
            remedy.FailureReason.NOT_REPLACED,
        )
        if event.reason in no_new_server:
            self.report(ReportEvent.RESTART_FAILED, "error", **fields)
            self.restart_recovery(Outcome.FAILED, event.detail)
            self.state = replace(
                self.state,
                ignore_before_at=None,
                old_server=None,
                not_replaced=None,
                listener_after=None,
            )
            self.close("restart_failed")
        else:
            # The remedy itself failed (error, timeout): the server is still the
            # stalled one, so try again once the backoff allows, within the budget.
            retry = {"retry": "after the back-off"}
            self.report(ReportEvent.RESTART_FAILED, "error", log_only=retry, **fields)
            self.update_episode(restart_pending_since=event.at)


def suspect_rate_limited(rules: Rules, state: EpisodeState, at: float) -> str | None:
    """C4: why a suspect capture at `at` is skipped (the last was too recent), or None."""
    limit = rules.suspect_capture_min_interval_seconds
    last = state.last_suspect_capture_at
    if last is None or limit <= 0 or at - last >= limit:
        return None
    return (
        f"a suspect capture ran {at - last:.0f} s ago; at most one per {limit:g} s "
        "(suspect_capture_min_interval_seconds)"
    )


def capture_outcome(event: CaptureDone) -> str:
    """`complete`, `server_gone` (nothing to capture from: crashed or stopped, not a
    failure), `incomplete` (some step failed) or `failed` (no bundle)."""
    if event.bundle is None:
        return "failed"
    if event.failures:
        return "incomplete"
    return "server_gone" if event.server_gone else "complete"


def capture_reports(
    event: CaptureDone, scrape_failure: str | None
) -> list[tuple[ReportEvent, Level, dict[str, Any], dict[str, Any]]]:
    """C3: (event, level, log-only fields, fields) of evidence_captured / _capture_failed."""
    fields = {
        "episode": event.episode_id,
        "phase": str(event.phase),  # plain strings: a console log line shows a list's reprs
        "family": event.family,
        "engine": event.key.engine if event.key else "",
        "model_name": event.key.model_name if event.key else "",
        "bundle": event.bundle,
        "triage": event.triage,
        "scrape_failure": scrape_failure,
        "duration_seconds": round(event.duration_seconds, 3),
    }
    reports: list[tuple[ReportEvent, Level, dict[str, Any], dict[str, Any]]] = []
    if event.bundle is not None:
        more = {
            "outcome": capture_outcome(event),
            "failures": [str(f) for f in event.failures],
            "detail": event.detail or None,
        }
        reports.append((ReportEvent.EVIDENCE_CAPTURED, "info", more, fields))
    if event.failures:
        more = {"reasons": [str(f) for f in event.failures], "detail": event.detail}
        reports.append((ReportEvent.EVIDENCE_CAPTURE_FAILED, "warning", more, fields))
    return reports


def requested_fields(event: RestartDue, rules: Rules, decision: remedy.Allow) -> dict[str, Any]:
    """What the restart_requested report (R2) says."""
    return {
        "remedy": rules.remedy,
        "attempt": decision.attempt,
        "restart_budget": rules.restart_policy.restart_budget,
        "server_pid": event.server_pid,
        "family": event.family,
        "engine": event.key.engine,
        "model_name": event.key.model_name,
        "reason": event.reason,
    }
