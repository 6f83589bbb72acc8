"""A real HTTP server on 127.0.0.1 whose every response is scripted by the test.

The server runs in a background thread, so it serves async tests and CLI runs alike. A
`Script` maps the request number (0, 1, ...) and path to a `Reply`: status, headers and a
body given as an iterable of chunks, so a 200 MB body can be produced lazily and a body
can trickle in with a pause before every chunk. The server records every request and how
many body bytes it managed to send before the client hung up.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One scripted response."""

    status: int = 200
    body: bytes | Iterable[bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_length: int | None = None  # None: the length of a bytes body, else close-delimited
    chunk_pause_seconds: float = 0.0
    headers_pause_seconds: float = 0.0


Script = Callable[[int, str], Reply]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up on a kept-alive connection is what scripts provoke: no
        traceback in the test output for it; anything else is printed as usual."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@dataclass
class Request:
    """What the server saw of one request."""

    path: str
    headers: dict[str, str]
    body: bytes = b""  # a POST's body


class ScriptedServer:
    """`with ScriptedServer(script) as server:` serves `server.url` until the block ends."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.bytes_sent: list[int] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), self._handler_class())
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT` of the running server."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def url(self) -> str:
        """The `/metrics` URL of the running server."""
        return self.base_url + "/metrics"

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

            def do_POST(self) -> None:
                """A POST is answered like a GET; its body is read and recorded."""
                length = int(self.headers.get("Content-Length") or 0)
                self.do_GET(self.rfile.read(length))

            def do_GET(self, body: bytes = b"") -> None:
                with server._lock:
                    number = len(server.requests)
                    server.requests.append(Request(self.path, dict(self.headers.items()), body))
                reply = server.script(number, self.path)
                sent = 0
                try:
                    if reply.headers_pause_seconds:
                        server._stopping.wait(reply.headers_pause_seconds)
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    length = reply.content_length
                    if length is None and isinstance(reply.body, bytes):
                        length = len(reply.body)
                    if length is not None:
                        self.send_header("Content-Length", str(length))
                    else:
                        self.send_header("Connection", "close")
                        self.close_connection = True
                    self.end_headers()
                    chunks = [reply.body] if isinstance(reply.body, bytes) else reply.body
                    for chunk in chunks:
                        if reply.chunk_pause_seconds and server._stopping.wait(
                            reply.chunk_pause_seconds
                        ):
                            break
                        self.wfile.write(chunk)
                        sent += len(chunk)
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True  # the client hung up: that is its right
                finally:
                    with server._lock:
                        server.bytes_sent.append(sent)

        return Handler


def always(reply: Reply) -> Script:
    """A script that gives the same reply to every request."""
    return lambda _number, _path: reply


def in_turn(replies: list[Reply]) -> Script:
    """A script that gives the replies in order, then repeats the last one."""
    return lambda number, _path: replies[min(number, len(replies) - 1)]


@dataclass(frozen=True)
class zeros:  # lowercase: called like the function it replaced, zeros(200 * 1024 * 1024)
    """A lazily generated body of `total_bytes` zero bytes, anew for every response.

    A plain generator would be shared by every response of an `always(...)` server: the
    second scrape would continue (or collide with) the first one's half-sent body.
    """

    total_bytes: int
    chunk_bytes: int = 1 << 20

    def __iter__(self) -> Iterator[bytes]:
        chunk = b"0" * self.chunk_bytes
        left = self.total_bytes
        while left > 0:
            yield chunk[: min(self.chunk_bytes, left)]
            left -= self.chunk_bytes


@dataclass
class RefusingPort:
    """A TCP port on 127.0.0.1 that is bound but not listening, so connections are refused."""

    sock: socket.socket = field(default_factory=lambda: socket.socket(socket.AF_INET))

    def __enter__(self) -> RefusingPort:
        self.sock.bind(("127.0.0.1", 0))
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    @property
    def url(self) -> str:
        """A `/metrics` URL nobody answers."""
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"


def wait_until(predicate: Callable[[], bool], timeout_seconds: float = 10.0) -> bool:
    """Poll `predicate` until it holds or the timeout passes; returns its last value."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()
