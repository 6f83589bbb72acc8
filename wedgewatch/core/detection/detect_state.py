"""The detector's memory as JSON and back: `dump_state` / `load_state` (pure).

The daemon persists a target's `TargetState` across a restart of wedgewatch, and
`wedgewatch check` keeps it between runs. `load_state` accepts only what `dump_state`
writes (this format version, every field typed, engines sorted) and raises ValueError
naming the first malformed field, so a damaged file is a clear message, never a crash.
A file keeps no secret: model names are written in their redacted form
(`core.redact.redact_text`), and the detector matches such a restored engine to the live one
by that form on the next scrape (`core.detect.adopt_redacted_keys`).
JSON has no NaN: non-finite reading values are written as "NaN", "Infinity" and
"-Infinity" (`vllm.semantics.encode_float`) and read back as floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from wedgewatch.core.detection.detect import MAX_START_TIMES, EngineMemory, TargetState
from wedgewatch.core.detection.states import STALLED, EngineState, Family
from wedgewatch.core.text.redact import redact_text
from wedgewatch.vllm import semantics
from wedgewatch.vllm.signals import EngineKey, EngineReading

# Version 2: completed requests by finished reason, prefix-cache queries, the suspect capture
# and deferred-only flags, start times (T5), and non-finite readings encoded as strings.
_FORMAT_VERSION = 2
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
    """The state as a JSON-safe dict (dicts, lists, str, float, bool, None); see `load_state`.

    JSON has no NaN: a non-finite reading value is written as "NaN", "Infinity" or
    "-Infinity" (`semantics.encode_float`), so `json.dumps(..., allow_nan=False)` never fails.
    """
    return {
        "version": _FORMAT_VERSION,
        "starting_since": state.starting_since,
        "failing_since": state.failing_since,
        "last_at": state.last_at,
        "process_start_time_seconds": state.process_start_time_seconds,
        "start_times": [[value, seen] for value, seen in state.start_times],
        "multi_server_since": state.multi_server_since,
        "engines": _dump_engines(state.engines),
    }


def _dump_engines(engines: tuple[EngineMemory, ...]) -> list[dict[str, Any]]:
    """The engines under their redacted keys, sorted by them; should two model names
    redact alike, the first is kept (the other starts from a fresh baseline)."""
    dumped: dict[EngineKey, dict[str, Any]] = {}
    for memory in engines:
        key = stored_key(memory.key)
        if key not in dumped:
            dumped[key] = _dump_memory(memory, key)
    return [dumped[key] for key in sorted(dumped)]


def stored_key(key: EngineKey) -> EngineKey:
    """The key as a state file keeps it: the model name without its secrets."""
    return EngineKey(redact_text(key.model_name), key.engine)


def _dump_optional(value: float | None) -> float | str | None:
    return None if value is None else semantics.encode_float(value)


def _dump_memory(memory: EngineMemory, key: EngineKey) -> dict[str, Any]:
    reading = memory.reading
    dumped_reading: dict[str, Any] = {
        name: semantics.encode_float(getattr(reading, name)) for name in _READING_FLOATS
    }
    dumped_reading["waiting_by_reason"] = {
        str(k): semantics.encode_float(v) for k, v in sorted(reading.waiting_by_reason.items())
    }
    dumped_reading["finished_by_reason"] = {
        str(k): semantics.encode_float(v) for k, v in sorted(reading.finished_by_reason.items())
    }
    dumped_reading["kv_cache_usage"] = _dump_optional(reading.kv_cache_usage)
    dumped_reading["prefix_cache_queries"] = _dump_optional(reading.prefix_cache_queries)
    dumped_reading["awake"] = reading.awake
    return {
        "model_name": key.model_name,  # `stored_key`: redacted
        "engine": key.engine,
        "state": memory.state.value,
        "family": None if memory.family is None else memory.family.value,
        "since_at": memory.since_at,
        "last_progress_at": memory.last_progress_at,
        "last_output_at": memory.last_output_at,
        "output_pending": memory.output_pending,
        "missing_since": memory.missing_since,
        "acted": memory.acted,
        "captured": memory.captured,
        "deferred_only": memory.deferred_only,
        "progressed_at": memory.progressed_at,
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
    raw_starts = fields.get("start_times")
    multi_server_since = fields.optional_number("multi_server_since")
    raw_engines = fields.get("engines")
    fields.done()
    start_times = _load_start_times(raw_starts)
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
        start_times=start_times,
        multi_server_since=multi_server_since,
    )


def _load_start_times(raw: object) -> tuple[tuple[float, float], ...]:
    if not isinstance(raw, list) or len(raw) > MAX_START_TIMES:
        raise ValueError(
            f"state.start_times: expected a list of at most {MAX_START_TIMES} [value, seen_at] "
            f"pairs, got {raw!r}"
        )
    pairs = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"state.start_times[{i}]: expected [value, seen_at], got {pair!r}")
        pairs.append(
            (
                _float(pair[0], f"state.start_times[{i}][0]"),
                _float(pair[1], f"state.start_times[{i}][1]"),
            )
        )
    return tuple(pairs)


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
        captured=fields.flag("captured"),
        deferred_only=fields.flag("deferred_only"),
        progressed_at=fields.absent_or_number("progressed_at"),  # absent before it existed
        reading=_load_reading(fields.get("reading"), key, f"{path}.reading"),
    )
    fields.done()
    return memory


def _load_reading(raw: object, key: EngineKey, path: str) -> EngineReading:
    fields = _Fields(raw, path)
    values = {name: fields.value(name) for name in _READING_FLOATS}
    by_reason = fields.value_map("waiting_by_reason")
    finished = fields.value_map("finished_by_reason")
    kv_cache_usage = fields.optional_value("kv_cache_usage")
    prefix_cache_queries = fields.optional_value("prefix_cache_queries")
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
        finished_by_reason=finished,
        prefix_cache_queries=prefix_cache_queries,
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

    def absent_or_number(self, name: str) -> float | None:
        """A key added to the format later: absent or null reads as None."""
        return self.optional_number(name) if name in self._raw else None

    def value(self, name: str) -> float:
        """A reading value: a number, or "NaN", "Infinity", "-Infinity"."""
        return semantics.decode_float(self.get(name), f"{self._path}.{name}")

    def optional_value(self, name: str) -> float | None:
        value = self.get(name)
        return None if value is None else semantics.decode_float(value, f"{self._path}.{name}")

    def value_map(self, name: str) -> dict[str, float]:
        raw = self.get(name)
        path = f"{self._path}.{name}"
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected an object, got {type(raw).__name__}")
        result: dict[str, float] = {}
        for key, value in raw.items():
            if not isinstance(key, str):
                raise ValueError(f"{path}: keys must be strings, got {key!r}")
            result[key] = semantics.decode_float(value, f"{path}.{key}")
        return result

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
    """A time or a start time: always a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{path}: expected a finite number, got {value!r}")
    return float(value)


def _enum(enum: type[_E], value: object, path: str) -> _E:
    allowed = ", ".join(member.value for member in enum)
    if not isinstance(value, str):
        raise ValueError(f"{path}: expected one of {allowed}, got {value!r}")
    try:
        return enum(value)
    except ValueError:
        raise ValueError(f"{path}: expected one of {allowed}, got {value!r}") from None
