"""Redaction costs CPU in proportion to the text: no pattern of `core.text.redact` backtracks.

A target's strings, exception texts and whole bundle files pass `redact_text`; a hostile
string of a megabyte must cost well under a second of CPU (`time.process_time`, not wall
time, so a loaded machine does not make it flaky). A quadratic pattern costs minutes on these
texts, so a CPU-time alarm (`ITIMER_PROF`) stops it after a few seconds and the test fails
instead of hanging.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import pytest

from wedgewatch.core.text.redact import MASK, redact_text

MB = 1_000_000
CPU_SECONDS = 1.0  # per megabyte; about 0.2 s on the 2-core dev machine
ALARM_SECONDS = 10.0  # what a quadratic pattern is stopped at


def _fill(unit: str, tail: str = "") -> str:
    return unit * (MB // len(unit)) + tail


HOSTILE = {
    # An unbounded scheme run before "://" was retried from every letter of the word.
    "word before a URL": _fill("a", " http://user:PLANTED@host/"),
    "scheme characters before a URL": _fill("a.+-", " http://user:PLANTED@host/"),
    "a word of schemes": _fill("ab:/", " http://user:PLANTED@host/"),
    # One rebuild of the whole text per masked flag value was quadratic in the flags.
    "many secret flags": _fill("--api-key PLANTED "),
    "many URLs with credentials": _fill("http://u:PLANTED@h/?token=PLANTED&a=1 "),
    "one URL with a long query": "http://h/?" + _fill("a" * 100 + "&", "token=PLANTED"),
    "unterminated quoted values": _fill('"key":"\\', " token=PLANTED"),
    "quoted keys without a colon": _fill('"' + "a" * 79, " token=PLANTED"),
    "assignments": _fill("a=", " HF_TOKEN=PLANTED"),
    "escaped quotes in an assignment": 'token="' + _fill('\\"'),
    "bearer and whitespace": "bearer" + _fill(" ", "x Bearer PLANTED1"),
    "a long flag": "--" + _fill("a-", " --hf-token PLANTED"),
    "at signs": _fill("@", " http://PLANTED@h/"),
    "secret pairs": _fill("'password': 'PLANTED', "),
    "capitals in a query": "http://h/?" + _fill("A", "a=1&apiKey=PLANTED"),
}


class _CpuAlarm(Exception):
    pass


@contextmanager
def _cpu_alarm(seconds: float) -> Iterator[None]:
    """Raise `_CpuAlarm` once the process has used `seconds` more of CPU."""

    def ring(_signum: int, _frame: FrameType | None) -> None:
        raise _CpuAlarm

    previous = signal.signal(signal.SIGPROF, ring)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_megabyte_of_hostile_text_is_redacted_in_well_under_a_second_of_cpu(name: str) -> None:
    """Each hostile megabyte costs under a second of CPU, and its planted secret is masked."""
    text = HOSTILE[name]
    assert len(text) >= MB - 100
    started = time.process_time()
    try:
        with _cpu_alarm(ALARM_SECONDS):
            shown = redact_text(text)
    except _CpuAlarm:
        pytest.fail(f"{name}: still redacting after {ALARM_SECONDS:g} s of CPU")
    spent = time.process_time() - started
    assert spent < CPU_SECONDS, f"{name}: {spent:.2f} s of CPU for {len(text)} characters"
    if "PLANTED" in text:
        assert "PLANTED" not in shown, name
        assert MASK in shown, name
