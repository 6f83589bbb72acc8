"""The exec probe's blocking scrape: the same answers and failures as the daemon's, in time.

Every case runs against a real server on 127.0.0.1, through `io.http_get` and through the
daemon's asynchronous transport (`io.scrape`), with its lean client (`ScrapeClient`, what
the daemon scrapes with) and with a plain httpx client: all must return the same body, or
fail for the same closed-set reason in the same words (`io.scrape_rules.Failures`).
"""

from __future__ import annotations

import gzip
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_http import RefusingPort, Reply, Script, ScriptedServer, always, zeros
from test_scrape import gzip_stream  # the same bomb as the daemon's transport is tested with

from wedgewatch.core.detection.detect import Scraped, ScrapeFailed
from wedgewatch.io import http_get, scrape
from wedgewatch.io.scrape_rules import REQUEST_HEADERS, Fetched, FetchFailed, ScrapeLimits
from wedgewatch.vllm.signals import EngineKey

BODY = (Path(__file__).parents[1] / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom").read_bytes()
MIB = 1024 * 1024


def blocking(url: str, timeout_seconds: float = 5.0, max_body_bytes: int = 16 * MIB) -> object:
    return http_get.fetch(url, timeout_seconds=timeout_seconds, max_body_bytes=max_body_bytes)


async def asynchronous(
    url: str, timeout_seconds: float = 5.0, max_body_bytes: int = 16 * MIB, *, lean: bool = False
) -> object:
    """The daemon's fetch, with its own client (`lean`) or with a plain httpx client."""
    client = scrape.new_scrape_client() if lean else scrape.new_client()
    async with client:
        return await scrape.fetch(
            client, url, timeout_seconds=timeout_seconds, max_body_bytes=max_body_bytes
        )


def outcome(result: object) -> tuple[str, object]:
    """What a caller sees of a fetch: ("body", bytes) or (reason, detail)."""
    if isinstance(result, Fetched):
        return "body", result.body
    assert isinstance(result, FetchFailed), result
    return result.reason, result.detail


def trickle() -> Iterator[bytes]:
    yield from BODY.splitlines(keepends=True)


def redirect_to(target: str, then: Reply) -> Script:
    """`/metrics` redirects to `target`; every other path gets `then`."""
    return lambda _n, path: (
        Reply(status=307, headers={"Location": target}) if path == "/metrics" else then
    )


CASES = {
    "ok": always(Reply(body=BODY, headers={"Content-Type": "text/plain"})),
    "close-delimited": always(Reply(body=[BODY[:1000], BODY[1000:]])),
    "gzip": always(Reply(body=gzip.compress(BODY), headers={"Content-Encoding": "gzip"})),
    "gzip-two-members": always(
        Reply(
            body=gzip.compress(BODY[:500]) + gzip.compress(BODY[500:]),
            headers={"Content-Encoding": "gzip"},
        )
    ),
    "http-500": always(Reply(status=500, body=b"Internal Server Error\nsecond line")),
    "http-404-empty": always(Reply(status=404)),
    "redirect": redirect_to("/metrics/", Reply(body=BODY)),
    "redirect-loop": always(Reply(status=307, headers={"Location": "/metrics"})),
    "too-large": always(Reply(body=b"x" * (MIB + 1))),
    "huge-lazy-body": always(Reply(body=zeros(200 * 1000 * 1000), content_length=200_000_000)),
    "gzip-bomb": always(Reply(body=gzip_stream(64 * MIB), headers={"Content-Encoding": "gzip"})),
    "corrupt-gzip": always(
        Reply(body=b"\x1f\x8b\x08\x00garbage-garbage", headers={"Content-Encoding": "gzip"})
    ),
    "truncated-gzip": always(
        Reply(body=gzip.compress(BODY)[:-20], headers={"Content-Encoding": "gzip"})
    ),
    "brotli": always(Reply(body=b"\x00\x01", headers={"Content-Encoding": "br"})),
    "trickle": always(Reply(body=trickle(), content_length=len(BODY), chunk_pause_seconds=0.05)),
    "silent": always(Reply(body=BODY, headers_pause_seconds=5)),
}


SLOW_CASES = {"huge-lazy-body", "gzip-bomb", "trickle", "silent"}  # each takes a second or so


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW_CASES else []) for c in sorted(CASES)],
    ids=str,
)
async def test_blocking_and_asynchronous_scrapes_agree(case: str) -> None:
    """A body, or the same reason in the same words, from both transports."""
    with ScriptedServer(CASES[case]) as server:
        # A short deadline where it is the point; elsewhere one that a loaded machine
        # cannot miss (21 requests of a redirect loop took over 0.5 s under load).
        timeout = 0.5 if case in ("trickle", "silent") else 10.0
        limits = {"timeout_seconds": timeout, "max_body_bytes": MIB}
        expected = outcome(await asynchronous(server.url, **limits))
        daemon = outcome(await asynchronous(server.url, **limits, lean=True))
        started = time.monotonic()
        got = outcome(blocking(server.url, **limits))
        took = time.monotonic() - started
    if case in ("trickle", "silent"):
        assert got[0] == daemon[0] == "timeout"
        assert took < 2.0  # the total deadline holds; generous for a loaded machine
        # How much of a trickle arrives before the deadline differs from run to run.
        words = {str(r[1]).split(" (")[0] for r in (got, expected, daemon)}
        assert len(words) == 1, words
    else:
        assert got == expected == daemon
    if case in ("ok", "close-delimited", "gzip", "gzip-two-members", "redirect"):
        assert got == ("body", BODY)


async def test_a_refused_port_is_refused_by_both() -> None:
    """Nobody listening: `refused`, naming host and port, from both transports."""
    with RefusingPort() as port:
        number = port.sock.getsockname()[1]
        got = outcome(blocking(port.url))
        assert got == outcome(await asynchronous(port.url))
    assert got == ("refused", f"connection refused by 127.0.0.1:{number}")


class RawServer:
    """A loopback server that answers every connection with the same raw bytes, then closes."""

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port: int = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request and (part := conn.recv(65536)):
                    request += part
                self.requests.append(request)
                conn.sendall(self.response)

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def chunked(body: bytes, size: int = 1000) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


RAW_CASES = {
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(BODY),
    "chunked-gzip": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
    b"Content-Encoding: gzip\r\n\r\n" + chunked(gzip.compress(BODY)),
    "closed-mid-body": b"HTTP/1.1 200 OK\r\nContent-Length: 99999\r\n\r\n" + BODY[:100],
    "chunked-cut": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(BODY)[:3000],
    "not-http": b"SSH-2.0-OpenSSH_9.6\r\n",
    "informational-first": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
    "close-without-answer": b"",
    "header-without-colon": b"HTTP/1.1 200 OK\r\nContent-Length 2\r\n\r\nok",
}
WHOLE = {"chunked", "chunked-gzip", "informational-first"}


@pytest.mark.parametrize("case", sorted(RAW_CASES), ids=str)
async def test_raw_responses_are_read_or_failed_like_the_daemon_does(case: str) -> None:
    """Chunked bodies are read, 1xx skipped; broken HTTP is `connect_error` from both."""
    with RawServer(RAW_CASES[case]) as server:
        expected = outcome(await asynchronous(server.url))
        daemon = outcome(await asynchronous(server.url, lean=True))
        got = outcome(blocking(server.url))
    assert got == daemon  # one parser, one set of rules: the same words
    if case in WHOLE:
        assert got == expected == ("body", BODY)
    else:  # httpx's detail names its own exception
        assert got[0] == expected[0] == "connect_error"
        assert f"from 127.0.0.1:{server.port}: " in str(got[1])


def test_the_request_is_the_daemons_request() -> None:
    """GET with the shared headers, basic auth from the URL, never a proxy, one connection."""
    with RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") as server:
        url = server.url.replace("http://", "http://user:s%40cret@")
        result = http_get.fetch(url, timeout_seconds=5, max_body_bytes=MIB)
    assert isinstance(result, Fetched)
    (request,) = server.requests
    head = request.decode().split("\r\n")
    assert head[0] == "GET /metrics HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in head[1:] if line)
    assert headers["Accept"] == REQUEST_HEADERS["Accept"]
    assert headers["Accept-Encoding"] == "gzip"
    assert headers["User-Agent"].startswith("wedgewatch/")
    assert headers["Authorization"] == "Basic dXNlcjpzQGNyZXQ="  # user:s@cret
    assert headers["Host"] == f"127.0.0.1:{server.port}"


def test_failure_details_never_show_the_password() -> None:
    """A failure detail names the URL with its credentials masked."""
    reply = Reply(status=503, body=b"starting")
    with ScriptedServer(always(reply)) as server:
        url = server.url.replace("http://", "http://user:hunter2@")
        result = http_get.fetch(url, timeout_seconds=5, max_body_bytes=MIB)
    assert isinstance(result, FetchFailed)
    assert result.reason == "http_status"
    assert "hunter2" not in result.detail
    assert result.detail.endswith(": starting")


def test_observe_stamps_the_start_and_parses() -> None:
    """`observe` parses the body, stamped with the clock before the fetch; failures pass through."""
    readings = iter([100.0, 104.0, 105.0, 106.0])
    with ScriptedServer(always(Reply(body=BODY))) as server:
        observation = http_get.observe(
            server.url, ScrapeLimits(5.0, 16 * MIB), clock=lambda: next(readings)
        )
        capped = http_get.observe(server.url, ScrapeLimits(5.0, 10))
    assert isinstance(observation, Scraped)
    assert observation.at == 100.0
    assert observation.exposition.engines[EngineKey("tiny-llama", "0")].running == 4.0
    assert isinstance(capped, ScrapeFailed)
    assert capped.reason == "too_large"


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh self-signed certificate for localhost and 127.0.0.1: (key, cert) files."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return key, cert


@pytest.fixture
def self_signed(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    """A server-side TLS context with the fresh self-signed certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certificate[1], certificate[0])
    return context


async def test_the_daemon_scrapes_https_over_one_kept_alive_connection(
    certificate: tuple[Path, Path], self_signed: ssl.SSLContext
) -> None:
    """https with a trusted certificate: the body, twice, over one TLS connection."""
    server = ScriptedServer(always(Reply(body=BODY)))
    server._httpd.socket = self_signed.wrap_socket(server._httpd.socket, server_side=True)
    trusted = ssl.create_default_context(cafile=certificate[1])
    with server:
        url = server.url.replace("http://", "https://")
        async with scrape.new_scrape_client(trusted) as client:
            for _ in range(2):
                result = await scrape.fetch(client, url, timeout_seconds=5, max_body_bytes=MIB)
                assert outcome(result) == ("body", BODY)
            assert client.lean.connections_opened == 1


async def test_an_untrusted_certificate_fails_alike(self_signed: ssl.SSLContext) -> None:
    """https to a self-signed server: `connect_error` naming the verification, from both."""
    server = ScriptedServer(always(Reply(body=BODY)))
    server._httpd.socket = self_signed.wrap_socket(server._httpd.socket, server_side=True)
    with server:
        url = server.url.replace("http://", "https://")
        expected = outcome(await asynchronous(url))
        got = outcome(blocking(url))
    assert got == expected
    assert got[0] == "connect_error"
    assert "CERTIFICATE_VERIFY_FAILED" in str(got[1])


async def test_a_redirect_to_https_is_refused_alike(self_signed: ssl.SSLContext) -> None:
    """http redirecting to https (another scheme and port: another origin): the lean client
    and the probe both refuse to follow it, in the same words, and no TLS leg is tried."""
    secure = ScriptedServer(always(Reply(body=BODY)))
    secure._httpd.socket = self_signed.wrap_socket(secure._httpd.socket, server_side=True)
    with secure:
        target = secure.url.replace("http://", "https://")
        with ScriptedServer(always(Reply(status=301, headers={"Location": target}))) as plain:
            daemon = outcome(await asynchronous(plain.url, lean=True))
            got = outcome(blocking(plain.url))
    assert got == daemon
    assert got[0] == "http_status"
    assert f"to {target}: not followed" in str(got[1])
    assert len(plain.requests) == 2  # one each; no https leg
    assert secure.requests == []


async def test_a_path_with_spaces_and_non_ascii_is_requested_like_the_daemon_does() -> None:
    """The request target is percent-encoded the way httpx encodes it."""
    with ScriptedServer(always(Reply(body=BODY))) as server:
        url = server.base_url + "/vllm metrics/ü?name=a b"
        await asynchronous(url)
        assert outcome(await asynchronous(url, lean=True)) == ("body", BODY)
        assert outcome(blocking(url)) == ("body", BODY)
    httpxs, leans, probes = (request.path for request in server.requests)
    assert probes == leans == httpxs == "/vllm%20metrics/%C3%BC?name=a%20b"
