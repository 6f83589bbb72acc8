"""What each path of the sidecar imports, read from `sys.modules` when the command exits
(after its work): the exec probe, the daemon and `capture` import none of the modules they
do not need.

A list, not a timing: each forbidden name is a package (or a wedgewatch subpackage) whose
import a path must not pay for. The exec probe runs every few seconds on every replica
(docs/benchmarks.md "Exec probe start-up"); the daemon runs for weeks in every pod, and
every module it holds is resident memory ("The daemon's memory").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always
from wedgewatch_daemon import DaemonProcess

FIXTURES = Path(__file__).parents[1] / "fixtures"
ENTRY = str(Path(sys.executable).with_name("wedgewatch"))

#: `wedgewatch ARGS` as the console script runs it (`entry.main`), writing the names in
#: `sys.modules` to the file given first when the process exits.
LISTING = """
import atexit, sys
out = sys.argv.pop(1)
sys.argv[0] = "wedgewatch"
def listing():
    with open(out, "w") as f:
        f.write("\\n".join(sorted(k for k, v in sys.modules.items() if v is not None)))
atexit.register(listing)
from wedgewatch.entry import main
main()
"""


def listed(out: Path) -> list[str]:
    """`wedgewatch` run so that it lists its modules into `out` when it exits."""
    return [sys.executable, "-c", LISTING, str(out)]


#: The probe answers from the state file's cached settings with the standard library.
PROBE_FORBIDDEN = frozenset(
    {
        "typer",
        "click",
        "rich",
        "pygments",
        "pydantic",
        "asyncio",
        "httpx",
        "httpcore",
        "anyio",
        "structlog",
        "prometheus_client",
        "psutil",
        "stamina",
        "tenacity",
        "starlette",
        "uvicorn",
        "matplotlib",
        "wedgewatch.cli",
        "wedgewatch.config",
        "wedgewatch.daemon",
        "wedgewatch.io.notify",
        "wedgewatch.io.scrape",
        "wedgewatch.lab",
        "wedgewatch.report",
    }
)
#: The daemon and `capture`: never the lab, the report renderer, matplotlib, or the
#: optional extras of its libraries (rich and pygments, see `cli.unused_extras_hidden`).
DAEMON_FORBIDDEN = frozenset(
    {"wedgewatch.lab", "wedgewatch.report", "matplotlib", "rich", "pygments", "markdown_it"}
)
#: `wedgewatch run` itself: its configuration is validated by the command line in a child
#: process (`daemon.start`), so the daemon holds neither the CLI nor pydantic; httpx and
#: stamina only when a canary, the abort cure or a webhook needs them. (click and anyio
#: stay: uvicorn and starlette import them.)
RUN_FORBIDDEN = DAEMON_FORBIDDEN | {
    "typer",
    "pydantic",
    "pydantic_core",
    "wedgewatch.cli",
    "wedgewatch.config.model",
    "wedgewatch.config.sources",
    "wedgewatch.config.settings",
    "wedgewatch.config.reference",
    "wedgewatch.vllm.profiles",
}
NEEDED_FOR_HTTPX = frozenset({"httpx", "httpcore", "stamina", "tenacity"})


def clean_env() -> dict[str, str]:
    """This environment without wedgewatch's settings, systemd's socket or a terminal width."""
    drop = ("NOTIFY_SOCKET", "COLUMNS", "TERMINAL_WIDTH")
    return {
        k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_") and k not in drop
    }


def imported(out: Path) -> set[str]:
    """The modules a `listed` run held when it exited."""
    return set(out.read_text().split())


def offending(modules: set[str], forbidden: frozenset[str]) -> list[str]:
    """Every module of `modules` that is, or lies below, a forbidden name."""
    return sorted(
        name
        for name in modules
        if any(name == banned or name.startswith(banned + ".") for banned in forbidden)
    )


def test_the_exec_probe_imports_no_cli_no_daemon_and_no_lab(tmp_path: Path) -> None:
    """`wedgewatch check --for 0 --state-file` scrapes, judges and saves with none of them."""
    state = tmp_path / "probe.json"
    body = (FIXTURES / "idle.prom").read_bytes()
    with ScriptedServer(always(Reply(body=body))) as server:
        args = ["check", server.url, "--for=0", f"--state-file={state}", "--critical-only"]
        first = subprocess.run(
            [ENTRY, *args], capture_output=True, text=True, env=clean_env(), check=False
        )  # the full CLI validates the settings and caches them in the state file
        assert first.returncode == 0, first.stderr
        probe = subprocess.run(
            [*listed(tmp_path / "modules"), *args],
            capture_output=True,
            text=True,
            env=clean_env(),
            check=False,
        )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.startswith(f"OK: idle - {server.url}, 1 engine, 1 scrape")
    modules = imported(tmp_path / "modules")
    assert {"wedgewatch.check.run", "wedgewatch.io.http_get", "wedgewatch.vllm.signals"} <= modules
    assert offending(modules, PROBE_FORBIDDEN) == []
    assert json.loads(state.read_text())["detector"]["last_at"] is not None  # and it saved


def _run_until(tmp_path: Path, args: list[str], done: Callable[[DaemonProcess], bool]) -> set[str]:
    """The modules `wedgewatch run ARGS` held when it stopped, stopped once `done` held."""
    daemon = DaemonProcess(args, tmp_path, env=clean_env(), command=listed(tmp_path / "modules"))
    try:
        deadline = time.monotonic() + 30
        while not done(daemon):
            assert time.monotonic() < deadline, "the daemon never got there"
            time.sleep(0.1)
    finally:
        assert daemon.stop() == 0
    return imported(tmp_path / "modules")


def _scraped(daemon: DaemonProcess) -> bool:
    return daemon.get("/status").json()["targets"][0]["last_scrape"] is not None


def test_the_daemon_imports_no_cli_no_pydantic_no_httpx_no_lab(tmp_path: Path) -> None:
    """`wedgewatch run` (one target; no canary, webhook or abort cure), once it scrapes its
    target, holds none of the forbidden modules, nor httpx."""
    body = (FIXTURES / "idle.prom").read_bytes()
    with ScriptedServer(always(Reply(body=body))) as server:
        modules = _run_until(tmp_path, ["--target", f"t={server.url}"], _scraped)
    assert {"wedgewatch.daemon.loop", "wedgewatch.io.scrape", "wedgewatch.config.plain"} <= modules
    assert offending(modules, RUN_FORBIDDEN | NEEDED_FOR_HTTPX) == []


def _vllm(number: int, path: str) -> Reply:
    """A server with a model that answers a canary with one streamed token."""
    if path.startswith("/v1/models"):
        return Reply(body=b'{"data": [{"id": "tiny"}]}')
    if path.startswith("/v1/completions"):
        token = b'data: {"choices": [{"text": "OK"}]}\n\ndata: [DONE]\n\n'
        return Reply(body=token, headers={"Content-Type": "text/event-stream"})
    return Reply(body=(FIXTURES / "idle.prom").read_bytes())


def test_a_daemon_with_a_canary_imports_httpx_and_still_no_cli(tmp_path: Path) -> None:
    """With a canary configured, httpx is imported when the first canary is sent; the CLI,
    pydantic and rich stay out."""
    with ScriptedServer(_vllm) as server:
        args = ["--target", f"t={server.url}", "--canary-interval-seconds", "1"]

        def canary_sent(daemon: DaemonProcess) -> bool:
            target = daemon.get("/status").json()["targets"][0]
            return any(r.path.startswith("/v1/completions") for r in server.requests) and (
                target["last_scrape"] is not None
            )

        modules = _run_until(tmp_path, args, canary_sent)
    assert {"httpx", "wedgewatch.io.canary"} <= modules
    assert offending(modules, RUN_FORBIDDEN) == []


def test_capture_imports_no_lab_no_report_and_no_rich(tmp_path: Path) -> None:
    """`wedgewatch capture --target URL` writes its bundle with none of the forbidden modules."""
    body = (FIXTURES / "idle.prom").read_bytes()
    with ScriptedServer(always(Reply(body=body))) as server:
        done = subprocess.run(
            [
                *listed(tmp_path / "modules"),
                "capture",
                "--target",
                server.url,
                "--evidence-dir",
                str(tmp_path / "evidence"),
                "--pyspy-path",
                str(tmp_path / "no-py-spy"),  # stacks fail as data: nothing is attached
                "--process-sample-seconds",
                "0.1",
            ],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("bundle: ")
    modules = imported(tmp_path / "modules")
    assert "wedgewatch.daemon.adapters" in modules
    assert offending(modules, DAEMON_FORBIDDEN) == []


def test_help_still_lists_the_commands_mounted_on_demand() -> None:
    """The top-level help names `sim`, `bundles` and `report`, which load only on demand."""
    done = subprocess.run(
        [ENTRY, "--help"], capture_output=True, text=True, env=clean_env(), timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    words = set(done.stdout.replace("│", " ").split())
    assert {"sim", "bundles", "report", "run", "check", "capture"} <= words


@pytest.mark.parametrize(("argv", "laid_out"), [(["run"], False), (["config"], True)])
def test_only_help_imports_the_help_layout(argv: list[str], laid_out: bool) -> None:
    """A bare command (`run`, its config from the environment) leaves typer's rich layout out."""
    code = (
        "import sys; from wedgewatch import cli; "
        f"cli._lay_out_piped_help({argv!r}); print('typer.rich_utils' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), check=True
    )
    assert done.stdout.strip() == str(laid_out)
