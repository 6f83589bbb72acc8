"""A lean HTTP/1.1 GET client on an asyncio protocol: one keep-alive connection per target.

Scraping a 50 KiB `/metrics` body every second from hundreds of targets is dominated by
the HTTP client's own Python work: httpx and httpcore cost about 3 ms of CPU per request
on this project's benchmark machine, ten times the parse. This client does only what a
scrape needs, in one `asyncio.Protocol` that frames the response as bytes arrive:

- GET over plain TCP (`http://`), one request at a time on one connection that is kept
  open between requests (HTTP/1.1 keep-alive) and opened anew when the server closed it;
  a request on a reused connection that the server closed before answering is sent once
  more on a fresh one (a GET is idempotent: the race of a keep-alive timeout);
- response framing by `Content-Length`, `Transfer-Encoding: chunked` (trailers read and
  dropped) or the end of the connection; interim `1xx` responses skipped;
- bounds on everything the server controls: the status line and headers (64 KiB, 100
  fields), a chunk-size line (1 KiB), and the body, which goes straight into the caller's
  `BodySink` so the caller caps it (and decodes gzip) while it arrives, never after.

Anything else (TLS, credentials in the URL, redirects, proxies) is not its job: the caller
(`io.scrape`) hands those URLs to httpx. Deadlines are the caller's too: cancelling a
request (`asyncio.timeout`) closes its connection, whatever state it was in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

MAX_HEAD_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 100
MAX_CHUNK_LINE_BYTES = 1024

# Where the response being read stands.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE, _IDLE = range(8)


class RemoteProtocolError(Exception):
    """The server spoke broken HTTP, or closed the connection in the middle of a response."""


class _StaleConnection(Exception):
    """A kept-alive connection closed before any byte of the response: send it again."""


class BodySink(Protocol):
    """Takes a response body as it arrives; `feed` may raise to abort the response."""

    def feed(self, chunk: bytes) -> bool:
        """Take the next raw body bytes; True when no more are wanted (the rest is dropped)."""
        ...


#: Called with the status and the headers (lower-case names) once they are read.
OpenSink = Callable[[int, dict[str, str]], BodySink]


class _Drop:
    """The sink before a response has begun: wants nothing."""

    def feed(self, chunk: bytes) -> bool:
        """Drop `chunk`; no more is wanted."""
        return True


_DROP = _Drop()


def _no_sink(status: int, headers: dict[str, str]) -> BodySink:
    return _DROP


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status code and headers (lower-case names, repeats joined by ", ") of a response head."""
    lines = head.split(b"\n")
    status_line = lines[0].rstrip(b"\r")
    parts = status_line.split(b" ", 2)
    if (
        len(parts) < 2
        or parts[0] not in (b"HTTP/1.1", b"HTTP/1.0")
        or len(parts[1]) != 3
        or not parts[1].isdigit()
    ):
        raise RemoteProtocolError(f"malformed status line {status_line[:80]!r}")
    if len(lines) - 1 > MAX_HEADER_FIELDS:
        raise RemoteProtocolError(f"more than {MAX_HEADER_FIELDS} header fields")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        line = raw.rstrip(b"\r")
        if not line:
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or line[:1] in b" \t":
            raise RemoteProtocolError(f"malformed header line {line[:80]!r}")
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
        raise RemoteProtocolError(f"bad Content-Length {headers['content-length'][:40]!r}")
    return int(value)


class _Connection(asyncio.Protocol):
    """One TCP connection; reads one response at a time into the current request's sink."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.received = 0  # body bytes of the current response
        self._buffer = bytearray()
        self._head_seen = 0  # bytes of the buffered head already searched for its end
        self._state = _IDLE
        self._remaining = 0
        self._keep_alive = True
        self._answered = False  # any byte of the current response seen
        self._reused = False
        self._open_sink: OpenSink = _no_sink
        self._sink: BodySink = _DROP
        self._head: tuple[int, dict[str, str]] = (0, {})
        self._done: asyncio.Future[tuple[int, dict[str, str], BodySink]] | None = None

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted again
            return
        self._answered = True
        self._buffer += data
        try:
            self._advance()
        except Exception as exc:  # handed to the waiting request, whatever it is
            self._fail(exc)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost finishes or fails the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done = self._done
        if done is None or done.done():
            return
        if self._state == _UNTIL_CLOSE and exc is None:
            self._finish()  # the end of a body delimited by the close (a reset is no end)
        elif not self._answered and self._reused:
            done.set_exception(_StaleConnection())
        else:
            where = "before the response" if not self._answered else "in the middle of the response"
            cause = f" ({exc})" if exc else ""
            error = RemoteProtocolError(f"server closed the connection {where}{cause}")
            done.set_exception(error)

    # -- one request -----------------------------------------------------------------------

    async def request(
        self, request: bytes, open_sink: OpenSink, *, reused: bool
    ) -> tuple[int, dict[str, str], BodySink]:
        """Send `request` and wait for the whole response; the body went to `open_sink`'s sink."""
        transport = self.transport
        if transport is None or self.closed:
            raise _StaleConnection
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, dict[str, str], BodySink]] = loop.create_future()
        self._done = done
        self._open_sink, self._sink, self._head = open_sink, _DROP, (0, {})
        self._state, self._answered, self._reused, self.received = _HEAD, False, reused, 0
        self._buffer.clear()
        self._head_seen = 0
        transport.write(request)
        try:
            return await done
        finally:
            # Hold nothing of this response past it: the sink may hold a body up to the
            # cap, and a failed future's traceback points back at this frame, so the local
            # `done` would make a cycle that keeps it all until a full collection.
            del done
            self._done = None
            self._open_sink, self._sink, self._head = _no_sink, _DROP, (0, {})
            if self._state != _IDLE:
                self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        """Open, idle and not asked to close by the last response."""
        return not self.closed and self._state == _IDLE and self._keep_alive

    def _fail(self, exc: Exception) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self.close()

    def _finish(self) -> None:
        self._state = _IDLE
        if self._buffer:  # more than one response's worth: never reuse this connection
            self._keep_alive = False
        if not self._keep_alive:
            self.close()
        status, headers = self._head
        if self._done is not None and not self._done.done():
            self._done.set_result((status, headers, self._sink))

    def _body(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self._sink.feed(chunk):  # the sink has enough: drop the rest with the connection
            self._keep_alive = False
            self._buffer.clear()
            self._finish()

    def _advance(self) -> None:
        buf = self._buffer
        while self._done is not None and not self._done.done():
            state = self._state
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
                        raise RemoteProtocolError(f"response head over {MAX_HEAD_BYTES} bytes")
                    self._head_seen = len(buf)
                    return
                status, headers = parse_head(bytes(buf[:end]))
                del buf[:size]
                self._head_seen = 0
                if 100 <= status < 200:
                    continue  # an interim response (100 Continue, 103 Early Hints)
                self._start_body(status, headers)
            elif state in (_LENGTH, _CHUNK_DATA):
                if not buf:
                    return
                take = bytes(buf[: self._remaining])
                del buf[: len(take)]
                self._remaining -= len(take)
                ended = self._remaining == 0
                if ended and state == _CHUNK_DATA:
                    self._state = _CHUNK_END
                self._body(take)  # may end the response early (the sink has enough)
                if ended and self._state == _LENGTH:
                    self._finish()
            elif state == _CHUNK_SIZE:
                end = buf.find(b"\n")
                if end < 0 or end > MAX_CHUNK_LINE_BYTES:
                    if len(buf) > MAX_CHUNK_LINE_BYTES:
                        raise RemoteProtocolError("chunk-size line too long")
                    return
                field = bytes(buf[:end]).split(b";", 1)[0].strip()
                del buf[: end + 1]
                try:
                    self._remaining = int(field, 16)
                except ValueError:
                    raise RemoteProtocolError(f"bad chunk size {field[:20]!r}") from None
                if self._remaining < 0 or field[:1] in (b"-", b"+") or b"_" in field:
                    raise RemoteProtocolError(f"bad chunk size {field[:20]!r}")
                self._state = _CHUNK_DATA if self._remaining else _TRAILERS
            elif state == _CHUNK_END:
                if len(buf) < 2 and buf != b"\n":
                    return
                size = 1 if buf[:1] == b"\n" else 2
                if bytes(buf[:size]) not in (b"\r\n", b"\n"):
                    raise RemoteProtocolError("chunk not followed by CRLF")
                del buf[:size]
                self._state = _CHUNK_SIZE
            elif state == _TRAILERS:
                end = buf.find(b"\n")
                if end < 0:
                    if len(buf) > MAX_HEAD_BYTES:
                        raise RemoteProtocolError(f"trailers over {MAX_HEAD_BYTES} bytes")
                    return
                line = bytes(buf[:end]).rstrip(b"\r")
                del buf[: end + 1]
                if not line:
                    self._finish()
            elif state == _UNTIL_CLOSE:
                if not buf:
                    return
                take = bytes(buf)
                buf.clear()
                self._body(take)
            else:
                return

    def _start_body(self, status: int, headers: dict[str, str]) -> None:
        self._head = (status, headers)
        self._keep_alive = "close" not in headers.get("connection", "").lower()
        self._sink = self._open_sink(status, headers)
        encoding = headers.get("transfer-encoding")
        if status in (204, 304):
            self._finish()
        elif encoding is not None:
            if encoding.strip().lower() != "chunked":
                raise RemoteProtocolError(f"unsupported Transfer-Encoding {encoding[:40]!r}")
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            self._remaining = _content_length(headers)
            self._state = _LENGTH
            if self._remaining == 0:
                self._finish()
        else:
            self._keep_alive = False
            self._state = _UNTIL_CLOSE


class Http1Client:
    """GETs over one kept-alive HTTP/1.1 connection to one host and port at a time."""

    def __init__(self) -> None:
        self._connection: _Connection | None = None
        self._origin: tuple[str, int] | None = None
        self.connections_opened = 0

    @property
    def received(self) -> int:
        """Body bytes of the response being read (or last read), for a timeout's detail."""
        return self._connection.received if self._connection is not None else 0

    async def get(
        self, host: str, port: int, request: bytes, open_sink: OpenSink
    ) -> tuple[int, dict[str, str], BodySink]:
        """Send `request` (a whole GET) to `host:port` and read the response into a sink.

        Raises `OSError` when no connection can be made (`ConnectionRefusedError` when
        refused) and `RemoteProtocolError` for broken HTTP or a connection closed mid-way.
        """
        for attempt in range(2):
            connection = self._connection
            reused = connection is not None and connection.reusable and self._origin == (host, port)
            if connection is None or not reused:
                self.close()
                loop = asyncio.get_running_loop()
                _, connection = await loop.create_connection(_Connection, host, port)
                self._connection, self._origin = connection, (host, port)
                self.connections_opened += 1
            try:
                return await connection.request(request, open_sink, reused=reused)
            except _StaleConnection:
                self._connection = None
                if attempt:
                    raise RemoteProtocolError("server closed the connection twice") from None
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection, if any."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
