"""wedgewatch's own endpoints: /health, /probe, /metrics and /status read the published snapshot."""

from __future__ import annotations

import math
from dataclasses import replace

import httpx
import pytest
from prometheus_client import CollectorRegistry

from wedgewatch.core.restart.probe_policy import ProbeVerdict
from wedgewatch.daemon.ownmetrics import OwnMetrics
from wedgewatch.daemon.publish import EngineSnapshot, TargetSnapshot
from wedgewatch.daemon.server import (
    HttpServer,
    Snapshot,
    health,
    make_app,
    probe,
)
from wedgewatch.vllm.signals import EngineKey, EngineReading

READING = EngineReading(
    key=EngineKey("m", "0"),
    running=0.0,
    waiting=7.0,
    waiting_by_reason={"capacity": 0.0, "deferred": 7.0},
    kv_cache_usage=math.nan,
    awake=True,
    prompt_tokens=100.0,
    generation_tokens=200.0,
    request_success=3.0,
    preemptions=0.0,
    iterations=50.0,
)


def _engine(state: str, family: str | None = None, reason: str = "") -> EngineSnapshot:
    return EngineSnapshot(
        model_name="m",
        engine="0",
        state=state,
        family=family,
        since_timestamp=1_700_000_000.0,
        stalled_seconds=30.0 if family else 0.0,
        last_progress_timestamp=1_699_999_970.0,
        reason=reason,
        missing=False,
        reading=READING,
    )


def _target(name: str, state: str, *engines: EngineSnapshot) -> TargetSnapshot:
    return TargetSnapshot(
        name=name,
        url=f"http://127.0.0.1:8000/{name}",
        state=state,
        reason=f"{name} is {state}",
        up=state != "unreachable",
        last_scrape_timestamp=1_700_000_001.0,
        last_scrape_error=None,
        engines=engines,
        remedy="none",
        restarts=1,
        restart_budget_remaining=2,
        gave_up=False,
        restart_in_progress=False,
        next_restart_allowed_timestamp=None,
        last_bundle="/var/lib/wedgewatch/evidence/x",
    )


def _snapshot(*targets: TargetSnapshot, last_tick_at: float | None = 100.0) -> Snapshot:
    return Snapshot(
        version="1.2.3",
        started_at=90.0,
        started_timestamp=1_699_999_990.0,
        health_stale_after_seconds=15.0,
        last_tick_at=last_tick_at,
        last_tick_timestamp=1_700_000_000.0,
        ticks=10,
        targets={t.name: t for t in targets},
    )


@pytest.mark.parametrize(
    ("last_tick_at", "now_at", "code"),
    [
        pytest.param(100.0, 101.0, 200, id="fresh-tick"),
        pytest.param(100.0, 115.0, 200, id="at-limit"),
        pytest.param(100.0, 115.5, 503, id="stale-tick"),
        pytest.param(None, 95.0, 200, id="before-first-tick"),
        pytest.param(None, 200.0, 503, id="never-ticked"),
    ],
)
def test_health_follows_the_loop(last_tick_at: float | None, now_at: float, code: int) -> None:
    """/health is 200 while the loop ticks and 503 once the last tick is too old."""
    status, body = health(_snapshot(last_tick_at=last_tick_at), now_at)
    assert status == code
    assert ("reason" in body) is (code == 503)


def test_health_ignores_a_wedged_target() -> None:
    """A wedged target does not make wedgewatch's own /health fail."""
    snapshot = _snapshot(_target("a", "wedged", _engine("wedged", "deferred_stall")))
    assert health(snapshot, 101.0)[0] == 200


@pytest.mark.parametrize(
    ("state", "code"),
    [
        pytest.param("ok", 200, id="ok"),
        pytest.param("idle", 200, id="idle"),
        pytest.param("starting", 200, id="starting"),
        pytest.param("sleeping", 200, id="sleeping"),
        pytest.param("suspect", 200, id="suspect"),
        pytest.param("wedged", 503, id="wedged"),
        pytest.param("unreachable", 503, id="unreachable"),
    ],
)
def test_probe_fails_only_when_wedged_or_unreachable(state: str, code: int) -> None:
    """/probe is 503 for wedged and unreachable targets and 200 for every other state."""
    status, body = probe(_target("a", state, _engine(state)))
    assert status == code
    assert body["state"] == state
    assert body["reason"] == f"a is {state}"


async def _get(app_snapshot: Snapshot, path: str, now_at: float = 101.0) -> httpx.Response:
    registry = CollectorRegistry()
    OwnMetrics(
        registry, version="1.2.3", states=("ok",), families=(), scrape_failure_reasons=()
    ).add_target("a", state="ok", remedy="none", budget_remaining=3)
    app = make_app(lambda: app_snapshot, registry, lambda: now_at)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://wedgewatch") as client:
        return await client.get(path)


async def test_probe_endpoint_single_target_needs_no_name() -> None:
    """With one target, /probe answers for it without ?target."""
    response = await _get(_snapshot(_target("a", "wedged", _engine("wedged"))), "/probe")
    assert response.status_code == 503
    assert response.json()["target"] == "a"


async def test_probe_endpoint_several_targets_need_a_name() -> None:
    """With several targets, /probe without ?target is a 400 that lists the names."""
    snapshot = _snapshot(_target("a", "ok"), _target("b", "wedged"))
    response = await _get(snapshot, "/probe")
    assert response.status_code == 400
    assert response.json()["targets"] == ["a", "b"]
    named = await _get(snapshot, "/probe?target=b")
    assert named.status_code == 503


async def test_probe_endpoint_unknown_target_is_404() -> None:
    """/probe?target=NAME for a target that is not watched is a 404."""
    response = await _get(_snapshot(_target("a", "ok")), "/probe?target=zzz")
    assert response.status_code == 404
    assert "zzz" in response.json()["error"]


async def test_status_endpoint_shows_every_engine() -> None:
    """/status lists targets with engines, state, family, since, reading and bundle."""
    engine = _engine("wedged", "deferred_stall", "7 deferred, nothing running")
    response = await _get(_snapshot(_target("a", "wedged", engine)), "/status")
    assert response.status_code == 200
    (target,) = response.json()["targets"]
    assert target["probe_ok"] is False
    assert target["last_bundle"] == "/var/lib/wedgewatch/evidence/x"
    (shown,) = target["engines"]
    assert shown["family"] == "deferred_stall"
    assert shown["since"] == "2023-11-14T22:13:20.000+00:00"
    assert shown["last_reading"]["waiting_by_reason"] == {"capacity": 0.0, "deferred": 7.0}
    assert shown["last_reading"]["kv_cache_usage"] is None  # NaN is not JSON


async def test_metrics_endpoint_serves_the_registry() -> None:
    """/metrics renders the injected registry in the text format."""
    response = await _get(_snapshot(_target("a", "ok")), "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'wedgewatch_target_up{target="a"} 0.0' in response.text


async def test_endpoints_follow_the_published_snapshot() -> None:
    """The endpoints read whichever snapshot was published last (a reference swap)."""
    published = [_snapshot(_target("a", "ok"))]
    app = make_app(lambda: published[-1], CollectorRegistry(), lambda: 101.0)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://wedgewatch") as client:
        assert (await client.get("/probe")).status_code == 200
        published.append(replace(published[-1], targets={"a": _target("a", "wedged")}))
        assert (await client.get("/probe")).status_code == 503


async def test_unknown_path_and_method_are_rejected() -> None:
    """Unknown paths are 404 and writes are 405."""
    snapshot = _snapshot(_target("a", "ok"))
    assert (await _get(snapshot, "/nope")).status_code == 404
    app = make_app(lambda: snapshot, CollectorRegistry(), lambda: 101.0)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://wedgewatch") as client:
        assert (await client.post("/probe")).status_code == 405


@pytest.mark.slow
async def test_http_server_serves_on_loopback_and_stops() -> None:
    """HttpServer binds 127.0.0.1 on a free port, answers real requests and releases the port."""
    snapshot = _snapshot(_target("a", "ok"))
    server = HttpServer(
        make_app(lambda: snapshot, CollectorRegistry(), lambda: 101.0), "127.0.0.1", 0
    )
    await server.start()
    host, port = server.address
    try:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"http://{host}:{port}/health")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
    finally:
        await server.stop()
    async with httpx.AsyncClient() as client:
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://{host}:{port}/health")


@pytest.mark.slow
async def test_http_server_reports_a_busy_port() -> None:
    """Binding a port already in use fails with an OSError naming the address."""
    snapshot = _snapshot()
    first = HttpServer(make_app(lambda: snapshot, CollectorRegistry(), lambda: 0.0), "127.0.0.1", 0)
    await first.start()
    try:
        _, port = first.address
        second = HttpServer(
            make_app(lambda: snapshot, CollectorRegistry(), lambda: 0.0), "127.0.0.1", port
        )
        with pytest.raises(OSError, match=f"127.0.0.1:{port}"):
            await second.start()
    finally:
        await first.stop()


async def test_probe_follows_the_budget_verdict_and_reports_each_sent_503() -> None:
    """A kept probe verdict decides the code; every 503 sent is reported, a 200 never is."""
    restart = ProbeVerdict(False, "restart", "a restart is allowed", False, 0, 3)
    gave_up = ProbeVerdict(True, "gave_up", "3 restarts within the last 3600 s", True, 3, 0)
    wedged = _target("a", "wedged", _engine("wedged"))
    failed: list[str] = []
    snapshots = [_snapshot(replace(wedged, probe=restart))]
    app = make_app(lambda: snapshots[-1], CollectorRegistry(), lambda: 101.0, failed.append)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://wedgewatch") as client:
        first = await client.get("/probe")
        assert first.status_code == 503
        assert first.json()["restart_policy"]["decision"] == "restart"
        assert failed == ["a"]
        snapshots.append(_snapshot(replace(wedged, probe=gave_up, gave_up=True)))
        second = await client.get("/probe")
        assert second.status_code == 200
        body = second.json()
        assert body["gave_up"] is True
        assert body["state"] == "wedged"
        assert body["restart_policy"]["decision"] == "gave_up"
        assert "3 restarts" in body["restart_policy"]["detail"]
        assert failed == ["a"]


@pytest.mark.parametrize(
    ("state", "gave_up", "restarting", "code", "decision"),
    [
        pytest.param("ok", False, False, 200, "ready", id="ok"),
        pytest.param("suspect", False, False, 200, "ready", id="suspect"),
        pytest.param("starting", False, False, 503, "starting", id="starting"),
        pytest.param("ok", False, True, 503, "restarting", id="restarting"),
        pytest.param("wedged", False, False, 503, "wedged", id="wedged"),
        pytest.param("unreachable", False, False, 503, "unreachable", id="unreachable"),
        pytest.param("wedged", True, False, 503, "gave_up", id="gave-up"),
    ],
)
async def test_ready_endpoint_follows_the_target_not_the_budget(
    state: str, gave_up: bool, restarting: bool, code: int, decision: str
) -> None:
    """/ready is 503 for a wedged or given-up target even where /probe passes (gave_up)."""
    gave_up_verdict = ProbeVerdict(True, "gave_up", "budget spent", True, 3, 0)
    target = replace(
        _target("a", state, _engine(state)),
        gave_up=gave_up,
        restart_in_progress=restarting,
        probe=gave_up_verdict if gave_up else None,
    )
    response = await _get(_snapshot(target), "/ready")
    assert response.status_code == code
    body = response.json()
    assert body["decision"] == decision
    assert body["ready"] is (code == 200)
    assert body["target"] == "a"
    assert response.headers["cache-control"] == "no-store"
    status_body = (await _get(_snapshot(target), "/status")).json()
    assert status_body["targets"][0]["readiness"]["decision"] == decision
    if gave_up:
        assert (await _get(_snapshot(target), "/probe")).status_code == 200


async def test_ready_endpoint_chooses_targets_like_probe() -> None:
    """Several targets need ?target=NAME (400 without, 404 for an unknown name)."""
    snapshot = _snapshot(_target("a", "ok"), _target("b", "wedged", _engine("wedged")))
    assert (await _get(snapshot, "/ready")).status_code == 400
    assert (await _get(snapshot, "/ready?target=a")).status_code == 200
    assert (await _get(snapshot, "/ready?target=b")).status_code == 503
    assert (await _get(snapshot, "/ready?target=zzz")).status_code == 404
