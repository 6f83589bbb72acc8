"""The words wedgewatch judges with, in one place: engine states, stall families, scrape
failure reasons, which threshold setting governs each family, evidence capture phases and
capture failure reasons.

The detector decides with them, the daemon's own metrics label with them, `/status` and
`/probe` report them, and the docs list them; every one of those imports them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Literal, get_args


class EngineState(StrEnum):
    """What the detector believes about one engine (or, for the worst of them, a target)."""

    STARTING = "starting"
    OK = "ok"
    IDLE = "idle"
    SLEEPING = "sleeping"
    SUSPECT = "suspect"
    WEDGED = "wedged"
    UNREACHABLE = "unreachable"
    UNKNOWN = "unknown"  # non-finite readings, or a URL that reaches more than one server


class Family(StrEnum):
    """The kind of stall behind a SUSPECT, WEDGED or UNREACHABLE engine."""

    DEFERRED_STALL = "deferred_stall"
    DEFERRED_ONLY_STALL = "deferred_only_stall"
    ADMISSION_STALL = "admission_stall"
    PROGRESS_STALL = "progress_stall"
    OUTPUT_STALL = "output_stall"
    UNREACHABLE = "unreachable"
    CANARY_STALL = "canary_stall"


#: Worst first: a target's state is the first of these that any of its engines is in.
SEVERITY: tuple[EngineState, ...] = (
    EngineState.WEDGED,
    EngineState.UNREACHABLE,
    EngineState.UNKNOWN,
    EngineState.SUSPECT,
    EngineState.STARTING,
    EngineState.OK,
    EngineState.SLEEPING,
    EngineState.IDLE,
)

#: An engine in one of these is in a stall episode (evidence is captured from SUSPECT on).
STALLED: frozenset[EngineState] = frozenset(
    {EngineState.SUSPECT, EngineState.WEDGED, EngineState.UNREACHABLE}
)
#: The states that are acted on (capture and restart) and that fail `/probe`.
ACTED_ON: frozenset[EngineState] = frozenset({EngineState.WEDGED, EngineState.UNREACHABLE})
#: Healthy: nothing to watch for, restarts may re-arm after long enough in these.
CALM: frozenset[EngineState] = frozenset({EngineState.OK, EngineState.IDLE, EngineState.SLEEPING})

#: The setting whose number of seconds turns a stall of each family into WEDGED (UNREACHABLE).
THRESHOLD_SETTING: Mapping[Family, str] = {
    Family.DEFERRED_STALL: "stall_after_seconds",
    Family.DEFERRED_ONLY_STALL: "deferred_only_after_seconds",
    Family.ADMISSION_STALL: "stall_after_seconds",
    Family.PROGRESS_STALL: "hang_after_seconds",
    Family.OUTPUT_STALL: "output_stall_after_seconds",
    Family.UNREACHABLE: "unreachable_after_seconds",
    Family.CANARY_STALL: "canary_timeout_seconds",
}
#: Each threshold setting once, in family order: the detector `DetectionPolicy`'s fields (with
#: `startup_timeout_seconds`), the thresholds a bundle and a webhook record.
THRESHOLD_SETTINGS: tuple[str, ...] = tuple(dict.fromkeys(THRESHOLD_SETTING.values()))


class CapturePhase(StrEnum):
    """Which evidence capture a bundle part belongs to: opened at suspect, completed at
    wedged, or taken on demand (`wedgewatch capture`). The values name the rounds in a
    bundle's `summary.json`, its file names and the `phase` label of the capture metric."""

    SUSPECT = "suspect"
    WEDGED = "wedged"
    MANUAL = "manual"


#: The phases the detector and the episode core ask for (a manual capture is an operator's).
EpisodePhase = Literal[CapturePhase.SUSPECT, CapturePhase.WEDGED]


class CaptureFailureReason(StrEnum):
    """Why an evidence capture step failed: a closed set, the `reason` label of
    `wedgewatch_evidence_capture_failures_total`."""

    WRITE_FAILED = "write_failed"  # the bundle could not be written
    PTRACE_DENIED = "ptrace_denied"  # py-spy without root or CAP_SYS_PTRACE
    TIMEOUT = "timeout"  # the capture deadline passed
    INCOMPLETE = "incomplete"  # some part failed
    ERROR = "error"  # the capture raised (a bug, or an unwritable evidence_dir)


class NotifyEvent(StrEnum):
    """The events wedgewatch sends to webhooks (the same names as its log lines); no others.

    The episode core's `Report` effect notifies exactly when its `ReportEvent` maps to one
    of these (`core.episode_types.notify_event`, an exhaustive match).
    """

    WEDGE_DETECTED = "wedge_detected"
    TARGET_UNREACHABLE = "target_unreachable"
    ENGINE_RECOVERED = "engine_recovered"
    RESTART_REQUESTED = "restart_requested"
    RESTART_SUCCEEDED = "restart_succeeded"
    RESTART_FAILED = "restart_failed"
    GAVE_UP = "gave_up"
    GAVE_UP_CLEARED = "gave_up_cleared"


#: Why a scrape produced no exposition: a closed set.
ScrapeFailureReason = Literal[
    "timeout",
    "refused",
    "connect_error",
    "http_status",
    "parse_error",
    "too_large",
    "too_many_engines",
]
SCRAPE_FAILURE_REASONS: tuple[ScrapeFailureReason, ...] = get_args(ScrapeFailureReason)
