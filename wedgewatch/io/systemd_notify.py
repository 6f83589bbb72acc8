"""The sd_notify protocol: tell systemd we are ready, alive, or stopping.

Under `Type=notify` systemd passes `NOTIFY_SOCKET` (a datagram socket path, or an
abstract name starting with `@`), and with `WatchdogSec=` also `WATCHDOG_USEC` (and
`WATCHDOG_PID`). A few lines of `socket` replace a dependency on libsystemd. Outside
systemd every call is a cheap no-op.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class SystemdNotifier:
    """Sends sd_notify messages when running under systemd, does nothing otherwise."""

    def __init__(self, address: str | None, watchdog_usec: int | None) -> None:
        self._address = address
        self._watchdog_usec = watchdog_usec

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """Read `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` (default: os.environ)."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        if address is not None and not address.startswith(("/", "@")):
            address = None  # vsock and other transports are not supported; stay silent
        watchdog_usec: int | None = None
        raw = env.get("WATCHDOG_USEC", "")
        watchdog_pid = env.get("WATCHDOG_PID", "")
        if raw.isdigit() and int(raw) > 0 and watchdog_pid in ("", str(os.getpid())):
            watchdog_usec = int(raw)
        return cls(address, watchdog_usec)

    @property
    def enabled(self) -> bool:
        """True when a notification socket was given."""
        return self._address is not None

    @property
    def watchdog_seconds(self) -> float | None:
        """The systemd watchdog timeout, when one is set for this process."""
        if self._address is None or self._watchdog_usec is None:
            return None
        return self._watchdog_usec / 1_000_000

    def ready(self, status: str = "") -> bool:
        """Report that startup finished (`READY=1`)."""
        return self._send("READY=1", status)

    def watchdog(self) -> bool:
        """Pet the systemd watchdog (`WATCHDOG=1`), when a watchdog is configured."""
        if self.watchdog_seconds is None:
            return False
        return self._send("WATCHDOG=1")

    def stopping(self, status: str = "") -> bool:
        """Report that shutdown began (`STOPPING=1`)."""
        return self._send("STOPPING=1", status)

    def status(self, status: str) -> bool:
        """Set the free-form status line `systemctl status` shows."""
        return self._send(f"STATUS={status}")

    def _send(self, *fields: str) -> bool:
        """Send one datagram; False when not under systemd or when the socket is gone."""
        if self._address is None:
            return False
        message = "\n".join(f if "=" in f else f"STATUS={f}" for f in fields if f)
        address = "\0" + self._address[1:] if self._address.startswith("@") else self._address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(address)
                sock.sendall(message.encode())
        except OSError:
            return False
        return True
