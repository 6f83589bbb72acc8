"""Asking a server's supervisor whether it is already restarting the server (rule W1).

When a server crashed, its supervisor (systemd with `Restart=`) is usually bringing it back
already; restarting it again would kill the model load. `SystemdStateProbe` reads the
unit's `ActiveState` / `SubState`: `activating` or `auto-restart` means systemd restarts it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol

from wedgewatch.io.runner import run_command


def parse_unit_state(text: str) -> tuple[str, str]:
    """(ActiveState, SubState) from `systemctl show --property=ActiveState,SubState` output."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and line.strip())
    return values.get("ActiveState", "").strip(), values.get("SubState", "").strip()


def supervisor_is_restarting(active_state: str, sub_state: str) -> bool:
    """Is systemd bringing the unit back by itself (`Restart=`): starting it, or waiting to?"""
    return active_state == "activating" or sub_state == "auto-restart"


class SupervisorProbe(Protocol):
    """Asks the server's supervisor whether it is already restarting the server."""

    async def restarting(self, target: str) -> str | None:
        """A sentence saying the supervisor is restarting `target`'s server, else None."""
        ...


class SystemdStateProbe:
    """Reads a target's systemd unit state: `activating` or `auto-restart` means systemd is
    already restarting the server, so a refused connection is waited out, not restarted.

    When the state cannot be read (no systemctl, no such unit, a timeout) the answer is
    None: wedgewatch then acts as it would without a supervisor.
    """

    def __init__(
        self,
        units: Mapping[str, str],
        *,
        user: bool = False,
        systemctl: str = "systemctl",
        timeout_seconds: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.units = dict(units)
        self._user = user
        self._systemctl = systemctl
        self._timeout = timeout_seconds
        self._env = env

    async def restarting(self, target: str) -> str | None:
        """Ask systemd about the target's unit; None when it is not restarting or unknown."""
        unit = self.units.get(target)
        if unit is None:
            return None
        scope = ("--user",) if self._user else ()
        argv = (self._systemctl, *scope, "show", "--property=ActiveState,SubState", unit)
        env = dict(os.environ if self._env is None else self._env)
        result = await run_command(
            argv, timeout_seconds=self._timeout, env=env, stdout_bytes=4096, stderr_bytes=4096
        )
        if result.returncode != 0:
            return None
        active, sub = parse_unit_state(result.stdout.decode("utf-8", "replace"))
        if not supervisor_is_restarting(active, sub):
            return None
        return (
            f"systemd is already restarting {unit} (ActiveState={active}, SubState={sub}); "
            "waiting for it instead of restarting the server a second time"
        )
