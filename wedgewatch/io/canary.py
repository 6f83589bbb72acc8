"""Send one canary: a one-token streamed completion through the server's real queue.

`send` never raises for anything the server does: every failure comes back as a
`core.canary.CanaryResult` with a reason from a closed set. The whole canary (model lookup,
connection, first token, the rest of the stream) is bounded by `timeout_seconds`; the time to
the first token is measured separately from the total. Requests are marked so operators can
recognise and filter them: the `user` field is `wedgewatch-canary` and the `X-Request-Id`
header starts with `wedgewatch-canary-`. A redirect is never followed (the client follows
none): it is an `http_status` failure that says where it pointed and whether that is off
the server's origin.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit, urlunsplit

from wedgewatch import __version__
from wedgewatch.core.detection.canary import CanaryFailureReason, CanaryResult
from wedgewatch.core.text.redact import redact_text
from wedgewatch.core.values import immutable
from wedgewatch.io.http_parse import same_origin
from wedgewatch.io.scrape_rules import REDIRECT_STATUSES, is_refused, one_line

if TYPE_CHECKING:  # httpx is imported by the functions that send
    import httpx

CANARY_USER = "wedgewatch-canary"
REQUEST_ID_PREFIX = "wedgewatch-canary-"
#: The most a canary reads of any response: one token's stream is well under 4 KiB.
MAX_RESPONSE_BYTES = 64 * 1024


@immutable
class CanarySpec:
    """What to send and to whom; `model` empty means the first id of `/v1/models`."""

    base_url: str
    model: str
    prompt: str
    max_tokens: int
    timeout_seconds: float


class _Failed(Exception):
    def __init__(self, reason: CanaryFailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: CanaryFailureReason = reason
        self.detail = detail


def base_url_of(metrics_url: str) -> str:
    """The server's base URL from its `/metrics` URL: a path prefix and a query are kept
    (`http://h/vllm/metrics?key=v` gives `http://h/vllm?key=v`; see `endpoint`)."""
    parts = urlsplit(metrics_url)
    path = parts.path.removesuffix("/metrics")
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def endpoint(base_url: str, route: str) -> str:
    """`route` (`/v1/models`) under the base URL's path, with its query (a proxy's key that the
    scrape carries goes with the canary too)."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/") + route
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def new_request_id() -> str:
    """A fresh `X-Request-Id` for a canary."""
    return REQUEST_ID_PREFIX + uuid.uuid4().hex[:16]


async def send(
    client: httpx.AsyncClient,
    spec: CanarySpec,
    *,
    sent_at: float,
    clock: Callable[[], float] = time.monotonic,
    request_id: str | None = None,
) -> CanaryResult:
    """Send one canary and measure it; `sent_at` is the caller's monotonic send instant."""
    import httpx  # noqa: PLC0415 - imported when a canary, an abort or a webhook is sent

    started = clock()
    first: list[float] = []

    def result(reason: CanaryFailureReason | None, detail: str) -> CanaryResult:
        # Every detail is made here, secrets masked (the URL's query and userinfo, a body's
        # or an exception's secret-looking values): it goes to /status, reports and logs.
        ttft = first[0] - started if first else None
        return CanaryResult(sent_at, ttft, clock() - started, reason, redact_text(detail))

    # httpx's own per-request deadline (5 s unless the client sets one) must not cut a canary
    # short: a first token after 6 s of a 15 s timeout is latency, never a `timeout` (the real
    # tier caught a loaded CPU vLLM wedged as canary_stall by it; docs/real-vllm.md).
    http_timeout = httpx.Timeout(spec.timeout_seconds)
    try:
        async with asyncio.timeout(spec.timeout_seconds):
            model = spec.model or await _first_model(client, spec.base_url, http_timeout)
            await _complete(
                client,
                spec,
                model=model,
                request_id=request_id or new_request_id(),
                first=first,
                clock=clock,
                http=http_timeout,
            )
    except TimeoutError:
        if first:  # the token came; only the rest of the stream was slow
            return result(None, f"stream not finished within {spec.timeout_seconds:g} s")
        return result("timeout", f"no token within {spec.timeout_seconds:g} s")
    except _Failed as exc:
        return result(exc.reason, exc.detail)
    except httpx.TimeoutException as exc:
        return result("timeout", f"{type(exc).__name__}: {exc}")
    except httpx.ConnectError as exc:
        reason: CanaryFailureReason = "refused" if is_refused(exc) else "connect_error"
        return result(reason, f"{spec.base_url}: {exc}")
    except httpx.HTTPError as exc:
        return result("connect_error", f"{spec.base_url}: {type(exc).__name__}: {exc}")
    if not first:
        return result("bad_response", "the stream ended without a token")
    return result(None, "")


_HEADERS = {"User-Agent": f"wedgewatch/{__version__}"}


async def _first_model(client: httpx.AsyncClient, base_url: str, http: httpx.Timeout) -> str:
    url = endpoint(base_url, "/v1/models")
    async with client.stream("GET", url, headers=_HEADERS, timeout=http) as response:
        body = await _read_capped(response)
        if response.status_code != 200:
            raise _Failed(
                "http_status", f"GET {url}: HTTP {response.status_code}{_redirect(url, response)}"
            )
    try:
        data = json.loads(body)
        model = data["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise _Failed("no_model", f"GET {url}: no model id in {_snippet(body)!r}") from None
    if not isinstance(model, str) or not model:
        raise _Failed("no_model", f"GET {url}: the first model id is not a string")
    return model


async def _complete(
    client: httpx.AsyncClient,
    spec: CanarySpec,
    *,
    model: str,
    request_id: str,
    first: list[float],
    clock: Callable[[], float],
    http: httpx.Timeout,
) -> None:
    url = endpoint(spec.base_url, "/v1/completions")
    payload = {
        "model": model,
        "prompt": spec.prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "user": CANARY_USER,
    }
    headers = _HEADERS | {"X-Request-Id": request_id, "Accept": "text/event-stream"}
    async with client.stream("POST", url, json=payload, headers=headers, timeout=http) as response:
        if response.status_code != 200:
            body = await _read_capped(response)
            raise _Failed(
                "http_status",
                f"POST {url}: HTTP {response.status_code}{_redirect(url, response)}: "
                f"{_snippet(body)}",
            )
        seen = 0
        async for line in response.aiter_lines():
            seen += len(line) + 1
            if seen > MAX_RESPONSE_BYTES:
                raise _Failed(
                    "bad_response",
                    f"POST {url}: stream over {MAX_RESPONSE_BYTES} bytes",
                )
            data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
            if not data or data == "[DONE]":
                continue
            if not first and _has_token(data):
                first.append(clock())


def _has_token(data: str) -> bool:
    """A stream event that carries a choice (the first token, or an empty finishing chunk)."""
    try:
        event = json.loads(data)
    except ValueError:
        return False
    choices = event.get("choices") if isinstance(event, dict) else None
    return isinstance(choices, list) and bool(choices)


async def _read_capped(response: httpx.Response) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        parts.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            break
    return b"".join(parts)[:MAX_RESPONSE_BYTES]


def _redirect(url: str, response: httpx.Response) -> str:
    """Where a redirect pointed, for its failure detail (redacted with the whole detail)."""
    location = response.headers.get("location")
    if response.status_code not in REDIRECT_STATUSES or not location:
        return ""
    target = urljoin(url, location)
    where = "within the server's origin" if same_origin(url, target) else "off the server's origin"
    return f" redirecting to {one_line(target)} ({where}; not followed)"


def _snippet(body: bytes) -> str:
    return one_line(body.decode("utf-8", "replace"))
