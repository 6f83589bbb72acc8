"""Fetch a vLLM `/metrics` body over HTTP, bounded in time and size; failures are data.

`fetch` never raises for anything the watched server does: a refused connection, a
timeout (including a body that trickles in forever), an HTTP error status or a body past
the size cap come back as `FetchFailed` with a reason from a closed set and a one-line
detail. `observe` turns a fetch into a detector observation by parsing the body.

The body is read as a stream and never held past `max_body_bytes`. gzip is accepted and
decoded here, in bounded steps, so the cap applies to the decoded size and a gzip bomb
is cut off after `max_body_bytes` of output, not after it has been inflated in memory.
"""

from __future__ import annotations

import asyncio
import errno
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from wedgewatch import __version__
from wedgewatch.core.detect import Observation, Scraped, ScrapeFailed
from wedgewatch.core.redact import redact_url, scrub_text, secret_fragments
from wedgewatch.core.states import ScrapeFailureReason
from wedgewatch.io import http1
from wedgewatch.vllm import signals

if TYPE_CHECKING:  # httpx is imported when a client is made: a probe may never need it
    import ssl

    import httpx

#: Request headers: plain text only (vLLM's `/metrics/` mount escapes `:` in OpenMetrics).
REQUEST_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1.0, text/plain;q=0.9",
    "Accept-Encoding": "gzip",
    "User-Agent": f"wedgewatch/{__version__}",
}
_SNIPPET_CHARS = 200
_OK = 200
_INFLATE_STEP_BYTES = 256 * 1024
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"


@dataclass(frozen=True, slots=True)
class ScrapeLimits:
    """The bounds of one scrape."""

    timeout_seconds: float
    max_body_bytes: int
    max_engines: int = signals.DEFAULT_MAX_ENGINES


@dataclass(frozen=True, slots=True)
class Fetched:
    """A complete 200 response."""

    body: bytes
    status: int
    content_type: str | None
    elapsed_seconds: float


@dataclass(frozen=True, slots=True)
class FetchFailed:
    """A scrape that produced no usable body, with a closed-set reason and a one-line detail."""

    reason: ScrapeFailureReason
    detail: str
    elapsed_seconds: float


class _TooLarge(Exception):
    pass


class _BadEncoding(Exception):
    pass


class _Inflater:
    """Decodes a `Content-Encoding` stream in bounded steps, counting decoded bytes."""

    def __init__(self, encoding: str, max_bytes: int) -> None:
        self._encoding = encoding
        self._max_bytes = max_bytes
        self._size = 0
        self._parts: list[bytes] = []
        self._decoder = self._new_decoder()
        self._in_member = False  # a gzip member has begun and not yet ended

    def _new_decoder(self) -> zlib._Decompress | None:
        if self._encoding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        return None

    def _keep(self, data: bytes) -> None:
        self._size += len(data)
        if self._size > self._max_bytes:
            raise _TooLarge
        self._parts.append(data)

    def feed(self, chunk: bytes) -> None:
        decoder = self._decoder
        if decoder is None:
            self._keep(chunk)
            return
        data = chunk
        while data:
            self._in_member = True
            try:
                out = decoder.decompress(data, _INFLATE_STEP_BYTES)
            except zlib.error as exc:
                raise _BadEncoding(f"corrupt {self._encoding} body ({exc})") from None
            self._keep(out)
            data = decoder.unconsumed_tail
            if decoder.eof:
                # gzip allows several members back to back: start a new one on what is left.
                self._in_member = False
                data = data or decoder.unused_data
                decoder = self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def finish(self) -> bytes:
        if self._in_member:
            raise _BadEncoding(f"truncated {self._encoding} body (the stream ended early)")
        return b"".join(self._parts)


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return parts.netloc
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_refused(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or (
            isinstance(current, OSError) and current.errno == errno.ECONNREFUSED
        ):
            return True
        current = current.__cause__ or current.__context__
    return "connection refused" in str(exc).lower()


#: Whether an exception (or its cause chain) is a refused connection; `io.canary` uses it too.
is_refused = _is_refused


def _one_line(text: str, limit: int = _SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


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
        trust_env=False, follow_redirects=True, limits=limits, verify=tls or True
    )


class ScrapeClient:
    """One target's scrape client: the lean HTTP/1.1 client of `io.http1` where it serves.

    A plain `http://` URL without credentials is fetched by `io.http1` over one kept-alive
    connection (about a tenth of httpx's CPU per scrape). Everything else goes to an httpx
    client made by `new_client`, created on first need, exactly as before: `https://`
    (verified with `tls`, or the default context), credentials in the URL (basic auth),
    and a URL that answered with a redirect (httpx follows it, from then on). Neither
    reads the environment's proxy settings.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self._tls = tls
        self.lean = http1.Http1Client()
        self._httpx: httpx.AsyncClient | None = None
        self._redirected: set[str] = set()
        self._requests: dict[str, tuple[str, int, bytes] | None] = {}

    def httpx_client(self) -> httpx.AsyncClient:
        """The httpx client for what the lean one does not serve (one keep-alive connection)."""
        if self._httpx is None:
            self._httpx = new_client(keepalive=1, tls=self._tls)
        return self._httpx

    def lean_request(self, url: str) -> tuple[str, int, bytes] | None:
        """(host, port, GET request bytes) when the lean client serves `url`, else None."""
        if url in self._redirected:
            return None
        if url not in self._requests:
            self._requests[url] = _lean_request(url)
        return self._requests[url]

    def redirected(self, url: str) -> None:
        """`url` answered with a redirect: httpx fetches (and follows) it from now on."""
        self._redirected.add(url)

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


def _lean_request(url: str) -> tuple[str, int, bytes] | None:
    parts = urlsplit(url)
    if parts.scheme != "http" or "@" in parts.netloc or not parts.hostname:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    host = parts.hostname
    shown_host = f"[{host}]" if ":" in host else host
    authority = shown_host if port == 80 else f"{shown_host}:{port}"
    target = quote(parts.path or "/", safe=_PATH_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_PATH_SAFE + "?")
    head = [f"GET {target} HTTP/1.1", f"Host: {authority}"]
    head += [f"{name}: {value}" for name, value in REQUEST_HEADERS.items()]
    return host, port, ("\r\n".join(head) + "\r\n\r\n").encode("ascii")


class _Body:
    """Where a response body goes: a 200's capped and decoded, anything else's first bytes."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.received = 0  # raw body bytes of a 200, for a timeout's detail
        self.inflater: _Inflater | None = None
        self.encoding = "identity"
        self.snippet = b""

    def open(self, status: int, headers: Mapping[str, str]) -> _Body:
        """Start a response: a 200 in an encoding that was asked for is kept and decoded."""
        self.received, self.snippet, self.inflater = 0, b"", None
        self.encoding = headers.get("content-encoding", "identity").strip().lower()
        if status == _OK and self.encoding in ("identity", "gzip", ""):
            self.inflater = _Inflater(self.encoding, self.max_body_bytes)
        return self

    def feed(self, chunk: bytes) -> bool:
        """Take raw body bytes; True once an error's snippet is long enough."""
        if self.inflater is None:
            self.snippet += chunk
            return len(self.snippet) >= _SNIPPET_CHARS * 4
        self.received += len(chunk)
        if self.received > self.max_body_bytes:
            raise _TooLarge
        self.inflater.feed(chunk)
        return False

    def snippet_text(self) -> str:
        """The start of an error response's body, decoded, on one line."""
        raw = self.snippet
        if self.encoding == "gzip":
            try:
                raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, _SNIPPET_CHARS * 4)
            except zlib.error:
                raw = b""
        return _one_line(raw.decode("utf-8", errors="replace"))


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
    started_at = clock()
    sink = _Body(max_body_bytes)

    def failed(reason: ScrapeFailureReason, detail: str) -> FetchFailed:
        # Never print credentials or a query; worked out only when something failed.
        detail = scrub_text(
            detail.replace(url, redact_url(url)), secret_fragments([url], keep_path=True)
        )
        return FetchFailed(reason=reason, detail=detail, elapsed_seconds=clock() - started_at)

    try:
        async with asyncio.timeout(timeout_seconds):
            status, headers = await _get(client, url, sink, timeout_seconds)
        if status != _OK:
            snippet = sink.snippet_text()
            return failed(
                "http_status", f"HTTP {status} from {url}" + (f": {snippet}" if snippet else "")
            )
        if sink.inflater is None:
            return failed(
                "parse_error",
                f"{url} answered with Content-Encoding {sink.encoding!r}, "
                "which was not asked for (only gzip)",
            )
        body = sink.inflater.finish()
        return Fetched(
            body=body,
            status=status,
            content_type=headers.get("content-type"),
            elapsed_seconds=clock() - started_at,
        )
    except _TooLarge:
        return failed("too_large", f"body from {url} exceeded {max_body_bytes} bytes")
    except _BadEncoding as exc:
        return failed("parse_error", f"{url}: {exc}")
    except TimeoutError:
        progress = f" ({sink.received} bytes of body received)" if sink.received else ""
        return failed(
            "timeout", f"no complete response from {url} within {timeout_seconds:g} s{progress}"
        )
    except (_ConnectFailed, OSError) as exc:
        # OSError: the lean client could not connect (errors on an open connection arrive
        # as RemoteProtocolError); _ConnectFailed: httpx could not.
        if _is_refused(exc):
            return failed("refused", f"connection refused by {_host_port(url)}")
        return failed(
            "connect_error", f"cannot connect to {_host_port(url)}: {_one_line(str(exc))}"
        )
    except _TooManyRedirects:
        return failed("http_status", f"too many redirects from {url}")
    except (_Broken, http1.RemoteProtocolError) as exc:
        # The connection broke mid-response, or the server spoke broken HTTP.
        what = exc.what if isinstance(exc, _Broken) else type(exc).__name__
        return failed(
            "connect_error", f"{what} from {_host_port(url)}: {_one_line(str(exc)) or 'no detail'}"
        )


async def _get(
    client: httpx.AsyncClient | ScrapeClient, url: str, sink: _Body, timeout_seconds: float
) -> tuple[int, Mapping[str, str]]:
    """Send the GET and read the response into `sink`; the status and headers."""
    if isinstance(client, ScrapeClient):
        lean = client.lean_request(url)
        if lean is not None:
            host, port, request = lean
            status, headers, _ = await client.lean.get(host, port, request, sink.open)
            if not (300 <= status < 400 and "location" in headers):
                return status, headers
            client.redirected(url)
        client = client.httpx_client()
    return await _get_httpx(client, url, sink, timeout_seconds)


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
    client: httpx.AsyncClient, url: str, sink: _Body, timeout_seconds: float
) -> tuple[int, Mapping[str, str]]:
    """`_get` through httpx; its errors become the module's own (httpx imported only here)."""
    import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

    timeout = httpx.Timeout(timeout_seconds)
    try:
        async with client.stream("GET", url, headers=REQUEST_HEADERS, timeout=timeout) as response:
            sink.open(response.status_code, response.headers)
            if response.status_code != _OK:
                sink.snippet = await _read_snippet(response)
                sink.encoding = "identity"  # httpx decoded it
            elif sink.inflater is not None and response.is_stream_consumed:
                # An in-memory transport (httpx.MockTransport) already read and decoded it.
                sink.inflater = _Inflater("identity", sink.max_body_bytes)
                sink.feed(response.content)
            elif sink.inflater is not None:
                async for chunk in response.aiter_raw():
                    sink.feed(chunk)
            return response.status_code, response.headers
    except httpx.TimeoutException:
        raise TimeoutError from None
    except httpx.ConnectError as exc:
        raise _ConnectFailed(str(exc)) from exc
    except httpx.TooManyRedirects:
        raise _TooManyRedirects from None
    except httpx.HTTPError as exc:
        raise _Broken(type(exc).__name__, str(exc)) from exc


async def _read_snippet(response: httpx.Response) -> bytes:
    """The start of an error response's body, decoded, for the failure detail."""
    import httpx  # noqa: PLC0415 - see TYPE_CHECKING above

    raw = b""
    try:
        async for chunk in response.aiter_bytes():
            raw += chunk
            if len(raw) >= _SNIPPET_CHARS * 4:
                break
    except httpx.HTTPError:
        pass
    return raw


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
    if isinstance(result, FetchFailed):
        return ScrapeFailed(at=at, reason=result.reason, detail=result.detail)
    parsed = signals.parse(result.body, max_engines=limits.max_engines)
    if isinstance(parsed, signals.ParseFailure):
        shown = redact_url(url)
        return ScrapeFailed(at=at, reason=parsed.reason, detail=f"{shown}: {parsed.message}")
    return Scraped(at=at, exposition=parsed)
