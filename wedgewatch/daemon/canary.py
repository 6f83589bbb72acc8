"""One target's canary in the daemon: sends at most one at a time, as `core.canary` decides.

The shell only performs: `core.canary.decide` says when, `io.canary` (behind the
`CanarySender` role) sends, `core.canary.judge` says what the outcome means, and the
standing stall goes into the detector as rule K1's input. A canary runs as its own task,
never in the target's worker, so a 120 s canary never delays evidence or a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import structlog

from wedgewatch.core.detection import canary as core
from wedgewatch.core.detection.detect import (
    CanaryStall,
    DetectionPolicy,
    Observation,
    TargetState,
    TargetVerdict,
)
from wedgewatch.core.detection.detect import step as detect_step
from wedgewatch.daemon.ownmetrics import OwnMetrics
from wedgewatch.daemon.roles import CanarySender, Clock, Deps

if TYPE_CHECKING:
    from wedgewatch.config import Config, Target

log = structlog.get_logger("wedgewatch.daemon")


class TargetCanary:
    """The canary of one target: its core state, its in-flight task, its latest outcome."""

    def __init__(
        self,
        target: Target,
        policy: core.CanaryPolicy,
        sender: CanarySender | None,
        metrics: OwnMetrics,
        clock: Clock,
    ) -> None:
        self.target = target
        self.policy = policy
        self.sender = sender
        self.metrics = metrics
        self.clock = clock
        self.state = core.CanaryState()
        self.task: asyncio.Task[None] | None = None
        self.sent = 0  # canaries sent by this process
        self.last: Mapping[str, Any] | None = None  # the latest finished canary, for /status
        self.busy: Callable[[], str | None] = lambda: None  # what the target's worker runs

    @classmethod
    def of(
        cls,
        target: Target,
        config: Config,
        deps: Deps,
        metrics: OwnMetrics,
        busy: Callable[[], str | None],
    ) -> TargetCanary:
        """The canary of `target`; `busy` says what the target's worker runs (a "restart")."""
        canary = cls(target, config.canary_policy(), deps.canary, metrics, deps.clock)
        canary.busy = busy
        return canary

    @property
    def on(self) -> bool:
        """The canary is configured and there is a sender for it."""
        return self.policy.enabled and self.sender is not None

    @property
    def stall(self) -> CanaryStall | None:
        """The standing canary stall (rule K1's input), None when there is none or it is off."""
        return self.state.stall if self.on else None

    def note(self, verdict: TargetVerdict) -> None:
        """Rule N1: fold one verdict in (progress seen clears a standing stall)."""
        if self.on:
            self.state = core.note(self.state, verdict)

    def after(self, verdict: TargetVerdict, now_at: float, *, restarting: bool) -> None:
        """After a scrape was judged: note it (N1), then send a canary if the core says so."""
        self.note(verdict)
        self.maybe_send(verdict, now_at, restarting=restarting)

    def maybe_send(self, verdict: TargetVerdict, now_at: float, *, restarting: bool) -> None:
        """Rule S1/S2: send a canary now if the core says so."""
        sender = self.sender
        if sender is None or not self.on:
            return
        decision = core.decide(self.state, self.policy, verdict, now_at, restarting=restarting)
        if not decision.send:
            return
        self.state = core.sent(self.state, now_at)
        self.sent += 1
        log.debug("canary_sent", target=self.target.name, reason=decision.reason)
        self.task = asyncio.get_running_loop().create_task(
            self._run(sender, now_at), name=f"wedgewatch-canary-{self.target.name}"
        )

    def reset(self) -> None:
        """Rule R1: the server was restarted; forget the canary (and drop one in flight)."""
        self.cancel()
        self.state = core.reset()

    def cancel(self) -> None:
        """Drop a canary in flight (shutdown, restart)."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        self.task = None
        self.state = core.CanaryState(
            quiet_since=self.state.quiet_since, mark=self.state.mark, stall=self.state.stall
        )

    def snapshot(self) -> Mapping[str, Any] | None:
        """The canary's part of `/status` (None when the canary is off)."""
        if not self.on:
            return None
        state, wall_of = self.state, self._wall_of
        return {
            "interval_seconds": self.policy.interval_seconds,
            "timeout_seconds": self.policy.timeout_seconds,
            "sent": self.sent,
            "in_flight_since_timestamp": wall_of(state.in_flight_since),
            "stall_since_timestamp": wall_of(state.stall.since_at if state.stall else None),
            "last_success_timestamp": wall_of(state.last_success_at),
            "last": dict(self.last) if self.last else None,
        }

    def detect(
        self, state: TargetState, observation: Observation, policy: DetectionPolicy
    ) -> tuple[TargetState, TargetVerdict]:
        """`detect.step` with the standing canary stall as rule K1's input, then the canary.

        The verdict is noted (N1) and a canary sent if the core says so (S1), never while the
        target's worker runs a restart. A fresh detector state (reset after a restart of the
        server) means a fresh canary too (rule R1): the old server's stall and its canary in
        flight are forgotten before the new server is judged.
        """
        fresh = state.last_at is None and state == TargetState.initial()  # none observed yet
        if fresh and (self.state != core.CanaryState() or self.task):
            self.reset()
        state, verdict = detect_step(state, observation, policy, self.stall)
        self.after(verdict, verdict.at, restarting=self.busy() == "restart")
        return state, verdict

    def add_to(self, summary: Mapping[str, Any]) -> Mapping[str, Any]:
        """An evidence bundle's verdict summary with the canary's part (when it is on)."""
        snapshot = self.snapshot()
        return summary if snapshot is None else {**summary, "canary": snapshot}

    def _wall_of(self, at: float | None) -> float | None:
        if at is None:
            return None
        return round(self.clock.wall() - (self.clock.monotonic() - at), 3)

    async def _run(self, sender: CanarySender, sent_at: float) -> None:
        name = self.target.name
        try:
            result = await sender.send(self.target, sent_at)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the adapter must not leave a canary "in flight"
            log.exception("canary_error", target=name, error=repr(exc))
            result = core.CanaryResult(sent_at, None, 0.0, "connect_error", repr(exc))
        self.state, judgement = core.judge(self.state, self.policy, result)
        self.task = None
        ok = judgement.verdict == "ok"
        self.metrics.observe_canary(
            name,
            first_token_seconds=result.first_token_seconds,
            failure_reason=None if ok else result.reason,
            success_timestamp=self._wall_of(self.state.last_success_at) if ok else None,
        )
        self.last = {
            "verdict": judgement.verdict,
            "reason": judgement.reason,
            "first_token_seconds": result.first_token_seconds,
            "total_seconds": round(result.total_seconds, 3),
            "failure": result.reason,
            "detail": result.detail or None,
            "sent_timestamp": self._wall_of(sent_at),
        }
        fields = {"target": name, "verdict": judgement.verdict, "reason": judgement.reason}
        if judgement.verdict == "stall":
            log.warning("canary_stall", **fields)
        elif not ok:
            log.info("canary_failed", failure=result.reason, detail=result.detail, **fields)
        else:
            log.debug("canary_ok", first_token_seconds=result.first_token_seconds, **fields)
