"""py-spy runner: pure parsing tables, then real py-spy against real child processes.

A few tests put a small shell script in place of py-spy: it does what a misbehaving
py-spy does (leaves the target stopped, hangs, fails with --native) so the runner's
safety nets can be seen working on a real process. No Python call is patched.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from wedgewatch.core.evidence.proc_state import parse_stat_state
from wedgewatch.core.evidence.triage import Frame, Thread
from wedgewatch.io.pyspy import (
    PTRACE_FIX,
    PYSPY_MISSING_FIX,
    DumpStatus,
    PySpyRunner,
    build_argv,
    classify_output,
    first_error_line,
    render_text,
    resolve_pyspy,
)

PYSPY = resolve_pyspy("py-spy")
TARGET = """
import time
def wait_here():
    secret_prompt = "tell me a story"
    while True:
        time.sleep(0.05)
print("ready", flush=True)
wait_here()
"""


def state_of(pid: int) -> str | None:
    """The process state letter from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        return parse_stat_state(f.read())


def unprivileged_prefix() -> tuple[str, ...] | None:
    """argv that runs a command as nobody with no capabilities (setpriv or runuser)."""
    if shutil.which("setpriv"):
        return ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    if shutil.which("runuser"):
        return ("runuser", "-u", "nobody", "--")
    return None


@pytest.fixture
def target() -> Iterator[subprocess.Popen[str]]:
    """A Python child sleeping inside `wait_here` (a local variable holds "prompt" text)."""
    proc = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait()
    proc.stdout.close()


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def gone_or_zombie(pid: int) -> bool:
    """True when the process no longer runs."""
    return not os.path.exists(f"/proc/{pid}") or state_of(pid) == "Z"


def fake_pyspy(tmp_path: Path, body: str) -> str:
    """An executable shell script standing in for py-spy; $3 is the target pid."""
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


# ---------------------------------------------------------------- pure

PERMISSION = "Permission Denied: Try running again with elevated permissions by going 'sudo'\n"
GONE = (
    "Error: Failed to get process executable name. Check that the process is running.\n\n"
    "Caused by:\n    0: No such file or directory (os error 2)\n\nStack backtrace:\n"
    "   0: anyhow::error\n   1: py_spy::main\n"
)


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "status"),
    [
        pytest.param(0, "Process 1: python\n", "", DumpStatus.OK, id="ok"),
        pytest.param(1, "", PERMISSION, DumpStatus.PERMISSION_DENIED, id="permission-denied"),
        pytest.param(
            1,
            "",
            "Error: Operation not permitted (os error 1)",
            DumpStatus.PERMISSION_DENIED,
            id="eperm",
        ),
        pytest.param(1, "", GONE, DumpStatus.NO_PROCESS, id="no-process"),
        pytest.param(
            1,
            "Process 1: x\n",
            "Error: Failed to get stack traces\n",
            DumpStatus.FAILED,
            id="failed",
        ),
        pytest.param(0, "", "", DumpStatus.FAILED, id="empty-output"),
    ],
)
def test_classify_output(code: int, stdout: str, stderr: str, status: DumpStatus) -> None:
    """py-spy's exit code and messages map to a closed set of statuses."""
    assert classify_output(code, stdout, stderr)[0] is status


def test_first_error_line_drops_the_rust_backtrace() -> None:
    """The error kept for the bundle is py-spy's message, not its backtrace."""
    assert first_error_line(GONE) == (
        "Error: Failed to get process executable name. Check that the process is running. | "
        "Caused by: | 0: No such file or directory (os error 2)"
    )
    assert first_error_line("\n\n") is None


@pytest.mark.parametrize(
    ("stat", "state"),
    [
        pytest.param("4242 (python3) S 1 4242 4242 0 -1", "S", id="sleeping"),
        pytest.param("4242 (VLLM::Worker_TP) T 1 4242", "T", id="stopped"),
        pytest.param("4242 (a) b (c)) t 1 2", "t", id="parens-and-spaces-in-comm"),
        pytest.param("garbage", None, id="garbage"),
        pytest.param("1 (x)", None, id="truncated"),
    ],
)
def test_parse_stat_state(stat: str, state: str | None) -> None:
    """The state letter is read after the last parenthesis of the comm."""
    assert parse_stat_state(stat) == state


def test_build_argv_locals_off_by_default() -> None:
    """Locals are only requested when configured (they can hold prompt text)."""
    assert build_argv("py-spy", 7, output="json", native=True, capture_locals=False) == [
        "py-spy",
        "dump",
        "--pid",
        "7",
        "--json",
        "--native",
    ]
    assert build_argv(
        "/p", 7, output="text", native=False, capture_locals=True, prefix=("setpriv", "-x")
    ) == ["setpriv", "-x", "/p", "dump", "--pid", "7", "--locals"]


def test_resolve_pyspy_finds_the_one_next_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty PATH, py-spy is still found next to the running Python (a venv)."""
    monkeypatch.setenv("PATH", "/nonexistent")
    assert resolve_pyspy("py-spy") == str(Path(sys.executable).parent / "py-spy")
    assert resolve_pyspy("no-such-tool-xyz") is None
    assert resolve_pyspy("/nonexistent/py-spy") is None


# ---------------------------------------------------------------- real py-spy

needs_pyspy = pytest.mark.skipif(PYSPY is None, reason="py-spy is not installed")


@needs_pyspy
async def test_dump_real_process(target: subprocess.Popen[str]) -> None:
    """A real dump gives parsed threads and text, native first, and leaves the target running."""
    dump = await PySpyRunner(timeout_seconds=20).dump(target.pid)
    assert dump.status is DumpStatus.OK, dump
    assert dump.threads is not None
    assert any(f.bare == "wait_here" for t in dump.threads for f in t.frames)
    assert dump.text is not None
    assert "wait_here" in dump.text
    assert dump.attempts[0].native is True
    assert dump.attempts[0].output == "json"
    assert not dump.resumed_target
    assert state_of(target.pid) != "T"


@needs_pyspy
async def test_locals_are_not_captured_by_default(target: subprocess.Popen[str]) -> None:
    """Without capture_locals the dump holds no variable values; with it, it does."""
    plain = await PySpyRunner(timeout_seconds=20).dump(target.pid)
    assert plain.json_text is not None
    assert "tell me a story" not in plain.json_text
    with_locals = await PySpyRunner(timeout_seconds=20, capture_locals=True).dump(target.pid)
    assert with_locals.json_text is not None
    assert "tell me a story" in with_locals.json_text


@needs_pyspy
async def test_permission_denied_for_an_unprivileged_pyspy(target: subprocess.Popen[str]) -> None:
    """py-spy as nobody against a root process is recorded as permission denied, with the fix."""
    prefix = unprivileged_prefix()
    if prefix is None:
        pytest.skip("neither setpriv nor runuser exists to drop privileges")
    if os.geteuid() != 0:
        pytest.skip("the target must belong to root for nobody to be refused")
    dump = await PySpyRunner(timeout_seconds=20, argv_prefix=prefix).dump(target.pid)
    assert dump.status is DumpStatus.PERMISSION_DENIED
    assert dump.fix == PTRACE_FIX
    assert "SYS_PTRACE" in PTRACE_FIX
    assert "shareProcessNamespace: true" in PTRACE_FIX
    assert dump.error is not None
    assert "Permission Denied" in dump.error
    assert len(dump.attempts) == 1  # no pointless retry without --native
    assert dump.threads is None


async def test_missing_pyspy_is_recorded_with_the_fix(target: subprocess.Popen[str]) -> None:
    """A py-spy that is not installed is a status with the fix, not an exception."""
    dump = await PySpyRunner(pyspy_path="/nonexistent/py-spy").dump(target.pid)
    assert dump.status is DumpStatus.PYSPY_MISSING
    assert dump.fix == PYSPY_MISSING_FIX
    assert dump.attempts == ()


async def test_vanished_process_is_recorded() -> None:
    """A pid that is gone gives `no_process` without running py-spy."""
    pid = dead_pid()
    dump = await PySpyRunner().dump(pid)
    assert dump.status is DumpStatus.NO_PROCESS
    assert dump.error == f"process {pid} does not exist"
    assert dump.attempts == ()


async def test_target_left_stopped_gets_sigcont(
    target: subprocess.Popen[str], tmp_path: Path
) -> None:
    """When py-spy leaves the target in state T, the runner resumes it and says so."""
    pyspy = fake_pyspy(
        tmp_path, 'kill -STOP "$3"\necho "Error: Failed to get stack traces" >&2\nexit 1\n'
    )
    dump = await PySpyRunner(pyspy_path=pyspy, timeout_seconds=10).dump(target.pid)
    assert dump.status is DumpStatus.FAILED
    assert dump.resumed_target
    assert all(a.resumed_target for a in dump.attempts)
    assert f"process {target.pid} was left stopped (state T) by py-spy; sent SIGCONT" in dump.notes
    assert state_of(target.pid) != "T"


async def test_hung_pyspy_is_killed_and_target_resumed(
    target: subprocess.Popen[str], tmp_path: Path
) -> None:
    """A py-spy past its timeout is killed, the target resumed, and no text dump is attempted."""
    marker = tmp_path / "pid"
    pyspy = fake_pyspy(tmp_path, f'kill -STOP "$3"\necho $$ >> {marker}\nexec sleep 60\n')
    dump = await PySpyRunner(pyspy_path=pyspy, timeout_seconds=0.5).dump(target.pid)
    assert dump.status is DumpStatus.TIMEOUT
    assert [(a.output, a.native, a.status) for a in dump.attempts] == [
        ("json", True, DumpStatus.TIMEOUT),
        ("json", False, DumpStatus.TIMEOUT),
    ]
    assert dump.error == "py-spy did not finish within 0.5 s; killed"
    assert state_of(target.pid) != "T"
    for pid in marker.read_text().split():
        assert gone_or_zombie(int(pid))


@needs_pyspy
async def test_native_failure_falls_back_to_plain(
    target: subprocess.Popen[str], tmp_path: Path
) -> None:
    """When --native fails the dump is retried without it and the text dump follows suit."""
    pyspy = fake_pyspy(
        tmp_path,
        'for a in "$@"; do\n'
        '  if [ "$a" = "--native" ]; then echo "Error: native unwinding failed" >&2; exit 1; fi\n'
        "done\n"
        f'exec {PYSPY} "$@"\n',
    )
    dump = await PySpyRunner(pyspy_path=pyspy, timeout_seconds=20).dump(target.pid)
    assert dump.status is DumpStatus.OK
    assert not dump.native
    assert [(a.output, a.native, a.status) for a in dump.attempts] == [
        ("json", True, DumpStatus.FAILED),
        ("json", False, DumpStatus.OK),
        ("text", False, DumpStatus.OK),
    ]
    assert dump.attempts[0].error == "Error: native unwinding failed"


def stopped(pid: int) -> None:
    """SIGSTOP our child and wait for its stop (waitid, WNOWAIT: the stop is not consumed)."""
    os.kill(pid, signal.SIGSTOP)
    os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOWAIT)


@needs_pyspy
@pytest.mark.parametrize("nonblocking", [False, True], ids=["blocking", "gentle"])
async def test_already_stopped_target_is_read_without_attaching_and_left_as_found(
    target: subprocess.Popen[str], nonblocking: bool
) -> None:
    """A target someone else stopped is never resumed nor ptrace-attached (a blocking py-spy
    fails on it: "Failed to suspend process"): its memory is read with --nonblocking, and the
    dump says in words that it is stopped, with its kernel wait."""
    stopped(target.pid)
    dump = await PySpyRunner(timeout_seconds=20, nonblocking=nonblocking).dump(target.pid)
    assert dump.status is DumpStatus.OK, dump
    assert dump.threads is not None
    assert any(t.frames for t in dump.threads)  # the stopped main thread's Python frames
    assert dump.attempts
    assert all(a.nonblocking and not a.native for a in dump.attempts)
    assert not dump.resumed_target
    assert dump.process_state is not None
    assert dump.process_state.word == "stopped"
    assert dump.why is not None
    assert dump.why.startswith(f"process {target.pid} state T: stopped (SIGSTOP or a debugger)")
    assert any(
        n.startswith(f"process {target.pid} was already stopped (state T: stopped")
        for n in dump.notes
    )
    record = dump.to_json()
    assert record["why"] == dump.why
    assert isinstance(record["process_state"], dict)
    assert record["process_state"]["state"] == "T"
    if os.geteuid() == 0:  # root reads the kernel stack: the stop is in it
        assert "do_signal_stop" in dump.process_state.kernel_stack, dump.process_state
    assert state_of(target.pid) == "T"


def test_a_zombie_is_not_dumped_and_the_reason_is_its_state() -> None:
    """An exited, unreaped child is `no_process` with "zombie" in words; py-spy is not run."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped
        dump = asyncio.run(PySpyRunner().dump(child.pid))
        assert dump.status is DumpStatus.NO_PROCESS
        assert dump.error == f"process {child.pid} is zombie: nothing to dump"
        assert dump.attempts == ()
        assert dump.why == f"process {child.pid} state Z: zombie (exited, not reaped by its parent)"
    finally:
        child.wait()


@pytest.fixture
def targets() -> Iterator[list[subprocess.Popen[str]]]:
    """Three sleeping Python children."""
    procs = [
        subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.readline()
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


@needs_pyspy
async def test_dumps_of_several_processes_in_parallel(
    targets: list[subprocess.Popen[str]],
) -> None:
    """Several processes dumped at once each get their own result, JSON-safe when recorded."""
    runner = PySpyRunner(timeout_seconds=20)
    dumps = await asyncio.gather(*(runner.dump(p.pid) for p in targets))
    assert [d.pid for d in dumps] == [p.pid for p in targets]
    assert {d.status for d in dumps} == {DumpStatus.OK}
    record = json.loads(json.dumps(dumps[0].to_json()))
    assert record["status"] == "ok"
    assert [a["output"] for a in record["attempts"]] == ["json", "text"]


# ---------------------------------------------------------------- the gentle (suspect) mode


def test_render_text_follows_pyspys_text_layout() -> None:
    """Threads from a JSON dump render as py-spy's text: a thread line, then its frames."""
    threads = (
        Thread(
            1, 42, "MainThread", True, (Frame("step", "engine.py", 7), Frame("loop", "c.py", 2))
        ),
        Thread(2, None, None, False, (Frame("get", "queue.py", 171),)),
    )
    assert render_text(9, threads) == (
        "Process 9: (rendered from py-spy dump --json --nonblocking)\n"
        "\n"
        'Thread 42 (active): "MainThread"\n'
        "    step (engine.py:7)\n"
        "    loop (c.py:2)\n"
        "Thread 2 (idle)\n"
        "    get (queue.py:171)\n"
    )


def test_build_argv_nonblocking() -> None:
    """The gentle run asks py-spy not to pause the target."""
    argv = build_argv(
        "py-spy", 7, output="json", native=False, capture_locals=False, nonblocking=True
    )
    assert argv == ["py-spy", "dump", "--pid", "7", "--json", "--nonblocking"]


@needs_pyspy
async def test_nonblocking_dump_is_one_json_run_with_rendered_text(
    target: subprocess.Popen[str], tmp_path: Path
) -> None:
    """One py-spy run per process, `--json --nonblocking`, no --native; the text comes from it."""
    calls = tmp_path / "calls"
    pyspy = fake_pyspy(tmp_path, f'echo "$@" >> {calls}\nexec {PYSPY} "$@"\n')
    dump = await PySpyRunner(pyspy_path=pyspy, timeout_seconds=20, nonblocking=True).dump(
        target.pid
    )
    assert dump.status is DumpStatus.OK, dump
    assert calls.read_text().splitlines() == [f"dump --pid {target.pid} --json --nonblocking"]
    assert [(a.output, a.native, a.nonblocking) for a in dump.attempts] == [("json", False, True)]
    assert dump.threads is not None
    assert any(f.bare == "wait_here" for t in dump.threads for f in t.frames)
    assert dump.text is not None
    assert dump.text.startswith(f"Process {target.pid}: (rendered from")
    assert "wait_here (<string>:" in dump.text
    assert dump.to_json()["attempts"][0]["nonblocking"] is True  # type: ignore[index]
    assert state_of(target.pid) != "T"


async def test_a_torn_nonblocking_read_is_repeated_nonblocking_only(
    target: subprocess.Popen[str], tmp_path: Path
) -> None:
    """A failed gentle read is repeated, still --nonblocking, at most 3 runs; never blocking."""
    calls = tmp_path / "calls"
    pyspy = fake_pyspy(
        tmp_path,
        f'echo "$@" >> {calls}\n'
        'echo "Error: Failed to copy PyFrameObject (os error 14)" >&2\nexit 1\n',
    )
    dump = await PySpyRunner(pyspy_path=pyspy, timeout_seconds=5, nonblocking=True).dump(target.pid)
    assert dump.status is DumpStatus.FAILED
    assert dump.error == "Error: Failed to copy PyFrameObject (os error 14)"
    assert calls.read_text().splitlines() == [f"dump --pid {target.pid} --json --nonblocking"] * 3
    assert dump.text is None


async def test_a_nonblocking_read_that_cannot_succeed_is_not_repeated(
    target: subprocess.Popen[str], tmp_path: Path
) -> None:
    """Permission denied is final: one run."""
    calls = tmp_path / "calls"
    pyspy = fake_pyspy(tmp_path, f'echo "$@" >> {calls}\necho "{PERMISSION.strip()}" >&2\nexit 1\n')
    dump = await PySpyRunner(pyspy_path=pyspy, timeout_seconds=5, nonblocking=True).dump(target.pid)
    assert dump.status is DumpStatus.PERMISSION_DENIED
    assert dump.fix == PTRACE_FIX
    assert len(calls.read_text().splitlines()) == 1
