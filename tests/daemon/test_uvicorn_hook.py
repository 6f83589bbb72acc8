"""The connection bounds' hook into uvicorn (daemon/connections.py): what it relies on, and
its fallback when a uvicorn does not have it.

The bounds subclass uvicorn's `H11Protocol`, not documented API. These tests fail when the
installed uvicorn stops defining a method the bounds override (the default tier runs them on
the newest uvicorn; the declared-minimum-versions job proves the floor end to end), and show
that a uvicorn without it serves unbounded with one warning rather than stopping the daemon.
"""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs
from uvicorn.protocols.http.h11_impl import H11Protocol

from wedgewatch.daemon.connections import (
    HOOKED_METHODS,
    ConnectionGuard,
    ConnectionLimits,
    guarded_protocol,
)


def test_uvicorn_h11_protocol_defines_every_method_the_bounds_override() -> None:
    """Each hooked method is H11Protocol's own, not asyncio.Protocol's no-op default."""
    for name in HOOKED_METHODS:
        defined_by = next(cls for cls in H11Protocol.__mro__ if name in vars(cls))
        assert defined_by is H11Protocol, (name, defined_by)


def test_the_guarded_protocol_is_uvicorns_h11_protocol_bound_to_its_guard() -> None:
    guard = ConnectionGuard(ConnectionLimits())
    protocol = guarded_protocol(guard)
    assert isinstance(protocol, type)
    assert issubclass(protocol, H11Protocol)
    assert protocol.guard is guard  # type: ignore[attr-defined]


def test_a_uvicorn_without_the_hook_serves_unbounded_and_says_so_once() -> None:
    """A base without `on_response_complete` (as asyncio.Protocol): uvicorn's own protocol."""
    with capture_logs() as logs:
        chosen = guarded_protocol(ConnectionGuard(ConnectionLimits()), asyncio.Protocol)
    assert chosen == "auto"
    (line,) = logs
    assert line["event"] == "http_connection_bounds_unavailable"
    assert line["missing"] == ["on_response_complete"]
    assert line["log_level"] == "warning"
