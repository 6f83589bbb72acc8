"""Logging goes to the stderr of the moment a line is logged."""

from __future__ import annotations

import io
import json
import sys

import pytest

from wedgewatch.logsetup import configure_logging, get_logger


def test_a_replaced_and_closed_stderr_does_not_break_later_logging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stderr replaced after logging was configured (a test harness, a daemonising
    wrapper) and closed since is not written to: the next line goes to the new stderr."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("info")
    log = get_logger("wedgewatch.test")
    log.info("to_first")
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    log.info("to_second", n=1)
    line = json.loads(second.getvalue().strip())
    assert line["event"] == "to_second"
    assert line["n"] == 1
