"""Tests of the restarters against real processes (signal, systemd, exec, supervise)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from wedgewatch.core.restart.restart_policy import (
    FailureReason,
    RestartOutcome,
    RestartPolicy,
)
from wedgewatch.io import restarters
from wedgewatch.io.restarters import (
    ExecRestarter,
    RestartRequest,
    SignalRestarter,
    SuperviseRestarter,
    Supervisor,
    SupervisorError,
    SystemdRestarter,
)
from wedgewatch.io.supervisor import SystemdStateProbe

CHILD = Path(__file__).parents[1] / "support" / "child_process.py"
POLICY = RestartPolicy()  # 3 per 3600 s, backoff 60 doubling to 900, startup 900
OK = RestartOutcome(ok=True, detail="done", duration_seconds=1.0)
FAILED = RestartOutcome(False, "boom", 1.0, FailureReason.REMEDY_ERROR)
TIMED_OUT = RestartOutcome(False, "slow", 1.0, FailureReason.TIMEOUT)

# ---------------------------------------------------------------------------------------
# Restarters against real processes


def _request(
    pid: int | None = None, bundle: Path | None = None, *, explicit: bool = True
) -> RestartRequest:
    return RestartRequest(
        target="vllm-a",
        url="http://127.0.0.1:8000",
        model_name="Qwen/Qwen3-8B",
        engine="0",
        family="deferred_stall",
        state="wedged",
        reason="running 0, waiting 5 (deferred 5), no progress for 300 s",
        bundle=bundle,
        server_pid=pid,
        server_pid_explicit=explicit,  # these trees are named by pid, as a target's `pid` does
    )


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_dead(pid: int) -> bool:
    """Wait (bounded) until `pid` is gone or a zombie."""
    deadline = time.monotonic() + 10
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_for_file(path: Path) -> bool:
    """Wait (bounded) until `path` exists."""
    deadline = time.monotonic() + 10
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _wait_for_pids(directory: Path, roles: list[str]) -> dict[str, int]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all((directory / f"{r}.pid").exists() for r in roles):
            return {r: int((directory / f"{r}.pid").read_text()) for r in roles}
        time.sleep(0.02)
    raise AssertionError(
        f"the process tree in {directory} did not come up: {os.listdir(directory)}"
    )


TREE = ["root", "child0", "child1", "grand0", "grand1"]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started by a test; whatever is left is killed and reaped afterwards."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _start_tree(
    spawned: list[subprocess.Popen[bytes]],
    directory: Path,
    *options: str,
    mode: str = "tree",
    new_session: bool = True,
    roles: list[str] = TREE,
) -> dict[str, int]:
    directory.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), mode, str(directory), *options],
        start_new_session=new_session,
    )
    spawned.append(proc)
    return _wait_for_pids(directory, roles)


def _kill_leftovers(pids: dict[str, int]) -> None:
    for pid in pids.values():
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_signal_stops_a_well_behaved_tree_on_sigterm(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A tree that exits on SIGTERM is gone before the grace, without SIGKILL."""
    pids = _start_tree(spawned, tmp_path / "tree")
    assert os.getpgid(pids["root"]) == pids["root"]
    outcome = await SignalRestarter(grace_seconds=60).restart(_request(pids["root"]))
    assert outcome.ok, outcome.detail
    assert "SIGTERM to process group" in outcome.detail
    assert "exited on SIGTERM" in outcome.detail
    assert not [r for r, pid in pids.items() if _alive(pid)]


async def test_signal_reaches_orphans_left_in_the_group(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A worker orphaned by an earlier death (no longer a descendant) still gets killed."""
    pids = _start_tree(spawned, tmp_path / "tree", "--orphan", "child0", "--stubborn", "grand0")
    assert _wait_dead(pids["child0"])
    root = psutil.Process(pids["root"])
    assert pids["grand0"] not in {p.pid for p in root.children(recursive=True)}
    try:
        outcome = await SignalRestarter(grace_seconds=0.5).restart(_request(pids["root"]))
        assert outcome.ok, outcome.detail
        assert not [r for r, pid in pids.items() if _alive(pid)]
    finally:
        _kill_leftovers(pids)


async def test_signal_kills_a_tree_that_ignores_sigterm(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Processes that ignore SIGTERM are SIGKILLed after the grace, orphans and escapees too."""
    pids = _start_tree(
        spawned,
        tmp_path / "tree",
        "--stubborn",
        "child0,grand0,grand1",
        "--escape",
        "grand1",
    )
    assert os.getpgid(pids["grand1"]) != pids["root"]  # it left the group
    try:
        outcome = await SignalRestarter(grace_seconds=0.5).restart(_request(pids["root"]))
        assert outcome.ok, outcome.detail
        assert "sent SIGKILL" in outcome.detail
        assert not [r for r, pid in pids.items() if _alive(pid)]
    finally:
        _kill_leftovers(pids)


async def test_signal_spares_the_supervising_parent(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A server sharing its supervisor's group is signalled process by process; the parent lives."""
    pids = _start_tree(
        spawned, tmp_path / "tree", "--stubborn", "grand0", mode="parent", roles=["parent", *TREE]
    )
    assert os.getpgid(pids["root"]) == pids["parent"]
    try:
        outcome = await SignalRestarter(grace_seconds=0.5).restart(_request(pids["root"]))
        assert outcome.ok, outcome.detail
        assert "does not lead its process group" in outcome.detail
        assert not [r for r, pid in pids.items() if r != "parent" and _alive(pid)]
        assert _alive(pids["parent"])
    finally:
        _kill_leftovers(pids)


async def test_signal_never_touches_our_own_process_group(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A server in wedgewatch's own process group is killed alone; we are not signalled."""
    received: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        pids = _start_tree(spawned, tmp_path / "tree", new_session=False)
        assert os.getpgid(pids["root"]) == os.getpgrp()
        outcome = await SignalRestarter(grace_seconds=5).restart(_request(pids["root"]))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert outcome.ok, outcome.detail
    assert received == []
    assert not [r for r, pid in pids.items() if _alive(pid)]


@pytest.mark.parametrize(
    ("pid", "ok", "text"),
    [
        pytest.param(None, False, "no server process is known", id="unknown-pid"),
        pytest.param(os.getpid(), False, "refusing", id="ourselves"),
        pytest.param(os.getppid(), False, "refusing", id="our-parent"),
    ],
)
async def test_signal_refuses_what_it_must_not_do(pid: int | None, ok: bool, text: str) -> None:
    """No pid, our own pid or an ancestor's is a failed outcome, not a signal."""
    outcome = await SignalRestarter(grace_seconds=1).restart(_request(pid))
    assert outcome.ok is ok
    assert text in outcome.detail
    expected = FailureReason.REMEDY_ERROR if pid is None else FailureReason.NOT_VLLM
    assert outcome.failure is expected


async def test_signal_reports_an_already_gone_server_as_done() -> None:
    """A server pid that no longer exists means the old tree is gone: ok."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await proc.wait()
    outcome = await SignalRestarter(grace_seconds=1).restart(_request(proc.pid))
    assert outcome.ok
    assert "already exited" in outcome.detail


async def test_exec_passes_the_verdict_in_the_environment(tmp_path: Path) -> None:
    """The exec command sees every WEDGEWATCH_* variable of the verdict."""
    out = tmp_path / "env.json"
    restarter = ExecRestarter([sys.executable, str(CHILD), "env-dump", str(out)])
    outcome = await restarter.restart(_request(bundle=tmp_path / "bundle"))
    assert outcome.ok, outcome.detail
    assert json.loads(out.read_text()) == {
        "WEDGEWATCH_TARGET": "vllm-a",
        "WEDGEWATCH_URL": "http://127.0.0.1:8000",
        "WEDGEWATCH_ENGINE": "0",
        "WEDGEWATCH_MODEL_NAME": "Qwen/Qwen3-8B",
        "WEDGEWATCH_FAMILY": "deferred_stall",
        "WEDGEWATCH_STATE": "wedged",
        "WEDGEWATCH_REASON": "running 0, waiting 5 (deferred 5), no progress for 300 s",
        "WEDGEWATCH_BUNDLE": str(tmp_path / "bundle"),
    }


async def test_exec_without_bundle_passes_an_empty_path(tmp_path: Path) -> None:
    """WEDGEWATCH_BUNDLE is empty when no bundle was captured."""
    out = tmp_path / "env.json"
    restarter = ExecRestarter([sys.executable, str(CHILD), "env-dump", str(out)])
    assert (await restarter.restart(_request())).ok
    assert json.loads(out.read_text())["WEDGEWATCH_BUNDLE"] == ""


async def test_exec_failure_carries_status_and_stderr() -> None:
    """A non-zero exit is a remedy_error whose detail has the status and the stderr tail."""
    restarter = ExecRestarter([sys.executable, str(CHILD), "fail", "3", "no such deployment"])
    outcome = await restarter.restart(_request())
    assert not outcome.ok
    assert outcome.failure is FailureReason.REMEDY_ERROR
    assert "exit status 3" in outcome.detail
    assert "no such deployment" in outcome.detail


async def test_exec_timeout_kills_the_whole_command_group(tmp_path: Path) -> None:
    """A command past its deadline is killed with its children and reported as a timeout."""
    restarter = ExecRestarter(
        [sys.executable, str(CHILD), "spawn-and-sleep", str(tmp_path)], timeout_seconds=4.0
    )
    outcome = await restarter.restart(_request())
    assert not outcome.ok
    assert outcome.failure is FailureReason.TIMEOUT
    assert "did not finish within" in outcome.detail
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    assert await asyncio.to_thread(_wait_dead, grandchild)


async def test_exec_missing_program_is_a_clear_failure() -> None:
    """A program that does not exist is a remedy_error naming it."""
    outcome = await ExecRestarter(["/nonexistent/restart-vllm"]).restart(_request())
    assert not outcome.ok
    assert "'/nonexistent/restart-vllm' was not found" in outcome.detail


def test_exec_requires_a_program() -> None:
    """An empty exec_command is a configuration error."""
    with pytest.raises(ValueError, match="exec_command"):
        ExecRestarter([])


def _fake_systemctl(directory: Path, body: str) -> Path:
    directory.mkdir()
    script = directory / "systemctl"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return directory


async def test_systemd_runs_systemctl_restart_with_the_unit(tmp_path: Path) -> None:
    """The argv is `systemctl --no-ask-password restart UNIT`, found on PATH, env inherited."""
    log = tmp_path / "calls"
    bin_dir = _fake_systemctl(
        tmp_path / "bin", f'printf "%s\\n" "$@" > {log}\necho "$MARKER" >> {log}\n'
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MARKER": "inherited"}
    outcome = await SystemdRestarter("vllm.service", env=env).restart(_request())
    assert outcome.ok, outcome.detail
    assert log.read_text().splitlines() == [
        "--no-ask-password",
        "restart",
        "vllm.service",
        "inherited",
    ]


async def test_systemd_user_units(tmp_path: Path) -> None:
    """user=True restarts a user unit (`systemctl --user ...`)."""
    restarter = SystemdRestarter("vllm.service", user=True)
    assert restarter.argv == ("systemctl", "--user", "--no-ask-password", "restart", "vllm.service")


async def test_systemd_failure_reports_systemctl_stderr(tmp_path: Path) -> None:
    """A failing systemctl gives remedy_error with its exit status and stderr."""
    bin_dir = _fake_systemctl(
        tmp_path / "bin", 'echo "Failed to restart $3: Unit $3 not found." >&2\nexit 5\n'
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    outcome = await SystemdRestarter("nope.service", env=env).restart(_request())
    assert not outcome.ok
    assert outcome.failure is FailureReason.REMEDY_ERROR
    assert "exit status 5" in outcome.detail
    assert "Unit nope.service not found" in outcome.detail


async def test_systemd_real_systemctl_without_systemd_fails_clearly() -> None:
    """The real systemctl, on a host without a running systemd (or without the unit), fails."""
    if shutil.which("systemctl") is None:
        pytest.skip("systemctl is not installed here")
    restarter = SystemdRestarter("wedgewatch-test-no-such-unit.service", timeout_seconds=60)
    outcome = await restarter.restart(_request())
    assert not outcome.ok
    assert "systemctl restart wedgewatch-test-no-such-unit.service failed" in outcome.detail
    assert outcome.detail.split(":", 1)[1].strip()  # systemctl said why


async def test_systemd_missing_systemctl_is_a_clear_failure(tmp_path: Path) -> None:
    """Without systemctl on PATH the outcome says so and shows the PATH searched."""
    empty = tmp_path / "empty"
    empty.mkdir()
    outcome = await SystemdRestarter("vllm.service", env={"PATH": str(empty)}).restart(_request())
    assert not outcome.ok
    assert "'systemctl' was not found on PATH" in outcome.detail
    assert str(empty) in outcome.detail


async def test_systemd_timeout(tmp_path: Path) -> None:
    """A systemctl that hangs past its deadline is killed and reported as a timeout."""
    bin_dir = _fake_systemctl(tmp_path / "bin", "exec sleep 60\n")
    restarter = SystemdRestarter(
        "vllm.service", env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout_seconds=0.5
    )
    outcome = await restarter.restart(_request())
    assert outcome.failure is FailureReason.TIMEOUT


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param("", id="empty"),
        pytest.param("--all", id="option"),
        pytest.param("a b", id="space"),
    ],
)
def test_systemd_rejects_bad_unit_names(unit: str) -> None:
    """A unit name that could be read as an option or several words is refused."""
    with pytest.raises(ValueError, match="not a unit name"):
        SystemdRestarter(unit)


# -- supervise ---------------------------------------------------------------------------------


@pytest.fixture
async def supervised() -> AsyncIterator[Callable[[list[str]], Supervisor]]:
    """Make supervisors whose process groups are stopped after the test, pass or fail."""
    made: list[Supervisor] = []

    def make(argv: list[str]) -> Supervisor:
        supervisor = Supervisor(argv)
        made.append(supervisor)
        return supervisor

    yield make
    for supervisor in made:
        await supervisor.stop(0.5)


async def test_supervisor_restart_replaces_the_whole_group(
    tmp_path: Path, supervised: Callable[[list[str]], Supervisor]
) -> None:
    """restart() leaves no process of the old group and starts a new group with a new pid."""
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    link = tmp_path / "current"
    link.symlink_to(first_dir)
    supervisor = supervised([sys.executable, str(CHILD), "tree", str(link), "--stubborn", "grand0"])
    await supervisor.start()
    old = await asyncio.to_thread(_wait_for_pids, first_dir, TREE)
    assert supervisor.pid == old["root"] == supervisor.pgid == os.getpgid(old["root"])
    link.unlink()
    link.symlink_to(second_dir)
    outcome = await SuperviseRestarter(supervisor, grace_seconds=0.5).restart(_request())
    assert outcome.ok, outcome.detail
    assert not [r for r, pid in old.items() if _alive(pid)]
    new = await asyncio.to_thread(_wait_for_pids, second_dir, TREE)
    assert supervisor.pid == new["root"] != old["root"]
    assert os.getpgid(new["root"]) == new["root"]
    assert supervisor.starts == 2
    assert await supervisor.stop(0.5) == -signal.SIGTERM  # the leader obeys; grand0 is killed
    assert not [r for r, pid in new.items() if _alive(pid)]


async def test_supervisor_wait_returns_the_exit_status(
    supervised: Callable[[list[str]], Supervisor],
) -> None:
    """wait() returns the status of a command that exits by itself."""
    supervisor = supervised([sys.executable, str(CHILD), "exit", "7"])
    await supervisor.start()
    assert await supervisor.wait() == 7
    assert await supervisor.stop(1) == 7


async def test_supervisor_wait_survives_restarts_and_ends_with_stop(
    supervised: Callable[[list[str]], Supervisor],
) -> None:
    """A restart does not end wait(); stop() does, with the signal status."""
    supervisor = supervised([sys.executable, "-c", "import time; time.sleep(3600)"])
    await supervisor.start()
    waiter = asyncio.create_task(supervisor.wait())
    outcome = await supervisor.restart(5)
    assert outcome.ok, outcome.detail
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await supervisor.stop(5)
    assert await waiter == -signal.SIGTERM


async def test_supervisor_restart_that_cannot_start_is_a_failed_outcome(
    tmp_path: Path, supervised: Callable[[list[str]], Supervisor]
) -> None:
    """When the command vanished, restart() fails with a message and wait() ends."""
    program = tmp_path / "server.sh"
    running = tmp_path / "running"
    program.write_text(f"#!/bin/sh\ntouch {running}\nexec sleep 3600\n")
    program.chmod(0o755)
    supervisor = supervised([str(program)])
    await supervisor.start()
    waiter = asyncio.create_task(supervisor.wait())
    assert await asyncio.to_thread(_wait_for_file, running)
    program.unlink()
    outcome = await supervisor.restart(5)
    assert not outcome.ok
    assert "not found" in outcome.detail
    assert await waiter == -signal.SIGTERM


async def test_supervisor_start_errors_are_clear() -> None:
    """Starting a missing program raises SupervisorError naming it."""
    with pytest.raises(SupervisorError, match="not found"):
        await Supervisor(["/nonexistent/vllm"]).start()


# ---------------------------------------------------------------------------------------
# Safety: the exec environment, the group leader check, the supervisor's own restart


async def test_exec_gets_a_minimal_environment(tmp_path: Path) -> None:
    """The exec command sees PATH, LANG and the event, never wedgewatch's settings or secrets."""
    out = tmp_path / "env.json"
    dump = "import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], 'w'))"
    parent = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HF_TOKEN": "hf_SECRET",
        "WEDGEWATCH_WEBHOOK_URLS": "https://hooks.slack.com/services/SECRET",
        "AWS_SECRET_ACCESS_KEY": "SECRET",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    restarter = ExecRestarter([sys.executable, "-c", dump, str(out)], env=parent)
    assert (await restarter.restart(_request())).ok
    seen = json.loads(out.read_text())
    seen.pop("LC_CTYPE", None)  # the interpreter may coerce the C locale
    assert {k: v for k, v in seen.items() if not k.startswith("WEDGEWATCH_")} == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    }
    assert sorted(k for k in seen if k.startswith("WEDGEWATCH_")) == sorted(
        restarters.restart_environment(_request())
    )
    assert "SECRET" not in out.read_text()


async def test_exec_without_path_gets_the_default_path(tmp_path: Path) -> None:
    """With no PATH in wedgewatch's environment the command still finds standard programs."""
    out = tmp_path / "path.txt"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ['PATH'])"
    assert (await ExecRestarter([sys.executable, "-c", script], env={}).restart(_request())).ok
    assert out.read_text() == restarters.DEFAULT_PATH


def test_exec_url_is_passed_without_credentials() -> None:
    """WEDGEWATCH_URL never carries the target URL's credentials or query."""
    request = replace(
        _request(), url="http://bob:PWSECRET@127.0.0.1:8000/metrics?token=QSECRET&a=1"
    )
    env = restarters.restart_environment(request)
    assert env["WEDGEWATCH_URL"] == "http://bob:***@127.0.0.1:8000/metrics?token=***&a=1"


async def test_group_is_signalled_only_while_its_leader_is_the_same_process(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A group whose leader's create time changed (pid reused) gets no killpg; members live."""
    pids = _start_tree(spawned, tmp_path / "tree")
    leader = psutil.Process(pids["root"])
    created = leader.create_time()
    try:
        assert restarters.group_is_still_ours(pids["root"], created)
        assert not restarters.group_is_still_ours(pids["root"], created - 100.0)
        assert not restarters.group_is_still_ours(pids["root"], None)
        # As if the tree had been collected from an older process with the same pid: nothing
        # may be signalled through the group, and no victim was named.
        result = await restarters._terminate([], pids["root"], 0.2, created - 100.0)
        assert any("pid reused" in e for e in result.errors)
        assert all(_alive(pid) for pid in pids.values())
        # With the true create time the group is reached.
        result = await restarters._terminate([], pids["root"], 5.0, created)
        assert not [r for r, pid in pids.items() if _alive(pid)]
    finally:
        _kill_leftovers(pids)


def test_group_of_a_vanished_leader_may_still_be_signalled() -> None:
    """No process with the group's id: killpg can only reach the old group's members."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert restarters.group_is_still_ours(proc.pid, None)


@pytest.mark.parametrize(
    ("state", "restarting"),
    [
        pytest.param("ActiveState=activating\nSubState=auto-restart\n", True, id="auto-restart"),
        pytest.param("ActiveState=activating\nSubState=start\n", True, id="activating"),
        pytest.param("ActiveState=failed\nSubState=failed\n", False, id="failed"),
        pytest.param("ActiveState=active\nSubState=running\n", False, id="running"),
    ],
)
async def test_systemd_state_probe(tmp_path: Path, state: str, restarting: bool) -> None:
    """systemd's own restart (activating, auto-restart) is reported; other states are not."""
    calls = tmp_path / "calls"
    bin_dir = _fake_systemctl(
        tmp_path / "bin", f'printf "%s\\n" "$@" > {calls}\nprintf "{state}"\n'
    )
    probe = SystemdStateProbe({"vllm-a": "vllm.service"}, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    said = await probe.restarting("vllm-a")
    assert (said is not None) is restarting
    if said is not None:
        assert "systemd is already restarting vllm.service" in said
    assert calls.read_text().split() == ["show", "--property=ActiveState,SubState", "vllm.service"]
    assert await probe.restarting("other-target") is None


async def test_systemd_state_probe_without_systemctl_says_nothing(tmp_path: Path) -> None:
    """When the unit state cannot be read the probe answers None: act as without supervisor."""
    probe = SystemdStateProbe({"vllm-a": "vllm.service"}, env={"PATH": str(tmp_path)})
    assert await probe.restarting("vllm-a") is None
