"""What a `/metrics` scrape is, whatever carries its bytes: bounds, request, failures, result.

Two transports fetch `/metrics`: the daemon's (`io.scrape`, asynchronous, many targets on
one event loop) and the exec probe's (`io.http_get`, one blocking GET in a process that
lives a fraction of a second). Both follow the rules kept here, so they ask the same
question and fail for the same reasons in the same words:

* `REQUEST_HEADERS`: plain text only, gzip accepted;
* `tls_context`: https verified against certifi's roots when installed, as httpx does;
* `basic_auth` and `follow_redirect`: credentials in the URL are sent as basic auth to that
  URL's origin only; a redirect (`REDIRECT_STATUSES` with a `Location`) is followed, at
  most `MAX_REDIRECTS` times, and only within its origin (`http_parse.redirect_target`;
  one off it is the failure `Failures.off_origin`);
* `ScrapeLimits`: a total deadline, a cap on the decoded body and on the engines parsed;
* `Inflater`: gzip decoded in bounded steps, the cap applied to the decoded size, so a gzip
  bomb is cut off after `max_body_bytes` of output;
* `Body`: where a response's body goes as it arrives (a 200's capped and decoded, anything
  else's first bytes for the failure detail), and the result it makes;
* `Failures`: every `FetchFailed` a transport returns, one method per closed-set reason
  (`core.states.ScrapeFailureReason`), its detail on one line with the URL redacted;
* `observation`: a fetch result, parsed, as the detector's observation.

Nothing here opens a socket or imports a transport.
"""

from __future__ import annotations

import errno
import zlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from wedgewatch import __version__
from wedgewatch.core.detection.detect import Observation, Scraped, ScrapeFailed
from wedgewatch.core.detection.states import ScrapeFailureReason
from wedgewatch.core.text.redact import redact_url, scrub_text, secret_fragments
from wedgewatch.core.values import immutable
from wedgewatch.io.http_parse import OffOriginRedirect, port_of, redirect_target
from wedgewatch.vllm import signals

if TYPE_CHECKING:
    import ssl

#: Request headers: plain text only (vLLM's `/metrics/` mount escapes `:` in OpenMetrics).
REQUEST_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1.0, text/plain;q=0.9",
    "Accept-Encoding": "gzip",
    "User-Agent": f"wedgewatch/{__version__}",
}
#: How many redirects a scrape follows before it fails (httpx's default).
MAX_REDIRECTS = 20
#: The statuses that redirect a GET (vLLM's `/metrics` may answer one to `/metrics/`).
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: The bytes of an error response's body kept for its failure detail (decoded, one line).
SNIPPET_CHARS = 200
_INFLATE_STEP_BYTES = 256 * 1024
_OK = 200


@immutable
class ScrapeLimits:
    """The bounds of one scrape."""

    timeout_seconds: float
    max_body_bytes: int
    max_engines: int = signals.DEFAULT_MAX_ENGINES


@immutable
class Fetched:
    """A complete 200 response."""

    body: bytes
    status: int
    content_type: str | None
    elapsed_seconds: float


@immutable
class FetchFailed:
    """A scrape that produced no usable body, with a closed-set reason and a one-line detail."""

    reason: ScrapeFailureReason
    detail: str
    elapsed_seconds: float


class TooLarge(Exception):
    """The body passed `max_body_bytes` (raw or decoded)."""


class Unfetchable(Exception):
    """A URL no transport fetches (not http or https, no host, a port out of range)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(reason)
        self.url = url


def origin_of(url: str) -> tuple[str, int, bool]:
    """(host, port, whether TLS) of an http(s) URL, the scheme's port by default; else
    Unfetchable saying why."""
    parts = urlsplit(url)
    try:
        port = port_of(parts)
    except ValueError as exc:  # a port out of range
        raise Unfetchable(url, str(exc)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unfetchable(url, "not an http(s) URL")
    return parts.hostname, port, parts.scheme == "https"


class BadEncoding(Exception):
    """The body is not valid in its `Content-Encoding`."""


def content_encoding(header: str | None) -> str:
    """The `Content-Encoding` of a response, normalised (`identity` when absent)."""
    return (header or "identity").strip().lower() or "identity"


def is_accepted_encoding(encoding: str) -> bool:
    """Whether a scrape can decode `encoding` (the ones `REQUEST_HEADERS` asks for)."""
    return encoding in ("identity", "gzip")


class Inflater:
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
            raise TooLarge
        self._parts.append(data)

    def feed(self, chunk: bytes) -> None:
        """Decode one chunk of the body; TooLarge past the cap, BadEncoding if corrupt."""
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
                raise BadEncoding(f"corrupt {self._encoding} body ({exc})") from None
            self._keep(out)
            data = decoder.unconsumed_tail
            if decoder.eof:
                # gzip allows several members back to back: start a new one on what is left.
                self._in_member = False
                data = data or decoder.unused_data
                decoder = self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def finish(self) -> bytes:
        """The whole decoded body; BadEncoding if the stream stopped inside a gzip member."""
        if self._in_member:
            raise BadEncoding(f"truncated {self._encoding} body (the stream ended early)")
        return b"".join(self._parts)


def host_port(url: str) -> str:
    """`host:port` of a URL (`[v6]:port`), the default port filled in, for failure details."""
    parts = urlsplit(url)
    try:
        port = port_of(parts)
    except ValueError:
        return parts.netloc
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def basic_auth(url: str) -> str | None:
    """The `Authorization` value (`Basic ...`) for the credentials in a URL, if it has any."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    import base64  # noqa: PLC0415 - only a URL with credentials pays for it (the probe)

    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")


def follow_redirect(
    current: str, location: str, authorization: str | None, status: int = 302
) -> tuple[str, str | None]:
    """Where a redirect (`status`) from `current` leads, and the `Authorization` to send there.

    Only within `current`'s origin (scheme, host and port), where the credentials go on;
    off it raises `http_parse.OffOriginRedirect` (report it with `Failures.off_origin`).
    """
    return redirect_target(current, location, status), authorization


def tls_context() -> ssl.SSLContext:
    """The verifying TLS context for https targets: certifi's roots when installed (as
    httpx has it), else the system's."""
    import ssl  # noqa: PLC0415 - only https targets pay for it (the probe)

    try:
        import certifi  # noqa: PLC0415 - optional, as in httpx

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


def is_refused(exc: BaseException) -> bool:
    """Whether an exception (or its cause chain) is a refused connection."""
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


def one_line(text: str, limit: int = SNIPPET_CHARS) -> str:
    """`text` on one line, cut after `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def snippet_text(raw: bytes, encoding: str) -> str:
    """The start of an error response's body (raw, in `encoding`), decoded, on one line."""
    if encoding == "gzip":
        try:  # the start of it: a bounded step of a possibly cut stream
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, SNIPPET_CHARS * 4)
        except zlib.error:
            raw = b""
    return one_line(raw.decode("utf-8", errors="replace"))


class Failures:
    """The failures of one fetch of `url`: one method per way a scrape fails, worded once.

    Every detail has the URL redacted (no credentials, no secret query) and any secret part
    of it scrubbed from the text a library put in; `elapsed_seconds` runs from `started_at`.
    """

    def __init__(self, url: str, started_at: float, clock: Callable[[], float]) -> None:
        self._url = url
        self._shown = redact_url(url)  # never print credentials or a query
        self.started_at = started_at
        self._clock = clock

    def elapsed(self) -> float:
        """Seconds since the fetch began."""
        return self._clock() - self.started_at

    def failed(self, reason: ScrapeFailureReason, detail: str) -> FetchFailed:
        """A failure with `detail` made safe to print."""
        secrets = secret_fragments([self._url], keep_path=True)  # only when a scrape failed
        detail = scrub_text(detail.replace(self._url, self._shown), secrets)
        return FetchFailed(reason=reason, detail=detail, elapsed_seconds=self.elapsed())

    def unfetchable(self, exc: Unfetchable) -> FetchFailed:
        """The scrape's URL, or where a redirect led, is no URL a transport fetches."""
        return self.failed("connect_error", f"cannot fetch {exc.url}: {exc}")

    def http_status(self, status: int, snippet: str) -> FetchFailed:
        """A response other than 200, with the start of its body."""
        return self.failed(
            "http_status", f"HTTP {status} from {self._url}" + (f": {snippet}" if snippet else "")
        )

    def off_origin(self, exc: OffOriginRedirect) -> FetchFailed:
        """A redirect off the scraped URL's origin: not followed; says where it pointed."""
        return self.failed(
            "http_status",
            f"HTTP {exc.status} from {self._url} redirects off its origin (scheme, host, "
            f"port) to {redact_url(exc.target)}: not followed",
        )

    def too_many_redirects(self) -> FetchFailed:
        """More than `MAX_REDIRECTS` redirects."""
        return self.failed("http_status", f"too many redirects from {self._url}")

    def unasked_encoding(self, encoding: str) -> FetchFailed:
        """A body in a `Content-Encoding` the request did not accept."""
        return self.failed(
            "parse_error",
            f"{self._url} answered with Content-Encoding {encoding!r}, "
            "which was not asked for (only gzip)",
        )

    def bad_encoding(self, exc: BadEncoding) -> FetchFailed:
        """A corrupt or truncated gzip body."""
        return self.failed("parse_error", f"{self._url}: {exc}")

    def too_large(self, max_body_bytes: int) -> FetchFailed:
        """A body past the cap, raw or decoded."""
        return self.failed("too_large", f"body from {self._url} exceeded {max_body_bytes} bytes")

    def timeout(self, timeout_seconds: float, received: int) -> FetchFailed:
        """No complete response within the total deadline."""
        progress = f" ({received} bytes of body received)" if received else ""
        return self.failed(
            "timeout",
            f"no complete response from {self._url} within {timeout_seconds:g} s{progress}",
        )

    def cannot_connect(self, exc: BaseException) -> FetchFailed:
        """No connection: refused, or another reason (name resolution, TLS, unreachable)."""
        if is_refused(exc):
            return self.failed("refused", f"connection refused by {host_port(self._url)}")
        return self.failed(
            "connect_error", f"cannot connect to {host_port(self._url)}: {one_line(str(exc))}"
        )

    def broken(self, exc: BaseException, what: str | None = None) -> FetchFailed:
        """The connection broke mid-response, or the server spoke broken HTTP.

        `what` names the error (a transport's library error), else the exception's type.
        """
        what = what or type(exc).__name__
        return self.failed(
            "connect_error",
            f"{what} from {host_port(self._url)}: {one_line(str(exc)) or 'no detail'}",
        )


class Body:
    """Where a response body goes as it arrives: a 200's capped and decoded, else its start.

    A transport opens it with the final response's status and headers, feeds it the raw
    body (still in its `Content-Encoding`) and asks it for the `result`.
    """

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.received = 0  # raw body bytes of a 200, for a timeout's detail
        self.inflater: Inflater | None = None
        self.encoding = "identity"
        self.snippet = b""
        self.status = 0
        self.content_type: str | None = None

    def open(self, status: int, headers: Mapping[str, str]) -> Body:
        """Start a response: a 200 in an encoding that was asked for is kept and decoded."""
        self.received, self.snippet, self.inflater = 0, b"", None
        self.status, self.content_type = status, headers.get("content-type")
        self.encoding = content_encoding(headers.get("content-encoding"))
        if status == _OK and is_accepted_encoding(self.encoding):
            self.inflater = Inflater(self.encoding, self.max_body_bytes)
        return self

    def feed(self, chunk: bytes) -> bool:
        """Take raw body bytes; True once an error's snippet suffices; TooLarge past the cap."""
        if self.inflater is None:
            self.snippet += chunk
            return len(self.snippet) >= SNIPPET_CHARS * 4
        self.received += len(chunk)
        if self.received > self.max_body_bytes:
            raise TooLarge
        self.inflater.feed(chunk)
        return False

    def result(self, failures: Failures) -> Fetched | FetchFailed:
        """The body of a 200 as it was asked for, or the failure the response was."""
        if self.status != _OK:
            return failures.http_status(self.status, snippet_text(self.snippet, self.encoding))
        if self.inflater is None:
            return failures.unasked_encoding(self.encoding)
        return Fetched(
            body=self.inflater.finish(),
            status=self.status,
            content_type=self.content_type,
            elapsed_seconds=failures.elapsed(),
        )


def observation(
    at: float, url: str, limits: ScrapeLimits, result: Fetched | FetchFailed
) -> Observation:
    """The detector's observation of a fetch that began at `at`: its failure, or its parse."""
    if isinstance(result, FetchFailed):
        return ScrapeFailed(at=at, reason=result.reason, detail=result.detail)
    parsed = signals.parse(result.body, max_engines=limits.max_engines)
    if isinstance(parsed, signals.ParseFailure):
        shown = redact_url(url)
        return ScrapeFailed(at=at, reason=parsed.reason, detail=f"{shown}: {parsed.message}")
    return Scraped(at=at, exposition=parsed)
