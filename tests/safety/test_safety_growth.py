"""Adversarial tests (issue #21): nothing a target says makes wedgewatch grow without bound.

The pure detector core under a target that names new engines on every scrape, and a real
`wedgewatch run` child against a real hostile HTTP target doing the same.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

import httpx
import pytest
import structlog
from scripted_http import Reply, ScriptedServer
from wedgewatch_daemon import DaemonProcess

from wedgewatch.core.detection.detect import DetectionPolicy, Scraped, TargetState, step
from wedgewatch.core.detection.states import EngineState
from wedgewatch.lograte import LINES_PER_TARGET_PER_MINUTE, TargetLogLimit
from wedgewatch.vllm.signals import MAX_SERIES_PER_ENGINE, Exposition, ParseFailure, parse


def engines_body(first: int, count: int, *, model: str = "m") -> bytes:
    """An idle vLLM exposition naming engines first .. first+count-1."""
    lines = []
    for n in range(first, first + count):
        labels = f'engine="{n}",model_name="{model}"'
        lines += [
            f"vllm:num_requests_running{{{labels}}} 0.0",
            f"vllm:num_requests_waiting{{{labels}}} 0.0",
            f"vllm:prompt_tokens_total{{{labels}}} 0.0",
            f"vllm:generation_tokens_total{{{labels}}} 0.0",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} 0.0',
            f"vllm:num_preemptions_total{{{labels}}} 0.0",
            f"vllm:iteration_tokens_total_count{{{labels}}} 0.0",
        ]
    lines.append("process_start_time_seconds 1.7e+09")
    return ("\n".join(lines) + "\n").encode()


def exposition(first: int, count: int) -> Exposition:
    parsed = parse(engines_body(first, count))
    assert isinstance(parsed, Exposition), parsed
    return parsed


def test_new_engines_on_every_scrape_never_grow_the_detector() -> None:
    """200 new engines per scrape, 100 scrapes: never more than max_engines remembered.

    Before: max_engines bounded one response only, vanished engines were kept for ever,
    and the state grew by 200 engines a scrape (19,000 in 90 s in the attack).
    """
    policy = DetectionPolicy(max_engines=256, unreachable_after_seconds=1)
    state = TargetState.initial()
    verdict = None
    for n in range(100):
        state, verdict = step(state, Scraped(float(n), exposition(200 * n, 200)), policy)
        assert len(state.engines) <= 256
        assert len(verdict.engines) <= 256
    assert verdict is not None
    assert verdict.engines
    assert all("too_many_engines" in e.reason for e in verdict.engines), verdict.engines[0]


def test_a_vanished_engine_is_judged_then_forgotten() -> None:
    """An engine gone from /metrics is UNREACHABLE after the threshold, forgotten at expiry."""
    policy = DetectionPolicy(unreachable_after_seconds=30, vanished_engine_expiry_seconds=600)
    state, _ = step(TargetState.initial(), Scraped(0.0, exposition(0, 2)), policy)
    state, verdict = step(state, Scraped(40.0, exposition(0, 1)), policy)
    assert [e.missing for e in verdict.engines] == [False, True]  # missing since 40 s
    state, verdict = step(state, Scraped(80.0, exposition(0, 1)), policy)
    assert verdict.state is EngineState.UNREACHABLE
    state, verdict = step(state, Scraped(40.0 + 599, exposition(0, 1)), policy)
    assert len(state.engines) == 2
    state, verdict = step(state, Scraped(40.0 + 600, exposition(0, 1)), policy)
    assert [e.key.engine for e in verdict.engines] == ["0"]
    assert verdict.state is EngineState.IDLE


def test_a_restarted_server_is_judged_on_its_own_engines() -> None:
    """Rule U5 counts the remembered engines only while the server is the same one."""
    policy = DetectionPolicy(max_engines=3)
    state, _ = step(TargetState.initial(), Scraped(0.0, exposition(0, 3)), policy)
    restarted = parse(engines_body(10, 3).replace(b"1.7e+09", b"1.8e+09"))
    assert isinstance(restarted, Exposition)
    state, verdict = step(state, Scraped(1.0, restarted), policy)
    assert sorted(e.key.engine for e in verdict.engines) == ["10", "11", "12"]
    assert verdict.state is EngineState.IDLE


@pytest.mark.slow
def test_the_daemon_does_not_grow_under_a_target_naming_new_engines(tmp_path: Path) -> None:
    """A real hostile target: 200 new engines per scrape, 25 scrapes; /status stays bounded."""
    with ScriptedServer(lambda n, path: Reply(body=engines_body(200 * n, 200))) as target:
        daemon = DaemonProcess(
            ["--target", f"t={target.url}", "--interval-seconds", "0.05"], tmp_path
        )
        try:
            while len(target.requests) < 25:
                daemon.wait_for("daemon_started")  # (returns at once) the daemon still runs
                with httpx.Client() as client:
                    status = client.get(daemon.base_url + "/status", timeout=30).json()
                assert len(status["targets"][0]["engines"]) <= 256
            engines = daemon.get("/status").json()["targets"][0]["engines"]
            assert 0 < len(engines) <= 256
            assert any("too_many_engines" in e["reason"] for e in engines)
        finally:
            daemon.stop()
    state_file = tmp_path / "state" / "state.json"
    assert state_file.stat().st_size < 2_000_000


def test_log_lines_per_target_are_bounded_and_the_dropped_are_counted() -> None:
    """Over the bound: one notice, then nothing; the next minute's first line has the count."""
    now = [0.0]
    limit = TargetLogLimit(lines_per_minute=3, clock=lambda: now[0])
    passed = []
    for n in range(10):
        with contextlib.suppress(structlog.DropEvent):
            passed.append(limit(None, "info", {"event": f"e{n}", "target": "t"}))
    assert [line["event"] for line in passed] == ["e0", "e1", "e2", "log_lines_suppressed"]
    assert limit(None, "info", {"event": "own"}) == {"event": "own"}  # no target: never limited
    assert limit(None, "info", {"event": "x", "target": "other"})["event"] == "x"
    now[0] = 60.0
    assert limit(None, "info", {"event": "later", "target": "t"}) == {
        "event": "later",
        "target": "t",
        "dropped_log_lines": 6,
    }


@pytest.mark.slow
def test_the_daemon_log_is_bounded_under_a_flapping_target(tmp_path: Path) -> None:
    """400 engines that vanish and come back on every scrape: at most the bound per minute.

    Before: every scrape logged 400 transitions, without limit.
    """
    bodies = (engines_body(0, 400), engines_body(400, 400))
    with ScriptedServer(lambda n, path: Reply(body=bodies[n % 2])) as target:
        daemon = DaemonProcess(
            [
                "--target", f"t={target.url}", "--interval-seconds", "0.05",
                "--max-engines", "1000",
            ],
            tmp_path,
        )  # fmt: skip
        try:
            daemon.wait_for("log_lines_suppressed", timeout_seconds=120)
            while len(target.requests) < 20:
                daemon.wait_for("daemon_started")  # (at once) the daemon still runs
        finally:
            daemon.stop()
    about_t = [line for line in daemon.lines() if line.get("target") == "t"]
    times = [dt.datetime.fromisoformat(line["timestamp"]) for line in about_t]
    minutes = 1 + int((max(times) - min(times)).total_seconds() // 60)
    assert len(about_t) <= (LINES_PER_TARGET_PER_MINUTE + 1) * minutes
    assert len(about_t) >= LINES_PER_TARGET_PER_MINUTE  # the flood was real


def test_an_engine_with_thousands_of_reason_series_is_refused() -> None:
    """A reading never holds more than MAX_SERIES_PER_ENGINE reasons (they are kept in
    the detector's memory, the state file and /status)."""
    extra = "".join(
        f'vllm:request_success_total{{engine="0",model_name="m",finished_reason="r{n}"}} 0.0\n'
        for n in range(5000)
    ).encode()
    parsed = parse(engines_body(0, 1) + extra)
    assert isinstance(parsed, ParseFailure)
    assert f"more than {MAX_SERIES_PER_ENGINE} finished_reason values" in parsed.message
    few = parse(engines_body(0, 1) + b"".join(extra.splitlines(keepends=True)[:5]))
    assert isinstance(few, Exposition)
