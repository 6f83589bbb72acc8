"""HTTP/1.1 on the wire, without IO: the GET both scrape transports send, the response they read.

`get_request` writes a GET's bytes: the request target percent-encoded where the URL left
text that may not stand in one, and the `Host` the URL names.

`redirect_target` is the one origin rule of every HTTP call wedgewatch makes to a watched
server (the scrape, the exec probe, the canary, the engine calls): a redirect is followed
only within the origin (scheme, host and port) it came from; anything else raises
`OffOriginRedirect`, which the caller reports as a failure naming where it pointed. A
hostile or confused target must never make wedgewatch (root, next to the server) GET
another port, another host or a cloud metadata address.

In the manner of python-hyper/h11, a transport hands the parser the bytes it received
(`receive_data`; `b""` when the connection closed) and takes events (`next_event`) until
the response ends:

    Head(status, headers)   the status and headers (lower-case names, repeats joined by
                            ", "); interim `1xx` responses are skipped, never returned
    Data(data)              raw body bytes (still in their `Content-Encoding`)
    End()                   the response is complete
    NEED_DATA               nothing more until more bytes arrive

The body is framed by `Transfer-Encoding: chunked` (extensions ignored, trailers read and
dropped), by `Content-Length`, or by the close of the connection; a 204 or 304 has none.
Everything the server controls is bounded: the status line and headers (`MAX_HEAD_BYTES`,
`MAX_HEADER_FIELDS`), a chunk-size line (`MAX_CHUNK_LINE_BYTES`) and the trailers; the
body is handed on as it arrives, so the caller caps it. Anything broken, including a
connection closed in the middle of a response, raises `ProtocolError` with a message that
says what. The daemon's asynchronous client (`io.http1`) and the exec probe's blocking
GET (`io.http_get`) are the IO around it: sockets, deadlines and connection reuse.

Why not h11 itself (installed with httpx): `bench/bench_http_parser.py`, run of 2026-12-03
(docs/benchmarks.md, "HTTP/1.1 parser"), on the real 50 KB vLLM body. Under the lean client
a scrape costs 0.135 ms of CPU with this parser and 0.215 ms with h11 (8 % of a core more
at 1000 targets at 1 Hz); the exec probe takes 117 ms of CPU against 130 ms with h11, whose
import alone costs 25 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import SplitResult, quote, urljoin, urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 100
MAX_CHUNK_LINE_BYTES = 1024

_PATH_SAFE = "/%:@!$&'()*+,;=-._~"  # what a path keeps as it is (RFC 3986 pchar and "/")
_DEFAULT_PORTS = {"http": 80, "https": 443}

# Where the response being read stands.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _DONE = range(8)


def port_of(parts: SplitResult) -> int:
    """A URL's port, or its scheme's default (443 for https, 80 otherwise).

    Raises ValueError for a port out of range, as `SplitResult.port` does.
    """
    return parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)


def origin(url: str) -> tuple[str, str, int]:
    """A URL's origin: (scheme, host, port), lower-case, the port defaulted by the scheme.

    Raises ValueError for a port out of range.
    """
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port_of(parts)


def same_origin(a: str, b: str) -> bool:
    """Whether two URLs share scheme, host and port (a bad port is never the same origin)."""
    try:
        return origin(a) == origin(b)
    except ValueError:
        return False


class OffOriginRedirect(Exception):
    """A redirect that leaves its origin: never followed. `target` is where it pointed
    (unredacted: redact before printing), `status` the redirect's status."""

    def __init__(self, status: int, target: str) -> None:
        super().__init__(f"HTTP {status} redirect off the origin")
        self.status = status
        self.target = target


def redirect_target(current: str, location: str, status: int = 302) -> str:
    """The absolute URL that a redirect (`status`) from `current` to `location` leads to.

    Raises `OffOriginRedirect` when it leads off `current`'s origin (scheme, host, port).
    """
    target = urljoin(current, location)
    if not same_origin(current, target):
        raise OffOriginRedirect(status, target)
    return target


class ProtocolError(Exception):
    """The server spoke broken HTTP, or closed the connection in the middle of a response."""


class Head(NamedTuple):
    """The status and headers of the (final) response."""

    status: int
    headers: dict[str, str]


class Data(NamedTuple):
    """Raw body bytes, in the order they came."""

    data: bytes


class End(NamedTuple):
    """The response is complete."""


class NeedData:
    """Nothing more can be read until more bytes arrive (or the close is reported)."""


NEED_DATA = NeedData()
_END = End()

Event = Head | Data | End | NeedData


def get_request(url: SplitResult, headers: Mapping[str, str]) -> bytes:
    """The bytes of a GET of `url` (an http or https URL, split) with `headers` after `Host`.

    Spaces and non-ASCII text in the path or query are percent-encoded; a non-ASCII host
    name is sent in its IDNA form; the port is in `Host` unless it is the scheme's default.
    """
    host = url.hostname or ""
    host = host if host.isascii() else host.encode("idna").decode("ascii")
    authority = f"[{host}]" if ":" in host else host
    if url.port is not None and url.port != _DEFAULT_PORTS.get(url.scheme):
        authority += f":{url.port}"
    target = quote(url.path or "/", safe=_PATH_SAFE)
    if url.query:
        target += "?" + quote(url.query, safe=_PATH_SAFE + "?")
    lines = [f"GET {target} HTTP/1.1", f"Host: {authority}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status code and headers (lower-case names, repeats joined by ", ") of a response head.

    An HTTP/1.0 response without `Connection: keep-alive` gets `connection: close`.
    """
    lines = head.split(b"\n")
    status_line = lines[0].rstrip(b"\r")
    parts = status_line.split(b" ", 2)
    if (
        len(parts) < 2
        or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
        or len(parts[1]) != 3
        or not parts[1].isdigit()
    ):
        raise ProtocolError(f"malformed status line {status_line[:80]!r}")
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        raise ProtocolError(f"more than {MAX_HEADER_FIELDS} header fields")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        line = raw.rstrip(b"\r")
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in b" \t":
            raise ProtocolError(f"malformed header line {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if parts[0] == b"HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
        headers["connection"] = "close"
    return int(parts[1]), headers


def _content_length(headers: dict[str, str]) -> int:
    values = {v.strip() for v in headers["content-length"].split(",")}
    value = values.pop() if len(values) == 1 else ""
    if not value.isdigit() or len(value) > 18:
        raise ProtocolError(f"bad Content-Length {headers['content-length'][:40]!r}")
    return int(value)


def _chunk_size(line: bytes) -> int:
    field = line.split(b";", 1)[0].strip()
    if not field or field[:1] in (b"-", b"+") or b"_" in field:
        raise ProtocolError(f"bad chunk size {field[:20]!r}")
    try:
        return int(field, 16)
    except ValueError:
        raise ProtocolError(f"bad chunk size {field[:20]!r}") from None


class ResponseParser:
    """One response's worth of HTTP/1.1 at a time; `next_response` readies it for the next."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._head_seen = 0  # bytes of the buffered head already searched for its end
        self._state = _HEAD
        self._remaining = 0
        self._closed = False
        self._reset: str | None = None  # why the connection broke, if it was not a clean close
        self._keep_alive = True
        self.answered = False  # any byte of this response seen

    def next_response(self) -> None:
        """Start reading the next response on the same connection."""
        self._state, self._head_seen, self._remaining, self.answered = _HEAD, 0, 0, False

    @property
    def keep_alive(self) -> bool:
        """After `End`: whether the connection may carry another response.

        Not when the response asked to close, was delimited by the close, or was followed
        by bytes nobody asked for yet.
        """
        return self._state == _DONE and self._keep_alive and not self._buffer

    def receive_data(self, data: bytes) -> None:
        """Take bytes from the connection; `b""` means the server closed it."""
        if data:
            self.answered = True
            self._buffer += data
        else:
            self._closed = True

    def connection_broken(self, error: str) -> None:
        """The connection broke (a reset, not a clean close): a body cannot end by it."""
        self._closed = True
        self._reset = error

    def next_event(self) -> Event:
        """The next event of the response; `ProtocolError` when it is broken."""
        buf = self._buffer
        while True:
            state = self._state
            if state in (_LENGTH, _CHUNK_DATA):
                if not buf:
                    return self._need()
                take = bytes(buf[: self._remaining])
                del buf[: len(take)]
                self._remaining -= len(take)
                if self._remaining == 0:
                    self._state = _CHUNK_END if state == _CHUNK_DATA else _DONE
                return Data(take)
            if state == _HEAD:
                # Search only what arrived since the last look (a head that trickles in a
                # byte at a time must not be scanned from its start every time).
                start = max(0, self._head_seen - 3)
                end = buf.find(b"\r\n\r\n", start)
                size = end + 4
                if end < 0:
                    end = buf.find(b"\n\n", start)
                    size = end + 2
                if end < 0 or end > MAX_HEAD_BYTES:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
                    self._head_seen = len(buf)
                    return self._need()
                status, headers = parse_head(bytes(buf[:end]))
                del buf[:size]
                self._head_seen = 0
                if 100 <= status < 200:
                    continue  # an interim response (100 Continue, 103 Early Hints)
                self._start_body(status, headers)
                return Head(status, headers)
            if state == _CHUNK_SIZE:
                end = buf.find(b"\n")
                if end < 0 or end > MAX_CHUNK_LINE_BYTES:
                    if len(buf) > MAX_CHUNK_LINE_BYTES:
                        raise ProtocolError("chunk-size line too long")
                    return self._need()
                self._remaining = _chunk_size(bytes(buf[:end]))
                del buf[: end + 1]
                self._state = _CHUNK_DATA if self._remaining else _TRAILERS
            elif state == _CHUNK_END:
                if len(buf) < 2 and buf != b"\n":
                    return self._need()
                size = 1 if buf[:1] == b"\n" else 2
                if bytes(buf[:size]) not in (b"\r\n", b"\n"):
                    raise ProtocolError("chunk not followed by CRLF")
                del buf[:size]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                end = buf.find(b"\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise ProtocolError(f"trailers over {MAX_HEAD_BYTES} bytes")
                    return self._need()
                line = bytes(buf[:end]).rstrip(b"\r")
                del buf[: end + 1]
                if not line:
                    self._state = _DONE
            elif state == _UNTIL_CLOSE:
                if buf:
                    take = bytes(buf)
                    buf.clear()
                    return Data(take)
                if self._closed and self._reset is None:
                    self._state = _DONE
                    return _END
                return self._need()
            else:  # _DONE
                return _END

    def _need(self) -> NeedData:
        if not self._closed:
            return NEED_DATA
        where = "in the middle of the response" if self.answered else "before the response"
        cause = f" ({self._reset})" if self._reset else ""
        raise ProtocolError(f"server closed the connection {where}{cause}")

    def _start_body(self, status: int, headers: dict[str, str]) -> None:
        self._keep_alive = "close" not in headers.get("connection", "").lower()
        encoding = headers.get("transfer-encoding")
        if status in (204, 304):
            self._state = _DONE
        elif encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise ProtocolError(f"unsupported Transfer-Encoding {encoding[:40]!r}")
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            self._remaining = _content_length(headers)
            self._state = _LENGTH if self._remaining else _DONE
        else:
            self._keep_alive = False
            self._state = _UNTIL_CLOSE
