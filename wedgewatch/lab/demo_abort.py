"""`wedgewatch demo --abort-first`: the wedge cured without a restart, then one that needs it.

Two acts against the simulator (vLLM 0.30.0's scheduler, the demo's profile), started by the
launcher with `--dev-endpoints` and watched in this process with `abort_first` on:

1. Agentic-burst traffic wedges the scheduler (the #57841 path). The watchdog takes the
   bundle, sends `POST /abort_requests {}` and proves recovery with a canary: the same API
   server and EngineCore pids before and after, restarts 0, serving again.
2. A frozen loop: the EngineCore is stopped (SIGSTOP) with a request in flight. No abort
   can reach a loop that does not run, so the watchdog goes straight to the restart (the
   launcher's `supervise` remedy): new pids, restarts 1, serving again.

The acts are read from the watchdog's `/status` (`recoveries`, `restarts`) as an operator
would read them. docs/demo.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import psutil

from wedgewatch import launch
from wedgewatch.config import Config
from wedgewatch.io import restarters
from wedgewatch.lab import demo
from wedgewatch.lab.demo_story import target_of

ACT_SECONDS = 240.0
"""How long one act may take before the demo says it did not happen."""
BURSTS = 3


def abort_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The demo's watchdog settings with the abort cure on (the launcher makes it supervise)."""
    return {**settings, "abort_first": True, "remedy": "supervise"}


def server_pids(supervisor: restarters.Supervisor) -> tuple[int | None, int | None]:
    """The API server's and the EngineCore's pids now."""
    root = supervisor.pid
    engine: int | None = None
    if root is not None:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(root).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if " ".join(child.cmdline()).startswith("VLLM::EngineCore"):
                        engine = child.pid
                        break
    return root, engine


async def _status(client: httpx.AsyncClient, url: str) -> Mapping[str, Any]:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        found = target_of((await client.get(url)).json())
        if found is not None:
            return found
    return {}


async def _serving(client: httpx.AsyncClient, server_url: str) -> bool:
    """One short completion completes."""
    with contextlib.suppress(httpx.HTTPError):
        answer = await client.post(
            f"{server_url}/v1/completions",
            json={"prompt_tokens": 16, "max_tokens": 4},
            timeout=30,
        )
        return answer.status_code == 200
    return False


async def _wait_recoveries(
    client: httpx.AsyncClient, url: str, count: int, stop: asyncio.Event, seconds: float
) -> Mapping[str, Any]:
    end = time.monotonic() + seconds
    status: Mapping[str, Any] = {}
    while time.monotonic() < end and not stop.is_set():
        status = await _status(client, url)
        if len(status.get("recoveries") or []) >= count:
            return status
        await asyncio.sleep(1.0)
    return status


def _describe(recovery: Mapping[str, Any]) -> str:
    seconds = recovery.get("seconds")
    taken = f"{seconds:.1f} s from the verdict to serving again" if seconds is not None else ""
    aborted = recovery.get("aborted")
    lost = f", {aborted} requests aborted" if aborted is not None else ""
    return f"cure {recovery.get('cure')}: {recovery.get('outcome')} ({taken}{lost})"


async def run(
    *,
    options: demo.DemoOptions,
    screen: demo.Screen,
    settings: Mapping[str, Any],
    config: Config,
    shim: Path,
    stop: asyncio.Event,
    log_path: Path,
) -> int:
    """Both acts; 0 when both happened as told, 1 otherwise."""
    port = demo.free_port()
    prepared = launch.prepare(
        launch.LaunchOptions(
            model=demo.DEMO_MODEL,
            profile=demo.DEMO_PROFILE,
            vllm_bin=str(shim),
            extra_args=("--host", "127.0.0.1", "--port", str(port), *demo.DEMO_SERVE_FLAGS),
            watch=True,
            dev_endpoints=True,
        ),
        demo.demo_profiles(),
    )
    assert prepared.binary is not None  # noqa: S101 - prepare() raises when the shim cannot run
    launch.preflight(prepared.command, prepared.binary, config)
    server_url = f"http://127.0.0.1:{port}"
    status_url = f"http://127.0.0.1:{config.listen_port}/status"
    screen.lines(
        [
            "wedgewatch demo --abort-first: a simulated vLLM 0.30.0 with its dev endpoints on "
            "(loopback only), watched with abort_first: the wedge cured without a restart, "
            "then a frozen loop that needs one.",
            f"  server     {prepared.command.render()}",
            *(f"  note       {line}" for line in launch.dev_mode_notice(prepared.command, {})),
            f"  endpoints  {status_url}   logs: {log_path}",
            "",
        ]
    )
    started = time.monotonic()

    def say(text: str) -> None:
        screen.lines([f"[t+{time.monotonic() - started:5.1f}s] {text}"])

    watch_stop = asyncio.Event()
    supervisors: list[restarters.Supervisor] = []
    watched = asyncio.create_task(
        launch.watch(prepared.command, config, stop=watch_stop, on_started=supervisors.append),
        name="launch-watch",
    )
    traffic = demo._Traffic()
    acts: list[bool] = []
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
            while not (supervisors and await _serving(client, server_url)):
                if stop.is_set() or watched.done() or time.monotonic() - started > ACT_SECONDS:
                    return 1
                await asyncio.sleep(0.5)
            before = server_pids(supervisors[0])
            say(f"ACT 1: the server answers (API server pid {before[0]}, EngineCore pid "
                f"{before[1]}); agentic-burst traffic")  # fmt: skip
            status: Mapping[str, Any] = {}
            for burst in range(BURSTS):
                if burst:
                    say("no wedge from this burst; a fresh server and the same burst again")
                    await demo._fresh_server(supervisors[0], server_url, config.grace_seconds)()
                    before = server_pids(supervisors[0])
                traffic.start("agentic-burst", server_url, options.seed, demo.BURST_SECONDS)
                status = await _wait_recoveries(client, status_url, 1, stop, ACT_SECONDS / 2)
                if status.get("recoveries"):
                    break
            recoveries = list(status.get("recoveries") or [])
            after = server_pids(supervisors[0])
            restarts = int(status.get("restarts") or 0)
            serving = await _serving(client, server_url)
            if recoveries:
                say(f"!! wedged, bundle taken, then {_describe(recoveries[0])}")
            first = recoveries[0] if recoveries else {}
            act1 = (
                first.get("cure") == "abort"
                and first.get("outcome") == "recovered"
                and after == before
                and restarts == 0
                and serving
            )
            say(f"{'OK' if act1 else 'XX'} same pids before and after: {before} -> {after}, "
                f"restarts {restarts}, serving again: {'yes' if serving else 'no'}")  # fmt: skip
            acts.append(act1)
            traffic.stop()

            say("ACT 2: a frozen loop: the EngineCore stopped (SIGSTOP) with a request in flight")
            engine = after[1]
            if engine is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(engine, signal.SIGSTOP)
            inflight = asyncio.create_task(_serving(client, server_url))
            status = await _wait_recoveries(client, status_url, 2, stop, ACT_SECONDS)
            inflight.cancel()
            await asyncio.gather(inflight, return_exceptions=True)
            recoveries = list(status.get("recoveries") or [])
            while not await _serving(client, server_url):
                if stop.is_set() or time.monotonic() - started > 3 * ACT_SECONDS:
                    break
                await asyncio.sleep(1.0)
            status = await _status(client, status_url)
            renewed = server_pids(supervisors[0])
            restarts = int(status.get("restarts") or 0)
            serving = await _serving(client, server_url)
            second = recoveries[1] if len(recoveries) > 1 else {}
            if second:
                say(f"!! wedged (a stopped loop: no abort can reach it), {_describe(second)}")
            act2 = second.get("cure") == "restart" and restarts >= 1 and renewed != after
            act2 = act2 and serving
            say(f"{'OK' if act2 else 'XX'} new pids: {after} -> {renewed}, restarts {restarts}, "
                f"serving again: {'yes' if serving else 'no'}")  # fmt: skip
            acts.append(act2)
    finally:
        traffic.stop()
        watch_stop.set()
        with contextlib.suppress(Exception):
            await watched
        if traffic.task is not None:
            await asyncio.gather(traffic.task, return_exceptions=True)
    screen.lines(
        [
            "",
            f"act 1, the abort cure:   {'happened as told' if acts[0] else 'did NOT happen'}",
            f"act 2, the restart:      "
            f"{'happened as told' if len(acts) > 1 and acts[1] else 'did NOT happen'}",
            f"the bundles: {settings['evidence_dir']}   the log: {log_path}",
        ]
    )
    return 0 if len(acts) == 2 and all(acts) else 1


def run_demo(options: demo.DemoOptions, *, configure_logging: Callable[[str], None]) -> int:
    """`wedgewatch demo --abort-first`: 0 when both acts happened as told."""
    return demo.run_demo(
        options, configure_logging=configure_logging, runner=run, adjust=abort_settings
    )
