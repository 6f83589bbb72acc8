"""sd_notify over a real datagram socket, as systemd receives it."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from wedgewatch.io.systemd_notify import SystemdNotifier


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket standing where systemd's notify socket would be."""
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield path, sock
    sock.close()


def test_ready_watchdog_stopping_reach_the_socket(listener: tuple[str, socket.socket]) -> None:
    """READY=1, WATCHDOG=1 and STOPPING=1 arrive as separate datagrams, status included."""
    path, sock = listener
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000"})
    assert notifier.watchdog_seconds == 30.0
    assert notifier.ready("watching 1 target")
    assert notifier.watchdog()
    assert notifier.stopping()
    received = [sock.recv(4096).decode() for _ in range(3)]
    assert received == ["READY=1\nSTATUS=watching 1 target", "WATCHDOG=1", "STOPPING=1"]


def test_abstract_socket_address() -> None:
    """An address starting with @ is an abstract socket (leading NUL byte)."""
    name = f"wedgewatch-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        assert SystemdNotifier.from_environ({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_without_systemd_everything_is_a_no_op() -> None:
    """Without NOTIFY_SOCKET nothing is sent and the watchdog is off."""
    notifier = SystemdNotifier.from_environ({"WATCHDOG_USEC": "1000000"})
    assert not notifier.enabled
    assert notifier.watchdog_seconds is None
    assert not notifier.ready()
    assert not notifier.watchdog()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({}, None, id="unset"),
        pytest.param({"WATCHDOG_USEC": "0"}, None, id="zero"),
        pytest.param({"WATCHDOG_USEC": "abc"}, None, id="garbage"),
        pytest.param({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "1"}, None, id="other-pid"),
        pytest.param({"WATCHDOG_USEC": "5000000", "WATCHDOG_PID": "self"}, 5.0, id="own-pid"),
    ],
)
def test_watchdog_applies_only_to_this_process(
    env: dict[str, str], expected: float | None, tmp_path: Path
) -> None:
    """WATCHDOG_USEC counts only when positive and meant for this pid."""
    env = {k: (str(os.getpid()) if v == "self" else v) for k, v in env.items()}
    env["NOTIFY_SOCKET"] = str(tmp_path / "absent.sock")
    assert SystemdNotifier.from_environ(env).watchdog_seconds == expected


def test_vanished_socket_is_not_an_error(tmp_path: Path) -> None:
    """A notify socket that does not exist makes the send return False, never raise."""
    notifier = SystemdNotifier.from_environ({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    assert notifier.enabled
    assert not notifier.ready()
