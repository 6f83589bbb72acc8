"""vLLM's dev endpoints in the simulator: `/abort_requests`, `/pause`, `/resume`, `/is_paused`.

The pure scheduler model first (what an abort or a pause does to the queues and the KV blocks),
then the simulator as a real process on 127.0.0.1 with and without `VLLM_SERVER_DEV_MODE=1`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from simproc import LoadProcess, SimProcess, running, value
from test_e2e import WEDGE_FLAGS, WEDGE_LOAD, wait_for_every_planned_arrival, wait_for_wedge
from test_scheduler import cpu_config, finished_in, hand_built_wedge, offload_prefix, run_until_idle

from wedgewatch.lab.sim.api import dev_mode_from_env
from wedgewatch.lab.sim.scheduler import Scheduler, SimRequest

DEV = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
NOT_DEV = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
# A 64-block pool of 16-token blocks with a CPU tier, as in the scheduler model's tests.
SMALL_POOL = [
    "--num-gpu-blocks", "65",
    "--block-size", "16",
    "--kv-offloading-size", "1",
    "--kv-offloading-backend", "native",
    "--enable-prefix-caching",
    "--max-model-len", "1024",
    "--max-num-batched-tokens", "1024",
]  # fmt: skip
DEV_ROUTES = ("/abort_requests", "/pause", "/resume", "/is_paused")
PREFIX = {"prompt_tokens": 496, "prefix_id": "p", "max_tokens": 1}
"""Computes prefix p (480 tokens, 30 blocks) and stores it on the CPU tier."""
EVICTOR = {"prompt_tokens": 1000, "max_tokens": 1}
"""Needs 63 of the 64 blocks: evicts p from the GPU (not from the tier)."""
ON_THE_TIER = {"prompt_tokens": 600, "prefix_id": "p", "prefix_tokens": 480, "max_tokens": 2}
"""Hits p on the tier only: parked WAITING_FOR_REMOTE_KVS holding 30 blocks for the load."""


# ------------------------------------------------------------------ the scheduler model


def test_abort_of_every_request_clears_the_landed_load_wedge() -> None:
    """The #57841 wedge (its load landed): aborting everything frees the pool, and a request
    that needs most of it is served at once, as a real 0.30.0 does."""
    scheduler, _ = hand_built_wedge("stock")
    for _ in range(20):
        scheduler.step()
    assert [r.request_id for r in scheduler.snapshot().skipped_waiting] == ["b", "l"]
    assert scheduler.snapshot().skipped_waiting[1].kv_load_in_flight is False
    for request_id in ("b", "l", "w"):
        scheduler.abort_request(request_id)
    aborted = scheduler.step()
    assert aborted.iteration_stats is not None
    assert sorted(f.request_id for f in aborted.iteration_stats.finished) == ["b", "l", "w"]
    assert {f.finish_reason for f in aborted.iteration_stats.finished} == {"abort"}
    assert aborted.scheduler_stats.num_free_blocks == 64
    scheduler.add_request(SimRequest("after", 1000, 1))
    assert [f.request_id for f in finished_in(run_until_idle(scheduler))] == ["after"]


def test_abort_of_a_hung_load_never_gives_its_blocks_back() -> None:
    """A load still in flight keeps its blocks after the abort until the worker reports it;
    a load that never lands keeps them for good, and a request needing them never runs."""
    scheduler = Scheduler(cpu_config(kv_load_steps=2))
    offload_prefix(scheduler)
    scheduler.arm_fault("hung-load")
    scheduler.add_request(SimRequest("r", 600, 2, "p", 480))
    scheduler.step()
    scheduler.abort_request("r")
    scheduler.step()
    scheduler.add_request(SimRequest("big", 1000, 1))
    after = [scheduler.step() for _ in range(200)]
    assert "big" not in {f.request_id for f in finished_in(after)}
    assert after[-1].scheduler_stats.num_free_blocks == 64 - 30
    assert scheduler.has_work()  # the orphaned load keeps the engine stepping, as in vLLM


def test_paused_new_runs_the_running_and_admits_nothing_until_unpaused() -> None:
    """PAUSED_NEW: running requests go on, new ones wait (and are not work); unpaused: served."""
    scheduler = Scheduler(cpu_config())
    scheduler.add_request(SimRequest("running", 32, 4))
    scheduler.step()
    scheduler.set_pause_state("new")
    scheduler.add_request(SimRequest("new", 32, 1))
    done = finished_in(run_until_idle(scheduler))
    assert [f.request_id for f in done] == ["running"]
    assert not scheduler.has_work()
    assert scheduler.snapshot().waiting[0].request_id == "new"
    scheduler.set_pause_state("unpaused")
    assert [f.request_id for f in finished_in(run_until_idle(scheduler))] == ["new"]


def test_paused_all_schedules_nothing_and_keeps_every_request() -> None:
    """PAUSED_ALL (`mode=keep`): nothing is work, nothing is scheduled, nothing is lost."""
    scheduler = Scheduler(cpu_config())
    scheduler.add_request(SimRequest("kept", 32, 4))
    scheduler.step()
    scheduler.set_pause_state("all")
    assert not scheduler.has_work()
    assert not scheduler.step().scheduled
    scheduler.set_pause_state("unpaused")
    assert [f.request_id for f in finished_in(run_until_idle(scheduler))] == ["kept"]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [({}, False), ({"VLLM_SERVER_DEV_MODE": "0"}, False), ({"VLLM_SERVER_DEV_MODE": "1"}, True)],
)
def test_dev_mode_is_read_like_vllm(environ: dict[str, str], expected: bool) -> None:
    """`bool(int(VLLM_SERVER_DEV_MODE))`, off when unset; a non-integer is refused."""
    assert dev_mode_from_env(environ) is expected
    with pytest.raises(ValueError, match="invalid literal"):
        dev_mode_from_env({"VLLM_SERVER_DEV_MODE": "yes"})


# ------------------------------------------------------------------ the simulator over HTTP


class InFlight:
    """A completion sent in a thread; its JSON answer (or error) once it returns."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        self.answer: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._send, args=(url, body), daemon=True)
        self.thread.start()

    def _send(self, url: str, body: dict[str, Any]) -> None:
        try:
            self.answer = httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()
        except (httpx.HTTPError, ValueError) as exc:
            self.answer = {"error": repr(exc)}

    def finish_reason(self, timeout: float = 60.0) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the completion did not return"
        return str(self.answer["choices"][0]["finish_reason"])


def wait_for(what: str, condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout:.0f} s: {what}")


@contextmanager
def parked_request(
    tmp_path: Path, *flags: str, env: dict[str, str]
) -> Iterator[tuple[SimProcess, InFlight]]:
    """A simulator with one request parked on a KV load from the CPU tier (30 of 64 blocks)."""
    with running(tmp_path, "sim", [*SMALL_POOL, *flags], env=env) as sim:
        for body in (PREFIX, EVICTOR):
            httpx.post(f"{sim.url}/v1/completions", json=body, timeout=30).raise_for_status()
        parked = InFlight(sim.url, ON_THE_TIER)
        yield sim, parked


def kv_usage(sim: SimProcess) -> float:
    return value(sim.samples(), "vllm:kv_cache_usage_perc")


def deferred(sim: SimProcess) -> float:
    return value(sim.samples(), "vllm:num_requests_waiting_by_reason", reason="deferred")


def waiting(sim: SimProcess) -> float:
    return value(sim.samples(), "vllm:num_requests_waiting")


def test_without_dev_mode_the_dev_routes_are_404_and_unlisted(tmp_path: Path) -> None:
    """As vLLM: no `VLLM_SERVER_DEV_MODE=1`, no abort or pause routes, none in /openapi.json."""
    with running(tmp_path, "sim", [], env=NOT_DEV) as sim:
        for route in DEV_ROUTES:
            method = "GET" if route == "/is_paused" else "POST"
            answer = httpx.request(method, sim.url + route, json={}, timeout=10)
            assert answer.status_code == 404, (route, answer.status_code)
        paths = sim.get("/openapi.json").json()["paths"]
        assert "/v1/completions" in paths
        assert not set(DEV_ROUTES) & set(paths)
        assert "SECURITY WARNING" not in sim.log()


def test_abort_requests_needs_a_json_body_and_aborts_every_request(tmp_path: Path) -> None:
    """No body is a 400 that aborts nothing; `{}` aborts the parked request ("abort")."""
    with parked_request(tmp_path, "--kv-load-steps", "100000", env=DEV) as (sim, parked):
        assert "SECURITY WARNING: Development endpoints are enabled" in sim.log()
        assert "/abort_requests" in sim.get("/openapi.json").json()["paths"]
        wait_for("the request parked", lambda: deferred(sim) == 1)
        refused = httpx.post(sim.url + "/abort_requests", timeout=10)
        assert (refused.status_code, refused.json()) == (400, {"detail": "Invalid JSON format"})
        assert parked.thread.is_alive()
        unknown = {"request_ids": ["cmpl-unknown"]}
        ids = httpx.post(sim.url + "/abort_requests", json=unknown, timeout=10)
        assert ids.json() == {"status": "aborted", "aborted": 1}
        assert parked.thread.is_alive()
        answer = httpx.post(sim.url + "/abort_requests", json={}, timeout=10)
        assert answer.json() == {"status": "aborted", "aborted": 1}
        assert parked.finish_reason() == "abort"


def test_aborting_a_load_still_in_flight_keeps_its_blocks_and_pause_waits_for_it(
    tmp_path: Path,
) -> None:
    """hung-load: the abort ends the request but its 30 blocks stay held, and `/pause` does
    not answer while the aborted load is in flight (vLLM waits for the worker's report)."""
    with parked_request(tmp_path, "--fault", "hung-load@0", env=DEV) as (sim, parked):
        wait_for("the load parked holding blocks", lambda: kv_usage(sim) > 0.4)
        assert httpx.post(sim.url + "/abort_requests", json={}, timeout=10).json()["aborted"] == 1
        assert parked.finish_reason() == "abort"
        assert deferred(sim) == 0
        assert kv_usage(sim) == pytest.approx(30 / 64)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(sim.url + "/pause?mode=abort", timeout=3)
        assert sim.get("/is_paused").json() == {"is_paused": True}
        assert kv_usage(sim) == pytest.approx(30 / 64)


LONG = {"prompt_tokens": 8, "max_tokens": 1000}
"""Decodes for 50 s at the 50 ms steps of `SLOW_STEPS`: running for the whole test."""
SLOW_STEPS = ["--step-time-seconds", "0.05", "--max-model-len", "2048"]


def generated(sim: SimProcess) -> float:
    return value(sim.samples(), "vllm:generation_tokens_total")


def test_pause_keep_freezes_requests_and_resume_lets_them_go_on(tmp_path: Path) -> None:
    """`mode=keep`: a running request stops making tokens without being lost, a new one waits;
    `/resume` lets both go on."""
    with running(tmp_path, "sim", SLOW_STEPS, env=DEV) as sim:
        long = InFlight(sim.url, LONG)
        wait_for("the request decodes", lambda: generated(sim) > 0)
        paused = httpx.post(sim.url + "/pause?mode=keep", timeout=30)
        assert paused.json() == {"status": "paused"}
        assert sim.get("/is_paused").json() == {"is_paused": True}
        time.sleep(0.5)  # the engine's last batch of tokens reaches /metrics
        frozen = generated(sim)
        fresh = InFlight(sim.url, {"prompt_tokens": 8, "max_tokens": 1})
        fresh.thread.join(1.0)
        assert generated(sim) == frozen
        assert long.thread.is_alive()
        assert fresh.thread.is_alive()
        assert httpx.post(sim.url + "/resume", timeout=30).json() == {"status": "resumed"}
        assert sim.get("/is_paused").json() == {"is_paused": False}
        assert fresh.finish_reason() == "length"
        wait_for("tokens flow again", lambda: generated(sim) > frozen + 1)
        assert long.thread.is_alive()
        httpx.post(sim.url + "/abort_requests", json={}, timeout=10)
        assert long.finish_reason() == "abort"


def test_pause_abort_ends_every_request_and_queues_new_ones_until_resume(tmp_path: Path) -> None:
    """`mode=abort` (the default): the running request ends "abort", the pause answers once the
    engine is idle, a new request waits for `/resume`; a bad mode is FastAPI's 422."""
    with running(tmp_path, "sim", SLOW_STEPS, env=DEV) as sim:
        long = InFlight(sim.url, LONG)
        wait_for("the request decodes", lambda: generated(sim) > 0)
        assert httpx.post(sim.url + "/pause?mode=sideways", timeout=10).status_code == 422
        assert httpx.post(sim.url + "/pause", timeout=60).json() == {"status": "paused"}
        assert long.finish_reason() == "abort"
        fresh = InFlight(sim.url, {"prompt_tokens": 8, "max_tokens": 1})
        fresh.thread.join(1.0)
        assert fresh.thread.is_alive()
        assert sim.get("/load").json() == {"server_load": 1}
        httpx.post(sim.url + "/resume", timeout=30)
        assert fresh.finish_reason() == "length"


@pytest.mark.slow
def test_abort_cures_the_agentic_burst_wedge_without_a_restart(tmp_path: Path) -> None:
    """The demo's wedge (vLLM 0.30.0's #57841 path): `POST /abort_requests {}` empties the
    queues, the stuck clients get "abort", a new request completes, same processes."""
    for attempt in range(3):
        with running(tmp_path, f"wedge-{attempt}", WEDGE_FLAGS, env=DEV) as sim:
            load = LoadProcess(sim.url, WEDGE_LOAD, tmp_path / f"load-{attempt}.txt")
            try:
                if wait_for_wedge(sim, 60.0) is None:
                    continue
                wait_for_every_planned_arrival(sim, 80.0)
                pids = sorted(p.pid for p in sim.tree())
                stuck = value(sim.samples(), "vllm:num_requests_waiting")
                answer = httpx.post(sim.url + "/abort_requests", json={}, timeout=30).json()
                assert answer["status"] == "aborted"
                assert answer["aborted"] >= stuck >= 1
                wait_for("the queues empty", lambda: waiting(sim) == 0)
                fresh = InFlight(sim.url, {"prompt_tokens": 64, "max_tokens": 4})
                assert fresh.finish_reason() == "length"
                assert sorted(p.pid for p in sim.tree()) == pids
                assert sim.get("/health").status_code == 200
                return
            finally:
                load.stop()
    raise AssertionError("no attempt wedged")
