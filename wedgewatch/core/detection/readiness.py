"""The readiness verdict: whether a watched server should receive traffic now (`/ready`).

Liveness (`core.probe_policy`) asks "should the kubelet restart this container?" and follows
the restart budget: it passes again once the budget is spent (`gave_up`), in a backoff, or
during a restart's grace. Readiness asks a different question, "would a request sent here be
served?", and answers it from the target's state alone: a wedged replica, a given-up one, one
that cannot be read or that is loading after a restart takes no traffic, whatever the budget
says. Pure: the inputs are plain values, the result is data.

# RULES (tests/core/test_readiness.py checks them row by row)
#
#   D1  No good scrape of the server yet (state `starting`: wedgewatch just started, the
#       server is loading, or a restart has not shown a new server yet): not ready,
#       decision `starting`.
#   D2  The restart policy is restarting the server or waiting for the new one (phase
#       restarting or starting): not ready, decision `restarting`.
#   D3  Some engine is wedged: not ready, decision `wedged`; with the budget spent,
#       decision `gave_up` (the wedge stays until someone acts).
#   D4  The server is unreachable (past unreachable_after_seconds, or never answered within
#       startup_timeout_seconds): not ready, decision `unreachable` (`gave_up` likewise).
#   D5  The budget is spent (`gave_up`) and the target is not calm (suspect, unknown): not
#       ready, decision `gave_up`: only a calm server shows the wedge has cleared.
#   D6  Otherwise ready, decision `ready`: ok, idle, sleeping, suspect (a stall not judged
#       yet: it may clear within its threshold) and unknown (non-finite values, several
#       servers behind the URL: nothing proves the replica cannot serve; the
#       WedgeWatchTargetUnknown alert tells a human).
"""

from __future__ import annotations

from typing import Any, Literal

from wedgewatch.core.detection.states import CALM, EngineState
from wedgewatch.core.values import immutable

ReadyDecision = Literal["ready", "starting", "restarting", "wedged", "unreachable", "gave_up"]


@immutable
class ReadyVerdict:
    """What `/ready` answers: ready or not, which decision, and one sentence why."""

    ready: bool
    decision: ReadyDecision
    detail: str

    def to_json(self) -> dict[str, Any]:
        """The verdict as the body of `/ready` shows it."""
        return {"ready": self.ready, "decision": self.decision, "detail": self.detail}


def ready_verdict(state: str, *, gave_up: bool, restarting: bool) -> ReadyVerdict:
    """Rules D1-D6 for a target in `state` (the worst engine state, `core.states`).

    `gave_up`: the restart budget is spent; `restarting`: the restart policy is restarting
    the server or waiting for the new one to answer.
    """
    if restarting:  # D2 (before D1: a restarted server reads `starting` too)
        return ReadyVerdict(False, "restarting", "the server is being restarted")
    if state == EngineState.STARTING:  # D1
        return ReadyVerdict(False, "starting", "no good scrape of the server yet (starting)")
    if state in (EngineState.WEDGED, EngineState.UNREACHABLE):  # D3, D4
        if gave_up:
            return ReadyVerdict(
                False,
                "gave_up",
                f"{state}, and the restart budget is spent: nothing restarts it until someone acts",
            )
        decision: ReadyDecision = "wedged" if state == EngineState.WEDGED else "unreachable"
        return ReadyVerdict(False, decision, f"{state}: requests sent here would not be served")
    if gave_up and state not in CALM:  # D5
        return ReadyVerdict(
            False,
            "gave_up",
            f"{state} after the restart budget was spent: out until the server is calm again",
        )
    return ReadyVerdict(True, "ready", str(state))  # D6
