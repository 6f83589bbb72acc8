"""h11 behind the interface of `io.http_parse.ResponseParser`, for bench/bench_http_parser.py.

The contender: python-hyper/h11 (installed with httpx) doing the work of wedgewatch's own
HTTP/1.1 response parser, with the same events (`Head`, `Data`, `End`, `NEED_DATA`), the
same `ProtocolError` and the same head bound, so the lean client (`io.http1`) and the
probe's blocking GET (`io.http_get`) run unchanged on top of it (`install` swaps it into
one of them).
What an h11 client must do per response is counted: it sends a `Request` and an
`EndOfMessage` through the state machine for every response (its bytes are not used: the
transports send `http_parse.get_request`'s), and starts the next cycle on keep-alive.

This module imports h11 at import time, so a child process that never imports it measures
the home-made parser alone.
"""

from __future__ import annotations

from types import ModuleType

import h11

from wedgewatch.io import http_parse
from wedgewatch.io.http_parse import NEED_DATA, Data, End, Event, Head, ProtocolError

_REQUEST = h11.Request(method="GET", target="/metrics", headers=[("Host", "bench")])
_END_OF_REQUEST = h11.EndOfMessage()
_END = End()


class H11ResponseParser:
    """`http_parse.ResponseParser`'s interface, the parsing done by an h11 client connection."""

    def __init__(self) -> None:
        self._conn = h11.Connection(
            our_role=h11.CLIENT, max_incomplete_event_size=http_parse.MAX_HEAD_BYTES
        )
        self._reset: str | None = None
        self._until_close = False
        self._sent = False
        self.answered = False

    def next_response(self) -> None:
        """Start reading the next response on the same connection."""
        conn = self._conn
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        self._sent, self._until_close, self.answered = False, False, False

    @property
    def keep_alive(self) -> bool:
        """After `End`: whether the connection may carry another response."""
        conn = self._conn
        return (
            conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
            and not conn.trailing_data[0]
        )

    def receive_data(self, data: bytes) -> None:
        """Take bytes from the connection; `b""` means the server closed it."""
        self._send_request()
        if data:
            self.answered = True
        try:
            self._conn.receive_data(data)
        except h11.RemoteProtocolError as exc:
            raise ProtocolError(str(exc)) from None

    def connection_broken(self, error: str) -> None:
        """The connection broke (a reset, not a clean close): a body cannot end by it."""
        self._reset = error
        self.receive_data(b"")

    def next_event(self) -> Event:
        """The next event of the response; `ProtocolError` when it is broken."""
        self._send_request()
        conn = self._conn
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ProtocolError(str(exc) or "broken response") from None
            kind = type(event)
            if kind is h11.Data:
                return Data(bytes(event.data))  # type: ignore[union-attr]
            if kind is h11.Response:
                return self._head(event)  # type: ignore[arg-type]
            if kind is h11.EndOfMessage:
                if self._until_close and self._reset is not None:
                    raise ProtocolError(f"server closed the connection ({self._reset})")
                return _END
            if event is h11.NEED_DATA:
                return NEED_DATA
            if event is h11.PAUSED:
                return _END
            if kind is h11.InformationalResponse:
                continue
            raise ProtocolError("server closed the connection before the response")

    def _send_request(self) -> None:
        if not self._sent:
            self._conn.send(_REQUEST)
            self._conn.send(_END_OF_REQUEST)
            self._sent = True

    def _head(self, event: h11.Response) -> Head:
        headers: dict[str, str] = {}
        for raw_name, raw_value in event.headers:
            name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self._until_close = "content-length" not in headers and "transfer-encoding" not in headers
        return Head(event.status_code, headers)


def install(module: ModuleType, parser_class: type = H11ResponseParser) -> None:
    """Make `module` (`io.http1` or `io.http_get`) parse with `parser_class` (h11 unless
    told), in this process only."""
    module.ResponseParser = parser_class  # type: ignore[attr-defined]
