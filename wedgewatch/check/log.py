"""`wedgewatch check`'s log lines, with structlog imported only when something is logged.

An exec probe runs every few seconds and logs nothing at the default level, so it never pays
for importing the logging stack (tests/cli/test_entry.py checks the probe's imports).
"""

from __future__ import annotations

from typing import Any

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_log_level = ["info"]


def set_log_level(level: str) -> None:
    """Log at `level` and above; structlog is imported only when something is logged."""
    _log_level[:] = [level if level in _LEVELS else "info"]


def log(level: str, event: str, **fields: Any) -> None:
    """One log event; the probe path pays for importing structlog only when it logs."""
    if _LEVELS[level] < _LEVELS[_log_level[0]]:
        return
    from wedgewatch.logsetup import get_logger  # noqa: PLC0415 - kept off the probe path

    getattr(get_logger("wedgewatch.check", _log_level[0]), level)(event, **fields)
