"""Tests of the readiness verdict (pure; rules D1-D6 of core/detection/readiness.py), row by row."""

from __future__ import annotations

import pytest

from wedgewatch.core.detection.readiness import ready_verdict
from wedgewatch.core.detection.states import EngineState

# (target state, gave_up, restarting) -> (ready, decision)
TABLE = [
    pytest.param("starting", False, False, False, "starting", id="D1-starting"),
    pytest.param("starting", False, True, False, "restarting", id="D2-restart-grace"),
    pytest.param("wedged", False, True, False, "restarting", id="D2-restarting-wedged"),
    pytest.param("ok", False, True, False, "restarting", id="D2-restarting-ok"),
    pytest.param("wedged", False, False, False, "wedged", id="D3-wedged"),
    pytest.param("wedged", True, False, False, "gave_up", id="D3-wedged-gave-up"),
    pytest.param("unreachable", False, False, False, "unreachable", id="D4-unreachable"),
    pytest.param("unreachable", True, False, False, "gave_up", id="D4-unreachable-gave-up"),
    pytest.param("suspect", True, False, False, "gave_up", id="D5-suspect-gave-up"),
    pytest.param("unknown", True, False, False, "gave_up", id="D5-unknown-gave-up"),
    pytest.param("ok", True, False, True, "ready", id="D6-recovered-after-gave-up"),
    pytest.param("ok", False, False, True, "ready", id="D6-ok"),
    pytest.param("idle", False, False, True, "ready", id="D6-idle"),
    pytest.param("sleeping", False, False, True, "ready", id="D6-sleeping"),
    pytest.param("suspect", False, False, True, "ready", id="D6-suspect"),
    pytest.param("unknown", False, False, True, "ready", id="D6-unknown"),
]


@pytest.mark.parametrize(("state", "gave_up", "restarting", "ready", "decision"), TABLE)
def test_readiness_rules(
    state: str, gave_up: bool, restarting: bool, ready: bool, decision: str
) -> None:
    """Each row of D1-D6: ready or not, and the decision that says why."""
    verdict = ready_verdict(state, gave_up=gave_up, restarting=restarting)
    assert (verdict.ready, verdict.decision) == (ready, decision)
    assert verdict.detail
    assert verdict.to_json() == {"ready": ready, "decision": decision, "detail": verdict.detail}


def test_every_state_has_a_row() -> None:
    """The table covers every engine state, so a new state must be given a readiness."""
    covered = {row.values[0] for row in TABLE}
    assert covered == {str(s) for s in EngineState}
