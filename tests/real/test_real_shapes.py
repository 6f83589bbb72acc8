"""wedgewatch against real `vllm serve` servers (vLLM's CPU build, a tiny model): what it says.

Real processes and real HTTP only: the server is vLLM 0.30.0 or 0.32.0 on the CPU
(tests/support/real_vllm.py, one per version shared by the module: tests/real/conftest.py), watched
the
way a user watches it, by `wedgewatch check` and the daemon `wedgewatch run` (its /status).

* Healthy shapes never get a false verdict: idle; a queue that waits for capacity (2 seqs, 20
  concurrent completions); long prompts prefilled in 32-token chunks; clients that time out and
  retry, so the server aborts request after request while real work still progresses.
* Real hangs: the worker SIGSTOPped under load is a `progress_stall` wedge; the EngineCore
  SIGSTOPped while idle leaves /metrics reading idle, and only the canary catches it; the API
  server SIGSTOPped is unreachable. Every stopped process is continued in `finally`, and the
  server must then serve again (the next test shares it).
* A real crash: `kill -9` of the worker takes the whole server down; wedgewatch says
  unreachable, never wedged. This one runs last: it ends the module's server.

Sleep mode is not here: vLLM's CPU build refuses `--enable-sleep-mode` ("Sleep mode is not
supported on current platform.", 0.30.0 and 0.32.0; docs/real-vllm.md).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families
from real_vllm import MODEL_NAME, RealServer, stop_while_running
from wedgewatch_daemon import WEDGEWATCH, DaemonProcess, clean_env, watching

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a cold start under load is minutes

HANG = [
    "--stall-after-seconds", "10",
    "--hang-after-seconds", "10",
    "--unreachable-after-seconds", "10",
]  # fmt: skip
"""Short thresholds where a test stops a process: the hang is certain, the wait short."""
WATCH = ["--interval-seconds", "1", "--remedy", "none"]
"""Every daemon: 1 s scrapes, observe only. Healthy shapes keep the shipped thresholds (60 s
stall, 120 s hang): a starved 2-core machine (load average 25) showed a healthy CPU vLLM's
counters flat for 25 s."""
CANARY = ["--canary-interval-seconds", "3", "--canary-timeout-seconds", "45"]
"""A canary every 3 s of quiet, wedged after 45 s without a token (a loaded 2-core machine
took 5 s for a warm server's first token: docs/real-vllm.md)."""
LONG_PROMPT = [5 + i % 500 for i in range(400)]  # ~400 token ids of the tiny model's 512
LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=32)
QUEUED_TOKENS = 480
"""Each queued completion's length: near the 512-token context, so the first two run long
enough for the other 18 to be queued behind them even when requests reach a starved server
one by one (at 256, a 0.30.0 server under load average 25 was seen running 1, waiting 0)."""
DEADLINE_S = 240.0  # generous: the machine may be busy; never a timed assertion


def samples(
    server: RealServer, client: httpx.Client | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The server's /metrics now: (sample name, labels without engine/model) -> value, summed."""
    text = (client.get if client is not None else httpx.get)(server.metrics_url, timeout=30).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(
                sorted((k, v) for k, v in s.labels.items() if k not in {"engine", "model_name"})
            )
            out[(s.name, labels)] = out.get((s.name, labels), 0.0) + s.value
    return out


def metric(server: RealServer, name: str, **labels: str) -> float:
    return samples(server).get((name, tuple(sorted(labels.items()))), 0.0)


def check(server: RealServer, *flags: str) -> tuple[int, dict[str, Any]]:
    """`wedgewatch check URL --json ...` as a user runs it: (exit code, its JSON)."""
    done = subprocess.run(
        [*WEDGEWATCH, "check", server.url, "--json", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=clean_env(),  # the test run's own WEDGEWATCH_* variables are not the user's
    )
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"check said: {done.stdout!r} {done.stderr[-2000:]!r}") from None


def target_status(daemon: DaemonProcess) -> dict[str, Any]:
    (target,) = daemon.get("/status").json()["targets"]
    return target  # type: ignore[no-any-return]


def wait_until(what: str, condition: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {deadline_s:.0f} s: {what}")


def wait_state(daemon: DaemonProcess, state: str) -> dict[str, Any]:
    seen: list[dict[str, Any]] = []

    def reached() -> bool:
        seen.append(target_status(daemon))
        return bool(seen[-1]["state"] == state)

    wait_until(f"the daemon's /status says {state} (last: {seen[-1:]})", reached)
    return seen[-1]


def canary_came_back(daemon: DaemonProcess) -> None:
    """The daemon's last canary got its token (its `canary_ok` lines are debug-level)."""

    def ok() -> bool:
        last = target_status(daemon)["canary"]["last"] or {}
        return bool(last.get("verdict") == "ok")

    wait_until("a canary answered in time", ok)


def complete(
    url: str,
    prompt: list[int],
    max_tokens: int,
    timeout: float = 600,
    client: httpx.Client | None = None,
) -> dict[str, Any]:
    """One completion of exactly `max_tokens` tokens (`client`: a shared one, see `clients`)."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    post = client.post if client is not None else httpx.post
    r = post(f"{url}/v1/completions", json=body, timeout=timeout)
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


class Load:
    """Clients that keep `clients` completions in flight until stopped (errors are counted)."""

    def __init__(self, url: str, clients: int, max_tokens: int = 200) -> None:
        self.stop = threading.Event()
        self.done = 0
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._client, args=(url, max_tokens), daemon=True)
            for _ in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _client(self, url: str, max_tokens: int) -> None:
        while not self.stop.is_set():
            try:
                complete(url, [1, 20, 30, 40], max_tokens, timeout=DEADLINE_S * 2)
                self.done += 1
            except httpx.HTTPError as e:
                self.errors.append(repr(e))
                self.stop.wait(1)

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=DEADLINE_S * 2)


def signal_all(processes: list[psutil.Process], sig: signal.Signals) -> None:
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)


def serves_again(server: RealServer) -> None:
    """The server, continued, finishes a completion: the hang was the stop, nothing else."""
    assert complete(server.url, [1, 2, 3], 4)["usage"]["completion_tokens"] == 4


def no_wedge(daemon: DaemonProcess) -> None:
    assert daemon.events("wedge_detected") == [], daemon.events("wedge_detected")
    assert daemon.events("canary_stall") == [], daemon.events("canary_stall")


def test_healthy_shapes_get_no_false_verdict(shaped_server: RealServer, tmp_path: Path) -> None:
    """Idle, a capacity queue, chunked long prompts, timing-out clients: never wedged."""
    server = shaped_server
    with watching(server.url, tmp_path, *WATCH, *CANARY) as daemon:
        # Idle: nothing waits; the canary goes out and comes back (a check may catch it running).
        code, said = check(server, "--for", "5")
        assert code == 0, said
        assert said["status"] in {"ok", "idle"}, said
        canary_came_back(daemon)

        # A queue that waits for capacity: 20 concurrent completions, 2 run at a time (long
        # enough that the queue stands for many scrapes even on a quiet machine).
        # One shared client: a fresh httpx client per request builds an SSL context under the
        # GIL (tens of ms on a loaded machine), which spread the 20 requests out so far that the
        # queue never stood.
        # A warm tiny model drains the queue in seconds: one kept-open client polls /metrics.
        seen: set[tuple[float, float]] = set()
        with (
            ThreadPoolExecutor(21) as pool,
            httpx.Client(limits=LIMITS) as client,
            httpx.Client() as poller,
        ):
            futures = [
                pool.submit(complete, server.url, [1, 20, 30 + i], QUEUED_TOKENS, client=client)
                for i in range(20)
            ]
            checking = pool.submit(check, server, "--for", "5")

            def queued() -> bool:
                now = samples(server, poller)
                seen.add(
                    (
                        now.get(("vllm:num_requests_running", ()), 0.0),
                        now.get(
                            ("vllm:num_requests_waiting_by_reason", (("reason", "capacity"),)), 0
                        ),
                    )
                )
                if any(running == 2 and capacity > 0 for running, capacity in seen):
                    return True
                if all(f.done() for f in futures):
                    raise AssertionError(
                        "every queued completion ended, and /metrics never showed 2 running with"
                        f" some waiting for capacity: (running, capacity) seen {sorted(seen)}"
                    )
                return False

            wait_until("2 running and some waiting for capacity", queued)
            sys.stderr.write(f"{server.version}: queue seen as (running, capacity) {seen}\n")
            results = [f.result() for f in futures]
            code, said = checking.result()
        assert all(r["usage"]["completion_tokens"] == QUEUED_TOKENS for r in results)
        assert code == 0, said
        assert said["status"] in {"ok", "idle"}, said

        # Long prompts in 32-token chunks: a step never holds a whole prompt.
        prompt_tokens = metric(server, "vllm:prompt_tokens_total")
        with ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(complete, server.url, LONG_PROMPT, 8) for _ in range(3)]
            checking = pool.submit(check, server, "--for", "5")
            results = [f.result() for f in futures]
            code, said = checking.result()
        assert [r["usage"]["prompt_tokens"] for r in results] == [len(LONG_PROMPT)] * 3
        assert metric(server, "vllm:prompt_tokens_total") - prompt_tokens >= 3 * len(LONG_PROMPT)
        assert code == 0, said
        assert said["status"] in {"ok", "idle"}, said

        # Clients that time out and retry: each hangs up on its streamed request after 0.5 s
        # and sends another, so the server aborts request after request while
        # tokens still flow (aborts are no progress: docs/real-vllm.md); never a wedge.
        before = samples(server)
        stop = threading.Event()
        gave_up: list[int] = []

        def impatient() -> None:  # streams, so giving up closes the stream: vLLM aborts
            body = {"model": MODEL_NAME, "prompt": [1, 20, 30, 40], "max_tokens": 400}
            body |= {"ignore_eos": True, "stream": True}
            while not stop.is_set():
                started = time.monotonic()
                try:
                    with httpx.stream(
                        "POST", f"{server.url}/v1/completions", json=body, timeout=0.5
                    ) as r:
                        for _ in r.iter_lines():
                            if time.monotonic() - started > 0.5:  # its deadline: hang up
                                gave_up.append(1)
                                break
                except httpx.TimeoutException:
                    gave_up.append(1)

        clients = [threading.Thread(target=impatient, daemon=True) for _ in range(4)]
        for t in clients:
            t.start()
        try:
            code, said = check(server, "--for", "20")
        finally:
            stop.set()
            for t in clients:
                t.join(timeout=DEADLINE_S)
        after = samples(server)
        assert code == 0, said
        assert said["status"] in {"ok", "idle"}, said
        assert len(gave_up) > 0, "no client timed out: the shape was not exercised"
        tokens = ("vllm:generation_tokens_total", ())
        assert after[tokens] > before[tokens]
        abort = ("vllm:request_success_total", (("finished_reason", "abort"),))
        sys.stderr.write(
            f"{server.version}: {len(gave_up)} client timeouts, request_success abort "
            f"{before.get(abort, 0):g} -> {after.get(abort, 0):g}\n"
        )
        no_wedge(daemon)
        assert target_status(daemon)["state"] in {"ok", "idle"}
        assert daemon.get("/probe").status_code == 200


def test_a_stopped_worker_under_load_is_a_progress_stall(
    shaped_server: RealServer, tmp_path: Path
) -> None:
    """SIGSTOP the VLLM::Worker mid-generation: running stays up, every counter flat: wedged."""
    server = shaped_server
    workers = server.named("VLLM::Worker")
    assert len(workers) == 1, [p.cmdline() for p in server.processes()]
    with watching(server.url, tmp_path, *WATCH, *HANG) as daemon:
        load = Load(server.url, clients=4)
        try:
            stop_while_running(server.url, [w.pid for w in workers])
            wedge = daemon.wait_for("wedge_detected", timeout_seconds=DEADLINE_S, target="real")
            assert wedge["family"] == "progress_stall", wedge
            status = target_status(daemon)
            assert status["state"] == "wedged", status
            assert [e["family"] for e in status["engines"]] == ["progress_stall"], status
            code, said = check(server, "--for", "8", "--hang-after-seconds", "5")
            assert code == 2, said
            assert said["status"] == "wedged", said
            assert [e.get("family") for e in said["engines"]] == ["progress_stall"], said
        finally:
            signal_all(workers, signal.SIGCONT)
            load.end()
        serves_again(server)
        assert load.errors == [], load.errors
        assert load.done > 0


def test_a_stopped_engine_core_while_idle_is_caught_by_the_canary_alone(
    shaped_server: RealServer, tmp_path: Path
) -> None:
    """SIGSTOP the EngineCore while idle: /metrics still reads idle; the canary wedges it."""
    server = shaped_server
    cores = server.named("VLLM::EngineCore")
    assert len(cores) == 1, [p.cmdline() for p in server.processes()]
    with watching(server.url, tmp_path, *WATCH, *HANG, *CANARY) as daemon:
        canary_came_back(daemon)
        try:
            signal_all(cores, signal.SIGSTOP)
            wedge = daemon.wait_for("wedge_detected", timeout_seconds=DEADLINE_S, target="real")
            assert wedge["family"] == "canary_stall", wedge
            assert target_status(daemon)["state"] == "wedged"
            # Invisible without the canary: /health 200 and /metrics idle.
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
            code, said = check(server, "--for", "5")
            assert (code, said["status"]) == (0, "idle"), said
        finally:
            signal_all(cores, signal.SIGCONT)
        serves_again(server)


def test_a_stopped_api_server_is_unreachable(shaped_server: RealServer, tmp_path: Path) -> None:
    """SIGSTOP the API server: connections are accepted and never answered: unreachable."""
    server = shaped_server
    api = psutil.Process(server.proc.pid)
    with watching(server.url, tmp_path, *WATCH, *HANG, "--scrape-timeout-seconds", "2") as daemon:
        wait_state(daemon, "idle")
        try:
            api.suspend()
            wait_state(daemon, "unreachable")
            code, said = check(
                server,
                "--for", "6",
                "--scrape-timeout-seconds", "2",
                "--unreachable-after-seconds", "3",
                "--startup-timeout-seconds", "3",
            )  # fmt: skip
            assert (code, said["status"]) == (2, "unreachable"), said
            no_wedge(daemon)
        finally:
            api.resume()
        wait_state(daemon, "idle")
        serves_again(server)


def test_a_killed_worker_takes_the_server_down_and_is_no_wedge(
    shaped_server: RealServer, tmp_path: Path
) -> None:
    """`kill -9` the worker under load: vLLM ends the whole server; down, not wedged. Last."""
    server = shaped_server
    (worker,) = server.named("VLLM::Worker")
    with watching(server.url, tmp_path, *WATCH, *HANG) as daemon:
        load = Load(server.url, clients=2)
        try:
            wait_until("requests running", lambda: metric(server, "vllm:num_requests_running") > 0)
            worker.kill()
            server.proc.wait(timeout=DEADLINE_S)  # the API server exits: the server is gone
        finally:
            load.end()
        wait_state(daemon, "unreachable")
        code, said = check(
            server,
            "--for",
            "3",
            "--unreachable-after-seconds",
            "1",
            "--startup-timeout-seconds",
            "1",
        )
        assert (code, said["status"]) == (2, "unreachable"), said
        no_wedge(daemon)
        # The daemon bundles the unreachable episode: it says so, and that the server is gone
        # (nothing listens any more), not that a capture failed on a live server.
        for captured in daemon.events("evidence_captured"):
            summary = json.loads((Path(captured["bundle"]) / "summary.json").read_text())
            assert summary["family"] == "unreachable", summary
            assert '"server_gone": true' in json.dumps(summary), summary
