"""The detector's memory as JSON and back: `dump_state` / `load_state` (pure).

The daemon persists a target's `TargetState` across a restart of wedgewatch, and
`wedgewatch check` keeps it between runs. `load_state` accepts only what `dump_state`
writes (this format version, every field typed, engines sorted) and raises ValueError
naming the first malformed field, so a damaged file is a clear message, never a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from wedgewatch.core.detect import EngineMemory, TargetState
from wedgewatch.core.states import STALLED, EngineState, Family
from wedgewatch.vllm.signals import EngineKey, EngineReading

_FORMAT_VERSION = 1
_READING_FLOATS = (
    "running",
    "waiting",
    "prompt_tokens",
    "generation_tokens",
    "request_success",
    "preemptions",
    "iterations",
)


def dump_state(state: TargetState) -> dict[str, Any]:
    """The state as a JSON-safe dict (dicts, lists, str, float, bool, None); see `load_state`."""
    return {
        "version": _FORMAT_VERSION,
        "starting_since": state.starting_since,
        "failing_since": state.failing_since,
        "last_at": state.last_at,
        "process_start_time_seconds": state.process_start_time_seconds,
        "engines": [_dump_memory(m) for m in state.engines],
    }


def _dump_memory(memory: EngineMemory) -> dict[str, Any]:
    reading = memory.reading
    dumped_reading: dict[str, Any] = {
        name: float(getattr(reading, name)) for name in _READING_FLOATS
    }
    dumped_reading["waiting_by_reason"] = {
        str(k): float(v) for k, v in sorted(reading.waiting_by_reason.items())
    }
    dumped_reading["kv_cache_usage"] = (
        None if reading.kv_cache_usage is None else float(reading.kv_cache_usage)
    )
    dumped_reading["awake"] = reading.awake
    return {
        "model_name": memory.key.model_name,
        "engine": memory.key.engine,
        "state": memory.state.value,
        "family": None if memory.family is None else memory.family.value,
        "since_at": memory.since_at,
        "last_progress_at": memory.last_progress_at,
        "last_output_at": memory.last_output_at,
        "output_pending": memory.output_pending,
        "missing_since": memory.missing_since,
        "acted": memory.acted,
        "reading": dumped_reading,
    }


def load_state(data: Mapping[str, Any]) -> TargetState:
    """Rebuild a `TargetState` from `dump_state` output; ValueError names what is malformed."""
    fields = _Fields(data, "state")
    version = fields.get("version")
    if version != _FORMAT_VERSION or isinstance(version, bool):
        raise ValueError(f"state.version: expected {_FORMAT_VERSION}, got {version!r}")
    starting_since = fields.optional_number("starting_since")
    failing_since = fields.optional_number("failing_since")
    last_at = fields.optional_number("last_at")
    process_start = fields.optional_number("process_start_time_seconds")
    raw_engines = fields.get("engines")
    fields.done()
    if not isinstance(raw_engines, list):
        raise ValueError(f"state.engines: expected a list, got {type(raw_engines).__name__}")
    engines = tuple(_load_memory(raw, f"state.engines[{i}]") for i, raw in enumerate(raw_engines))
    keys = [m.key for m in engines]
    for i in range(1, len(keys)):
        if keys[i] <= keys[i - 1]:
            raise ValueError(
                f"state.engines[{i}]: engines must be sorted by (model_name, engine) without "
                f"duplicates; {keys[i]} follows {keys[i - 1]}"
            )
    return TargetState(
        engines=engines,
        starting_since=starting_since,
        failing_since=failing_since,
        last_at=last_at,
        process_start_time_seconds=process_start,
    )


def _load_memory(raw: object, path: str) -> EngineMemory:
    fields = _Fields(raw, path)
    key = EngineKey(model_name=fields.text("model_name"), engine=fields.text("engine"))
    state = fields.enum("state", EngineState)
    family_raw = fields.get("family")
    family = None if family_raw is None else _enum(Family, family_raw, f"{path}.family")
    if state is EngineState.STARTING:
        raise ValueError(f"{path}.state: an engine is never 'starting' (only a target is)")
    if (state in STALLED) != (family is not None):
        raise ValueError(
            f"{path}.family: {family_raw!r} does not fit state {state.value!r} "
            "(suspect, wedged and unreachable need a family; other states have none)"
        )
    memory = EngineMemory(
        key=key,
        state=state,
        family=family,
        since_at=fields.number("since_at"),
        last_progress_at=fields.number("last_progress_at"),
        last_output_at=fields.number("last_output_at"),
        output_pending=fields.flag("output_pending"),
        missing_since=fields.optional_number("missing_since"),
        acted=fields.flag("acted"),
        reading=_load_reading(fields.get("reading"), key, f"{path}.reading"),
    )
    fields.done()
    return memory


def _load_reading(raw: object, key: EngineKey, path: str) -> EngineReading:
    fields = _Fields(raw, path)
    values = {name: fields.number(name) for name in _READING_FLOATS}
    by_reason_raw = fields.get("waiting_by_reason")
    if not isinstance(by_reason_raw, dict):
        raise ValueError(
            f"{path}.waiting_by_reason: expected an object, got {type(by_reason_raw).__name__}"
        )
    by_reason: dict[str, float] = {}
    for reason, value in by_reason_raw.items():
        if not isinstance(reason, str):
            raise ValueError(f"{path}.waiting_by_reason: keys must be strings, got {reason!r}")
        by_reason[reason] = _float(value, f"{path}.waiting_by_reason.{reason}")
    kv_cache_usage = fields.optional_number("kv_cache_usage")
    awake = fields.get("awake")
    if awake is not None and not isinstance(awake, bool):
        raise ValueError(f"{path}.awake: expected true, false or null, got {awake!r}")
    fields.done()
    return EngineReading(
        key=key,
        running=values["running"],
        waiting=values["waiting"],
        waiting_by_reason=by_reason,
        kv_cache_usage=kv_cache_usage,
        awake=awake,
        prompt_tokens=values["prompt_tokens"],
        generation_tokens=values["generation_tokens"],
        request_success=values["request_success"],
        preemptions=values["preemptions"],
        iterations=values["iterations"],
    )


_E = TypeVar("_E", EngineState, Family)


class _Fields:
    """Reads the keys of one JSON object, naming the path of whatever is wrong."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{path}: expected an object, got {type(raw).__name__}")
        self._raw: Mapping[object, object] = raw
        self._path = path
        self._seen: set[str] = set()

    def get(self, name: str) -> Any:
        if name not in self._raw:
            raise ValueError(f"{self._path}: missing key {name!r}")
        self._seen.add(name)
        return self._raw[name]

    def number(self, name: str) -> float:
        return _float(self.get(name), f"{self._path}.{name}")

    def optional_number(self, name: str) -> float | None:
        value = self.get(name)
        return None if value is None else _float(value, f"{self._path}.{name}")

    def flag(self, name: str) -> bool:
        value = self.get(name)
        if not isinstance(value, bool):
            raise ValueError(f"{self._path}.{name}: expected true or false, got {value!r}")
        return value

    def text(self, name: str) -> str:
        value = self.get(name)
        if not isinstance(value, str):
            raise ValueError(f"{self._path}.{name}: expected a string, got {value!r}")
        return value

    def enum(self, name: str, enum: type[_E]) -> _E:
        return _enum(enum, self.get(name), f"{self._path}.{name}")

    def done(self) -> None:
        unknown = sorted(str(k) for k in self._raw if k not in self._seen)
        if unknown:
            raise ValueError(f"{self._path}: unknown key(s) {', '.join(map(repr, unknown))}")


def _float(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}: expected a number, got {value!r}")
    return float(value)


def _enum(enum: type[_E], value: object, path: str) -> _E:
    allowed = ", ".join(member.value for member in enum)
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected one of {allowed}, got {value!r}")
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{path}: expected one of {allowed}, got {value!r}") from None
