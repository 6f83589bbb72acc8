"""The systemd units in systemd/: verified by systemd-analyze, and their ExecStart lines run.

No systemd runs as PID 1 here, so the units are checked offline (`systemd-analyze verify`,
`systemd-analyze security --offline`) and their command lines are run by this test the way
systemd would: ExecStart is parsed from the unit, `${VAR}` and `$VAR` are expanded from
Environment= and the example environment file, and only what must differ on a test machine
is substituted (the install prefix /opt/wedgewatch/.venv/bin -> this venv, /etc paths ->
temporary copies, ports -> free ones, the vllm binary -> the simulator's shim).
The polkit rule is evaluated with node against a stand-in of polkit's JavaScript API.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx
import psutil
import pytest
import tomli_w
from ports import free_port

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
INSTALLED = "/opt/wedgewatch/.venv/bin/wedgewatch"
VENV_BIN = Path(sys.executable).parent
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
NODE = shutil.which("node")

needs_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze not found")


# -- reading units the way systemd does (the subset the shipped units use) -------------------


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """Sections of a unit file: (key, value) pairs in order; continuations and comments handled."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{path.name}: {line!r} outside a section"
        current.append((key.strip(), value.strip()))
    return sections


def values(unit: Mapping[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    """Every value of `key` in `section`, in order."""
    return [v for k, v in unit.get(section, []) if k == key]


def environment_of(
    unit: Mapping[str, list[tuple[str, str]]], env_file: Path | None
) -> dict[str, str]:
    """Environment= assignments, then the environment file on top (it wins, as in systemd)."""
    env: dict[str, str] = {}
    for value in values(unit, "Service", "Environment"):
        for assignment in shlex.split(value):
            name, _, setting = assignment.partition("=")
            env[name] = setting
    if env_file is not None:
        for raw in env_file.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            name, _, setting = line.partition("=")
            env[name.strip()] = setting.strip().strip("\"'")
    return env


_WHOLE_VAR = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")
_BRACED_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def exec_argv(unit: Mapping[str, list[tuple[str, str]]], env: Mapping[str, str]) -> list[str]:
    """ExecStart as argv: `$VAR` alone splits into words, `${VAR}` is substituted in place."""
    (command,) = values(unit, "Service", "ExecStart")
    command = command.lstrip("-@:+!")
    argv: list[str] = []
    for word in shlex.split(command):
        whole = _WHOLE_VAR.match(word)
        if whole:
            argv.extend(env.get(whole[1], "").split())
        else:
            argv.append(_BRACED_VAR.sub(lambda m: env.get(m[1], ""), word))
    return argv


def installed_here(argv: list[str]) -> list[str]:
    """The unit's command with the install prefix replaced by this venv."""
    assert argv[0] == INSTALLED, f"units must run {INSTALLED}, not {argv[0]}"
    return [str(VENV_BIN / "wedgewatch"), *argv[1:]]


# -- the unit files themselves ----------------------------------------------------------------


@needs_analyze
def test_every_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts both units (install prefix pointed at this venv)."""
    for unit in UNITS.glob("*.service"):
        text = unit.read_text().replace(INSTALLED, str(VENV_BIN / "wedgewatch"))
        (tmp_path / unit.name).write_text(text)
    units = sorted(str(p) for p in tmp_path.glob("*.service"))
    assert len(units) == 2
    assert_verified(units, tmp_path)


def assert_verified(units: list[str], cwd: Path) -> None:
    """`systemd-analyze verify UNITS` passes without a word on stderr."""
    done = subprocess.run(
        [str(SYSTEMD_ANALYZE), "verify", *units],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


def own_unit_from_the_docs() -> str:
    """The example of an operator's own vllm.service in docs/systemd.md."""
    text = (REPO / "docs" / "systemd.md").read_text()
    section = text.split("### Keep your own `vllm.service`", 1)[1]
    return section.split("```ini\n", 1)[1].split("```", 1)[0]


@needs_analyze
def test_an_own_vllm_unit_verifies_with_only_the_watchdog_unit(tmp_path: Path) -> None:
    """docs/systemd.md's own vllm.service next to the shipped wedgewatch.service, unchanged
    but for paths: systemd-analyze verify accepts the pair, and the polkit rule's unit and
    the config's units name it."""
    own = own_unit_from_the_docs()
    assert "wedgewatch" not in own.split("\n", 1)[1]  # nothing of wedgewatch in the vLLM unit
    vllm = shutil.which("true")
    assert vllm is not None
    (tmp_path / "vllm.service").write_text(own.replace("/opt/vllm/.venv/bin/vllm", vllm))
    watchdog = (UNITS / "wedgewatch.service").read_text()
    (tmp_path / "wedgewatch.service").write_text(
        watchdog.replace(INSTALLED, str(VENV_BIN / "wedgewatch"))
    )
    assert_verified(["vllm.service", "wedgewatch.service"], tmp_path)
    unit = parse_unit(tmp_path / "vllm.service")
    assert values(unit, "Service", "KillMode") == ["control-group"]
    for key in ("BindsTo", "Requires", "PartOf"):
        assert values(unit, "Unit", key) == [], key
    rule = (UNITS / "50-wedgewatch-restart-vllm.rules").read_text()
    assert 'action.lookup("unit") === "vllm.service"' in rule
    config = tomllib.loads((UNITS / "wedgewatch.toml").read_text())
    assert config["targets"][0]["url"] == "http://127.0.0.1:8000"  # the unit's --port
    assert config["targets"][0]["systemd_unit"] == "vllm.service"


@needs_analyze
def test_watchdog_unit_is_hardened(tmp_path: Path) -> None:
    """systemd's own exposure score for wedgewatch.service stays at or below 3.0 ("OK")."""
    text = (UNITS / "wedgewatch.service").read_text()
    unit = tmp_path / "wedgewatch.service"
    unit.write_text(text.replace(INSTALLED, str(VENV_BIN / "wedgewatch")))
    done = subprocess.run(
        [str(SYSTEMD_ANALYZE), "security", "--offline=true", "--threshold=30", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:]


def test_watchdog_keeps_only_ptrace_and_never_binds_to_the_server() -> None:
    """CAP_SYS_PTRACE is the one capability; no dependency that would restart wedgewatch too.

    A restart of vllm.service is propagated to units with BindsTo=, Requires= or PartOf= on
    it; wedgewatch is the one running `systemctl restart vllm.service`.
    """
    unit = parse_unit(UNITS / "wedgewatch.service")
    assert values(unit, "Service", "AmbientCapabilities") == ["CAP_SYS_PTRACE"]
    assert values(unit, "Service", "CapabilityBoundingSet") == ["CAP_SYS_PTRACE"]
    assert values(unit, "Service", "Type") == ["notify"]
    assert values(unit, "Service", "NoNewPrivileges") == ["yes"]
    assert values(unit, "Service", "ProtectSystem") == ["strict"]
    assert values(unit, "Service", "StateDirectory") == ["wedgewatch"]
    for key in ("BindsTo", "Requires", "PartOf", "Requisite"):
        assert not any("vllm.service" in v for v in values(unit, "Unit", key)), key
    assert any("vllm.service" in v for v in values(unit, "Unit", "After"))
    config = tomllib.loads((UNITS / "wedgewatch.toml").read_text())
    assert config["state_dir"] == "/var/lib/wedgewatch"  # = StateDirectory=wedgewatch
    assert config["systemd_unit"] == "vllm.service"


def test_shipped_config_observes_first_and_the_documented_switch_is_valid(tmp_path: Path) -> None:
    """wedgewatch.toml ships `remedy = "none"` (observe); the one-line switch it documents
    (`remedy = "systemd"`) is a valid configuration that restarts vllm.service."""
    text = (UNITS / "wedgewatch.toml").read_text()
    assert tomllib.loads(text)["remedy"] == "none"
    assert '#   remedy = "systemd"\n' in text
    switched = tmp_path / "wedgewatch.toml"
    switched.write_text(text.replace('remedy = "none"\n', 'remedy = "systemd"\n'))
    assert tomllib.loads(switched.read_text())["remedy"] == "systemd"
    done = subprocess.run(
        [str(VENV_BIN / "wedgewatch"), "config", "show", "--config", str(switched)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert 'remedy = "systemd"' in done.stdout


def test_sample_config_is_valid() -> None:
    """`wedgewatch config check` accepts the shipped wedgewatch.toml."""
    done = subprocess.run(
        [str(VENV_BIN / "wedgewatch"), "config", "check", str(UNITS / "wedgewatch.toml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_server_command_variables_are_all_defined() -> None:
    """Every variable vllm.service's ExecStart uses has a default or an example value."""
    unit = parse_unit(UNITS / "vllm.service")
    (command,) = values(unit, "Service", "ExecStart")
    used = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", command))
    defaults = environment_of(unit, None)
    example = environment_of({}, UNITS / "vllm.env.example")
    assert used == {
        "VLLM_MODEL",
        "VLLM_PROFILE",
        "VLLM_BIN",
        "VLLM_HOST",
        "VLLM_PORT",
        "VLLM_EXTRA_ARGS",
    }
    assert used <= set(defaults) | set(example)
    assert "VLLM_MODEL" in example  # the one without a default: the file is required
    assert values(unit, "Service", "EnvironmentFile") == ["/etc/wedgewatch/vllm.env"]


# -- the polkit rule ----------------------------------------------------------------------------

POLKIT_HARNESS = r"""
const fs = require("fs");
const rules = [];
const polkit = {
  addRule: (rule) => rules.push(rule),
  Result: { YES: "yes", NO: "no", AUTH_ADMIN: "auth_admin", NOT_HANDLED: null },
};
new Function("polkit", fs.readFileSync(process.argv[2], "utf8"))(polkit);
const answers = JSON.parse(process.argv[3]).map(([id, user, unit, verb]) => {
  const action = { id, lookup: (key) => ({ unit, verb })[key] };
  for (const rule of rules) {
    const answer = rule(action, { user });
    if (answer) return answer;
  }
  return "not_handled";
});
console.log(JSON.stringify(answers));
"""

MANAGE = "org.freedesktop.systemd1.manage-units"


@pytest.mark.skipif(NODE is None, reason="node not found")
@pytest.mark.parametrize(
    ("asked", "answer"),
    [
        pytest.param((MANAGE, "wedgewatch", "vllm.service", "restart"), "yes", id="restart-vllm"),
        pytest.param((MANAGE, "wedgewatch", "vllm.service", "stop"), "not_handled", id="stop"),
        pytest.param((MANAGE, "wedgewatch", "vllm.service", "start"), "not_handled", id="start"),
        pytest.param((MANAGE, "wedgewatch", "sshd.service", "restart"), "not_handled", id="sshd"),
        pytest.param((MANAGE, "nobody", "vllm.service", "restart"), "not_handled", id="other-user"),
        pytest.param(
            ("org.freedesktop.systemd1.manage-unit-files", "wedgewatch", "vllm.service", "restart"),
            "not_handled",
            id="unit-files",
        ),
    ],
)
def test_polkit_rule_allows_exactly_restarting_vllm(
    tmp_path: Path, asked: tuple[str, str, str, str], answer: str
) -> None:
    """The wedgewatch user may restart vllm.service; every other request falls through."""
    harness = tmp_path / "harness.js"
    harness.write_text(POLKIT_HARNESS)
    rule = UNITS / "50-wedgewatch-restart-vllm.rules"
    done = subprocess.run(
        [str(NODE), str(harness), str(rule), json.dumps([list(asked)])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(done.stdout) == [answer]


# -- the ExecStart lines, run against the simulator ---------------------------------------------


class NotifySocket:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="ww-notify-", dir="/tmp")  # short: sun_path limit
        self.path = os.path.join(self._dir, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def wait_for(self, line: str, timeout_seconds: float) -> None:
        """Receive until a message holds `line` (e.g. READY=1)."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if any(line in m.splitlines() for m in self.messages):
                return
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
        raise AssertionError(f"no {line} within {timeout_seconds} s; got {self.messages}")

    def close(self) -> None:
        """Remove the socket."""
        self.sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    """A NOTIFY_SOCKET for one test."""
    sock = NotifySocket()
    yield sock
    sock.close()


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started in their own session; their whole groups are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Poll GET url until 200; fail with the log tail if the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise AssertionError(f"{url} not healthy within {timeout} s (exit {proc.poll()}):\n{tail}")


@pytest.mark.slow
def test_unit_command_lines_run_the_server_and_the_watchdog(
    tmp_path: Path, notify: NotifySocket, groups: list[subprocess.Popen[bytes]]
) -> None:
    """vllm.service's ExecStart serves (as its main pid); wedgewatch.service's notifies systemd."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WEDGEWATCH_", "NOTIFY_"))}
    shim_dir = tmp_path / "shim"
    subprocess.run(
        [sys.executable, "-m", "wedgewatch", "sim", "install-vllm-shim", str(shim_dir)],
        check=True,
        timeout=60,
        capture_output=True,
    )

    # vllm.service, with the shipped defaults and example file, the shim and a free port.
    vllm_unit = parse_unit(UNITS / "vllm.service")
    port = free_port()
    env = environment_of(vllm_unit, UNITS / "vllm.env.example")
    env.update(VLLM_BIN=str(shim_dir / "vllm"), VLLM_PORT=str(port))
    argv = installed_here(exec_argv(vllm_unit, env))
    assert argv[1:3] == ["launch", "--model"]
    server_log = tmp_path / "vllm.log"
    with server_log.open("wb") as out:
        server = subprocess.Popen(
            argv,
            env={**clean, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the unit's cgroup
        )
    groups.append(server)
    wait_healthy(f"http://127.0.0.1:{port}/health", server, server_log, 120)
    listener = next(
        c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port
    )
    assert listener == server.pid, "launch should exec vLLM so that it is the unit's main pid"
    served = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
    assert served["data"][0]["id"] == "qwen"  # --served-model-name from VLLM_EXTRA_ARGS

    # wedgewatch.service, with the sample config pointed at temporary directories.
    config = tomllib.loads((UNITS / "wedgewatch.toml").read_text())
    listen = free_port()
    config.update(
        state_dir=str(tmp_path / "state"),
        evidence_dir=str(tmp_path / "evidence"),
        listen_port=listen,
    )
    config["targets"][0]["url"] = f"http://127.0.0.1:{port}"
    config_path = tmp_path / "wedgewatch.toml"
    config_path.write_text(tomli_w.dumps(config))
    ww_unit = parse_unit(UNITS / "wedgewatch.service")
    argv = installed_here(exec_argv(ww_unit, environment_of(ww_unit, None)))
    assert argv[-2:] == ["--config", "/etc/wedgewatch/wedgewatch.toml"]
    argv[-1] = str(config_path)
    (watchdog_sec,) = values(ww_unit, "Service", "WatchdogSec")
    watchdog_log = tmp_path / "wedgewatch.log"
    with watchdog_log.open("wb") as out:
        watchdog = subprocess.Popen(
            argv,
            env={
                **clean,
                "NOTIFY_SOCKET": notify.path,
                "WATCHDOG_USEC": str(int(watchdog_sec) * 1_000_000),
            },
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    groups.append(watchdog)
    notify.wait_for("READY=1", 60)
    notify.wait_for("WATCHDOG=1", 30)
    wait_healthy(f"http://127.0.0.1:{listen}/health", watchdog, watchdog_log, 30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = httpx.get(f"http://127.0.0.1:{listen}/probe", timeout=5)
        if probe.json()["state"] in ("idle", "ok"):
            break
        time.sleep(0.5)
    assert probe.status_code == 200, probe.text
    assert probe.json()["target"] == "vllm"
    assert any(m.startswith("STATUS=watching 1 target(s)") for m in notify.messages)

    watchdog.send_signal(signal.SIGTERM)  # systemctl stop wedgewatch
    assert watchdog.wait(timeout=60) == 0
    notify.wait_for("STOPPING=1", 5)
    os.killpg(server.pid, signal.SIGTERM)  # systemctl stop vllm: TERM to the whole cgroup
    server.wait(timeout=60)
