"""One story, two probes, one persisted state (#20).

The daemon's `/probe` and `wedgewatch check --state-file` (an exec probe) answer the same
question and keep the same restart state. Here both watch one real HTTP server on loopback
whose body is scripted step by step (healthy, wedge, suspect, the kubelet's restart after a
failing probe, the new server's start-up, recovery, a second wedge and restart, a third
wedge with the budget spent, gave_up cleared by health), with one injected clock:

* the daemon's path: the detector and the episode core fed as `daemon.target.TargetRunner`
  feeds them (`Observed` with the server's mark and identity), `/probe` answered by
  `daemon.server.probe` from the published snapshot, a served 503 fed back as `ProbeServed`,
  and the state persisted as the daemon persists it (`daemon.publish.target_record` through
  `io.statefile.encode`/`decode`);
* the exec probe's path: `check.run_check` on the same URL with a state file on disk, run
  again at every step as the kubelet runs it.

After every step every field of the persisted restart state must be identical, and both
probes must give the same answer. Swapping `record_tick` and `observe_server` in one path
makes the story diverge (the last test), so the comparison can fail.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fixtures.vllm_exposition import EngineState as Shown
from fixtures.vllm_exposition import render_single_process
from scripted_http import Reply, ScriptedServer

from tests.daemon.test_loop import FakeClock
from wedgewatch.check import CheckOptions, run_blocking, run_check
from wedgewatch.check import run as check_run
from wedgewatch.config import Target
from wedgewatch.core.detection.detect import DetectionPolicy, Scraped, TargetState
from wedgewatch.core.detection.detect import step as detect_step
from wedgewatch.core.episode import episode
from wedgewatch.core.restart import probe_policy, probe_step, restart_codec, restart_policy
from wedgewatch.core.restart.probe_policy import ServerMark
from wedgewatch.daemon import publish, server
from wedgewatch.daemon.target import identity_of
from wedgewatch.io import http_get, statefile
from wedgewatch.io.scrape_rules import ScrapeLimits
from wedgewatch.vllm.signals import EngineKey

KEY = EngineKey("tiny-llama", "0")
STEP_SECONDS = 5.0
POLICY = DetectionPolicy(
    stall_after_seconds=20,
    hang_after_seconds=20,
    output_stall_after_seconds=20,
    unreachable_after_seconds=15,
    startup_timeout_seconds=60,
)
RESTART = restart_policy.RestartPolicy(
    restart_budget=2,
    restart_budget_window_seconds=3600.0,
    restart_backoff_seconds=10.0,
    restart_backoff_max_seconds=40.0,
    startup_timeout_seconds=60.0,
)
LIMITS = ScrapeLimits(timeout_seconds=5.0, max_body_bytes=4 * 1024 * 1024)

# The story: (what the server shows, how many steps of STEP_SECONDS). `new` is the
# kubelet's restart after a failing probe: a new process, its counters from zero.
STORY: tuple[tuple[str, int], ...] = (
    ("busy", 4),  # healthy
    ("wedged", 6),  # suspect, then wedged: /probe fails, the kubelet restarts it
    ("down", 1),  # the container restarts
    ("new", 1),  # the new server's start-up: proven new, the restart is counted
    ("busy", 9),  # recovery; after 40 s of health the backoff resets
    ("wedged", 6),  # a second wedge: the second restart of the budget
    ("down", 1),
    ("new", 1),
    ("busy", 2),
    ("wedged", 6),  # a third wedge: the budget is spent, gave_up, the probe passes
    ("busy", 10),  # health for 40 s clears gave_up
)


class World:
    """The scripted server: its generation (process) and its counters."""

    def __init__(self) -> None:
        self.mode = "busy"
        self.generation = 0
        self.progress = 0

    def set(self, mode: str) -> None:
        if mode == "new":
            self.generation += 1
            self.progress = 0
            mode = "busy"
        if mode == "busy":
            self.progress += 1
        self.mode = mode

    def reply(self, _number: int, _path: str) -> Reply:
        if self.mode == "down":
            return Reply(status=503, body=b"starting\n")
        step = self.progress
        if self.mode == "wedged":
            shown = Shown(
                running=0,
                capacity=1,
                deferred=2,
                prompt_tokens=512.0 * step,
                generation_tokens=37.0 * step,
                finished={"stop": float(step)},
                iterations=step,
            )
        else:
            shown = Shown(
                running=4,
                capacity=1,
                prompt_tokens=512.0 * step,
                generation_tokens=37.0 * step,
                finished={"stop": float(step)},
                iterations=step,
            )
        start = 1.7e9 + 1000.0 * self.generation
        body = render_single_process({KEY: shown}, process_start_time_seconds=start)
        return Reply(body=body.encode())


@dataclass
class Daemon:
    """The daemon's side of one target, fed as `TargetRunner.observe` feeds it."""

    target: Target
    rules: episode.Rules
    detector: TargetState
    core: episode.EpisodeState

    def scrape(self, url: str, clock: FakeClock) -> None:
        at, now = clock.monotonic(), clock.wall()
        obs = http_get.observe(url, LIMITS, clock=clock.monotonic)
        self.detector, verdict = detect_step(self.detector, obs, POLICY)
        observed = episode.Observed(
            verdict,
            good=isinstance(obs, Scraped),
            worker_idle=True,
            mark=ServerMark.of(self.detector),
            identity=identity_of(obs.exposition) if isinstance(obs, Scraped) else None,
        )
        self.core = episode.step(self.core, observed, self.rules, at, now).state

    def probe(self, clock: FakeClock) -> tuple[int, dict[str, Any]]:
        """GET /probe: the published snapshot's answer; a 503 sent is fed back (Q2)."""
        at, now = clock.monotonic(), clock.wall()
        snapshot = publish.target_snapshot(
            self.target,
            self.core,
            RESTART,
            remedy_name="probe",
            failure_text=None,
            last_scrape_timestamp=now,
            restart_running=False,
            now_at=at,
            now=now,
        )
        code, body = server.probe(snapshot)
        if code == 503:
            served = episode.ProbeServed(ServerMark.of(self.detector))
            self.core = episode.step(self.core, served, self.rules, at, now).state
        return code, body

    def persisted(self, clock: FakeClock) -> restart_codec.RestartRecord:
        """The restart state as the daemon's state.json holds it (through its bytes)."""
        at, now = clock.monotonic(), clock.wall()
        record = publish.target_record(self.target, self.core, self.detector, at, now)
        data = statefile.encode(statefile.SavedState({self.target.name: record}), now)
        decoded = statefile.decode(data)
        assert isinstance(decoded, statefile.SavedState)
        back = decoded.targets[self.target.name]
        return restart_codec.RestartRecord(back.restart_policy, back.probe)


def check_persisted(path: Path) -> restart_codec.RestartRecord:
    """The restart state as the exec probe's state file holds it."""
    data = json.loads(path.read_text())
    record = restart_codec.decode(data["restart_policy"], data["probe"])
    assert isinstance(record, restart_codec.RestartRecord)
    return record


@dataclass(frozen=True)
class Step:
    label: str
    daemon_code: int
    check_decision: str | None
    record: dict[str, Any]


def run_story(tmp_path: Path) -> Iterator[tuple[Step, dict[str, Any]]]:
    """Both probes through STORY; yields (the daemon's step, the check's record) per step."""
    world, clock = World(), FakeClock()
    state_file = tmp_path / "probe.json"
    with ScriptedServer(world.reply) as http:
        target = Target(name="vllm", url=http.url)
        rules = episode.Rules(
            target="vllm",
            remedy="probe",
            can_restart=False,
            restart_policy=RESTART,
            detect=POLICY,
        )
        daemon = Daemon(target, rules, TargetState.initial(), episode.EpisodeState())
        options = CheckOptions(
            metrics_url=http.url,
            window_seconds=0.0,
            interval_seconds=STEP_SECONDS,
            policy=POLICY,
            limits=LIMITS,
            state_file=state_file,
            restart=RESTART,
        )
        for mode, count in STORY:
            for _ in range(count):
                clock.now += STEP_SECONDS
                world.set(mode)
                daemon.scrape(http.url, clock)
                code, _ = daemon.probe(clock)
                report = run_blocking(run_check(options, clock=clock.monotonic, wall=clock.wall))
                verdict = report.restart_policy
                daemon_record = dataclasses.asdict(daemon.persisted(clock))
                check_record = dataclasses.asdict(check_persisted(state_file))
                step = Step(
                    mode,
                    code,
                    None if verdict is None else verdict.decision,
                    daemon_record,
                )
                assert (code == 503) == (verdict is not None and not verdict.ok), (step, report)
                yield step, check_record


def test_the_daemon_probe_and_the_exec_probe_persist_the_same_state(tmp_path: Path) -> None:
    """After every step of the story every field of the persisted restart state is equal."""
    steps: list[Step] = []
    for number, (step, check_record) in enumerate(run_story(tmp_path)):
        assert step.record == check_record, f"step {number} ({step.label})"
        steps.append(step)
    decisions = [s.check_decision for s in steps]
    # The story happened as told: two restarts asked and counted, then the budget held.
    assert decisions.count("restart") >= 2
    assert "gave_up" in decisions
    policies = [s.record["policy"] for s in steps]
    assert max(len(p["restart_timestamps"]) for p in policies) == RESTART.restart_budget
    assert any(p["phase"] == "gave_up" for p in policies)
    assert policies[-1]["phase"] == "armed"  # health cleared gave_up
    assert any(p["healthy_since_timestamp"] is not None for p in policies)
    assert any(s.record["probe"] is not None for s in steps)  # served failures were kept


def _swapped_step(
    state: probe_step.ProbeState,
    scrape: probe_step.ProbeScrape,
    at: float,
    timestamp: float,
    config: probe_step.ProbeConfig,
) -> probe_step.ProbeStep:
    """The old `check` order: record_tick before observe_server (what #20 found)."""
    ticked = restart_policy.record_tick(
        state.policy, config.policy, at, timestamp, healthy=scrape.healthy
    )
    assert scrape.mark is not None
    memory, counted = probe_policy.observe_server(
        state.memory,
        ticked.state,
        config.policy,
        scrape.mark,
        scraped=scrape.scraped,
        target_state=scrape.target_state,
        at=at,
        timestamp=timestamp,
    )
    verdict, decided = probe_policy.probe_verdict(
        counted.state, config.policy, scrape.target_state, at, timestamp
    )
    return probe_step.ProbeStep(
        probe_step.ProbeState(decided.state, memory),
        verdict,
        (*ticked.events, *counted.events, *decided.events),
    )


def test_the_comparison_fails_when_one_path_orders_the_step_differently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the exec probe on the old order (tick, then count the probe restart), the
    stretch of health after a counted restart starts a scrape apart, and the story shows it."""
    swapped = SimpleNamespace(**{**vars(probe_step), "step": _swapped_step})
    monkeypatch.setattr(check_run, "probe_step", swapped)
    differing = [
        (number, step.label, step.record["policy"], check_record["policy"])
        for number, (step, check_record) in enumerate(run_story(tmp_path))
        if step.record != check_record
    ]
    assert differing, "the old order went unnoticed"
    _, _, daemon_policy, check_policy = differing[0]
    assert daemon_policy["healthy_since_timestamp"] != check_policy["healthy_since_timestamp"]
