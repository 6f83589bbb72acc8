"""The detector's inputs and outputs: observations, the policy, actions and verdicts (pure).

`core.detect` judges with them and re-exports them; callers may import from either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from wedgewatch.core.states import (
    SCRAPE_FAILURE_REASONS,
    THRESHOLD_SETTING,
    THRESHOLD_SETTINGS,
    EngineState,
    EpisodePhase,
    Family,
    ScrapeFailureReason,
)
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition

__all__ = [
    "Action",
    "CanaryStall",
    "CaptureEvidence",
    "EngineVerdict",
    "Observation",
    "Policy",
    "Restart",
    "ScrapeFailed",
    "Scraped",
    "TargetVerdict",
    "Transition",
]


@dataclass(frozen=True, slots=True)
class Scraped:
    """A good scrape: the parsed exposition, observed at monotonic time `at`."""

    at: float
    exposition: Exposition


@dataclass(frozen=True, slots=True)
class ScrapeFailed:
    """A scrape that produced no exposition, with a reason from a closed set."""

    at: float
    reason: ScrapeFailureReason
    detail: str

    def __post_init__(self) -> None:
        """Reject a reason outside the closed set (a bug in the caller, not in the server)."""
        if self.reason not in SCRAPE_FAILURE_REASONS:
            allowed = ", ".join(sorted(SCRAPE_FAILURE_REASONS))
            raise ValueError(f"ScrapeFailed.reason must be one of {allowed}, got {self.reason!r}")


Observation = Scraped | ScrapeFailed


@dataclass(frozen=True, slots=True)
class Policy:
    """Thresholds of the detector, in seconds; `startup_timeout_seconds=None` waits forever.

    `deferred_only_after_seconds = 0` disables the deferred_only_stall family (rule R4).
    """

    stall_after_seconds: float = 60.0
    hang_after_seconds: float = 120.0
    output_stall_after_seconds: float = 300.0
    unreachable_after_seconds: float = 30.0
    startup_timeout_seconds: float | None = None
    deferred_only_after_seconds: float = 600.0
    canary_timeout_seconds: float = 120.0
    # Bounds on what a target makes the detector remember (rules U4, U5 of core.detect):
    # engines across scrapes, and how long an engine gone from /metrics is kept.
    max_engines: int = 256
    vanished_engine_expiry_seconds: float = 600.0

    def __post_init__(self) -> None:
        """Reject thresholds that are negative, NaN or infinite, and a bound below 1."""
        if isinstance(self.max_engines, bool) or not isinstance(self.max_engines, int):
            raise ValueError(f"Policy.max_engines must be a whole number, got {self.max_engines!r}")
        if self.max_engines < 1:
            raise ValueError(f"Policy.max_engines must be >= 1, got {self.max_engines}")
        names = (*THRESHOLD_SETTINGS, "startup_timeout_seconds", "vanished_engine_expiry_seconds")
        for name in names:
            value = getattr(self, name)
            if value is None and name == "startup_timeout_seconds":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"Policy.{name} must be a number of seconds, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"Policy.{name} must be finite and >= 0, got {value!r}")

    def threshold(self, family: Family) -> float:
        """The number of seconds after which a stall of `family` is WEDGED (or UNREACHABLE)."""
        seconds: float = getattr(self, THRESHOLD_SETTING[family])
        return seconds


@dataclass(frozen=True, slots=True)
class CanaryStall:
    """Rule K1's input: a canary sent at `since_at` got no token while nothing progressed."""

    since_at: float
    detail: str


@dataclass(frozen=True, slots=True)
class CaptureEvidence:
    """Ask the shell to capture evidence about one engine (stacks, metrics, process state)."""

    key: EngineKey
    family: Family
    phase: EpisodePhase


@dataclass(frozen=True, slots=True)
class Restart:
    """Ask the shell to restart the server that runs this engine (subject to its budget)."""

    key: EngineKey
    family: Family


Action = CaptureEvidence | Restart


@dataclass(frozen=True, slots=True)
class Transition:
    """One engine changed state at `at`; `family` is the new state's stall family, if any."""

    key: EngineKey
    old: EngineState
    new: EngineState
    family: Family | None
    at: float


@dataclass(frozen=True, slots=True)
class EngineVerdict:
    """The judgement of one engine at one step.

    `since_at` is when the engine entered `state`; `reading` is what this step's scrape said
    about the engine (None when the scrape failed or the engine was missing); `missing` is
    True while the engine is absent from good scrapes; `reason` is one human sentence.
    """

    key: EngineKey
    state: EngineState
    family: Family | None
    since_at: float
    stalled_seconds: float
    last_progress_at: float | None
    reading: EngineReading | None
    missing: bool
    reason: str


@dataclass(frozen=True, slots=True)
class TargetVerdict:
    """The judgement of one target at one step: its worst state and each engine's verdict.

    `engines` is sorted by key and empty while no engine is known (rule T1); `failure` is the
    observation when the scrape failed. Actions are ordered: every capture before any restart.
    """

    at: float
    state: EngineState
    engines: tuple[EngineVerdict, ...]
    transitions: tuple[Transition, ...]
    actions: tuple[Action, ...]
    failure: ScrapeFailed | None
