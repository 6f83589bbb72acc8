"""What vLLM's numbers and processes mean: progress, output, neither, unknown; process roles.

`signals` knows vLLM's metric *names* and turns a body into readings; this module is the one
place that knows what a *movement* of those readings means. The detector (`detect`) asks it
and never interprets a counter or a gauge itself. The facts about vLLM behind each rule are
in docs/vllm.md.

Counters, compared between two readings of the same engine
-----------------------------------------------------------
* **Progress counters**: prompt tokens, generation tokens, *completed* requests and
  preemptions. Not iterations (`vllm:iteration_tokens_total_count`): vLLM's stat logger
  observes that histogram from every `IterationStats`, and the batch that carries an aborted
  finish to `request_success{finished_reason="abort"}` is one, with 0 tokens. So clients that
  time out and retry during a wedge move the iteration count as well as the abort series,
  and every iteration that did work already moves prompt or generation tokens.
* **Output counters**: generation tokens and completed requests.
* **Completed requests** are `vllm:request_success_total` summed over every `finished_reason`
  except `abort` and `error`. Despite its name that counter counts every finished request;
  an *aborted* finish is a client that gave up (agentic clients time out and retry, so
  during a wedge the abort series climbs every few seconds) and an *errored* finish is a
  request that failed. Neither is work the engine did: they are **never progress and never
  output**. A reading without per-reason detail (built by hand, old fixtures) counts its
  whole `request_success`.
* A counter **moved** when both values are finite and differ. A non-finite value never
  moves, so NaN -> NaN and NaN -> 5 are not progress.
* A counter went **backwards** when both values are finite and the new one is smaller: a
  restarted server (every counter of the engine is compared, the abort and error series and
  the iteration count included, since a restart resets them too).

Gauges
------
* **Prefill progress**: with chunked prefill a long prompt moves no counter until its first
  token, but every chunk allocates KV blocks. While `running > 0`, growth of
  `vllm:kv_cache_usage_perc`, or `vllm:prefix_cache_queries_total` moving (a request was
  admitted and looked up in the prefix cache), is prefill progress. It keeps a
  `progress_stall` from growing and nothing else: it is never output (a livelock that
  re-prefills forever is still an `output_stall` through its preemptions), and it never
  counts while `running == 0` (an engine that admits nothing still allocates blocks for
  parked KV loads, and re-queries the prefix cache for a head it cannot place on every
  scheduler pass: #49829 saw 1.27 M lookups of one request).
* A frozen engine (a device or collective hang) freezes *every* value, KV usage included,
  so prefill progress never hides it.

Non-finite values
-----------------
* A reading whose queue gauges (running, waiting, any waiting reason) or progress counters
  are NaN or +/-Inf is **unknown**: neither work nor idle. `non_finite_fields` names them.
* A non-finite `process_start_time_seconds` is treated as absent (NaN != NaN would look like
  a restart on every scrape), and a non-finite KV usage or prefix-cache count shows no
  prefill progress.
* JSON has no NaN: `encode_float` writes a non-finite float as the string `"NaN"`,
  `"Infinity"` or `"-Infinity"`, and `decode_float` reads those three strings back.

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
from collections.abc import Iterator
from dataclasses import replace
from enum import StrEnum
from typing import Final

from wedgewatch.core.values import immutable
from wedgewatch.vllm.signals import EngineReading

ENGINE_TITLE_PREFIX = "VLLM::EngineCore"
WORKER_TITLE_PREFIX = "VLLM::Worker"
API_TITLE_PREFIX = "VLLM::APIServer"

#: `finished_reason` values of `vllm:request_success_total` that are neither progress nor output.
NOT_PROGRESS_FINISH_REASONS: Final = frozenset({"abort", "error"})

#: Names of the progress counters, in the order of `progress_counters`, for messages.
PROGRESS_COUNTERS: Final = (
    "prompt tokens",
    "generation tokens",
    "completed requests",
    "preemptions",
)

_NON_FINITE_JSON: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@immutable
class Movement:
    """What changed between two readings of one engine.

    `progress`: a progress counter moved. `output`: an output counter moved. `prefill`: the
    engine runs requests and its KV usage grew or its prefix-cache queries moved.
    """

    progress: bool
    output: bool
    prefill: bool


def completed_requests(reading: EngineReading) -> float:
    """Finished requests that count: every finished_reason except abort and error."""
    if not reading.finished_by_reason:
        return reading.request_success
    return sum(
        value
        for reason, value in reading.finished_by_reason.items()
        if reason not in NOT_PROGRESS_FINISH_REASONS
    )


def progress_counters(reading: EngineReading) -> tuple[float, float, float, float]:
    """Prompt tokens, generation tokens, completed requests, preemptions."""
    return (
        reading.prompt_tokens,
        reading.generation_tokens,
        completed_requests(reading),
        reading.preemptions,
    )


def output_counters(reading: EngineReading) -> tuple[float, float]:
    """Generation tokens and completed requests."""
    return (reading.generation_tokens, completed_requests(reading))


def counter_moved(before: float, now: float) -> bool:
    """Both values are finite and differ."""
    return math.isfinite(before) and math.isfinite(now) and before != now


def counter_went_backwards(before: float, now: float) -> bool:
    """Both values are finite and the new one is smaller."""
    return math.isfinite(before) and math.isfinite(now) and now < before


def movement(before: EngineReading, now: EngineReading) -> Movement:
    """What moved from `before` to `now` (see the module docstring).

    The output counters are progress counters too (`output_counters`, `progress_counters`):
    each counter is compared once, and completed requests are summed once per reading.
    """
    output = counter_moved(before.generation_tokens, now.generation_tokens) or counter_moved(
        completed_requests(before), completed_requests(now)
    )
    progress = (
        output
        or counter_moved(before.prompt_tokens, now.prompt_tokens)
        or counter_moved(before.preemptions, now.preemptions)
    )
    prefill = False
    if math.isfinite(now.running) and now.running > 0:
        prefill = _grew(before.kv_cache_usage, now.kv_cache_usage) or _moved_optional(
            before.prefix_cache_queries, now.prefix_cache_queries
        )
    return Movement(progress=progress, output=output, prefill=prefill)


def progress_moved(before: EngineReading, after: EngineReading) -> bool:
    """True when any progress counter moved between two readings of one engine."""
    return movement(before, after).progress


def output_moved(before: EngineReading, after: EngineReading) -> bool:
    """True when generation tokens or completed requests moved between two readings."""
    return movement(before, after).output


def restart_evidence(before: EngineReading, now: EngineReading) -> tuple[str, float, float] | None:
    """The first counter of the engine that went backwards (a restarted server), or None.

    Returns the counter's name, its value before and now. Every finished request counts here,
    aborted and errored ones included: a restart resets them too.
    """
    pairs = zip(
        (*PROGRESS_COUNTERS, "finished requests", "iterations"),
        (*progress_counters(before), before.request_success, before.iterations),
        (*progress_counters(now), now.request_success, now.iterations),
        strict=True,
    )
    for name, a, b in pairs:
        if counter_went_backwards(a, b):
            return name, a, b
    return None


def non_finite_fields(reading: EngineReading) -> tuple[str, ...]:
    """The queue gauges and progress counters of `reading` that are NaN or +/-Inf, by name."""
    values = (
        reading.running,
        reading.waiting,
        *reading.waiting_by_reason.values(),
        reading.prompt_tokens,
        reading.generation_tokens,
        reading.request_success,
        *reading.finished_by_reason.values(),
        reading.preemptions,
        reading.iterations,
    )
    if all(map(math.isfinite, values)):  # every value finite (every healthy scrape): no names
        return ()
    return tuple(name for name, value in _judged_values(reading) if not math.isfinite(value))


def _judged_values(reading: EngineReading) -> Iterator[tuple[str, float]]:
    yield "running", reading.running
    yield "waiting", reading.waiting
    for reason, value in sorted(reading.waiting_by_reason.items()):
        yield f"waiting ({reason})", value
    yield "prompt tokens", reading.prompt_tokens
    yield "generation tokens", reading.generation_tokens
    if reading.finished_by_reason:
        for reason, value in sorted(reading.finished_by_reason.items()):
            yield f"finished requests ({reason})", value
    else:
        yield "finished requests", reading.request_success
    yield "preemptions", reading.preemptions
    yield "iterations", reading.iterations


def process_start(value: float | None) -> float | None:
    """`process_start_time_seconds` as the detector uses it: non-finite means absent."""
    return value if value is not None and math.isfinite(value) else None


def encode_float(value: float) -> float | str:
    """A float for JSON: itself when finite, else "NaN", "Infinity" or "-Infinity"."""
    if math.isfinite(value):
        return float(value)
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def decode_float(value: object, path: str) -> float:
    """The inverse of `encode_float`; ValueError names `path` for anything else."""
    if isinstance(value, str) and value in _NON_FINITE_JSON:
        return _NON_FINITE_JSON[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}: expected a number, got {value!r}")
    return float(value)


def _grew(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return False
    return math.isfinite(before) and math.isfinite(now) and now > before


def _moved_optional(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return False
    return counter_moved(before, now)


def keep_finite(before: EngineReading, now: EngineReading) -> EngineReading:
    """`now` as the base of the next delta: a non-finite counter, KV usage or prefix-cache
    count keeps the last finite value from `before`, so a NaN never hides or fakes movement."""
    if _all_finite(now):  # every scrape of a healthy server: nothing to keep
        return now
    finished = dict(now.finished_by_reason)
    for reason, value in finished.items():
        if not math.isfinite(value):
            finished[reason] = before.finished_by_reason.get(reason, value)
    return replace(
        now,
        prompt_tokens=_finite_or(now.prompt_tokens, before.prompt_tokens),
        generation_tokens=_finite_or(now.generation_tokens, before.generation_tokens),
        request_success=_finite_or(now.request_success, before.request_success),
        preemptions=_finite_or(now.preemptions, before.preemptions),
        iterations=_finite_or(now.iterations, before.iterations),
        finished_by_reason=finished,
        kv_cache_usage=_finite_or_optional(now.kv_cache_usage, before.kv_cache_usage),
        prefix_cache_queries=_finite_or_optional(
            now.prefix_cache_queries, before.prefix_cache_queries
        ),
    )


def _all_finite(reading: EngineReading) -> bool:
    """Whether every value `keep_finite` looks at is finite (or absent, where optional)."""
    values = (
        reading.prompt_tokens,
        reading.generation_tokens,
        reading.request_success,
        reading.preemptions,
        reading.iterations,
        *reading.finished_by_reason.values(),
        0.0 if reading.kv_cache_usage is None else reading.kv_cache_usage,
        0.0 if reading.prefix_cache_queries is None else reading.prefix_cache_queries,
    )
    return all(map(math.isfinite, values))


def _finite_or(value: float, fallback: float) -> float:
    return value if math.isfinite(value) else fallback


def _finite_or_optional(value: float | None, fallback: float | None) -> float | None:
    if value is None or math.isfinite(value):
        return value
    return fallback


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
