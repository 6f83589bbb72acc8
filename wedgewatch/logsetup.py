"""Logging for every command: structlog to stderr, configured once per process.

A module of its own so that the probe path (`wedgewatch check`) can configure logging only
when it has something to log: importing structlog costs more than the rest of a probe.

Every line passes `safe_fields` before it is rendered, whoever logs it: secrets redacted
(`wedgewatch.core.text.redact.redact_value`), control characters and escape sequences made
visible and long strings cut (`wedgewatch.core.text.escape.neutralise`), so a value from the
target cannot forge a line, drive a terminal or flood the log with one field.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from wedgewatch.core.text.escape import neutralise
from wedgewatch.core.text.redact import redact_value
from wedgewatch.lograte import TargetLogLimit

FIELD_LIMIT = 2000  # characters of one string field of a log line; longer ones are cut

_configured: list[str] = []  # the level configured, once configure_logging ran


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    """A print logger on the `sys.stderr` of the moment the line is logged, not of the
    moment logging was configured (which may have been replaced and closed since)."""
    return structlog.PrintLogger(file=sys.stderr)


def _safe(value: Any, newlines: bool = False) -> Any:
    """A redacted field (JSON-like: `_plain` made every other object its text) neutralised."""
    if isinstance(value, str):
        return neutralise(value, FIELD_LIMIT, newlines=newlines)
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_safe(v) for v in value]
    return value  # a number, a boolean or None


def _plain(value: Any) -> Any:
    """A field as JSON-like data: an object that is not (an exception, a path, a URL object)
    becomes its text, so that the redaction below sees it too."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def safe_fields(_logger: Any, _method: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor, and the one place a log line is redacted: every field of the
    line, whatever its type, redacted, neutralised and bounded (one line per event: a newline
    shows as `\\x0a`, but in a traceback). Callers log raw values."""
    return {
        key: _safe(value, newlines=key == "exception")
        for key, value in redact_value(_plain(event_dict)).items()
    }


def configure_logging(level: str = "info") -> None:
    """structlog to stderr: a console renderer on a terminal, JSON lines otherwise.

    JSON lines carry a `log.exception` traceback as text in the `exception` field (the
    console renderer prints it itself).
    """
    renderers: list[Any] = (
        [structlog.processors.format_exc_info, safe_fields, structlog.dev.ConsoleRenderer()]
        if sys.stderr.isatty()
        else [
            structlog.processors.format_exc_info,
            safe_fields,
            structlog.processors.JSONRenderer(),
        ]
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
