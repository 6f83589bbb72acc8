"""Fuzz: the HTTP/1.1 response parser takes any bytes a target sends, in any pieces.

`io.http_parse` reads what a watched server answers on every scrape, before anything else
looks at it: whatever arrives, in whatever pieces, it yields events or raises
`ProtocolError`, never anything else, and never loops or buffers without bound.
"""

from __future__ import annotations

import itertools

from fuzzing import FUZZ, HOSTILE_WORDS, within_cpu
from hypothesis import given
from hypothesis import strategies as st

from wedgewatch.io import http_parse
from wedgewatch.io.http_parse import Data, End, Head, NeedData, ProtocolError, ResponseParser

_PIECES = (
    b"HTTP/1.1 200 OK\r\n", b"HTTP/1.0 204 No\r\n", b"HTTP/1.1 100 Continue\r\n\r\n",
    b"Content-Length: 5\r\n", b"Content-Length: 5, 6\r\n", b"Content-Length: -1\r\n",
    b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: gzip\r\n", b"Connection: close\r\n",
    b"\r\n", b"\n", b"\r\n\r\n", b"5\r\nhello\r\n", b"0\r\n\r\n", b"ffffffffffffffffff\r\n",
    b"-1\r\n", b"5;ext=1\r\n", b" folded\r\n", b":\r\n", b"X: \x00\xff\r\n", b"a" * 70_000,
)  # fmt: skip
responses = st.one_of(
    st.binary(max_size=2048),
    st.lists(
        st.sampled_from(_PIECES)
        | st.binary(max_size=16)
        | st.sampled_from(HOSTILE_WORDS).map(lambda word: word.encode("utf-8", "surrogatepass")),
        max_size=30,
    ).map(b"".join),
)


def _drain(parser: ResponseParser, events: list[object]) -> bool:
    """Take events until the parser needs data (False) or the response ended (True)."""
    for _ in range(100_000):  # a parser that never stops yielding is a bug
        event = parser.next_event()
        if isinstance(event, NeedData):
            return False
        assert isinstance(event, Head | Data | End), event
        events.append(event)
        if isinstance(event, End):
            return True
    raise AssertionError("no end of events")


def _read(data: bytes, cuts: list[int]) -> list[object]:
    parser = ResponseParser()
    events: list[object] = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    try:
        for start, end in itertools.pairwise(bounds):
            parser.receive_data(data[start:end])
            if _drain(parser, events):
                return events
        parser.receive_data(b"")
        _drain(parser, events)
    except ProtocolError:
        pass
    return events


@FUZZ
@given(responses, st.lists(st.integers(0, 100_000), max_size=8))
def test_any_response_in_any_pieces_gives_events_or_a_protocol_error(
    data: bytes, cuts: list[int]
) -> None:
    """Hostile bytes cut anywhere: only events or `ProtocolError`; the body never exceeds
    what was sent."""
    events = within_cpu(lambda: _read(data, cuts))
    assert sum(len(e.data) for e in events if isinstance(e, Data)) <= len(data)


@FUZZ
@given(responses)
def test_any_response_head_parses_or_raises_a_protocol_error(head: bytes) -> None:
    """`parse_head` on any bytes: a status of three digits and str headers, or `ProtocolError`."""
    try:
        status, headers = within_cpu(lambda: http_parse.parse_head(head))
    except ProtocolError:
        return
    assert 0 <= status <= 999
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
