"""The seed's wedge (#57841) driven through a real `vllm serve`'s OpenAI API.

The server runs with ``wedgewatch.lab.real.real_connector`` (a CPU tier emulated in memory) and a
small KV pool; ``drive`` sends, as token-id prompts of exact lengths:

1. ``A`` (13 blocks of 32 tokens) and lets its store into the tier finish;
2. ``S`` (5 blocks, one output token): it finishes and its store stays pending;
3. ``H`` = S's prompt and one block more: its lookup answers "not yet" (S's blocks are still
   being stored), so H is deferred holding no blocks;
4. ``L`` = A's prompt: A's tail was evicted by S, the tier has it, so L is admitted as an
   asynchronous load, parked ``WAITING_FOR_REMOTE_KVS`` holding 12 of the 15 usable blocks;
5. ``W``, a small unrelated request, waits for capacity.

Then S's store completes before L's load: H's lookup now hits, but H's full sequence does not
fit next to L's blocks. vLLM 0.30.0 keeps H ahead of L in one mixed skipped queue, stops its
scan at H every step and never promotes the landed load: running 0, deferred 2, capacity 1,
the EngineCore spinning in ``Scheduler.schedule``. From 0.31.0 (PR #58947) landed loads sit in
``kv_holding_waiting``, drained first: L runs, then H, then W.

Imports only the standard library and httpx (it runs in wedgewatch's venv).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

BLOCK_SIZE = 32
"""The CPU attention backend takes multiples of 32 only (16: "No common block size for 16")."""
NUM_BLOCKS = 16
"""The KV pool (``--num-gpu-blocks-override``): block 0 is vLLM's null block, 15 usable."""
STORE_SECONDS = 3.0
LOAD_SECONDS = 8.0
CONNECTOR = "EmulatedTierConnector"
CONNECTOR_MODULE = "wedgewatch.lab.real.real_connector"
MODEL = "tiny"

A_BLOCKS, S_BLOCKS, W_BLOCKS = 13, 5, 5


def _tokens(seed: int, count: int) -> list[int]:
    """Deterministic token ids in the tiny model's vocabulary (512), distinct per seed."""
    return [16 + (seed * 131 + i * 37 + (i * i) % 11) % 480 for i in range(count)]


@dataclass(frozen=True)
class Prompts:
    """The five prompts of one drive (token ids)."""

    a: list[int]
    s: list[int]
    h: list[int]
    w: list[int]

    @property
    def l(self) -> list[int]:  # noqa: E743 - the scenario's name for it
        """L is A's prompt again."""
        return self.a


def prompts(variant: int = 0) -> Prompts:
    """The prompts of drive number `variant`: variant 0 is the module's PROMPT_*; another
    variant has tokens of its own, so a server wedged, cured and driven again meets no prefix
    of the earlier drives in its cache or its tier."""
    base = 1 + 4 * variant
    s = _tokens(base + 1, S_BLOCKS * BLOCK_SIZE)
    return Prompts(
        a=_tokens(base, A_BLOCKS * BLOCK_SIZE),
        s=s,
        h=s + _tokens(base + 2, BLOCK_SIZE),
        w=_tokens(base + 3, W_BLOCKS * BLOCK_SIZE),
    )


PROMPT_A = prompts(0).a
PROMPT_S = prompts(0).s
PROMPT_H = prompts(0).h
PROMPT_L = PROMPT_A
PROMPT_W = prompts(0).w
MAX_TOKENS = 4
MAX_MODEL_LEN = 480


def kv_transfer_config(
    event_log: Path, *, store_seconds: float = STORE_SECONDS, load_seconds: float = LOAD_SECONDS
) -> str:
    """The ``--kv-transfer-config`` value that loads the emulated-tier connector."""
    return json.dumps(
        {
            "kv_connector": CONNECTOR,
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "event_log": str(event_log),
                "store_seconds": store_seconds,
                "load_seconds": load_seconds,
            },
        }
    )


def serve_args(event_log: Path) -> list[str]:
    """The `vllm serve` flags of the scenario (appended after the model and the KV size)."""
    return [
        "--kv-transfer-config",
        kv_transfer_config(event_log),
        "--block-size",
        str(BLOCK_SIZE),
        "--num-gpu-blocks-override",
        str(NUM_BLOCKS),
        "--enable-prefix-caching",
        "--max-num-seqs",
        "4",
        # 15 usable blocks of 32 hold 480 tokens: one whole sequence must fit in the pool.
        "--max-model-len",
        str(MAX_MODEL_LEN),
    ]


def read_events(event_log: Path) -> list[dict[str, Any]]:
    """The connector's events so far (a torn last line is skipped)."""
    try:
        text = event_log.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def await_event(
    event_log: Path,
    event: str,
    tokens: int,
    deadline: float,
    poll_s: float = 0.05,
    *,
    since: float = 0.0,
) -> dict[str, Any]:
    """The first `event` for a request of `tokens` tokens logged at `since` (wall clock) or
    later; TimeoutError past `deadline`."""
    while time.monotonic() < deadline:
        for entry in read_events(event_log):
            if (
                entry.get("event") == event
                and entry.get("tokens") == tokens
                and float(entry.get("t", 0.0)) >= since
            ):
                return entry
        time.sleep(poll_s)
    raise TimeoutError(f"the connector logged no {event!r} for a {tokens}-token request")


@dataclass
class Flight:
    """One completion sent in a thread: its result or error once it returns."""

    name: str
    thread: threading.Thread
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()


def complete(url: str, prompt: list[int], max_tokens: int, timeout_s: float) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout_s)
    response.raise_for_status()
    return dict(response.json())


def send(url: str, name: str, prompt: list[int], timeout_s: float) -> Flight:
    """Send one completion in a daemon thread (it may never return on a wedged server)."""
    holder: dict[str, Any] = {}

    def run() -> None:
        try:
            holder["response"] = complete(url, prompt, MAX_TOKENS, timeout_s)
        except Exception as exc:  # recorded: the caller judges it
            holder["error"] = f"{type(exc).__name__}: {exc}"

    thread = threading.Thread(target=run, name=f"wedge-{name}", daemon=True)
    flight = Flight(name, thread, holder)
    thread.start()
    return flight


@dataclass
class WedgeRun:
    """The requests of one drive: H, L and W in flight."""

    flights: list[Flight]

    def wait(self, timeout_s: float) -> bool:
        """Whether every request returned within `timeout_s`."""
        end = time.monotonic() + timeout_s
        for flight in self.flights:
            flight.thread.join(max(0.0, end - time.monotonic()))
        return all(f.done for f in self.flights)

    def completed(self) -> list[str]:
        return [f.name for f in self.flights if f.done and "response" in f.result]


def drive(url: str, event_log: Path, *, timeout_s: float = 600.0, variant: int = 0) -> WedgeRun:
    """Send the #57841 sequence (the prompts of `variant`); returns with H, L and W in flight."""
    deadline = time.monotonic() + timeout_s
    since = time.time()
    p = prompts(variant)
    complete(url, p.a, MAX_TOKENS, timeout_s)
    stored = await_event(event_log, "store", len(p.a) + MAX_TOKENS, deadline, since=since)
    # The emulated copy takes store_seconds from the instant the connector logged it.
    time.sleep(max(0.0, stored["t"] + float(stored["seconds"]) + 0.5 - time.time()))
    complete(url, p.s, 1, timeout_s)
    flights = [send(url, "H", p.h, timeout_s)]
    await_event(event_log, "deferred", len(p.h), deadline, since=since)
    flights.append(send(url, "L", p.l, timeout_s))
    await_event(event_log, "load", len(p.l), deadline, since=since)
    flights.append(send(url, "W", p.w, timeout_s))
    return WedgeRun(flights)
