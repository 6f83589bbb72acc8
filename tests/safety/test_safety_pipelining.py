"""Adversarial tests of the daemon's own HTTP server: clients that pipeline requests and
never read the answers can neither hold connections for ever nor starve /probe and /health.

Real sockets on 127.0.0.1 (and other loopback addresses, as other peers), a real
`wedgewatch run` child and a real HTTP target for the attacker's shapes; an in-process
server for the single rules. Every wait is for an event (a response, or the server
closing a connection); the 3 s a probe may take is the kubelet's own patience.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from scripted_http import Reply, ScriptedServer, always
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from wedgewatch_daemon import DaemonProcess

from wedgewatch.daemon.connections import ConnectionLimits
from wedgewatch.daemon.server import HttpServer, Snapshot, make_app

pytestmark = pytest.mark.slow

IDLE = (Path(__file__).parents[1] / "fixtures" / "idle.prom").read_bytes()
GET_METRICS = b"GET /metrics HTTP/1.1\r\nHost: wedgewatch\r\n\r\n"
#: The kubelet's patience in these tests: a probe answered later counts as failed.
PROBE_SECONDS = 3.0
#: How long the attack may last before the test gives up waiting for the server to end it.
ATTACK_LIMIT_SECONDS = 60.0
_CLOSED = select.POLLRDHUP | select.POLLHUP | select.POLLERR


def _non_reader(port: int, peer: str, requests: int = 2000) -> socket.socket:
    """A client from `peer` with a tiny receive buffer that pipelines `requests` GETs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.bind((peer, 0))
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        sock.send(GET_METRICS * requests)  # as much as the server takes; never read
    return sock


def _probe(port: int, path: str) -> bytes:
    """The status line of one GET from 127.0.0.1 on a fresh connection, within PROBE_SECONDS."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=PROBE_SECONDS) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while b"\r\n" not in answer:
            sock.settimeout(max(0.01, PROBE_SECONDS - (time.monotonic() - started)))
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def _closed_by_server(poller: select.poll, open_fds: set[int], wait_seconds: float) -> None:
    """Forget the sockets the server closed (reset or FIN), waiting up to `wait_seconds`."""
    for fd, _ in poller.poll(wait_seconds * 1000):
        poller.unregister(fd)
        open_fds.discard(fd)


@pytest.mark.parametrize(
    ("sockets", "peers"),
    [
        pytest.param(40, ["127.0.0.1"], id="40-from-the-probes-own-address"),
        pytest.param(270, [f"127.0.0.{n}" for n in range(2, 11)], id="270-over-9-other-peers"),
        pytest.param(1000, [f"127.0.0.{n}" for n in range(1, 11)], id="1000-over-10-peers"),
    ],
)
def test_probes_answer_while_clients_pipeline_and_never_read(
    tmp_path: Path, enough_fds: None, sockets: int, peers: list[str]
) -> None:
    """Pipelining non-readers: /probe and /health answer in 3 s throughout; all are closed.

    Before the fix their connections stayed busy for ever, and once they filled the
    per-peer or the total bound every probe was reset.
    """
    with ScriptedServer(always(Reply(body=IDLE))) as target:
        daemon = DaemonProcess(
            ["--target", f"t={target.url}", "--interval-seconds", "0.5"], tmp_path
        )
        held: list[socket.socket] = []
        try:
            daemon.wait_for("daemon_started", timeout_seconds=60)
            port = int(daemon.base_url.rsplit(":", 1)[1])
            poller = select.poll()
            for n in range(sockets):
                sock = _non_reader(port, peers[n % len(peers)])
                held.append(sock)
                poller.register(sock, _CLOSED)
            still_open = {sock.fileno() for sock in held}
            deadline = time.monotonic() + ATTACK_LIMIT_SECONDS
            probes = 0
            while still_open:
                assert time.monotonic() < deadline, (
                    f"{len(still_open)} of {sockets} non-reading connections still open "
                    f"after {ATTACK_LIMIT_SECONDS:g} s"
                )
                for path in ("/probe", "/health"):
                    assert _probe(port, path) == b"HTTP/1.1 200 OK", (path, probes)
                    probes += 1
                _closed_by_server(poller, still_open, 0.2)
            # And after the attack, as before it.
            assert _probe(port, "/probe") == b"HTTP/1.1 200 OK"
        finally:
            for sock in held:
                sock.close()
            daemon.stop()


def _snapshot() -> Snapshot:
    return Snapshot(
        version="t", started_at=0.0, started_timestamp=0.0, health_stale_after_seconds=1e9
    )


class _Counting:
    """An app whose /big answers 1 MiB and counts the requests it began; /hold waits."""

    def __init__(self) -> None:
        self.began = 0
        self.first = asyncio.Event()
        self.release = asyncio.Event()

    def app(self) -> Starlette:
        async def big(request: Request) -> Response:
            self.began += 1
            self.first.set()
            return Response(b"x" * (1 << 20))

        async def hold(request: Request) -> Response:
            await self.release.wait()
            return Response(b"held")

        async def health(request: Request) -> Response:
            return Response(b"ok")

        return Starlette(
            routes=[Route("/big", big), Route("/hold", hold), Route("/health", health)]
        )


@contextlib.asynccontextmanager
async def _server(limits: ConnectionLimits, app: Starlette | None = None) -> AsyncIterator[int]:
    snapshot = _snapshot()
    if app is None:
        app = make_app(lambda: snapshot, CollectorRegistry(), lambda: 0.0)
    server = HttpServer(app, "127.0.0.1", 0, limits)
    await server.start()
    try:
        yield server.address[1]
    finally:
        await server.stop()


async def _status_line(port: int, path: str, peer: str = "127.0.0.1") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(peer, 0))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n".encode())
    try:
        return (await reader.readline()).rstrip()
    finally:
        writer.close()


async def test_the_next_pipelined_request_waits_until_the_response_is_sent() -> None:
    """A client that pipelines and does not read gets one request handled, not the next."""
    counting = _Counting()
    async with _server(ConnectionLimits(), counting.app()) as port:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: w\r\n\r\n" * 10)
        # Another request on another connection is answered: the loop has run past the
        # first /big (its body is far larger than what the socket buffers hold).
        await asyncio.wait_for(counting.first.wait(), 30)
        assert await _status_line(port, "/health") == b"HTTP/1.1 200 OK"
        assert counting.began == 1
        sock.close()


async def test_a_client_that_does_not_read_is_reset_after_the_send_timeout() -> None:
    """Pipelined requests never read: the server resets the connection once the send
    deadline passes (it used to keep it busy for ever)."""
    async with _server(ConnectionLimits(send_timeout_seconds=0.3)) as port:
        sock = await asyncio.to_thread(_non_reader, port, "127.0.0.1")
        poller = select.poll()
        poller.register(sock, _CLOSED)
        events = await asyncio.to_thread(poller.poll, 30_000)
        sock.close()
        assert events, "the server kept a connection that does not read its answers"


async def test_a_peer_with_few_connections_gets_in_when_others_hold_every_slot_busy() -> None:
    """Every slot busy with another peer's in-flight requests: a new peer is still answered,
    by closing the oldest connection of the peer holding the most."""
    counting = _Counting()
    limits = ConnectionLimits(max_connections=4, max_connections_per_peer=4)
    async with _server(limits, counting.app()) as port:
        streams = [
            await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
            for _ in range(4)
        ]
        for _, writer in streams:
            writer.write(b"GET /hold HTTP/1.1\r\nHost: w\r\n\r\n")
            await writer.drain()
        answer = await asyncio.wait_for(_status_line(port, "/health"), 30)
        assert answer == b"HTTP/1.1 200 OK"
        counting.release.set()
        for _, writer in streams:
            writer.close()
