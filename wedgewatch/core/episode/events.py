"""Every event the core reports, as one closed type.

`ReportEvent` is the `event` of the daemon's log lines, the key of its own metrics
(`daemon/report.py`), of the remedy notes (`daemon/target.py`) and of the webhooks
(`episode_types.notify_event`). The restart policy's facts are members of it too:
`restart_policy.PolicyEventKind` is the `Literal` of the six it reports, so the episode core
reports a policy event under its own kind with no second enum to keep in step, and a match
on it ends in `assert_never` (tests/report/test_report_events.py renames and adds members and
checks that mypy fails where the shell or the core did not follow).
"""

from __future__ import annotations

from enum import StrEnum


class ReportEvent(StrEnum):
    """Every event the episode core reports: a closed set, the `event` of its log lines.

    The shell matches on it (own metrics in `daemon/report.py`, remedy notes in
    `daemon/target.py`) with `assert_never` in the last case, so renaming or adding a member
    without deciding what the shell does with it fails mypy. The values are the log lines'
    event names (docs/daemon.md) and never change with a member's name.
    """

    # T1: detector transitions (core/episode/transitions.py)
    STALL_SUSPECTED = "stall_suspected"
    WEDGE_DETECTED = "wedge_detected"
    TARGET_UNREACHABLE = "target_unreachable"
    ENGINE_RECOVERED = "engine_recovered"
    ENGINE_UNKNOWN = "engine_unknown"
    ENGINE_DISCOVERED = "engine_discovered"
    ENGINE_STATE_CHANGED = "engine_state_changed"
    # E1, E2: the episode
    EPISODE_OPENED = "episode_opened"
    EPISODE_CLOSED = "episode_closed"
    # C3, C4: evidence
    EVIDENCE_CAPTURED = "evidence_captured"
    EVIDENCE_CAPTURE_FAILED = "evidence_capture_failed"
    SUSPECT_CAPTURE_SKIPPED = "suspect_capture_skipped"
    # R1-R3, W1: restarts
    RESTART_SKIPPED = "restart_skipped"
    RESTART_WAITING = "restart_waiting"
    RESTART_DEFERRED = "restart_deferred"
    RESTART_REQUESTED = "restart_requested"
    RESTART_COMPLETED = "restart_completed"
    # P*: the restart policy's events (`restart_policy.PolicyEventKind`, a subset of these)
    RESTART_SUCCEEDED = "restart_succeeded"
    RESTART_FAILED = "restart_failed"
    GAVE_UP = "gave_up"
    GAVE_UP_CLEARED = "gave_up_cleared"
    BACKOFF_RESET = "backoff_reset"
    BUDGET_RESET = "budget_reset"
    # K1-K4: the cure ladder's abort rung (core/restart/ladder.py)
    ABORT_REQUESTED = "abort_requested"
    ABORT_SKIPPED = "abort_skipped"
    ABORT_SUCCEEDED = "abort_succeeded"
    ABORT_FAILED = "abort_failed"
