"""Injected faults: the other wedge families, each switched on at a chosen time.

`--fault NAME@SECONDS[:RANK]` arms a fault SECONDS after the server is ready (the instant it
logs `Starting vLLM API server`), however long its engines took to start. What a
watchdog sees from outside (docs/simulator.md has the full table):

* `collective-hang` (TP workers): every `vllm:` value freezes with running > 0, /health
  stays 200; the engine waits in `future.result()` on workers stuck in `ncclAllReduce`.
* `engine-crash` (EngineCore): the engine exits 1, /health turns 503 and the serving
  process exits non-zero within ~5 s.
* `api-hang` (serving process): the port accepts connections, nothing ever answers.
* `garbage-metrics`: /metrics answers 200 with a body that is not Prometheus exposition.
* `slow-metrics`: /metrics answers 200 but trickles the body at ~256 bytes/s.
* `nan-gauges`: the stat logger records NaN for the queue and KV-usage gauges (as a 0/0
  division in a stats path would); counters and everything else stay real.
* `frozen-step` (EngineCore, vLLM #46811): the next step blocks for good in a timeout-less
  `future.result()` before its stats are published, so every `vllm:` value freezes at its
  last reading (idle when the engine was idle) while /health and /metrics keep answering
  200. Only a request through the queue (the canary) can tell it from a quiet server.
* `lost-store-event` (KV connector worker, one TP rank; the built-in model and
  `--scheduler vllm` alike, the latter through `vllm_engine.RealSettings.fault`): the next
  store the workers start is never confirmed by one rank (nor any later store: a rank
  reports in order), so it stays pending forever: its CPU copy never becomes readable and
  its request keeps a transfer in flight; requests that need those blocks are deferred for
  good (with SimpleCPUOffloadConnector its GPU blocks stay pinned).
* `hung-load` (KV connector worker, one TP rank): the next load (and any later one) never
  finishes: its request stays parked in WAITING_FOR_REMOTE_KVS holding its blocks, and
  requests that need the same chunks are deferred for good.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Literal

FaultName = Literal[
    "collective-hang",
    "engine-crash",
    "api-hang",
    "garbage-metrics",
    "slow-metrics",
    "nan-gauges",
    "frozen-step",
    "lost-store-event",
    "hung-load",
]
TRANSFER_FAULTS: tuple[FaultName, ...] = ("lost-store-event", "hung-load")
"""Faults of the KV connector's workers: the next transfer started never completes on one rank."""
ENGINE_FAULTS: frozenset[FaultName] = frozenset(
    {"collective-hang", "engine-crash", "frozen-step", *TRANSFER_FAULTS}
)
FAULT_NAMES: tuple[FaultName, ...] = (
    "collective-hang",
    "engine-crash",
    "api-hang",
    "garbage-metrics",
    "slow-metrics",
    "nan-gauges",
    "frozen-step",
    "lost-store-event",
    "hung-load",
)

# What /metrics serves under `garbage-metrics`: the error page a broken proxy or a
# crashed framework might return, with status 200. No line of it is valid exposition.
GARBAGE_METRICS_BODY = (
    b"<!DOCTYPE html>\n<html><head><title>Internal error</title></head>\n"
    b"<body><h1>upstream returned an invalid response</h1>\n"
    b'<p>{"detail": "stats logger unavailable"}</p></body></html>\n'
)
SLOW_METRICS_CHUNK_BYTES = 64
SLOW_METRICS_CHUNK_INTERVAL_SECONDS = 0.25

log = logging.getLogger("wedgewatch.lab.sim.faults")


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One armed fault: what, when (seconds after start) and, optionally, which DP engine."""

    name: FaultName
    at_seconds: float
    engine: int | None = None  # None: every engine (engine faults only)

    def render(self) -> str:
        """The flag value that produces this spec (`collective-hang@20:1`)."""
        suffix = "" if self.engine is None else f":{self.engine}"
        return f"{self.name}@{self.at_seconds:g}{suffix}"


def parse_fault(text: str) -> FaultSpec | str:
    """Parse `NAME@SECONDS[:RANK]` (or bare `NAME`, meaning at start); a str is an error."""
    name_text, at_sign, rest = text.partition("@")
    if name_text not in FAULT_NAMES:
        return f"unknown fault {name_text!r}; known faults: {', '.join(FAULT_NAMES)}"
    name: FaultName = name_text
    when_text, _, rank_text = rest.partition(":")
    at_seconds = 0.0
    if when_text:
        try:
            at_seconds = float(when_text)
        except ValueError:
            return f"expected NAME@SECONDS, {when_text!r} is not a number of seconds"
        if not math.isfinite(at_seconds) or at_seconds < 0:
            return f"the time must be a non-negative number of seconds, got {when_text!r}"
    elif at_sign:
        return "expected NAME@SECONDS, the time after '@' is missing"
    engine: int | None = None
    if rank_text:
        if name not in ENGINE_FAULTS:
            return f"{name} is a fault of the serving process; it takes no ':RANK'"
        try:
            engine = int(rank_text)
        except ValueError:
            return f"the data-parallel rank after ':' must be an integer, got {rank_text!r}"
        if engine < 0:
            return f"the data-parallel rank must be >= 0, got {engine}"
    return FaultSpec(name=name, at_seconds=at_seconds, engine=engine)


@dataclass(frozen=True, slots=True)
class FaultClock:
    """Answers "is this fault active now?" from the start instant and the armed specs (pure).

    `origin_at` is the monotonic instant the server became ready (CLOCK_MONOTONIC is
    system-wide, so the engine processes share it); None until then: no fault is active and
    none has a time yet.
    """

    origin_at: float | None
    faults: tuple[FaultSpec, ...]

    def started(self, origin_at: float) -> FaultClock:
        """This clock, started at `origin_at`."""
        return replace(self, origin_at=origin_at)

    def active(self, name: FaultName, now: float, engine: int | None = None) -> bool:
        """True once `now` has reached an armed `name` fault that applies to `engine`."""
        if self.origin_at is None:
            return False
        return any(
            fault.name == name
            and now - self.origin_at >= fault.at_seconds
            and (fault.engine is None or engine is None or fault.engine == engine)
            for fault in self.faults
        )

    def first_at(self, name: FaultName, engine: int | None = None) -> float | None:
        """The monotonic instant the earliest matching `name` fault fires, or None (also
        while the clock has not started)."""
        if self.origin_at is None:
            return None
        times = [
            self.origin_at + fault.at_seconds
            for fault in self.faults
            if fault.name == name
            and (fault.engine is None or engine is None or fault.engine == engine)
        ]
        return min(times) if times else None

    def for_engine(self, engine: int) -> FaultClock:
        """The engine faults that apply to DP rank `engine`."""
        return FaultClock(
            origin_at=self.origin_at,
            faults=tuple(
                fault
                for fault in self.faults
                if fault.name in ENGINE_FAULTS and fault.engine in (None, engine)
            ),
        )


def block_event_loop_forever() -> None:
    """`api-hang`: block the serving process's event loop; the listening socket stays open."""
    log.warning("fault api-hang: the HTTP event loop is now blocked for good")
    while True:
        time.sleep(3600)


async def trickle(body: bytes) -> AsyncIterator[bytes]:
    """`slow-metrics`: yield `body` a few bytes at a time, very slowly."""
    for start in range(0, len(body), SLOW_METRICS_CHUNK_BYTES):
        yield body[start : start + SLOW_METRICS_CHUNK_BYTES]
        await asyncio.sleep(SLOW_METRICS_CHUNK_INTERVAL_SECONDS)
