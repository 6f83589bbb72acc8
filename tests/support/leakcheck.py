"""The suite leaves no process behind: every process it started is gone when it ends.

At the start of a session a marker (`WWTEST_SESSION=<pid>-<random>`) is put into the
environment, which every child process inherits (and keeps when it is orphaned, unlike its
parent pid). At the end, every process carrying this session's marker, and every live
descendant of the pytest process, is a leak: it gets a few seconds to finish exiting (an
orphaned simulator engine ends itself within ORPHAN_EXIT_GRACE_SECONDS), then the leaks
are listed, their process groups and themselves are killed, and the session fails.

Children started with an environment built from scratch do not carry the marker: build
test environments from `os.environ` (or add `MARK_VARIABLE`), as every test here does.

Under pytest-xdist each worker is a session of its own: it marks its environment with its own
marker (so one worker ending early never counts another's children), checks its own leaks
when it ends, and sends what it found to the controller (`config.workeroutput`), which
reports them and fails the run. The controller itself starts no test process and checks
nothing else. Loaded by tests/conftest.py; tests/meta/test_leakcheck.py runs leaking sessions,
serial and with `-n 2`, to check it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time

import psutil
import pytest

MARK_VARIABLE = "WWTEST_SESSION"  # not WEDGEWATCH_*: that prefix is wedgewatch's settings
_SETTLE_SECONDS = 6.0


_OUTPUT_KEY = "wwtest_leaks"
_WORKER_LEAKS = pytest.StashKey[list[str]]()


def _is_xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no"


def pytest_configure(config: pytest.Config) -> None:
    """Mark this session's environment (inherited by every process the tests start)."""
    config.stash[_WORKER_LEAKS] = []
    if _is_xdist_controller(config):
        os.environ.pop(MARK_VARIABLE, None)  # each worker marks its own session
        return
    os.environ[MARK_VARIABLE] = f"{os.getpid()}-{secrets.token_hex(6)}"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object) -> None:
    """xdist controller: collect what a finished worker found."""
    output = getattr(node, "workeroutput", None) or {}
    config = getattr(node, "config", None)
    if config is not None and output.get(_OUTPUT_KEY):
        config.stash[_WORKER_LEAKS].extend(output[_OUTPUT_KEY])


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leaked_processes(mark: str) -> list[psutil.Process]:
    """Live processes carrying `mark`, or descending from this one (never this one)."""
    me = psutil.Process()
    spared = {me.pid, *(p.pid for p in me.parents())}
    found: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        for child in me.children(recursive=True):
            found[child.pid] = child
    for proc in psutil.process_iter():
        if proc.pid in spared or proc.pid in found:
            continue
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARK_VARIABLE) == mark:
                found[proc.pid] = proc
    return [p for p in found.values() if p.pid not in spared and _alive(p)]


def _describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:120] or proc.name()}"
    except psutil.Error:
        return f"pid {proc.pid}"


def _check(mark: str | None) -> list[str]:
    """The processes carrying `mark` (or descending from this one) still alive after a grace
    period, described; they are killed."""
    if not mark:
        return []
    deadline = time.monotonic() + _SETTLE_SECONDS
    leaked = leaked_processes(mark)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.2)
        leaked = leaked_processes(mark)
    lines = [_describe(p) for p in leaked]
    _kill(leaked)
    return lines


def _kill(procs: list[psutil.Process]) -> None:
    own_group = os.getpgrp()
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError, psutil.Error):
            group = os.getpgid(proc.pid)
            if group != own_group:
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session if any process it started is still alive (after killing them)."""
    config = session.config
    if _is_xdist_controller(config):
        lines = config.stash[_WORKER_LEAKS]
    else:
        lines = _check(os.environ.get(MARK_VARIABLE))
        if lines and hasattr(config, "workeroutput"):
            config.workeroutput[_OUTPUT_KEY] = lines  # the controller reports and fails
    if not lines:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = (
        f"{len(lines)} process(es) started by this test session were still alive "
        f"{_SETTLE_SECONDS:g} s after it ended (now killed):\n  " + "\n  ".join(lines)
    )
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
