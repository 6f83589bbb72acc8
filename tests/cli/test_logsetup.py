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


class _Opaque:
    """An object that is neither a string nor JSON data, whose text holds a secret."""

    def __str__(self) -> str:
        return "connect to http://admin:hunter2pw@127.0.0.1:9/x?token=tok123456"


def test_the_log_processor_alone_masks_a_secret_in_any_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that logs raw values (a string, a nested mapping, an exception, an opaque
    object) under arbitrary field names leaks no secret: the processor is the one place."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    configure_logging("info")
    get_logger("wedgewatch.test").warning(
        "planted",
        anything="--api-key sk-planted-1 and HF_TOKEN=hf_planted_2",
        nested={"inner": ["serve", "--api-key", "sk-planted-3"], "password": "planted-4"},
        error=ValueError("GET http://u:planted-5@127.0.0.1:1/m failed"),
        thing=_Opaque(),
    )
    text = out.getvalue()
    line = json.loads(text.strip())
    assert line["event"] == "planted"
    for secret in ("sk-planted-1", "hf_planted_2", "sk-planted-3", "planted-4", "planted-5"):
        assert secret not in text
    for secret in ("hunter2pw", "tok123456"):
        assert secret not in text
    assert "127.0.0.1:1/m" in line["error"]  # the rest of the value is kept
