"""One blocking GET of `/metrics`, for the exec probe: the standard library, a hard deadline.

A Kubernetes exec probe starts `wedgewatch check` every few seconds for a single scrape;
an event loop and an HTTP client library cost more to import than the scrape takes. This
transport is a socket and a small HTTP/1.1 response reader (status line, headers, and a
body delimited by its length, by chunks or by the end of the connection; `http.client`
would drag in the `email` package and `ssl`), under the rules of `io.scrape_rules`, which
the daemon's asynchronous transport (`io.scrape`) follows too:

* one total deadline (`timeout_seconds`) for connecting, every redirect, the headers and
  the body: every read on the socket waits at most for what is left of it, and none starts
  after it, so a server that trickles its answer a byte at a time is cut off on time;
* the body is read in bounded pieces and decoded as it arrives (`scrape_rules.Inflater`),
  never held past `max_body_bytes` raw or decoded;
* redirects are followed (vLLM's `/metrics` may answer with one to `/metrics/`), at most
  `MAX_REDIRECTS`; credentials in the URL are sent as basic auth to that URL's origin only;
* proxies from the environment are never used (the sidecar scrapes its neighbour), and
  https verifies the server against certifi's roots when installed (as httpx does).

Name resolution is the one wait the deadline cannot cut short (`getaddrinfo` blocks); a
probe's URL names the pod's own server, by IP address or `localhost`.

Failures come back as `FetchFailed` with the reasons and words of `scrape_rules.Failures`.
"""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urljoin, urlsplit

from wedgewatch.core.detect import Observation
from wedgewatch.io.scrape_rules import (
    MAX_REDIRECTS,
    REQUEST_HEADERS,
    SNIPPET_CHARS,
    BadEncoding,
    Failures,
    Fetched,
    FetchFailed,
    Inflater,
    ScrapeLimits,
    TooLarge,
    content_encoding,
    is_accepted_encoding,
    observation,
    one_line,
    snippet_text,
)

if TYPE_CHECKING:
    import ssl

    from _typeshed import WriteableBuffer

_READ_BYTES = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_MAX_LINE_BYTES = 64 * 1024  # a status, header or chunk-size line (http.client's limits)
_MAX_HEADERS = 100
_LINE_ENDS = (b"\r\n", b"\n")
_URL_SAFE = "!#$%&'()*+,/:;=?@[]~"  # what a request target keeps as it is (and A-Z a-z 0-9 _.-)


class BrokenResponse(Exception):
    """The server spoke broken HTTP, or hung up before the end of its response."""


class _Timeout(Exception):
    """The total deadline passed."""


class _CannotConnect(Exception):
    """No connection to the server; `error` says why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


class _DeadlineReader(io.RawIOBase):
    """A socket's receiving side where no read waits past the deadline or starts after it."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise _Timeout
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise _Timeout from None


def fetch(
    url: str,
    *,
    timeout_seconds: float,
    max_body_bytes: int,
    clock: Callable[[], float] = time.monotonic,
) -> Fetched | FetchFailed:
    """GET `url` within `timeout_seconds` in total, reading at most `max_body_bytes`."""
    failures = Failures(url, clock(), clock)
    deadline = time.monotonic() + timeout_seconds  # the sockets wait in real time
    received = [0]
    current = url
    authorization = _basic_auth(url)
    try:
        for _ in range(MAX_REDIRECTS + 1):
            result = _get_once(
                current,
                authorization=authorization,
                deadline=deadline,
                max_body_bytes=max_body_bytes,
                failures=failures,
                received=received,
            )
            if isinstance(result, str):  # a redirect: follow it, credentials to one origin
                target = urljoin(current, result)
                if _origin(target) != _origin(current):
                    authorization = _basic_auth(target)
                current = target
                continue
            if isinstance(result, Fetched):
                return replace(result, elapsed_seconds=clock() - failures.started_at)
            return result
        return failures.too_many_redirects()
    except TooLarge:
        return failures.too_large(max_body_bytes)
    except BadEncoding as exc:
        return failures.bad_encoding(exc)
    except _Timeout:
        return failures.timeout(timeout_seconds, received[0])
    except _CannotConnect as exc:
        return failures.cannot_connect(exc.error)
    except (BrokenResponse, OSError) as exc:  # broken HTTP, or a connection broken mid-way
        return failures.broken(exc)


def observe(
    url: str, limits: ScrapeLimits, *, clock: Callable[[], float] = time.monotonic
) -> Observation:
    """Scrape and parse once; the observation is stamped with `clock()` when the scrape began."""
    at = clock()
    result = fetch(
        url,
        timeout_seconds=limits.timeout_seconds,
        max_body_bytes=limits.max_body_bytes,
        clock=clock,
    )
    return observation(at, url, limits, result)


def _get_once(
    url: str,
    *,
    authorization: str | None,
    deadline: float,
    max_body_bytes: int,
    failures: Failures,
    received: list[int],
) -> Fetched | FetchFailed | str:
    """One request: the response, a failure, or the `Location` of a redirect."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:  # a port out of range
        return failures.failed("connect_error", f"cannot fetch {url}: {exc}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return failures.failed("connect_error", f"cannot fetch {url}: not an http(s) URL")
    sock = _connect(parts.hostname, port, parts.scheme == "https", deadline)
    try:
        host = parts.hostname
        host = host if host.isascii() else host.encode("idna").decode()
        host = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            host += f":{parts.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        target = quote(target, safe=_URL_SAFE)  # a space or non-ASCII text, percent-encoded
        headers = {"Host": host, **REQUEST_HEADERS, "Connection": "close"}
        if authorization is not None:
            headers["Authorization"] = authorization
        request = f"GET {target} HTTP/1.1\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )
        _send(sock, (request + "\r\n").encode("latin-1"), deadline)
        stream = io.BufferedReader(_DeadlineReader(sock, deadline), _READ_BYTES)
        status, response_headers = _read_head(stream)
        location = response_headers.get("location")
        if status in _REDIRECTS and location:
            return location
        body = _read_body(stream, status, response_headers)
        encoding = content_encoding(response_headers.get("content-encoding"))
        if status != 200:
            return failures.http_status(status, _snippet(body, encoding))
        if not is_accepted_encoding(encoding):
            return failures.unasked_encoding(encoding)
        inflater = Inflater(encoding, max_body_bytes)
        for chunk in body:
            received[0] += len(chunk)
            if received[0] > max_body_bytes:
                raise TooLarge
            inflater.feed(chunk)
        return Fetched(
            body=inflater.finish(),
            status=status,
            content_type=response_headers.get("content-type"),
            elapsed_seconds=0.0,  # set by `fetch`, which knows when the scrape began
        )
    finally:
        sock.close()


def _connect(host: str, port: int, tls: bool, deadline: float) -> socket.socket:
    """A connected socket (TLS-wrapped for https), or _CannotConnect / _Timeout."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Timeout
    try:
        # An ASCII name as bytes: the resolver then needs no IDNA codec (a costly import).
        name: str | bytes = host.encode("ascii") if host.isascii() else host
        sock = socket.create_connection((name, port), timeout=remaining)  # type: ignore[arg-type]
    except TimeoutError:
        raise _Timeout from None
    except OSError as exc:
        raise _CannotConnect(exc) from exc
    if not tls:
        return sock
    try:
        sock.settimeout(max(deadline - time.monotonic(), 1e-3))
        return _tls_context().wrap_socket(sock, server_hostname=host)
    except TimeoutError:
        sock.close()
        raise _Timeout from None
    except OSError as exc:  # ssl.SSLError is an OSError: a failed handshake or verification
        sock.close()
        raise _CannotConnect(exc) from exc


def _tls_context() -> ssl.SSLContext:
    """The default verifying context with certifi's roots when present, as httpx has it."""
    import ssl  # noqa: PLC0415 - only https targets pay for it

    try:
        import certifi  # noqa: PLC0415 - optional, as in httpx

        return ssl.create_default_context(cafile=certifi.where())
    except ImportError:
        return ssl.create_default_context()


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Timeout
    sock.settimeout(remaining)
    try:
        sock.sendall(data)
    except TimeoutError:
        raise _Timeout from None


def _snippet(body: Iterator[bytes], encoding: str) -> str:
    """The start of an error response's body, decoded, for the failure detail."""
    raw = b""
    try:
        for chunk in body:
            raw += chunk
            if len(raw) >= SNIPPET_CHARS * 4:
                break
    except (BrokenResponse, OSError, _Timeout):
        pass
    return snippet_text(raw, encoding)


def _read_line(stream: io.BufferedReader[_DeadlineReader]) -> bytes:
    line = stream.readline(_MAX_LINE_BYTES + 1)
    if len(line) > _MAX_LINE_BYTES:
        raise BrokenResponse(f"a line longer than {_MAX_LINE_BYTES} bytes")
    return line


def _read_head(stream: io.BufferedReader[_DeadlineReader]) -> tuple[int, dict[str, str]]:
    """The status and headers (lower-case names, repeats joined by `, `) of the response."""
    while True:
        line = _read_line(stream)
        if not line:
            raise BrokenResponse("the server closed the connection without a response")
        version, _, rest = line.decode("latin-1").rstrip("\r\n").partition(" ")
        code = rest[:3]
        if not (version.startswith("HTTP/1.") and len(code) == 3 and code.isdigit()):
            raise BrokenResponse(f"not an HTTP/1 status line: {one_line(repr(line[:80]))}")
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS + 1):
            line = _read_line(stream)
            if not line or line in _LINE_ENDS:
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise BrokenResponse(f"a header line without a colon: {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        else:
            raise BrokenResponse(f"more than {_MAX_HEADERS} headers")
        if not 100 <= int(code) < 200:  # 1xx: informational, the answer follows
            return int(code), headers


def _read_body(
    stream: io.BufferedReader[_DeadlineReader], status: int, headers: dict[str, str]
) -> Iterator[bytes]:
    """The body's raw bytes in pieces, delimited by chunks, by its length or by the close."""
    if status in (204, 304):
        return
    if "chunked" in headers.get("transfer-encoding", "").lower():
        yield from _read_chunks(stream)
        return
    length = headers.get("content-length")
    if length is None:
        while piece := stream.read1(_READ_BYTES):
            yield piece
        return
    if not length.isdigit():
        raise BrokenResponse(f"a Content-Length that is not a length: {length[:40]!r}")
    yield from _read_exactly(stream, int(length))


def _read_exactly(stream: io.BufferedReader[_DeadlineReader], size: int) -> Iterator[bytes]:
    left = size
    while left:
        piece = stream.read1(min(left, _READ_BYTES))
        if not piece:
            raise BrokenResponse(f"the server hung up {left} bytes before the end of the body")
        left -= len(piece)
        yield piece


def _read_chunks(stream: io.BufferedReader[_DeadlineReader]) -> Iterator[bytes]:
    while True:
        line = _read_line(stream)
        size = line.split(b";", 1)[0].strip()
        if not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
            if not line:
                raise BrokenResponse("the server hung up before the end of the chunked body")
            raise BrokenResponse(f"a broken chunk size line: {line[:40]!r}")
        if int(size, 16) == 0:
            while (trailer := _read_line(stream)) and trailer not in _LINE_ENDS:
                pass
            return
        yield from _read_exactly(stream, int(size, 16))
        if _read_line(stream) not in _LINE_ENDS:
            raise BrokenResponse("a chunk not followed by its line end")


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def _basic_auth(url: str) -> str | None:
    """`Basic ...` for the credentials in a URL (`user:password@host`), if any."""
    parts = urlsplit(url)
    if parts.username is None:
        return None
    import base64  # noqa: PLC0415 - only a URL with credentials pays for it

    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode("ascii")
