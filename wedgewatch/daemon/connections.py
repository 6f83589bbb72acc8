"""Bounds on the connections of wedgewatch's own HTTP server.

Anything that can reach the port (every container of the pod, the node, any local user)
can open connections and send nothing, or half a request head. uvicorn keeps such a
connection for ever, and its `limit_concurrency` then answers every request with 503: 63
silent sockets turned `/health` and `/probe` (liveness probes) into a restart of vLLM.
Here instead:

- **Idle timeout.** A connection with no request in flight (just opened, or after a
  response) that sends nothing for `idle_timeout_seconds` is closed.
- **Header timeout.** Once the first byte of a request arrives, its whole head must
  arrive within `header_timeout_seconds`; more bytes never extend that deadline (a drip
  gains nothing).
- **Per peer.** One client address holds at most `max_connections_per_peer` connections;
  its next one closes *its own* oldest idle connection, so a flood from one peer never
  touches another's (in Kubernetes the kubelet probes from the node's address, never
  from the pod's).
- **In total.** At most `max_connections`; the next one closes the oldest idle
  connection of any peer.

The newest connection always wins: a probe, which sends its request at once, is never
the oldest idle connection, so it is answered while the bounds are hit. Only when every
connection has a request in flight (handlers here answer in microseconds) is a new one
refused. Connections with a request in flight are never closed by these rules.

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
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import structlog

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
)

#: How often at most the daemon logs that its connection bounds closed connections.
REPORT_EVERY_SECONDS: Final = 60.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The bounds of the daemon's HTTP server (see the module docstring for each rule)."""

    max_connections: int = 256
    max_connections_per_peer: int = 32
    idle_timeout_seconds: float = 10.0
    header_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        """Reject a bound that is not a positive count or a positive finite time."""
        for name in ("max_connections", "max_connections_per_peer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
        for name in ("idle_timeout_seconds", "header_timeout_seconds"):
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
        self.refused = 0
        self.timed_out = 0
        self._reported = (0, 0, 0)
        self._reported_at: float | None = None

    def __len__(self) -> int:
        return len(self._all)

    def admit(self, connection: _GuardedProtocol) -> bool:
        """Make room for a new connection (closing the oldest idle ones); False: refuse it."""
        peers = self._by_peer.get(connection.peer, OrderedDict())
        if (len(peers) >= self.limits.per_peer and not self._evict_oldest(peers)) or (
            len(self._all) >= self.limits.max_connections and not self._evict_oldest(self._all)
        ):
            self.refused += 1
            self._report()
            return False
        self._all[connection] = None
        self._by_peer.setdefault(connection.peer, OrderedDict())[connection] = None
        return True

    def forget(self, connection: _GuardedProtocol) -> None:
        """The connection is closed."""
        self._all.pop(connection, None)
        peers = self._by_peer.get(connection.peer)
        if peers is not None:
            peers.pop(connection, None)
            if not peers:
                del self._by_peer[connection.peer]

    def timed_out_one(self) -> None:
        """Count a connection closed by the idle or header timeout."""
        self.timed_out += 1
        self._report()

    def _evict_oldest(self, connections: OrderedDict[_GuardedProtocol, None]) -> bool:
        for victim in connections:
            if not victim.busy:
                self.forget(victim)
                victim.drop()
                self.evicted += 1
                self._report()
                return True
        return False

    def _report(self) -> None:
        """Log the counts at most once per REPORT_EVERY_SECONDS (a flood makes one line)."""
        now = self._clock()
        if self._reported_at is not None and now - self._reported_at < REPORT_EVERY_SECONDS:
            return
        counts = (self.evicted, self.refused, self.timed_out)
        evicted, refused, timed_out = (a - b for a, b in zip(counts, self._reported, strict=True))
        self._reported, self._reported_at = counts, now
        log.warning(
            "http_connections_bounded",
            open=len(self._all),
            evicted=evicted,
            refused=refused,
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

    @property
    def busy(self) -> bool:
        """A request is in flight (its head was read, its response is not complete)."""
        return self.cycle is not None and not self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.peer = self.client[0] if self.client else ""
        if not self.guard.admit(self):
            self.drop()
            return
        self._arm(self.guard.limits.idle_timeout_seconds)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.busy and not self._partial:
            self._partial = True  # the head's deadline runs from its first byte, once
            self._arm(self.guard.limits.header_timeout_seconds)
        super().data_received(data)
        if self.busy:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        self._partial = False
        if self.busy:  # a pipelined request started at once
            self._disarm()
        else:
            self._arm(self.guard.limits.idle_timeout_seconds)

    def drop(self) -> None:
        """Close now; unsent bytes are discarded (a client that does not read holds nothing)."""
        self._disarm()
        transport = self.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size():
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
        self._timer = None
        if self.busy or self.transport.is_closing():
            return
        self.guard.forget(self)
        self.guard.timed_out_one()
        self.drop()


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
