"""The one codec of the persisted restart state: the daemon's and `check`'s state files.

What survives between runs about a target's restarts is a `RestartRecord`: the restart
policy (`restart_policy.PolicyRecord`, with the stretch of health) and the liveness probe's
served failures (`probe_policy.ProbeRecord`), all in Unix seconds. `encode` turns it into
the JSON-ready objects both files embed (`restart_policy` and `probe`), `decode` checks
them back, field by field, and returns a sentence saying what is wrong instead of raising.

The format is versioned by the files that embed it (`schema_version` of the daemon's
`state.json`, 2 since `healthy_since_timestamp`; `version` of a check's state file, which
always had it): it changes only with both. `healthy_since_timestamp` may be absent (a
version 1 `state.json`).

Pure: no JSON text and no file here (the exec probe imports this without pydantic), so the
daemon's pydantic schema (`io.statefile`) and the check's store (`check.state`) parse their
files and hand these two objects to the same `decode`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from wedgewatch.core.restart.probe_policy import ProbeRecord
from wedgewatch.core.restart.restart_policy import Phase, PolicyRecord
from wedgewatch.core.values import immutable

_POLICY_KEYS = frozenset(
    {
        "phase",
        "restart_timestamps",
        "consecutive",
        "not_before_timestamp",
        "phase_since_timestamp",
        "healthy_since_timestamp",
    }
)
_PROBE_KEYS = frozenset(
    {
        "first_failed_timestamp",
        "last_failed_timestamp",
        "failures",
        "process_start_time_seconds",
        "progress",
    }
)


@immutable
class RestartRecord:
    """The persisted restart state of one target (Unix seconds)."""

    policy: PolicyRecord | None = None  # None: no history, a fresh policy
    probe: ProbeRecord | None = None  # None: no served failure pending


class _Bad(ValueError):
    """One field is not what the format says; the message names it."""


def encode(record: RestartRecord) -> dict[str, Any]:
    """`{"restart_policy": {...} | None, "probe": {...} | None}`, ready for `json.dumps`."""
    policy, probe = record.policy, record.probe
    return {
        "restart_policy": None
        if policy is None
        else {
            "phase": policy.phase.value,
            "restart_timestamps": list(policy.restart_timestamps),
            "consecutive": policy.consecutive,
            "not_before_timestamp": policy.not_before_timestamp,
            "phase_since_timestamp": policy.phase_since_timestamp,
            "healthy_since_timestamp": policy.healthy_since_timestamp,
        },
        "probe": None
        if probe is None
        else {
            "first_failed_timestamp": probe.first_failed_timestamp,
            "last_failed_timestamp": probe.last_failed_timestamp,
            "failures": probe.failures,
            "process_start_time_seconds": probe.process_start_time_seconds,
            "progress": dict(sorted(probe.progress.items())),
        },
    }


def decode(restart_policy: object, probe: object) -> RestartRecord | str:
    """The record from the two stored objects, or a sentence saying what is wrong.

    A missing (None) object is a fresh one. Unknown keys, a missing key (other than
    `healthy_since_timestamp`, added later), wrong types and non-finite numbers are errors.
    """
    try:
        policy = None if restart_policy is None else _policy(restart_policy)
    except _Bad as exc:
        return f"restart_policy: {exc}"
    try:
        memory = None if probe is None else _probe(probe)
    except _Bad as exc:
        return f"probe: {exc}"
    return RestartRecord(policy=policy, probe=memory)


def _object(raw: object, keys: frozenset[str], optional: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise _Bad(f"expected an object, got {_shown(raw)}")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise _Bad(f"unknown field {unknown[0]!r}")
    missing = sorted(keys - optional - set(raw))
    if missing:
        raise _Bad(f"missing field {missing[0]!r}")
    return raw


def _policy(raw: object) -> PolicyRecord:
    data = _object(raw, _POLICY_KEYS, frozenset({"healthy_since_timestamp"}))
    phase = data["phase"]
    if not isinstance(phase, str) or phase not in {p.value for p in Phase}:
        raise _Bad(f"phase: expected one of {', '.join(p.value for p in Phase)}, got {phase!r}")
    stamps = data["restart_timestamps"]
    if not isinstance(stamps, list):
        raise _Bad(f"restart_timestamps: expected a list, got {_shown(stamps)}")
    return PolicyRecord(
        phase=Phase(phase),
        restart_timestamps=tuple(_number(s, "restart_timestamps[]") for s in stamps),
        consecutive=_count(data["consecutive"], "consecutive", minimum=0),
        not_before_timestamp=_optional(data["not_before_timestamp"], "not_before_timestamp"),
        phase_since_timestamp=_optional(data["phase_since_timestamp"], "phase_since_timestamp"),
        healthy_since_timestamp=_optional(
            data.get("healthy_since_timestamp"), "healthy_since_timestamp"
        ),
    )


def _probe(raw: object) -> ProbeRecord:
    data = _object(raw, _PROBE_KEYS, frozenset())
    progress = data["progress"]
    if not isinstance(progress, dict) or not all(isinstance(k, str) for k in progress):
        raise _Bad(f"progress: expected an object of numbers, got {_shown(progress)}")
    return ProbeRecord(
        first_failed_timestamp=_optional(data["first_failed_timestamp"], "first_failed_timestamp"),
        last_failed_timestamp=_optional(data["last_failed_timestamp"], "last_failed_timestamp"),
        failures=_count(data["failures"], "failures", minimum=1),
        process_start_time_seconds=_optional(
            data["process_start_time_seconds"], "process_start_time_seconds"
        ),
        progress={k: _number(v, f"progress[{k!r}]") for k, v in sorted(progress.items())},
    )


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad(f"{name}: expected a number, got {_shown(value)}")
    if not math.isfinite(value):
        raise _Bad(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _optional(value: object, name: str) -> float | None:
    return None if value is None else _number(value, name)


def _count(value: object, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _Bad(f"{name}: expected a whole number >= {minimum}, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
