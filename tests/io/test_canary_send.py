"""`io.canary.send` against real HTTP servers on 127.0.0.1: measured, marked, failures as data."""

from __future__ import annotations

import json
import time

import pytest
from scripted_http import RefusingPort, Reply, Script, ScriptedServer

from wedgewatch.io import canary
from wedgewatch.io.scrape import new_client

MODELS = Reply(200, json.dumps({"object": "list", "data": [{"id": "org/m"}]}).encode())
EVENT = b'data: {"id": "c", "choices": [{"index": 0, "text": "O"}]}\n\n'
STREAM = Reply(200, [EVENT, b"data: [DONE]\n\n"], {"Content-Type": "text/event-stream"})


def script(models: Reply, completions: Reply) -> Script:
    """Answer /v1/models and /v1/completions with the given replies."""
    return lambda _n, path: models if path.endswith("/v1/models") else completions


def spec(base_url: str, timeout: float = 5.0, model: str = "") -> canary.CanarySpec:
    """A canary spec with the defaults the daemon uses."""
    return canary.CanarySpec(
        base_url=base_url, model=model, prompt="Say OK.", max_tokens=1, timeout_seconds=timeout
    )


async def send(base_url: str, *, deadline: float = 5.0, model: str = "") -> canary.CanaryResult:
    """One canary with a fresh client."""
    async with new_client() as client:
        return await canary.send(client, spec(base_url, deadline, model), sent_at=time.monotonic())


async def test_success_is_measured_and_marked() -> None:
    """A streamed token: no failure, TTFT measured; the request is recognisably a canary."""
    with ScriptedServer(script(MODELS, STREAM)) as server:
        result = await send(server.base_url)
    assert result.reason is None, result
    assert result.first_token_seconds is not None
    assert 0 <= result.first_token_seconds <= result.total_seconds
    post = server.requests[-1]
    assert post.path == "/v1/completions"
    assert post.headers["X-Request-Id"].startswith("wedgewatch-canary-")
    body = json.loads(post.body)
    assert body == {
        "model": "org/m",
        "prompt": "Say OK.",
        "max_tokens": 1,
        "temperature": 0,
        "stream": True,
        "user": "wedgewatch-canary",
    }


async def test_configured_model_skips_the_lookup() -> None:
    """`canary_model` set: no /v1/models request, that model is asked for."""
    with ScriptedServer(script(Reply(500), STREAM)) as server:
        result = await send(server.base_url, model="other")
    assert result.reason is None
    assert [r.path for r in server.requests] == ["/v1/completions"]
    assert json.loads(server.requests[0].body)["model"] == "other"


async def test_no_token_within_the_deadline_is_timeout() -> None:
    """A server that never sends a token: `timeout`, bounded by the deadline, no TTFT."""
    hung = Reply(200, [EVENT], {"Content-Type": "text/event-stream"}, headers_pause_seconds=30)
    with ScriptedServer(script(MODELS, hung)) as server:
        started = time.monotonic()
        result = await send(server.base_url, deadline=0.5)
        took = time.monotonic() - started
    assert result.reason == "timeout", result
    assert result.first_token_seconds is None
    assert took < 5, took


async def test_a_first_token_later_than_httpx_default_deadline_is_in_time() -> None:
    """A token after 6 s of a 10 s canary is in time: httpx's 5 s default read deadline (the
    client's) must not turn it into a `timeout` (a loaded real vLLM took that long)."""
    slow = Reply(200, [EVENT], {"Content-Type": "text/event-stream"}, headers_pause_seconds=6)
    with ScriptedServer(script(MODELS, slow)) as server:
        result = await send(server.base_url, deadline=10)
    assert result.reason is None, result
    assert result.first_token_seconds is not None
    assert result.first_token_seconds >= 5.5


@pytest.mark.parametrize(
    ("models", "completions", "reason", "detail"),
    [
        (MODELS, Reply(404, b'{"error": "The model does not exist."}'), "http_status", "404"),
        (Reply(200, b'{"data": []}'), STREAM, "no_model", "no model id"),
        (Reply(200, b"<html>"), STREAM, "no_model", "no model id"),
        (Reply(401, b"denied"), STREAM, "http_status", "401"),
        (MODELS, Reply(200, b"data: [DONE]\n\n"), "bad_response", "without a token"),
        (MODELS, Reply(200, [b": keepalive\n"] * 10_000), "bad_response", "over"),
    ],
    ids=["unknown-model", "no-models", "models-html", "auth", "no-token", "huge-stream"],
)
async def test_failures_are_data(
    models: Reply, completions: Reply, reason: str, detail: str
) -> None:
    """Every misbehaviour is a result with a reason from the closed set and a clear detail."""
    with ScriptedServer(script(models, completions)) as server:
        result = await send(server.base_url)
    assert result.reason == reason, result
    assert detail in result.detail
    assert result.first_token_seconds is None


async def test_refused_port() -> None:
    """Nobody listens: `refused`, at once."""
    with RefusingPort() as port:
        result = await send(canary.base_url_of(port.url))
    assert result.reason == "refused", result


def test_base_url_keeps_a_path_prefix() -> None:
    """The completions URL sits beside /metrics, behind the same proxy prefix."""
    assert canary.base_url_of("http://h:8000/metrics") == "http://h:8000"
    assert canary.base_url_of("http://h/vllm/metrics") == "http://h/vllm"
    assert canary.endpoint("http://h:8000", "/v1/models") == "http://h:8000/v1/models"
    assert canary.endpoint("http://h/vllm/", "/v1/models") == "http://h/vllm/v1/models"


def test_a_query_on_the_metrics_url_goes_after_each_route() -> None:
    """A proxy's key in the scraped URL's query stays a query: never part of the path."""
    base = canary.base_url_of("http://h/vllm/metrics?api_key=k&x=1")
    assert base == "http://h/vllm?api_key=k&x=1"
    assert canary.endpoint(base, "/v1/completions") == "http://h/vllm/v1/completions?api_key=k&x=1"


async def test_the_canary_carries_the_scraped_urls_prefix_and_query() -> None:
    """Behind a proxy that wants its key in the query (the scrape sends it), both canary
    requests reach the routes under the prefix, with the key; a refusal never shows the key."""
    key = "api_key=s3cret-value"

    def proxy(replies: tuple[Reply, Reply]) -> Script:
        routes = {f"/vllm/v1/models?{key}": replies[0], f"/vllm/v1/completions?{key}": replies[1]}
        return lambda _n, path: routes.get(path, Reply(404, b"no such route"))

    with ScriptedServer(proxy((MODELS, STREAM))) as server:
        result = await send(canary.base_url_of(f"{server.base_url}/vllm/metrics?{key}"))
    assert result.reason is None, result
    assert [r.path for r in server.requests] == [
        f"/vllm/v1/models?{key}",
        f"/vllm/v1/completions?{key}",
    ]

    with ScriptedServer(proxy((Reply(401, b"denied"), STREAM))) as server:
        result = await send(canary.base_url_of(f"{server.base_url}/vllm/metrics?{key}"))
    assert result.reason == "http_status", result
    assert "HTTP 401" in result.detail, result
    assert "/vllm/v1/models?api_key=***" in result.detail, result
    assert "s3cret" not in result.detail, result
