"""wedgewatch's own HTTP endpoints: /health, /probe, /ready, /metrics and /status.

The watch loop publishes an immutable `Snapshot` after every tick by swapping a
reference; the endpoints only read the latest one, so no locks are needed and a slow
client never holds up the loop. The app is starlette, served by uvicorn inside the
daemon's own event loop (`HttpServer`), without uvicorn's signal handling: the daemon
owns SIGTERM/SIGINT.

- `/health`  wedgewatch's own liveness: 200 while the loop ticks, 503 once the last tick
             is older than `health_stale_after_seconds`. It never reflects the target.
- `/probe`   the verdict for a watched server (for the vLLM container's liveness probe):
             503 when the target is wedged or unreachable past its threshold and the
             restart policy allows a restart (`core.probe_policy`), else 200; a 503 that
             went out is reported to the loop (`on_probe_failed`), which counts the
             restart it causes once a new server proves it.
- `/ready`   whether a watched server should receive traffic (for the vLLM container's
             readiness probe): 503 while it is starting, restarting, wedged, unreachable or
             given up (`core.readiness`), whatever the restart budget says, else 200.
- `/metrics` wedgewatch's own registry (see ownmetrics).
- `/status`  JSON with every target and engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import field
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from wedgewatch.core.detection.readiness import ready_verdict
from wedgewatch.core.detection.states import ACTED_ON
from wedgewatch.core.text.redact import redact_value
from wedgewatch.core.values import immutable
from wedgewatch.daemon.connections import ConnectionGuard, ConnectionLimits, guarded_protocol
from wedgewatch.daemon.ownmetrics import render
from wedgewatch.daemon.publish import TargetSnapshot
from wedgewatch.vllm.signals import EngineReading

# Target states that fail /probe: the acted-on states. The detector only reports
# `unreachable` once the target has been unreachable for unreachable_after_seconds, so a
# blip never fails the probe.
PROBE_FAILING_STATES = ACTED_ON


@immutable
class Snapshot:
    """Everything the endpoints need, published whole by the loop after each tick."""

    version: str
    started_at: float
    started_timestamp: float
    health_stale_after_seconds: float
    last_tick_at: float | None = None
    last_tick_timestamp: float | None = None
    ticks: int = 0
    targets: Mapping[str, TargetSnapshot] = field(default_factory=dict)


def health(snapshot: Snapshot, now_at: float) -> tuple[int, dict[str, Any]]:
    """wedgewatch's own liveness at monotonic `now_at`: (status code, body)."""
    reference = snapshot.last_tick_at if snapshot.last_tick_at is not None else snapshot.started_at
    age = max(0.0, now_at - reference)
    ok = age <= snapshot.health_stale_after_seconds
    body: dict[str, Any] = {
        "status": "ok" if ok else "stuck",
        "version": snapshot.version,
        "ticks": snapshot.ticks,
        "last_tick": _iso(snapshot.last_tick_timestamp),
        "seconds_since_last_tick": round(age, 3) if snapshot.last_tick_at is not None else None,
        "stale_after_seconds": snapshot.health_stale_after_seconds,
    }
    if not ok:
        body["reason"] = (
            f"the watch loop has not completed a tick for {age:.1f} s "
            f"(limit {snapshot.health_stale_after_seconds:g} s)"
        )
    return (200 if ok else 503), body


def probe(target: TargetSnapshot) -> tuple[int, dict[str, Any]]:
    """The liveness verdict for one watched server: (status code, body saying why)."""
    verdict = target.probe
    failing = target.state in PROBE_FAILING_STATES if verdict is None else not verdict.ok
    body: dict[str, Any] = {
        "target": target.name,
        "ok": not failing,
        "state": target.state,
        "gave_up": target.gave_up,
        "reason": target.reason,
    }
    if verdict is not None:
        body["restart_policy"] = verdict.to_json()
    return (503 if failing else 200), {
        **body,
        "engines": [
            {
                "model_name": e.model_name,
                "engine": e.engine,
                "state": e.state,
                "family": e.family,
                "stalled_seconds": _finite(round(e.stalled_seconds, 3)),
                "reason": e.reason,
            }
            for e in target.engines
        ],
    }


def ready(target: TargetSnapshot) -> tuple[int, dict[str, Any]]:
    """The readiness verdict for one watched server: (status code, body saying why)."""
    verdict = ready_verdict(
        target.state, gave_up=target.gave_up, restarting=target.restart_in_progress
    )
    body = {"target": target.name, "state": target.state, **verdict.to_json()}
    return (200 if verdict.ready else 503), body


def status(snapshot: Snapshot) -> dict[str, Any]:
    """The full JSON status document: every target and engine."""
    return {
        "version": snapshot.version,
        "started": _iso(snapshot.started_timestamp),
        "last_tick": _iso(snapshot.last_tick_timestamp),
        "ticks": snapshot.ticks,
        "targets": [_target_json(t) for t in snapshot.targets.values()],
    }


def make_app(
    snapshot: Callable[[], Snapshot],
    registry: CollectorRegistry,
    monotonic: Callable[[], float],
    on_probe_failed: Callable[[str], None] | None = None,
) -> Starlette:
    """Build the ASGI app; `snapshot` returns the latest published snapshot.

    `on_probe_failed(target)` is called for every failing `/probe` answer that was sent.
    """

    async def health_endpoint(request: Request) -> Response:
        code, body = health(snapshot(), monotonic())
        return _json(body, code)

    async def probe_endpoint(request: Request) -> Response:
        target = _chosen_target(request, snapshot().targets)
        if isinstance(target, Response):
            return target
        code, body = probe(target)
        response = _json(body, code)
        if code == 503 and on_probe_failed is not None:
            on_probe_failed(target.name)
        return response

    async def ready_endpoint(request: Request) -> Response:
        target = _chosen_target(request, snapshot().targets)
        if isinstance(target, Response):
            return target
        code, body = ready(target)
        return _json(body, code)

    async def metrics_endpoint(request: Request) -> Response:
        body, content_type = render(registry, request.headers.get("accept", ""))
        return Response(body, media_type=content_type, headers=_NO_STORE)

    async def status_endpoint(request: Request) -> Response:
        return _json(status(snapshot()))

    return Starlette(
        routes=[
            Route("/health", health_endpoint, methods=["GET"]),
            Route("/probe", probe_endpoint, methods=["GET"]),
            Route("/ready", ready_endpoint, methods=["GET"]),
            Route("/metrics", metrics_endpoint, methods=["GET"]),
            Route("/status", status_endpoint, methods=["GET"]),
        ]
    )


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its signal handlers: the daemon owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """Serves an ASGI app on host:port inside the running event loop.

    Its connections are bounded by `limits` (`daemon.connections`): idle and header
    timeouts, per peer and in total, the newest connection evicting the oldest idle one,
    so that silent or half-sent connections never make /health or /probe fail.
    """

    def __init__(
        self, app: Starlette, host: str, port: int, limits: ConnectionLimits | None = None
    ) -> None:
        self._app = app
        self._host = host
        self._port = port
        self.connections = ConnectionGuard(limits if limits is not None else ConnectionLimits())
        self._socket: socket.socket | None = None
        self._server: _EmbeddedServer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the port is the real one when 0 was asked for."""
        if self._socket is None:
            raise RuntimeError("the HTTP server is not started")
        host, port = self._socket.getsockname()[:2]
        return str(host), int(port)

    async def start(self) -> None:
        """Bind (raising OSError with the address on failure) and serve until `stop`."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        try:
            sock = socket.create_server((self._host, self._port), family=family)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen on {self._host}:{self._port}: {exc.strerror}"
            ) from exc
        self._socket = sock
        config = uvicorn.Config(
            self._app,
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=2,
            http=guarded_protocol(self.connections),
            limit_concurrency=None,  # the guard bounds connections; uvicorn's bound answers 503
        )
        self._server = _EmbeddedServer(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name="http-server")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup failure
                raise RuntimeError("the HTTP server stopped during startup")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting connections, finish in-flight responses and close the socket."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._socket is not None:
            self._socket.close()


_NO_STORE = {"cache-control": "no-store"}


def _chosen_target(
    request: Request, targets: Mapping[str, TargetSnapshot]
) -> TargetSnapshot | Response:
    """The target `?target=NAME` names (optional with one target), or the error response."""
    name = request.query_params.get("target")
    if name is None:
        if len(targets) != 1:
            return _error(400, "several targets are watched; choose one with ?target=NAME", targets)
        (target,) = targets.values()
        return target
    if name not in targets:
        return _error(404, f"unknown target {name!r}", targets)
    return targets[name]


def _error(code: int, message: str, targets: Mapping[str, TargetSnapshot]) -> Response:
    return _json({"error": message, "targets": sorted(targets)}, code)


def _json(body: Mapping[str, Any], code: int = 200) -> Response:
    """Every JSON document the server sends: redacted (what leaves the process), and
    never cached."""
    return JSONResponse(redact_value(body), status_code=code, headers=_NO_STORE)


def _iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC).isoformat(timespec="milliseconds")


def _reading_json(reading: EngineReading | None) -> dict[str, Any] | None:
    if reading is None:
        return None
    return {
        "running": _finite(reading.running),
        "waiting": _finite(reading.waiting),
        "waiting_by_reason": {k: _finite(v) for k, v in reading.waiting_by_reason.items()},
        "kv_cache_usage": _finite(reading.kv_cache_usage),
        "awake": reading.awake,
        "prompt_tokens": _finite(reading.prompt_tokens),
        "generation_tokens": _finite(reading.generation_tokens),
        "request_success": _finite(reading.request_success),
        "preemptions": _finite(reading.preemptions),
        "iterations": _finite(reading.iterations),
    }


def _finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity; a non-finite metric value is shown as null."""
    if value is None or not math.isfinite(value):
        return None
    return value


def _target_json(target: TargetSnapshot) -> dict[str, Any]:
    return {
        "name": target.name,
        "url": target.url,
        "state": target.state,
        "reason": target.reason,
        "probe_ok": target.state not in PROBE_FAILING_STATES
        if target.probe is None
        else target.probe.ok,
        "readiness": ready_verdict(
            target.state, gave_up=target.gave_up, restarting=target.restart_in_progress
        ).to_json(),
        "up": target.up,
        "last_scrape": _iso(target.last_scrape_timestamp),
        "last_scrape_error": target.last_scrape_error,
        "remedy": target.remedy,
        "restarts": target.restarts,
        "restart_budget_remaining": target.restart_budget_remaining,
        "gave_up": target.gave_up,
        "restart_in_progress": target.restart_in_progress,
        "next_restart_allowed": _iso(target.next_restart_allowed_timestamp),
        "last_bundle": target.last_bundle,
        "episode": dict(target.episode) if target.episode is not None else None,
        "last_restart_failure": (
            {
                **target.last_restart_failure,
                "time": _iso(target.last_restart_failure.get("timestamp")),
            }
            if target.last_restart_failure is not None
            else None
        ),
        "waiting_for_supervisor": target.waiting_for_supervisor,
        "canary": dict(target.canary) if target.canary is not None else None,
        "recoveries": [{**r, "time": _iso(r.get("timestamp"))} for r in target.recoveries],
        "engines": [
            {
                "model_name": e.model_name,
                "engine": e.engine,
                "state": e.state,
                "family": e.family,
                "since": _iso(e.since_timestamp),
                "since_timestamp": e.since_timestamp,
                "stalled_seconds": _finite(round(e.stalled_seconds, 3)),
                "last_progress": _iso(e.last_progress_timestamp),
                "last_progress_timestamp": e.last_progress_timestamp,
                "reason": e.reason,
                "missing": e.missing,
                "last_reading": _reading_json(e.reading),
            }
            for e in target.engines
        ],
    }
