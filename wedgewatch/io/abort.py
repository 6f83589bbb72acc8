"""The abort cure's HTTP call: empty a wedged engine's queues through vLLM's own endpoint.

`send_abort` posts `{}` (Content-Type application/json) to `/abort_requests` under the
target's base URL (vLLM with `VLLM_SERVER_DEV_MODE=1`: every in-flight request is aborted,
the process and its model stay). Without a JSON body vLLM answers 400 and aborts nothing.
Nothing else is ever posted: no other dev route (`/collective_rpc`, `/sleep`, ...) is
reachable from here. Redirects are not followed: a 3xx answer is a failure that names its
`Location` (redacted), so the call never leaves the configured origin. Every failure is
data (`AbortResult`), never an exception.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from wedgewatch import __version__
from wedgewatch.core.restart.server_proof import prove_server
from wedgewatch.core.text.redact import redact_text, redact_url
from wedgewatch.core.values import immutable
from wedgewatch.io.canary import base_url_of, endpoint
from wedgewatch.io.procs import Discovery, own_lineage
from wedgewatch.io.scrape_rules import one_line

if TYPE_CHECKING:  # httpx is imported by the functions that send
    import httpx

#: The one route the abort cure posts to (under the target's base URL).
ABORT_ROUTE = "/abort_requests"
#: The most read of an answer: `{"status": "aborted", "aborted": N}` is tiny.
MAX_ANSWER_BYTES = 16 * 1024


@immutable
class AbortResult:
    """How the abort call went: `ok` with the number of requests vLLM aborted, or why not."""

    ok: bool
    detail: str
    duration_seconds: float
    aborted: int | None = None  # vLLM's own count, when it said


def abort_url(metrics_url: str) -> str:
    """The abort endpoint of the server whose `/metrics` is `metrics_url` (same origin)."""
    return endpoint(base_url_of(metrics_url), ABORT_ROUTE)


def new_abort_client() -> httpx.AsyncClient:
    """A client that never follows a redirect and keeps no connection."""
    import httpx  # noqa: PLC0415 - imported when a canary, an abort or a webhook is sent

    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_keepalive_connections=0),
    )


async def send_abort(
    client: httpx.AsyncClient,
    metrics_url: str,
    *,
    timeout_seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> AbortResult:
    """POST `{}` to the target's `/abort_requests`; the result, never an exception."""
    import httpx  # noqa: PLC0415 - imported when a canary, an abort or a webhook is sent

    started = clock()
    url = abort_url(metrics_url)
    shown = redact_url(url)

    def result(ok: bool, detail: str, aborted: int | None = None) -> AbortResult:
        return AbortResult(ok, redact_text(detail), clock() - started, aborted)

    headers = {"User-Agent": f"wedgewatch/{__version__}", "Content-Type": "application/json"}
    try:
        async with asyncio.timeout(timeout_seconds):
            request = client.build_request(
                "POST", url, content=b"{}", headers=headers, timeout=timeout_seconds
            )
            response = await client.send(request, stream=True, follow_redirects=False)
            try:
                body = await _read_capped(response)
            finally:
                await response.aclose()
    except TimeoutError:
        return result(False, f"POST {shown}: no answer within {timeout_seconds:g} s")
    except httpx.TimeoutException:
        return result(False, f"POST {shown}: no answer within {timeout_seconds:g} s")
    except httpx.HTTPError as exc:
        return result(False, f"POST {shown}: {type(exc).__name__}: {exc}")
    status = response.status_code
    if 300 <= status < 400:
        location = response.headers.get("location", "")
        where = redact_url(location) if location else "no Location"
        return result(
            False,
            f"POST {shown}: HTTP {status} redirect to {one_line(where)} not followed "
            "(the abort goes to the configured origin only)",
        )
    if status == 404:
        return result(
            False,
            f"POST {shown}: HTTP 404: the server offers no abort endpoint (vLLM exposes "
            "/abort_requests with VLLM_SERVER_DEV_MODE=1)",
        )
    if status != 200:
        snippet = one_line(body.decode("utf-8", "replace"))
        return result(False, f"POST {shown}: HTTP {status}: {snippet}")
    aborted = aborted_count(body)
    said = f"{aborted} request(s) aborted" if aborted is not None else "aborted"
    return result(True, f"POST {shown}: HTTP 200, {said}", aborted)


def aborted_count(body: bytes) -> int | None:
    """vLLM's `{"status": "aborted", "aborted": N}` -> N; None when the body does not say."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    value = data.get("aborted") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


async def _read_capped(response: httpx.Response) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        parts.append(chunk)
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            break
    return b"".join(parts)[:MAX_ANSWER_BYTES]


def abort_refusal(discovery: Discovery) -> str | None:
    """Why the abort must not be sent to the server behind the target's port, or None.

    The same proof as for signals (`core.restart.server_proof.prove_server`, never the
    read-only variant): the process tree found from the target (its listener, or its `pid`,
    `pid_file`, systemd unit) holds a `VLLM::EngineCore*` process or was named by the
    operator, and wedgewatch is not in it. A target on another host has no local tree, so
    it is never aborted.
    """
    if discovery.error is not None and not discovery.processes:
        return f"the server's processes were not found: {discovery.error}"
    return prove_server(
        [(p.pid, p.title) for p in discovery.processes],
        explicit=discovery.explicit,
        own_pids=own_lineage()[0],
    )
