"""Ports for servers a test starts in a child process (which binds the port itself, later).

Binding port 0 and closing hands out a port from the kernel's ephemeral range, the range every
outgoing connection on the machine also takes its local port from: with the suite's workers
connecting to servers all the time, a port found free that way can be taken by somebody's
client socket before the child binds it (the launcher then refuses to start: "port ... is
already in use"). These ports come from below the ephemeral range, from a slice of it for
each xdist worker, and are checked free on every address before they are handed out.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator


def _ephemeral_low(default: int = 32768) -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as text:
            return int(text.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default


#: Below the ephemeral range (Linux's default is 32768-60999), above the well-known and most
#: registered service ports a developer machine may run.
HIGH = max(_ephemeral_low(), 24000)
LOW = HIGH - 12000
_SLICES = 8


def _worker_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % _SLICES if worker.isdigit() else 0
    width = (HIGH - LOW) // _SLICES
    return range(LOW + index * width, LOW + (index + 1) * width)


def _candidates() -> Iterator[int]:
    ports = list(_worker_slice())
    random.Random(os.getpid()).shuffle(ports)
    return itertools.cycle(ports)


_NEXT = _candidates()


def _bindable(port: int) -> bool:
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")):
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((address, port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A port nobody has bound, not from the ephemeral range, not handed out by this worker
    since it last went round its slice."""
    for _ in range(HIGH - LOW):
        port = next(_NEXT)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {_worker_slice()}")
