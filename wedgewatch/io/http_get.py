"""One blocking GET of `/metrics`, for the exec probe: the standard library, a hard deadline.

A Kubernetes exec probe starts `wedgewatch check` every few seconds for a single scrape;
an event loop and an HTTP client library cost more to import than the scrape takes. This
transport is a socket around `io.http_parse`, the sans-IO HTTP/1.1 response parser the
daemon's lean client (`io.http1`) reads with too (`http.client` would drag in the `email`
package and `ssl`). It follows the rules of `io.scrape_rules`, as the daemon's asynchronous
transport (`io.scrape`) does:

* one total deadline (`timeout_seconds`) for connecting, every redirect, the headers and
  the body: every read on the socket waits at most for what is left of it, and none starts
  after it, so a server that trickles its answer a byte at a time is cut off on time;
* the body is read in bounded pieces and decoded as it arrives (`scrape_rules.Inflater`),
  never held past `max_body_bytes` raw or decoded;
* redirects are followed within the URL's origin (scheme, host, port) only, with the
  credentials in the URL sent as basic auth, by `scrape_rules.follow_redirect`, at most
  `MAX_REDIRECTS` times; a redirect off the origin is a failure that says where it pointed;
* proxies from the environment are never used (the sidecar scrapes its neighbour), and
  https verifies the server by `scrape_rules.tls_context` (certifi's roots when installed),
  as the daemon's lean client does.

Name resolution is the one wait the deadline cannot cut short (`getaddrinfo` blocks); a
probe's URL names the pod's own server, by IP address or `localhost`.

Failures come back as `FetchFailed` with the reasons and words of `scrape_rules.Failures`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

from wedgewatch.core.detection.detect import Observation
from wedgewatch.io import scrape_rules
from wedgewatch.io.http_parse import (
    Data,
    End,
    Event,
    Head,
    NeedData,
    OffOriginRedirect,
    ProtocolError,
    ResponseParser,
    get_request,
)

_READ_BYTES = 64 * 1024


class _Timeout(Exception):
    """The total deadline passed."""


class _CannotConnect(Exception):
    """No connection to the server; `error` says why."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def fetch(
    url: str,
    *,
    timeout_seconds: float,
    max_body_bytes: int,
    clock: Callable[[], float] = time.monotonic,
) -> scrape_rules.Fetched | scrape_rules.FetchFailed:
    """GET `url` within `timeout_seconds` in total, reading at most `max_body_bytes`."""
    failures = scrape_rules.Failures(url, clock(), clock)
    deadline = time.monotonic() + timeout_seconds  # the sockets wait in real time
    sink = scrape_rules.Body(max_body_bytes)
    current = url
    authorization = scrape_rules.basic_auth(url)
    try:
        for _ in range(scrape_rules.MAX_REDIRECTS + 1):
            result = _get_once(
                current,
                authorization=authorization,
                deadline=deadline,
                sink=sink,
                failures=failures,
            )
            if isinstance(result, tuple):  # a redirect: followed within the origin only
                status, location = result
                current, authorization = scrape_rules.follow_redirect(
                    current, location, authorization, status
                )
                continue
            return result
        return failures.too_many_redirects()
    except OffOriginRedirect as exc:
        return failures.off_origin(exc)
    except scrape_rules.TooLarge:
        return failures.too_large(max_body_bytes)
    except scrape_rules.BadEncoding as exc:
        return failures.bad_encoding(exc)
    except _Timeout:
        return failures.timeout(timeout_seconds, sink.received)
    except _CannotConnect as exc:
        return failures.cannot_connect(exc.error)
    except (ProtocolError, OSError) as exc:  # broken HTTP, or a connection broken mid-way
        return failures.broken(exc)


def observe(
    url: str, limits: scrape_rules.ScrapeLimits, *, clock: Callable[[], float] = time.monotonic
) -> Observation:
    """Scrape and parse once; the observation is stamped with `clock()` when the scrape began."""
    at = clock()
    result = fetch(
        url,
        timeout_seconds=limits.timeout_seconds,
        max_body_bytes=limits.max_body_bytes,
        clock=clock,
    )
    return scrape_rules.observation(at, url, limits, result)


def _get_once(
    url: str,
    *,
    authorization: str | None,
    deadline: float,
    sink: scrape_rules.Body,
    failures: scrape_rules.Failures,
) -> scrape_rules.Fetched | scrape_rules.FetchFailed | tuple[int, str]:
    """One request: the response, a failure, or a redirect's (status, `Location`)."""
    try:
        host, port, tls = scrape_rules.origin_of(url)
    except scrape_rules.Unfetchable as exc:
        return failures.unfetchable(exc)
    parts = urlsplit(url)
    sock = _connect(host, port, tls, deadline)
    try:
        headers = {**scrape_rules.REQUEST_HEADERS, "Connection": "close"}
        if authorization is not None:
            headers["Authorization"] = authorization
        _send(sock, get_request(parts, headers), deadline)
        events = _events(sock, deadline)
        head = next(events)
        if not isinstance(head, Head):  # the parser's first event is always the head
            raise ProtocolError(f"a response without a head: {head!r}")
        status, response_headers = head.status, head.headers
        location = response_headers.get("location")
        if status in scrape_rules.REDIRECT_STATUSES and location:
            return status, location
        sink.open(status, response_headers)
        try:
            for event in events:
                if isinstance(event, Data) and sink.feed(event.data):
                    break  # enough of an error's body for its detail
        except (ProtocolError, OSError, _Timeout):
            if sink.inflater is not None:
                raise
            # an error response: its detail shows what came before the break
        return sink.result(failures)
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
        return scrape_rules.tls_context().wrap_socket(sock, server_hostname=host)
    except TimeoutError:
        sock.close()
        raise _Timeout from None
    except OSError as exc:  # ssl.SSLError is an OSError: a failed handshake or verification
        sock.close()
        raise _CannotConnect(exc) from exc


def _send(sock: socket.socket, data: bytes, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Timeout
    sock.settimeout(remaining)
    try:
        sock.sendall(data)
    except TimeoutError:
        raise _Timeout from None


def _events(sock: socket.socket, deadline: float) -> Iterator[Event]:
    """The response's events, read from `sock` with no wait past the deadline."""
    parser = ResponseParser()
    while True:
        event = parser.next_event()
        if isinstance(event, NeedData):
            parser.receive_data(_receive(sock, deadline))
            continue
        yield event
        if isinstance(event, End):
            return


def _receive(sock: socket.socket, deadline: float) -> bytes:
    """What arrives next (`b""` when the server closed), or _Timeout at the deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Timeout
    sock.settimeout(remaining)
    try:
        return sock.recv(_READ_BYTES)
    except TimeoutError:
        raise _Timeout from None
