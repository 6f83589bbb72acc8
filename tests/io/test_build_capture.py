"""The vLLM build at capture: /version over real HTTP, flags and environment of real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_http import RefusingPort, Reply, ScriptedServer, always

from wedgewatch.io.build_capture import capture_build, fetch_version, version_url_of
from wedgewatch.io.bundles import BUILD_FILE, bundle_bytes, json_bytes
from wedgewatch.io.procs import Discovery, Role, ServerProcess


@pytest.mark.parametrize(
    ("url", "version_url"),
    [
        ("http://h:8000", "http://h:8000/version"),
        ("http://h:8000/metrics", "http://h:8000/version"),
        ("http://h:8000/metrics/", "http://h:8000/version"),
        ("http://h/vllm/metrics", "http://h/vllm/version"),
    ],
)
def test_version_url(url: str, version_url: str) -> None:
    """The /version URL sits beside /metrics, keeping a proxy's path prefix."""
    assert version_url_of(url) == version_url


async def test_version_is_read_like_vllm_serves_it() -> None:
    """`{"version": "0.33.0"}` from the server becomes status ok with the version."""
    with ScriptedServer(always(Reply(200, b'{"version": "0.33.0"}'))) as server:
        got = await fetch_version(server.url + "/metrics")
    assert got == {"status": "ok", "url": server.url + "/version", "version": "0.33.0"}


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (Reply(404, b"not found"), "http_status"),
        (Reply(200, b"<html>"), "not JSON"),
        (Reply(200, b'{"v": 1}'), 'no "version" string'),
    ],
)
async def test_bad_version_answers_are_failures_with_a_reason(reply: Reply, error: str) -> None:
    """A missing route, a non-JSON body or a body without a version is recorded, not raised."""
    with ScriptedServer(always(reply)) as server:
        got = await fetch_version(server.url)
    assert got["status"] == "failed"
    assert error in got["error"]


async def test_refused_version_is_a_failure() -> None:
    """A server that refuses connections gives status failed with `refused`."""
    with RefusingPort() as port:
        got = await fetch_version(port.url)
    assert got["status"] == "failed"
    assert "refused" in got["error"]


RETITLE = (
    "import setproctitle, sys, time; setproctitle.setproctitle('VLLM::EngineCore'); "
    "print('up', flush=True); time.sleep(60)"
)


@pytest.fixture
def server_pair() -> Iterator[tuple[subprocess.Popen[str], subprocess.Popen[str]]]:
    """An 'API server' with vllm serve flags and a retitled 'EngineCore', both real processes."""
    env = {
        "PATH": "/usr/bin:/bin",
        "VLLM_USE_SIMPLE_KV_OFFLOAD": "1",
        "NCCL_DEBUG": "INFO",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_TOKEN": "hf_do_not_print",
        "VLLM_API_KEY": "sk-do-not-print",
        "UNRELATED": "x",
    }
    api = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "serve", "Qwen/Qwen3-0.6B",
         "--tensor-parallel-size", "2", "--api-key", "sk-flag-secret", "--enable-prefix-caching"],
        env=env, text=True,
    )  # fmt: skip
    engine = subprocess.Popen(
        [sys.executable, "-c", RETITLE], env=env, stdout=subprocess.PIPE, text=True
    )
    assert engine.stdout is not None
    assert engine.stdout.readline().strip() == "up"
    time.sleep(0.2)
    try:
        yield api, engine
    finally:
        for proc in (api, engine):
            proc.kill()
            proc.wait()
        engine.stdout.close()


async def test_flags_and_environment_of_real_processes_are_read_and_redacted(
    server_pair: tuple[subprocess.Popen[str], subprocess.Popen[str]],
) -> None:
    """Flags come from the API server; the retitled engine's environment via the API server;
    `build.json` as written holds no secret (the flags are read from the redacted argv)."""
    api, engine = server_pair
    discovery = Discovery(
        "pid",
        api.pid,
        (
            ServerProcess(api.pid, 1, "python", Role.API_SERVER),
            ServerProcess(engine.pid, api.pid, "VLLM::EngineCore", Role.ENGINE_CORE),
        ),
    )
    body = (
        Path(__file__).parents[1] / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
    ).read_bytes()
    captured = await capture_build(None, discovery, body)
    assert "sk-flag-secret" not in json.dumps(captured["flags"])
    build = json.loads(bundle_bytes(BUILD_FILE, json_bytes(captured)))
    text = json.dumps(build)
    assert "sk-flag-secret" not in text
    assert "hf_do_not_print" not in text
    assert "sk-do-not-print" not in text
    assert build["flags"]["--tensor-parallel-size"] == "2"
    assert build["flags"]["--api-key"] == "***"
    assert build["flags"]["--enable-prefix-caching"] == ""
    assert build["model"] == "Qwen/Qwen3-0.6B"
    assert build["engine_env"] == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_DEBUG": "INFO",
        "VLLM_API_KEY": "***",
        "VLLM_USE_SIMPLE_KV_OFFLOAD": "1",
    }
    assert "overwritten by its process title" in build["engine_env_source"]
    assert build["version"]["status"] == "failed"
    assert build["cache_config_info"]["block_size"]


async def test_missing_processes_are_errors_not_crashes() -> None:
    """No processes and no body: each part says why it is missing."""
    build = await capture_build(None, Discovery("pid 1", None, (), error="gone"), None)
    assert build["command_line_error"] == "gone"
    assert build["engine_env_error"] == "no EngineCore process found"
    assert build["cache_config_info_error"] == "no /metrics body"
