"""A per-target bound on log lines: a target cannot flood the logs.

Whatever a watched server does (name a new engine on every scrape, flap every second), the
lines wedgewatch logs about it (those with a `target` field) are bounded to
`LINES_PER_TARGET_PER_MINUTE` per minute and target. The first line over the bound becomes
one `log_lines_suppressed` line saying so; the others are dropped and counted, and the
count comes with the target's next line that is let through
(`dropped_log_lines`, how many were dropped since the previous line that got through).
Lines without a target (the daemon's own) are never limited.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

#: The most lines logged about one target in one minute.
LINES_PER_TARGET_PER_MINUTE: Final = 1000
#: The most targets whose windows are remembered (more targets than that: the oldest
#: windows are forgotten, which at worst lets a burst through again).
MAX_TRACKED_TARGETS: Final = 10_000
_WINDOW_SECONDS: Final = 60.0


@dataclass(slots=True)
class _Window:
    started: float
    lines: int = 0
    dropped: int = 0


class TargetLogLimit:
    """A structlog processor applying the bound (one per process)."""

    def __init__(
        self,
        lines_per_minute: int = LINES_PER_TARGET_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines_per_minute = lines_per_minute
        self._clock = clock
        self._windows: dict[str, _Window] = {}

    def __call__(
        self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        """Let the line through, turn it into the suppression notice, or drop it."""
        target = event_dict.get("target")
        if not isinstance(target, str):
            return event_dict
        now = self._clock()
        window = self._windows.get(target)
        if window is None or now - window.started >= _WINDOW_SECONDS:
            dropped = window.dropped if window is not None else 0
            if window is None and len(self._windows) >= MAX_TRACKED_TARGETS:
                del self._windows[next(iter(self._windows))]
            window = self._windows[target] = _Window(now, dropped=dropped)
        window.lines += 1
        if window.lines <= self.lines_per_minute:
            if window.dropped:
                event_dict["dropped_log_lines"] = window.dropped
                window.dropped = 0
            return event_dict
        if window.lines == self.lines_per_minute + 1:
            return {
                "event": "log_lines_suppressed",
                "target": target,
                "limit_per_minute": self.lines_per_minute,
                "note": "more lines about this target are dropped until the minute is over; "
                "the next line that gets through says how many (dropped_log_lines)",
                "first_dropped": event_dict.get("event"),
            }
        window.dropped += 1
        raise structlog.DropEvent
