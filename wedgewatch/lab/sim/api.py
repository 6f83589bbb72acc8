"""The serving process: vLLM's OpenAI-compatible HTTP surface on starlette + uvicorn.

Routes (as vLLM serves them):

* `GET /health` (and `/ping`): 200 with an empty body; 503 once an engine has died.
* `GET /metrics`: the whole exposition; ignores `name[]` (vLLM's instrumentator route).
* `GET /metrics/...`: the mounted exposition app; honours `name[]` in single-process
  mode and returns nothing for a filtered request in multiprocess mode.
* `GET /v1/models`, `GET /version`, `GET /load`.
* `POST /v1/completions`: answers when the simulated request finishes (or streams with
  `"stream": true`). Extensions: `prompt_tokens` (int), `prefix_id`, `prefix_tokens`.
* `GET /openapi.json`: the routes served, as FastAPI lists them (paths and methods only).
* Sleep mode: `POST /sleep?level=1|2`, `POST /wake_up`, `GET /is_sleeping` (served whatever
  `VLLM_SERVER_DEV_MODE` says: the watchdog's tests put servers to sleep with them).
* Dev endpoints, only with `VLLM_SERVER_DEV_MODE=1` (404 otherwise, as in vLLM), with vLLM
  0.30.0's semantics (`vllm/entrypoints/serve/dev/rlhf/api_router.py`):
  `POST /abort_requests` (a JSON body is required: none or invalid JSON is a 400
  `{"detail": "Invalid JSON format"}`; `{"request_ids": [...]}` aborts those, anything else
  every request in flight; answers `{"status": "aborted", "aborted": N}`),
  `POST /pause?mode=abort|wait|keep` (answers `{"status": "paused"}` once the engines are
  idle), `POST /resume`, `GET /is_paused`. Aborted requests end with `finish_reason` "abort".
* `POST /v1/streaming_input` (simulator extension): a streaming-input session. The body is
  NDJSON read as it arrives: the first line is a completion request, each later line
  (`prompt_tokens`/`prompt`, `max_tokens`) is the session's next input chunk, and the end of
  the body closes the session. Between chunks the request waits in `skipped_waiting` as
  WAITING_FOR_STREAMING_REQ (reason "deferred"). Answers when the session finishes.

A text prompt counts as `ceil(len(text) / 4)` tokens, a token-id list as its length.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from prometheus_client import REGISTRY
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wedgewatch.lab.real.vllm_core import VllmFrontend, core_factory, real_settings, with_fault
from wedgewatch.lab.real.vllm_engine import RealSettings
from wedgewatch.lab.sim.args import ServeArgs
from wedgewatch.lab.sim.client import EngineClient, EngineDeadError, EngineStartError, TokenDelta
from wedgewatch.lab.sim.engine import EngineConfig
from wedgewatch.lab.sim.faults import (
    GARBAGE_METRICS_BODY,
    TRANSFER_FAULTS,
    FaultClock,
    block_event_loop_forever,
    trickle,
)
from wedgewatch.lab.sim.metrics import MetricsPage
from wedgewatch.lab.sim.proctitle import configure_process_logging
from wedgewatch.lab.sim.scheduler import (
    FinishedRequest,
    SchedulerConfig,
    SimRequest,
    cpu_blocks_from_gib,
)
from wedgewatch.lab.sim.version import SIM_VLLM_VERSION, sim_vllm_version

log = logging.getLogger("wedgewatch.lab.sim.api")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
WATCHDOG_INTERVAL_SECONDS = 5.0  # vLLM's VLLM_WATCHDOG_TIME_S
DEFAULT_MAX_TOKENS = 16
CHARS_PER_TOKEN = 4
MAX_NDJSON_LINE_BYTES = 65_536


class BadRequest(Exception):
    """A client error, answered as vLLM answers it (`{"object": "error", ...}`, 400)."""

    def __init__(self, message: str, status_code: int = 400) -> None:
        super().__init__(message)
        self.status_code = status_code


_QUERY_BOOLEANS = ("true", "false", "1", "0", "yes", "no", "on", "off", "t", "f", "y", "n")
"""What pydantic (FastAPI's query parsing) reads as a boolean."""

DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
DEV_MODE_WARNING = (
    "SECURITY WARNING: Development endpoints are enabled! This should NOT be used in production!"
)


def dev_mode_from_env(environ: Mapping[str, str]) -> bool:
    """vLLM's `VLLM_SERVER_DEV_MODE`: `bool(int(value))`, unset is off (raises ValueError)."""
    return bool(int(environ.get(DEV_MODE_ENV, "0")))


def _validation_error(name: str, value: str, message: str) -> JSONResponse:
    """FastAPI's 422 for a query parameter that does not validate."""
    return JSONResponse(
        {
            "detail": [
                {"type": "value_error", "loc": ["query", name], "msg": message, "input": value}
            ]
        },
        status_code=422,
    )


def error_response(message: str, status_code: int) -> JSONResponse:
    """vLLM's error body."""
    kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
    return JSONResponse(
        {
            "object": "error",
            "message": message,
            "type": kind.get(status_code, "InternalServerError"),
            "param": None,
            "code": status_code,
        },
        status_code=status_code,
    )


def count_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Tokens of a completion prompt: `prompt_tokens` if given, else from `prompt` (pure)."""
    explicit = body.get("prompt_tokens")
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, (int, float, str)):
            raise BadRequest("prompt_tokens must be an integer")
        try:
            count = int(explicit)
        except ValueError as exc:
            raise BadRequest(f"prompt_tokens must be an integer, got {explicit!r}") from exc
        if count < 1:
            raise BadRequest(f"prompt_tokens must be >= 1, got {count}")
        return count
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise BadRequest("prompt must not be empty")
        return max(1, math.ceil(len(prompt) / CHARS_PER_TOKEN))
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return count_prompt_tokens({"prompt": prompt[0]})
    if isinstance(prompt, list) and len(prompt) > 1:
        raise BadRequest("batched prompts are not supported by the simulator; send one prompt")
    raise BadRequest("prompt must be a string or a list of token ids (or give prompt_tokens)")


def _int_field(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class CompletionParams:
    """A validated `/v1/completions` request."""

    model: str
    prompt_tokens: int
    max_tokens: int
    prefix_id: str | None
    prefix_tokens: int
    stream: bool


def parse_completion(
    body: object, *, served_names: tuple[str, ...], max_model_len: int
) -> CompletionParams:
    """Validate a completion request body like vLLM does (pure; raises `BadRequest`)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    model = body.get("model", served_names[0])
    if model not in served_names:
        raise BadRequest(f"The model `{model}` does not exist.", status_code=404)
    prompt_tokens = count_prompt_tokens(body)
    max_tokens = _int_field(body, "max_tokens", DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = max_model_len - prompt_tokens
    if max_tokens < 1:
        raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
    n = _int_field(body, "n", 1)
    if n != 1:
        raise BadRequest("the simulator supports n=1 only")
    prefix_id = body.get("prefix_id")
    if prefix_id is not None and not isinstance(prefix_id, str):
        raise BadRequest(f"prefix_id must be a string, got {prefix_id!r}")
    prefix_tokens = _int_field(body, "prefix_tokens", prompt_tokens if prefix_id else 0) or 0
    if not 0 <= prefix_tokens <= prompt_tokens:
        raise BadRequest(
            f"prefix_tokens must be within [0, {prompt_tokens}] (the prompt length), "
            f"got {prefix_tokens}"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"stream must be a boolean, got {stream!r}")
    return CompletionParams(model, prompt_tokens, max_tokens, prefix_id, prefix_tokens, stream)


async def ndjson_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """JSON objects, one per line, as the bytes arrive (raises BadRequest for a bad line)."""
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield _ndjson_object(line)
        if len(buffer) > MAX_NDJSON_LINE_BYTES:
            raise BadRequest(f"an input line is longer than {MAX_NDJSON_LINE_BYTES} bytes")
    if buffer.strip():
        yield _ndjson_object(buffer)


def _ndjson_object(line: bytes) -> dict[str, Any]:
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"an input line is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadRequest("each input line must be a JSON object")
    return value


def completion_text(num_tokens: int) -> str:
    """The text of `num_tokens` simulated tokens."""
    return " sim" * num_tokens


class RequestIds:
    """The request ids a server assigns, `cmpl-<32 hex>`, drawn in arrival order from `--seed`.

    vLLM draws them from uuid4; the simulator seeds them so that the same `--seed` and the
    same arrival order give the same ids, hence the same per-request hashes in the scheduler
    model (a request's own KV block identities, the early-stop choice), run after run.
    """

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"request-ids:{seed}")

    def next(self) -> str:
        """The id of the next request that arrives."""
        return f"cmpl-{self._rng.getrandbits(128):032x}"


class InstrumentatorMiddleware:
    """Records `http_*` like prometheus-fastapi-instrumentator (handler = route template)."""

    def __init__(self, app: ASGIApp, exposition: Callable[[], MetricsPage]) -> None:
        self.app = app
        self._exposition = exposition

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        response_bytes = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status, response_bytes
            if message["type"] == "http.response.start":
                status = message["status"]
                for key, value in message.get("headers", []):
                    if key.lower() == b"content-length":
                        response_bytes = int(value)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            handler = getattr(route, "path", None) or "none"
            request_bytes = 0
            for key, value in scope.get("headers", []):
                if key.lower() == b"content-length":
                    request_bytes = int(value)
            self._exposition().http.observe(
                method=scope["method"],
                handler=handler,
                status_code=status,
                request_bytes=request_bytes,
                response_bytes=response_bytes,
                duration_seconds=time.perf_counter() - started,
            )


class SimServer:
    """The HTTP side: routes over an `EngineClient` and an `MetricsPage`."""

    def __init__(
        self,
        args: ServeArgs,
        client: EngineClient,
        exposition: MetricsPage,
        faults: FaultClock,
        vllm_version: str = SIM_VLLM_VERSION,
        *,
        dev_mode: bool = False,
    ) -> None:
        self.args = args
        self.dev_mode = dev_mode
        self.client = client
        self.exposition = exposition
        self.faults = faults
        self.vllm_version = vllm_version
        self._created = int(time.time())
        self._served_names = args.served_model_name or (args.model,)
        self._request_ids = RequestIds(args.seed)
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/ping", self.health, methods=["GET", "POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/load", self.load, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/streaming_input", self.streaming_input, methods=["POST"]),
            Route("/sleep", self.sleep, methods=["POST"]),
            Route("/wake_up", self.wake_up, methods=["POST"]),
            Route("/is_sleeping", self.is_sleeping, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            # vLLM mounts prometheus_client's app under /metrics; the exact route above wins
            # for `/metrics`, so the mount only serves sub-paths such as `/metrics/`.
            Route("/metrics/{path:path}", self.metrics_mount, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]
        if dev_mode:
            routes += [
                Route("/abort_requests", self.abort_requests, methods=["POST"]),
                Route("/pause", self.pause, methods=["POST"]),
                Route("/resume", self.resume, methods=["POST"]),
                Route("/is_paused", self.is_paused, methods=["GET"]),
            ]
        self._openapi_paths: dict[str, dict[str, dict[str, str]]] = {}
        for route in routes:
            methods = sorted(m.lower() for m in (route.methods or ()) if m != "HEAD")
            self._openapi_paths[route.path] = {m: {"summary": route.name} for m in methods}
        self.app: ASGIApp = InstrumentatorMiddleware(
            Starlette(routes=routes), lambda: self.exposition
        )

    # ------------------------------------------------------------ health and info

    async def health(self, request: Request) -> Response:
        """200 while every engine lives; 503 after one died (vLLM's only health signal)."""
        if self.client.errored:
            return Response(status_code=503)
        return Response(status_code=200)

    async def version(self, request: Request) -> Response:
        """`{"version": ...}`."""
        return JSONResponse({"version": self.vllm_version})

    async def load(self, request: Request) -> Response:
        """`{"server_load": N}`: requests in flight."""
        return JSONResponse({"server_load": self.client.in_flight()})

    async def models(self, request: Request) -> Response:
        """The served model names (static; 200 even when the engine is wedged)."""
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": self._created,
                        "owned_by": "vllm",
                        "root": self.args.model,
                        "parent": None,
                        "max_model_len": self.args.max_model_len,
                        "permission": [],
                    }
                    for name in self._served_names
                ],
            }
        )

    # ------------------------------------------------------------ metrics

    def _metrics_fault_response(self, body: Callable[[], bytes]) -> Response | None:
        now = time.monotonic()
        stats = self.exposition.stats
        if (
            stats is not None
            and not stats.non_finite_gauges
            and self.faults.active("nan-gauges", now)
        ):
            log.warning("fault nan-gauges: the queue and KV-usage gauges now read NaN")
            stats.write_nan_gauges()
        if self.faults.active("garbage-metrics", now):
            return Response(GARBAGE_METRICS_BODY, media_type="text/html")
        if self.faults.active("slow-metrics", now):
            return StreamingResponse(trickle(body()), media_type=PROMETHEUS_CONTENT_TYPE)
        return None

    async def metrics(self, request: Request) -> Response:
        """The whole exposition, whatever the query string says."""
        faulty = self._metrics_fault_response(self.exposition.render)
        if faulty is not None:
            return faulty
        return Response(self.exposition.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def metrics_mount(self, request: Request) -> Response:
        """prometheus_client's app: `name[]` filters sample names (empty in multiprocess mode)."""
        names = request.query_params.getlist("name[]")

        def body() -> bytes:
            return self.exposition.render_filtered(names)

        faulty = self._metrics_fault_response(body)
        if faulty is not None:
            return faulty
        return Response(body(), media_type=PROMETHEUS_CONTENT_TYPE)

    async def openapi(self, request: Request) -> Response:
        """The routes this server answers, in FastAPI's `/openapi.json` shape (paths only)."""
        return JSONResponse(
            {
                "openapi": "3.1.0",
                "info": {"title": "FastAPI", "version": "0.1.0"},
                "paths": self._openapi_paths,
            }
        )

    # ------------------------------------------------------------ dev: abort and pause

    async def abort_requests(self, request: Request) -> Response:
        """vLLM's `POST /abort_requests` (dev mode): abort the ids given, or every request."""
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return JSONResponse({"detail": "Invalid JSON format"}, status_code=400)
        if not isinstance(body, dict):  # vLLM calls body.get outside its handler: a 500
            return Response("Internal Server Error", status_code=500, media_type="text/plain")
        request_ids = body.get("request_ids")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        if request_ids and not (
            isinstance(request_ids, list) and all(isinstance(i, str) for i in request_ids)
        ):
            return JSONResponse(
                {"error": "Failed to abort requests: request_ids must be a list of strings"},
                status_code=500,
            )
        aborted = self.client.abort_requests(request_ids or None)
        log.info("dev endpoint /abort_requests: aborted %d request(s)", aborted)
        return JSONResponse({"status": "aborted", "aborted": aborted})

    async def pause(self, request: Request) -> Response:
        """vLLM's `POST /pause?mode=abort|wait|keep` (dev mode); answers once paused."""
        mode = request.query_params.get("mode", "abort")
        if mode not in ("abort", "wait", "keep"):
            return _validation_error("mode", mode, "Input should be 'abort', 'wait' or 'keep'")
        clear_cache = request.query_params.get("clear_cache", "true").lower()
        if clear_cache not in _QUERY_BOOLEANS:
            return _validation_error(
                "clear_cache", clear_cache, "Input should be a valid boolean, unable to interpret"
            )
        try:
            await self.client.pause(mode)
        except EngineDeadError as exc:
            return JSONResponse({"error": f"Failed to pause generation: {exc}"}, status_code=500)
        log.info("dev endpoint /pause: paused (mode %s)", mode)
        return JSONResponse({"status": "paused"})

    async def resume(self, request: Request) -> Response:
        """vLLM's `POST /resume` (dev mode)."""
        try:
            await self.client.resume()
        except EngineDeadError as exc:
            return JSONResponse({"error": f"Failed to resume generation: {exc}"}, status_code=500)
        log.info("dev endpoint /resume: resumed")
        return JSONResponse({"status": "resumed"})

    async def is_paused(self, request: Request) -> Response:
        """vLLM's `GET /is_paused` (dev mode): `{"is_paused": bool}`."""
        try:
            paused = await self.client.is_paused()
        except EngineDeadError as exc:
            return JSONResponse({"error": f"Failed to fetch pause status: {exc}"}, status_code=500)
        return JSONResponse({"is_paused": paused})

    # ------------------------------------------------------------ dev: sleep mode

    async def sleep(self, request: Request) -> Response:
        """Put every engine to sleep (level 1: weights offloaded, level 2: discard all)."""
        try:
            level = int(request.query_params.get("level", "1"))
        except ValueError:
            return error_response("level must be 1 or 2", 400)
        if level not in (1, 2):
            return error_response(f"level must be 1 or 2, got {level}", 400)
        try:
            await self.client.call_utility("sleep", level)
        except EngineDeadError as exc:
            return error_response(str(exc), 500)
        return Response(status_code=200)

    async def wake_up(self, request: Request) -> Response:
        """Wake every engine up."""
        try:
            await self.client.call_utility("wake_up")
        except EngineDeadError as exc:
            return error_response(str(exc), 500)
        return Response(status_code=200)

    async def is_sleeping(self, request: Request) -> Response:
        """`{"is_sleeping": bool}`."""
        try:
            answers = await self.client.call_utility("is_sleeping")
        except EngineDeadError as exc:
            return error_response(str(exc), 500)
        return JSONResponse({"is_sleeping": any(answers)})

    # ------------------------------------------------------------ completions

    async def completions(self, request: Request) -> Response:
        """OpenAI `/v1/completions`; the answer comes when the simulated request finishes."""
        arrival_time = time.time()
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as exc:
            return error_response(f"the request body is not valid JSON: {exc}", 400)
        try:
            params = parse_completion(
                body, served_names=self._served_names, max_model_len=self.args.max_model_len
            )
        except BadRequest as exc:
            return error_response(str(exc), exc.status_code)
        rejection = self._admission_rejection(params.prompt_tokens)
        if rejection is not None:
            return rejection
        request_id = self._request_ids.next()
        user = body.get("user") if isinstance(body, dict) else None
        header_id = request.headers.get("x-request-id")
        if user is not None or header_id is not None:
            # vLLM logs the caller's marks too: a canary reads `user=wedgewatch-canary`.
            log.info(
                "request %s: user=%s x-request-id=%s max_tokens=%d stream=%s",
                request_id,
                user,
                header_id,
                params.max_tokens,
                params.stream,
            )
        sim_request = SimRequest(
            request_id=request_id,
            prompt_tokens=params.prompt_tokens,
            max_tokens=params.max_tokens,
            prefix_id=params.prefix_id,
            prefix_tokens=params.prefix_tokens,
        )
        try:
            state = self.client.add_request(sim_request, arrival_time)
        except EngineDeadError as exc:
            return error_response(str(exc), 500)
        if params.stream:
            return StreamingResponse(
                self._stream(request, request_id, params, state.events),
                media_type="text/event-stream",
            )
        finished = await self._wait_finished(request, request_id, state.events)
        if finished is None:  # the client went away; vLLM aborts the request
            return Response(status_code=499)
        if self.client.errored:
            return error_response(f"EngineDeadError: {self.client.dead_reason}", 500)
        return JSONResponse(self._completion_body(request_id, params, finished))

    async def streaming_input(self, request: Request) -> Response:
        """A streaming-input session over one request (see the module docstring)."""
        arrival_time = time.time()
        lines = ndjson_lines(request.stream())
        try:
            first = await anext(lines)
            params = parse_completion(
                first, served_names=self._served_names, max_model_len=self.args.max_model_len
            )
        except StopAsyncIteration:
            return error_response("the body must start with a completion request line", 400)
        except ClientDisconnect:
            return Response(status_code=499)
        except BadRequest as exc:
            return error_response(str(exc), exc.status_code)
        rejection = self._admission_rejection(params.prompt_tokens)
        if rejection is not None:
            return rejection
        request_id = self._request_ids.next()
        sim_request = SimRequest(
            request_id=request_id,
            prompt_tokens=params.prompt_tokens,
            max_tokens=params.max_tokens,
            prefix_id=params.prefix_id,
            prefix_tokens=params.prefix_tokens,
            streaming_input=True,
        )
        try:
            state = self.client.add_request(sim_request, arrival_time)
        except EngineDeadError as exc:
            return error_response(str(exc), 500)
        total = params.prompt_tokens + params.max_tokens
        segments = 1
        try:
            async for line in lines:
                prompt_tokens = count_prompt_tokens(line)
                max_tokens = _int_field(line, "max_tokens", DEFAULT_MAX_TOKENS) or 0
                if max_tokens < 1:
                    raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.")
                total += prompt_tokens + max_tokens
                if total > self.args.max_model_len:
                    raise BadRequest(
                        f"This model's maximum context length is {self.args.max_model_len} "
                        f"tokens; the session would reach {total}"
                    )
                self.client.add_streaming_input(request_id, prompt_tokens, max_tokens)
                segments += 1
        except ClientDisconnect:
            self.client.abort_request(request_id)
            return Response(status_code=499)
        except BadRequest as exc:
            self.client.abort_request(request_id)
            return error_response(str(exc), exc.status_code)
        self.client.close_streaming_input(request_id)
        finished = await self._wait_finished(request, request_id, state.events)
        if finished is None:
            return Response(status_code=499)
        if self.client.errored:
            return error_response(f"EngineDeadError: {self.client.dead_reason}", 500)
        body = self._completion_body(request_id, params, finished)
        body["segments"] = segments
        return JSONResponse(body)

    def _admission_rejection(self, prompt_tokens: int) -> Response | None:
        queued_requests, queued_tokens = self.client.queued()
        reason = None
        if (
            self.args.max_num_queued_reqs is not None
            and queued_requests + 1 > self.args.max_num_queued_reqs
        ):
            reason = "max_num_queued_reqs"
        elif (
            self.args.max_num_queued_tokens is not None
            and queued_tokens + prompt_tokens > self.args.max_num_queued_tokens
        ):
            reason = "max_num_queued_tokens"
        if reason is None:
            return None
        if self.exposition.stats is not None:
            self.exposition.stats.record_admission_rejection(reason)
        return error_response(f"Server is overloaded: {reason} limit reached", 503)

    async def _wait_finished(
        self,
        request: Request,
        request_id: str,
        events: asyncio.Queue[TokenDelta | FinishedRequest],
    ) -> FinishedRequest | None:
        async def finished() -> FinishedRequest:
            while True:
                event = await events.get()
                if isinstance(event, FinishedRequest):
                    return event

        async def disconnected() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    return

        done_task = asyncio.ensure_future(finished())
        gone_task = asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({done_task, gone_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone_task.cancel()
        if done_task.done():
            return done_task.result()
        done_task.cancel()
        self.client.abort_request(request_id)
        return None

    async def _stream(
        self,
        request: Request,
        request_id: str,
        params: CompletionParams,
        events: asyncio.Queue[TokenDelta | FinishedRequest],
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        try:
            while True:
                event = await events.get()
                if isinstance(event, TokenDelta):
                    chunk = {
                        "id": request_id,
                        "object": "text_completion",
                        "created": created,
                        "model": params.model,
                        "choices": [
                            {
                                "index": 0,
                                "text": completion_text(event.num_tokens),
                                "logprobs": None,
                                "finish_reason": None,
                                "stop_reason": None,
                            }
                        ],
                    }
                    yield f"data: {json.dumps(chunk)}\n\n".encode()
                    continue
                body = self._completion_body(request_id, params, event)
                body["choices"][0]["text"] = ""
                yield f"data: {json.dumps(body)}\n\n".encode()
                yield b"data: [DONE]\n\n"
                return
        finally:
            if self.client.is_pending(request_id):  # the client went away mid-stream
                self.client.abort_request(request_id)

    def _completion_body(
        self, request_id: str, params: CompletionParams, finished: FinishedRequest
    ) -> dict[str, Any]:
        reason = finished.finish_reason
        if self.client.errored:
            reason = "abort"
        return {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": params.model,
            "choices": [
                {
                    "index": 0,
                    "text": completion_text(finished.num_generation_tokens),
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": finished.num_prompt_tokens,
                "total_tokens": finished.num_prompt_tokens + finished.num_generation_tokens,
                "completion_tokens": finished.num_generation_tokens,
                "prompt_tokens_details": {"cached_tokens": finished.num_cached_tokens},
            },
        }


# ---------------------------------------------------------------- the serving process


SIMPLE_OFFLOAD_IGNORED = (
    "VLLM_USE_SIMPLE_KV_OFFLOAD=1 is set, but the built-in scheduler model runs "
    "OffloadingConnector's scheduler side, not SimpleCPUOffloadConnector's (serve vLLM's own "
    "with --scheduler vllm)"
)


def builtin_connector(args: ServeArgs) -> str:
    """The KV connector the built-in model runs for these flags ("none" without a CPU tier).

    `--kv-offloading-size N --kv-offloading-backend native` is `OffloadingConnector`, as in vLLM
    without `VLLM_USE_SIMPLE_KV_OFFLOAD`; the model ignores that variable (a warning says so).
    """
    return "none" if args.kv_offloading_size is None else "OffloadingConnector"


def scheduler_config_from_args(args: ServeArgs) -> SchedulerConfig:
    """The scheduler model's settings for a `vllm serve` command line (raises ValueError)."""
    defaults = SchedulerConfig()
    num_cpu_blocks = 0
    if args.kv_offloading_size is not None:
        num_cpu_blocks = cpu_blocks_from_gib(
            args.kv_offloading_size,
            block_size=args.block_size,
            tensor_parallel_size=args.tensor_parallel_size,
        )
    return SchedulerConfig(
        num_gpu_blocks=args.num_gpu_blocks or defaults.num_gpu_blocks,
        block_size=args.block_size,
        num_cpu_blocks=num_cpu_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        kv_load_steps=args.kv_load_steps
        if args.kv_load_steps is not None
        else (defaults.kv_load_steps),
        policy=args.scheduler_fix,
        max_model_len=args.max_model_len,
        vllm_structure="0.31+" if args.vllm_structure == "0.31+" else "0.30",
        async_scheduling=args.async_scheduling,
        reserve_full_isl=args.scheduler_reserve_full_isl,
    )


def cache_config_info(args: ServeArgs, config: SchedulerConfig) -> dict[str, str]:
    """`vllm:cache_config_info` labels: vLLM 0.33.0's CacheConfig fields, with the sim's values."""
    kv_tokens = config.num_gpu_blocks * config.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(config.block_size),
        "cache_dtype": args.kv_cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": "None",
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(config.enable_prefix_caching),
        "gpu_memory_utilization": str(args.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(kv_tokens / config.max_model_len, 2)),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(kv_tokens),
        "kv_offloading_backend": args.kv_offloading_backend,
        "kv_offloading_size": str(args.kv_offloading_size),
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": str(config.num_cpu_blocks) if config.num_cpu_blocks else "None",
        "num_gpu_blocks": str(config.num_gpu_blocks),
        "num_gpu_blocks_override": str(args.num_gpu_blocks),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "simple_cpu_offload_num_blocks": "None",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


def _execute_model_timeout(tensor_parallel_size: int) -> float | None:
    if tensor_parallel_size <= 1:
        return None
    return float(os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300"))


def bind_socket(host: str | None, port: int) -> socket.socket:
    """Bind the listening socket like vLLM (all interfaces when no host is given)."""
    bind_host = host if host else "0.0.0.0"
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind_host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def serve(args: ServeArgs) -> int:
    """Run the simulated `vllm serve` until SIGTERM/SIGINT or engine death; the exit code."""
    configure_process_logging("APIServer")
    for flag in args.ignored_flags:
        log.warning("ignoring vLLM flag %s: the simulator does not model it", flag)
    try:
        scheduler_config = scheduler_config_from_args(args)
    except ValueError as exc:
        log.error("invalid configuration: %s", exc)
        return 2
    try:
        dev_mode = dev_mode_from_env(os.environ)
    except ValueError:
        log.error("%s must be an integer (0 or 1), got %r", DEV_MODE_ENV, os.environ[DEV_MODE_ENV])
        return 2
    if dev_mode:
        log.warning("%s", DEV_MODE_WARNING)
    faults = FaultClock(origin_at=None, faults=args.faults)  # started once the server is ready
    frontend: VllmFrontend | None = None
    settings: RealSettings | None = None
    if args.scheduler == "vllm":
        try:
            settings = real_settings(args, os.environ.get("VLLM_USE_SIMPLE_KV_OFFLOAD") == "1")
            for fault in args.faults:  # refuse a connector fault this checkout cannot emulate
                if fault.name in TRANSFER_FAULTS:
                    with_fault(settings, fault.name)
            frontend = VllmFrontend(
                settings, args.model_name, tuple(range(args.data_parallel_size))
            )
        except NotImplementedError as exc:
            log.error("--scheduler vllm: %s", exc)
            return 2
        log.info(
            "--scheduler vllm: vLLM %s's own %s with %s (async scheduling %s, full-ISL %s)",
            frontend.version,
            frontend.scheduler_name,
            frontend.connector_name,
            "on" if settings.async_scheduling else "off",
            "on" if settings.reserve_full_isl else "off",
        )
    elif os.environ.get("VLLM_USE_SIMPLE_KV_OFFLOAD", "").strip() == "1":
        log.warning("%s", SIMPLE_OFFLOAD_IGNORED)
    engine_configs = [
        EngineConfig(
            engine_index=rank,
            data_parallel_size=args.data_parallel_size,
            tensor_parallel_size=args.tensor_parallel_size,
            scheduler=scheduler_config,
            step_time_seconds=args.step_time_seconds,
            faults=faults.for_engine(rank),
            log_stats=not args.disable_log_stats,
            execute_model_timeout_seconds=_execute_model_timeout(args.tensor_parallel_size),
            prefill_step_time_seconds=args.prefill_step_time_seconds,
            core_factory=core_factory(settings) if settings is not None else None,
        )
        for rank in range(args.data_parallel_size)
    ]
    emulated = sim_vllm_version(scheduler_config.vllm_structure)
    log.info(
        "wedgewatch sim %s serving %s: TP=%d DP=%d, %d GPU blocks, %d CPU blocks, "
        "%s, step %.3f s, scheduler %s, seed %d, faults: %s",
        emulated if frontend is None else frontend.version,
        args.model_name,
        args.tensor_parallel_size,
        args.data_parallel_size,
        scheduler_config.num_gpu_blocks,
        scheduler_config.num_cpu_blocks,
        "connector " + (builtin_connector(args) if frontend is None else frontend.connector_name),
        args.step_time_seconds,
        args.scheduler_fix,
        args.seed,
        ", ".join(f.render() for f in args.faults) or "none",
    )
    exposition_holder: list[MetricsPage] = []
    client = EngineClient(
        engine_configs,
        scheduler_config,
        args.step_time_seconds,
        exposition=lambda: exposition_holder[0] if exposition_holder else None,
        frontend=frontend,
    )
    try:
        client.start()
    except EngineStartError as exc:
        log.error("%s", exc)
        return 1
    if frontend is not None:  # vLLM's own stat logger is on prometheus_client's REGISTRY
        exposition = MetricsPage.of_registry(REGISTRY)
    else:
        exposition = MetricsPage(
            model_name=args.model_name,
            engine_indexes=client.engine_indexes,
            max_model_len=args.max_model_len,
            cache_config_info=cache_config_info(args, scheduler_config),
            multiprocess=args.multiprocess_metrics,
            log_stats=not args.disable_log_stats,
        )
    exposition_holder.append(exposition)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", args.host or "0.0.0.0", args.port, exc)
        client.shutdown()
        return 1
    server = SimServer(
        args,
        client,
        exposition,
        faults,
        vllm_version=frontend.version if frontend is not None else emulated,
        dev_mode=dev_mode,
    )
    received: list[int] = []

    def _remember(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)

    # uvicorn restores these after serving and re-raises the signal it caught: keep it ours.
    signal.signal(signal.SIGTERM, _remember)
    signal.signal(signal.SIGINT, _remember)
    try:
        asyncio.run(_serve_http(args, server, client, sock, faults))
    finally:
        client.shutdown()
        sock.close()
    if client.errored:
        log.error("exiting: %s", client.dead_reason)
        return 1
    return 0


async def _serve_http(
    args: ServeArgs,
    server: SimServer,
    client: EngineClient,
    sock: socket.socket,
    faults: FaultClock,
) -> None:
    loop = asyncio.get_running_loop()
    client.attach(loop)
    config = uvicorn.Config(
        server.app,
        log_config=None,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_uvicorn_access_log,
        timeout_graceful_shutdown=2,
        lifespan="off",
    )
    uv_server = uvicorn.Server(config)
    host, port = sock.getsockname()[:2]
    # Ready: the socket listens and the engines are up. Fault times count from here, so a
    # slow start (a loaded machine) never eats into them.
    ready_at = time.monotonic()
    faults = faults.started(ready_at)
    server.faults = faults
    client.start_fault_clock(ready_at)
    log.info("Starting vLLM API server 0 on http://%s:%d", host, port)
    background: list[asyncio.Task[None]] = [
        asyncio.create_task(_watchdog_loop(uv_server, client, ready_at)),
        asyncio.create_task(client.log_stats_loop()),
    ]
    hang_at = faults.first_at("api-hang")
    if hang_at is not None:
        background.append(asyncio.create_task(_api_hang_at(hang_at)))
    try:
        await uv_server.serve(sockets=[sock])
    finally:
        for task in background:
            task.cancel()


async def _watchdog_loop(uv_server: uvicorn.Server, client: EngineClient, origin_at: float) -> None:
    """vLLM's `watchdog_loop`: every 5 s, stop serving if an engine has died.

    vLLM's ticks fall every 5 s after its server started, a phase nobody outside can know;
    here they fall on whole multiples of 5 s after the server was ready (the fault clock's
    origin), so an engine that dies at fault time T answers /health 503 until the next
    multiple of 5 after T: `engine-crash@6` gives four seconds of 503, however long the
    start took.
    """
    while True:
        elapsed = time.monotonic() - origin_at
        ticks_done = math.floor(elapsed / WATCHDOG_INTERVAL_SECONDS)
        next_tick = origin_at + (ticks_done + 1) * WATCHDOG_INTERVAL_SECONDS
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
        if client.errored:
            log.error("Engine failed, terminating server.")
            uv_server.should_exit = True
            return


async def _api_hang_at(at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    block_event_loop_forever()
