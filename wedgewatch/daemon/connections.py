"""Bounds on the connections of wedgewatch's own HTTP server.

Anything that can reach the port (every container of the pod, the node, any local user)
can open connections and send nothing, send half a request head, or pipeline requests and
never read the answers. uvicorn alone keeps such connections for ever, and its
`limit_concurrency` then answers every request with 503: a few dozen sockets turned
`/health` and `/probe` (liveness probes) into a restart of vLLM. Here instead:

- **Idle timeout.** A connection with no request in flight (just opened, or after a
  response) that sends nothing for `idle_timeout_seconds` is closed.
- **Header timeout.** Once the first byte of a request arrives, its whole head must
  arrive within `header_timeout_seconds`; more bytes never extend that deadline (a drip
  gains nothing).
- **Send timeout.** Once a request's head is read, its whole response must reach the
  client (acknowledged by its TCP) within `send_timeout_seconds`; a client that does not
  read its answers (a tiny receive window, requests pipelined and never read) is reset
  then, its unsent bytes dropped.
- **One request at a time.** The next pipelined request is not read before the client
  has the previous response: the transport's write buffer is empty and the kernel holds
  no byte of it unacknowledged (`SIOCOUTQ`, looked at again after 2 ms, 4 ms, ... up to
  every 0.5 s). A client that pipelines and never reads costs one response, never
  thousands; each accepted socket's kernel send buffer is also held to
  `SEND_BUFFER_BYTES`, so an answer it does not read parks little kernel memory.
- **Per peer.** One client address holds at most `max_connections_per_peer` connections;
  past that, *its own* oldest evictable connections are closed, so a flood from one peer
  never touches another's (in Kubernetes the kubelet probes from the node's address,
  never from the pod's).
- **In total.** At most `max_connections`; past that, the oldest evictable connections of
  any peer are closed.

Evictable means idle, half-sent, or done: its response is written and waits for a client
to read it. A new connection is never refused and a busy one (its request in flight,
answered in microseconds) never closed: the counts may pass a bound until the busy
connections' responses are written, and are brought back under it then. So a probe,
which sends its request at once and reads its answer, is always answered, however many
connections other peers (or its own) hold; docs/security.md says why this priority
rather than a reserve or a second listener.

The bounds subclass uvicorn's `H11Protocol`, which uvicorn does not document as API (its
`Config(http=...)` takes any protocol class). Tested at both ends of the declared range: at
the uvicorn floor by the declared-minimum-versions smoke test (a silent connection is closed)
and at the newest release by tests/safety/test_safety_server.py. The import is inside a `try`: a
uvicorn without the class, or without a method the bounds override, serves on its own
protocol (no bounds) and the daemon logs `http_connection_bounds_unavailable` once, rather
than failing to start (docs/development.md, "Dependency floors").
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import socket
import struct
import termios
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog

from wedgewatch.core.values import immutable

if TYPE_CHECKING:
    from uvicorn.protocols.http.h11_impl import H11Protocol
else:
    try:  # not documented API: see the module docstring
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError:  # the subclass below is then never used (`guarded_protocol`)
        H11Protocol = asyncio.Protocol

log = structlog.get_logger("wedgewatch.daemon")

#: The methods of uvicorn's `H11Protocol` that the bounds override and call.
HOOKED_METHODS: Final = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_response_complete",
    "pause_writing",
    "resume_writing",
)

#: The kernel send buffer of every accepted socket (Linux doubles it for bookkeeping):
#: without it, loopback autotuning lets a client that never reads park megabytes of
#: answers in the kernel, each one a request the server rendered for nothing.
SEND_BUFFER_BYTES: Final = 64 * 1024

#: How often at most the daemon logs that its connection bounds closed connections.
REPORT_EVERY_SECONDS: Final = 60.0


@immutable
class ConnectionLimits:
    """The bounds of the daemon's HTTP server (see the module docstring for each rule)."""

    max_connections: int = 256
    max_connections_per_peer: int = 32
    idle_timeout_seconds: float = 10.0
    header_timeout_seconds: float = 10.0
    send_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        """Reject a bound that is not a positive count or a positive finite time."""
        for name in ("max_connections", "max_connections_per_peer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        for name in ("idle_timeout_seconds", "header_timeout_seconds", "send_timeout_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")

    @property
    def per_peer(self) -> int:
        """The per-peer bound, never above the total one."""
        return min(self.max_connections_per_peer, self.max_connections)


class ConnectionGuard:
    """Tracks the open connections of one server, oldest first, in total and per peer."""

    def __init__(
        self, limits: ConnectionLimits, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limits = limits
        self._clock = clock
        self._all: OrderedDict[_GuardedProtocol, None] = OrderedDict()
        self._by_peer: dict[str, OrderedDict[_GuardedProtocol, None]] = {}
        self.evicted = 0
        self.timed_out = 0
        self._reported = (0, 0)
        self._reported_at: float | None = None

    def __len__(self) -> int:
        return len(self._all)

    def admit(self, connection: _GuardedProtocol) -> None:
        """Take a new connection, then close the oldest evictable ones over the bounds.

        Nothing is ever refused, and nothing busy closed: a connection whose request is in
        flight becomes evictable as soon as its response is written, and `trim` (called
        then) brings the counts back under the bounds.
        """
        self._all[connection] = None
        self._by_peer.setdefault(connection.peer, OrderedDict())[connection] = None
        self.trim(connection.peer, spare=connection)

    def trim(self, peer: str, spare: _GuardedProtocol | None = None) -> None:
        """Close the oldest evictable connections (never `spare`) of `peer`, then of any
        peer, while over the per-peer or the total bound."""
        peers = self._by_peer.get(peer)
        while peers and len(peers) > self.limits.per_peer and self._evict_oldest(peers, spare):
            pass
        while len(self._all) > self.limits.max_connections and self._evict_oldest(self._all, spare):
            pass

    def forget(self, connection: _GuardedProtocol) -> None:
        """The connection is closed."""
        self._all.pop(connection, None)
        peers = self._by_peer.get(connection.peer)
        if peers is not None:
            peers.pop(connection, None)
            if not peers:
                del self._by_peer[connection.peer]

    def timed_out_one(self) -> None:
        """Count a connection closed by the idle, header or send timeout."""
        self.timed_out += 1
        self._report()

    def _evict_oldest(
        self,
        connections: OrderedDict[_GuardedProtocol, None],
        spare: _GuardedProtocol | None = None,
    ) -> bool:
        for victim in connections:
            if victim.evictable and victim is not spare:
                self._evict(victim)
                return True
        return False

    def _evict(self, victim: _GuardedProtocol) -> None:
        self.forget(victim)
        victim.drop()
        self.evicted += 1
        self._report()

    def _report(self) -> None:
        """Log the counts at most once per REPORT_EVERY_SECONDS (a flood makes one line)."""
        now = self._clock()
        if self._reported_at is not None and now - self._reported_at < REPORT_EVERY_SECONDS:
            return
        counts = (self.evicted, self.timed_out)
        evicted, timed_out = (a - b for a, b in zip(counts, self._reported, strict=True))
        self._reported, self._reported_at = counts, now
        log.warning(
            "http_connections_bounded",
            open=len(self._all),
            evicted=evicted,
            timed_out=timed_out,
            max_connections=self.limits.max_connections,
            max_connections_per_peer=self.limits.per_peer,
            note=f"counts since the previous line (at most one per {REPORT_EVERY_SECONDS:g} s)",
        )


class _GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol under a `ConnectionGuard`: admitted, timed out, evictable."""

    guard: ConnectionGuard  # set on the per-server subclass made by `guarded_protocol`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.peer = ""
        self._timer: asyncio.TimerHandle | None = None
        self._partial = False  # bytes of a request head arrived since the last response
        self._sending = False  # the send deadline of the request in flight is armed
        self._unflushed = False  # a complete response has not reached the client yet
        self._stalled = False  # the write buffer waits for a client that does not read
        self._ack_wait = ACK_POLL_FIRST_SECONDS  # the next look at the kernel's queue
        self._ack_timer: asyncio.TimerHandle | None = None

    @property
    def busy(self) -> bool:
        """A request is in flight: its head was read, its response has not left for the
        kernel yet."""
        cycle_busy = self.cycle is not None and not self.cycle.response_complete
        return cycle_busy or self._unflushed

    @property
    def evictable(self) -> bool:
        """Idle, half-sent, or waiting for a client to read a response the server has
        finished (in the write buffer or the kernel's)."""
        return not self.busy or self._stalled or self._unflushed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        # Any byte left in the write buffer pauses writing, and the buffer's emptying
        # resumes it: a response counts as sent once it is all in the kernel.
        transport.set_write_buffer_limits(high=0, low=0)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        self._arm(self.guard.limits.idle_timeout_seconds)
        self.guard.admit(self)  # may close older connections, never this one (it is idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.busy and not self._partial:
            self._partial = True  # the head's deadline runs from its first byte, once
            self._arm(self.guard.limits.header_timeout_seconds)
        super().data_received(data)
        self._after_events()

    def on_response_complete(self) -> None:
        if self.transport.is_closing():
            self._complete()
            return
        # The next (pipelined) request waits until this response has reached the client.
        self._unflushed = True
        self.flow.pause_reading()
        self._ack_wait = ACK_POLL_FIRST_SECONDS
        self._check_sent()
        self._now_evictable()

    def _check_sent(self) -> None:
        """Complete the response once the client has it: the write buffer empty (else
        `resume_writing` looks again) and nothing left unacknowledged in the kernel (else
        look again later, less and less often)."""
        if not self._unflushed or self.transport.is_closing() or self._ack_timer is not None:
            return
        if self.transport.get_write_buffer_size():
            return
        if _unacknowledged(self.transport):
            self._ack_timer = self.loop.call_later(self._ack_wait, self._look_again)
            self._ack_wait = min(self._ack_wait * 2, ACK_POLL_MAX_SECONDS)
            return
        self._unflushed = False
        self._complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._stalled = True
        self._now_evictable()

    def _now_evictable(self) -> None:
        """This connection may have become evictable: back under the bounds, if over."""
        if not self.transport.is_closing() and self.evictable:
            self.guard.trim(self.peer)

    def _look_again(self) -> None:
        self._ack_timer = None
        self._check_sent()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled = False
        self._check_sent()

    def _complete(self) -> None:
        """The response left for the kernel: on to the next request (maybe pipelined)."""
        self._disarm()
        self._partial = self._sending = False
        super().on_response_complete()  # may start a pipelined request at once
        self._after_events()

    def _after_events(self) -> None:
        """Arm the deadline that fits: a new request's send deadline, or the idle one."""
        if self.transport.is_closing():
            return
        if self.busy:
            if not self._sending:  # a request began: its answer must leave in time
                self._sending = True
                self._arm(self.guard.limits.send_timeout_seconds)
        elif not self._partial and self._timer is None:
            self._arm(self.guard.limits.idle_timeout_seconds)

    def drop(self) -> None:
        """Close now; unsent bytes are discarded (a client that does not read holds nothing).

        With bytes still unsent the connection is reset (SO_LINGER 0), so the kernel does
        not keep trying to deliver them either.
        """
        self._disarm()
        transport = self.transport
        if transport.is_closing():
            return
        if self.busy or self._stalled or transport.get_write_buffer_size():
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            transport.abort()
        else:
            transport.close()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        """The idle, header or send deadline passed."""
        self._timer = None
        if self.transport.is_closing():
            return
        self.guard.forget(self)
        self.guard.timed_out_one()
        self.drop()


#: SO_LINGER on, zero seconds: `close` resets the connection and drops unsent bytes.
_RESET: Final = struct.pack("ii", 1, 0)

#: How soon, and then how often at most, a finished response's socket is looked at again
#: for bytes the client has not acknowledged yet (the delay doubles each time).
ACK_POLL_FIRST_SECONDS: Final = 0.002
ACK_POLL_MAX_SECONDS: Final = 0.5


def _unacknowledged(transport: asyncio.Transport) -> int:
    """Bytes of the socket's send queue the client has not acknowledged (Linux
    `SIOCOUTQ`); 0 where that cannot be read (the check is then the write buffer alone)."""
    sock = transport.get_extra_info("socket")
    if sock is None or _SIOCOUTQ is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0")
    except OSError:
        return 0
    return int(struct.unpack("i", raw)[0])


_SIOCOUTQ: Final = getattr(termios, "TIOCOUTQ", None)  # SIOCOUTQ is TIOCOUTQ on Linux


def guarded_protocol(
    guard: ConnectionGuard, base: type[asyncio.Protocol] = H11Protocol
) -> type[asyncio.Protocol] | Literal["auto"]:
    """An HTTP protocol class for uvicorn (`Config(http=...)`) whose connections `guard` bounds.

    "auto" (uvicorn's own protocol, unbounded; logged) when this uvicorn's `base` lacks a
    method the bounds override: a uvicorn outside the tested range must not stop the daemon.
    """
    missing = [name for name in HOOKED_METHODS if not callable(getattr(base, name, None))]
    if missing:
        log.warning(
            "http_connection_bounds_unavailable",
            missing=missing,
            note="this uvicorn's h11 protocol lacks what the connection bounds hook; "
            "serving without idle/header timeouts and connection bounds (docs/security.md)",
        )
        return "auto"
    return type("GuardedH11Protocol", (_GuardedProtocol,), {"guard": guard})
