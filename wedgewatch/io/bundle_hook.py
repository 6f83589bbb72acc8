"""The `on_bundle` hook: an operator's command run with a bundle's path once it is complete.

A bundle on a pod's volume dies with the pod; the hook is how it leaves the machine (an
upload to object storage, a copy to a shared volume, a ticket). It runs like the `exec`
remedy (`io.restarters`): no shell, its own session (a timeout kills its whole group), the
same minimal environment (`inherited_environment`: PATH, HOME, LANG, ... never wedgewatch's
settings or secrets), bounded in time, its output's tail kept for the log. It gets the
bundle directory as its last argument and in `WEDGEWATCH_BUNDLE`, with
`WEDGEWATCH_TARGET` and `WEDGEWATCH_PHASE`. Its outcome is data: `ok`, `failed` or
`timeout`, never an exception.

The hook only reads the bundle: retention (`evidence_keep`, `evidence_max_bytes`) still
decides what stays on disk, whatever the hook did with it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from wedgewatch.core.restart.restart_policy import FailureReason
from wedgewatch.core.values import immutable
from wedgewatch.io.restarters import inherited_environment, run_operator_command

HookResult = Literal["ok", "failed", "timeout"]


@immutable
class HookOutcome:
    """How one run of the hook went."""

    result: HookResult
    detail: str
    duration_seconds: float


class BundleHook:
    """Runs `argv + [bundle]` for each complete bundle, under `timeout_seconds`."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        timeout_seconds: float,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not argv or not argv[0]:
            raise ValueError("on_bundle must start with the program to run")
        if not math.isfinite(timeout_seconds) or timeout_seconds <= 0:
            raise ValueError(f"on_bundle_timeout_seconds must be > 0, got {timeout_seconds}")
        self.argv = tuple(argv)
        self._timeout = timeout_seconds
        self._env = env
        self._clock = clock

    def environment(self, bundle: Path, *, target: str, phase: str) -> dict[str, str]:
        """The hook's whole environment: the inherited few, and the bundle it is about."""
        env = inherited_environment(os.environ if self._env is None else self._env)
        env.update(WEDGEWATCH_BUNDLE=str(bundle), WEDGEWATCH_TARGET=target, WEDGEWATCH_PHASE=phase)
        return env

    async def run(self, bundle: Path, *, target: str, phase: str) -> HookOutcome:
        """Run the hook for `bundle`; a failure or a timeout is the outcome, never raised."""
        outcome = await run_operator_command(
            f"on_bundle {self.argv[0]}",
            (*self.argv, str(bundle)),
            self.environment(bundle, target=target, phase=phase),
            self._timeout,
            self._clock,
        )
        result: HookResult = "ok"
        if not outcome.ok:
            result = "timeout" if outcome.failure is FailureReason.TIMEOUT else "failed"
        return HookOutcome(result, outcome.detail, outcome.duration_seconds)
