"""Adversarial tests (issue #21): values a target supplies are data, never a stuck remedy.

A real `wedgewatch run` child watches a real HTTP target that reports a wedged engine
whose `model_name` is hostile (a NUL byte; 2 MB), and restarts it with the real `exec`
remedy, a shell script that records the environment it was given.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always
from test_safety import FAST as SAFETY_FAST
from wedgewatch_daemon import DaemonProcess

from wedgewatch.core.text.escape import TRUNCATION_MARKER, neutralise
from wedgewatch.io.notify import Notification, payload
from wedgewatch.io.restarters import ENV_VALUE_MAX_CHARS, RestartRequest, exec_environment
from wedgewatch.vllm.signals import MAX_LABEL_CHARS, Exposition, parse, truncate

pytestmark = pytest.mark.slow

# test_safety.py's fast thresholds; a restart that brings no new server fails within 2 s.
FAST = [*SAFETY_FAST, "--startup-timeout-seconds", "2"]


def wedged_body(model_name: str) -> bytes:
    """A vLLM exposition with one engine that has work and never progresses (a hang)."""
    labels = f'engine="0",model_name="{model_name}"'
    lines = [
        f"vllm:num_requests_running{{{labels}}} 1.0",
        f"vllm:num_requests_waiting{{{labels}}} 0.0",
        f"vllm:prompt_tokens_total{{{labels}}} 10.0",
        f"vllm:generation_tokens_total{{{labels}}} 10.0",
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} 1.0',
        f"vllm:num_preemptions_total{{{labels}}} 0.0",
        f"vllm:iteration_tokens_total_count{{{labels}}} 5.0",
        "process_start_time_seconds 1.7e+09",
    ]
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemons; each is killed after the test if it is still running."""
    started: list[DaemonProcess] = []
    yield lambda args: started.append(DaemonProcess(args, tmp_path)) or started[-1]
    for daemon in started:
        if daemon.proc.poll() is None:
            daemon.kill9()


def _recording_remedy(directory: Path) -> Path:
    """A remedy script that appends its WEDGEWATCH_MODEL_NAME (one line per run) and exits 0."""
    script = directory / "remedy.sh"
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$WEDGEWATCH_MODEL_NAME" >> "$0.calls"\nexit 0\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize(
    ("model_name", "expected"),
    [
        ("evil\x00model", "evil\\x00model"),
        ("m" * 2_000_000, None),  # None: cut with a marker
    ],
    ids=["nul-byte", "2-MB"],
)
def test_a_hostile_model_name_never_sticks_the_exec_remedy(
    daemons: Callable[..., DaemonProcess], tmp_path: Path, model_name: str, expected: str | None
) -> None:
    """The command runs, is told a neutralised name, and the attempt completes and is counted.

    Before: a NUL raised ValueError building the environment, the restart stayed "in
    progress" for ever and the command never ran; 2 MB made exec fail with E2BIG and put
    megabytes into every log line.
    """
    script = _recording_remedy(tmp_path)
    with (
        ScriptedServer(always(Reply(body=wedged_body(model_name)))) as target,
        ScriptedServer(always(Reply())) as receiver,
    ):
        daemon = daemons(
            [
                "--target", f"t={target.url}", "--remedy", "exec",
                "--exec-command", str(script), "--max-body-bytes", "64MiB",
                "--restart-budget", "2", "--webhook-url", receiver.url, *FAST,
            ]
        )  # fmt: skip
        completed = daemon.wait_for("restart_completed", timeout_seconds=60)
        assert completed["target"] == "t"
        daemon.wait_for("restart_failed", timeout_seconds=60)  # not_replaced: same server
        status = daemon.get("/status").json()["targets"][0]
        assert status["restart_in_progress"] is False
        assert status["last_restart_failure"]["reason"] == "not_replaced"
        assert daemon.stop() == 0  # delivers the queued webhooks first
        bodies = [request.body for request in receiver.requests]
    assert bodies  # the webhooks went out, each of them small
    assert max(len(body) for body in bodies) < 32_768
    told = (tmp_path / "remedy.sh.calls").read_text().splitlines()[0]
    if expected is not None:
        assert told == expected
    else:
        assert told.startswith("m" * MAX_LABEL_CHARS + TRUNCATION_MARKER)
        assert len(told) < MAX_LABEL_CHARS + 64
    # No log line carries the 2 MB (or any huge) value.
    assert max(len(line) for line in daemon.log_path.read_text().splitlines()) < 20_000


def test_a_remedy_that_raises_is_a_failed_attempt_not_a_stuck_one(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Any failure to launch (here: a command that is a directory) is counted and reported."""
    with ScriptedServer(always(Reply(body=wedged_body("m")))) as target:
        daemon = daemons(
            [
                "--target", f"t={target.url}", "--remedy", "exec",
                "--exec-command", str(tmp_path), "--restart-budget", "2", *FAST,
            ]
        )  # fmt: skip
        failed = daemon.wait_for("restart_failed", timeout_seconds=60)
        assert failed["reason"] == "remedy_error", failed
        status = daemon.get("/status").json()["targets"][0]
        assert status["restart_in_progress"] is False
        assert daemon.stop() == 0


def test_exec_environment_neutralises_every_value() -> None:
    """Control characters become visible escapes; huge values are cut with a marker."""
    request = RestartRequest(
        target="t",
        url="http://127.0.0.1:1/metrics",
        model_name="a\x00b\x1b[31mc\nd",
        engine="e" * 100_000,
        family="progress_stall",
        state="wedged",
        reason="r\r\n",
    )
    env = exec_environment(request, {"PATH": "/bin"})
    assert env["WEDGEWATCH_MODEL_NAME"] == "a\\x00b\\x1b[31mc\\x0ad"
    assert env["WEDGEWATCH_REASON"] == "r\\x0d\\x0a"
    assert env["WEDGEWATCH_ENGINE"].startswith("e" * ENV_VALUE_MAX_CHARS + TRUNCATION_MARKER)
    assert all("\x00" not in v and len(v) < ENV_VALUE_MAX_CHARS + 64 for v in env.values())


def test_a_webhook_payload_is_bounded_whatever_its_values() -> None:
    """Every field cut with a marker: a 2 MB reason makes a body of a few KiB."""
    huge = Notification(
        event="wedge_detected",
        target="t" * 100_000,
        engine="e",
        model_name="m" * 2_000_000,
        family="progress_stall",
        state="wedged",
        reason="r" * 2_000_000,
        timestamp=0.0,
        bundle="/b" * 100_000,
    )
    body = payload(huge, version="v", host="h")
    assert len(json.dumps(body)) < 32_768
    assert TRUNCATION_MARKER in body["model_name"]
    assert TRUNCATION_MARKER in body["text"]


def test_long_labels_are_cut_but_stay_distinct() -> None:
    """Two 1 MB model names sharing a prefix are two engines, each cut with its own digest."""
    body = wedged_body("x" * 1_000_000 + "A") + wedged_body("x" * 1_000_000 + "B").replace(
        b"process_start_time_seconds 1.7e+09\n", b""
    )
    parsed = parse(body)
    assert isinstance(parsed, Exposition), parsed
    names = sorted(key.model_name for key in parsed.engines)
    assert len(names) == 2
    assert names[0] != names[1]
    assert all(len(n) < MAX_LABEL_CHARS + 64 for n in names)
    assert truncate("short") == "short"
    assert neutralise("ok") == "ok"
