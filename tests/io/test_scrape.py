"""Scraping /metrics: bounded in time and size, gzip decoded safely, failures as data."""

from __future__ import annotations

import functools
import gzip
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from scripted_http import RefusingPort, Reply, ScriptedServer, always, zeros

from wedgewatch.core.detection.detect import Scraped, ScrapeFailed
from wedgewatch.io.scrape import fetch, new_client, observe
from wedgewatch.io.scrape_rules import REQUEST_HEADERS, Fetched, FetchFailed, ScrapeLimits
from wedgewatch.vllm.signals import EngineKey

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
BODY = FIXTURE.read_bytes()
MIB = 1024 * 1024
URL = "http://vllm.test:8000/metrics"


class ChunkStream(httpx.AsyncByteStream):
    """A response body that arrives in chunks, as from a socket (not pre-read by httpx)."""

    def __init__(self, data: bytes, chunk_bytes: int = 64 * 1024) -> None:
        self._data = data
        self._chunk_bytes = chunk_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for start in range(0, len(self._data), self._chunk_bytes):
            yield self._data[start : start + self._chunk_bytes]


def streamed(status: int, data: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    """A response whose body is streamed, like one from a real connection."""
    return httpx.Response(status, headers=headers, stream=ChunkStream(data))


def mock_client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def fetch_with(
    handler: Callable[[httpx.Request], httpx.Response],
    *,
    timeout_seconds: float = 5.0,
    max_body_bytes: int = 16 * MIB,
) -> Fetched | FetchFailed:
    async with mock_client(handler) as client:
        return await fetch(
            client, URL, timeout_seconds=timeout_seconds, max_body_bytes=max_body_bytes
        )


@functools.cache
def gzip_stream(total_zero_bytes: int) -> bytes:
    """gzip of `total_zero_bytes` zero bytes, compressed chunk by chunk (never held decoded)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b"\0" * MIB
    parts = [compressor.compress(block) for _ in range(total_zero_bytes // MIB)]
    parts.append(compressor.flush())
    return b"".join(parts)


# -- unit tests on httpx.MockTransport ------------------------------------------------------


async def test_ok_body_is_returned_with_status_and_content_type() -> None:
    """A 200 response yields the exact body, its status and content type."""
    result = await fetch_with(lambda _: streamed(200, BODY, {"Content-Type": "text/plain"}))
    assert isinstance(result, Fetched)
    assert result.body == BODY
    assert result.status == 200
    assert result.content_type == "text/plain"


async def test_request_asks_for_plain_text_and_gzip_only() -> None:
    """The request accepts plain text (never OpenMetrics) and gzip, nothing else."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return streamed(200, BODY)

    await fetch_with(handler)
    headers = seen[0].headers
    assert headers["accept-encoding"] == "gzip"
    assert "openmetrics" not in headers["accept"]
    assert headers["accept"].startswith("text/plain")
    assert headers["user-agent"].startswith("wedgewatch/")


async def test_http_error_status_is_http_status_with_a_bounded_snippet() -> None:
    """A 500 is `http_status`; the detail names the status, the URL and at most 200 chars."""
    result = await fetch_with(lambda _: streamed(500, b"boom " * 200))
    assert isinstance(result, FetchFailed)
    assert result.reason == "http_status"
    assert result.detail.startswith(f"HTTP 500 from {URL}: boom boom")
    assert len(result.detail) < 300
    assert "\n" not in result.detail


async def test_body_over_the_cap_is_too_large() -> None:
    """A body one byte over the cap is `too_large`, naming the cap."""
    result = await fetch_with(lambda _: streamed(200, b"x" * 4097), max_body_bytes=4096)
    assert isinstance(result, FetchFailed)
    assert result.reason == "too_large"
    assert result.detail == f"body from {URL} exceeded 4096 bytes"


async def test_in_memory_responses_are_read_and_capped() -> None:
    """A response httpx already holds in memory (MockTransport content=) is used, and capped."""
    ok = await fetch_with(lambda _: httpx.Response(200, content=BODY))
    assert isinstance(ok, Fetched)
    assert ok.body == BODY
    big = await fetch_with(lambda _: httpx.Response(200, content=b"x" * 5000), max_body_bytes=4096)
    assert isinstance(big, FetchFailed)
    assert big.reason == "too_large"


async def test_body_exactly_at_the_cap_is_read() -> None:
    """A body of exactly the cap is still fine."""
    result = await fetch_with(lambda _: streamed(200, b"x" * 4096), max_body_bytes=4096)
    assert isinstance(result, Fetched)
    assert len(result.body) == 4096


async def test_gzip_body_is_decoded() -> None:
    """A gzip-encoded body comes back decoded."""
    result = await fetch_with(
        lambda _: streamed(200, gzip.compress(BODY), {"Content-Encoding": "gzip"})
    )
    assert isinstance(result, Fetched)
    assert result.body == BODY


async def test_multi_member_gzip_is_decoded_whole() -> None:
    """Two gzip members back to back decode to both halves."""
    half = len(BODY) // 2
    content = gzip.compress(BODY[:half]) + gzip.compress(BODY[half:])
    result = await fetch_with(lambda _: streamed(200, content, {"Content-Encoding": "gzip"}))
    assert isinstance(result, Fetched)
    assert result.body == BODY


async def test_gzip_bomb_is_cut_at_the_decoded_cap() -> None:
    """64 MiB of zeros in a 64 KB gzip body is `too_large` against a 1 MiB cap."""
    bomb = gzip_stream(64 * MIB)
    assert len(bomb) < MIB
    result = await fetch_with(
        lambda _: streamed(200, bomb, {"Content-Encoding": "gzip"}),
        max_body_bytes=MIB,
    )
    assert isinstance(result, FetchFailed)
    assert result.reason == "too_large"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"\x1f\x8b\x08\x00garbage-garbage", "corrupt gzip body", id="corrupt"),
        pytest.param(gzip.compress(BODY)[:-20], "truncated gzip body", id="truncated"),
    ],
)
async def test_broken_gzip_is_a_parse_error(content: bytes, expected: str) -> None:
    """A corrupt or truncated gzip body is a `parse_error` that says which."""
    result = await fetch_with(lambda _: streamed(200, content, {"Content-Encoding": "gzip"}))
    assert isinstance(result, FetchFailed)
    assert result.reason == "parse_error"
    assert expected in result.detail


async def test_unrequested_content_encoding_is_a_parse_error() -> None:
    """A body in an encoding that was not asked for (br) is a `parse_error` naming it."""
    result = await fetch_with(lambda _: streamed(200, b"\x00\x01", {"Content-Encoding": "br"}))
    assert isinstance(result, FetchFailed)
    assert result.reason == "parse_error"
    assert "'br'" in result.detail


def _raiser(exc: Exception) -> Callable[[httpx.Request], httpx.Response]:
    def handler(_: httpx.Request) -> httpx.Response:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("exc", "reason", "detail"),
    [
        pytest.param(
            httpx.ConnectError("[Errno 111] Connection refused"),
            "refused",
            "connection refused by vllm.test:8000",
            id="refused",
        ),
        pytest.param(
            httpx.ConnectError("[Errno -2] Name or service not known"),
            "connect_error",
            "cannot connect to vllm.test:8000: [Errno -2] Name or service not known",
            id="dns",
        ),
        pytest.param(
            httpx.ReadTimeout("timed out"),
            "timeout",
            f"no complete response from {URL} within 5 s",
            id="read-timeout",
        ),
        pytest.param(
            httpx.RemoteProtocolError("peer closed connection without sending complete body"),
            "connect_error",
            "RemoteProtocolError from vllm.test:8000: peer closed connection",
            id="broken-response",
        ),
    ],
)
async def test_transport_errors_become_failure_reasons(
    exc: Exception, reason: str, detail: str
) -> None:
    """Each transport error maps to its reason with a one-line detail."""
    result = await fetch_with(_raiser(exc))
    assert isinstance(result, FetchFailed)
    assert result.reason == reason
    assert result.detail.startswith(detail)


async def test_observe_stamps_the_start_of_the_scrape_and_parses() -> None:
    """`observe` returns Scraped stamped with the clock reading taken before the fetch."""
    readings = iter([100.0, 104.0, 105.0, 106.0])
    async with mock_client(lambda _: streamed(200, BODY)) as client:
        observation = await observe(
            client, URL, ScrapeLimits(5.0, 16 * MIB), clock=lambda: next(readings)
        )
    assert isinstance(observation, Scraped)
    assert observation.at == 100.0
    reading = observation.exposition.engines[EngineKey("tiny-llama", "0")]
    assert reading.running == 4.0


async def test_observe_turns_a_non_vllm_body_into_a_parse_error() -> None:
    """An HTML page is a ScrapeFailed with reason `parse_error` naming the URL."""
    html = b"<!doctype html><html><body>It works!</body></html>"
    async with mock_client(lambda _: streamed(200, html)) as client:
        observation = await observe(client, URL, ScrapeLimits(5.0, 16 * MIB))
    assert isinstance(observation, ScrapeFailed)
    assert observation.reason == "parse_error"
    assert observation.detail.startswith(URL)


async def test_observe_passes_fetch_failures_through() -> None:
    """A failed fetch becomes a ScrapeFailed with the same reason and detail."""
    async with mock_client(lambda _: streamed(503, b"starting")) as client:
        observation = await observe(client, URL, ScrapeLimits(5.0, 16 * MIB))
    assert isinstance(observation, ScrapeFailed)
    assert observation.reason == "http_status"
    assert observation.detail == f"HTTP 503 from {URL}: starting"


def test_request_headers_never_ask_for_openmetrics() -> None:
    """The module-level headers pin the plain-text format."""
    assert "openmetrics" not in REQUEST_HEADERS["Accept"]


# -- real HTTP servers on 127.0.0.1 ---------------------------------------------------------


async def real_fetch(
    url: str, *, timeout_seconds: float = 5.0, max_body_bytes: int = 16 * MIB
) -> Fetched | FetchFailed:
    async with new_client() as client:
        return await fetch(
            client, url, timeout_seconds=timeout_seconds, max_body_bytes=max_body_bytes
        )


@pytest.mark.slow
async def test_loopback_ok() -> None:
    """A real server's body arrives intact."""
    with ScriptedServer(always(Reply(body=BODY))) as server:
        result = await real_fetch(server.url)
    assert isinstance(result, Fetched)
    assert result.body == BODY


@pytest.mark.slow
async def test_loopback_refused_port() -> None:
    """A port nobody listens on is `refused`, naming host and port."""
    with RefusingPort() as port:
        result = await real_fetch(port.url)
        assert isinstance(result, FetchFailed)
        assert result.reason == "refused"
        assert result.detail == f"connection refused by 127.0.0.1:{port.sock.getsockname()[1]}"


@pytest.mark.slow
async def test_loopback_http_500() -> None:
    """A real 500 is `http_status` with the start of its body."""
    reply = Reply(status=500, body=b"Internal Server Error", headers={"Content-Type": "text/plain"})
    with ScriptedServer(always(reply)) as server:
        result = await real_fetch(server.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "http_status"
    assert result.detail == f"HTTP 500 from {server.url}: Internal Server Error"


@pytest.mark.slow
async def test_loopback_huge_body_is_cut_at_the_cap() -> None:
    """A 200 MB body, generated lazily, is `too_large`; the server sends far less than 200 MB."""
    huge = 200 * 1000 * 1000
    reply = Reply(body=zeros(huge), content_length=huge)
    with ScriptedServer(always(reply)) as server:
        result = await real_fetch(server.url, max_body_bytes=16 * MIB)
        assert isinstance(result, FetchFailed)
        assert result.reason == "too_large"
        assert result.detail == f"body from {server.url} exceeded {16 * MIB} bytes"
    assert server.bytes_sent[0] < 64 * MIB


@pytest.mark.slow
async def test_loopback_trickling_body_hits_the_total_deadline() -> None:
    """A body that keeps arriving, a little at a time, is cut at the total deadline."""

    def trickle() -> Iterator[bytes]:
        yield from BODY.splitlines(keepends=True)

    reply = Reply(body=trickle(), content_length=len(BODY), chunk_pause_seconds=0.05)
    with ScriptedServer(always(reply)) as server:
        result = await real_fetch(server.url, timeout_seconds=0.5)
    assert isinstance(result, FetchFailed)
    assert result.reason == "timeout"
    assert result.detail.startswith(f"no complete response from {server.url} within 0.5 s (")
    assert "bytes of body received" in result.detail


@pytest.mark.slow
async def test_loopback_silent_server_is_a_timeout() -> None:
    """A server that accepts but never answers is a `timeout`."""
    with ScriptedServer(always(Reply(body=BODY, headers_pause_seconds=5))) as server:
        result = await real_fetch(server.url, timeout_seconds=0.3)
    assert isinstance(result, FetchFailed)
    assert result.reason == "timeout"


@pytest.mark.slow
async def test_loopback_gzip() -> None:
    """A gzip-encoded body from a real server is decoded."""
    reply = Reply(body=gzip.compress(BODY), headers={"Content-Encoding": "gzip"})
    with ScriptedServer(always(reply)) as server:
        result = await real_fetch(server.url)
    assert isinstance(result, Fetched)
    assert result.body == BODY


@pytest.mark.slow
async def test_loopback_gzip_bomb_stops_reading() -> None:
    """A gzip bomb from a real server is `too_large` against the decoded cap."""
    reply = Reply(body=gzip_stream(64 * MIB), headers={"Content-Encoding": "gzip"})
    with ScriptedServer(always(reply)) as server:
        result = await real_fetch(server.url, max_body_bytes=MIB)
    assert isinstance(result, FetchFailed)
    assert result.reason == "too_large"


@pytest.mark.slow
async def test_loopback_wrong_content_type_with_vllm_text_is_fine() -> None:
    """The content type is not trusted either way: vLLM text labelled JSON still parses."""
    reply = Reply(body=BODY, headers={"Content-Type": "application/json"})
    with ScriptedServer(always(reply)) as server:
        async with new_client() as client:
            observation = await observe(client, server.url, ScrapeLimits(5.0, 16 * MIB))
    assert isinstance(observation, Scraped)
    assert EngineKey("tiny-llama", "0") in observation.exposition.engines


@pytest.mark.slow
async def test_loopback_html_is_a_parse_error() -> None:
    """An HTML page served as text/html is a `parse_error` observation."""
    reply = Reply(body=b"<html><body><h1>404 Not Found</h1></body></html>")
    with ScriptedServer(always(reply)) as server:
        async with new_client() as client:
            observation = await observe(client, server.url, ScrapeLimits(5.0, 16 * MIB))
    assert isinstance(observation, ScrapeFailed)
    assert observation.reason == "parse_error"


@pytest.mark.slow
async def test_loopback_connection_closed_mid_body() -> None:
    """A server that promises more than it sends and hangs up is a `connect_error`."""
    reply = Reply(body=BODY[:100], content_length=len(BODY), headers={"Connection": "close"})
    with ScriptedServer(always(reply)) as server:
        result = await real_fetch(server.url)
    assert isinstance(result, FetchFailed)
    assert result.reason == "connect_error"
    assert "127.0.0.1" in result.detail


@pytest.mark.slow
async def test_loopback_environment_proxy_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """An HTTP_PROXY in the environment never carries the scrape of a neighbour."""
    with RefusingPort() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/metrics"))
        monkeypatch.setenv("NO_PROXY", "")
        with ScriptedServer(always(Reply(body=BODY))) as server:
            result = await real_fetch(server.url)
    assert isinstance(result, Fetched)
