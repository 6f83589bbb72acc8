"""A lean HTTP/1.1 GET client on an asyncio protocol: one keep-alive connection per target.

Scraping a 50 KiB `/metrics` body every second from hundreds of targets is dominated by
the HTTP client's own Python work: a fetch through httpx and httpcore costs 1.22 ms of CPU,
seven times the parse (0.17 ms), and 0.20 ms through this client (`bench/bench_scrape.py`,
run of 2026-12-02, docs/benchmarks.md "Daemon: many targets"). This client does only what a
scrape needs, in one `asyncio.Protocol` that hands the bytes to the sans-IO response
parser of `io.http_parse` as they arrive:

- GET over TCP or TLS, one request at a time on one connection that is kept
  open between requests (HTTP/1.1 keep-alive) and opened anew when the server closed it;
  a request on a reused connection that the server closed before answering is sent once
  more on a fresh one (a GET is idempotent: the race of a keep-alive timeout);
- the response's framing and bounds are `io.http_parse`'s; the body goes straight into
  the caller's `BodySink` so the caller caps it (and decodes gzip) while it arrives,
  never after.

Anything else is the caller's (`io.scrape`): redirects and credentials in the URL by the
rules of `io.scrape_rules` (a redirect is one more `get`; the `Authorization` header is in
the request's bytes), and the TLS context; proxies are never used.
Deadlines are the caller's too: cancelling a request (`asyncio.timeout`) closes its
connection, whatever state it was in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from wedgewatch.io.http_parse import Data, Head, NeedData, ProtocolError, ResponseParser

if TYPE_CHECKING:
    import ssl


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


class _Connection(asyncio.Protocol):
    """One TCP connection; reads one response at a time into the current request's sink."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.received = 0  # body bytes of the current response
        self._parser = ResponseParser()
        self._idle = True
        self._keep_alive = True
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
        self._parser.receive_data(data)
        self._advance()

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost finishes or fails the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done = self._done
        if done is None or done.done():
            return
        if not self._parser.answered and self._reused:
            done.set_exception(_StaleConnection())
            return
        if exc is None:
            self._parser.receive_data(b"")
        else:
            self._parser.connection_broken(str(exc))  # a reset is no end of a body
        self._advance()

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
        self._idle, self._reused, self.received = False, reused, 0
        self._parser.next_response()
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
            if not self._idle:
                self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    @property
    def reusable(self) -> bool:
        """Open, idle and not asked to close by the last response."""
        return not self.closed and self._idle and self._keep_alive

    def _finish(self, keep_alive: bool) -> None:
        self._idle, self._keep_alive = True, keep_alive
        if not keep_alive:
            self.close()
        status, headers = self._head
        if self._done is not None and not self._done.done():
            self._done.set_result((status, headers, self._sink))

    def _advance(self) -> None:
        """Take the parser's events into the sink until it needs more bytes or the end."""
        parser = self._parser
        try:
            while self._done is not None and not self._done.done():
                event = parser.next_event()
                if isinstance(event, Data):
                    self.received += len(event.data)
                    if self._sink.feed(event.data):  # enough: drop the rest with the connection
                        self._finish(keep_alive=False)
                elif isinstance(event, Head):
                    self._head = (event.status, event.headers)
                    self._sink = self._open_sink(event.status, event.headers)
                elif isinstance(event, NeedData):
                    return
                else:
                    self._finish(parser.keep_alive)
        except Exception as exc:  # handed to the waiting request, whatever it is
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)
            self.close()


class Http1Client:
    """GETs over one kept-alive HTTP/1.1 connection (TLS or not) to one origin at a time."""

    def __init__(self) -> None:
        self._connection: _Connection | None = None
        self._origin: tuple[str, int, ssl.SSLContext | None] | None = None
        self.connections_opened = 0

    @property
    def received(self) -> int:
        """Body bytes of the response being read (or last read), for a timeout's detail."""
        return self._connection.received if self._connection is not None else 0

    async def get(
        self,
        host: str,
        port: int,
        request: bytes,
        open_sink: OpenSink,
        tls: ssl.SSLContext | None = None,
    ) -> tuple[int, dict[str, str], BodySink]:
        """Send `request` (a whole GET) to `host:port` and read the response into a sink.

        With `tls`, the connection is TLS, the server verified as `tls` says for `host`.
        Raises `OSError` when no connection can be made (`ConnectionRefusedError` when
        refused, `ssl.SSLError` when the handshake or verification fails) and
        `ProtocolError` for broken HTTP or a connection closed mid-way.
        """
        origin = (host, port, tls)
        for attempt in range(2):
            connection = self._connection
            reused = connection is not None and connection.reusable and self._origin == origin
            if connection is None or not reused:
                self.close()
                loop = asyncio.get_running_loop()
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=tls, server_hostname=host if tls else None
                )
                self._connection, self._origin = connection, origin
                self.connections_opened += 1
            try:
                return await connection.request(request, open_sink, reused=reused)
            except _StaleConnection:
                self._connection = None
                if attempt:
                    raise ProtocolError("server closed the connection twice") from None
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection, if any."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
