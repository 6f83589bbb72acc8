"""Fuzz: the exposition parser reads any body, valid or hostile, without crashing or stalling.

`vllm.signals.parse` is the first code that sees a target's bytes on every scrape: whatever
they hold, it returns a reading or a `ParseFailure` with a bounded message, in bounded CPU.
"""

from __future__ import annotations

from pathlib import Path

from fuzzing import FUZZ, hostile_text, within_cpu
from hypothesis import example, given
from hypothesis import strategies as st

from wedgewatch.vllm import signals

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
VALID = (FIXTURES / "deferred_wedge.prom").read_text()
MESSAGE_CHARS = 2000  # a failure message quotes a short excerpt, never the body
# Inside a sample's value: where the library's message once quoted a whole hostile line.
IN_A_VALUE = VALID.index("\nprocess_start_time_seconds ") + len("\nprocess_start_time_seconds ")


def _check(body: bytes | str) -> None:
    result = within_cpu(lambda: signals.parse(body))
    assert isinstance(result, signals.Exposition | signals.ParseFailure)
    if isinstance(result, signals.ParseFailure):
        assert len(result.message) < MESSAGE_CHARS, result.message[:200]
    else:
        for key in result.engines:
            assert len(key.model_name) <= signals.MAX_LABEL_CHARS + 40  # the cut's marker


@FUZZ
@given(st.integers(0, len(VALID)), hostile_text)
@example(IN_A_VALUE, "0\x7f" * 5000)
def test_a_valid_body_with_hostile_text_inserted_is_read_or_refused(at: int, text: str) -> None:
    """The real exposition with hostile text anywhere in it: a reading or a failure."""
    _check(VALID[:at] + text + VALID[at:])


@FUZZ
@given(hostile_text)
def test_a_hostile_model_name_is_read_or_refused(name: str) -> None:
    """Every model_name label replaced by hostile text (quotes, escapes, newlines, megabytes)."""
    _check(VALID.replace('model_name="', f'model_name="{name}', 3))


@FUZZ
@given(st.binary(max_size=4096))
def test_any_bytes_are_read_or_refused(body: bytes) -> None:
    """Arbitrary bytes (not UTF-8, NUL, nothing): a reading or a failure."""
    _check(body)
