"""Process discovery: pure classification tables, then psutil against real process trees."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standin_tree import StandinTree, standin_tree

from wedgewatch.core.restart.server_proof import cgroup_in_unit, is_this_machine, prove_server
from wedgewatch.io.procs import (
    ListeningSocket,
    ProcessReading,
    ProcessRecord,
    ProcessSelector,
    PsutilProcessFinder,
    ServerProcess,
    build_tree,
    choose_root,
    combine_samples,
    descendants,
    endpoint_of_url,
    parse_pid_file,
    pick_listeners,
    read_readings,
    title_from_cmdline,
)
from wedgewatch.vllm.semantics import Role

# ---------------------------------------------------------------- pure


@pytest.mark.parametrize(
    ("cmdline", "name", "title"),
    [
        pytest.param(
            ["VLLM::EngineCore", "", "", ""],
            "VLLM::EngineCor",
            "VLLM::EngineCore",
            id="setproctitle-padding",
        ),
        pytest.param(
            ["vllm", "serve", "m", "--tensor-parallel-size", "2"],
            "vllm",
            "vllm serve m --tensor-parallel-size 2",
            id="argv",
        ),
        pytest.param([], "kworker/0:1", "kworker/0:1", id="no-cmdline-uses-comm"),
        pytest.param(["", ""], "VLLM::Worker_TP", "VLLM::Worker_TP", id="blank-cmdline"),
    ],
)
def test_title_from_cmdline(cmdline: list[str], name: str, title: str) -> None:
    """Titles come from the full command line; comm (15 bytes) only when there is none."""
    assert title_from_cmdline(cmdline, name) == title


RECORDS = [
    ProcessRecord(10, 1, "vllm serve m"),
    ProcessRecord(30, 20, "VLLM::Worker_TP1"),
    ProcessRecord(20, 10, "VLLM::EngineCore"),
    ProcessRecord(29, 20, "VLLM::Worker_TP0"),
    ProcessRecord(11, 10, "python -c from multiprocessing.resource_tracker import main"),
    ProcessRecord(99, 1, "unrelated"),
]


def test_descendants_breadth_first_with_siblings_by_pid() -> None:
    """The root comes first, then children, then grandchildren, siblings ordered by pid."""
    assert [r.pid for r in descendants(RECORDS, 10)] == [10, 11, 20, 29, 30]


def test_descendants_of_unknown_root_is_empty() -> None:
    """A root that is not among the records gives nothing."""
    assert descendants(RECORDS, 12345) == ()


def test_descendants_survive_a_cycle() -> None:
    """Bad input with a parent cycle does not loop forever."""
    records = [ProcessRecord(1, 2, "a"), ProcessRecord(2, 1, "b")]
    assert [r.pid for r in descendants(records, 1)] == [1, 2]


def test_build_tree_assigns_roles() -> None:
    """The TP=2 layout yields one API server, one engine, two workers and one other."""
    tree = build_tree(RECORDS, 10)
    assert [(p.pid, p.role) for p in tree] == [
        (10, Role.API_SERVER),
        (11, Role.OTHER),
        (20, Role.ENGINE_CORE),
        (29, Role.WORKER),
        (30, Role.WORKER),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("1234\n", 1234, id="plain"),
        pytest.param("  77  extra words\n", 77, id="trailing-words"),
        pytest.param("", "pid file /run/v.pid is empty", id="empty"),
        pytest.param("\n \n", "pid file /run/v.pid is empty", id="blank"),
        pytest.param(
            "vllm\n", "pid file /run/v.pid does not start with a process id: 'vllm'", id="garbage"
        ),
        pytest.param(
            "-5", "pid file /run/v.pid does not start with a process id: '-5'", id="negative"
        ),
        pytest.param(
            "0", "pid file /run/v.pid holds 0, which is not a valid process id", id="zero"
        ),
    ],
)
def test_parse_pid_file(text: str, expected: int | str) -> None:
    """A pid file yields a pid or a specific message, never an exception."""
    assert parse_pid_file(text, Path("/run/v.pid")) == expected


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param("http://127.0.0.1:8000/metrics", ("127.0.0.1", 8000), id="explicit"),
        pytest.param("http://vllm.local/metrics", ("vllm.local", 80), id="http-default"),
        pytest.param("https://[::1]/", ("::1", 443), id="https-ipv6"),
        pytest.param(
            "http://h:99999/",
            "cannot read a port from 'http://h:99999/': Port out of range 0-65535",
            id="bad-port",
        ),
        pytest.param("ftp://h/", "not an http(s) URL with a host: 'ftp://h/'", id="scheme"),
    ],
)
def test_endpoint_of_url(url: str, expected: tuple[str, int] | str) -> None:
    """The port to look for comes from the target URL, with the scheme's default."""
    assert endpoint_of_url(url) == expected


@pytest.mark.parametrize(
    ("sockets", "host", "expected"),
    [
        pytest.param([ListeningSocket("0.0.0.0", 8000, 5)], "127.0.0.1", ((5,), 0), id="wildcard"),
        pytest.param(
            [ListeningSocket("127.0.0.1", 8000, 5), ListeningSocket("10.0.0.2", 8000, 6)],
            "127.0.0.1",
            ((5,), 0),
            id="host-filter",
        ),
        pytest.param([ListeningSocket("::1", 8000, 5)], "localhost", ((5,), 0), id="localhost-v6"),
        pytest.param(
            [ListeningSocket("10.0.0.2", 8000, 6)],
            "127.0.0.1",
            ((), 0),
            id="another-address-is-never-picked",
        ),
        pytest.param(
            [ListeningSocket("0.0.0.0", 8000, None)], "127.0.0.1", ((), 1), id="hidden-pid"
        ),
        pytest.param([ListeningSocket("0.0.0.0", 8001, 5)], "127.0.0.1", ((), 0), id="other-port"),
        pytest.param(
            [ListeningSocket("0.0.0.0", 8000, 7), ListeningSocket("::", 8000, 5)],
            "vllm.svc",
            ((5, 7), 0),
            id="two-listeners",
        ),
    ],
)
def test_pick_listeners(
    sockets: list[ListeningSocket], host: str, expected: tuple[tuple[int, ...], int]
) -> None:
    """Listeners are matched on the port and the host (or a wildcard), never on the port alone."""
    assert pick_listeners(sockets, host, 8000) == expected


def test_choose_root_prefers_the_parent_of_other_listeners() -> None:
    """With API-server children sharing the socket, the parent is the server's root."""
    parents = {50: 10, 51: 10, 10: 1}
    assert choose_root([50, 10, 51], parents) == 10
    assert choose_root([50, 51], parents) == 50


def reading(pid: int, cpu: float, created: float = 100.0) -> ProcessReading:
    """A reading with `cpu` seconds of user time."""
    return ProcessReading(pid, cpu, 0.0, 1 << 20, 4, created, "running")


def test_combine_samples_computes_percent_and_keeps_failures() -> None:
    """CPU percent is per core over the sample; vanished and reused pids say so."""
    procs = [ServerProcess(p, 1, f"p{p}", Role.OTHER) for p in (1, 2, 3, 4)]
    before = {
        1: reading(1, 1.0),
        2: reading(2, 1.0),
        3: "pid 3 no longer exists",
        4: reading(4, 5.0),
    }
    after = {
        1: reading(1, 1.5),
        2: "pid 2 no longer exists",
        3: "pid 3 no longer exists",
        4: reading(4, 0.1, created=200.0),
    }
    stats = combine_samples(procs, before, after, 0.5)
    assert stats[0].cpu_percent == 100.0
    assert stats[1].error == "vanished during the CPU sample: pid 2 no longer exists"
    assert stats[2].reading is None
    assert stats[2].error == "pid 3 no longer exists"
    assert stats[3].cpu_percent is None  # pid reused: the two readings are different processes
    assert stats[0].to_json()["cpu_percent"] == 100.0


# ---------------------------------------------------------------- real processes


@pytest.fixture(scope="module")
def tree() -> Iterator[StandinTree]:
    """One stand-in vLLM tree (API > EngineCore > 2 workers) for this module."""
    with standin_tree("scheduler_wedge") as running:
        yield running


@pytest.mark.slow
def test_discover_by_listening_port(tree: StandinTree) -> None:
    """The URL's port leads to the API server, its engine and both workers, titled in full."""
    found = PsutilProcessFinder().discover(
        ProcessSelector(url=f"http://127.0.0.1:{tree.port}/metrics")
    )
    assert found.error is None
    assert found.root_pid == tree.api_pid
    roles = [(p.pid, p.role, p.title) for p in found.processes]
    assert roles[1:] == [
        (tree.engine_pid, Role.ENGINE_CORE, "VLLM::EngineCore"),
        (tree.worker_pids[0], Role.WORKER, "VLLM::Worker_TP0"),
        (tree.worker_pids[1], Role.WORKER, "VLLM::Worker_TP1"),
    ]
    assert roles[0][:2] == (tree.api_pid, Role.API_SERVER)
    assert found.pids(Role.WORKER) == tree.worker_pids


@pytest.mark.slow
def test_configured_pid_overrides_the_url(tree: StandinTree) -> None:
    """A configured pid wins over the URL (here: a URL nobody listens on)."""
    found = PsutilProcessFinder().discover(
        ProcessSelector(url="http://127.0.0.1:1/", pid=tree.engine_pid)
    )
    assert found.error is None
    assert [p.role for p in found.processes] == [Role.ENGINE_CORE, Role.WORKER, Role.WORKER]


@pytest.mark.slow
def test_pid_file_is_read(tree: StandinTree, tmp_path: Path) -> None:
    """A pid file names the root process."""
    pid_file = tmp_path / "vllm.pid"
    pid_file.write_text(f"{tree.api_pid}\n")
    found = PsutilProcessFinder().discover(ProcessSelector(pid_file=pid_file))
    assert found.root_pid == tree.api_pid
    assert len(found.processes) == 4
    assert found.source == f"pid file {pid_file}"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(None, "does not exist", id="missing"),
        pytest.param("not a pid", "does not start with a process id", id="garbage"),
    ],
)
def test_bad_pid_file_is_an_error_in_the_result(
    tmp_path: Path, content: str | None, message: str
) -> None:
    """A missing or garbage pid file gives a clear error in the result, not an exception."""
    pid_file = tmp_path / "vllm.pid"
    if content is not None:
        pid_file.write_text(content)
    found = PsutilProcessFinder().discover(ProcessSelector(pid_file=pid_file))
    assert found.processes == ()
    assert found.error is not None
    assert message in found.error
    assert str(pid_file) in found.error
    assert found.gone is (content is None)  # a removed pid file: the server has stopped


def test_nobody_listening_is_an_error_in_the_result() -> None:
    """A port nobody listens on is reported, not raised."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening
        found = PsutilProcessFinder().discover(ProcessSelector(url=f"http://127.0.0.1:{port}/"))
    assert found.error == f"no process listens on TCP port {port}"
    assert found.gone  # a crashed or stopped server: not a failed discovery (#24)
    assert type(found.error) is str


def test_vanished_pid_is_an_error_in_the_result() -> None:
    """A configured pid that no longer exists is reported, not raised."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    found = PsutilProcessFinder().discover(ProcessSelector(pid=child.pid))
    assert found.processes == ()
    assert found.error == f"pid {child.pid} no longer exists"
    assert found.gone


def test_zombie_child_is_recorded_with_its_status() -> None:
    """An exited, unreaped child shows up with status zombie (an engine that just died)."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'pass'])\n"
            "time.sleep(30)\n",
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            found = PsutilProcessFinder().discover(ProcessSelector(pid=parent.pid))
            if len(found.processes) == 2 and found.processes[1].status == "zombie":
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.05)
        assert found.processes[1].role is Role.OTHER
    finally:
        parent.kill()
        parent.wait()


def test_nothing_configured_is_an_error_in_the_result() -> None:
    """A selector with nothing set explains what is missing."""
    found = PsutilProcessFinder().discover(ProcessSelector())
    assert found.error == "no url, pid or pid file to find the server's processes from"
    assert not found.gone  # a configuration problem, not a server that went away


def test_read_readings_of_self_and_of_a_vanished_pid() -> None:
    """Counters are read for a live process; a gone one gives a message."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    readings = read_readings([os.getpid(), child.pid])
    mine = readings[os.getpid()]
    assert isinstance(mine, ProcessReading)
    assert mine.num_threads >= 1
    assert mine.rss_bytes > 0
    assert readings[child.pid] == f"pid {child.pid} no longer exists"


# ---------------------------------------------------------------- proof and locality


@pytest.mark.parametrize(
    ("tree", "explicit", "accept_command", "refused_with"),
    [
        pytest.param(
            [(10, "python -m vllm"), (11, "VLLM::EngineCore")], False, False, None, id="engine"
        ),
        pytest.param(
            [(10, "vllm serve m"), (11, "VLLM::EngineCore_DP1")], False, False, None, id="dp"
        ),
        pytest.param(
            [(10, "nginx: master process")], False, False, "has no VLLM::EngineCore", id="nginx"
        ),
        pytest.param([(10, "anything")], True, False, None, id="explicit-pid"),
        pytest.param(
            [(10, "vllm serve m")], False, False, "has no VLLM::EngineCore", id="dead-engine"
        ),
        pytest.param([(10, "vllm serve m")], False, True, None, id="dead-engine-readonly"),
        pytest.param(
            [(10, "VLLM::EngineCore"), (4242, "wedgewatch run")],
            True,
            False,
            "wedgewatch itself (pid 4242)",
            id="contains-wedgewatch",
        ),
        pytest.param([], True, False, "no server process", id="empty"),
    ],
)
def test_prove_server(
    tree: list[tuple[int, str]], explicit: bool, accept_command: bool, refused_with: str | None
) -> None:
    """Only an EngineCore or an explicitly configured pid proves a tree, never with us in it."""
    reason = prove_server(
        tree, explicit=explicit, own_pids={4242}, accept_vllm_command=accept_command
    )
    if refused_with is None:
        assert reason is None
    else:
        assert reason is not None
        assert refused_with in reason


@pytest.mark.parametrize(
    ("host_ips", "local", "expected"),
    [
        pytest.param(("127.0.0.1",), (), True, id="loopback-v4"),
        pytest.param(("127.0.1.1",), (), True, id="loopback-range"),
        pytest.param(("::1",), (), True, id="loopback-v6"),
        pytest.param(("10.1.2.3",), ("10.1.2.3", "127.0.0.1"), True, id="own-interface"),
        pytest.param(("fe80::1",), ("fe80::1%eth0",), True, id="zoned-interface"),
        pytest.param(("10.1.2.3",), ("10.1.2.4", "127.0.0.1"), False, id="other-host"),
        pytest.param((), ("127.0.0.1",), False, id="unresolved"),
    ],
)
def test_is_this_machine(host_ips: tuple[str, ...], local: tuple[str, ...], expected: bool) -> None:
    """Loopback and the machine's own interface addresses are local; nothing else is."""
    assert is_this_machine(host_ips, local) is expected


def test_remote_url_is_never_looked_up_by_port() -> None:
    """A URL on another host finds no local process, with the reason, whatever listens here."""
    found = PsutilProcessFinder().discover(ProcessSelector(url="http://192.0.2.7:8000/metrics"))
    assert found.root_pid is None
    assert found.processes == ()
    assert found.error is not None
    assert "192.0.2.7 is not this machine" in found.error


@pytest.mark.parametrize(
    ("text", "unit", "inside"),
    [
        pytest.param("0::/system.slice/vllm.service\n", "vllm.service", True, id="v2"),
        pytest.param("0::/system.slice/vllm.service/engine\n", "vllm.service", True, id="sub"),
        pytest.param(
            "12:pids:/\n1:name=systemd:/system.slice/vllm.service\n0::/\n",
            "vllm.service",
            True,
            id="v1",
        ),
        pytest.param("0::/system.slice/nginx.service\n", "vllm.service", False, id="other"),
        pytest.param("0::/system.slice/vllm.service.d\n", "vllm.service", False, id="prefix"),
        pytest.param("0::/\n", "vllm.service", False, id="container-root"),
        pytest.param("0::/system.slice/vllm.service\n", "", False, id="no-unit"),
    ],
)
def test_cgroup_in_unit(text: str, unit: str, inside: bool) -> None:
    """A listener inside the target's systemd unit's cgroup counts as named by the target."""
    assert cgroup_in_unit(text, unit) is inside


def test_a_keeping_finder_reads_the_listening_sockets_once() -> None:
    """`keep_sockets`: one read of the socket table serves every later lookup (a pass over
    many targets); the daemon's finder reads it afresh each time."""
    import socket

    keeping, fresh = PsutilProcessFinder(keep_sockets=True), PsutilProcessFinder()
    with socket.socket() as before:
        before.bind(("127.0.0.1", 0))
        before.listen()
        before_port = before.getsockname()[1]
        assert keeping.listen_addresses([os.getpid()], before_port) == ("127.0.0.1",)
        with socket.socket() as after:
            after.bind(("127.0.0.1", 0))
            after.listen()
            url = f"http://127.0.0.1:{after.getsockname()[1]}/"
            assert keeping.discover(ProcessSelector(url=url)).root_pid is None  # not re-read
            assert fresh.discover(ProcessSelector(url=url)).root_pid == os.getpid()
        found = keeping.discover(ProcessSelector(url=f"http://127.0.0.1:{before_port}/"))
    assert found.root_pid == os.getpid()
    assert keeping.listen_addresses([os.getpid()], None) == ("127.0.0.1",)
    assert keeping.listen_addresses([os.getpid() + 1], before_port) == ()
