"""Redirects off the watched server's origin are never followed, by any HTTP call.

Two real servers on 127.0.0.1, on two ports: the target redirects to the other (which
stands for any other host or port, a cloud metadata address included). The scrape (the
daemon's lean client and the httpx client of one-off fetches), the exec probe's blocking
GET and the canary all report a failure that names where the redirect pointed, with its
secrets masked, and the other server never sees a request.
"""

from __future__ import annotations

import json
import time

import pytest
from scripted_http import Reply, ScriptedServer, always

from wedgewatch.io import canary, http_get
from wedgewatch.io.http_parse import OffOriginRedirect, redirect_target, same_origin
from wedgewatch.io.scrape import fetch, new_client, new_scrape_client
from wedgewatch.io.scrape_rules import Fetched, FetchFailed

BODY = b"vllm:num_requests_running 0\n"
MIB = 1 << 20
PLANTED = "s3cret-token-value"


async def _fetch(transport: str, url: str) -> Fetched | FetchFailed:
    if transport == "probe":
        return http_get.fetch(url, timeout_seconds=5, max_body_bytes=MIB)
    client = new_scrape_client() if transport == "lean" else new_client()
    async with client:
        return await fetch(client, url, timeout_seconds=5, max_body_bytes=MIB)


@pytest.mark.parametrize("transport", ["lean", "httpx", "probe"])
async def test_a_scrape_never_follows_a_redirect_to_another_port(transport: str) -> None:
    """A 302 to another port is a scrape error naming it (redacted); the other port sees
    nothing and its page is never shown as the target's."""
    with ScriptedServer(always(Reply(body=b"other page"))) as other:
        elsewhere = f"{other.base_url}/latest/meta-data?token={PLANTED}"
        with ScriptedServer(always(Reply(302, headers={"Location": elsewhere}))) as target:
            result = await _fetch(transport, target.url)
    assert isinstance(result, FetchFailed), result
    assert result.reason == "http_status"
    assert f"{other.base_url}/latest/meta-data?token=***" in result.detail
    assert "off its origin" in result.detail
    assert PLANTED not in result.detail
    assert "other page" not in result.detail
    assert other.requests == []


@pytest.mark.parametrize("transport", ["lean", "httpx", "probe"])
async def test_a_scrape_follows_a_redirect_within_its_origin(transport: str) -> None:
    """A 307 from /metrics to /metrics/ on the same host and port is still followed."""

    def script(_: int, path: str) -> Reply:
        if path == "/metrics":
            return Reply(307, headers={"Location": "/metrics/"})
        return Reply(body=BODY)

    with ScriptedServer(script) as target:
        result = await _fetch(transport, target.url)
    assert isinstance(result, Fetched), result
    assert result.body == BODY
    assert [r.path for r in target.requests] == ["/metrics", "/metrics/"]


async def test_the_canary_never_follows_a_redirect_to_another_port() -> None:
    """/v1/models answering 307 to another port: an http_status canary failure naming it."""
    models = Reply(200, json.dumps({"data": [{"id": "m"}]}).encode())
    with ScriptedServer(always(models)) as other:
        elsewhere = f"{other.base_url}/v1/models?key={PLANTED}"
        with ScriptedServer(always(Reply(307, headers={"Location": elsewhere}))) as target:
            spec = canary.CanarySpec(
                base_url=target.base_url,
                model="",
                prompt="Say OK.",
                max_tokens=1,
                timeout_seconds=5,
            )
            async with new_client() as client:
                result = await canary.send(client, spec, sent_at=time.monotonic())
    assert result.reason == "http_status", result
    assert f"{other.base_url}/v1/models" in result.detail
    assert "off the server's origin" in result.detail
    assert PLANTED not in result.detail
    assert other.requests == []


def test_the_origin_rule() -> None:
    """Same scheme, host and port (defaults filled in) is followed; anything else raises."""
    assert redirect_target("http://h:8000/metrics", "/metrics/") == "http://h:8000/metrics/"
    assert redirect_target("http://h/metrics", "http://H:80/x") == "http://H:80/x"
    assert same_origin("https://h/metrics", "https://h:443/")
    for location in (
        "http://h:8001/metrics",
        "https://h:8000/metrics",
        "http://169.254.169.254/latest/meta-data/",
        "//other:8000/metrics",
        "http://h:99999/metrics",
    ):
        with pytest.raises(OffOriginRedirect) as caught:
            redirect_target("http://h:8000/metrics", location, 301)
        assert caught.value.status == 301
