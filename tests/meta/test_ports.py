"""tests/support/ports.py: ports for child servers, clear of the ephemeral range."""

from __future__ import annotations

import socket

import ports
import pytest


def test_ports_come_from_below_the_ephemeral_range_and_are_not_repeated() -> None:
    handed = [ports.free_port() for _ in range(50)]
    assert len(set(handed)) == 50, handed
    assert all(ports.LOW <= port < ports.HIGH <= ports._ephemeral_low(60000) for port in handed)


def test_a_port_somebody_listens_on_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = int(taken.getsockname()[1])
        free = ports.free_port()
        monkeypatch.setattr(ports, "_NEXT", iter([busy, busy, free]))
        assert ports.free_port() == free
