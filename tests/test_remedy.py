"""Tests of the restart policy (pure: a transition table and hypothesis properties) and of the
restarters against real processes (signal, systemd, exec, supervise)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wedgewatch import remedy
from wedgewatch.remedy import (
    Allow,
    Deny,
    DenyReason,
    ExecRestarter,
    FailureReason,
    Phase,
    PolicyEventKind,
    PolicyState,
    RestartOutcome,
    RestartPolicy,
    RestartRequest,
    SignalRestarter,
    Step,
    SuperviseRestarter,
    Supervisor,
    SupervisorError,
    SystemdRestarter,
)

CHILD = Path(__file__).with_name("remedy_child.py")
POLICY = RestartPolicy()  # 3 per 3600 s, backoff 60 doubling to 900, startup 900
OK = RestartOutcome(ok=True, detail="done", duration_seconds=1.0)
FAILED = RestartOutcome(False, "boom", 1.0, FailureReason.REMEDY_ERROR)
TIMED_OUT = RestartOutcome(False, "slow", 1.0, FailureReason.TIMEOUT)

# ---------------------------------------------------------------------------------------
# The policy as a transition table


def _decide(at: float) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: remedy.decide(s, POLICY, at, 1e9 + at)


def _restart(at: float, outcome: RestartOutcome) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, remedy.record_restart(s, POLICY, at, 1e9 + at, outcome))


def _scrape(at: float) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, remedy.record_good_scrape(s, POLICY, at, 1e9 + at))


def _tick(at: float, healthy: bool) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, remedy.record_tick(s, POLICY, at, 1e9 + at, healthy=healthy))


def _reset(at: float) -> Callable[[PolicyState], tuple[object, Step]]:
    return lambda s: (None, remedy.reset(s, at, 1e9 + at))


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
            ((PolicyEventKind.GAVE_UP, "budget_exhausted"),),
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
            ((PolicyEventKind.RESTART_FAILED, "remedy_error"),),
        ),
        id="restarting-remedy-error",
    ),
    pytest.param(
        Row(
            RESTARTING,
            _restart(1010, TIMED_OUT),
            Phase.ARMED,
            ((PolicyEventKind.RESTART_FAILED, "timeout"),),
        ),
        id="restarting-timeout",
    ),
    pytest.param(
        Row(
            STARTING,
            _scrape(1200),
            Phase.ARMED,
            ((PolicyEventKind.RESTART_SUCCEEDED, "came_back"),),
        ),
        id="starting-good-scrape-succeeds",
    ),
    pytest.param(Row(STARTING, _tick(1899, False), Phase.STARTING), id="starting-within-grace"),
    pytest.param(
        Row(
            STARTING,
            _tick(1900, False),
            Phase.ARMED,
            ((PolicyEventKind.RESTART_FAILED, "not_recovered"),),
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
            ((PolicyEventKind.GAVE_UP_CLEARED, "healthy"),),
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
            ((PolicyEventKind.BACKOFF_RESET, "healthy"),),
        ),
        id="armed-backoff-reset-by-health",
    ),
    pytest.param(
        Row(
            GAVE_UP,
            _reset(2000),
            Phase.ARMED,
            ((PolicyEventKind.GAVE_UP_CLEARED, "operator_reset"),),
        ),
        id="gave-up-operator-reset",
    ),
    pytest.param(
        Row(SPENT, _reset(1000), Phase.ARMED, ((PolicyEventKind.BUDGET_RESET, "operator_reset"),)),
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
        remedy.record_restart(ARMED, POLICY, 0.0, 0.0, OK)


def test_backoff_doubles_from_resolution_and_caps() -> None:
    """The pause after the n-th restart is 60 * 2**(n-1) s from its resolution, capped at 900."""
    assert [POLICY.backoff_after(n) for n in range(0, 7)] == [0, 60, 120, 240, 480, 900, 900]
    state = PolicyState()
    policy = RestartPolicy(restart_budget=10)
    at = 0.0
    gaps = []
    for _ in range(4):
        decision, step = remedy.decide(state, policy, at, at)
        assert isinstance(decision, Allow)
        state = remedy.record_restart(step.state, policy, at + 5, at + 5, OK).state
        state = remedy.record_good_scrape(state, policy, at + 100, at + 100).state
        denied, _ = remedy.decide(state, policy, at + 100, at + 100)
        assert isinstance(denied, Deny)
        assert denied.reason is DenyReason.BACKOFF
        assert denied.retry_at is not None
        gaps.append(denied.retry_at - (at + 100))
        at = denied.retry_at
    assert gaps == [60, 120, 240, 480]


def test_health_counted_from_a_zero_clock() -> None:
    """A fake clock starting at 0 still measures health from the first healthy tick."""
    state = replace(GAVE_UP, restarts_at=(), phase_since_at=0.0)
    state = remedy.record_tick(state, POLICY, 0.0, 0.0, healthy=True).state
    step = remedy.record_tick(state, POLICY, 900.0, 900.0, healthy=True)
    assert step.state.phase is Phase.ARMED
    assert [e.kind for e in step.events] == [PolicyEventKind.GAVE_UP_CLEARED]


def test_budget_remaining_counts_the_sliding_window() -> None:
    """budget_remaining is the budget minus restarts in the last window, never negative."""
    assert remedy.budget_remaining(SPENT, POLICY, 1000) == 0
    assert remedy.budget_remaining(SPENT, POLICY, 3700) == 1
    assert remedy.budget_remaining(SPENT, POLICY, 4500) == 3


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
    record = remedy.to_record(state, 650.0, 1_700_000_650.0)
    assert record.restart_timestamps == (1_700_000_100.0, 1_700_000_500.0)
    restored = remedy.from_record(record, POLICY, 10.0, 1_700_000_650.0)
    assert restored == PolicyState(Phase.STARTING, (-540.0, -140.0), 2, 60.0, -40.0, None)


def test_restore_is_conservative_about_clocks() -> None:
    """Future stamps count as now; a backoff is never restored longer than its maximum."""
    record = remedy.PolicyRecord(
        phase=Phase.RESTARTING,
        restart_timestamps=(5000.0,),
        consecutive=1,
        not_before_timestamp=99_999.0,
        phase_since_timestamp=None,
    )
    restored = remedy.from_record(record, POLICY, 7.0, 1000.0)
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
            decision, step = remedy.decide(state, policy, at, wall)
            if isinstance(decision, Allow):
                allows.append(wall)
        elif op in ("ok", "fail") and state.phase is Phase.RESTARTING:
            step = remedy.record_restart(state, policy, at, wall, OK if op == "ok" else FAILED)
        elif op == "scrape":
            step = remedy.record_good_scrape(state, policy, at, wall)
        elif op in ("healthy", "unhealthy"):
            healthy = op == "healthy"
            if not healthy:
                healthy_run = None
            elif healthy_run is None:
                healthy_run = wall
            step = remedy.record_tick(state, policy, at, wall, healthy=healthy)
        elif op == "persist":
            record = remedy.to_record(state, at, wall)
            offset += delta + 17  # the new process's monotonic clock starts elsewhere
            state = remedy.from_record(record, policy, float(wall - offset), wall)
            healthy_run = None
        elif op == "reset" and with_resets:
            step = remedy.reset(state, at, wall)
        if step is None:
            continue
        state = step.state
        for event in step.events:
            events.append((wall, event.kind, event.reason))
            if event.kind is PolicyEventKind.GAVE_UP:
                healthy_run = None
            if event.kind is PolicyEventKind.GAVE_UP_CLEARED and event.reason == "healthy":
                run_start = healthy_run if healthy_run is not None else wall + 1
                cleared_ok = cleared_ok and wall - run_start >= policy.reset_after_seconds
    return Run(allows, events, cleared_ok)


@settings(max_examples=300, deadline=None)
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


@settings(max_examples=300, deadline=None)
@given(policy=SMALL_POLICIES, ops=OPS)
def test_backoff_is_respected(policy: RestartPolicy, ops: list[tuple[int, str]]) -> None:
    """Two restarts are at least the backoff of the first apart unless a reset came between."""
    run = _simulate(policy, ops, with_resets=True)
    resets = [
        w
        for w, kind, _ in run.events
        if kind
        in (
            PolicyEventKind.BACKOFF_RESET,
            PolicyEventKind.GAVE_UP_CLEARED,
            PolicyEventKind.BUDGET_RESET,
        )
    ]
    since_reset = 0
    for previous, current in zip(run.allows, run.allows[1:], strict=False):
        if any(previous <= r <= current for r in resets):
            since_reset = 0
            continue
        since_reset += 1
        assert current - previous >= policy.backoff_after(since_reset)


@settings(max_examples=300, deadline=None)
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
        if what == PolicyEventKind.GAVE_UP:
            gave_up = True
        elif what == PolicyEventKind.GAVE_UP_CLEARED:
            gave_up = False
        elif what == "allow":
            assert not gave_up


@settings(max_examples=200, deadline=None)
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
            state = remedy.decide(state, policy, at, wall)[1].state
        elif op in ("ok", "fail") and state.phase is Phase.RESTARTING:
            state = remedy.record_restart(
                state, policy, at, wall, OK if op == "ok" else FAILED
            ).state
        elif op == "scrape":
            state = remedy.record_good_scrape(state, policy, at, wall).state
        elif op in ("healthy", "unhealthy"):
            state = remedy.record_tick(state, policy, at, wall, healthy=op == "healthy").state
        restored = remedy.from_record(remedy.to_record(state, at, wall), policy, at + shift, wall)

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


# ---------------------------------------------------------------------------------------
# Restarters against real processes


def _request(pid: int | None = None, bundle: Path | None = None) -> RestartRequest:
    return RestartRequest(
        target="vllm-a",
        url="http://127.0.0.1:8000",
        model_name="Qwen/Qwen3-8B",
        engine="0",
        family="deferred_stall",
        state="wedged",
        reason="running 0, waiting 5 (deferred 5), no progress for 300 s",
        bundle=bundle,
        server_pid=pid,
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(pid: int) -> bool:
    """Wait (bounded) until `pid` is gone or a zombie."""
    deadline = time.monotonic() + 10
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_for_file(path: Path) -> bool:
    """Wait (bounded) until `path` exists."""
    deadline = time.monotonic() + 10
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_for_pids(directory: Path, roles: list[str]) -> dict[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all((directory / f"{r}.pid").exists() for r in roles):
            return {r: int((directory / f"{r}.pid").read_text()) for r in roles}
        time.sleep(0.02)
    raise AssertionError(
        f"the process tree in {directory} did not come up: {os.listdir(directory)}"
    )


TREE = ["root", "child0", "child1", "grand0", "grand1"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test; whatever is left is killed and reaped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _start_tree(
    spawned: list[subprocess.Popen[bytes]],
    directory: Path,
    *options: str,
    mode: str = "tree",
    new_session: bool = True,
    roles: list[str] = TREE,
) -> dict[str, int]:
    directory.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(directory), *options],
        start_new_session=new_session,
    )
    spawned.append(proc)
    return _wait_for_pids(directory, roles)


def _kill_leftovers(pids: dict[str, int]) -> None:
    for pid in pids.values():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_signal_stops_a_well_behaved_tree_on_sigterm(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A tree that exits on SIGTERM is gone before the grace, without SIGKILL."""
    pids = _start_tree(spawned, tmp_path / "tree")
    assert os.getpgid(pids["root"]) == pids["root"]
    outcome = await SignalRestarter(grace_seconds=60).restart(_request(pids["root"]))
    assert outcome.ok, outcome.detail
    assert "SIGTERM to process group" in outcome.detail
    assert "exited on SIGTERM" in outcome.detail
    assert not [r for r, pid in pids.items() if _alive(pid)]


async def test_signal_reaches_orphans_left_in_the_group(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A worker orphaned by an earlier death (no longer a descendant) still gets killed."""
    pids = _start_tree(spawned, tmp_path / "tree", "--orphan", "child0", "--stubborn", "grand0")
    assert _wait_dead(pids["child0"])
    root = psutil.Process(pids["root"])
    assert pids["grand0"] not in {p.pid for p in root.children(recursive=True)}
    try:
        outcome = await SignalRestarter(grace_seconds=0.5).restart(_request(pids["root"]))
        assert outcome.ok, outcome.detail
        assert not [r for r, pid in pids.items() if _alive(pid)]
    finally:
        _kill_leftovers(pids)


async def test_signal_kills_a_tree_that_ignores_sigterm(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Processes that ignore SIGTERM are SIGKILLed after the grace, orphans and escapees too."""
    pids = _start_tree(
        spawned,
        tmp_path / "tree",
        "--stubborn",
        "child0,grand0,grand1",
        "--escape",
        "grand1",
    )
    assert os.getpgid(pids["grand1"]) != pids["root"]  # it left the group
    try:
        outcome = await SignalRestarter(grace_seconds=0.5).restart(_request(pids["root"]))
        assert outcome.ok, outcome.detail
        assert "sent SIGKILL" in outcome.detail
        assert not [r for r, pid in pids.items() if _alive(pid)]
    finally:
        _kill_leftovers(pids)


async def test_signal_spares_the_supervising_parent(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A server sharing its supervisor's group is signalled process by process; the parent lives."""
    pids = _start_tree(
        spawned, tmp_path / "tree", "--stubborn", "grand0", mode="parent", roles=["parent", *TREE]
    )
    assert os.getpgid(pids["root"]) == pids["parent"]
    try:
        outcome = await SignalRestarter(grace_seconds=0.5).restart(_request(pids["root"]))
        assert outcome.ok, outcome.detail
        assert "does not lead its process group" in outcome.detail
        assert not [r for r, pid in pids.items() if r != "parent" and _alive(pid)]
        assert _alive(pids["parent"])
    finally:
        _kill_leftovers(pids)


async def test_signal_never_touches_our_own_process_group(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A server in wedgewatch's own process group is killed alone; we are not signalled."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        pids = _start_tree(spawned, tmp_path / "tree", new_session=False)
        assert os.getpgid(pids["root"]) == os.getpgrp()
        outcome = await SignalRestarter(grace_seconds=5).restart(_request(pids["root"]))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert outcome.ok, outcome.detail
    assert received == []
    assert not [r for r, pid in pids.items() if _alive(pid)]


@pytest.mark.parametrize(
    ("pid", "ok", "text"),
    [
        pytest.param(None, False, "no server process is known", id="unknown-pid"),
        pytest.param(os.getpid(), False, "refusing", id="ourselves"),
        pytest.param(os.getppid(), False, "refusing", id="our-parent"),
    ],
)
async def test_signal_refuses_what_it_must_not_do(pid: int | None, ok: bool, text: str) -> None:
    """No pid, our own pid or an ancestor's is a failed outcome, not a signal."""
    outcome = await SignalRestarter(grace_seconds=1).restart(_request(pid))
    assert outcome.ok is ok
    assert text in outcome.detail
    assert outcome.failure is FailureReason.REMEDY_ERROR


async def test_signal_reports_an_already_gone_server_as_done() -> None:
    """A server pid that no longer exists means the old tree is gone: ok."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    outcome = await SignalRestarter(grace_seconds=1).restart(_request(proc.pid))
    assert outcome.ok
    assert "already exited" in outcome.detail


async def test_exec_passes_the_verdict_in_the_environment(tmp_path: Path) -> None:
    """The exec command sees every WEDGEWATCH_* variable of the verdict."""
    out = tmp_path / "env.json"
    restarter = ExecRestarter([sys.executable, str(CHILD), "env-dump", str(out)])
    outcome = await restarter.restart(_request(bundle=tmp_path / "bundle"))
    assert outcome.ok, outcome.detail
    assert json.loads(out.read_text()) == {
        "WEDGEWATCH_TARGET": "vllm-a",
        "WEDGEWATCH_URL": "http://127.0.0.1:8000",
        "WEDGEWATCH_ENGINE": "0",
        "WEDGEWATCH_MODEL_NAME": "Qwen/Qwen3-8B",
        "WEDGEWATCH_FAMILY": "deferred_stall",
        "WEDGEWATCH_STATE": "wedged",
        "WEDGEWATCH_REASON": "running 0, waiting 5 (deferred 5), no progress for 300 s",
        "WEDGEWATCH_BUNDLE": str(tmp_path / "bundle"),
    }


async def test_exec_without_bundle_passes_an_empty_path(tmp_path: Path) -> None:
    """WEDGEWATCH_BUNDLE is empty when no bundle was captured."""
    out = tmp_path / "env.json"
    restarter = ExecRestarter([sys.executable, str(CHILD), "env-dump", str(out)])
    assert (await restarter.restart(_request())).ok
    assert json.loads(out.read_text())["WEDGEWATCH_BUNDLE"] == ""


async def test_exec_failure_carries_status_and_stderr() -> None:
    """A non-zero exit is a remedy_error whose detail has the status and the stderr tail."""
    restarter = ExecRestarter([sys.executable, str(CHILD), "fail", "3", "no such deployment"])
    outcome = await restarter.restart(_request())
    assert not outcome.ok
    assert outcome.failure is FailureReason.REMEDY_ERROR
    assert "exit status 3" in outcome.detail
    assert "no such deployment" in outcome.detail


async def test_exec_timeout_kills_the_whole_command_group(tmp_path: Path) -> None:
    """A command past its deadline is killed with its children and reported as a timeout."""
    restarter = ExecRestarter(
        [sys.executable, str(CHILD), "spawn-and-sleep", str(tmp_path)], timeout_seconds=4.0
    )
    outcome = await restarter.restart(_request())
    assert not outcome.ok
    assert outcome.failure is FailureReason.TIMEOUT
    assert "did not finish within" in outcome.detail
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert await asyncio.to_thread(_wait_dead, grandchild)


async def test_exec_missing_program_is_a_clear_failure() -> None:
    """A program that does not exist is a remedy_error naming it."""
    outcome = await ExecRestarter(["/nonexistent/restart-vllm"]).restart(_request())
    assert not outcome.ok
    assert "'/nonexistent/restart-vllm' was not found" in outcome.detail


def test_exec_requires_a_program() -> None:
    """An empty exec_command is a configuration error."""
    with pytest.raises(ValueError, match="exec_command"):
        ExecRestarter([])


def _fake_systemctl(directory: Path, body: str) -> Path:
    directory.mkdir()
    script = directory / "systemctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return directory


async def test_systemd_runs_systemctl_restart_with_the_unit(tmp_path: Path) -> None:
    """The argv is `systemctl --no-ask-password restart UNIT`, found on PATH, env inherited."""
    log = tmp_path / "calls"
    bin_dir = _fake_systemctl(
        tmp_path / "bin", f'printf "%s\\n" "$@" > {log}\necho "$MARKER" >> {log}\n'
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MARKER": "inherited"}
    outcome = await SystemdRestarter("vllm.service", env=env).restart(_request())
    assert outcome.ok, outcome.detail
    assert log.read_text().splitlines() == [
        "--no-ask-password",
        "restart",
        "vllm.service",
        "inherited",
    ]


async def test_systemd_user_units(tmp_path: Path) -> None:
    """user=True restarts a user unit (`systemctl --user ...`)."""
    restarter = SystemdRestarter("vllm.service", user=True)
    assert restarter.argv == ("systemctl", "--user", "--no-ask-password", "restart", "vllm.service")


async def test_systemd_failure_reports_systemctl_stderr(tmp_path: Path) -> None:
    """A failing systemctl gives remedy_error with its exit status and stderr."""
    bin_dir = _fake_systemctl(
        tmp_path / "bin", 'echo "Failed to restart $3: Unit $3 not found." >&2\nexit 5\n'
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    outcome = await SystemdRestarter("nope.service", env=env).restart(_request())
    assert not outcome.ok
    assert outcome.failure is FailureReason.REMEDY_ERROR
    assert "exit status 5" in outcome.detail
    assert "Unit nope.service not found" in outcome.detail


async def test_systemd_real_systemctl_without_systemd_fails_clearly() -> None:
    """The real systemctl, on a host without a running systemd (or without the unit), fails."""
    if shutil.which("systemctl") is None:
        pytest.skip("systemctl is not installed here")
    restarter = SystemdRestarter("wedgewatch-test-no-such-unit.service", timeout_seconds=60)
    outcome = await restarter.restart(_request())
    assert not outcome.ok
    assert "systemctl restart wedgewatch-test-no-such-unit.service failed" in outcome.detail
    assert outcome.detail.split(":", 1)[1].strip()  # systemctl said why


async def test_systemd_missing_systemctl_is_a_clear_failure(tmp_path: Path) -> None:
    """Without systemctl on PATH the outcome says so and shows the PATH searched."""
    empty = tmp_path / "empty"
    empty.mkdir()
    outcome = await SystemdRestarter("vllm.service", env={"PATH": str(empty)}).restart(_request())
    assert not outcome.ok
    assert "'systemctl' was not found on PATH" in outcome.detail
    assert str(empty) in outcome.detail


async def test_systemd_timeout(tmp_path: Path) -> None:
    """A systemctl that hangs past its deadline is killed and reported as a timeout."""
    bin_dir = _fake_systemctl(tmp_path / "bin", "exec sleep 60\n")
    restarter = SystemdRestarter(
        "vllm.service", env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout_seconds=0.5
    )
    outcome = await restarter.restart(_request())
    assert outcome.failure is FailureReason.TIMEOUT


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param("", id="empty"),
        pytest.param("--all", id="option"),
        pytest.param("a b", id="space"),
    ],
)
def test_systemd_rejects_bad_unit_names(unit: str) -> None:
    """A unit name that could be read as an option or several words is refused."""
    with pytest.raises(ValueError, match="not a unit name"):
        SystemdRestarter(unit)


# -- supervise ---------------------------------------------------------------------------------


@pytest.fixture
async def supervised() -> AsyncIterator[Callable[[list[str]], Supervisor]]:
    """Make supervisors whose process groups are stopped after the test, pass or fail."""
    made: list[Supervisor] = []

    def make(argv: list[str]) -> Supervisor:
        supervisor = Supervisor(argv)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        await supervisor.stop(0.5)


async def test_supervisor_restart_replaces_the_whole_group(
    tmp_path: Path, supervised: Callable[[list[str]], Supervisor]
) -> None:
    """restart() leaves no process of the old group and starts a new group with a new pid."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    link = tmp_path / "current"
    link.symlink_to(first_dir)
    supervisor = supervised([sys.executable, str(CHILD), "tree", str(link), "--stubborn", "grand0"])
    await supervisor.start()
    old = await asyncio.to_thread(_wait_for_pids, first_dir, TREE)
    assert supervisor.pid == old["root"] == supervisor.pgid == os.getpgid(old["root"])
    link.unlink()
    link.symlink_to(second_dir)
    outcome = await SuperviseRestarter(supervisor, grace_seconds=0.5).restart(_request())
    assert outcome.ok, outcome.detail
    assert not [r for r, pid in old.items() if _alive(pid)]
    new = await asyncio.to_thread(_wait_for_pids, second_dir, TREE)
    assert supervisor.pid == new["root"] != old["root"]
    assert os.getpgid(new["root"]) == new["root"]
    assert supervisor.starts == 2
    assert await supervisor.stop(0.5) == -signal.SIGTERM  # the leader obeys; grand0 is killed
    assert not [r for r, pid in new.items() if _alive(pid)]


async def test_supervisor_wait_returns_the_exit_status(
    supervised: Callable[[list[str]], Supervisor],
) -> None:
    """wait() returns the status of a command that exits by itself."""
    supervisor = supervised([sys.executable, str(CHILD), "exit", "7"])
    await supervisor.start()
    assert await supervisor.wait() == 7
    assert await supervisor.stop(1) == 7


async def test_supervisor_wait_survives_restarts_and_ends_with_stop(
    supervised: Callable[[list[str]], Supervisor],
) -> None:
    """A restart does not end wait(); stop() does, with the signal status."""
    supervisor = supervised([sys.executable, "-c", "import time; time.sleep(3600)"])
    await supervisor.start()
    waiter = asyncio.create_task(supervisor.wait())
    outcome = await supervisor.restart(5)
    assert outcome.ok, outcome.detail
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await supervisor.stop(5)
    assert await waiter == -signal.SIGTERM


async def test_supervisor_restart_that_cannot_start_is_a_failed_outcome(
    tmp_path: Path, supervised: Callable[[list[str]], Supervisor]
) -> None:
    """When the command vanished, restart() fails with a message and wait() ends."""
    program = tmp_path / "server.sh"
    running = tmp_path / "running"
    program.write_text(f"#!/bin/sh\ntouch {running}\nexec sleep 3600\n")
    program.chmod(0o755)
    supervisor = supervised([str(program)])
    await supervisor.start()
    waiter = asyncio.create_task(supervisor.wait())
    assert await asyncio.to_thread(_wait_for_file, running)
    program.unlink()
    outcome = await supervisor.restart(5)
    assert not outcome.ok
    assert "not found" in outcome.detail
    assert await waiter == -signal.SIGTERM


async def test_supervisor_start_errors_are_clear() -> None:
    """Starting a missing program raises SupervisorError naming it."""
    with pytest.raises(SupervisorError, match="not found"):
        await Supervisor(["/nonexistent/vllm"]).start()
