"""The abort cure's HTTP call (`io.abort`) against a loopback server that records it."""

from __future__ import annotations

import pytest
from scripted_http import Reply, ScriptedServer, always

from wedgewatch.io.abort import abort_url, aborted_count, new_abort_client, send_abort


async def _send(server: ScriptedServer) -> tuple[bool, str, int | None]:
    async with new_abort_client() as client:
        result = await send_abort(client, server.url, timeout_seconds=5.0)
    return result.ok, result.detail, result.aborted


async def test_posts_an_empty_json_object_and_reads_the_count() -> None:
    """POST /abort_requests with body `{}` and Content-Type application/json; 200 -> ok with
    vLLM's count (without the body vLLM answers 400 and aborts nothing)."""
    with ScriptedServer(always(Reply(200, b'{"status": "aborted", "aborted": 3}'))) as server:
        ok, detail, aborted = await _send(server)
    assert (ok, aborted) == (True, 3)
    assert "3 request(s) aborted" in detail
    (request,) = server.requests
    assert request.path == "/abort_requests"
    assert request.body == b"{}"
    assert request.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    ("status", "said"),
    [(404, "VLLM_SERVER_DEV_MODE=1"), (400, "Invalid JSON"), (500, "HTTP 500")],
)
async def test_an_error_answer_is_a_failed_abort(status: int, said: str) -> None:
    """404 (no dev routes), 400 and 5xx are failures with the reason in the detail."""
    with ScriptedServer(always(Reply(status, b'{"error": "Invalid JSON format"}'))) as server:
        ok, detail, aborted = await _send(server)
    assert not ok
    assert aborted is None
    assert said in detail


async def test_a_redirect_is_reported_not_followed() -> None:
    """A 3xx is a failure naming the Location (password masked); nothing follows it."""
    reply = Reply(302, b"", {"Location": "https://admin:secret@elsewhere.invalid/x"})
    with ScriptedServer(always(reply)) as server:
        ok, detail, _ = await _send(server)
    assert not ok
    assert "elsewhere.invalid" in detail
    assert "secret" not in detail
    assert len(server.requests) == 1


def test_the_abort_url_keeps_the_origin_prefix_and_query() -> None:
    """The abort goes to the scraped server's origin, under its path prefix, with its query."""
    assert abort_url("http://h:8000/metrics") == "http://h:8000/abort_requests"
    assert abort_url("http://h:1/vllm/metrics?key=v") == "http://h:1/vllm/abort_requests?key=v"


def test_aborted_count_reads_only_a_plain_count() -> None:
    """vLLM's `aborted` is taken only when it is a non-negative integer."""
    assert aborted_count(b'{"status": "aborted", "aborted": 0}') == 0
    assert aborted_count(b'{"aborted": true}') is None
    assert aborted_count(b'{"aborted": -1}') is None
    assert aborted_count(b"not json") is None
