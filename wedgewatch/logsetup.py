"""Logging for every command: structlog to stderr, configured once per process.

A module of its own so that the probe path (`wedgewatch check`) can configure logging only
when it has something to log: importing structlog costs more than the rest of a probe.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from wedgewatch.lograte import TargetLogLimit

_configured: list[str] = []  # the level configured, once configure_logging ran


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    """A print logger on the `sys.stderr` of the moment the line is logged, not of the
    moment logging was configured (which may have been replaced and closed since)."""
    return structlog.PrintLogger(file=sys.stderr)


def configure_logging(level: str = "info") -> None:
    """structlog to stderr: a console renderer on a terminal, JSON lines otherwise.

    JSON lines carry a `log.exception` traceback as text in the `exception` field (the
    console renderer prints it itself).
    """
    renderers: list[Any] = (
        [structlog.dev.ConsoleRenderer()]
        if sys.stderr.isatty()
        else [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    )
    structlog.configure(
        processors=[
            TargetLogLimit(),  # a target cannot flood the logs
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *renderers,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    _configured[:] = [level]


def get_logger(name: str, level: str = "info") -> Any:
    """A logger named `name`; configures logging at `level` first if nothing did yet."""
    if not _configured:
        configure_logging(level)
    return structlog.get_logger(name)
