"""`wedgewatch run` as a real process against real servers on 127.0.0.1 (slow).

Misbehaving HTTP servers (garbage, a 200 MB body, a trickling body, a refused port, HTML)
test that bad input is data; a static wedged exposition with an `exec` remedy tests the
restart budget across a `kill -9`; the simulator tests detection, evidence, triage, the
signal remedy under a supervising parent, the fault families and the absence of false
alarms.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ports import free_port
from scripted_http import RefusingPort, Reply, ScriptedServer, always, zeros
from wedgewatch_daemon import WEDGEWATCH, DaemonProcess

from wedgewatch.report.commands import write_report
from wedgewatch.report.model import read_bundle
from wedgewatch.report.render import NO_MATCH, verdict_sentence
from wedgewatch.vllm.profiles import builtin_profiles
from wedgewatch.vllm.semantics import progress_counters
from wedgewatch.vllm.signals import Exposition, parse

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts daemons and makes sure none outlives the test."""
    started: list[DaemonProcess] = []

    def start(args: list[str], name: str = "daemon") -> DaemonProcess:
        daemon = DaemonProcess(args, tmp_path, name)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:  # each leads its own session: kill the whole group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(daemon.proc.pid, signal.SIGKILL)
        daemon.proc.wait(timeout=30)


# -- bad input -----------------------------------------------------------------------------------


def test_bad_targets_are_data_not_crashes(daemons: Callable[..., DaemonProcess]) -> None:
    """Garbage, 200 MB, trickling, refused and HTML targets: a clear reason each, no wedge."""
    garbage = Reply(200, b"this is not prometheus {{{\n\x00\xff\n", {"Content-Type": "text/plain"})
    huge = Reply(200, zeros(200 * 1024 * 1024), {"Content-Type": "text/plain"}, 200 * 1024 * 1024)
    trickle = Reply(
        200,
        (b"# HELP x y\n" for _ in range(100_000)),
        {"Content-Type": "text/plain"},
        chunk_pause_seconds=0.2,
    )
    html = Reply(200, b"<html><body>Login required</body></html>", {"Content-Type": "text/html"})
    idle = Reply(200, (FIXTURES / "idle.prom").read_bytes(), {"Content-Type": "text/plain"})
    with (
        ScriptedServer(always(garbage)) as s_garbage,
        ScriptedServer(always(huge)) as s_huge,
        ScriptedServer(always(trickle)) as s_trickle,
        ScriptedServer(always(html)) as s_html,
        ScriptedServer(always(idle)) as s_idle,
        RefusingPort() as refused,
    ):
        targets = {
            "garbage": s_garbage.base_url,
            "huge": s_huge.base_url,
            "trickle": s_trickle.base_url,
            "html": s_html.base_url,
            "refused": refused.url,
            "idle": s_idle.base_url,
        }
        args = ["--interval-seconds", "1", "--scrape-timeout-seconds", "2"]
        for name, url in targets.items():
            args += ["--target", f"{name}={url}"]
        daemon = daemons(args)
        expected = {
            "garbage": "parse_error",
            "huge": "too_large",
            "trickle": "timeout",
            "html": "parse_error",
            "refused": "refused",
        }
        for name, reason in expected.items():
            line = daemon.wait_for("scrape_failed", timeout_seconds=30, target=name)
            assert line["reason"] == reason, line
        html_line = daemon.events("scrape_failed", target="html")[0]
        assert "text/html" in html_line["detail"]
        peak = 0
        for _ in range(10):  # keep feeding it bad input for a while
            time.sleep(1)
            peak = max(peak, daemon.rss_bytes())
            assert daemon.get("/health").status_code == 200
        status = daemon.get("/status").json()
        states = {t["name"]: t["state"] for t in status["targets"]}
        assert states["idle"] == "idle"
        assert all(states[name] == "starting" for name in expected), states
        for name in expected:  # one line per change of reason, not one per scrape
            assert len(daemon.events("scrape_failed", target=name)) == 1
        assert daemon.events("wedge_detected") == []
        # Measured about 78 MiB; a body cap that failed would hold the 200 MB body.
        assert peak < 120 * 1024 * 1024, f"RSS peaked at {peak / 2**20:.0f} MiB"
        assert daemon.stop() == 0


# -- restart budget across kill -9 -----------------------------------------------------------------


def test_restart_budget_holds_across_kill_9(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Restarts done before wedgewatch is SIGKILLed count against the budget of the next one."""
    body = (FIXTURES / "deferred_wedge.prom").read_bytes()
    restarts = tmp_path / "restarts.txt"
    command = f"sh -c 'echo restarted >> {shlex.quote(str(restarts))}'"

    def wedged(n: int, path: str) -> Reply:
        # Each "restart" brings a new (still wedged) server: a new process start time, as
        # vLLM's process collector reports it, so wedgewatch can prove the replacement.
        count = restarts.read_text().count("restarted") if restarts.exists() else 0
        started = f"process_start_time_seconds {1.8e9 + count}".encode()
        replaced = body.replace(b"process_start_time_seconds 1.79620356444e+09", started)
        return Reply(200, replaced, {"Content-Type": "text/plain"})

    with ScriptedServer(wedged) as server:
        args = [
            "--target",
            f"sim={server.base_url}",
            "--interval-seconds",
            "0.5",
            "--stall-after-seconds",
            "2",
            "--remedy",
            "exec",
            "--exec-command",
            command,
            "--restart-budget",
            "2",
            "--restart-backoff-seconds",
            "1",
            "--restart-backoff-max-seconds",
            "1",
        ]
        first = daemons(args, name="first")
        first.wait_for("restart_succeeded", timeout_seconds=60)
        first.kill9()
        assert restarts.read_text().count("restarted") == 1

        second = daemons(args, name="second")
        restored = second.wait_for("state_restored", timeout_seconds=30)
        assert restored["restart_budget_remaining"] == 1
        second.wait_for("gave_up", timeout_seconds=60)
        time.sleep(3)  # it stays given up: no further restart
        assert restarts.read_text().count("restarted") == 2
        status = second.get("/status").json()["targets"][0]
        assert status["gave_up"] is True
        # The budget binds a liveness probe too (probe_respects_budget): it passes, saying so.
        probe = second.get("/probe")
        assert probe.status_code == 200
        assert probe.json()["gave_up"] is True
        assert probe.json()["restart_policy"]["decision"] == "gave_up"
        assert second.stop() == 0


def test_second_daemon_on_one_state_dir_is_refused(
    daemons: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """Two watchdogs on one state_dir would restart one server twice: the second exits 2."""
    with RefusingPort() as refused:
        first = daemons(["--target", refused.url])
        second = subprocess.run(
            [
                *WEDGEWATCH,
                "run",
                "--target",
                refused.url,
                "--listen-port",
                "0",
                "--state-dir",
                str(tmp_path / "state"),
                "--evidence-dir",
                str(tmp_path / "evidence"),
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 2
        assert b"in use by another wedgewatch" in second.stderr
        assert first.stop() == 0


# -- against the simulator -------------------------------------------------------------------------

# The launcher's production profile, exactly as `wedgewatch launch --profile tp2-offload` runs it.
TP2_OFFLOAD = list(builtin_profiles()["tp2-offload"].args)
# vLLM 0.30.0's scheduler (the simulator's model) wedges on agentic-burst with full-ISL admission
# off (30 of 30 seeds, for the real scheduler too); with vLLM's default (on) on 1 of 30
# (docs/simulator.md, "Fidelity").
TP2_WEDGE = [*TP2_OFFLOAD, "--no-scheduler-reserve-full-isl"]
# The load seed under which agentic-burst wedges the stock scheduler about 7 s into the load
# (tests/lab/sim/test_burst.py); over HTTP, arrival timing can occasionally let a burst through.
WEDGING_SEED = "16"

# A supervising parent, as systemd or a container runtime would be: it runs the server in
# its own process group and starts it again whenever it exits, until told to stop.
SUPERVISOR = """
import os, pathlib, signal, subprocess, sys, time
stop_file, pids_file, argv = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3:]
child = None
def finish(*_):
    stop_file.touch()
    if child is not None and child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
signal.signal(signal.SIGTERM, finish)
while not stop_file.exists():
    child = subprocess.Popen(argv, start_new_session=True)
    with pids_file.open("a") as f:
        f.write(f"{child.pid}\\n")
    child.wait()
    time.sleep(0.2)
"""


class Sim:
    """`wedgewatch sim serve` on 127.0.0.1 (optionally under the supervisor above)."""

    def __init__(
        self, tmp_path: Path, name: str, flags: list[str], *, supervised: bool = False
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.name = name
        serve = [
            *WEDGEWATCH,
            "sim",
            "serve",
            "Qwen/Qwen3-0.6B",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *flags,
        ]
        self.log_path = tmp_path / f"sim-{name}.log"
        self.stop_file = tmp_path / f"sim-{name}.stop"
        self.pids_file = tmp_path / f"sim-{name}.pids"
        argv = (
            [sys.executable, "-c", SUPERVISOR, str(self.stop_file), str(self.pids_file), *serve]
            if supervised
            else serve
        )
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.wait_healthy(timeout_seconds=60)

    def wait_healthy(self, timeout_seconds: float) -> None:
        """Wait until /health answers 200."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            with_error = None
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError as exc:
                with_error = exc
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        tail = self.log_path.read_text(errors="replace")[-3000:]
        raise AssertionError(f"sim {self.name} not healthy ({with_error}); log:\n{tail}")

    def serving_pids(self) -> list[int]:
        """Pids of the serving processes the supervisor started, in order."""
        return [int(p) for p in self.pids_file.read_text().split()]

    def load(
        self,
        profile: str,
        duration_seconds: float,
        seed: str = "7",
        timeout_seconds: float = 300,
        retries: int = 0,
    ) -> Load:
        """Start `wedgewatch sim load` against this server (clients retry timed-out requests)."""
        return Load(
            [
                *WEDGEWATCH,
                "sim",
                "load",
                "--url",
                self.base_url,
                "--profile",
                profile,
                "--seed",
                seed,
                "--duration",
                str(duration_seconds),
                "--request-timeout-seconds",
                str(timeout_seconds),
                "--retries",
                str(retries),
                "--retry-backoff-seconds",
                "0.5",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def stop(self) -> None:
        """Stop the server (and its supervisor) and every process of their groups."""
        self.stop_file.touch()
        groups = {self.proc.pid}
        if self.pids_file.exists():
            groups.update(self.serving_pids())
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        self.proc.wait(timeout=30)


class Load:
    """A `wedgewatch sim load` child in its own process group."""

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        self.proc = subprocess.Popen(argv, **kwargs)

    def kill(self) -> None:
        """Stop it now (it may have finished already)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


class ProgressWatch:
    """Polls a server's /metrics at 5 Hz and remembers when engine 0 last made progress."""

    def __init__(self, base_url: str) -> None:
        self.url = base_url + "/metrics"
        self.last_progress_timestamp: float | None = None
        self._last: tuple[float, ...] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                body = httpx.get(self.url, timeout=2).content
            except httpx.HTTPError:
                continue
            parsed = parse(body)
            if not isinstance(parsed, Exposition) or not parsed.engines:
                continue
            reading = parsed.engines[min(parsed.engines)]
            if progress_counters(reading) != self._last:
                self._last = progress_counters(reading)
                self.last_progress_timestamp = time.time()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _timestamp(line: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


@pytest.fixture
def sims(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    """Starts simulators and stops every one of them after the test."""
    started: list[Sim] = []

    def start(name: str, flags: list[str], *, supervised: bool = False) -> Sim:
        sim = Sim(tmp_path, name, flags, supervised=supervised)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


def test_sim_wedge_is_detected_captured_and_restarted(
    daemons: Callable[..., DaemonProcess], sims: Callable[..., Sim], tmp_path: Path
) -> None:
    """The real scheduler wedge: detected in time, stacks of engine and both workers, restart."""
    stall_after, interval = 5.0, 1.0
    sim = sims("tp2", TP2_WEDGE, supervised=True)
    watch = ProgressWatch(sim.base_url)
    daemon = daemons(
        [
            "--target",
            f"sim={sim.base_url}",
            "--interval-seconds",
            str(interval),
            "--stall-after-seconds",
            str(stall_after),
            "--hang-after-seconds",
            "30",
            "--remedy",
            "signal",
            "--grace-seconds",
            "5",
        ]
    )
    load = sim.load("agentic-burst", 12, seed=WEDGING_SEED)
    try:
        wedge = daemon.wait_for("wedge_detected", timeout_seconds=150)
        assert wedge["family"] == "deferred_stall", wedge
        onset = watch.last_progress_timestamp
        assert onset is not None
        latency = _timestamp(wedge) - onset
        assert latency <= stall_after + interval + 1.0, f"detected {latency:.2f} s after onset"

        captured = daemon.wait_for("evidence_captured", timeout_seconds=60, phase="wedged")
        bundle = Path(captured["bundle"])
        summary = json.loads((bundle / "summary.json").read_text())
        assert len(summary["pids"]["engine_core"]) == 1
        assert len(summary["pids"]["worker"]) == 2
        stacks = {p.name for p in (bundle / "pyspy").iterdir()}
        for pid in [*summary["pids"]["engine_core"], *summary["pids"]["worker"]]:
            assert any(str(pid) in name for name in stacks), (pid, stacks)
        assert summary["triage"]["kind"] == "scheduler_wedge", summary["triage"]
        assert oct((bundle / "summary.json").stat().st_mode & 0o777) == "0o600"

        daemon.wait_for("restart_requested", timeout_seconds=60)
        load.kill()  # let the new server come back to an idle world
        daemon.wait_for("restart_succeeded", timeout_seconds=120)
        closed = daemon.wait_for("episode_closed", timeout_seconds=30)
        assert closed["outcome"] == "restarted"
        # What happened next is in the bundle, so its report can tell the whole story.
        remedy = [json.loads(line) for line in (bundle / "remedy.jsonl").read_text().splitlines()]
        assert [(e["event"], e.get("ok"), e.get("outcome")) for e in remedy] == [
            ("restart", True, None),
            ("episode_closed", None, "restarted"),
        ]
        model = read_bundle(bundle)
        assert model.problems == ()
        assert model.version is not None
        # GET /version of the simulator: the release its scheduler emulates, marked as the sim
        assert model.version == "0.30.0+wedgewatch.sim"
        assert model.build["flags"]["--kv-offloading-size"] == "60"
        assert {"kv_offloading", "running_zero"} <= set(model.facts.features)
        assert model.matches  # the tp2-offload wedge is a known upstream shape
        assert [m["id"] for m in summary["known_issues"]] == [m.issue.id for m in model.matches]
        assert "server back after the restart" in verdict_sentence(model)
        sim.wait_healthy(timeout_seconds=60)
        assert len(sim.serving_pids()) == 2  # the supervisor started a second server
        time.sleep(3)
        assert daemon.get("/probe").status_code == 200
        assert daemon.stop() == 0
    finally:
        load.kill()
        watch.close()


def test_sim_faults_are_their_own_families(
    daemons: Callable[..., DaemonProcess], sims: Callable[..., Sim]
) -> None:
    """Each fault its own story: progress stall; unreachable (refused); unreachable (timeout)."""
    hang = sims("hang", [*TP2_OFFLOAD, "--fault", "collective-hang@10"])
    crash = sims("crash", ["--fault", "engine-crash@10"])
    api = sims("api", ["--fault", "api-hang@10"])
    load = hang.load("steady", 60)
    try:
        daemon = daemons(
            [
                "--target",
                f"hang={hang.base_url}",
                "--target",
                f"crash={crash.base_url}",
                "--target",
                f"api={api.base_url}",
                "--interval-seconds",
                "1",
                "--stall-after-seconds",
                "5",
                "--hang-after-seconds",
                "5",
                "--unreachable-after-seconds",
                "5",
                "--scrape-timeout-seconds",
                "2",
            ]
        )
        hung = daemon.wait_for("wedge_detected", timeout_seconds=90, target="hang")
        assert hung["family"] == "progress_stall", hung
        assert "scrape_failure" not in hung
        # What tells them apart: the crashed server's port is closed (refused), the hung
        # API server accepts and never answers (timeout).
        for name, failure in (("crash", "refused"), ("api", "timeout")):
            line = daemon.wait_for("target_unreachable", timeout_seconds=90, target=name)
            assert line["family"] == "unreachable", line
            assert line["scrape_failure"] == failure, line
        assert daemon.events("wedge_detected", target="crash") == []
        assert daemon.events("wedge_detected", target="api") == []
        triages = {}
        for name in ("hang", "crash", "api"):
            captured = daemon.wait_for(
                "evidence_captured", timeout_seconds=90, target=name, phase="wedged"
            )
            triages[name] = captured["triage"]
        assert triages["hang"].startswith("collective_hang"), triages
        assert triages["api"].startswith("api_hang"), triages
        # The crashed server exited (sim: within ~5 s of the engine): nothing left to py-spy.
        assert triages["crash"].startswith("no_stacks"), triages
        assert "no process listens" in triages["crash"], triages
        status = {t["name"]: t for t in daemon.get("/status").json()["targets"]}
        for name, failure in (("crash", "refused"), ("api", "timeout")):
            episode = status[name]["episode"]
            assert episode["scrape_failure"] == failure, status[name]
            assert status[name]["last_scrape_error"].startswith(failure), status[name]
        assert status["hang"]["episode"]["triage"].startswith("collective_hang")
        assert status["api"]["episode"]["triage"].startswith("api_hang")
        # Reports of real fault bundles: the collective hang is a known NCCL-hang shape; an
        # API hang and a crashed server match nothing known and say so.
        expected = {"hang": ("collective_hang", "vllm-45094"), "api": ("api_hang", None),
                    "crash": ("no_stacks", None)}  # fmt: skip
        for name, (kind, issue) in expected.items():
            captured = daemon.events("evidence_captured", target=name, phase="wedged")[-1]
            written = write_report(Path(captured["bundle"]))
            html = written.paths[0].read_text()
            assert f"<b>{kind}</b>" in html, name
            if issue is None:
                assert NO_MATCH in html, name
            else:
                assert issue.split("-")[1] in html, name
        assert daemon.stop() == 0
    finally:
        load.kill()


@pytest.mark.soak  # minutes of real time by design: the heavy tier (tests/run.sh --real)
def test_sim_no_false_alarm(
    daemons: Callable[..., DaemonProcess], sims: Callable[..., Sim]
) -> None:
    """Three minutes of healthy traffic shapes, none of which may become a wedge.

    Agentic load from clients that time out and retry (aborts moving), an idle server, long
    unchunked prefills, a sleeping engine, a 90 s chunked prefill (three times
    hang_after_seconds, counters flat, KV growing) and a streaming-input session waiting
    deferred between its chunks with nothing else queued. One daemon watches the six servers at
    once, so the cases share the three minutes. The long-prefill server runs whole (unchunked)
    prompts in 4 s steps, so its counters stay flat for seconds while requests run: the test
    checks that this flat window was really seen (suspect, progress_stall) and that it never
    became a wedge.
    """
    duration = 180.0
    fixed = ["--scheduler-fix", "skip-head-when-idle"]
    agentic = sims("agentic", fixed)
    idle = sims("idle", [])
    prefill = sims(
        "prefill",
        [
            *fixed,
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens",
            "32768",
            "--step-time-seconds",
            "4",
        ],
    )
    sleeping = sims("sleeping", [])
    assert httpx.post(sleeping.base_url + "/sleep", timeout=10).status_code == 200
    # 30 000 tokens in 1024-token chunks of 3 s: a 90 s prefill, 3x hang_after_seconds.
    chunked = sims(
        "chunked",
        ["--max-num-batched-tokens", "1024", "--prefill-step-time-seconds", "3"],
    )
    session = sims("session", [])
    daemon = daemons(
        [
            "--target",
            f"agentic={agentic.base_url}",
            "--target",
            f"idle={idle.base_url}",
            "--target",
            f"prefill={prefill.base_url}",
            "--target",
            f"sleeping={sleeping.base_url}",
            "--target",
            f"chunked={chunked.base_url}",
            "--target",
            f"session={session.base_url}",
            "--interval-seconds",
            "1",
            "--stall-after-seconds",
            "10",
            "--hang-after-seconds",
            "30",
            "--remedy",
            "signal",
        ]
    )
    loads = [
        # Impatient agentic clients: many give up after 1 s, are aborted and retry.
        agentic.load("agentic", duration, timeout_seconds=1, retries=3),
        prefill.load("long-prefill", duration),
        sleeping.load("steady", duration),
        chunked.load("long-prompt", duration),
        session.load("streaming-session", duration),
    ]
    try:
        flat_seen = 0.0
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            time.sleep(2)
            for target in daemon.get("/status").json()["targets"]:
                if target["name"] == "prefill" and target["engines"]:
                    flat_seen = max(flat_seen, target["engines"][0]["stalled_seconds"])
        targets = {t["name"]: t for t in daemon.get("/status").json()["targets"]}
        for busy in ("agentic", "prefill", "chunked", "session"):  # the load really reached them
            reading = targets[busy]["engines"][0]["last_reading"]
            assert reading["generation_tokens"] > 0, targets[busy]
        # The agentic clients really gave up and retried (their aborts were counted).
        agentic_body = httpx.get(agentic.base_url + "/metrics", timeout=10).text
        assert 'finished_reason="abort",model_name="Qwen/Qwen3-0.6B"} 0.0' not in agentic_body
        # The long prefill really looked like a stall for a while (so this case can fail).
        suspected = daemon.events("stall_suspected", target="prefill")
        assert suspected, "the long prefill never left the counters flat"
        assert {line["family"] for line in suspected} == {"progress_stall"}
        assert flat_seen > 0, "no stalled_seconds seen for the long prefill in /status"
        assert daemon.events("engine_recovered", target="prefill")
        states = {name: t["state"] for name, t in targets.items()}
        assert states["idle"] == "idle"
        assert states["sleeping"] == "sleeping"
        assert daemon.events("stall_suspected", target="agentic") == []
        assert daemon.events("wedge_detected") == []
        assert daemon.events("target_unreachable") == []
        assert daemon.events("restart_requested") == []
        assert daemon.stop() == 0
    finally:
        for load in loads:
            load.kill()


def test_capture_command_takes_a_bundle_now(sims: Callable[..., Sim], tmp_path: Path) -> None:
    """`wedgewatch capture --target URL` writes a private bundle with every process's stacks."""
    sim = sims("capture", ["--tensor-parallel-size", "2"])
    evidence_dir = tmp_path / "manual"
    result = subprocess.run(
        [
            *WEDGEWATCH,
            "capture",
            "--target",
            sim.base_url,
            "--evidence-dir",
            str(evidence_dir),
            "--json",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    bundle = Path(report["bundle"])
    assert bundle.parent == evidence_dir
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["verdict"] == "manual"
    assert len(summary["pids"]["worker"]) == 2
    assert (bundle / "metrics_manual.prom").read_bytes().startswith(b"# HELP")
    assert oct(bundle.stat().st_mode & 0o777) == "0o700"

    missing = subprocess.run(
        [*WEDGEWATCH, "capture", "--evidence-dir", str(evidence_dir)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2
    assert b"--target URL, --pid PID or --pid-file FILE" in missing.stderr
