"""Fetch a vLLM `/metrics` body over HTTP, asynchronously, for the daemon's many targets.

`fetch` never raises for anything the watched server does: a refused connection, a
timeout (including a body that trickles in forever), an HTTP error status or a body past
the size cap come back as `FetchFailed` with a reason from a closed set and a one-line
detail. `observe` turns a fetch into a detector observation by parsing the body.

The rules every scrape follows (request headers, basic auth and redirects, limits,
results, the bounded gzip inflate that caps the decoded size, the failure wording) are
`io.scrape_rules`', shared with the exec probe's blocking transport (`io.http_get`), which
reads with the same HTTP/1.1 parser (`io.http_parse`). This module is the asynchronous
transport under them: the daemon's `ScrapeClient` (the lean client of `io.http1`, http and
https); `fetch` also takes a plain httpx client (`new_client`), for one-off fetches.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from wedgewatch.core.detection.detect import Observation
from wedgewatch.io import http1
from wedgewatch.io.http_parse import OffOriginRedirect, ProtocolError, get_request
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
    Unfetchable,
    basic_auth,
    follow_redirect,
    observation,
    origin_of,
    tls_context,
)

if TYPE_CHECKING:  # httpx is imported when a client is made: a probe may never need it
    import ssl

    import httpx

_OK = 200


def new_client(keepalive: int = 20, tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """The client wedgewatch scrapes with: no proxies from the environment, no pooled retries.

    A sidecar scrapes a server next to it; an `HTTP_PROXY` meant for egress must never
    carry that traffic, so the environment's proxy settings are ignored. httpx follows no
    redirect: `fetch` follows them within the origin only, as with the lean client.
    `keepalive` connections stay open between scrapes (one per target it serves; more are
    opened when needed, never queued behind a slow one). `tls` shares one TLS context
    between clients.
    """
    import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

    limits = httpx.Limits(max_connections=None, max_keepalive_connections=keepalive)
    return httpx.AsyncClient(
        trust_env=False,
        follow_redirects=False,
        limits=limits,
        verify=tls or True,
    )


class ScrapeClient:
    """One target's scrape client: the lean HTTP/1.1 client of `io.http1`, over TCP or TLS.

    One kept-alive connection (a sixth of httpx's CPU per scrape: `bench/bench_scrape.py`,
    2026-12-02), read with the exec probe's parser (`io.http_parse`) and following its rules
    (`io.scrape_rules`): credentials in the URL as basic auth to its origin only, redirects
    followed by `follow_redirect` within the origin only, at most `MAX_REDIRECTS`. https is
    verified with `tls`, or with `scrape_rules.tls_context()` made on first need. Never
    reads the environment's proxy settings.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls
        self.lean = http1.Http1Client()
        self._requests: dict[tuple[str, str | None], _LeanRequest] = {}
        self._credentials: dict[str, str | None] = {}

    def lean_request(self, url: str, authorization: str | None = None) -> _LeanRequest:
        """(host, port, GET request bytes, TLS context or None) for `url`; Unfetchable for a
        URL that is not http(s). `authorization` is sent as the `Authorization` header."""
        key = (url, authorization)
        request = self._requests.get(key)
        if request is None:
            host, port, tls = origin_of(url)
            headers = REQUEST_HEADERS
            if authorization is not None:
                headers = {**REQUEST_HEADERS, "Authorization": authorization}
            context = self._tls_context() if tls else None
            request = (host, port, get_request(urlsplit(url), headers), context)
            if len(self._requests) >= _MAX_REQUESTS_KEPT:  # redirects to ever-new URLs
                self._requests.clear()
            self._requests[key] = request
        return request

    def credentials(self, url: str) -> str | None:
        """`basic_auth(url)`: the `Authorization` value for the credentials in `url`, read
        once per URL (the same URL is scraped every interval)."""
        if url in self._credentials:
            return self._credentials[url]
        if len(self._credentials) >= _MAX_REQUESTS_KEPT:
            self._credentials.clear()
        authorization = self._credentials[url] = basic_auth(url)
        return authorization

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context()
        return self._tls

    async def aclose(self) -> None:
        """Close the connection."""
        self.lean.close()

    async def __aenter__(self) -> ScrapeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def new_scrape_client(tls: ssl.SSLContext | None = None) -> ScrapeClient:
    """A client for one target's scrapes (see `ScrapeClient`); `tls` may be shared."""
    return ScrapeClient(tls)


_LeanRequest = tuple[str, int, bytes, "ssl.SSLContext | None"]
_MAX_REQUESTS_KEPT = 64


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
    except Unfetchable as exc:
        return failures.unfetchable(exc)
    except _TooManyRedirects:
        return failures.too_many_redirects()
    except OffOriginRedirect as exc:
        return failures.off_origin(exc)
    except _Broken as exc:  # httpx saw the connection break, or broken HTTP
        return failures.broken(exc, what=exc.what)
    except ProtocolError as exc:
        return failures.broken(exc)


async def _get(
    client: httpx.AsyncClient | ScrapeClient, url: str, sink: Body, timeout_seconds: float
) -> None:
    """Send the GET and read the response into `sink`, following redirects within the origin."""
    authorization = client.credentials(url) if isinstance(client, ScrapeClient) else basic_auth(url)
    headers: Mapping[str, str]
    for _ in range(MAX_REDIRECTS + 1):
        if isinstance(client, ScrapeClient):
            host, port, request, tls = client.lean_request(url, authorization)
            status, headers, _ = await client.lean.get(host, port, request, sink.open, tls)
        else:
            status, headers = await _get_httpx(client, url, sink, timeout_seconds)
        location = headers.get("location")
        if status not in REDIRECT_STATUSES or not location:
            return
        url, authorization = follow_redirect(url, location, authorization, status)
    raise _TooManyRedirects


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
) -> tuple[int, Mapping[str, str]]:
    """One GET of `_get` through httpx (which follows no redirect): the status and headers.

    Its errors become the module's own (httpx imported only here).
    """
    import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

    timeout = httpx.Timeout(timeout_seconds)
    try:
        async with client.stream("GET", url, headers=REQUEST_HEADERS, timeout=timeout) as response:
            if response.status_code in REDIRECT_STATUSES and "location" in response.headers:
                return response.status_code, response.headers
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
            return response.status_code, response.headers
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.ConnectError as exc:
        raise _ConnectFailed(str(exc)) from exc
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
