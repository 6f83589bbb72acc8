"""Fuzz: the daemon's HTTP server takes any request bytes and keeps answering `/health`.

`/health` and `/probe` are what the kubelet asks; anyone on the pod's network can send the
daemon's port anything. Whatever a request holds (a broken request line, hostile headers,
a hostile path or query, bytes that are not HTTP), the server answers it with an HTTP status
that is not a 500 or closes it, and the next `/health` is answered at once.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
from fuzzing import FUZZ, HOSTILE_WORDS
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from wedgewatch.daemon.server import HttpServer, Snapshot, make_app

READ_SECONDS = 5.0  # a hung read is a failure, not a hang of the suite

_words = st.sampled_from(HOSTILE_WORDS).map(lambda w: w.encode("utf-8", "surrogatepass"))
_paths = st.lists(_words | st.binary(max_size=8), max_size=8).map(b"".join)
requests = st.one_of(
    st.binary(max_size=2048),
    st.builds(
        lambda method, path, headers: method + b" /" + path + b" HTTP/1.1\r\n" + headers + b"\r\n",
        st.sampled_from([b"GET", b"POST", b"HEAD", b"get", b"BREW", b""]),
        st.sampled_from([b"health", b"probe", b"status", b"metrics", b"ready", b""]) | _paths,
        st.lists(
            st.tuples(_words | st.binary(max_size=8), _words | st.binary(max_size=8)).map(
                lambda kv: kv[0] + b": " + kv[1] + b"\r\n"
            ),
            max_size=6,
        ).map(lambda lines: b"Host: 127.0.0.1\r\n" + b"".join(lines)),
    ),
)


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    """The daemon's real HTTP server on an ephemeral loopback port, in a thread's loop."""
    snapshot = Snapshot(
        version="0", started_at=0.0, started_timestamp=0.0, health_stale_after_seconds=30.0
    )
    loop = asyncio.new_event_loop()
    server = HttpServer(
        make_app(lambda: snapshot, CollectorRegistry(), lambda: 0.0), "127.0.0.1", 0
    )
    loop.run_until_complete(server.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.address
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()


def _exchange(address: tuple[str, int], data: bytes) -> bytes:
    """Send `data`, end the request side, and read until the server closes."""
    with socket.create_connection(address, timeout=READ_SECONDS) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            return b""  # the server closed first: an answer too
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


@FUZZ
@given(requests)
def test_any_request_is_answered_or_closed_and_health_still_answers(
    address: tuple[str, int], data: bytes
) -> None:
    """A hostile request: an HTTP answer that is not a 500, or a close; then `/health` answers."""
    answer = _exchange(address, data)
    if answer:
        assert answer.startswith(b"HTTP/1."), answer[:80]
        assert answer.split(b" ", 2)[1] != b"500", answer[:200]
    health = _exchange(address, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert health.split(b" ", 2)[1] in (b"200", b"503"), health[:200]
