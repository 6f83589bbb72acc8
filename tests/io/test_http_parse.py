"""HTTP/1.1 without IO (`io.http_parse`): the GET written, the response parsed, row by row.

Each row is the bytes a server sends and what the parser must make of them: the head,
the body, whether the connection may be reused, or the `ProtocolError` it raises. Every
row runs twice: the bytes at once, and one byte at a time (the framing must not depend
on how the bytes are cut). The transports around the parser are tested over real
sockets in `test_http1.py` and `test_http_get.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from wedgewatch.io.http_parse import (
    MAX_CHUNK_LINE_BYTES,
    MAX_HEAD_BYTES,
    MAX_HEADER_FIELDS,
    NEED_DATA,
    Data,
    End,
    Head,
    ProtocolError,
    ResponseParser,
    get_request,
    parse_head,
)

OK = b"HTTP/1.1 200 OK\r\n"


@dataclass(frozen=True)
class Read:
    """What the parser made of a response."""

    status: int
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


def read(raw: bytes, *, step: int, close: bool, reset: str | None = None) -> Read:
    """Feed `raw` in pieces of `step` bytes (then the close, if `close`) and read it all."""
    parser = ResponseParser()
    pieces = [raw[i : i + step] for i in range(0, len(raw), step)]
    head: Head | None = None
    body = b""
    while True:
        event = parser.next_event()
        if event is NEED_DATA:
            if pieces:
                parser.receive_data(pieces.pop(0))
            elif reset is not None:
                parser.connection_broken(reset)
            elif close:
                parser.receive_data(b"")
            else:
                raise AssertionError("the parser wants more than the response")
        elif isinstance(event, Head):
            assert head is None, "one head per response"
            head = event
        elif isinstance(event, Data):
            assert head is not None, "body before the head"
            body += event.data
        else:
            assert isinstance(event, End)
            assert head is not None
            assert parser.next_event() == End(), "End stays End"
            return Read(head.status, head.headers, body, parser.keep_alive)


def chunked(data: bytes, size: int, extension: bytes = b"", trailers: bytes = b"") -> bytes:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces)
    return body + b"0\r\n" + trailers + b"\r\n"


BODY = b"vllm:num_requests_running 1\n" * 40

# (id, bytes sent, whether the connection is closed after them, status, body, keep_alive)
FRAMED = [
    ("length", OK + b"Content-Length: 5\r\n\r\nhello", False, 200, b"hello", True),
    ("length-zero", OK + b"Content-Length: 0\r\n\r\n", False, 200, b"", True),
    ("length-repeated", OK + b"Content-Length: 5, 5\r\n\r\nhello", False, 200, b"hello", True),
    (
        "chunked",
        OK + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY, 100),
        False,
        200,
        BODY,
        True,
    ),
    (
        "chunked-extensions-trailers",
        OK
        + b"Transfer-Encoding: Chunked\r\n\r\n"
        + chunked(BODY, 333, b";name=value", b"X-Checksum: 1\r\nX-Other: 2\r\n"),
        False,
        200,
        BODY,
        True,
    ),
    (
        "chunked-bare-lf",
        OK + b"Transfer-Encoding: chunked\n\n5\nhello\n0\n\n",
        False,
        200,
        b"hello",
        True,
    ),
    ("until-close", OK + b"Server: x\r\n\r\n" + BODY, True, 200, BODY, False),
    ("bare-lf-head", b"HTTP/1.1 200 OK\nContent-Length: 2\n\nok", False, 200, b"ok", True),
    (
        "connection-close",
        OK + b"Connection: close\r\nContent-Length: 2\r\n\r\nok",
        False,
        200,
        b"ok",
        False,
    ),
    ("http1.0-length", b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False, 200, b"ok", False),
    (
        "http1.0-keep-alive",
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
        False,
        200,
        b"ok",
        True,
    ),
    (
        "interim-responses-skipped",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
        + OK
        + b"Content-Length: 2\r\n\r\nok",
        False,
        200,
        b"ok",
        True,
    ),
    ("no-content", b"HTTP/1.1 204 No Content\r\n\r\n", False, 204, b"", True),
    (
        "not-modified",
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
        False,
        304,
        b"",
        True,
    ),
    (
        "error-status",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
        False,
        503,
        b"busy",
        True,
    ),
]


@pytest.mark.parametrize("step", [1 << 20, 1], ids=["at-once", "byte-by-byte"])
@pytest.mark.parametrize(
    ("raw", "close", "expected"),
    [pytest.param(raw, close, rest, id=name) for name, raw, close, *rest in FRAMED],
)
def test_a_response_is_framed(raw: bytes, close: bool, expected: list[object], step: int) -> None:
    """The status and the body come out whole, however the bytes were cut."""
    got = read(raw, step=step, close=close)
    assert [got.status, got.body, got.keep_alive] == expected


FIELDS = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADER_FIELDS + 1))

# (id, bytes sent, the words of the ProtocolError); the connection is closed after them.
BROKEN = [
    ("not-http", b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "malformed status line"),
    ("bad-status", b"HTTP/1.1 2OO OK\r\n\r\n", "malformed status line"),
    ("http2", b"HTTP/2 200\r\n\r\n", "malformed status line"),
    ("header-without-colon", OK + b"no colon here\r\n\r\n", "malformed header line"),
    ("space-before-colon", OK + b"Content-Length : 2\r\n\r\nok", "malformed header line"),
    ("folded-header", OK + b"X-A: 1\r\n  continued\r\n\r\n", "malformed header line"),
    ("too-many-fields", OK + FIELDS + b"\r\n", f"more than {MAX_HEADER_FIELDS} header fields"),
    (
        "head-too-long",
        OK + b"X-A: " + b"a" * MAX_HEAD_BYTES,
        f"response head over {MAX_HEAD_BYTES} bytes",
    ),
    ("length-not-a-number", OK + b"Content-Length: 12x\r\n\r\n", "bad Content-Length"),
    (
        "lengths-disagree",
        OK + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        "bad Content-Length",
    ),
    ("length-too-long", OK + b"Content-Length: 1234567890123456789\r\n\r\n", "bad Content-Length"),
    ("negative-length", OK + b"Content-Length: -1\r\n\r\n", "bad Content-Length"),
    (
        "other-transfer-coding",
        OK + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
        "unsupported Transfer-Encoding",
    ),
    ("chunk-size-not-hex", OK + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    ("chunk-size-signed", OK + b"Transfer-Encoding: chunked\r\n\r\n-5\r\n", "bad chunk size"),
    ("chunk-size-plus", OK + b"Transfer-Encoding: chunked\r\n\r\n+5\r\n", "bad chunk size"),
    ("chunk-size-underscore", OK + b"Transfer-Encoding: chunked\r\n\r\n1_0\r\n", "bad chunk size"),
    ("chunk-size-empty", OK + b"Transfer-Encoding: chunked\r\n\r\n\r\n", "bad chunk size"),
    (
        "chunk-line-too-long",
        OK + b"Transfer-Encoding: chunked\r\n\r\n5;" + b"x" * MAX_CHUNK_LINE_BYTES,
        "chunk-size line too long",
    ),
    (
        "chunk-overrun",
        OK + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        "chunk not followed by CRLF",
    ),
    (
        "trailers-too-long",
        OK + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-A: " + b"a" * MAX_HEAD_BYTES,
        f"trailers over {MAX_HEAD_BYTES} bytes",
    ),
    ("closed-before-the-response", b"", "server closed the connection before the response"),
    (
        "closed-in-the-head",
        OK + b"Content-Le",
        "server closed the connection in the middle of the response",
    ),
    (
        "closed-in-a-length-body",
        OK + b"Content-Length: 500\r\n\r\n" + BODY[:100],
        "server closed the connection in the middle of the response",
    ),
    (
        "closed-in-a-chunked-body",
        OK + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(BODY, 100)[:300],
        "server closed the connection in the middle of the response",
    ),
    (
        "closed-in-the-trailers",
        OK + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-A: 1\r\n",
        "server closed the connection in the middle of the response",
    ),
]


@pytest.mark.parametrize("step", [1 << 20, 1], ids=["at-once", "byte-by-byte"])
@pytest.mark.parametrize(("raw", "words"), [pytest.param(*row[1:], id=row[0]) for row in BROKEN])
def test_broken_http_is_one_error_that_says_what(raw: bytes, words: str, step: int) -> None:
    """Every way a response is broken raises `ProtocolError`, its message naming the fault."""
    with pytest.raises(ProtocolError, match=words.replace("+", r"\+")):
        read(raw, step=step, close=True)


def test_a_reset_is_no_end_of_a_body_delimited_by_the_close() -> None:
    """A body that runs until the close is complete on a clean close only, not on a reset."""
    raw = OK + b"\r\n" + BODY
    assert read(raw, step=1 << 20, close=True).body == BODY
    with pytest.raises(ProtocolError, match=r"in the middle of the response \(reset by peer\)"):
        read(raw, step=1 << 20, close=False, reset="reset by peer")


def test_a_body_comes_as_it_arrives_never_buffered_whole() -> None:
    """Each piece of a length-framed body is handed on at once (the caller caps it)."""
    parser = ResponseParser()
    parser.receive_data(OK + b"Content-Length: 10\r\n\r\nabc")
    assert parser.next_event() == Head(200, {"content-length": "10"})
    assert parser.next_event() == Data(b"abc")
    assert parser.next_event() is NEED_DATA
    parser.receive_data(b"defghijklmnop")  # a second response's bytes follow the first
    assert parser.next_event() == Data(b"defghij")
    assert parser.next_event() == End()
    assert not parser.keep_alive  # bytes nobody asked for: the connection is not reused


def test_a_connection_carries_one_response_after_another() -> None:
    """After `next_response` the parser reads the next response on the same connection."""
    parser = ResponseParser()
    for body in (b"first", b"second"):
        parser.next_response()
        assert not parser.answered
        parser.receive_data(OK + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert parser.answered
        assert isinstance(parser.next_event(), Head)
        assert parser.next_event() == Data(body)
        assert parser.next_event() == End()
        assert parser.keep_alive


def test_parse_head_joins_repeats_and_lowercases_names() -> None:
    """Header names are lower-cased, repeated fields joined; HTTP/1.0 means close."""
    status, headers = parse_head(b"HTTP/1.0 404 Not Found\r\nX-A: 1\r\nx-a: 2\r\nServer:  s ")
    assert status == 404
    assert headers == {"x-a": "1, 2", "server": "s", "connection": "close"}


@pytest.mark.parametrize(
    ("url", "first_lines"),
    [
        ("http://127.0.0.1:8000/metrics", "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8000"),
        ("http://h/m?a=b&c=d", "GET /m?a=b&c=d HTTP/1.1\r\nHost: h"),
        ("http://h:80/", "GET / HTTP/1.1\r\nHost: h"),
        ("https://h:443", "GET / HTTP/1.1\r\nHost: h"),
        ("https://h:80/x", "GET /x HTTP/1.1\r\nHost: h:80"),
        ("http://[::1]:8000/metrics", "GET /metrics HTTP/1.1\r\nHost: [::1]:8000"),
        ("http://u:p@h:9/metrics", "GET /metrics HTTP/1.1\r\nHost: h:9"),
        ("http://h/a b/\u00e9?q=x y", "GET /a%20b/%C3%A9?q=x%20y HTTP/1.1\r\nHost: h"),
        ("http://h/a%20b;p=1/[x]", "GET /a%20b;p=1/%5Bx%5D HTTP/1.1\r\nHost: h"),
        ("http://b\u00fccher.example/", "GET / HTTP/1.1\r\nHost: xn--bcher-kva.example"),
    ],
)
def test_a_get_request_is_written(url: str, first_lines: str) -> None:
    """The target is percent-encoded where needed, `Host` named as the URL has it."""
    request = get_request(urlsplit(url), {"Accept": "text/plain"})
    assert request == f"{first_lines}\r\nAccept: text/plain\r\n\r\n".encode()
