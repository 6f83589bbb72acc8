"""Fetch a vLLM `/metrics` body over HTTP, asynchronously, for the daemon's many targets.

`fetch` never raises for anything the watched server does: a refused connection, a
timeout (including a body that trickles in forever), an HTTP error status or a body past
the size cap come back as `FetchFailed` with a reason from a closed set and a one-line
detail. `observe` turns a fetch into a detector observation by parsing the body.

The rules every scrape follows (request headers, basic auth and redirects, limits,
results, the bounded gzip inflate that caps the decoded size, the failure wording) are
`io.scrape_rules`', shared with the exec probe's blocking transport (`io.http_get`), which
reads with the same HTTP/1.1 parser (`io.http_parse`). This module is the asynchronous
transport under them: the lean client of `io.http1` for `http://`, httpx for `https://`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from wedgewatch.core.detect import Observation
from wedgewatch.io import http1
from wedgewatch.io.http_parse import ProtocolError, get_request
from wedgewatch.io.scrape_rules import (
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    REQUEST_HEADERS,
    BadEncoding,
    Body,
    Failures,
    Fetched,
    FetchFailed,
    Inflater,
    ScrapeLimits,
    TooLarge,
    basic_auth,
    follow_redirect,
    observation,
)

if TYPE_CHECKING:  # httpx is imported when a client is made: a probe may never need it
    import ssl

    import httpx

_OK = 200


def new_client(keepalive: int = 20, tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """The client wedgewatch scrapes with: no proxies from the environment, no pooled retries.

    A sidecar scrapes a server next to it; an `HTTP_PROXY` meant for egress must never
    carry that traffic, so the environment's proxy settings are ignored. `keepalive`
    connections stay open between scrapes (one per target it serves; more are opened when
    needed, never queued behind a slow one). `tls` shares one TLS context between clients.
    """
    import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=keepalive)
    return httpx.AsyncClient(
        trust_env=False,
        follow_redirects=True,
        max_redirects=MAX_REDIRECTS,
        limits=limits,
        verify=tls or True,
    )


class ScrapeClient:
    """One target's scrape client: the lean HTTP/1.1 client of `io.http1` where it serves.

    An `http://` URL is fetched by `io.http1` over one kept-alive connection (a sixth of
    httpx's CPU per scrape: `bench/bench_scrape.py`, 2026-12-02), with the exec probe's
    rules (`io.scrape_rules`): credentials in the URL as basic auth to its origin only,
    redirects followed by `follow_redirect` on every scrape. `https://` (a target, or where
    a redirect leads) goes to an httpx client made by `new_client`, created on first need
    and verified with `tls` (or the default context); it follows the same redirect limit.
    Neither reads the environment's proxy settings.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls
        self.lean = http1.Http1Client()
        self._httpx: httpx.AsyncClient | None = None
        self._requests: dict[tuple[str, str | None], tuple[str, int, bytes] | None] = {}

    def httpx_client(self) -> httpx.AsyncClient:
        """The httpx client for what the lean one does not serve (one keep-alive connection)."""
        if self._httpx is None:
            self._httpx = new_client(keepalive=1, tls=self._tls)
        return self._httpx

    def lean_request(
        self, url: str, authorization: str | None = None
    ) -> tuple[str, int, bytes] | None:
        """(host, port, GET request bytes) when the lean client serves `url`, else None.

        `authorization` is sent as the `Authorization` header (`scrape_rules.basic_auth`).
        """
        key = (url, authorization)
        if key not in self._requests:
            if len(self._requests) >= _MAX_REQUESTS_KEPT:  # redirects to ever-new URLs
                self._requests.clear()
            self._requests[key] = _lean_request(url, authorization)
        return self._requests[key]

    async def aclose(self) -> None:
        """Close the connections."""
        self.lean.close()
        if self._httpx is not None:
            await self._httpx.aclose()
            self._httpx = None

    async def __aenter__(self) -> ScrapeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def new_scrape_client(tls: ssl.SSLContext | None = None) -> ScrapeClient:
    """A client for one target's scrapes (see `ScrapeClient`); `tls` may be shared."""
    return ScrapeClient(tls)


_MAX_REQUESTS_KEPT = 64


def _lean_request(url: str, authorization: str | None) -> tuple[str, int, bytes] | None:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    headers = REQUEST_HEADERS
    if authorization is not None:
        headers = {**REQUEST_HEADERS, "Authorization": authorization}
    return parts.hostname, port, get_request(parts, headers)


async def fetch(
    client: httpx.AsyncClient | ScrapeClient,
    url: str,
    *,
    timeout_seconds: float,
    max_body_bytes: int,
    clock: Callable[[], float] = time.monotonic,
) -> Fetched | FetchFailed:
    """GET `url` within `timeout_seconds` in total, reading at most `max_body_bytes`.

    `client` is a `ScrapeClient` (the daemon's, one per target) or a plain httpx client.
    """
    failures = Failures(url, clock(), clock)
    sink = Body(max_body_bytes)
    try:
        async with asyncio.timeout(timeout_seconds):
            await _get(client, url, sink, timeout_seconds)
        return sink.result(failures)
    except TooLarge:
        return failures.too_large(max_body_bytes)
    except BadEncoding as exc:
        return failures.bad_encoding(exc)
    except TimeoutError:
        return failures.timeout(timeout_seconds, sink.received)
    except (_ConnectFailed, OSError) as exc:
        # OSError: the lean client could not connect (errors on an open connection arrive
        # as ProtocolError); _ConnectFailed: httpx could not.
        return failures.cannot_connect(exc)
    except _TooManyRedirects:
        return failures.too_many_redirects()
    except _Broken as exc:  # httpx saw the connection break, or broken HTTP
        return failures.broken(exc, what=exc.what)
    except ProtocolError as exc:
        return failures.broken(exc)


async def _get(
    client: httpx.AsyncClient | ScrapeClient, url: str, sink: Body, timeout_seconds: float
) -> None:
    """Send the GET and read the response into `sink`, following redirects."""
    if isinstance(client, ScrapeClient):
        authorization = basic_auth(url)
        for _ in range(MAX_REDIRECTS + 1):
            lean = client.lean_request(url, authorization)
            if lean is None:  # https: httpx from here on
                break
            host, port, request = lean
            status, headers, _ = await client.lean.get(host, port, request, sink.open)
            location = headers.get("location")
            if status not in REDIRECT_STATUSES or not location:
                return
            url, authorization = follow_redirect(url, location, authorization)
        else:
            raise _TooManyRedirects
        client = client.httpx_client()
    await _get_httpx(client, url, sink, timeout_seconds)


class _ConnectFailed(Exception):
    """httpx could not connect; `__cause__` is its error."""


class _TooManyRedirects(Exception):
    pass


class _Broken(Exception):
    """httpx saw the connection break or broken HTTP; `what` names its error."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what = what


async def _get_httpx(
    client: httpx.AsyncClient, url: str, sink: Body, timeout_seconds: float
) -> None:
    """`_get` through httpx; its errors become the module's own (httpx imported only here)."""
    import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

    timeout = httpx.Timeout(timeout_seconds)
    try:
        async with client.stream("GET", url, headers=REQUEST_HEADERS, timeout=timeout) as response:
            sink.open(response.status_code, response.headers)
            if response.status_code != _OK:
                sink.encoding = "identity"  # httpx decodes what it reads
                with contextlib.suppress(httpx.HTTPError):  # the detail shows what came
                    async for chunk in response.aiter_bytes():
                        if sink.feed(chunk):
                            break
            elif sink.inflater is not None and response.is_stream_consumed:
                # An in-memory transport (httpx.MockTransport) already read and decoded it.
                sink.inflater = Inflater("identity", sink.max_body_bytes)
                sink.feed(response.content)
            elif sink.inflater is not None:
                async for chunk in response.aiter_raw():
                    sink.feed(chunk)
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.ConnectError as exc:
        raise _ConnectFailed(str(exc)) from exc
    except httpx.TooManyRedirects:
        raise _TooManyRedirects from None
    except httpx.HTTPError as exc:
        raise _Broken(type(exc).__name__, str(exc)) from exc


async def observe(
    client: httpx.AsyncClient | ScrapeClient,
    url: str,
    limits: ScrapeLimits,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> Observation:
    """Scrape and parse once; the observation is stamped with `clock()` when the scrape began.

    Stamping the start keeps observations exactly as far apart as the scrapes were
    scheduled, whatever each one took, so a stall seen over a window measures the window.
    """
    at = clock()
    result = await fetch(
        client,
        url,
        timeout_seconds=limits.timeout_seconds,
        max_body_bytes=limits.max_body_bytes,
        clock=clock,
    )
    return observation(at, url, limits, result)
