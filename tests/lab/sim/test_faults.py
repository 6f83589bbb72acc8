"""Fault specs and the clock that arms them."""

from __future__ import annotations

import pytest

from wedgewatch.lab.sim.faults import FaultClock, FaultSpec, parse_fault


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("collective-hang@20", FaultSpec("collective-hang", 20.0)),
        ("engine-crash@0.5:1", FaultSpec("engine-crash", 0.5, 1)),
        ("slow-metrics", FaultSpec("slow-metrics", 0.0)),
        ("garbage-metrics@0", FaultSpec("garbage-metrics", 0.0)),
    ],
    ids=str,
)
def test_fault_flags_parse(text: str, spec: FaultSpec) -> None:
    """NAME@SECONDS[:RANK], a bare NAME meaning at start; render() gives the flag back."""
    assert parse_fault(text) == spec
    rendered = spec.render()
    assert parse_fault(rendered) == spec


@pytest.mark.parametrize(
    "text", ["", "hang@1", "api-hang@", "api-hang@-1", "api-hang@inf", "engine-crash@1:x"]
)
def test_bad_fault_flags_are_messages(text: str) -> None:
    """A malformed fault is reported as a message string, never raised."""
    assert isinstance(parse_fault(text), str)


def test_the_clock_arms_faults_at_their_time_for_their_engine() -> None:
    """A fault is active from origin + at_seconds on, for its rank or for every rank."""
    clock = FaultClock(
        origin_at=100.0,
        faults=(FaultSpec("collective-hang", 5.0, 1), FaultSpec("api-hang", 2.0)),
    )
    assert not clock.active("api-hang", 101.9)
    assert clock.active("api-hang", 102.0)
    assert not clock.active("collective-hang", 110.0, engine=0)
    assert clock.active("collective-hang", 110.0, engine=1)
    assert not clock.active("collective-hang", 104.0, engine=1)
    assert clock.first_at("collective-hang", 1) == 105.0
    assert clock.first_at("collective-hang", 0) is None
    assert clock.first_at("engine-crash") is None


def test_a_clock_that_has_not_started_arms_nothing() -> None:
    """Until the server is ready (origin None) no fault is active or has a time; started()
    counts every fault from the ready instant."""
    clock = FaultClock(origin_at=None, faults=(FaultSpec("api-hang", 0.0),))
    assert not clock.active("api-hang", 1e9)
    assert clock.first_at("api-hang") is None
    started = clock.started(50.0)
    assert started.active("api-hang", 50.0)
    assert started.first_at("api-hang") == 50.0


def test_an_engine_gets_only_its_engine_faults() -> None:
    """for_engine() keeps engine faults for that rank and drops the serving process's."""
    clock = FaultClock(
        origin_at=0.0,
        faults=(
            FaultSpec("engine-crash", 1.0, 0),
            FaultSpec("engine-crash", 2.0, 1),
            FaultSpec("collective-hang", 3.0),
            FaultSpec("slow-metrics", 0.0),
        ),
    )
    assert clock.for_engine(1).faults == (
        FaultSpec("engine-crash", 2.0, 1),
        FaultSpec("collective-hang", 3.0),
    )
