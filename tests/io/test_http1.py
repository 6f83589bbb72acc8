"""The lean HTTP/1.1 scrape client (`io.http1` through `io.scrape.ScrapeClient`).

Every test runs against a real server on 127.0.0.1: `ScriptedServer` for well-formed
HTTP (the same scenarios `test_scrape.py` runs with the httpx client), and `RawServer`,
which writes whatever bytes a test gives it, for what a well-behaved server never sends:
chunked bodies with extensions and trailers, a status line that is not HTTP, a header
flood, a Content-Length that lies, a kept-alive connection closed under the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import socket
import ssl
import struct
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from scripted_http import RefusingPort, Reply, ScriptedServer, always, in_turn, zeros

from wedgewatch.core.detection.detect import Scraped, ScrapeFailed
from wedgewatch.io import http_get
from wedgewatch.io.http_parse import MAX_HEAD_BYTES
from wedgewatch.io.scrape import ScrapeClient, fetch, new_scrape_client, observe
from wedgewatch.io.scrape_rules import Fetched, FetchFailed, ScrapeLimits, Unfetchable
from wedgewatch.vllm.signals import EngineKey

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
BODY = FIXTURE.read_bytes()
MIB = 1024 * 1024


async def lean_fetch(
    url: str,
    *,
    client: ScrapeClient | None = None,
    timeout_seconds: float = 5.0,
    max_body_bytes: int = 16 * MIB,
) -> Fetched | FetchFailed:
    """One fetch with `client` (kept open) or a fresh ScrapeClient (closed after)."""
    if client is not None:
        return await fetch(
            client, url, timeout_seconds=timeout_seconds, max_body_bytes=max_body_bytes
        )
    async with new_scrape_client() as fresh:
        return await fetch(
            fresh, url, timeout_seconds=timeout_seconds, max_body_bytes=max_body_bytes
        )


def ok_response(body: bytes = BODY, extra: bytes = b"") -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
    return head + b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body


Handler = Callable[["RawServer", int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An asyncio server on 127.0.0.1 whose every byte is written by the test's handler."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/metrics"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        index = self.connections
        self.connections += 1
        try:
            await self.handler(self, index, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._tasks.discard(task)

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request head."""
        head = await reader.readuntil(b"\r\n\r\n")
        self.requests.append(head)
        return head


def answer_each(*responses: bytes, then_close: bool = False) -> Handler:
    """Answer the requests of a connection with `responses` in turn (the last one repeats)."""

    async def handler(
        server: RawServer, _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        number = 0
        while True:
            await server.request(reader)
            writer.write(responses[min(number, len(responses) - 1)])
            await writer.drain()
            number += 1
            if then_close:
                return

    return handler


# -- the scenarios of test_scrape.py's loopback tests, with the lean client ---------------


async def test_loopback_ok_and_the_request_it_sent() -> None:
    """The body arrives intact; the request is a GET with the scrape's headers and Host."""
    with ScriptedServer(always(Reply(body=BODY))) as server:
        result = await lean_fetch(server.url + "?x=1")
        port = server.url.split(":")[2].split("/")[0]
    assert isinstance(result, Fetched)
    assert result.body == BODY
    request = server.requests[0]
    assert request.path == "/metrics?x=1"
    assert request.headers["Host"] == f"127.0.0.1:{port}"
    assert request.headers["Accept-Encoding"] == "gzip"
    assert request.headers["Accept"].startswith("text/plain")
    assert "openmetrics" not in request.headers["Accept"]
    assert request.headers["User-Agent"].startswith("wedgewatch/")


async def test_loopback_refused_port() -> None:
    """A port nobody listens on is `refused`, naming host and port."""
    with RefusingPort() as port:
        result = await lean_fetch(port.url)
        assert isinstance(result, FetchFailed)
        assert result.reason == "refused"
        assert result.detail == f"connection refused by 127.0.0.1:{port.sock.getsockname()[1]}"


async def test_unresolvable_host_is_a_connect_error() -> None:
    """A host name that does not resolve is `connect_error`, naming it."""
    result = await lean_fetch("http://wedgewatch-no-such-host.invalid:8000/metrics")
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert result.detail.startswith("cannot connect to wedgewatch-no-such-host.invalid:8000: ")


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
async def test_loopback_http_500_has_a_bounded_snippet(gzipped: bool) -> None:
    """A 500 is `http_status` with the start of its (decoded) body, on one bounded line."""
    text = b"Internal Server Error\n" + b"boom " * 400
    headers = {"Content-Encoding": "gzip"} if gzipped else {}
    reply = Reply(status=500, body=gzip.compress(text) if gzipped else text, headers=headers)
    with ScriptedServer(always(reply)) as server:
        result = await lean_fetch(server.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "http_status"
    assert result.detail.startswith(f"HTTP 500 from {server.url}: Internal Server Error boom")
    assert len(result.detail) < 300
    assert "\n" not in result.detail


async def test_loopback_huge_body_is_cut_at_the_cap() -> None:
    """A 200 MB body is `too_large`; the server sends far less than 200 MB."""
    huge = 200 * 1000 * 1000
    with ScriptedServer(always(Reply(body=zeros(huge), content_length=huge))) as server:
        result = await lean_fetch(server.url, max_body_bytes=16 * MIB)
        assert isinstance(result, FetchFailed)
        assert result.reason == "too_large"
        assert result.detail == f"body from {server.url} exceeded {16 * MIB} bytes"
        for _ in range(200):  # the handler thread notes the hang-up when its write fails
            if server.bytes_sent:
                break
            await asyncio.sleep(0.05)
    assert server.bytes_sent[0] < 64 * MIB


async def test_loopback_trickling_body_hits_the_total_deadline() -> None:
    """A body that keeps arriving, a little at a time, is cut at the total deadline."""

    def trickle() -> Iterator[bytes]:
        yield from BODY.splitlines(keepends=True)

    reply = Reply(body=trickle(), content_length=len(BODY), chunk_pause_seconds=0.05)
    with ScriptedServer(always(reply)) as server:
        result = await lean_fetch(server.url, timeout_seconds=0.5)
    assert isinstance(result, FetchFailed)
    assert result.reason == "timeout"
    assert result.detail.startswith(f"no complete response from {server.url} within 0.5 s (")
    assert "bytes of body received" in result.detail


async def test_loopback_silent_server_is_a_timeout() -> None:
    """A server that accepts but never answers is a `timeout`."""
    with ScriptedServer(always(Reply(body=BODY, headers_pause_seconds=5))) as server:
        result = await lean_fetch(server.url, timeout_seconds=0.3)
    assert isinstance(result, FetchFailed)
    assert result.reason == "timeout"
    assert result.detail == f"no complete response from {server.url} within 0.3 s"


async def test_loopback_gzip_and_multi_member_gzip() -> None:
    """gzip bodies, one member or two, are decoded."""
    half = len(BODY) // 2
    replies = [
        Reply(body=gzip.compress(BODY), headers={"Content-Encoding": "gzip"}),
        Reply(
            body=gzip.compress(BODY[:half]) + gzip.compress(BODY[half:]),
            headers={"Content-Encoding": "gzip"},
        ),
    ]
    with ScriptedServer(in_turn(replies)) as server:
        async with new_scrape_client() as client:
            first = await lean_fetch(server.url, client=client)
            second = await lean_fetch(server.url, client=client)
    assert isinstance(first, Fetched)
    assert isinstance(second, Fetched)
    assert first.body == second.body == BODY


async def test_loopback_gzip_bomb_stops_at_the_decoded_cap() -> None:
    """64 MiB of zeros in under 1 MiB of gzip is `too_large` against a 1 MiB decoded cap."""
    bomb = gzip.compress(b"\0" * (64 * MIB), compresslevel=9)
    assert len(bomb) < MIB
    reply = Reply(body=bomb, headers={"Content-Encoding": "gzip"})
    with ScriptedServer(always(reply)) as server:
        result = await lean_fetch(server.url, max_body_bytes=MIB)
    assert isinstance(result, FetchFailed)
    assert result.reason == "too_large"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"\x1f\x8b\x08\x00garbage-garbage", "corrupt gzip body", id="corrupt"),
        pytest.param(gzip.compress(BODY)[:-20], "truncated gzip body", id="truncated"),
    ],
)
async def test_loopback_broken_gzip_is_a_parse_error(content: bytes, expected: str) -> None:
    """A corrupt or truncated gzip body is a `parse_error` that says which."""
    with ScriptedServer(always(Reply(body=content, headers={"Content-Encoding": "gzip"}))) as s:
        result = await lean_fetch(s.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "parse_error"
    assert expected in result.detail


async def test_loopback_unrequested_encoding_is_a_parse_error() -> None:
    """A body in an encoding that was not asked for (br) is a `parse_error` naming it."""
    with ScriptedServer(always(Reply(body=b"\0\1", headers={"Content-Encoding": "br"}))) as s:
        result = await lean_fetch(s.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "parse_error"
    assert "'br'" in result.detail


async def test_loopback_observe_parses_and_html_is_a_parse_error() -> None:
    """`observe` with the lean client: vLLM text parses; an HTML page is a `parse_error`."""
    html = Reply(body=b"<html><body><h1>404 Not Found</h1></body></html>")
    with ScriptedServer(in_turn([Reply(body=BODY), html])) as server:
        async with new_scrape_client() as client:
            good = await observe(client, server.url, ScrapeLimits(5.0, 16 * MIB))
            bad = await observe(client, server.url, ScrapeLimits(5.0, 16 * MIB))
    assert isinstance(good, Scraped)
    assert EngineKey("tiny-llama", "0") in good.exposition.engines
    assert isinstance(bad, ScrapeFailed)
    assert bad.reason == "parse_error"


async def test_loopback_connection_closed_mid_body() -> None:
    """A server that promises more than it sends and hangs up is a `connect_error`."""
    reply = Reply(body=BODY[:100], content_length=len(BODY), headers={"Connection": "close"})
    with ScriptedServer(always(reply)) as server:
        result = await lean_fetch(server.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert "127.0.0.1" in result.detail
    assert "in the middle of the response" in result.detail


async def test_loopback_environment_proxy_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """An HTTP_PROXY in the environment never carries the scrape of a neighbour."""
    with RefusingPort() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/metrics"))
        monkeypatch.setenv("NO_PROXY", "")
        with ScriptedServer(always(Reply(body=BODY))) as server:
            result = await lean_fetch(server.url)
    assert isinstance(result, Fetched)


async def test_secrets_in_the_url_never_reach_the_detail() -> None:
    """A token in the query is masked in a failure's detail (the lean path builds it too)."""
    with ScriptedServer(always(Reply(status=503, body=b"starting"))) as server:
        result = await lean_fetch(server.url + "?token=hunter2-secret")
    assert isinstance(result, FetchFailed)
    assert "hunter2-secret" not in result.detail
    assert result.detail.startswith("HTTP 503 from ")


# -- keep-alive --------------------------------------------------------------------------


async def test_one_connection_serves_every_scrape() -> None:
    """Back-to-back scrapes reuse one kept-alive connection."""
    async with RawServer(answer_each(ok_response())) as server, new_scrape_client() as client:
        results = [await lean_fetch(server.url, client=client) for _ in range(5)]
        assert client.lean.connections_opened == 1
    assert all(isinstance(r, Fetched) and r.body == BODY for r in results)
    assert server.connections == 1
    assert len(server.requests) == 5


async def test_a_kept_alive_connection_closed_by_the_server_is_replaced() -> None:
    """The server closes the connection after answering: the next scrape opens a new one."""
    async with (
        RawServer(answer_each(ok_response(), then_close=True)) as server,
        new_scrape_client() as client,
    ):
        first = await lean_fetch(server.url, client=client)
        await asyncio.sleep(0.05)  # the close arrives while the connection is idle
        second = await lean_fetch(server.url, client=client)
    assert isinstance(first, Fetched)
    assert isinstance(second, Fetched)
    assert server.connections == 2


async def test_a_request_lost_to_a_keepalive_close_is_sent_again_once() -> None:
    """The server reads the second request on a kept-alive connection and closes without an
    answer (its keep-alive timeout raced the request): the GET is sent again, once, on a
    fresh connection."""

    async def handler(
        server: RawServer, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)
        writer.write(ok_response())
        await writer.drain()
        if index == 0:
            await server.request(reader)  # ... and hang up without answering
            return
        await server.request(reader)

    async with RawServer(handler) as server, new_scrape_client() as client:
        first = await lean_fetch(server.url, client=client)
        second = await lean_fetch(server.url, client=client)
    assert isinstance(first, Fetched)
    assert isinstance(second, Fetched)
    assert second.body == BODY
    assert server.connections == 2
    assert len(server.requests) == 3


async def test_a_fresh_connection_closed_before_the_answer_is_a_connect_error() -> None:
    """No retry on a new connection: a server that hangs up on every request has failed."""

    async def handler(
        server: RawServer, _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)

    async with RawServer(handler) as server:
        result = await lean_fetch(server.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert "before the response" in result.detail
    assert server.connections == 1


@pytest.mark.parametrize(
    "response",
    [
        pytest.param(ok_response(extra=b"Connection: close\r\n"), id="connection-close"),
        pytest.param(b"HTTP/1.0 200 OK\r\n\r\n" + BODY, id="http1.0-until-close"),
    ],
)
async def test_responses_that_end_the_connection(response: bytes) -> None:
    """`Connection: close` and an HTTP/1.0 body read until the close: fine, never reused."""
    async with (
        RawServer(answer_each(response, then_close=True)) as server,
        new_scrape_client() as client,
    ):
        results = [await lean_fetch(server.url, client=client) for _ in range(2)]
    assert all(isinstance(r, Fetched) and r.body == BODY for r in results)
    assert server.connections == 2


async def test_a_body_longer_than_its_content_length_is_cut_and_the_connection_dropped() -> None:
    """Bytes past Content-Length are not the next response: the connection is not reused."""
    response = ok_response(BODY[:1000]).replace(b"Content-Length: 1000", b"Content-Length: 500")
    async with RawServer(answer_each(response)) as server, new_scrape_client() as client:
        first = await lean_fetch(server.url, client=client)
        await asyncio.sleep(0.05)
        second = await lean_fetch(server.url, client=client)
    assert isinstance(first, Fetched)
    assert first.body == BODY[:500]
    assert isinstance(second, Fetched)
    assert server.connections == 2


async def test_a_body_shorter_than_its_content_length_on_an_open_connection_times_out() -> None:
    """A Content-Length the server never fulfils is a `timeout` at the deadline."""
    response = ok_response(BODY[:100]).replace(b"Content-Length: 100", b"Content-Length: 5000")
    async with RawServer(answer_each(response)) as server:
        result = await lean_fetch(server.url, timeout_seconds=0.3)
    assert isinstance(result, FetchFailed)
    assert result.reason == "timeout"
    assert "(100 bytes of body received)" in result.detail


async def test_a_timed_out_connection_is_not_reused() -> None:
    """After a timeout mid-response the next scrape starts on a fresh connection."""

    async def handler(
        server: RawServer, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await server.request(reader)
            if index == 0:
                writer.write(ok_response()[:300])  # headers and a little body, then nothing
                await writer.drain()
                await asyncio.sleep(30)
            writer.write(ok_response())
            await writer.drain()

    async with RawServer(handler) as server, new_scrape_client() as client:
        first = await lean_fetch(server.url, client=client, timeout_seconds=0.3)
        second = await lean_fetch(server.url, client=client)
    assert isinstance(first, FetchFailed)
    assert first.reason == "timeout"
    assert isinstance(second, Fetched)
    assert server.connections == 2


# -- framing -----------------------------------------------------------------------------


def chunked(data: bytes, size: int, *, extension: bytes = b"", trailers: bytes = b"") -> bytes:
    parts = [
        b"%x%s\r\n%s\r\n" % (len(data[i : i + size]), extension, data[i : i + size])
        for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\n" + trailers + b"\r\n"


@pytest.mark.parametrize("gzipped", [False, True], ids=["plain", "gzip"])
async def test_chunked_bodies_are_decoded(gzipped: bool) -> None:
    """Chunked bodies (extensions, trailers) are reassembled, then gzip-decoded; kept alive."""
    payload = gzip.compress(BODY) if gzipped else BODY
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
    head += b"Content-Encoding: gzip\r\n" if gzipped else b""
    body = chunked(payload, 1000, extension=b";name=value", trailers=b"X-Checksum: 1\r\n")
    async with (
        RawServer(answer_each(head + b"\r\n" + body)) as server,
        new_scrape_client() as client,
    ):
        results = [await lean_fetch(server.url, client=client) for _ in range(2)]
    assert all(isinstance(r, Fetched) and r.body == BODY for r in results)
    assert server.connections == 1


async def test_a_chunked_body_is_capped_as_it_arrives() -> None:
    """A chunked body past the cap is `too_large` without reading the rest."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    async with RawServer(answer_each(head + chunked(b"x" * 10_000, 1000))) as server:
        result = await lean_fetch(server.url, max_body_bytes=4096)
    assert isinstance(result, FetchFailed)
    assert result.reason == "too_large"


async def test_interim_responses_are_skipped() -> None:
    """A `100 Continue` before the answer is read past."""
    response = b"HTTP/1.1 100 Continue\r\n\r\n" + ok_response()
    async with RawServer(answer_each(response)) as server:
        result = await lean_fetch(server.url)
    assert isinstance(result, Fetched)
    assert result.body == BODY


@pytest.mark.parametrize(
    ("response", "detail"),
    [
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "malformed status line", id="not-http"),
        pytest.param(b"HTTP/1.1 2OO OK\r\n\r\n", "malformed status line", id="bad-status"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "malformed header line", id="bad-header"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n", "bad Content-Length", id="bad-length"
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
            "bad Content-Length",
            id="two-lengths",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "bad chunk size",
            id="bad-chunk-size",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
            "chunk not followed by CRLF",
            id="chunk-overrun",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "unsupported Transfer-Encoding",
            id="transfer-coding",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n",
            "more than 100 header fields",
            id="too-many-fields",
        ),
    ],
)
async def test_broken_http_is_a_connect_error(response: bytes, detail: str) -> None:
    """What is not HTTP/1.1 is a `connect_error` that says what was wrong, at once."""
    async with RawServer(answer_each(response)) as server:
        result = await lean_fetch(server.url, timeout_seconds=3)
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert detail in result.detail
    assert result.elapsed_seconds < 2


async def test_a_header_flood_is_cut_at_64_kib() -> None:
    """Headers that never end are refused once past 64 KiB, long before the deadline."""

    async def handler(
        server: RawServer, _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        with contextlib.suppress(ConnectionError):
            for _ in range(10_000):
                writer.write(b"X-Flood: " + b"a" * 1000 + b"\r\n")
                await writer.drain()
        await asyncio.sleep(30)

    async with RawServer(handler) as server:
        result = await lean_fetch(server.url, timeout_seconds=5)
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert f"response head over {MAX_HEAD_BYTES} bytes" in result.detail
    assert result.elapsed_seconds < 4


async def test_slow_headers_hit_the_total_deadline() -> None:
    """A status line and headers sent a byte at a time are cut at the deadline."""

    async def handler(
        server: RawServer, _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)
        for byte in ok_response():
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with RawServer(handler) as server:
        result = await lean_fetch(server.url, timeout_seconds=0.4)
    assert isinstance(result, FetchFailed)
    assert result.reason == "timeout"


# -- URLs, credentials, redirects -------------------------------------------------------


def test_the_lean_request_of_a_url() -> None:
    """Host, port, request bytes (basic auth in a header) and TLS for http and https URLs;
    anything else is Unfetchable."""
    tls = ssl.create_default_context()
    client = new_scrape_client(tls)
    v4 = client.lean_request("http://127.0.0.1:8000/metrics")
    v6 = client.lean_request("http://[::1]:8000/metrics")
    default_port = client.lean_request("http://h/m?a=b")
    assert v4[:2] == ("127.0.0.1", 8000)
    assert v4[2].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n")
    assert v4[3] is None
    assert v6[:2] == ("::1", 8000)
    assert b"Host: [::1]:8000\r\n" in v6[2]
    assert default_port[2].startswith(b"GET /m?a=b HTTP/1.1\r\nHost: h\r\n")
    assert client.lean_request("https://vllm.example/metrics")[1:4:2] == (443, tls)
    with_auth = client.lean_request("http://u:p@127.0.0.1:8000/metrics", "Basic dTpw")
    assert with_auth[:2] == ("127.0.0.1", 8000)
    assert b"\r\nAuthorization: Basic dTpw\r\n" in with_auth[2]
    assert b"u:p" not in with_auth[2]
    for bad in ("ftp://h/metrics", "http:///metrics", "http://h:99999/metrics"):
        with pytest.raises(Unfetchable):
            client.lean_request(bad)


async def test_a_url_no_transport_fetches_fails_alike_in_both() -> None:
    """Not http(s): `connect_error` in the same words from the daemon and the probe."""
    url = "ftp://user:hunter2@127.0.0.1/metrics"
    daemon = await lean_fetch(url)
    probe = http_get.fetch(url, timeout_seconds=5, max_body_bytes=MIB)
    assert isinstance(daemon, FetchFailed)
    assert isinstance(probe, FetchFailed)
    assert (daemon.reason, daemon.detail) == (probe.reason, probe.detail)
    assert daemon.reason == "connect_error"
    assert "not an http(s) URL" in daemon.detail
    assert "hunter2" not in daemon.detail


async def test_credentials_in_the_url_are_sent_as_basic_auth_by_the_lean_client() -> None:
    """`http://user:pw@host` is sent with basic auth, lean, and the password never shown."""
    with ScriptedServer(in_turn([Reply(body=BODY), Reply(status=500, body=b"no")])) as server:
        url = server.url.replace("http://", "http://scraper:s3cret-pw@")
        async with new_scrape_client() as client:
            good = await lean_fetch(url, client=client)
            bad = await lean_fetch(url, client=client)
            assert client.lean.connections_opened >= 1
    assert isinstance(good, Fetched)
    assert server.requests[0].headers["Authorization"] == "Basic c2NyYXBlcjpzM2NyZXQtcHc="
    assert server.requests[1].headers["Authorization"] == "Basic c2NyYXBlcjpzM2NyZXQtcHc="
    assert isinstance(bad, FetchFailed)
    assert "s3cret-pw" not in bad.detail


def test_the_credentials_of_a_url_are_read_once_and_kept_within_bounds() -> None:
    """A client reads a URL's credentials once (it scrapes the same URL every interval);
    ever-new URLs (redirects) never grow what it keeps past a bound."""
    client = new_scrape_client()
    assert client.credentials("http://u:p@127.0.0.1:8000/metrics") == "Basic dTpw"
    assert client.credentials("http://u:p@127.0.0.1:8000/metrics") == "Basic dTpw"
    assert client.credentials("http://127.0.0.1:8000/metrics") is None
    for index in range(200):
        assert client.credentials(f"http://u{index}:p@h/metrics") is not None
        assert len(client._credentials) <= 64


async def test_a_redirect_is_followed_by_the_lean_client_on_every_scrape() -> None:
    """A 307 (e.g. to `/metrics/`) is followed each time, as the exec probe follows it."""

    def script(_: int, path: str) -> Reply:
        if path == "/metrics":
            return Reply(status=307, headers={"Location": "/metrics/"})
        return Reply(body=BODY)

    with ScriptedServer(script) as server:
        async with new_scrape_client() as client:
            first = await lean_fetch(server.url, client=client)
            second = await lean_fetch(server.url, client=client)
            assert client.lean.connections_opened >= 1
    assert isinstance(first, Fetched)
    assert isinstance(second, Fetched)
    assert first.body == second.body == BODY
    assert [r.path for r in server.requests] == ["/metrics", "/metrics/"] * 2


@pytest.mark.parametrize("transport", ["daemon", "probe"])
async def test_credentials_follow_a_redirect_to_the_same_origin_and_no_further(
    transport: str,
) -> None:
    """Both transports keep basic auth across a redirect on the same origin and refuse to
    follow one to another origin (another port here), by the same rule."""
    with ScriptedServer(always(Reply(body=BODY))) as other:

        def script(_: int, path: str) -> Reply:
            if path == "/metrics":
                return Reply(status=302, headers={"Location": "/metrics/"})
            return Reply(status=307, headers={"Location": other.url})

        with ScriptedServer(script) as server:
            url = server.url.replace("http://", "http://scraper:pw@")
            if transport == "daemon":
                result = await lean_fetch(url)
            else:
                result = http_get.fetch(url, timeout_seconds=5, max_body_bytes=MIB)
    assert isinstance(result, FetchFailed)
    assert f"off its origin (scheme, host, port) to {other.url}: not followed" in result.detail
    first, same_origin = server.requests
    assert first.headers["Authorization"] == same_origin.headers["Authorization"]
    assert same_origin.path == "/metrics/"
    assert other.requests == []


async def test_a_reset_ends_no_body_delimited_by_the_close() -> None:
    """A body read until the close that ends in a connection reset is broken, not complete."""

    async def handler(
        server: RawServer, _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + BODY[:1000])
        await writer.drain()
        await asyncio.sleep(0.1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN

    async with RawServer(handler) as server:
        result = await lean_fetch(server.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert "in the middle of the response" in result.detail


async def test_a_body_cut_at_the_cap_is_not_kept_alive_by_a_cycle() -> None:
    """With the collector off, five 16 MiB bodies cut at the cap leave nothing behind:
    the body is freed when the fetch returns, not at the next full collection."""
    huge = 200 * 1000 * 1000
    with ScriptedServer(always(Reply(body=zeros(huge), content_length=huge))) as server:
        async with new_scrape_client() as client:
            await lean_fetch(server.url, client=client, max_body_bytes=16 * MIB)  # warm up
            gc.collect()
            gc.disable()
            tracemalloc.start()
            try:
                for _ in range(5):
                    result = await lean_fetch(server.url, client=client, max_body_bytes=16 * MIB)
                    assert isinstance(result, FetchFailed)
                    assert result.reason == "too_large"
                await asyncio.sleep(0.1)  # let the closed transports go
                held, _ = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
                gc.enable()
    assert held < 16 * MIB, f"{held / MIB:.0f} MiB still held"
