"""Tests of webhook notifications against real HTTP servers on 127.0.0.1: retries with
backoff, a hanging receiver, a refused port, a full queue, and the payload.

The retry waits are stamina's; its testing mode (the `no_waits` fixture, on for every test
but the one that checks the waits) makes them zero and keeps the configured attempts."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import stamina
from structlog.testing import capture_logs

from wedgewatch.core.detection.states import NotifyEvent
from wedgewatch.io.notify import (
    Notification,
    NotifyStats,
    WebhookFailure,
    WebhookNotifier,
    _backoff,
    payload,
)

pytestmark = pytest.mark.slow  # every test here runs real HTTP servers


@pytest.fixture(autouse=True)
def no_waits() -> Iterator[None]:
    """stamina's testing mode: no backoff waits; `cap` keeps each notifier's attempt count."""
    with stamina.set_testing(True, attempts=1_000, cap=True):
        yield


@dataclass
class Receiver:
    """What a test server saw, and how it answers the n-th request (0-based)."""

    answer: Callable[[int], int]  # request number -> status; 0 means hang until released
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    received: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        receiver = self.server.receiver
        length = int(self.headers.get("content-length", "0"))
        body = json.loads(self.rfile.read(length))
        with receiver.lock:
            number = len(receiver.bodies)
            receiver.bodies.append(body)
            receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
        receiver.received.set()
        status = receiver.answer(number)
        if status == 0:
            receiver.release.wait(30)
            return  # close without an answer
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, receiver: Receiver) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.receiver = receiver

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up on a hanging answer is expected here."""


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int], int]], Receiver]]:
    """Start real HTTP receivers on 127.0.0.1; all are stopped after the test."""
    servers: list[tuple[_Server, threading.Thread, Receiver]] = []

    def start(answer: Callable[[int], int]) -> Receiver:
        receiver = Receiver(answer)
        server = _Server(receiver)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        host, port = server.server_address[:2]
        receiver.url = f"http://{host!s}:{port}/hook/T0/B0/pathsecret?token=secret"
        servers.append((server, thread, receiver))
        return receiver

    yield start
    for server, thread, receiver in servers:
        receiver.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def refused_url() -> str:
    """A loopback URL where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def _note(n: int = 0, event: str = NotifyEvent.WEDGE_DETECTED) -> Notification:
    return Notification(
        event=event,
        target="vllm-a",
        engine="0",
        model_name="Qwen/Qwen3-8B",
        family="deferred_stall",
        state="wedged",
        reason=f"note {n}",
        timestamp=1_764_670_680.25 + n,
        bundle="/var/lib/wedgewatch/evidence/b1",
    )


def _notifier(urls: list[str], **kwargs: Any) -> WebhookNotifier:
    options: dict[str, Any] = {"timeout_seconds": 2.0, "backoff_seconds": 0.01, "host": "node-7"}
    options.update(kwargs)
    return WebhookNotifier(urls, **options)


async def test_retries_until_the_receiver_accepts(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """A receiver that fails twice then answers 200 gets the notification on the 3rd POST."""
    receiver = serve(lambda n: 500 if n < 2 else 200)
    notifier = _notifier([receiver.url], retries=3, backoff_seconds=60, backoff_max_seconds=60)
    notifier.start()
    notifier.notify(_note())
    with capture_logs() as logs:
        await notifier.aclose(10)  # a minute's backoff, not waited: stamina's testing mode
    assert len(receiver.bodies) == 3
    retries = [entry for entry in logs if entry["event"].startswith("webhook_")]
    assert [(e["event"], e["attempt"], e["error"]) for e in retries] == [
        ("webhook_retry", 1, "HTTP 500"),
        ("webhook_retry", 2, "HTTP 500"),
    ]  # once per failure, and no failure logged for the delivered notification
    assert {e["url"] for e in retries} == {receiver.url.split("/hook/")[0] + "/***"}
    assert "secret" not in repr(logs)  # neither the path's nor the query's secret
    assert not [e for e in logs if e["event"].startswith("stamina")]  # its hooks are ours
    assert notifier.stats.sent == 1
    assert notifier.stats.retried == 2
    assert notifier.stats.failed == 0
    assert receiver.bodies[-1]["reason"] == "note 0"
    assert receiver.headers[-1]["content-type"] == "application/json"
    assert receiver.headers[-1]["user-agent"].startswith("wedgewatch/")


async def test_hanging_receiver_times_out_and_fails(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """Each POST to a receiver that never answers ends at the timeout; then it is a failure."""
    receiver = serve(lambda n: 0)
    failures: list[WebhookFailure] = []
    notifier = _notifier([receiver.url], timeout_seconds=0.3, retries=1, on_failure=failures.append)
    notifier.start()
    notifier.notify(_note())
    await notifier.aclose(10)
    assert len(receiver.bodies) == 2
    assert notifier.stats.failed == 1
    assert len(failures) == 1
    assert failures[0].attempts == 2
    assert "timed out" in failures[0].message
    assert "secret" not in failures[0].url  # neither the path's nor the query's secret
    assert failures[0].url.endswith(":" + failures[0].url.rsplit(":", 1)[1])
    assert failures[0].url.endswith("/***")


async def test_refused_port_fails_after_bounded_retries(refused_url: str) -> None:
    """A refused connection is retried `retries` times, then reported as failed."""
    failures: list[WebhookFailure] = []
    notifier = _notifier([refused_url], retries=2, on_failure=failures.append)
    notifier.start()
    notifier.notify(_note())
    await notifier.aclose(10)
    assert notifier.stats == NotifyStats(sent=0, failed=1, dropped=0, retried=2)
    assert failures[0].attempts == 3
    assert "ConnectError" in failures[0].message


async def test_retry_waits_are_jittered_within_the_plain_doubling(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """Without testing mode the wait before retry k lies in [d/2, d], d = backoff doubled
    k-1 times and capped: never longer than the unjittered schedule, and not fixed."""
    receiver = serve(lambda n: 503 if n < 4 else 200)
    notifier = _notifier([receiver.url], retries=4, backoff_seconds=0.02, backoff_max_seconds=0.05)
    notifier.start()
    notifier.notify(_note())
    with stamina.set_testing(False), capture_logs() as logs:  # real waits, 0.16 s at most
        await notifier.aclose(10)
    assert len(receiver.bodies) == 5
    waits = [e["retry_in_seconds"] for e in logs if e["event"] == "webhook_retry"]
    plain = [0.02, 0.04, 0.05, 0.05]  # 0.02 doubling, capped at 0.05
    assert len(waits) == len(plain)
    for wait, longest in zip(waits, plain, strict=True):
        assert longest / 2 <= wait <= longest, (waits, plain)
    # Uncapped, stamina adds uniform(0, 0.01) to 0.01 * 2**(k-1): the chance that the
    # first two waits both land on their jitter-free values at 4 decimals is 1 in 10^4.
    assert waits[:2] != [0.01, 0.02], waits
    assert notifier.stats == NotifyStats(sent=1, failed=0, dropped=0, retried=4)


@pytest.mark.parametrize(
    ("initial", "maximum"), [(1.0, 30.0), (0.5, 0.5), (0.0, 0.0), (2.0, 7.0), (3.0, 1e9)]
)
def test_the_backoff_arguments_keep_every_wait_within_the_plain_doubling(
    initial: float, maximum: float
) -> None:
    """stamina's formula with `_backoff`'s arguments, at both ends of the jitter, stays in
    [d/2, d] for the first 40 retries (d = `initial` doubled k-1 times, capped)."""
    args = _backoff(initial, maximum)
    for k in range(1, 41):
        plain = min(initial * 2.0 ** (k - 1), maximum)
        for jitter in (0.0, args["wait_jitter"]):
            wait = min(args["wait_max"], args["wait_initial"] * 2.0 ** (k - 1) + jitter)
            assert plain / 2 <= wait <= plain, (k, jitter, wait, plain)


async def test_client_errors_are_not_retried(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """A 4xx answer (other than 429) will not change on retry: one attempt, then failed."""
    receiver = serve(lambda n: 404)
    failures: list[WebhookFailure] = []
    notifier = _notifier([receiver.url], retries=3, on_failure=failures.append)
    notifier.start()
    notifier.notify(_note())
    await notifier.aclose(10)
    assert len(receiver.bodies) == 1
    assert failures[0].message == "HTTP 404 (not retried)"


async def test_full_queue_drops_the_oldest(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """With the queue full, the oldest waiting notification makes room and is counted."""
    receiver = serve(lambda n: 200)
    notifier = _notifier([receiver.url], queue_size=2)
    for n in range(5):
        notifier.notify(_note(n))  # returns at once, even before any worker runs
    assert notifier.stats.dropped == 3
    notifier.start()
    await notifier.aclose(10)
    assert [b["reason"] for b in receiver.bodies] == ["note 3", "note 4"]
    assert notifier.stats.sent == 2


async def test_a_hanging_receiver_does_not_delay_another(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """Each URL has its own worker: one that hangs does not hold up the others."""
    hanging = serve(lambda n: 0)
    healthy = serve(lambda n: 200)
    notifier = _notifier([hanging.url, healthy.url], timeout_seconds=30, retries=0)
    notifier.start()
    notifier.notify(_note())
    assert await asyncio.to_thread(healthy.received.wait, 10)
    assert await asyncio.to_thread(hanging.received.wait, 10)
    assert not hanging.release.is_set()  # the hanging POST is still in flight
    await notifier.aclose(0.2)
    assert len(healthy.bodies) == 1
    assert notifier.stats.sent == 1


async def test_aclose_is_bounded_by_its_timeout(
    serve: Callable[[Callable[[int], int]], Receiver],
) -> None:
    """Shutting down with a receiver that hangs returns after the drain timeout."""
    receiver = serve(lambda n: 0)
    notifier = _notifier([receiver.url], timeout_seconds=60, retries=5)
    notifier.start()
    notifier.notify(_note())
    assert await asyncio.to_thread(receiver.received.wait, 10)
    await asyncio.wait_for(notifier.aclose(0.1), timeout=30)
    assert notifier.stats.sent == 0


def test_payload_fields() -> None:
    """The payload has every documented field, an ISO 8601 UTC timestamp and a summary."""
    body = payload(_note(), version="1.2.3", host="node-7")
    assert body == {
        "event": "wedge_detected",
        "target": "vllm-a",
        "engine": "0",
        "model_name": "Qwen/Qwen3-8B",
        "family": "deferred_stall",
        "state": "wedged",
        "reason": "note 0",
        "bundle": "/var/lib/wedgewatch/evidence/b1",
        "wedgewatch_version": "1.2.3",
        "host": "node-7",
        "timestamp": "2025-12-02T10:18:00.250Z",
        "text": "wedgewatch on node-7: wedge_detected for vllm-a (Qwen/Qwen3-8B engine 0), "
        "deferred_stall: note 0 [evidence: /var/lib/wedgewatch/evidence/b1]",
    }
    json.dumps(body)


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("ftp://example.org/x", id="scheme"),
        pytest.param("hooks.example.org/x", id="no-scheme"),
        pytest.param("http:///x", id="no-host"),
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    """A webhook URL that is not http(s) with a host is a configuration error."""
    with pytest.raises(ValueError, match="http:// or https://"):
        WebhookNotifier([url])


def test_the_docs_name_exactly_the_events_sent() -> None:
    """docs/remedies.md lists every event sent to webhooks (NotifyEvent), and no other."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "remedies.md").read_text()
    paragraph = text.split("Webhooks (`webhook_urls`)")[1].split("(routine events")[0]
    assert set(re.findall(r"`(\w+)`", paragraph)) == {str(event) for event in NotifyEvent}
