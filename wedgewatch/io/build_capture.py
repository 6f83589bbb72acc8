"""The vLLM build of a server at capture time: `/version`, `vllm serve` flags, environment.

`capture_build` asks the target for `GET /version` (bounded in time and size), reads the
API server's command line and the EngineCore's `VLLM_*` / `CUDA_*` / `NCCL_*` environment
from /proc (psutil), and takes the `vllm:cache_config_info` labels from the /metrics body
already scraped. The command line is redacted as an argument vector before its flags are
read from it (`redact_argv`: a secret flag's value is masked whole, and no flag parsed from
it holds a secret); the rest goes to `build.json` raw, and the bundle writer redacts it, the
environment by its names' rules (`io.bundles.bundle_bytes`). Every part that cannot be had
becomes an `error` entry; nothing raises.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil

from wedgewatch.core.text.redact import redact_argv
from wedgewatch.io.procs import Discovery
from wedgewatch.io.scrape import fetch, new_client
from wedgewatch.io.scrape_rules import FetchFailed
from wedgewatch.vllm.build_info import build_env, cache_config_labels, serve_flags
from wedgewatch.vllm.semantics import Role

VERSION_TIMEOUT_SECONDS = 2.0
VERSION_MAX_BYTES = 64 * 1024


def version_url_of(url: str) -> str:
    """`http://h:8000`, `http://h:8000/metrics` -> `http://h:8000/version` (prefix kept)."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    if path.endswith("/metrics"):
        path = path[: -len("/metrics")]
    return urlunsplit((parts.scheme, parts.netloc, f"{path}/version", "", ""))


async def fetch_version(
    url: str, timeout_seconds: float = VERSION_TIMEOUT_SECONDS
) -> dict[str, Any]:
    """`{"status": "ok", "version": "0.33.0", "url": ...}` or `{"status": "failed", "error"}`."""
    target = version_url_of(url)
    async with new_client() as client:
        result = await fetch(
            client, target, timeout_seconds=timeout_seconds, max_body_bytes=VERSION_MAX_BYTES
        )
    if isinstance(result, FetchFailed):  # build.json is redacted by the bundle writer
        return {"status": "failed", "url": target, "error": f"{result.reason}: {result.detail}"}
    try:
        data = json.loads(result.body)
    except ValueError:
        return {"status": "failed", "url": target, "error": "the answer is not JSON"}
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        return {"status": "failed", "url": target, "error": 'no "version" string in the answer'}
    return {"status": "ok", "url": target, "version": data["version"][:200]}


def _cmdline(pid: int) -> list[str] | str:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.Error as exc:
        return f"cannot read the command line of pid {pid}: {type(exc).__name__}"


def _environ(pid: int) -> dict[str, str] | str:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error as exc:
        why = type(exc).__name__
        return f"cannot read the environment of pid {pid}: {why} (needs the same user or root)"


def read_process_build(discovery: Discovery) -> dict[str, Any]:
    """The API server's redacted command line and flags, the EngineCore's build environment
    (raw: `build.json`'s writer redacts it)."""
    out: dict[str, Any] = {}
    api = discovery.pids(Role.API_SERVER)
    root = discovery.root_pid if discovery.root_pid is not None else (api[0] if api else None)
    if root is None:
        out["command_line_error"] = discovery.error or "no API server process found"
    else:
        argv = _cmdline(root)
        if isinstance(argv, str):
            out["command_line_error"] = argv
        else:
            redacted = redact_argv(argv)
            model, flags = serve_flags(redacted)
            out.update(api_server_pid=root, command_line=redacted, model=model, flags=flags)
    engines = discovery.pids(Role.ENGINE_CORE)
    if not engines:
        out["engine_env_error"] = "no EngineCore process found"
        return out
    environ = _environ(engines[0])
    source = f"EngineCore pid {engines[0]}"
    if isinstance(environ, dict) and not environ and root is not None:
        # setproctitle (VLLM::EngineCore) overwrites the memory /proc/<pid>/environ reads;
        # the engine inherited the API server's environment, so read that instead.
        environ = _environ(root)
        source = (
            f"API server pid {root} (the EngineCore's /proc environ is overwritten by its "
            "process title; it inherits this environment)"
        )
    if isinstance(environ, str):
        out["engine_env_error"] = environ
    else:
        out.update(
            engine_core_pid=engines[0],
            engine_env=build_env(environ),
            engine_env_source=source,
        )
    return out


async def capture_build(
    url: str | None, discovery: Discovery, metrics_body: bytes | None
) -> dict[str, Any]:
    """Everything about the build that can be had now; failures as `*_error` entries."""
    if url is not None:
        version_task = asyncio.create_task(fetch_version(url))
    processes = await asyncio.to_thread(read_process_build, discovery)
    build: dict[str, Any] = {}
    if url is not None:
        build["version"] = await version_task
    else:
        build["version"] = {"status": "failed", "error": "no URL configured (pid capture)"}
    build.update(processes)
    if metrics_body is not None:
        labels = cache_config_labels(metrics_body.decode("utf-8", errors="replace"))
        if labels:
            build["cache_config_info"] = labels
        else:
            build["cache_config_info_error"] = "no vllm:cache_config_info in the /metrics body"
    else:
        build["cache_config_info_error"] = "no /metrics body"
    return build
