"""What vLLM's numbers and processes mean: which counters are progress and output, and which
process does what.

`signals` knows the metric names and turns a body into readings; this module knows what a
reading says about work (the detector's rules build on it), and how vLLM titles its processes
(`procs` and `triage` build on that). Pure: no IO.

Progress and output
-------------------
An engine makes **progress** when any of these counters moves: prompt tokens, generation
tokens, finished requests, preemptions, iterations (engine steps that emitted tokens). It
makes **output** when generation tokens or finished requests move. A counter that stays
NaN did not move.

Processes (vLLM V1, and the simulator alike)
--------------------------------------------
vLLM titles its processes with `setproctitle`. The API server keeps its command line
(`vllm serve MODEL ...`; with several API servers the children are `VLLM::APIServer_<n>`),
so it is recognised as the process listening on the target's port. The engine core is
`VLLM::EngineCore` (`VLLM::EngineCore_DP<rank>` with data parallelism); its workers, one
per rank when TP or PP > 1, are `VLLM::Worker` plus a suffix per parallel dimension
(`VLLM::Worker_TP0`, `VLLM::Worker_TP1`). The kernel's 15-byte `comm` cuts these
(`VLLM::EngineCor`), so titles are read from the command line.
"""

from __future__ import annotations

import math
from enum import StrEnum

from wedgewatch.vllm.signals import EngineReading

ENGINE_TITLE_PREFIX = "VLLM::EngineCore"
WORKER_TITLE_PREFIX = "VLLM::Worker"
API_TITLE_PREFIX = "VLLM::APIServer"

#: Names of the progress counters, in the order of `progress_counters`, for messages.
PROGRESS_COUNTERS = (
    "prompt tokens",
    "generation tokens",
    "finished requests",
    "preemptions",
    "iterations",
)


def progress_counters(reading: EngineReading) -> tuple[float, float, float, float, float]:
    """The counters whose movement is progress, in the order of `PROGRESS_COUNTERS`."""
    return (
        reading.prompt_tokens,
        reading.generation_tokens,
        reading.request_success,
        reading.preemptions,
        reading.iterations,
    )


def _unchanged(a: float, b: float) -> bool:
    """Counter equality that treats NaN as equal to NaN (a NaN that stays NaN did not move)."""
    return a == b or (math.isnan(a) and math.isnan(b))


def progress_moved(before: EngineReading, after: EngineReading) -> bool:
    """True when any progress counter differs between two readings of one engine."""
    return not all(
        _unchanged(a, b)
        for a, b in zip(progress_counters(before), progress_counters(after), strict=True)
    )


def output_moved(before: EngineReading, after: EngineReading) -> bool:
    """True when generation tokens or finished requests differ between two readings."""
    return not (
        _unchanged(before.generation_tokens, after.generation_tokens)
        and _unchanged(before.request_success, after.request_success)
    )


class Role(StrEnum):
    """What a process of the server does."""

    API_SERVER = "api_server"
    ENGINE_CORE = "engine_core"
    WORKER = "worker"
    OTHER = "other"


def classify_role(title: str, *, is_listener: bool) -> Role:
    """The role of a process from its title; the listener (or configured root) is the API server."""
    if title.startswith(ENGINE_TITLE_PREFIX):
        return Role.ENGINE_CORE
    if title.startswith(WORKER_TITLE_PREFIX):
        return Role.WORKER
    if is_listener or title.startswith(API_TITLE_PREFIX):
        return Role.API_SERVER
    return Role.OTHER


def is_engine_core_of(title: str, engine: str) -> bool:
    """True when an EngineCore's title names data-parallel rank `engine` (`..._DP<engine>`)."""
    words = title.split()
    return bool(words) and words[0].endswith(f"_DP{engine}")
