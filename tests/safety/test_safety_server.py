"""Adversarial tests of the daemon's own HTTP server (issue #21): idle and half-sent
connections from anything that can reach the port never turn /health or /probe into 503.

Real sockets on 127.0.0.1 (and other loopback addresses, as other peers), a real
`wedgewatch run` child and a real HTTP target; no sleeps: every wait is for an event (a
response, or the server closing a connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry
from scripted_http import Reply, ScriptedServer, always
from wedgewatch_daemon import DaemonProcess

from wedgewatch.daemon.connections import ConnectionLimits
from wedgewatch.daemon.server import HttpServer, Snapshot, make_app

pytestmark = pytest.mark.slow

IDLE = (Path(__file__).parents[1] / "fixtures" / "idle.prom").read_bytes()
# A request head cut off before its blank line: the server waits for the rest.
HALF_SENT = b"GET /health HTTP/1.1\r\nHost: wedgewatch\r\nX-Slow: "


def _open(port: int, peer: str, payload: bytes = b"") -> socket.socket:
    """A connection to 127.0.0.1:port from loopback address `peer`, having sent `payload`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((peer, 0))
    sock.connect(("127.0.0.1", port))
    if payload:
        sock.sendall(payload)
    return sock


def _tcp_connections(pid: int, port: int) -> int:
    """How many established TCP connections process `pid` holds on its port `port`."""
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.laddr and c.laddr[1] == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_probes_answer_while_hundreds_of_idle_and_half_sent_connections_are_held(
    tmp_path: Path, enough_fds: None
) -> None:
    """300 silent and 300 half-sent connections from 13 peers: /health and /probe stay 200.

    Before the fix the 64th connection made every request a 503 for as long as the
    sockets stayed open. The daemon also never holds more than its total bound.
    """
    with ScriptedServer(always(Reply(body=IDLE))) as target:
        daemon = DaemonProcess(
            ["--target", f"t={target.url}", "--interval-seconds", "0.2"], tmp_path
        )
        try:
            daemon.wait_for("daemon_started", timeout_seconds=60)
            port = int(daemon.base_url.rsplit(":", 1)[1])
            held: list[socket.socket] = []
            try:
                # One peer (127.0.0.1, as everything in the pod) with 200 silent sockets,
                # twelve more with 25 silent and 25 half-sent each.
                held += [_open(port, "127.0.0.1") for _ in range(200)]
                for n in range(2, 14):
                    peer = f"127.0.0.{n}"
                    held += [_open(port, peer) for _ in range(25)]
                    held += [_open(port, peer, HALF_SENT) for _ in range(25)]
                held += [_open(port, "127.0.0.1", HALF_SENT) for _ in range(100)]
                assert len(held) == 900
                for _ in range(5):
                    for path in ("/health", "/probe"):
                        # A fresh connection each time, as the kubelet's probes are.
                        with httpx.Client(transport=httpx.HTTPTransport(retries=0)) as client:
                            response = client.get(daemon.base_url + path, timeout=30)
                        assert response.status_code == 200, (path, response.text)
                    # The probes are answered from 127.0.0.1 too, the peer holding most.
                assert _tcp_connections(daemon.proc.pid, port) <= ConnectionLimits().max_connections
            finally:
                for sock in held:
                    sock.close()
        finally:
            daemon.stop()


def _snapshot() -> Snapshot:
    return Snapshot(
        version="t", started_at=0.0, started_timestamp=0.0, health_stale_after_seconds=1e9
    )


async def _closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded by pytest's timeout).

    A reset is a close too: a server that closes a socket with client bytes still unread
    (a byte dripped just before its deadline passed) makes the kernel send a reset instead of
    a FIN. Whatever the server sent before it is read first, so it is in what this returns.
    """
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := await reader.read(65536):
            data += chunk
    return data


@contextlib.asynccontextmanager
async def _server(limits: ConnectionLimits) -> AsyncIterator[tuple[str, int]]:
    snapshot = _snapshot()
    server = HttpServer(
        make_app(lambda: snapshot, CollectorRegistry(), lambda: 0.0), "127.0.0.1", 0, limits
    )
    await server.start()
    try:
        yield server.address
    finally:
        await server.stop()


async def test_a_silent_connection_is_closed_after_the_idle_timeout() -> None:
    """A connection that never sends a byte is closed by the server (it used to stay open)."""
    async with _server(ConnectionLimits(idle_timeout_seconds=0.2)) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        assert await _closed_by_server(reader) == b""
        writer.close()


async def test_a_dripped_request_head_is_closed_after_the_header_timeout() -> None:
    """A head sent one byte at a time never completes; the drip does not extend the deadline."""
    async with _server(ConnectionLimits(header_timeout_seconds=0.3)) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        closed = asyncio.ensure_future(_closed_by_server(reader))
        for byte in HALF_SENT * 1000:
            if closed.done():
                break
            writer.write(bytes([byte]))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            await asyncio.wait([closed], timeout=0.02)
        assert closed.done(), "the server kept a dripped head open past its header timeout"
        assert await closed == b""
        writer.close()


async def test_a_kept_alive_connection_is_closed_after_the_idle_timeout_and_served_before() -> None:
    """A normal client's keep-alive connection is served, then closed once idle."""
    async with _server(ConnectionLimits(idle_timeout_seconds=0.2)) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: w\r\n\r\n")
        answer = await _closed_by_server(reader)
        assert answer.startswith(b"HTTP/1.1 200 ")
        writer.close()


async def test_the_newest_connection_of_a_full_peer_evicts_its_oldest_idle_one() -> None:
    """Per peer: the (max+1)th connection closes that peer's oldest idle one, not itself."""
    limits = ConnectionLimits(max_connections=100, max_connections_per_peer=3)
    async with _server(limits) as (host, port):
        streams = [await asyncio.open_connection(host, port) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
        assert (await _closed_by_server(reader)).startswith(b"HTTP/1.1 200 ")
        assert await _closed_by_server(streams[0][0]) == b""  # the oldest was evicted
        for _, w in streams:
            w.close()
        writer.close()


async def test_the_total_bound_evicts_the_oldest_idle_connection_of_any_peer() -> None:
    """In total: a new connection from another peer closes the oldest idle connection."""
    limits = ConnectionLimits(max_connections=4, max_connections_per_peer=4)
    async with _server(limits) as (host, port):
        streams = [
            await asyncio.open_connection(host, port, local_addr=(f"127.0.0.{n}", 0))
            for n in range(2, 6)
        ]
        reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.9", 0))
        writer.write(b"GET /health HTTP/1.1\r\nHost: w\r\nConnection: close\r\n\r\n")
        assert (await _closed_by_server(reader)).startswith(b"HTTP/1.1 200 ")
        assert await _closed_by_server(streams[0][0]) == b""
        for _, w in streams:
            w.close()
        writer.close()


def test_limits_reject_nonsense() -> None:
    """Bounds must be positive and finite; a per-peer bound above the total is clamped."""
    with pytest.raises(ValueError, match="max_connections"):
        ConnectionLimits(max_connections=0)
    with pytest.raises(ValueError, match="idle_timeout_seconds"):
        ConnectionLimits(idle_timeout_seconds=float("nan"))
    assert ConnectionLimits(max_connections=4, max_connections_per_peer=9).per_peer == 4
