"""Tests of the restart policy (pure): a transition table and hypothesis properties."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.restart import restart_policy
from wedgewatch.core.restart.restart_policy import (
    Allow,
    Deny,
    DenyReason,
    FailureReason,
    Phase,
    PolicyEventKind,
    PolicyState,
    RestartOutcome,
    RestartPolicy,
    Step,
)

CHILD = Path(__file__).parents[1] / "support" / "child_process.py"
POLICY = RestartPolicy()  # 3 per 3600 s, backoff 60 doubling to 900, startup 900
OK = RestartOutcome(ok=True, detail="done", duration_seconds=1.0)
FAILED = RestartOutcome(False, "boom", 1.0, FailureReason.REMEDY_ERROR)
TIMED_OUT = RestartOutcome(False, "slow", 1.0, FailureReason.TIMEOUT)

# ---------------------------------------------------------------------------------------
# The policy as a transition table


def _decide(at: float) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: restart_policy.decide(s, POLICY, at, 1e9 + at)


def _restart(at: float, outcome: RestartOutcome) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, restart_policy.record_restart(s, POLICY, at, 1e9 + at, outcome))


def _scrape(at: float) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, restart_policy.record_good_scrape(s, POLICY, at, 1e9 + at))


def _tick(at: float, healthy: bool) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, restart_policy.record_tick(s, POLICY, at, 1e9 + at, healthy=healthy))


def _reset(at: float) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, restart_policy.reset(s, at, 1e9 + at))


ARMED = PolicyState()
RESTARTING = PolicyState(Phase.RESTARTING, (1000.0,), 1, None, 1000.0)
STARTING = PolicyState(Phase.STARTING, (1000.0,), 1, None, 1000.0)
SPENT = PolicyState(Phase.ARMED, (100.0, 500.0, 900.0), 3, 1200.0, 960.0)
GAVE_UP = PolicyState(Phase.GAVE_UP, (100.0, 500.0, 900.0), 3, None, 1500.0)
BACKING_OFF = PolicyState(Phase.ARMED, (1000.0,), 1, 1100.0, 1040.0)
HEALTHY_GAVE_UP = replace(GAVE_UP, healthy_since_at=1600.0)
HEALTHY_BACKOFF = PolicyState(Phase.ARMED, (100.0, 200.0), 2, 400.0, 280.0, 300.0)


@dataclass(frozen=True)
class Row:
    start: PolicyState
    op: Callable[[PolicyState], tuple[object, Step]]
    phase: Phase
    events: tuple[tuple[PolicyEventKind, str], ...] = ()
    decision: object = None


TABLE = [
    pytest.param(Row(ARMED, _decide(0), Phase.RESTARTING, (), Allow(1)), id="armed-allow"),
    pytest.param(
        Row(
            SPENT,
            _decide(1300),
            Phase.GAVE_UP,
            ((ReportEvent.GAVE_UP, "budget_exhausted"),),
            DenyReason.BUDGET_EXHAUSTED,
        ),
        id="armed-budget-spent-gives-up",
    ),
    pytest.param(
        Row(SPENT, _decide(3700), Phase.RESTARTING, (), Allow(3)),
        id="armed-oldest-restart-left-window-half-open",
    ),
    pytest.param(
        Row(BACKING_OFF, _decide(1099), Phase.ARMED, (), DenyReason.BACKOFF),
        id="armed-inside-backoff",
    ),
    pytest.param(
        Row(BACKING_OFF, _decide(1100), Phase.RESTARTING, (), Allow(2)), id="armed-backoff-over"
    ),
    pytest.param(
        Row(RESTARTING, _decide(1001), Phase.RESTARTING, (), DenyReason.IN_PROGRESS),
        id="restarting-deny",
    ),
    pytest.param(
        Row(STARTING, _decide(1500), Phase.STARTING, (), DenyReason.IN_GRACE),
        id="starting-deny-in-grace",
    ),
    pytest.param(
        Row(GAVE_UP, _decide(9000), Phase.GAVE_UP, (), DenyReason.BUDGET_EXHAUSTED),
        id="gave-up-stays-when-window-frees",
    ),
    pytest.param(Row(RESTARTING, _restart(1010, OK), Phase.STARTING), id="restarting-ok"),
    pytest.param(
        Row(
            RESTARTING,
            _restart(1010, FAILED),
            Phase.ARMED,
            ((ReportEvent.RESTART_FAILED, "remedy_error"),),
        ),
        id="restarting-remedy-error",
    ),
    pytest.param(
        Row(
            RESTARTING,
            _restart(1010, TIMED_OUT),
            Phase.ARMED,
            ((ReportEvent.RESTART_FAILED, "timeout"),),
        ),
        id="restarting-timeout",
    ),
    pytest.param(
        Row(
            STARTING,
            _scrape(1200),
            Phase.ARMED,
            ((ReportEvent.RESTART_SUCCEEDED, "came_back"),),
        ),
        id="starting-good-scrape-succeeds",
    ),
    pytest.param(Row(STARTING, _tick(1899, False), Phase.STARTING), id="starting-within-grace"),
    pytest.param(
        Row(
            STARTING,
            _tick(1900, False),
            Phase.ARMED,
            ((ReportEvent.RESTART_FAILED, "not_recovered"),),
        ),
        id="starting-timeout-not-recovered",
    ),
    pytest.param(Row(ARMED, _scrape(5), Phase.ARMED), id="armed-good-scrape-nothing"),
    pytest.param(Row(GAVE_UP, _scrape(2000), Phase.GAVE_UP), id="gave-up-good-scrape-nothing"),
    pytest.param(
        Row(HEALTHY_GAVE_UP, _tick(2499, True), Phase.GAVE_UP), id="gave-up-healthy-too-short"
    ),
    pytest.param(
        Row(
            HEALTHY_GAVE_UP,
            _tick(2500, True),
            Phase.ARMED,
            ((ReportEvent.GAVE_UP_CLEARED, "healthy"),),
        ),
        id="gave-up-cleared-by-health",
    ),
    pytest.param(
        Row(HEALTHY_GAVE_UP, _tick(2500, False), Phase.GAVE_UP), id="gave-up-health-broken"
    ),
    pytest.param(
        Row(
            HEALTHY_BACKOFF,
            _tick(1200, True),
            Phase.ARMED,
            ((ReportEvent.BACKOFF_RESET, "healthy"),),
        ),
        id="armed-backoff-reset-by-health",
    ),
    pytest.param(
        Row(
            GAVE_UP,
            _reset(2000),
            Phase.ARMED,
            ((ReportEvent.GAVE_UP_CLEARED, "operator_reset"),),
        ),
        id="gave-up-operator-reset",
    ),
    pytest.param(
        Row(SPENT, _reset(1000), Phase.ARMED, ((ReportEvent.BUDGET_RESET, "operator_reset"),)),
        id="armed-operator-reset",
    ),
]


@pytest.mark.parametrize("row", TABLE)
def test_transition_table(row: Row) -> None:
    """Each (phase, input) pair leads to the documented phase, events and decision."""
    decision, step = row.op(row.start)
    assert step.state.phase is row.phase
    assert tuple((e.kind, e.reason) for e in step.events) == row.events
    if isinstance(row.decision, Allow):
        assert decision == row.decision
    elif row.decision is not None:
        assert isinstance(decision, Deny)
        assert decision.reason is row.decision
        assert decision.detail


def test_record_restart_outside_restarting_is_a_bug() -> None:
    """Reporting a restart outcome when no restart was allowed raises (a daemon bug)."""
    with pytest.raises(ValueError, match="expected restarting"):
        restart_policy.record_restart(ARMED, POLICY, 0.0, 0.0, OK)


def test_backoff_doubles_from_resolution_and_caps() -> None:
    """The pause after the n-th restart is 60 * 2**(n-1) s from its resolution, capped at 900."""
    assert [POLICY.backoff_after(n) for n in range(0, 7)] == [0, 60, 120, 240, 480, 900, 900]
    state = PolicyState()
    policy = RestartPolicy(restart_budget=10)
    at = 0.0
    gaps = []
    for _ in range(4):
        decision, step = restart_policy.decide(state, policy, at, at)
        assert isinstance(decision, Allow)
        state = restart_policy.record_restart(step.state, policy, at + 5, at + 5, OK).state
        state = restart_policy.record_good_scrape(state, policy, at + 100, at + 100).state
        denied, _ = restart_policy.decide(state, policy, at + 100, at + 100)
        assert isinstance(denied, Deny)
        assert denied.reason is DenyReason.BACKOFF
        assert denied.retry_at is not None
        gaps.append(denied.retry_at - (at + 100))
        at = denied.retry_at
    assert gaps == [60, 120, 240, 480]


def test_health_counted_from_a_zero_clock() -> None:
    """A fake clock starting at 0 still measures health from the first healthy tick."""
    state = replace(GAVE_UP, restarts_at=(), phase_since_at=0.0)
    state = restart_policy.record_tick(state, POLICY, 0.0, 0.0, healthy=True).state
    step = restart_policy.record_tick(state, POLICY, 900.0, 900.0, healthy=True)
    assert step.state.phase is Phase.ARMED
    assert [e.kind for e in step.events] == [ReportEvent.GAVE_UP_CLEARED]


def test_budget_remaining_counts_the_sliding_window() -> None:
    """budget_remaining is the budget minus restarts in the last window, never negative."""
    assert restart_policy.budget_remaining(SPENT, POLICY, 1000) == 0
    assert restart_policy.budget_remaining(SPENT, POLICY, 3700) == 1
    assert restart_policy.budget_remaining(SPENT, POLICY, 4500) == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"restart_budget": 0}, 'remedy = "none"', id="zero-budget"),
        pytest.param({"restart_backoff_seconds": -1}, "restart_backoff_seconds", id="negative"),
        pytest.param({"restart_backoff_max_seconds": 10}, "at least", id="max-below-base"),
        pytest.param({"startup_timeout_seconds": 0}, "> 0", id="zero-startup"),
        pytest.param({"restart_budget_window_seconds": float("inf")}, "finite", id="inf-window"),
    ],
)
def test_policy_rejects_bad_settings(kwargs: dict[str, float], message: str) -> None:
    """A nonsensical policy is refused with a message naming the setting."""
    with pytest.raises(ValueError, match=message):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


def test_reset_after_defaults_to_backoff_max() -> None:
    """Without healthy_reset_seconds, health must last restart_backoff_max_seconds."""
    assert RestartPolicy().reset_after_seconds == 900
    assert RestartPolicy(healthy_reset_seconds=30).reset_after_seconds == 30


# ---------------------------------------------------------------------------------------
# Persistence of the policy (pure round trip)


def test_record_round_trip_rebases_onto_a_new_clock() -> None:
    """A state saved under one monotonic clock means the same after a restart under another."""
    state = PolicyState(Phase.STARTING, (100.0, 500.0), 2, 700.0, 600.0, None)
    record = restart_policy.to_record(state, 650.0, 1_700_000_650.0)
    assert record.restart_timestamps == (1_700_000_100.0, 1_700_000_500.0)
    restored = restart_policy.from_record(record, POLICY, 10.0, 1_700_000_650.0)
    assert restored == PolicyState(Phase.STARTING, (-540.0, -140.0), 2, 60.0, -40.0, None)


def test_restore_is_conservative_about_clocks() -> None:
    """Future stamps count as now; a backoff is never restored longer than its maximum."""
    record = restart_policy.PolicyRecord(
        phase=Phase.RESTARTING,
        restart_timestamps=(5000.0,),
        consecutive=1,
        not_before_timestamp=99_999.0,
        phase_since_timestamp=None,
    )
    restored = restart_policy.from_record(record, POLICY, 7.0, 1000.0)
    assert restored.restarts_at == (7.0,)
    assert restored.not_before_at == 7.0 + POLICY.restart_backoff_max_seconds
    assert restored.phase is Phase.STARTING  # a restart in flight resumes as starting
    assert restored.phase_since_at == 7.0


# ---------------------------------------------------------------------------------------
# Hypothesis: the safety properties hold for any sequence of inputs, across persistence

OPS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=1500),
        st.sampled_from(
            ["want", "ok", "fail", "scrape", "healthy", "unhealthy", "persist", "reset"]
        ),
    ),
    max_size=80,
)
SMALL_POLICIES = st.builds(
    RestartPolicy,
    restart_budget=st.integers(1, 4),
    restart_budget_window_seconds=st.sampled_from([600.0, 3600.0]),
    restart_backoff_seconds=st.sampled_from([0.0, 30.0, 60.0]),
    restart_backoff_max_seconds=st.just(240.0),
    startup_timeout_seconds=st.sampled_from([120.0, 900.0]),
)


@dataclass
class Run:
    """The wall times of every Allow and event of one simulated run."""

    allows: list[int]
    events: list[tuple[int, PolicyEventKind, str]]
    cleared_ok: bool


def _simulate(policy: RestartPolicy, ops: list[tuple[int, str]], with_resets: bool) -> Run:
    wall = 1_000_000
    offset = 0  # monotonic = wall - offset; a persist restarts the monotonic clock
    state = PolicyState()
    allows: list[int] = []
    events: list[tuple[int, PolicyEventKind, str]] = []
    healthy_run: int | None = None
    cleared_ok = True
    for delta, op in ops:
        wall += delta
        at = float(wall - offset)
        step: Step | None = None
        if op == "want":
            decision, step = restart_policy.decide(state, policy, at, wall)
            if isinstance(decision, Allow):
                allows.append(wall)
        elif op in ("ok", "fail") and state.phase is Phase.RESTARTING:
            step = restart_policy.record_restart(
                state, policy, at, wall, OK if op == "ok" else FAILED
            )
        elif op == "scrape":
            step = restart_policy.record_good_scrape(state, policy, at, wall)
        elif op in ("healthy", "unhealthy"):
            healthy = op == "healthy"
            if not healthy:
                healthy_run = None
            elif healthy_run is None:
                healthy_run = wall
            step = restart_policy.record_tick(state, policy, at, wall, healthy=healthy)
        elif op == "persist":
            record = restart_policy.to_record(state, at, wall)
            offset += delta + 17  # the new process's monotonic clock starts elsewhere
            state = restart_policy.from_record(record, policy, float(wall - offset), wall)
            healthy_run = None
        elif op == "reset" and with_resets:
            step = restart_policy.reset(state, at, wall)
        if step is None:
            continue
        state = step.state
        for event in step.events:
            events.append((wall, event.kind, event.reason))
            if event.kind is ReportEvent.GAVE_UP:
                healthy_run = None
            if event.kind is ReportEvent.GAVE_UP_CLEARED and event.reason == "healthy":
                run_start = healthy_run if healthy_run is not None else wall + 1
                cleared_ok = cleared_ok and wall - run_start >= policy.reset_after_seconds
    return Run(allows, events, cleared_ok)


@settings(deadline=None)
@given(policy=SMALL_POLICIES, ops=OPS)
def test_never_more_restarts_than_the_budget_in_any_window(
    policy: RestartPolicy, ops: list[tuple[int, str]]
) -> None:
    """No window of restart_budget_window_seconds holds more than restart_budget restarts."""
    run = _simulate(policy, ops, with_resets=False)
    window = policy.restart_budget_window_seconds
    for end in run.allows:
        inside = [a for a in run.allows if end - window < a <= end]
        assert len(inside) <= policy.restart_budget


@settings(deadline=None)
@given(policy=SMALL_POLICIES, ops=OPS)
def test_backoff_is_respected(policy: RestartPolicy, ops: list[tuple[int, str]]) -> None:
    """Two restarts are at least the backoff of the first apart unless a reset came between."""
    run = _simulate(policy, ops, with_resets=True)
    resets = [
        w
        for w, kind, _ in run.events
        if kind
        in (
            ReportEvent.BACKOFF_RESET,
            ReportEvent.GAVE_UP_CLEARED,
            ReportEvent.BUDGET_RESET,
        )
    ]
    since_reset = 0
    for previous, current in zip(run.allows, run.allows[1:], strict=False):
        if any(previous <= r <= current for r in resets):
            since_reset = 0
            continue
        since_reset += 1
        assert current - previous >= policy.backoff_after(since_reset)


@settings(deadline=None)
@given(policy=SMALL_POLICIES, ops=OPS)
def test_gave_up_is_sticky(policy: RestartPolicy, ops: list[tuple[int, str]]) -> None:
    """After gave_up no restart is allowed until it is cleared, by long health or a reset."""
    run = _simulate(policy, ops, with_resets=True)
    assert run.cleared_ok
    timeline = sorted(
        [(w, 1, kind.value) for w, kind, _ in run.events] + [(w, 2, "allow") for w in run.allows]
    )
    gave_up = False
    for _, _, what in timeline:
        if what == ReportEvent.GAVE_UP:
            gave_up = True
        elif what == ReportEvent.GAVE_UP_CLEARED:
            gave_up = False
        elif what == "allow":
            assert not gave_up


@settings(deadline=None)
@given(policy=SMALL_POLICIES, ops=OPS, shift=st.integers(-10_000, 10_000))
def test_records_round_trip(policy: RestartPolicy, ops: list[tuple[int, str]], shift: int) -> None:
    """Any reachable state survives to_record/from_record, up to the documented changes."""
    window = policy.restart_budget_window_seconds
    wall = 5_000_000
    state = PolicyState()
    for delta, op in ops:
        wall += delta
        at = float(wall)
        if op == "want":
            state = restart_policy.decide(state, policy, at, wall)[1].state
        elif op in ("ok", "fail") and state.phase is Phase.RESTARTING:
            state = restart_policy.record_restart(
                state, policy, at, wall, OK if op == "ok" else FAILED
            ).state
        elif op == "scrape":
            state = restart_policy.record_good_scrape(state, policy, at, wall).state
        elif op in ("healthy", "unhealthy"):
            state = restart_policy.record_tick(
                state, policy, at, wall, healthy=op == "healthy"
            ).state
        restored = restart_policy.from_record(
            restart_policy.to_record(state, at, wall), policy, at + shift, wall
        )

        def moved(x: float | None) -> float | None:
            return None if x is None else x + shift

        expected_phase = Phase.STARTING if state.phase is Phase.RESTARTING else state.phase
        assert restored == PolicyState(
            phase=expected_phase,
            restarts_at=tuple(r + shift for r in state.restarts_at if r > at - window),
            consecutive=state.consecutive,
            not_before_at=moved(state.not_before_at),
            phase_since_at=moved(state.phase_since_at),
            healthy_since_at=None,
        )
