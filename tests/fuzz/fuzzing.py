"""The fuzz harness's settings and hostile strategies, shared by tests/fuzz.

Two hypothesis profiles: `fuzz-quick` (the default tier: a few dozen examples a test, a
couple of seconds each) and `fuzz-long` (the heavy tier, `tests/run.sh --real`, which sets
`TEST_FUZZ_PROFILE=long`: a thousand examples a test). Each fuzz test is decorated with
`FUZZ`, so the choice applies to these tests only, whatever profile the rest of the suite
loads. No deadline (a loaded machine is not a bug); "no unbounded time" is `within_cpu`, a
bound on the CPU time (`time.process_time`) of one call, far above what a linear
implementation needs for the largest example.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

T = TypeVar("T")

settings.register_profile(
    "fuzz-quick",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz-long",
    max_examples=1000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = "fuzz-long" if os.environ.get("TEST_FUZZ_PROFILE") == "long" else "fuzz-quick"
FUZZ = settings.get_profile(PROFILE)

CPU_SECONDS = 2.0  # one call on the largest example (~200k characters); linear code: < 0.3 s

# Characters that start markup, escapes, URLs, secrets, quotes and line structure.
HOSTILE_ALPHABET = "aZ09 _-.:/?#&;=@%+*!~`'\"\\<>[](){}|,\t\n\r\x00\x1b\x7f\u0085\u2028\u202e\ufeff"
HOSTILE_WORDS = (
    "<script>", "</script>", "<img src=http://evil.example/i.png>", "![p](http://evil.example/p)",
    "[x](javascript:alert(1))", "<!--", "-->", "```", "`", "\\", "&lt;", "--api-key",
    "--hf-token=", "token=", "HF_TOKEN=", "apiKey", '"secret": "', "Bearer ", "http://",
    "https://u:PLANTED@h/?token=PLANTED#k=v", "://", "PLANTED", "\x1b]0;t\x07", "\u202e",
    '{engine="0",model_name="', '"}', "\\n", "\\\"", "# HELP ", "# TYPE ", "vllm:", "{", "}",
    "[", "]", "]]", "[[", "=", '"', "'''", '"""', "\r\n", "\n\n", "|", "*", "_",
)  # fmt: skip

hostile_text: st.SearchStrategy[str] = st.one_of(
    st.text(alphabet=HOSTILE_ALPHABET, max_size=200),
    st.lists(st.sampled_from(HOSTILE_WORDS) | st.text(max_size=6), max_size=40).map("".join),
    # One short unit repeated to ~200k characters: what exposes a quadratic pattern.
    st.builds(
        lambda unit, times, tail: unit * times + tail,
        st.text(alphabet=HOSTILE_ALPHABET, min_size=1, max_size=6) | st.sampled_from(HOSTILE_WORDS),
        st.integers(1, 50_000),
        st.sampled_from(HOSTILE_WORDS),
    ).map(lambda text: text[:200_000]),
)


def within_cpu(call: Callable[[], T], seconds: float = CPU_SECONDS) -> T:
    """`call()`'s result, asserting it used less than `seconds` of this process's CPU."""
    started = time.process_time()
    result = call()
    spent = time.process_time() - started
    assert spent < seconds, f"{spent:.2f} s of CPU for one example"
    return result
