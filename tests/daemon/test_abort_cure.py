"""The abort cure in the daemon: the fake-clock world of test_loop, and the real abort call
(`daemon.adapters.HttpAborter`) against a loopback HTTP stand-in that records it."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer
from test_loop import World, events, make_world, play

from wedgewatch.config import Config, ConfigError, load_config
from wedgewatch.daemon.adapters import HttpAborter
from wedgewatch.io.procs import Discovery, ProcessFinder, ProcessSelector, ServerProcess
from wedgewatch.vllm.semantics import Role

ABORT_ANSWER = json.dumps({"status": "aborted", "aborted": 3}).encode()
MODELS = json.dumps({"data": [{"id": "m"}]}).encode()
STREAM = (
    b'data: {"choices": [{"text": "OK", "index": 0}]}\n\n'
    b'data: {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}\n\n'
    b"data: [DONE]\n\n"
)


class ProvenFinder:
    """The target's tree: an API server with a `VLLM::EngineCore` child (proven vLLM)."""

    def discover(self, selector: ProcessSelector) -> Discovery:
        return Discovery(
            selector.describe(),
            4242,
            (
                ServerProcess(4242, 1, "vllm serve m", Role.API_SERVER),
                ServerProcess(4243, 4242, "VLLM::EngineCore", Role.ENGINE_CORE),
            ),
        )


class UnprovenFinder:
    """A tree with no EngineCore, found by port (not named by the operator): not proven."""

    def discover(self, selector: ProcessSelector) -> Discovery:
        return Discovery(
            selector.describe(), 4242, (ServerProcess(4242, 1, "nginx: master", Role.OTHER),)
        )


class StandIn:
    """vLLM's HTTP side for the cure: /abort_requests, /v1/models, /v1/completions."""

    def __init__(self, abort_reply: Reply | None = None) -> None:
        self.aborted = threading.Event()
        self.abort_reply = abort_reply or Reply(
            200, ABORT_ANSWER, {"Content-Type": "application/json"}
        )

    def script(self, _number: int, path: str) -> Reply:
        if path.startswith("/abort_requests"):
            if self.abort_reply.status == 200:
                self.aborted.set()
            return self.abort_reply
        if path.startswith("/v1/models"):
            return Reply(200, MODELS, {"Content-Type": "application/json"})
        if path.startswith("/v1/completions"):
            return Reply(200, STREAM, {"Content-Type": "text/event-stream"})
        return Reply(404, b"not found")


@pytest.fixture
def stand_in() -> Iterator[tuple[StandIn, ScriptedServer]]:
    fake = StandIn()
    with ScriptedServer(fake.script) as server:
        yield fake, server


def world_for(
    tmp_path: Path,
    server: ScriptedServer,
    script: Callable[[float], str],
    *,
    finder: ProcessFinder | None = None,
    remedy_name: str = "signal",
) -> World:
    """test_loop's world, watching the stand-in's URL, with the real abort adapter."""
    world = make_world(
        tmp_path,
        script,
        until=400,
        remedy_name=remedy_name,
        targets=[f"sim={server.url}"],
        abort_first=True,
        canary_timeout_seconds=10.0,
    )
    world.deps = replace(
        world.deps, finder=finder or ProvenFinder(), aborter=HttpAborter(world.config)
    )
    return world


def cured_by(fake: StandIn) -> Callable[[float], str]:
    """Healthy, wedged from t=60 s, idle once the stand-in received the abort."""
    return lambda t: "healthy" if t < 60 else ("idle" if fake.aborted.is_set() else "wedged")


def abort_calls(server: ScriptedServer) -> list[tuple[str, bytes, str]]:
    return [
        (r.path, r.body, r.headers.get("Content-Type", ""))
        for r in server.requests
        if r.path.startswith("/abort_requests")
    ]


async def test_the_abort_cures_a_scheduler_wedge_without_a_restart(
    tmp_path: Path, stand_in: tuple[StandIn, ScriptedServer]
) -> None:
    """Wedge -> evidence -> one POST /abort_requests `{}` (application/json) -> a canary ->
    recovered: no restart, /status recoveries and the metric say abort / recovered."""
    fake, server = stand_in
    world = world_for(tmp_path, server, cured_by(fake))
    daemon, logs = await play(world)
    assert abort_calls(server) == [("/abort_requests", b"{}", "application/json")]
    assert world.restarter.requests == []
    names = [line["event"] for line in logs]
    assert names.index("evidence_captured") < names.index("abort_requested")
    (succeeded,) = events(logs, "abort_succeeded")
    assert succeeded["aborted"] == 3
    snapshot = daemon.snapshot.targets["sim"]
    assert [(r["cure"], r["outcome"]) for r in snapshot.recoveries] == [("abort", "recovered")]
    assert snapshot.restarts == 0
    assert snapshot.recoveries[0]["seconds"] is not None
    metric = world.metric
    assert metric("wedgewatch_recoveries_total", cure="abort", outcome="recovered") == 1
    assert any(r.path.startswith("/v1/completions") for r in server.requests)


async def test_the_abort_is_never_sent_to_an_unproven_process(
    tmp_path: Path, stand_in: tuple[StandIn, ScriptedServer]
) -> None:
    """A tree that is not proven to be vLLM gets no abort call: abort_failed (refusing),
    and the ladder escalates to the restart remedy."""
    fake, server = stand_in
    world = world_for(tmp_path, server, cured_by(fake), finder=UnprovenFinder())
    daemon, logs = await play(world)
    assert abort_calls(server) == []
    (failed, *_) = events(logs, "abort_failed")
    assert "refusing" in failed["detail"]
    assert len(world.restarter.requests) == 1
    recoveries = daemon.snapshot.targets["sim"].recoveries
    assert (recoveries[0]["cure"], recoveries[0]["outcome"]) == ("abort", "failed")


async def test_an_abort_that_does_not_bring_progress_back_escalates_once(
    tmp_path: Path, stand_in: tuple[StandIn, ScriptedServer]
) -> None:
    """The engine stays wedged after the abort: escalated to one restart, the abort sent
    exactly once in the episode."""
    _fake, server = stand_in
    world = world_for(tmp_path, server, lambda t: "healthy" if t < 60 else "wedged")
    daemon, logs = await play(world)
    assert len(abort_calls(server)) == 1
    (failed,) = events(logs, "abort_failed")
    assert failed["outcome"] == "escalated"
    assert len(world.restarter.requests) == 1
    cures = [(r["cure"], r["outcome"]) for r in daemon.snapshot.targets["sim"].recoveries]
    assert cures[0] == ("abort", "escalated")
    assert ("restart", "recovered") in cures


async def test_a_redirect_is_not_followed_and_escalates(tmp_path: Path) -> None:
    """A 3xx answer to the abort is a failure naming its Location (secrets masked): no
    request leaves for the other origin, and the restart follows."""
    fake = StandIn(Reply(307, b"", {"Location": "http://user:pw@10.9.9.9/abort_requests"}))
    with ScriptedServer(fake.script) as server:
        world = world_for(tmp_path, server, lambda t: "healthy" if t < 60 else "wedged")
        _daemon, logs = await play(world)
    assert len(abort_calls(server)) == 1
    (failed, *_) = events(logs, "abort_failed")
    assert "307" in failed["detail"]
    assert "10.9.9.9" in failed["detail"]
    assert "pw" not in failed["detail"]
    assert len(world.restarter.requests) == 1


def test_abort_first_is_refused_in_observe_mode() -> None:
    """abort_first with remedy = "none" is a configuration error naming abort_first."""
    with pytest.raises(ConfigError) as caught:
        load_config(environ={}, flags={"abort_first": True, "remedy": "none"})
    assert any("abort_first" in m for m in caught.value.messages)
    assert Config(abort_first=True, remedy="probe").abort_first


async def test_under_the_kubelet_the_probe_fails_only_after_the_abort_did_not_cure(
    tmp_path: Path, stand_in: tuple[StandIn, ScriptedServer]
) -> None:
    """remedy = "probe": the sidecar sends the abort itself; /probe passes ("abort") while it
    is tried and asks the kubelet for the restart (503 "restart") once it did not cure."""
    _fake, server = stand_in
    seen: list[str] = []
    world = world_for(
        tmp_path, server, lambda t: "healthy" if t < 60 else "wedged", remedy_name="probe"
    )

    def probe_decision(_now: float) -> None:
        daemon = world.sleeper.daemon
        target = daemon.snapshot.targets.get("sim") if daemon is not None else None
        if target is not None and target.probe is not None:
            seen.append(target.probe.decision)

    world.sleeper.on_tick = probe_decision
    _daemon, logs = await play(world)
    assert len(abort_calls(server)) == 1
    assert "abort" in seen
    assert "restart" in seen
    assert seen.index("abort") < seen.index("restart")
    assert seen[: seen.index("abort")].count("restart") == 0
    (failed,) = events(logs, "abort_failed")
    assert failed["outcome"] == "escalated"
