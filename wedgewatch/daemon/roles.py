"""The roles the daemon talks to (Protocols), the data they exchange, and `Deps`.

The watch loop (`daemon.loop`) depends only on these; `daemon.adapters.real_deps` builds the
real ones and the tests pass fakes (a fake clock replays a 30-minute story in milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry

from wedgewatch.core.detection.canary import CanaryResult
from wedgewatch.core.detection.detect import (
    Observation,
)
from wedgewatch.core.detection.states import CaptureFailureReason, EpisodePhase
from wedgewatch.core.values import immutable
from wedgewatch.io import restarters, statefile
from wedgewatch.io.bundle_hook import BundleHook
from wedgewatch.io.procs import ProcessFinder
from wedgewatch.io.supervisor import SupervisorProbe
from wedgewatch.vllm.signals import EngineKey

if TYPE_CHECKING:
    from wedgewatch.config import Target


class Clock(Protocol):
    """Monotonic seconds for durations; wall seconds (Unix time) for what humans read."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def wall(self) -> float:
        """Unix time."""
        ...


class Sleeper(Protocol):
    """Waits between ticks."""

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds` (a fake returns at once after advancing its clock)."""
        ...


@immutable
class ScrapeResult:
    """One scrape: the observation for the detector, the raw body of a good one, its duration."""

    observation: Observation
    body: bytes | None
    duration_seconds: float


class Scraper(Protocol):
    """Scrapes a target's /metrics; failures come back as `ScrapeFailed` observations."""

    async def scrape(self, target: Target) -> ScrapeResult:
        """Scrape once; never raises for anything the server does."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


class CanarySender(Protocol):
    """Sends one canary to a target (`io.canary`); failures come back as data."""

    async def send(self, target: Target, sent_at: float) -> CanaryResult:
        """Send once and measure; never raises for anything the server does."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@immutable
class CaptureRequest:
    """What an evidence capture needs to know: who, why, and what the loop has seen."""

    target: Target
    key: EngineKey
    family: str
    phase: EpisodePhase
    episode_id: str
    bundle: str | None  # the bundle opened at suspect, to be completed; None opens one
    metrics_body: bytes | None
    history: tuple[Mapping[str, Any], ...]
    verdict: Mapping[str, Any]
    verdict_at: float | None = None


@immutable
class CaptureOutcome:
    """What a capture produced: the bundle directory, failed steps (reasons), the triage."""

    bundle: str | None
    failures: tuple[CaptureFailureReason, ...] = ()
    triage: str | None = None
    detail: str = ""
    server_gone: bool = False  # nothing to capture from: not a failure
    triage_kind: str | None = None  # the triage's kind alone (the cure ladder reads it)


@immutable
class AbortOutcome:
    """What the abort cure's call did, and whether the canary sent after it completed."""

    ok: bool
    detail: str
    aborted: int | None = None  # vLLM's count of aborted requests, when it said
    canary_ok: bool = False
    canary_detail: str = ""


class Aborter(Protocol):
    """Sends the abort cure to a target (`io.abort`), then one canary; failures as data."""

    async def abort(self, target: Target, *, proof_seconds: float) -> AbortOutcome:
        """Abort every in-flight request of `target`, then send one canary."""
        ...


class EvidenceCollector(Protocol):
    """Writes or completes an evidence bundle."""

    async def capture(self, request: CaptureRequest) -> CaptureOutcome:
        """Capture evidence; failures of single steps are reported in the outcome."""
        ...

    async def cut_off(self, bundle: str, detail: str) -> None:
        """Record that the bundle's wedged round was cut off at its time limit."""
        ...

    async def resolve(self, bundle: str, note: str) -> None:
        """Mark a suspect bundle whose episode ended without a wedge as routine."""
        ...


class Notifier(Protocol):
    """Sends notifications (webhooks) without blocking the caller."""

    def notify(self, event: str, payload: Mapping[str, Any]) -> None:
        """Queue one notification and return at once."""
        ...

    def failures(self) -> int:
        """Notifications given up on (after retries) since the start."""
        ...

    async def aclose(self, timeout_seconds: float) -> None:
        """Deliver what is queued within `timeout_seconds`, then drop the rest."""
        ...


class StateStore(Protocol):
    """Loads and saves the daemon's persistent state atomically (see statefile)."""

    def load(self) -> statefile.Loaded:
        """The saved state (empty on a first start; a problem string when it was corrupt)."""
        ...

    def save(
        self, state: statefile.SavedState, timestamp: float
    ) -> statefile.Saved | statefile.SaveFailed:
        """Replace the saved state atomically."""
        ...

    def take_resets(self) -> statefile.ResetRequests:
        """Operator requests to reset restart budgets, collected since the last call."""
        ...


class ServiceManager(Protocol):
    """The supervisor of wedgewatch itself (systemd's sd_notify, or nothing)."""

    @property
    def watchdog_seconds(self) -> float | None:
        """The supervisor's watchdog timeout, if any."""
        ...

    def ready(self, status: str = "") -> bool:
        """Startup finished."""
        ...

    def watchdog(self) -> bool:
        """The loop is alive."""
        ...

    def status(self, status: str) -> bool:
        """A one-line status for `systemctl status`."""
        ...

    def stopping(self, status: str = "") -> bool:
        """Shutdown began."""
        ...


@immutable
class Deps:
    """Everything the daemon talks to; `real_deps(config)` builds the real ones."""

    clock: Clock
    sleeper: Sleeper
    scraper: Scraper
    evidence: EvidenceCollector
    restarters: Mapping[str, restarters.Restarter]  # by target name; empty for remedy "none"
    finder: ProcessFinder
    notifier: Notifier
    state_store: StateStore
    service: ServiceManager
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    serve_http: bool = True
    # Asks a target's supervisor (systemd) whether it is already restarting the server.
    supervisor_probe: SupervisorProbe | None = None
    canary: CanarySender | None = None  # None: no canary is ever sent
    bundle_hook: BundleHook | None = None  # `on_bundle`; None: no hook
    aborter: Aborter | None = None  # the abort cure (`abort_first`); None: never aborts
