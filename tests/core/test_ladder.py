"""The cure ladder (pure): the abort cure first for a scheduler wedge, proven by progress, and
escalated to the restart; driven through the episode core with a fake clock."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wedgewatch.core.detection.detect import (
    CaptureEvidence,
    EngineVerdict,
    Restart,
    TargetVerdict,
)
from wedgewatch.core.detection.states import SEVERITY, CapturePhase, EngineState, Family
from wedgewatch.core.episode import episode as core
from wedgewatch.core.episode.episode import (
    AbortDone,
    CaptureDone,
    EpisodeState,
    Observed,
    QueueRestart,
    Recovered,
    Report,
    RestartDue,
    Rules,
    RunAbort,
    RunRestart,
)
from wedgewatch.core.restart import ladder
from wedgewatch.core.restart.ladder import Outcome, Rung
from wedgewatch.core.restart.probe_policy import ServerMark
from wedgewatch.core.restart.replacement import ServerIdentity
from wedgewatch.core.restart.restart_policy import RestartOutcome, RestartPolicy
from wedgewatch.vllm.signals import EngineKey

KEY = EngineKey("m", "0")
WALL = 1_800_000_000.0
POLICY = RestartPolicy(restart_budget=3, restart_backoff_seconds=60.0)
ABORT = Rules("sim", "signal", can_restart=True, restart_policy=POLICY, abort_first=True)
PROBE_ABORT = Rules("sim", "probe", can_restart=False, restart_policy=POLICY, abort_first=True)
MARK = ServerMark(process_start_time_seconds=5.0, progress={"m|0": 10.0})


def engine(state: EngineState, family: Family) -> EngineVerdict:
    stalled = state in core.STALLED
    return EngineVerdict(
        key=KEY,
        state=state,
        family=family if stalled else None,
        since_at=0.0,
        stalled_seconds=60.0 if stalled else 0.0,
        last_progress_at=0.0,
        reading=None,
        missing=False,
        reason=f"{state} for the test",
    )


def verdict(state: EngineState, family: Family, at: float, *, wedge: bool = False) -> TargetVerdict:
    actions = (
        (CaptureEvidence(KEY, family, CapturePhase.WEDGED), Restart(KEY, family)) if wedge else ()
    )
    states = {state}
    target = next((s for s in SEVERITY if s in states), EngineState.STARTING)
    return TargetVerdict(at, target, (engine(state, family),), (), actions, None)


@dataclass
class Story:
    """One target's episode core fed input by input on a fake clock."""

    rules: Rules = ABORT
    family: Family = Family.DEFERRED_STALL
    at: float = 1000.0
    state: EpisodeState = field(default_factory=EpisodeState)
    effects: list[object] = field(default_factory=list)

    def feed(self, event: core.Input, *, advance: float = 1.0) -> list[object]:
        self.at += advance
        step = core.step(self.state, event, self.rules, self.at, WALL + self.at)
        self.state = step.state
        self.effects += step.effects
        return list(step.effects)

    def scrape(self, state: EngineState, *, wedge: bool = False) -> list[object]:
        v = verdict(state, self.family, self.at + 1.0, wedge=wedge)
        return self.feed(Observed(v, good=True, mark=MARK))

    def wedge(self, triage: str | None = "scheduler_wedge") -> list[object]:
        """The wedged verdict, its capture done (with `triage`), then the worker's cure."""
        self.scrape(EngineState.WEDGED, wedge=True)
        episode = self.state.episode
        assert episode is not None
        self.feed(
            CaptureDone(
                episode.episode_id,
                CapturePhase.WEDGED,
                "/evidence/b",
                triage=f"{triage}: ...",
                key=KEY,
                family=str(self.family),
                triage_kind=triage,
            )
        )
        return self.feed(RestartDue(KEY, str(self.family), "flat"))

    def events(self) -> list[str]:
        return [str(e.event) for e in self.effects if isinstance(e, Report)]

    def recoveries(self) -> list[tuple[str, str]]:
        return [(str(r.cure), str(r.outcome)) for r in self.state.recoveries]


def of(effects: list[object], kind: type) -> list[object]:
    return [e for e in effects if isinstance(e, kind)]


def test_a_scheduler_wedge_is_aborted_first_and_recovers_without_a_restart() -> None:
    """K2-K3: deferred_stall + scheduler_wedge -> RunAbort (no restart); a completed canary
    and a calm scrape prove it: abort_succeeded, recovery "abort"/"recovered", episode closed."""
    story = Story()
    cure = story.wedge()
    assert of(cure, RunAbort)
    assert not of(cure, RunRestart)
    assert "abort_requested" in story.events()
    story.feed(AbortDone(True, "HTTP 200", aborted=3, canary_ok_at=story.at + 0.3))
    story.scrape(EngineState.IDLE)
    assert "abort_succeeded" in story.events()
    assert story.recoveries() == [("abort", "recovered")]
    recovery = story.state.recoveries[-1]
    assert recovery.aborted == 3
    assert recovery.seconds is not None
    assert 0 < recovery.seconds < 10
    assert story.state.episode is None
    assert not of(story.effects, RunRestart)
    assert not of(story.effects, QueueRestart)[1:]
    assert [str(r.recovery.outcome) for r in of(story.effects, Recovered)] == ["recovered"]  # type: ignore[attr-defined]


def test_the_cure_is_queued_behind_the_wedged_capture() -> None:
    """Evidence first: the wedged verdict queues the capture before the cure job."""
    story = Story()
    effects = story.scrape(EngineState.WEDGED, wedge=True)
    kinds = [type(e).__name__ for e in effects if type(e).__name__ in ("Capture", "QueueRestart")]
    assert kinds == ["Capture", "QueueRestart"]


def test_idle_without_a_canary_is_no_proof_and_escalates_at_the_deadline() -> None:
    """L5/L6: an idle engine with no completed canary proves nothing; past proof_seconds the
    abort is escalated (abort_failed, a restart queued), and the restart runs only on a
    verdict that is still acted on (R2): an idle one is not restarted."""
    story = Story()
    story.wedge()
    story.feed(AbortDone(True, "HTTP 200", aborted=2, canary_ok_at=None))
    story.scrape(EngineState.IDLE)
    assert "abort_succeeded" not in story.events()
    assert story.state.episode is not None
    queued_before = len(of(story.effects, QueueRestart))
    story.at += ladder.PROOF_SECONDS
    story.scrape(EngineState.IDLE)
    assert "abort_failed" in story.events()
    assert story.recoveries() == [("abort", "escalated")]
    assert len(of(story.effects, QueueRestart)) == queued_before + 1
    idle = story.feed(RestartDue(KEY, str(story.family), "flat"))
    assert not of(idle, RunRestart)
    assert not of(idle, RunAbort)
    story.scrape(EngineState.WEDGED)
    cure = story.feed(RestartDue(KEY, str(story.family), "flat"))
    assert of(cure, RunRestart)
    assert not of(cure, RunAbort)


def test_an_abort_whose_wedge_stays_is_escalated_to_a_restart() -> None:
    """L6: the engine stays wedged after the abort: escalated at the deadline, the restart
    runs, and the abort is never sent twice in the episode (L3)."""
    story = Story()
    story.wedge()
    story.feed(AbortDone(True, "HTTP 200", aborted=1, canary_ok_at=None))
    for _ in range(int(ladder.PROOF_SECONDS) + 2):
        story.scrape(EngineState.WEDGED)
    assert story.recoveries() == [("abort", "escalated")]
    cure = story.feed(RestartDue(KEY, str(story.family), "flat"))
    assert of(cure, RunRestart)
    assert len(of(story.effects, RunAbort)) == 1


def test_a_failed_abort_call_escalates_at_once() -> None:
    """L6: an abort call that failed (404, refused, unproven server) escalates at once."""
    story = Story()
    story.wedge()
    effects = story.feed(AbortDone(False, "HTTP 404: no abort endpoint"))
    assert of(effects, QueueRestart)
    assert story.recoveries() == [("abort", "failed")]
    assert of(story.feed(RestartDue(KEY, str(story.family), "flat")), RunRestart)


def test_a_second_cure_due_while_the_abort_is_proven_does_nothing() -> None:
    """L3: at most one abort per episode: a cure due again while proving asks for nothing."""
    story = Story()
    story.wedge()
    again = story.feed(RestartDue(KEY, str(story.family), "flat"))
    assert not of(again, RunAbort)
    assert not of(again, RunRestart)


@pytest.mark.parametrize(
    ("family", "triage"),
    [
        (Family.PROGRESS_STALL, "scheduler_wedge"),
        (Family.CANARY_STALL, None),
        (Family.DEFERRED_STALL, "collective_hang"),
        (Family.DEFERRED_STALL, "process_stopped"),
        (Family.ADMISSION_STALL, "worker_dead"),
        (Family.OUTPUT_STALL, "no_stacks"),
    ],
)
def test_frozen_loops_go_straight_to_the_restart(family: Family, triage: str | None) -> None:
    """L2: a frozen-loop family or triage never gets an abort: abort_skipped, RunRestart."""
    story = Story(family=family)
    cure = story.wedge(triage)
    assert of(cure, RunRestart)
    assert not of(cure, RunAbort)
    assert "abort_skipped" in story.events()


@pytest.mark.parametrize(
    ("family", "triage"),
    [
        (Family.DEFERRED_STALL, "scheduler_wedge"),
        (Family.DEFERRED_ONLY_STALL, "no_stacks"),
        (Family.ADMISSION_STALL, None),
        (Family.OUTPUT_STALL, "busy"),
    ],
)
def test_scheduler_wedges_get_the_abort(family: Family, triage: str | None) -> None:
    """L2: scheduler families (output_stall with a running loop) get the abort first."""
    assert of(Story(family=family).wedge(triage), RunAbort)


def test_observe_mode_never_aborts() -> None:
    """L1: remedy = "none" with abort_first acts on nothing: no cure is queued or run."""
    rules = Rules("sim", "none", can_restart=False, restart_policy=POLICY, abort_first=True)
    story = Story(rules=rules)
    story.wedge()
    assert not of(story.effects, RunAbort)
    assert not of(story.effects, RunRestart)
    assert not of(story.effects, QueueRestart)


def test_without_abort_first_the_restart_runs_as_before() -> None:
    """abort_first off (the default): the wedge gets RunRestart and no abort."""
    cure = Story(rules=replace(ABORT, abort_first=False)).wedge()
    assert of(cure, RunRestart)
    assert not of(cure, RunAbort)


def test_a_rewedge_right_after_an_abort_is_escalated() -> None:
    """L4: the next wedge less than reset_after_seconds after an abort gets no abort."""
    story = Story()
    story.wedge()
    story.feed(AbortDone(True, "HTTP 200", aborted=1, canary_ok_at=story.at))
    story.scrape(EngineState.IDLE)
    assert story.state.episode is None
    story.scrape(EngineState.OK)
    story.at += 60.0
    cure = story.wedge()
    assert of(cure, RunRestart)
    assert not of(cure, RunAbort)
    assert "abort_skipped" in story.events()


def test_a_wedge_long_after_an_abort_is_aborted_again() -> None:
    """L4: once the stretch of health has passed, a new episode may abort again."""
    story = Story()
    story.wedge()
    story.feed(AbortDone(True, "HTTP 200", aborted=1, canary_ok_at=story.at))
    story.scrape(EngineState.IDLE)
    story.at += POLICY.reset_after_seconds + 1.0
    assert of(story.wedge(), RunAbort)


def test_probe_holds_while_the_abort_rung_is_open_then_asks_for_the_restart() -> None:
    """P1a: remedy = "probe" with abort_first: /probe passes ("abort") until the abort
    failed, then it fails (decision "restart") so the kubelet restarts the server."""
    story = Story(rules=PROBE_ABORT)
    story.scrape(EngineState.WEDGED, wedge=True)
    answer = story.state.probe_answer
    assert answer is not None
    assert answer.ok
    assert answer.decision == "abort"
    episode = story.state.episode
    assert episode is not None
    story.feed(
        CaptureDone(
            episode.episode_id,
            CapturePhase.WEDGED,
            "/b",
            key=KEY,
            family="deferred_stall",
            triage_kind="scheduler_wedge",
        )
    )
    assert of(story.feed(RestartDue(KEY, "deferred_stall", "flat")), RunAbort)
    story.scrape(EngineState.WEDGED)
    assert story.state.probe_answer is not None
    assert story.state.probe_answer.decision == "abort"
    story.feed(AbortDone(False, "HTTP 404"))
    story.scrape(EngineState.WEDGED)
    answer = story.state.probe_answer
    assert answer is not None
    assert not answer.ok
    assert answer.decision == "restart"


def test_probe_asks_for_the_restart_at_once_for_a_frozen_loop() -> None:
    """P1a: no abort applies to a progress_stall: /probe fails on the wedged verdict."""
    story = Story(rules=PROBE_ABORT, family=Family.PROGRESS_STALL)
    story.scrape(EngineState.WEDGED, wedge=True)
    answer = story.state.probe_answer
    assert answer is not None
    assert not answer.ok
    assert answer.decision == "restart"


def test_a_restart_that_brings_a_new_server_is_a_restart_recovery() -> None:
    """K1: a restart rung that succeeded is recorded as cure "restart", outcome "recovered"."""
    story = Story(rules=replace(ABORT, abort_first=False))
    story.wedge()
    assert story.state.episode is not None
    story.state = replace(
        story.state, episode=replace(story.state.episode, wedged_at=story.at - 5.0)
    )
    story.feed(core.RestartDone(RestartOutcome(True, "gone", 0.5)))
    new = Observed(
        verdict(EngineState.OK, story.family, story.at + 1.0),
        good=True,
        mark=ServerMark(process_start_time_seconds=99.0, progress={"m|0": 0.0}),
        identity=ServerIdentity(process_start_time_seconds=99.0),
    )
    story.feed(new)
    assert story.recoveries() == [("restart", "recovered")]


def test_abort_refusal_reads_family_and_triage() -> None:
    """L2 as a table: which family and triage pairs the abort may cure."""
    assert ladder.abort_refusal("deferred_stall", None) is None
    assert ladder.abort_refusal("deferred_stall", "engine_dead") is not None
    assert ladder.abort_refusal("output_stall", "scheduler_wedge") is None
    assert ladder.abort_refusal("output_stall", None) is not None
    assert ladder.abort_refusal("unreachable", None) is not None
    assert {str(r) for r in Rung} == {"abort", "restart"}
    assert {str(o) for o in Outcome} == {"recovered", "failed", "escalated"}


_STEP = st.one_of(
    st.tuples(st.just("scrape"), st.sampled_from(["wedged", "idle", "ok", "suspect"])),
    st.tuples(st.just("capture"), st.sampled_from(["scheduler_wedge", "collective_hang", None])),
    st.tuples(st.just("due"), st.just(None)),
    st.tuples(st.just("abort_done"), st.sampled_from(["ok", "ok_canary", "failed"])),
    st.tuples(st.just("wait"), st.floats(min_value=1.0, max_value=40.0)),
)


def _play(
    story: Story, steps: list[tuple[str, object]]
) -> list[tuple[str | None, EngineState | None, object]]:
    """Feed the steps; (open episode id, latest verdict's state, effect) for every effect."""
    seen: list[tuple[str | None, EngineState | None, object]] = []
    for kind, value in steps:
        before = story.state.episode.episode_id if story.state.episode else None
        if kind == "scrape":
            state = EngineState(str(value))
            effects = story.scrape(state, wedge=state is EngineState.WEDGED)
        elif kind == "capture":
            if story.state.episode is None:
                continue
            effects = story.feed(
                CaptureDone(
                    story.state.episode.episode_id,
                    CapturePhase.WEDGED,
                    "/b",
                    key=KEY,
                    family="deferred_stall",
                    triage_kind=value if isinstance(value, str) else None,
                )
            )
        elif kind == "due":
            effects = story.feed(RestartDue(KEY, "deferred_stall", "flat"))
        elif kind == "abort_done":
            ok = value != "failed"
            canary = story.at if value == "ok_canary" else None
            effects = story.feed(AbortDone(ok, str(value), aborted=1, canary_ok_at=canary))
        else:
            assert isinstance(value, float)
            story.at += value
            effects = []
        latest = story.state.verdict.state if story.state.verdict else None
        seen += [(before, latest, e) for e in effects]
    return seen


@settings(max_examples=150, deadline=None)
@given(st.lists(_STEP, max_size=40), st.sampled_from(["signal", "probe", "none"]))
def test_never_two_aborts_in_an_episode_and_never_in_observe_mode(
    steps: list[tuple[str, object]], remedy_name: str
) -> None:
    """L1, L3 under any input order: at most one RunAbort per episode, none with remedy =
    "none", and a RunAbort only while the latest verdict is wedged."""
    rules = replace(ABORT, remedy=remedy_name, can_restart=remedy_name == "signal")
    story = Story(rules=rules)
    aborts: dict[str | None, int] = {}
    for episode_id, verdict_state, effect in _play(story, steps):
        if isinstance(effect, RunAbort):
            assert remedy_name != "none"
            aborts[episode_id] = aborts.get(episode_id, 0) + 1
            assert aborts[episode_id] == 1, episode_id
            assert verdict_state is EngineState.WEDGED
