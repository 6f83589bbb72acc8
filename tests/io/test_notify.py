"""Tests of webhook notifications against real HTTP servers on 127.0.0.1: retries with
backoff, a hanging receiver, a refused port, a full queue, and the payload."""

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

from wedgewatch.core.states import NotifyEvent
from wedgewatch.io.notify import (
    Notification,
    NotifyStats,
    WebhookFailure,
    WebhookNotifier,
    payload,
)

pytestmark = pytest.mark.slow  # every test here runs real HTTP servers


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
    notifier = _notifier([receiver.url], retries=3)
    notifier.start()
    notifier.notify(_note())
    await notifier.aclose(10)
    assert len(receiver.bodies) == 3
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
