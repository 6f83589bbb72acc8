"""The one codec of the persisted restart state (core/restart/restart_codec.py): both state
files'.
"""

from __future__ import annotations

import json
import math

import pytest

from wedgewatch.core.restart import restart_codec
from wedgewatch.core.restart.probe_policy import ProbeRecord
from wedgewatch.core.restart.restart_codec import RestartRecord
from wedgewatch.core.restart.restart_policy import Phase, PolicyRecord

FULL = RestartRecord(
    policy=PolicyRecord(
        phase=Phase.GAVE_UP,
        restart_timestamps=(1.8e9 - 60, 1.8e9 - 30),
        consecutive=2,
        not_before_timestamp=1.8e9 + 20,
        phase_since_timestamp=1.8e9 - 10,
        healthy_since_timestamp=1.8e9 - 5,
    ),
    probe=ProbeRecord(
        first_failed_timestamp=1.8e9 - 9,
        last_failed_timestamp=1.8e9 - 4,
        failures=3,
        process_start_time_seconds=1.7e9,
        progress={"m|0": 1234.0, "m|1": 5.0},
    ),
)


def roundtrip(record: RestartRecord) -> RestartRecord | str:
    encoded = json.loads(json.dumps(restart_codec.encode(record), allow_nan=False))
    return restart_codec.decode(encoded["restart_policy"], encoded["probe"])


def test_every_field_survives_the_json_round_trip() -> None:
    assert roundtrip(FULL) == FULL
    assert roundtrip(RestartRecord()) == RestartRecord()


def test_a_policy_written_before_healthy_since_was_kept_still_decodes() -> None:
    """A version-1 `state.json` has no healthy_since_timestamp: it is None, not an error."""
    encoded = restart_codec.encode(FULL)["restart_policy"]
    del encoded["healthy_since_timestamp"]
    decoded = restart_codec.decode(encoded, None)
    assert isinstance(decoded, RestartRecord)
    assert decoded.policy is not None
    assert decoded.policy.healthy_since_timestamp is None


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("phase", "sleepy", "restart_policy: phase: expected one of armed, restarting"),
        ("consecutive", True, "restart_policy: consecutive: expected a whole number >= 0"),
        ("restart_timestamps", [1.0, "x"], "restart_policy: restart_timestamps[]: expected a"),
        ("restart_timestamps", 3, "restart_policy: restart_timestamps: expected a list"),
        ("not_before_timestamp", math.inf, "not_before_timestamp: expected a finite number"),
        ("colour", "red", "restart_policy: unknown field 'colour'"),
    ],
)
def test_a_bad_policy_field_is_named(field: str, value: object, why: str) -> None:
    encoded = restart_codec.encode(FULL)["restart_policy"]
    encoded[field] = value
    decoded = restart_codec.decode(encoded, None)
    assert isinstance(decoded, str)
    assert why in decoded


def test_not_an_object_is_named() -> None:
    assert restart_codec.decode([1], None) == "restart_policy: expected an object, got [1]"
    assert restart_codec.decode(None, "x" * 100) == (
        "probe: expected an object, got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."
    )
