"""Invariants of the wedge detector over generated observation histories (hypothesis)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from wedgewatch.core.detection.detect import (
    SUSPECT_CAPTURE_FRACTION,
    CaptureEvidence,
    DetectionPolicy,
    Observation,
    Restart,
    Scraped,
    ScrapeFailed,
    TargetState,
    TargetVerdict,
    new_state,
    step,
)
from wedgewatch.core.detection.detect_state import dump_state, load_state
from wedgewatch.core.detection.states import EngineState, Family
from wedgewatch.vllm import semantics
from wedgewatch.vllm.semantics import progress_counters
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition

K0 = EngineKey("m", "0")
K1 = EngineKey("m", "1")
ENGINES = (K0, K1)
FLAT_FAMILIES = {
    Family.DEFERRED_STALL,
    Family.DEFERRED_ONLY_STALL,
    Family.ADMISSION_STALL,
    Family.PROGRESS_STALL,
}
STALL_FAMILIES = {*FLAT_FAMILIES, Family.OUTPUT_STALL}
STALLED = {EngineState.SUSPECT, EngineState.WEDGED, EngineState.UNREACHABLE}

# Gaps cluster around the default thresholds so that boundaries are hit exactly.
GAPS = (0.0, 0.5, 1.0, 5.0, 29.0, 30.0, 31.0, 59.0, 60.0, 61.0, 119.0, 120.0, 299.0, 300.0)
THRESHOLDS = st.sampled_from([0.0, 1.0, 10.0, 30.0, 60.0, 120.0, 300.0])
POLICIES = st.builds(
    DetectionPolicy,
    stall_after_seconds=THRESHOLDS,
    hang_after_seconds=THRESHOLDS,
    output_stall_after_seconds=THRESHOLDS,
    unreachable_after_seconds=THRESHOLDS,
    startup_timeout_seconds=st.none() | THRESHOLDS,
    deferred_only_after_seconds=st.sampled_from([0.0, 60.0, 600.0]),
)
# How an engine's counters change in one sample: mostly flat or all moving, so stalls happen.
MOVES = ("flat", "flat", "all", "other", "output", "random", "reset")


@dataclass(frozen=True)
class History:
    """A generated sequence of observations and the policy to judge them by."""

    observations: tuple[Observation, ...]
    policy: DetectionPolicy


@dataclass(frozen=True)
class Shape:
    """Which kinds of trouble a generated history may contain."""

    idle_only: bool = False
    failures: bool = True
    missing: bool = True
    resets: bool = True
    non_finite: bool = False  # some gauges and counters read NaN or +/-Inf
    multi_server: bool = False  # the process start time alternates between two servers


def move_counters(old: list[float], move: str, rng: random.Random) -> list[float]:
    """The counters after one sample; "reset" halves or zeroes them (a server restart)."""
    if move == "reset":
        return [c / 2 if rng.random() < 0.5 else 0.0 for c in old]
    if move == "all":
        return [c + rng.randint(1, 4) for c in old]
    if move == "other":  # prompt tokens and preemptions move; output does not
        return [old[0] + rng.randint(0, 2), old[1], old[2], old[3] + 1, old[4]]
    if move == "output":
        return [old[0], old[1] + 1, old[2] + rng.randint(0, 1), old[3], old[4] + 1]
    if move == "random":
        return [c + rng.randint(0, 1) for c in old]
    return list(old)


def make_history(seed: int, length: int, policy: DetectionPolicy, shape: Shape) -> History:
    """A pseudo-random history; for one seed, a shorter length gives a prefix (shrinks well)."""
    rng = random.Random(seed)
    at = rng.choice([0.0, 12.25, 1e6])
    counters = {key: [0.0] * 5 for key in ENGINES}
    server = 1000.0
    observations: list[Observation] = []
    for _ in range(length):
        if shape.multi_server:  # two servers seen within seconds of each other
            at += rng.choice([0.5, 1.0, 5.0, 10.0])
        else:
            at += rng.choice(GAPS) if rng.random() < 0.7 else rng.uniform(0, 400)
        if shape.failures and rng.random() < 0.12:
            observations.append(ScrapeFailed(at, rng.choice(["timeout", "refused"]), "x"))
            continue
        present = rng.choice([ENGINES, ENGINES, (K0,), (K1,), ()]) if shape.missing else ENGINES
        readings = {}
        for key in present:
            move = rng.choice(MOVES)
            if move == "reset" and not shape.resets:
                move = "flat"
            counters[key] = new = move_counters(counters[key], move, rng)
            running = 0.0 if shape.idle_only else float(rng.choice([0, 0, 1, 4]))
            waiting = 0.0 if shape.idle_only else float(rng.choice([0, 0, 2, 5]))
            deferred = float(rng.randint(0, int(waiting)))
            if shape.non_finite and rng.random() < 0.3:
                bad = rng.choice([math.nan, math.inf, -math.inf])
                which = rng.randrange(3)
                running, waiting = (bad, waiting) if which == 0 else (running, bad)
                if which == 2:
                    new = [*new[:1], bad, *new[2:]]
            readings[key] = EngineReading(
                key=key,
                running=running,
                waiting=waiting,
                waiting_by_reason=(
                    {"deferred": deferred, "capacity": waiting - deferred}
                    if rng.random() < 0.7
                    else {}
                ),
                kv_cache_usage=rng.choice([None, 0.5, 0.5, 0.6, 0.7, math.nan]),
                awake=rng.choice([True, True, True, None, False]),
                prompt_tokens=new[0],
                generation_tokens=new[1],
                request_success=new[2],
                preemptions=new[3],
                iterations=new[4],
            )
        if shape.multi_server:
            server = 3000.0 - server  # 1000, 2000, 1000, ...: two servers behind one URL
        elif shape.resets and rng.random() < 0.1:
            server += 1000.0  # a restart: a new start time that never comes back
        start = server if shape.multi_server else rng.choice([None, server, server, server])
        observations.append(Scraped(at, Exposition(readings, start)))
    return History(tuple(observations), policy)


def histories(**shape: bool) -> st.SearchStrategy[History]:
    """Random readings, time gaps, failures, vanishing engines and counter resets."""
    return st.builds(
        make_history,
        seed=st.integers(0, 2**32 - 1),
        length=st.integers(1, 40),
        policy=POLICIES,
        shape=st.just(Shape(**shape)),
    )


def judge(history: History) -> list[tuple[TargetState, TargetVerdict]]:
    """Every state and verdict of the history, in order."""
    state = new_state()
    out = []
    for observation in history.observations:
        state, verdict = step(state, observation, history.policy)
        out.append((state, verdict))
    return out


def good_scrapes(observations: Sequence[Observation]) -> list[Scraped]:
    """The good scrapes of a history."""
    return [o for o in observations if isinstance(o, Scraped)]


def calm(reading: EngineReading) -> bool:
    """Asleep or idle: a reading that resets the stall clocks."""
    return reading.awake is False or (reading.running == 0 and reading.waiting == 0)


@given(histories(idle_only=True))
def test_idle_never_stalls(history: History) -> None:
    """An engine whose every reading has running == waiting == 0 never has a stall family."""
    for _, verdict in judge(history):
        for judged in verdict.engines:
            assert judged.family not in STALL_FAMILIES
            if judged.reading is not None:
                assert judged.state in {EngineState.IDLE, EngineState.SLEEPING}


@given(histories(failures=False, missing=False, idle_only=True))
def test_idle_without_outages_is_idle_or_sleeping(history: History) -> None:
    """With no failures and no vanishing engines, an idle server is only ever idle or asleep."""
    for _, verdict in judge(history):
        assert verdict.engines, "a good scrape with engines reports them"
        assert {e.state for e in verdict.engines} <= {EngineState.IDLE, EngineState.SLEEPING}


@given(histories())
def test_progress_returns_to_ok_in_one_step(history: History) -> None:
    """Progress with output is OK at once; progress without output is never a flat-family stall."""
    previous: dict[EngineKey, EngineReading] = {}
    for (_, verdict), observation in zip(judge(history), history.observations, strict=True):
        if not isinstance(observation, Scraped):
            continue
        for judged in verdict.engines:
            now = observation.exposition.engines.get(judged.key)
            before = previous.get(judged.key)
            if now is None or before is None or calm(now):
                continue
            moved = progress_counters(now) != progress_counters(before)
            output_moved = (now.generation_tokens, now.request_success) != (
                before.generation_tokens,
                before.request_success,
            )
            if moved:
                assert judged.family not in FLAT_FAMILIES
            if output_moved:
                assert judged.state is EngineState.OK
        previous = dict(observation.exposition.engines)


@settings(max_examples=2 * settings.default.max_examples)
@given(histories())
def test_wedged_never_before_its_threshold(history: History) -> None:
    """WEDGED/UNREACHABLE only once stalled_seconds and the real quiet time reach the threshold."""
    policy = history.policy
    seen: list[Observation] = []
    for (_, verdict), observation in zip(judge(history), history.observations, strict=True):
        seen.append(observation)
        for judged in verdict.engines:
            if judged.state is EngineState.WEDGED or (
                judged.state is EngineState.UNREACHABLE and judged.family is Family.UNREACHABLE
            ):
                assert judged.family is not None
                threshold = policy.threshold(judged.family)
                assert judged.stalled_seconds >= threshold
                # No event that restarts this family's clock happened in (at - threshold, at].
                for event_at in clock_events(seen, judged.key, judged.family):
                    assert verdict.at - event_at >= threshold, (judged, event_at)


def clock_events(
    observations: Sequence[Observation], key: EngineKey, family: Family
) -> list[float]:
    """Times at which the engine's own readings prove it was not stalled in `family`.

    A first reading or reappearance, a calm reading, or (per family) any counter / an output
    counter / the mere presence of the engine. Server restarts add more resets, so this is a
    necessary condition only.
    """
    events = []
    before: EngineReading | None = None
    for scrape in good_scrapes(observations):
        now = scrape.exposition.engines.get(key)
        if now is None:
            before = None
            continue
        if family is Family.UNREACHABLE or before is None or calm(now):
            events.append(scrape.at)
        elif family is Family.OUTPUT_STALL:
            if (now.generation_tokens, now.request_success) != (
                before.generation_tokens,
                before.request_success,
            ):
                events.append(scrape.at)
        elif progress_counters(now) != progress_counters(before):
            events.append(scrape.at)
        before = now
    return events


@given(histories())
def test_counter_reset_never_produces_a_stall(history: History) -> None:
    """On a step where some counter went backwards, every reported engine is re-baselined."""
    previous: Scraped | None = None
    for (_, verdict), observation in zip(judge(history), history.observations, strict=True):
        if not isinstance(observation, Scraped):
            continue
        if previous is not None and went_backwards(previous, observation):
            assert verdict.engines == tuple(
                e for e in verdict.engines if e.key in observation.exposition.engines
            )
            for judged in verdict.engines:
                assert judged.family is None
                assert judged.state in {EngineState.OK, EngineState.IDLE, EngineState.SLEEPING}
                assert judged.stalled_seconds == 0
        previous = observation


def went_backwards(before: Scraped, now: Scraped) -> bool:
    """Whether an engine present in both scrapes has a counter lower than before."""
    for key, reading in now.exposition.engines.items():
        old = before.exposition.engines.get(key)
        if old is not None and any(
            b < a for a, b in zip(progress_counters(old), progress_counters(reading), strict=True)
        ):
            return True
    return False


@given(histories())
def test_sleeping_is_never_wedged(history: History) -> None:
    """An engine whose reading says it is asleep is SLEEPING, whatever its queues and counters."""
    for (_, verdict), observation in zip(judge(history), history.observations, strict=True):
        if not isinstance(observation, Scraped):
            continue
        for judged in verdict.engines:
            now = observation.exposition.engines.get(judged.key)
            if now is not None and now.awake is False:
                assert judged.state is EngineState.SLEEPING


@given(histories())
def test_dump_load_round_trips_at_every_step(history: History) -> None:
    """Every intermediate state survives strict JSON, and resuming from it changes nothing."""
    results = judge(history)
    for index, (state, _) in enumerate(results):
        restored = load_state(json.loads(json.dumps(dump_state(state), allow_nan=False)))
        assert restored == state
        if index + 1 < len(history.observations):
            resumed = step(restored, history.observations[index + 1], history.policy)
            assert resumed == results[index + 1]


@settings(max_examples=2 * settings.default.max_examples)
@given(histories())
def test_actions_at_most_once_per_episode(history: History) -> None:
    """Per episode: at most one suspect capture, one wedged capture, one restart; captures first."""
    counts: dict[EngineKey, dict[str, int]] = {}
    for _, verdict in judge(history):
        kinds = [
            "restart" if isinstance(a, Restart) else f"capture:{a.phase}" for a in verdict.actions
        ]
        assert kinds == sorted(kinds, key=lambda k: k == "restart"), "captures precede restarts"
        states = {e.key: e.state for e in verdict.engines}
        for key in list(counts):
            if states.get(key) not in STALLED:
                del counts[key]  # the episode ended (or the engine was dropped)
        for action in verdict.actions:
            assert states[action.key] in STALLED
            kind = "restart" if isinstance(action, Restart) else f"capture:{action.phase}"
            episode = counts.setdefault(action.key, {})
            episode[kind] = episode.get(kind, 0) + 1
            assert episode[kind] == 1, (action, episode)
            if isinstance(action, Restart):
                assert CaptureEvidence(action.key, action.family, "wedged") in verdict.actions


@given(histories())
def test_transitions_list_every_state_change(history: History) -> None:
    """Each step lists one transition per engine whose state changed, and no other."""
    before: dict[EngineKey, EngineState] = {}
    for _, verdict in judge(history):
        expected = {
            e.key: (before.get(e.key, EngineState.STARTING), e.state)
            for e in verdict.engines
            if before.get(e.key, EngineState.STARTING) is not e.state
        }
        assert {t.key: (t.old, t.new) for t in verdict.transitions} == expected
        assert len(verdict.transitions) == len(expected)
        before = {e.key: e.state for e in verdict.engines}


@given(histories())
def test_step_is_deterministic(history: History) -> None:
    """Judging the same history twice gives identical states and verdicts."""
    assert judge(history) == judge(history)


# --------------------------------------------------------------------------------------------
# Issue #10: aborts, prefill progress, non-finite readings, several servers, suspect capture


def with_aborts(history: History, seed: int) -> History:
    """The same history with abort and error finishes climbing on every reading."""
    rng = random.Random(seed)
    totals = {key: [0.0, 0.0] for key in ENGINES}
    observations: list[Observation] = []
    for observation in history.observations:
        if not isinstance(observation, Scraped):
            observations.append(observation)
            continue
        readings = {}
        for key, reading in observation.exposition.engines.items():
            aborts_errors = totals[key]
            aborts_errors[0] += rng.choice([0, 0, 1, 7])
            aborts_errors[1] += rng.choice([0, 0, 0, 2])
            aborts, errors = aborts_errors
            readings[key] = replace(
                reading,
                request_success=reading.request_success + aborts + errors,
                finished_by_reason={
                    "stop": reading.request_success,
                    "abort": aborts,
                    "error": errors,
                },
            )
        exposition = Exposition(readings, observation.exposition.process_start_time_seconds)
        observations.append(Scraped(observation.at, exposition))
    return History(tuple(observations), history.policy)


def outline(history: History) -> list[tuple[object, ...]]:
    """Per step: the target state, each engine's state, family and stalled time, the actions."""
    return [
        (
            verdict.state,
            tuple((e.key, e.state, e.family, e.stalled_seconds) for e in verdict.engines),
            verdict.actions,
        )
        for _, verdict in judge(history)
    ]


@given(histories(), st.integers(0, 2**32 - 1))
def test_aborts_and_errors_never_change_a_verdict(history: History, seed: int) -> None:
    """Clients that abort (or requests that error) move nothing the detector counts."""
    assert outline(with_aborts(history, seed)) == outline(history)


@given(histories(non_finite=True))
def test_non_finite_readings_are_unknown_and_always_persist(history: History) -> None:
    """A reading with a NaN/Inf gauge or counter is never work, idle or a new stall; state saves."""
    for (state, verdict), observation in zip(judge(history), history.observations, strict=True):
        text = json.dumps(dump_state(state), allow_nan=False)  # never fails on a NaN
        assert dump_state(load_state(json.loads(text))) == json.loads(text)
        if not isinstance(observation, Scraped):
            continue
        for judged in verdict.engines:
            now = observation.exposition.engines.get(judged.key)
            if now is None or not semantics.non_finite_fields(now) or now.awake is False:
                continue
            assert judged.state in {EngineState.UNKNOWN, EngineState.WEDGED}
            assert verdict.actions == () or all(a.key != judged.key for a in verdict.actions)


@given(histories())
def test_prefill_growth_is_never_a_flat_stall(history: History) -> None:
    """A sample whose KV usage grew while requests run is never a flat-family stall."""
    previous: dict[EngineKey, EngineReading] = {}
    for (_, verdict), observation in zip(judge(history), history.observations, strict=True):
        if not isinstance(observation, Scraped):
            previous = {}
            continue
        for judged in verdict.engines:
            now = observation.exposition.engines.get(judged.key)
            before = previous.get(judged.key)
            if now is None or before is None:
                continue
            if semantics.movement(before, now).prefill:
                assert judged.family not in FLAT_FAMILIES
        previous = dict(observation.exposition.engines)


@given(histories())
def test_suspect_capture_waits_for_a_quarter_of_the_threshold(history: History) -> None:
    """Every suspect capture comes when its stall has lasted a quarter of its threshold."""
    for _, verdict in judge(history):
        by_key = {e.key: e for e in verdict.engines}
        for action in verdict.actions:
            if isinstance(action, CaptureEvidence) and action.phase == "suspect":
                judged = by_key[action.key]
                assert judged.state is EngineState.SUSPECT
                threshold = history.policy.threshold(action.family)
                assert judged.stalled_seconds >= SUSPECT_CAPTURE_FRACTION * threshold


@given(histories(failures=False, multi_server=True))
def test_two_servers_behind_one_url_are_unknown_never_restarted(history: History) -> None:
    """Start times alternating between two servers: unknown from the first return, no actions."""
    # The generator alternates 1000, 2000, ... every few seconds, well within the window.
    returned = False
    seen: list[float] = []
    for (_, verdict), observation in zip(judge(history), history.observations, strict=True):
        assert isinstance(observation, Scraped)
        start = observation.exposition.process_start_time_seconds
        if start is not None:
            returned = returned or (bool(seen) and start != seen[-1] and start in seen)
            seen.append(start)
        if returned:
            assert verdict.actions == ()
            assert all(e.state is EngineState.UNKNOWN for e in verdict.engines)
