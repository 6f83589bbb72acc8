"""`wedgewatch sim load`: traffic profiles against a (simulated or real) vLLM server.

The request sequence is planned up front from `--seed` (pure, `plan_requests`), then sent
open-loop at the planned instants (capped by `--concurrency` requests in flight) during
`--duration` seconds. Requests still in flight after that are awaited, each until its own
`--request-timeout-seconds`, so a run ends by itself even against a wedged server.

Profiles:

* `agentic`: steady arrivals (~4 req/s, Poisson); 85 % of the requests start with one of 8
  agent prefixes (1k-3k tokens, sent as a shared `prefix_id`) and add 64-1024 tokens of
  their own; 32-256 output tokens.
* `agentic-burst`: `agentic`, except that from 3 s to 6 s the arrivals are ~10 req/s of long
  prompts (the same prefixes plus 12k-24k tokens of their own). The burst drives GPU KV
  usage to 100 %, forces preemptions and pushes the prefixes out to the CPU tier.
  Against vLLM's own scheduler (`python -m wedgewatch.lab.real.vllm_engine`, the tp2-offload
  flags with OffloadingConnector, 2048 GPU blocks, 12 s plans, 60 simulated seconds):
  vLLM 0.30.0 wedges 30 of seeds 1-30 with async scheduling and full-ISL admission off,
  1 of 30 (seed 24) with vLLM's CUDA defaults (async, full-ISL on), 0 with sync
  scheduling; 0.33.0 serves every plan. With full-ISL on, 0.30.0 only wedges when a big
  request A, admitted after another big one C, is preempted by their decode growth, is
  retried before its stores are reported, and the next big request B (a CPU-tier load) fits
  in A's freed blocks yet A + B exceed the pool: sizes C < B <= A around half the pool,
  rare in any traffic we tried. Variants measured with those defaults, none of which wedged
  0.30.0 once (so the profile stays as it is; seeds 1-N): burst prompts of 6k-16k (N=10),
  13k-15k (8) or 8k-24k (6) tokens of their own; a 6 s burst (6, also with 8k-24k);
  22k-28k own tokens at 5 or 8 requests per second (10 each) or with 128-1536 output
  tokens (6-8 each); 2-3 shared 6k-12k task contexts under 2k-16k own tokens (8 each);
  3-turn conversations re-sending a growing 8k-16k context (8); 8k-24k prompts with
  512-4096 output tokens (6-10; most plans then run past the 60 s); half 11k-12.5k and
  half 16k-17.5k own tokens with 256-768 output tokens at 5 per second (6).
* `steady`: ~4 req/s of 256-1024 token prompts without shared prefixes.
* `long-prefill`: one 16k-30k token prompt every two seconds.
* `long-prompt`: one 30k-token prompt at the start and nothing else: a single chunked prefill
  (long on a server with `--prefill-step-time-seconds`) whose KV usage grows chunk by chunk.
* `streaming-session`: one streaming-input session (`POST /v1/streaming_input`): a 512-token
  chunk at the start, another every 60 s, and the input closed at `--duration`. Between chunks
  the session waits in the server's deferred queue (WAITING_FOR_STREAMING_REQ) with nothing
  else waiting: the realtime-streaming shape.

Clients that give up: a request not answered within `--request-timeout-seconds` is abandoned
(its connection closed, so the server aborts it, as vLLM does for a client that went away) and,
with `--retries N`, sent again as a new request after `--retry-backoff-seconds`, up to N times,
while the run's `--duration` lasts. That is the agentic client of a real deployment, and
during a wedge it keeps `vllm:request_success_total{finished_reason="abort"}` moving.

Requests carry the simulator's extension fields (`prompt_tokens`, `prefix_id`,
`prefix_tokens`) next to a short text `prompt`; a real vLLM ignores the extensions.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, TextIO

import httpx

ProfileName = Literal[
    "agentic", "agentic-burst", "steady", "long-prefill", "long-prompt", "streaming-session"
]
PROFILE_NAMES: tuple[ProfileName, ...] = (
    "agentic",
    "agentic-burst",
    "steady",
    "long-prefill",
    "long-prompt",
    "streaming-session",
)

AGENTIC_RATE_PER_SECOND = 4.0
AGENTIC_PREFIXES = 8
AGENTIC_PREFIX_TOKENS = (1024, 3072)
AGENTIC_PREFIX_SHARE = 0.85  # of requests
AGENTIC_OWN_TOKENS = (64, 1024)
AGENTIC_MAX_TOKENS = (32, 256)
BURST_START_SECONDS = 3.0
BURST_SECONDS = 3.0
BURST_RATE_PER_SECOND = 10.0
BURST_OWN_TOKENS = (12_000, 24_000)
STEADY_RATE_PER_SECOND = 4.0
STEADY_PROMPT_TOKENS = (256, 1024)
STEADY_MAX_TOKENS = (64, 256)
LONG_PREFILL_INTERVAL_SECONDS = 2.0
LONG_PROMPT_TOKENS = (16_000, 30_000)
LONG_MAX_TOKENS = (16, 64)
LONG_PROMPT_TOKENS_ONE = 30_000
LONG_PROMPT_MAX_TOKENS = 16
SESSION_CHUNK_INTERVAL_SECONDS = 60.0
SESSION_FIRST_CHUNK_TOKENS = 512
SESSION_CHUNK_TOKENS = 256
SESSION_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of a load plan."""

    index: int
    send_at_seconds: float
    prompt_tokens: int
    max_tokens: int
    prefix_id: str | None = None
    prefix_tokens: int = 0
    kind: str = "request"  # "session", "burst", "steady", "long", "stream"
    input_chunks: tuple[tuple[float, int, int], ...] = ()
    """A streaming-input session's later chunks: (seconds after its start, prompt tokens,
    max tokens). The session's input is closed when the run's duration ends."""

    @property
    def streaming_input(self) -> bool:
        """Whether this is a streaming-input session (`POST /v1/streaming_input`)."""
        return self.kind == "stream"

    def body(self, model: str) -> dict[str, object]:
        """The `/v1/completions` JSON body."""
        body: dict[str, object] = {
            "model": model,
            "prompt": f"wedgewatch load request {self.index} ({self.kind})",
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
        }
        if self.prefix_id is not None:
            body["prefix_id"] = self.prefix_id
            body["prefix_tokens"] = self.prefix_tokens
        return body


def _poisson(times: random.Random, rate: float, start: float, end: float) -> Iterator[float]:
    """Poisson arrival instants in [start, end)."""
    at = start + times.expovariate(rate)
    while at < end:
        yield at
        at += times.expovariate(rate)


def _request(
    content: random.Random,
    at: float,
    own_tokens: tuple[int, int],
    max_tokens: tuple[int, int],
    *,
    kind: str,
    prefixes: Sequence[tuple[str, int]] = (),
) -> PlannedRequest:
    """One request drawn from `content`; with `prefixes`, 85 % of requests share one."""
    prefix_id: str | None = None
    prefix_tokens = 0
    if prefixes and content.random() < AGENTIC_PREFIX_SHARE:
        prefix_id, prefix_tokens = content.choice(prefixes)
    return PlannedRequest(
        index=0,
        send_at_seconds=round(at, 4),
        prompt_tokens=prefix_tokens + content.randint(*own_tokens),
        max_tokens=content.randint(*max_tokens),
        prefix_id=prefix_id,
        prefix_tokens=prefix_tokens,
        kind=kind,
    )


def _stream(
    name: str, seed: int, rate: float, start: float, end: float
) -> tuple[Iterator[float], random.Random]:
    """Arrival instants and a content generator, independent of how far they are consumed."""
    return _poisson(random.Random(f"{name}-times:{seed}"), rate, start, end), random.Random(
        f"{name}-content:{seed}"
    )


def plan_requests(
    profile: ProfileName, seed: int, duration_seconds: float
) -> tuple[PlannedRequest, ...]:
    """The deterministic request sequence of `profile` under `seed` (pure).

    Every stream draws arrival instants and request contents from its own generator in
    arrival order, so the plan for a shorter duration is a prefix of the plan for a longer.
    """
    if duration_seconds <= 0:
        raise ValueError(f"duration_seconds must be positive, got {duration_seconds}")
    requests: list[PlannedRequest] = []
    if profile in ("agentic", "agentic-burst"):
        prefix_rng = random.Random(f"agentic-prefixes:{seed}")
        prefixes = [
            (f"agent-{i}", prefix_rng.randint(*AGENTIC_PREFIX_TOKENS))
            for i in range(AGENTIC_PREFIXES)
        ]
        burst = profile == "agentic-burst"
        burst_end = BURST_START_SECONDS + BURST_SECONDS
        times, content = _stream("agentic", seed, AGENTIC_RATE_PER_SECOND, 0.0, duration_seconds)
        for at in times:
            request = _request(
                content,
                at,
                AGENTIC_OWN_TOKENS,
                AGENTIC_MAX_TOKENS,
                kind="session",
                prefixes=prefixes,
            )
            if not (burst and BURST_START_SECONDS <= at < burst_end):
                requests.append(request)
        if burst:
            times, content = _stream(
                "burst",
                seed,
                BURST_RATE_PER_SECOND,
                BURST_START_SECONDS,
                min(burst_end, duration_seconds),
            )
            requests.extend(
                _request(
                    content,
                    at,
                    BURST_OWN_TOKENS,
                    AGENTIC_MAX_TOKENS,
                    kind="burst",
                    prefixes=prefixes,
                )
                for at in times
            )
    elif profile == "steady":
        times, content = _stream("steady", seed, STEADY_RATE_PER_SECOND, 0.0, duration_seconds)
        requests = [
            _request(content, at, STEADY_PROMPT_TOKENS, STEADY_MAX_TOKENS, kind="steady")
            for at in times
        ]
    elif profile == "long-prefill":
        content = random.Random(f"long-prefill-content:{seed}")
        at = 0.0
        while at < duration_seconds:
            requests.append(_request(content, at, LONG_PROMPT_TOKENS, LONG_MAX_TOKENS, kind="long"))
            at += LONG_PREFILL_INTERVAL_SECONDS
    elif profile == "streaming-session":
        chunks: list[tuple[float, int, int]] = []
        at = SESSION_CHUNK_INTERVAL_SECONDS
        while at < duration_seconds:
            chunks.append((at, SESSION_CHUNK_TOKENS, SESSION_MAX_TOKENS))
            at += SESSION_CHUNK_INTERVAL_SECONDS
        requests = [
            PlannedRequest(
                index=0,
                send_at_seconds=0.0,
                prompt_tokens=SESSION_FIRST_CHUNK_TOKENS,
                max_tokens=SESSION_MAX_TOKENS,
                kind="stream",
                input_chunks=tuple(chunks),
            )
        ]
    elif profile == "long-prompt":
        requests = [
            PlannedRequest(
                index=0,
                send_at_seconds=0.0,
                prompt_tokens=LONG_PROMPT_TOKENS_ONE,
                max_tokens=LONG_PROMPT_MAX_TOKENS,
                kind="long",
            )
        ]
    else:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILE_NAMES)}")
    ordered = sorted(requests, key=lambda r: (r.send_at_seconds, r.kind))
    return tuple(replace(r, index=i) for i, r in enumerate(ordered))


# ---------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How one sent request ended."""

    index: int
    status: Literal["completed", "failed", "timed_out"]
    latency_seconds: float
    detail: str = ""
    attempts: int = 1
    """Times the request was sent (1 + retries); every attempt but the last timed out."""


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """What a load run did."""

    profile: str
    seed: int
    planned: int
    outcomes: tuple[RequestOutcome, ...]
    elapsed_seconds: float
    failures: dict[str, int] = field(default_factory=dict)

    @property
    def sent(self) -> int:
        """Requests sent."""
        return len(self.outcomes)

    @property
    def retries(self) -> int:
        """Requests sent again after a timeout (each abandoned attempt is one)."""
        return sum(o.attempts - 1 for o in self.outcomes)

    def count(self, status: str) -> int:
        """Requests that ended with `status`."""
        return sum(1 for o in self.outcomes if o.status == status)

    def latency(self, fraction: float) -> float | None:
        """Latency percentile of completed requests."""
        return percentile(
            [o.latency_seconds for o in self.outcomes if o.status == "completed"], fraction
        )

    def as_dict(self) -> dict[str, object]:
        """A JSON-safe summary."""
        return {
            "profile": self.profile,
            "seed": self.seed,
            "planned": self.planned,
            "sent": self.sent,
            "completed": self.count("completed"),
            "failed": self.count("failed"),
            "timed_out": self.count("timed_out"),
            "retries": self.retries,
            "latency_seconds": {
                "p50": self.latency(0.5),
                "p90": self.latency(0.9),
                "p99": self.latency(0.99),
            },
            "failures": dict(self.failures),
            "elapsed_seconds": round(self.elapsed_seconds, 3),
        }

    def render(self) -> str:
        """The human summary."""

        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}s"

        lines = [
            f"profile {self.profile}  seed {self.seed}  elapsed {self.elapsed_seconds:.1f}s",
            f"sent {self.sent}  completed {self.count('completed')}  failed "
            f"{self.count('failed')}  timed out {self.count('timed_out')}"
            + (f"  retries {self.retries}" if self.retries else "")
            + (f"  (not sent: {self.planned - self.sent})" if self.planned > self.sent else ""),
            f"latency p50 {fmt(self.latency(0.5))}  p90 {fmt(self.latency(0.9))}  "
            f"p99 {fmt(self.latency(0.99))}",
        ]
        for reason, count in sorted(self.failures.items()):
            lines.append(f"  failed: {count} x {reason}")
        return "\n".join(lines)


# ---------------------------------------------------------------- the runner


class LoadError(Exception):
    """The target cannot be load-tested (unreachable, no model)."""


async def discover_model(client: httpx.AsyncClient, url: str) -> str:
    """The first served model name from `GET /v1/models`."""
    try:
        response = await client.get(f"{url}/v1/models")
    except httpx.HTTPError as exc:
        raise LoadError(f"cannot reach {url}/v1/models: {exc!r}") from exc
    if response.status_code != 200:
        raise LoadError(f"{url}/v1/models answered HTTP {response.status_code}")
    try:
        return str(response.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise LoadError(f"{url}/v1/models did not list a model: {response.text[:200]!r}") from exc


async def _send(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    planned: PlannedRequest,
    timeout_seconds: float,
) -> RequestOutcome:
    started = time.monotonic()
    try:
        response = await asyncio.wait_for(
            client.post(f"{url}/v1/completions", json=planned.body(model)), timeout_seconds
        )
    except (TimeoutError, httpx.TimeoutException):
        return RequestOutcome(planned.index, "timed_out", time.monotonic() - started, "timeout")
    except httpx.HTTPError as exc:
        return RequestOutcome(
            planned.index, "failed", time.monotonic() - started, type(exc).__name__
        )
    latency = time.monotonic() - started
    if response.status_code != 200:
        return RequestOutcome(planned.index, "failed", latency, f"HTTP {response.status_code}")
    return RequestOutcome(planned.index, "completed", latency)


async def _send_session(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    planned: PlannedRequest,
    *,
    timeout_seconds: float,
    close_at: float,
) -> RequestOutcome:
    """One streaming-input session: chunks at their instants, input closed at `close_at`."""
    started = time.monotonic()

    async def body() -> AsyncIterator[bytes]:
        yield (json.dumps(planned.body(model)) + "\n").encode()
        for offset, prompt_tokens, max_tokens in planned.input_chunks:
            await asyncio.sleep(max(0.0, started + offset - time.monotonic()))
            yield (
                json.dumps({"prompt_tokens": prompt_tokens, "max_tokens": max_tokens}) + "\n"
            ).encode()
        await asyncio.sleep(max(0.0, close_at - time.monotonic()))

    budget = max(close_at - started, 0.0) + timeout_seconds
    try:
        response = await asyncio.wait_for(
            client.post(
                f"{url}/v1/streaming_input",
                content=body(),
                headers={"Content-Type": "application/x-ndjson"},
                timeout=httpx.Timeout(budget, connect=min(5.0, budget)),
            ),
            budget,
        )
    except (TimeoutError, httpx.TimeoutException):
        return RequestOutcome(planned.index, "timed_out", time.monotonic() - started, "timeout")
    except httpx.HTTPError as exc:
        return RequestOutcome(
            planned.index, "failed", time.monotonic() - started, type(exc).__name__
        )
    latency = time.monotonic() - started
    if response.status_code != 200:
        return RequestOutcome(planned.index, "failed", latency, f"HTTP {response.status_code}")
    return RequestOutcome(planned.index, "completed", latency)


async def run_load(
    url: str,
    requests: Sequence[PlannedRequest],
    *,
    profile: str,
    seed: int,
    duration_seconds: float,
    concurrency: int = 256,
    request_timeout_seconds: float = 30.0,
    model: str | None = None,
    retries: int = 0,
    retry_backoff_seconds: float = 1.0,
    progress: Callable[[float, int, int, int], None] | None = None,
    stop: asyncio.Event | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> LoadSummary:
    """Send `requests` at their planned instants during `duration_seconds`; then drain.

    Setting `stop` ends the run early: nothing more is sent and requests in flight are
    abandoned (counted as failed, "interrupted"). A request that times out is sent again
    after `retry_backoff_seconds`, up to `retries` times, unless `duration_seconds` is over.
    """
    if retries < 0 or retry_backoff_seconds < 0:
        raise ValueError(
            f"retries and retry_backoff_seconds must be >= 0, got {retries}, "
            f"{retry_backoff_seconds}"
        )
    stop = stop or asyncio.Event()
    url = url.rstrip("/")
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(request_timeout_seconds, connect=min(5.0, request_timeout_seconds))
    async with httpx.AsyncClient(limits=limits, timeout=timeout, transport=transport) as client:
        served_model = model if model is not None else await discover_model(client, url)
        semaphore = asyncio.Semaphore(concurrency)
        outcomes: list[RequestOutcome] = []
        tasks: list[asyncio.Task[None]] = []
        started = time.monotonic()

        async def one(planned: PlannedRequest) -> None:
            sent_at = time.monotonic()
            try:
                if planned.streaming_input:
                    outcomes.append(
                        await _send_session(
                            client,
                            url,
                            served_model,
                            planned,
                            timeout_seconds=request_timeout_seconds,
                            close_at=started + duration_seconds,
                        )
                    )
                    return
                attempts = 1
                outcome = await _send(client, url, served_model, planned, request_timeout_seconds)
                while (
                    outcome.status == "timed_out"
                    and attempts <= retries
                    and time.monotonic() - started + retry_backoff_seconds < duration_seconds
                ):
                    # The timed-out attempt's connection is closed: the server aborts it.
                    await asyncio.sleep(retry_backoff_seconds)
                    attempts += 1
                    outcome = await _send(
                        client, url, served_model, planned, request_timeout_seconds
                    )
                outcomes.append(replace(outcome, attempts=attempts))
            except asyncio.CancelledError:
                outcomes.append(
                    RequestOutcome(
                        planned.index, "failed", time.monotonic() - sent_at, "interrupted"
                    )
                )
            finally:
                semaphore.release()

        async def pause(seconds: float) -> bool:
            """Sleep unless stopped first; True when stopped."""
            try:
                await asyncio.wait_for(stop.wait(), max(seconds, 0.0))
            except TimeoutError:
                return False
            return True

        async def report() -> None:
            while progress is not None:
                done = len(outcomes)
                failed = sum(1 for o in outcomes if o.status != "completed")
                progress(time.monotonic() - started, len(tasks), done - failed, failed)
                await asyncio.sleep(0.5)

        reporter = asyncio.create_task(report())
        try:
            for planned in requests:
                now = time.monotonic() - started
                if planned.send_at_seconds >= duration_seconds or now >= duration_seconds:
                    break
                if planned.send_at_seconds > now and await pause(planned.send_at_seconds - now):
                    break
                remaining = duration_seconds - (time.monotonic() - started)
                if remaining <= 0 or stop.is_set():
                    break
                try:
                    await asyncio.wait_for(semaphore.acquire(), remaining)
                except TimeoutError:
                    break
                tasks.append(asyncio.create_task(one(planned)))
            if tasks:
                stopper: asyncio.Future[object] = asyncio.ensure_future(stop.wait())
                drained: asyncio.Future[list[None]] = asyncio.gather(*tasks)
                await asyncio.wait((stopper, drained), return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if not drained.done():
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(drained, return_exceptions=True)
        finally:
            reporter.cancel()
            for task in tasks:
                task.cancel()
        if progress is not None:
            done = len(outcomes)
            failed = sum(1 for o in outcomes if o.status != "completed")
            progress(time.monotonic() - started, len(tasks), done - failed, failed)
    failures: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.status != "completed":
            failures[outcome.detail] = failures.get(outcome.detail, 0) + 1
    return LoadSummary(
        profile=profile,
        seed=seed,
        planned=len(requests),
        outcomes=tuple(sorted(outcomes, key=lambda o: o.index)),
        elapsed_seconds=time.monotonic() - started,
        failures=failures,
    )


def terminal_progress(stream: TextIO) -> Callable[[float, int, int, int], None]:
    """A one-line progress display for a terminal."""

    def show(elapsed: float, sent: int, completed: int, failed: int) -> None:
        in_flight = sent - completed - failed
        stream.write(
            f"\r{elapsed:6.1f}s  sent {sent}  completed {completed}  failed {failed}  "
            f"in flight {in_flight}   "
        )
        stream.flush()

    return show


def print_summary(summary: LoadSummary, as_json: bool, stream: TextIO = sys.stdout) -> None:
    """Write the summary, human or JSON."""
    if as_json:
        stream.write(json.dumps(summary.as_dict(), sort_keys=True) + "\n")
    else:
        stream.write(summary.render() + "\n")
