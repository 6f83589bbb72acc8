"""`wedgewatch sim load`: deterministic profiles and a bounded runner."""

from __future__ import annotations

import asyncio
import itertools
import json

import httpx
import pytest

from wedgewatch.lab.sim.load import (
    BURST_OWN_TOKENS,
    BURST_SECONDS,
    BURST_START_SECONDS,
    PROFILE_NAMES,
    LoadError,
    PlannedRequest,
    percentile,
    plan_requests,
    run_load,
)


@pytest.mark.parametrize(
    "profile", [p for p in PROFILE_NAMES if p not in ("long-prompt", "streaming-session")]
)
def test_a_seed_gives_one_sequence_and_shorter_runs_are_prefixes(profile: str) -> None:
    """Same seed, same requests; a shorter duration plans a prefix of a longer one."""
    long = plan_requests(profile, 5, 30.0)  # type: ignore[arg-type]
    assert plan_requests(profile, 5, 30.0) == long  # type: ignore[arg-type]
    short = plan_requests(profile, 5, 12.0)  # type: ignore[arg-type]
    assert short == long[: len(short)]
    assert len(short) < len(long)
    assert plan_requests(profile, 6, 30.0) != long  # type: ignore[arg-type]
    assert [r.index for r in long] == list(range(len(long)))
    assert all(a.send_at_seconds <= b.send_at_seconds for a, b in itertools.pairwise(long))
    assert all(0 <= r.send_at_seconds < 30.0 for r in long)


def test_agentic_reuses_eight_prefixes_on_about_85_percent_of_requests() -> None:
    """Heavy prefix reuse: ~85 % of requests start with one of 8 agent prefixes."""
    plan = plan_requests("agentic", 1, 300.0)
    shared = [r for r in plan if r.prefix_id is not None]
    assert 0.80 <= len(shared) / len(plan) <= 0.90
    assert len({r.prefix_id for r in shared}) == 8
    assert all(0 < r.prefix_tokens < r.prompt_tokens <= 4096 for r in shared)
    assert 3.0 <= len(plan) / 300.0 <= 5.0


def test_agentic_burst_replaces_the_steady_phase_with_long_prompts() -> None:
    """Between 3 s and 6 s the arrivals are long prompts; outside it they are agentic ones."""
    plan = plan_requests("agentic-burst", 16, 12.0)
    end = BURST_START_SECONDS + BURST_SECONDS
    burst = [r for r in plan if r.kind == "burst"]
    assert len(burst) >= 15
    assert all(BURST_START_SECONDS <= r.send_at_seconds < end for r in burst)
    assert all(r.prompt_tokens - r.prefix_tokens >= BURST_OWN_TOKENS[0] for r in burst)
    assert not [
        r for r in plan if r.kind == "session" and BURST_START_SECONDS <= r.send_at_seconds < end
    ]
    # Far more KV than a 2048 x 16-token GPU pool holds: it must spill and preempt.
    assert sum(r.prompt_tokens for r in burst) > 4 * 32768


def test_requests_carry_the_simulator_extension_fields() -> None:
    """The JSON body has a text prompt plus prompt_tokens / prefix_id / prefix_tokens."""
    body = PlannedRequest(3, 0.0, 900, 32, "agent-1", 700, "session").body("m")
    assert body == {
        "model": "m",
        "prompt": "wedgewatch load request 3 (session)",
        "prompt_tokens": 900,
        "max_tokens": 32,
        "prefix_id": "agent-1",
        "prefix_tokens": 700,
    }


def test_percentile_is_nearest_rank() -> None:
    """p50/p90/p99 of a known list."""
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) is None


def _server(delays: dict[int, float], statuses: dict[int, int]) -> httpx.MockTransport:
    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served"}]})
        body = json.loads(request.content)
        index = int(body["prompt"].split()[3])
        assert body["model"] == "served"
        await asyncio.sleep(delays.get(index, 0.0))
        return httpx.Response(statuses.get(index, 200), json={"ok": True})

    return httpx.MockTransport(handle)


def plan(count: int) -> list[PlannedRequest]:
    return [PlannedRequest(i, 0.05 * i, 10, 1, kind="t") for i in range(count)]


async def test_the_runner_counts_completed_failed_and_timed_out() -> None:
    """Each request ends in exactly one bucket and the run ends by itself."""
    summary = await run_load(
        "http://sim.test/",
        plan(5),
        profile="t",
        seed=0,
        duration_seconds=2.0,
        request_timeout_seconds=0.5,
        transport=_server(delays={2: 5.0}, statuses={3: 500}),
    )
    assert summary.sent == 5
    assert summary.count("completed") == 3
    assert summary.count("failed") == 1
    assert summary.count("timed_out") == 1
    assert summary.failures == {"HTTP 500": 1, "timeout": 1}
    assert summary.elapsed_seconds < 2.0  # drained, not waiting out the duration
    rendered = summary.render()
    assert "sent 5  completed 3  failed 1  timed out 1" in rendered
    assert summary.as_dict()["timed_out"] == 1


async def test_nothing_is_sent_after_the_duration() -> None:
    """Requests planned after --duration are not sent."""
    summary = await run_load(
        "http://sim.test",
        plan(20),
        profile="t",
        seed=0,
        duration_seconds=0.3,
        transport=_server({}, {}),
    )
    assert 5 <= summary.sent <= 7
    assert summary.planned == 20
    assert "(not sent:" in summary.render()


async def test_concurrency_caps_requests_in_flight() -> None:
    """With --concurrency 1 the second request waits for the first."""
    in_flight = 0
    peak = 0

    async def handle(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return httpx.Response(200, json={})

    summary = await run_load(
        "http://sim.test",
        [PlannedRequest(i, 0.0, 10, 1) for i in range(4)],
        profile="t",
        seed=0,
        duration_seconds=5.0,
        concurrency=1,
        model="given",
        transport=httpx.MockTransport(handle),
    )
    assert summary.count("completed") == 4
    assert peak == 1


async def test_stop_abandons_requests_in_flight() -> None:
    """Setting `stop` ends the run early; what was in flight counts as interrupted."""
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, stop.set)
    summary = await run_load(
        "http://sim.test",
        plan(2),
        profile="t",
        seed=0,
        duration_seconds=30.0,
        transport=_server(delays={0: 30.0, 1: 30.0}, statuses={}),
        stop=stop,
    )
    assert summary.failures == {"interrupted": 2}
    assert summary.elapsed_seconds < 5.0


async def test_an_unreachable_target_is_a_load_error() -> None:
    """No /v1/models: a clear error before anything is sent."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(LoadError, match=r"cannot reach http://sim\.test/v1/models"):
        await run_load(
            "http://sim.test",
            plan(1),
            profile="t",
            seed=0,
            duration_seconds=1.0,
            transport=httpx.MockTransport(refuse),
        )
