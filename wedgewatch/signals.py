"""The one module that knows vLLM's metric names: `/metrics` text -> per-engine readings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class EngineKey:
    """Identifies one engine of a server: vLLM's `model_name` and `engine` labels."""

    model_name: str
    engine: str


@dataclass(frozen=True, slots=True)
class EngineReading:
    """What one scrape says about one engine."""

    key: EngineKey
    running: float
    waiting: float
    waiting_by_reason: Mapping[str, float]
    kv_cache_usage: float | None
    awake: bool | None
    prompt_tokens: float
    generation_tokens: float
    request_success: float
    preemptions: float
    iterations: float

    @property
    def deferred(self) -> float:
        """Requests parked in `skipped_waiting` (0 when the by-reason family is absent)."""
        return self.waiting_by_reason.get("deferred", 0.0)

    @property
    def capacity(self) -> float:
        """Requests in the FCFS `waiting` queue (total waiting on old vLLM without reasons)."""
        return self.waiting_by_reason.get("capacity", self.waiting if not self.waiting_by_reason else 0.0)

    @property
    def progress(self) -> tuple[float, float, float, float, float]:
        """Every progress counter, in a fixed order: prompt, generation, success, preemptions, iterations."""
        return (
            self.prompt_tokens,
            self.generation_tokens,
            self.request_success,
            self.preemptions,
            self.iterations,
        )


@dataclass(frozen=True, slots=True)
class Exposition:
    """A parsed `/metrics` body: one reading per engine."""

    engines: Mapping[EngineKey, EngineReading]
    process_start_time_seconds: float | None


@dataclass(frozen=True, slots=True)
class ParseFailure:
    """A body that is not vLLM's exposition, with a specific reason."""

    message: str


def parse(body: bytes | str) -> Exposition | ParseFailure:
    """Parse a full vLLM `/metrics` body (implementation in progress)."""
    raise NotImplementedError
