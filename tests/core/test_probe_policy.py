"""Tests of the liveness-probe rule under the restart budget (pure; rules P1-P3, R1-R4)."""

from __future__ import annotations

import json
import math

import pytest

from wedgewatch.core.detection.detect import EngineMemory, EngineState, TargetState
from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.restart import probe_policy, restart_codec
from wedgewatch.core.restart.probe_policy import ProbeMemory, ServerMark
from wedgewatch.core.restart.restart_policy import Phase, PolicyState, RestartPolicy
from wedgewatch.io import statefile
from wedgewatch.vllm.signals import EngineKey, EngineReading

POLICY = RestartPolicy()  # 3 per 3600 s, backoff 60 doubling to 900
KEY = EngineKey("m", "0")


def detector(start: float | None, tokens: float) -> TargetState:
    """A detector state that last read one engine with `tokens` generated, from `start`."""
    reading = EngineReading(
        key=KEY,
        running=0.0,
        waiting=3.0,
        waiting_by_reason={},
        kv_cache_usage=None,
        awake=None,
        prompt_tokens=tokens,
        generation_tokens=tokens,
        request_success=1.0,
        preemptions=0.0,
        iterations=tokens,
    )
    memory = EngineMemory(
        key=KEY,
        state=EngineState.WEDGED,
        family=None,
        since_at=0.0,
        last_progress_at=0.0,
        last_output_at=0.0,
        output_pending=False,
        reading=reading,
        missing_since=None,
        acted=False,
    )
    return TargetState(engines=(memory,), last_at=0.0, process_start_time_seconds=start)


def verdict(state: PolicyState, target: str, at: float = 5000.0, **kw: bool):  # type: ignore[no-untyped-def]
    """probe_verdict with the default policy at `at`."""
    return probe_policy.probe_verdict(state, POLICY, target, at, 1e9 + at, **kw)


@pytest.mark.parametrize("target", ["ok", "idle", "sleeping", "starting", "suspect"])
def test_p1_a_target_that_is_not_failing_passes(target: str) -> None:
    """P1: only wedged and unreachable can fail the probe."""
    answer, step = verdict(PolicyState(), target)
    assert answer.ok
    assert answer.decision == "healthy"
    assert step.state == PolicyState()


@pytest.mark.parametrize("target", ["wedged", "unreachable"])
def test_p3_a_failing_target_fails_while_a_restart_is_allowed_and_nothing_is_counted(
    target: str,
) -> None:
    """P3: Allow fails the probe but does not record an attempt (only a proven one counts)."""
    answer, step = verdict(PolicyState(), target)
    assert not answer.ok
    assert answer.decision == "restart"
    assert step.state == PolicyState()
    assert answer.budget_remaining == 3
    assert "3 of restart_budget = 3" in answer.detail


def test_p3_a_spent_budget_passes_with_gave_up_once() -> None:
    """P3: budget spent -> 200 with gave_up and why; the gave_up event comes once."""
    spent = PolicyState(Phase.ARMED, (4000.0, 4500.0, 4900.0), 3, None, 4950.0)
    answer, step = verdict(spent, "wedged")
    assert answer.ok
    assert answer.gave_up
    assert answer.decision == "gave_up"
    assert "3 restarts within the last 3600 s" in answer.detail
    assert step.state.phase is Phase.GAVE_UP
    assert [e.kind for e in step.events] == [ReportEvent.GAVE_UP]
    again, step2 = verdict(step.state, "wedged", at=5100.0)
    assert again.ok
    assert again.gave_up
    assert step2.events == ()
    assert "restart_budget = 3 within 3600 s; 3 in the window now" in again.detail
    healthy, _ = verdict(step.state, "ok", at=5100.0)
    assert healthy.gave_up
    assert healthy.decision == "healthy"


def test_p3_backoff_passes_until_it_ends() -> None:
    """P3: inside the backoff the probe passes with the time left; after it, it fails."""
    backing = PolicyState(Phase.ARMED, (4000.0,), 1, 5060.0, 5000.0)
    answer, _ = verdict(backing, "wedged", at=5030.0)
    assert answer.ok
    assert answer.decision == "backoff"
    assert "30 s" in answer.detail
    later, _ = verdict(backing, "wedged", at=5061.0)
    assert not later.ok


@pytest.mark.parametrize(
    ("phase", "decision"), [(Phase.RESTARTING, "in_progress"), (Phase.STARTING, "in_grace")]
)
def test_p3_a_restart_in_flight_passes(phase: Phase, decision: str) -> None:
    """P3: a remedy's own restart in flight: the probe must not add a second restarter."""
    answer, _ = verdict(PolicyState(phase, (4990.0,), 1, None, 4990.0), "unreachable")
    assert answer.ok
    assert answer.decision == decision


def test_p2_probe_respects_budget_off_always_fails() -> None:
    """P2: with the setting off a spent budget still fails the probe, and nothing changes."""
    spent = PolicyState(Phase.ARMED, (4000.0, 4500.0, 4900.0), 3, None, 4950.0)
    answer, step = verdict(spent, "wedged", respects_budget=False)
    assert not answer.ok
    assert step.state == spent
    assert step.events == ()


def test_r1_r2_a_served_failure_then_a_new_process_counts_one_restart() -> None:
    """R1/R2: failure served about server A, then server B (new start time) -> counted."""
    memory = probe_policy.served_failure(
        ProbeMemory(), ServerMark.of(detector(100.0, 50.0)), at=1000.0
    )
    memory = probe_policy.served_failure(memory, ServerMark.of(detector(100.0, 50.0)), at=1010.0)
    assert memory.failures == 2
    assert memory.pending
    memory, step = probe_policy.observe_server(
        memory, PolicyState(), POLICY, ServerMark.of(detector(200.0, 0.0)),
        scraped=True, target_state="ok", at=1300.0, timestamp=1e9 + 1300.0,
    )  # fmt: skip
    assert memory == ProbeMemory()
    assert step.state.restarts_at == (1010.0,)
    assert step.state.consecutive == 1
    assert step.state.not_before_at == 1300.0 + 60.0
    (event,) = step.events
    assert event.kind is ReportEvent.RESTART_SUCCEEDED
    assert event.reason == "probe_restart"
    assert "2 failed liveness probes" in event.detail


def test_r2_counters_going_backwards_prove_a_restart_without_a_start_time() -> None:
    """R2: no process_start_time_seconds (multiprocess mode): counters going back prove it."""
    memory = probe_policy.served_failure(
        ProbeMemory(), ServerMark.of(detector(None, 50.0)), at=1000.0
    )
    _, same = probe_policy.observe_server(
        memory, PolicyState(), POLICY, ServerMark.of(detector(None, 50.0)),
        scraped=True, target_state="wedged", at=1100.0, timestamp=1e9,
    )  # fmt: skip
    assert same.state.restarts_at == ()
    _, new = probe_policy.observe_server(
        memory, PolicyState(), POLICY, ServerMark.of(detector(None, 3.0)),
        scraped=True, target_state="ok", at=1100.0, timestamp=1e9,
    )  # fmt: skip
    assert new.state.restarts_at == (1000.0,)


def test_r2_nothing_is_counted_without_proof() -> None:
    """R2: a failed scrape, or the same server still failing, proves nothing."""
    memory = probe_policy.served_failure(
        ProbeMemory(), ServerMark.of(detector(100.0, 50.0)), at=1000.0
    )
    for scraped, target in ((False, "unreachable"), (True, "wedged")):
        kept, step = probe_policy.observe_server(
            memory, PolicyState(), POLICY, ServerMark.of(detector(100.0, 50.0)),
            scraped=scraped, target_state=target, at=1100.0, timestamp=1e9,
        )  # fmt: skip
        assert kept == memory
        assert step.state == PolicyState()
        assert step.events == ()


def test_r2_a_new_server_without_a_served_failure_is_not_counted() -> None:
    """R2: a restart nobody's probe failure caused (a deploy, a crash) never counts."""
    memory, step = probe_policy.observe_server(
        ProbeMemory(), PolicyState(), POLICY, ServerMark.of(detector(200.0, 0.0)),
        scraped=True, target_state="ok", at=1100.0, timestamp=1e9,
    )  # fmt: skip
    assert memory == ProbeMemory()
    assert step.state == PolicyState()


def test_r3_recovery_of_the_same_server_forgets_the_failures() -> None:
    """R3: the wedge cleared by itself; a later restart is not the probe's doing."""
    memory = probe_policy.served_failure(
        ProbeMemory(), ServerMark.of(detector(100.0, 50.0)), at=1000.0
    )
    memory, _ = probe_policy.observe_server(
        memory, PolicyState(), POLICY, ServerMark.of(detector(100.0, 80.0)),
        scraped=True, target_state="ok", at=1100.0, timestamp=1e9,
    )  # fmt: skip
    assert memory == ProbeMemory()
    _, step = probe_policy.observe_server(
        memory, PolicyState(), POLICY, ServerMark.of(detector(300.0, 0.0)),
        scraped=True, target_state="ok", at=1200.0, timestamp=1e9,
    )  # fmt: skip
    assert step.state.restarts_at == ()


def test_r4_a_remedy_restart_in_flight_is_not_counted_twice() -> None:
    """R4: while the policy's own restart runs, the new server belongs to that restart."""
    memory = probe_policy.served_failure(
        ProbeMemory(), ServerMark.of(detector(100.0, 50.0)), at=1000.0
    )
    starting = PolicyState(Phase.STARTING, (1001.0,), 1, None, 1001.0)
    memory, step = probe_policy.observe_server(
        memory, starting, POLICY, ServerMark.of(detector(200.0, 0.0)),
        scraped=True, target_state="ok", at=1100.0, timestamp=1e9,
    )  # fmt: skip
    assert memory == ProbeMemory()
    assert step.state == starting


def test_three_proven_restarts_spend_the_budget_and_the_probe_gives_up() -> None:
    """The whole story: wedge, fail, restart x3, then the fourth wedge passes with gave_up."""
    state, memory, at = PolicyState(), ProbeMemory(), 1000.0
    for n in range(3):
        answer, _ = verdict(state, "wedged", at=at)
        assert not answer.ok, n
        memory = probe_policy.served_failure(memory, ServerMark.of(detector(float(n), 9.0)), at)
        memory, step = probe_policy.observe_server(
            memory, state, POLICY, ServerMark.of(detector(float(n + 1), 0.0)),
            scraped=True, target_state="ok", at=at + 300, timestamp=1e9,
        )  # fmt: skip
        state = step.state
        at += 300 + POLICY.backoff_after(n + 1) + 1
    answer, step = verdict(state, "wedged", at=at)
    assert answer.ok
    assert answer.gave_up
    assert answer.budget_remaining == 0
    assert answer.restarts == 3


def test_memory_survives_a_round_trip_through_the_codec_and_garbage_is_named() -> None:
    """Persistence: served failures survive the sidecar's restart through the one codec of
    the restart state (`core.restart_codec`); a bad record is refused with what is wrong."""
    memory = probe_policy.served_failure(
        ProbeMemory(), ServerMark.of(detector(100.0, 50.0)), at=1000.0
    )
    record = probe_policy.memory_to_record(memory, at=1000.0, timestamp=1e9)
    assert record is not None
    raw = restart_codec.encode(restart_codec.RestartRecord(probe=record))["probe"]
    decoded = restart_codec.decode(None, json.loads(json.dumps(raw)))
    assert isinstance(decoded, restart_codec.RestartRecord)
    back = probe_policy.memory_from_record(decoded.probe, at=20.0, timestamp=1e9 + 5)
    assert back.failures == 1
    assert back.server == memory.server
    assert back.last_failed_at is not None
    assert math.isclose(back.last_failed_at, 15.0)
    assert probe_policy.memory_to_record(ProbeMemory(), 1.0, 1.0) is None
    assert probe_policy.memory_from_record(None, 1.0, 1.0) == ProbeMemory()
    for bad, why in (
        ([], "probe: expected an object, got []"),
        ({**raw, "failures": 0}, "probe: failures: expected a whole number >= 1, got 0"),
        ({**raw, "progress": {"x": "y"}}, "probe: progress['x']: expected a number, got 'y'"),
        ({**raw, "failures": True}, "probe: failures: expected a whole number >= 1, got True"),
        ({**raw, "extra": 1}, "probe: unknown field 'extra'"),
        ({k: v for k, v in raw.items() if k != "failures"}, "probe: missing field 'failures'"),
    ):
        assert restart_codec.decode(None, bad) == why


def test_server_mark_takes_the_start_time_and_counter_sums() -> None:
    """ServerMark.of reads the start time and each engine's progress counters (not iterations)."""
    mark = ServerMark.of(detector(7.0, 10.0))
    assert mark.process_start_time_seconds == 7.0
    assert mark.progress == {"m|0": 10.0 + 10.0 + 1.0 + 0.0}


# What the daemon and `check --state-file` wrote before ServerMark took its counters from
# `core.replacement.engine_counters`: a target's probe record in a version-1 state file.
STATE_FILE_PROBE_RECORD = b"""{
 "schema_version": 1,
 "written_timestamp": 1800000000.0,
 "wedgewatch_version": "0.1.0",
 "targets": {
  "vllm": {
   "restart_policy": null,
   "open_episodes": [],
   "detector": null,
   "probe": {
    "first_failed_timestamp": 1799999980.0,
    "last_failed_timestamp": 1799999990.0,
    "failures": 2,
    "process_start_time_seconds": 1700000000.0,
    "progress": {"m|0": 1234.0}
   }
  }
 }
}"""


def test_a_probe_record_written_by_the_earlier_code_still_loads_and_judges() -> None:
    """A state file's served failures from before still load, name the same server as a mark
    of today's code, and a new server after them counts one probe restart."""
    saved = statefile.decode(STATE_FILE_PROBE_RECORD)
    assert isinstance(saved, statefile.SavedState)
    memory = probe_policy.memory_from_record(
        saved.targets["vllm"].probe, at=500.0, timestamp=1_800_000_000.0
    )
    assert memory.failures == 2
    assert memory.server == ServerMark(1_700_000_000.0, {"m|0": 1234.0})
    assert memory.last_failed_at is not None
    assert math.isclose(memory.last_failed_at, 490.0)
    same = ServerMark.of(detector(1_700_000_000.0, 616.5))  # 616.5 * 2 + 1.0 + 0.0 = 1234.0
    assert memory.server.replaced_by(same) is None
    _, step = probe_policy.observe_server(
        memory, PolicyState(), POLICY, ServerMark.of(detector(1_700_000_500.0, 0.0)),
        scraped=True, target_state="ok", at=510.0, timestamp=1_800_000_010.0,
    )  # fmt: skip
    assert [e.kind for e in step.events] == [ReportEvent.RESTART_SUCCEEDED]
    assert len(step.state.restarts_at) == 1


@pytest.mark.parametrize("target", ["ok", "starting", "suspect", "wedged", "unreachable"])
def test_p0_observe_mode_always_passes_and_never_says_restart(target: str) -> None:
    """P0: remedy none: the probe passes with decision `observe`, the policy is untouched."""
    spent = PolicyState(restarts_at=(4000.0, 4100.0, 4200.0), consecutive=3)
    for state in (PolicyState(), spent):
        answer, step = verdict(state, target, observe=True)
        assert answer.ok
        assert answer.decision == "observe"
        assert step.state == state
        assert step.events == ()
        assert ("observe mode" in answer.detail) is (target in ("wedged", "unreachable"))
