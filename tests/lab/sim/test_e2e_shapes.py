"""Issue #10's traffic shapes end to end: a real simulator, real HTTP clients, real /metrics."""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from pathlib import Path

import httpx
import pytest
from simproc import LoadProcess, Samples, progress, running, value

pytestmark = pytest.mark.slow


def _hold_the_only_slot(url: str, max_tokens: int) -> threading.Thread:
    """A client whose request occupies the engine's single batch slot for a long time."""

    def hold() -> None:
        # The server is stopped under it at the end of the test.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                url + "/v1/completions",
                json={"prompt_tokens": 16, "max_tokens": max_tokens},
                timeout=300,
            )

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


def _wait(sim_samples: object, predicate: object, timeout_seconds: float) -> Samples:
    deadline = time.monotonic() + timeout_seconds
    samples: Samples = {}
    while time.monotonic() < deadline:
        samples = sim_samples()  # type: ignore[operator]
        if predicate(samples):  # type: ignore[operator]
            return samples
        time.sleep(0.1)
    raise AssertionError(f"condition not reached within {timeout_seconds} s")


def test_timed_out_clients_are_aborted_and_counted_as_abort(tmp_path: Path) -> None:
    """Every abandoned attempt of a retrying client reaches request_success{abort}, nothing else."""
    with running(tmp_path, "retry", ["--max-num-seqs", "1", "--step-time-seconds", "0.5"]) as sim:
        _hold_the_only_slot(sim.url, 400)
        _wait(sim.samples, lambda s: value(s, "vllm:num_requests_running") == 1, 10)
        before = sim.samples()
        load = LoadProcess(
            sim.url,
            [
                "--profile", "steady",
                "--seed", "3",
                "--duration", "4",
                "--request-timeout-seconds", "1",
                "--retries", "3",
                "--retry-backoff-seconds", "0.2",
                "--json",
            ],
            tmp_path / "load.out",
        )  # fmt: skip
        try:
            assert load.proc.wait(timeout=60) == 1  # nothing completed: every request timed out
        finally:
            load.stop()
        summary = json.loads(load.output().strip().splitlines()[-1])
        assert summary["sent"] > 0
        assert summary["completed"] == 0
        assert summary["retries"] > 0
        attempts = summary["sent"] + summary["retries"]
        after = _wait(
            sim.samples,
            lambda s: value(s, "vllm:request_success_total", finished_reason="abort") >= attempts,
            10,
        )
        assert value(after, "vllm:request_success_total", finished_reason="abort") == attempts
        for reason in ("stop", "length", "error", "repetition"):
            assert value(after, "vllm:request_success_total", finished_reason=reason) == 0
        assert value(after, "vllm:generation_tokens_total") > value(
            before, "vllm:generation_tokens_total"
        )  # the slot holder kept decoding
        assert value(after, "vllm:num_requests_waiting") == 0  # the aborted ones left the queue


def test_a_streaming_session_sits_deferred_with_nothing_else_waiting(tmp_path: Path) -> None:
    """Between chunks: running 0, capacity 0, deferred 1, KV held, no counter moves; then done."""
    with running(tmp_path, "session", []) as sim:
        load = LoadProcess(
            sim.url,
            ["--profile", "streaming-session", "--duration", "8", "--json"],
            tmp_path / "load.out",
        )
        try:
            idle = _wait(
                sim.samples,
                lambda s: (
                    value(s, "vllm:num_requests_waiting_by_reason", reason="deferred") == 1
                    and value(s, "vllm:generation_tokens_total") > 0
                ),
                10,
            )
            assert value(idle, "vllm:num_requests_running") == 0
            assert value(idle, "vllm:num_requests_waiting_by_reason", reason="capacity") == 0
            assert value(idle, "vllm:kv_cache_usage_perc") > 0
            time.sleep(3)
            later = sim.samples()
            assert progress(later) == progress(idle)
            assert value(later, "vllm:num_requests_waiting_by_reason", reason="deferred") == 1
            assert value(later, "vllm:request_success_total") == 0
            assert load.proc.wait(timeout=30) == 0
        finally:
            load.stop()
        summary = json.loads(load.output().strip().splitlines()[-1])
        assert summary["completed"] == 1
        done = _wait(
            sim.samples,
            lambda s: value(s, "vllm:request_success_total", finished_reason="stop") == 1,
            5,
        )
        assert value(done, "vllm:num_requests_waiting") == 0
        assert value(done, "vllm:kv_cache_usage_perc") == 0


def test_a_long_prompt_prefills_chunk_by_chunk_with_only_kv_usage_moving(tmp_path: Path) -> None:
    """15 chunks of 0.5 s: KV usage climbs with running 1 while every counter stays flat."""
    flags = ["--max-num-batched-tokens", "2048", "--prefill-step-time-seconds", "0.5"]
    with running(tmp_path, "prefill", flags) as sim:
        load = LoadProcess(
            sim.url, ["--profile", "long-prompt", "--duration", "1", "--json"], tmp_path / "l.out"
        )
        try:
            flat = progress(sim.samples())
            _wait(sim.samples, lambda s: value(s, "vllm:num_requests_running") == 1, 20)
            usages: list[float] = []
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                samples = sim.samples()
                assert progress(samples) == flat, "a counter moved during the prefill"
                assert value(samples, "vllm:num_requests_running") == 1
                usages.append(value(samples, "vllm:kv_cache_usage_perc"))
                time.sleep(0.7)
            assert usages == sorted(usages)
            assert len(set(usages)) >= 3, usages  # it grew chunk by chunk, not at once
            assert load.proc.wait(timeout=30) == 0
        finally:
            load.stop()
        after = sim.samples()
        assert value(after, "vllm:prompt_tokens_total") == 30_000
        assert value(after, "vllm:request_success_total", finished_reason="length") == 1


def test_nan_gauges_fault_serves_nan_and_everything_else_works(tmp_path: Path) -> None:
    """From its time on, the queue and KV gauges read NaN; health and completions still work."""
    with running(tmp_path, "nan", ["--fault", "nan-gauges@0"]) as sim:
        answer = httpx.post(
            sim.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30
        )
        assert answer.status_code == 200
        samples = sim.samples()
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
        ):
            assert math.isnan(value(samples, name)), name
        assert math.isnan(value(samples, "vllm:num_requests_waiting_by_reason", reason="deferred"))
        assert value(samples, "vllm:generation_tokens_total") == 3
        assert sim.get("/health").status_code == 200
        assert "fault nan-gauges" in sim.log()
