"""A process's /proc state in words: parsing, naming, and the reader on a real and a fake /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from wedgewatch.core.evidence.proc_state import (
    ProcState,
    parse_kernel_stack,
    sigstop_pending,
)
from wedgewatch.io.procs import read_proc_state

STOP_STACK = (
    "[<0>] do_signal_stop+0x12e/0x240\n[<0>] get_signal+0x58c/0x900\n"
    "[<0>] arch_do_signal_or_restart+0x2e/0x270\n"
)


def test_parse_kernel_stack_keeps_function_names_innermost_first() -> None:
    assert parse_kernel_stack(STOP_STACK) == (
        "do_signal_stop",
        "get_signal",
        "arch_do_signal_or_restart",
    )
    assert parse_kernel_stack("") == ()
    assert len(parse_kernel_stack(STOP_STACK * 10, limit=4)) == 4


@pytest.mark.parametrize(
    ("mask", "pending"),
    [("0000000000040000", True), ("0000000000000000", False), ("zz", False)],
)
def test_sigstop_pending_reads_the_shared_pending_mask(mask: str, pending: bool) -> None:
    assert sigstop_pending(f"Name:\tpython\nShdPnd:\t{mask}\n") is pending
    assert sigstop_pending("Name:\tpython\n") is False


@pytest.mark.parametrize(
    ("state", "word", "words"),
    [
        (
            ProcState(7, "T", wchan="do_signal_stop"),
            "stopped",
            "state T: stopped (SIGSTOP or a debugger); waiting in kernel do_signal_stop",
        ),
        (ProcState(7, "t"), "tracing-stop", "state t: stopped by a tracer (tracing stop)"),
        (ProcState(7, "Z"), "zombie", "state Z: zombie (exited, not reaped by its parent)"),
        (ProcState(7, "D"), "disk-sleep", "state D: uninterruptible sleep (disk or device wait)"),
        (ProcState(7, None), "gone", "process 7 is gone (no /proc/7)"),
        (
            ProcState(7, "S", stop_pending=True),
            "stopped",
            "state S with a SIGSTOP pending: stopping (SIGSTOP sent)",
        ),
        (
            ProcState(7, "S", stopped_threads=1, threads=3),
            "stopped",
            "state S: sleeping; 1 of 3 threads stopped",
        ),
        (ProcState(7, "S"), "sleeping", "state S: sleeping"),
        (ProcState(7, "R"), "running", "state R: running"),
    ],
)
def test_states_in_words(state: ProcState, word: str, words: str) -> None:
    assert state.word == word
    assert state.describe() == words
    assert state.dumpable is (word in ("running", "sleeping", "disk-sleep"))
    assert ProcState.from_json(state.to_json()) == state


def test_from_json_drops_what_is_not_its_type() -> None:
    state = ProcState.from_json({"pid": "x", "state": 5, "kernel_stack": "no", "threads": True})
    assert state == ProcState(0, None)


def test_reader_on_a_fake_proc(tmp_path: Path) -> None:
    """A stat with a spaced comm, a stopped thread, wchan and an unreadable stack."""
    pid = tmp_path / "42"
    (pid / "task" / "42").mkdir(parents=True)
    (pid / "task" / "43").mkdir(parents=True)
    (pid / "stat").write_text("42 (VLLM::Worker TP1) S 1 42\n")
    (pid / "task" / "42" / "stat").write_text("42 (VLLM::Worker TP1) S 1 42\n")
    (pid / "task" / "43" / "stat").write_text("43 (x) T 1 42\n")
    (pid / "status").write_text("ShdPnd:\t0000000000000000\n")
    (pid / "wchan").write_text("0")
    state = read_proc_state(42, proc=str(tmp_path))
    assert (state.state, state.stopped_threads, state.threads) == ("S", 1, 2)
    assert state.wchan is None
    assert state.kernel_stack_error is not None
    assert state.word == "stopped"
    assert read_proc_state(43, proc=str(tmp_path)).gone


def test_reader_on_a_real_stopped_child() -> None:
    """Our own stopped child reads `T`, its stop in wchan (and the kernel stack as root)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        os.waitid(os.P_PID, child.pid, os.WSTOPPED | os.WNOWAIT)
        state = read_proc_state(child.pid)
        assert state.state == "T"
        assert state.word == "stopped"
        assert not state.dumpable
        if os.geteuid() == 0:
            assert state.kernel_stack[0] == "do_signal_stop", state
            assert state.wchan == "do_signal_stop"
    finally:
        child.kill()
        child.wait()
    assert read_proc_state(child.pid).gone
