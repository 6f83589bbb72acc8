"""The proof that a restart replaced the server, as a table of before/after identities."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from wedgewatch.core.detection.detect import DetectionPolicy, Scraped, TargetState, step
from wedgewatch.core.restart.probe_policy import ServerMark
from wedgewatch.core.restart.replacement import (
    NotReplaced,
    Replaced,
    ServerIdentity,
    judge_replacement,
)
from wedgewatch.vllm.semantics import progress_counters
from wedgewatch.vllm.signals import Exposition, parse

FIXTURES = Path(__file__).parents[1] / "fixtures"

OLD = ServerIdentity(
    process_start_time_seconds=1000.0,
    progress={"0": (10.0, 500.0, 7.0, 0.0)},
    listener_pid=41,
    listener_create_time=999.5,
)


@pytest.mark.parametrize(
    ("before", "after", "replaced", "words"),
    [
        pytest.param(OLD, OLD, False, "process_start_time_seconds unchanged", id="same-server"),
        pytest.param(
            OLD,
            ServerIdentity(process_start_time_seconds=2000.0),
            True,
            "process_start_time_seconds changed",
            id="start-time-changed",
        ),
        pytest.param(
            OLD,
            ServerIdentity(
                process_start_time_seconds=1000.0,
                progress={"0": (10.0, 500.0, 7.0, 0.0)},
                listener_pid=77,
            ),
            True,
            "listener changed from pid 41 to pid 77",
            id="listener-pid-changed",
        ),
        pytest.param(
            OLD,
            ServerIdentity(listener_pid=41, listener_create_time=1500.0),
            True,
            "pid 41 is a new process",
            id="listener-pid-reused-by-new-server",
        ),
        pytest.param(
            ServerIdentity(progress={"0": (10.0, 500.0, 7.0, 0.0)}),
            ServerIdentity(progress={"0": (0.0, 3.0, 0.0, 0.0)}),
            True,
            "engine 0 prompt tokens went back from 10 to 0",
            id="counters-went-back",
        ),
        pytest.param(
            ServerIdentity(progress={"0": (10.0, 500.0, 7.0, 0.0)}),
            ServerIdentity(progress={"0": (12.0, 520.0, 8.0, 0.0)}),
            False,
            "no progress counter went back",
            id="counters-only-grew",
        ),
        pytest.param(
            ServerIdentity(progress={"0": (10.0, 500.0, 7.0, 0.0)}),
            ServerIdentity(progress={"1": (0.0, 0.0, 0.0, 0.0)}),
            False,
            "nothing comparable",
            id="other-engines-prove-nothing",
        ),
        pytest.param(
            ServerIdentity(),
            ServerIdentity(process_start_time_seconds=5.0),
            True,
            "nothing was known about the old server",
            id="old-server-never-seen",
        ),
        pytest.param(
            ServerIdentity(process_start_time_seconds=1000.0),
            ServerIdentity(),
            False,
            "nothing comparable",
            id="after-unknown",
        ),
        pytest.param(
            ServerIdentity(listener_pid=41, listener_create_time=999.5),
            ServerIdentity(listener_pid=41, listener_create_time=999.5),
            False,
            "listener is still pid 41",
            id="same-listener",
        ),
    ],
)
def test_judge_replacement(
    before: ServerIdentity, after: ServerIdentity, replaced: bool, words: str
) -> None:
    """A restart counts only with a changed start time, listener, or counters that went back."""
    result = judge_replacement(before, after)
    assert isinstance(result, Replaced if replaced else NotReplaced), result
    text = result.proof if isinstance(result, Replaced) else result.reason
    assert words in text


@pytest.mark.parametrize("fixture", ["deferred_wedge.prom", "dp2_multiproc.prom"])
def test_the_identity_and_the_probes_mark_of_one_scrape_describe_one_server(fixture: str) -> None:
    """A good scrape's ServerIdentity holds each engine's progress counters as they came and
    the probe's ServerMark of the detector that read it their sum, with one start time."""
    exposition = parse((FIXTURES / fixture).read_bytes())
    assert isinstance(exposition, Exposition)
    identity = ServerIdentity.of(exposition)
    state, _ = step(TargetState.initial(), Scraped(1.0, exposition), DetectionPolicy())
    mark = ServerMark.of(state)
    assert identity.process_start_time_seconds == exposition.process_start_time_seconds
    assert mark.process_start_time_seconds == exposition.process_start_time_seconds
    assert identity.progress == {
        key.engine: progress_counters(reading) for key, reading in exposition.engines.items()
    }
    assert mark.progress == {
        f"{key.model_name}|{key.engine}": math.fsum(identity.progress[key.engine])
        for key in exposition.engines
    }
    assert len(identity.progress) == len(exposition.engines) >= 1
