"""`wedgewatch demo`: the whole story on one machine, without a GPU, in about a minute.

The simulator stands in for vLLM (its `vllm` shim is installed into a temporary directory),
started by the launcher with the demo's profile (`tp2-offload`'s flags without
`VLLM_USE_SIMPLE_KV_OFFLOAD`, so vLLM's `OffloadingConnector`) in `--watch` mode, in this process:
the same `launch.watch` that `wedgewatch launch --watch` runs. Agentic-burst traffic
drives it into the scheduler wedge; the watchdog detects it after the (short, demo)
`stall_after_seconds`, captures an evidence bundle, restarts the server's whole process
group and sees it serve again. A live view shows every engine once a second; the story's
steps are printed as they happen, and a summary at the end.

The story is read the way an operator would read it: from the watchdog's own `/status`
endpoint and the bundle's `summary.json`. Tracking it is pure (`advance`, `render_*`);
`run_demo` is the IO shell. The server's and the watchdog's logs go to `demo.log` in the
demo directory, so the terminal only shows the story.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from wedgewatch import launch
from wedgewatch.config import Config, load_config
from wedgewatch.core.detection.states import CALM, CapturePhase
from wedgewatch.core.evidence.known_issues import (
    Facts,
    KnownIssue,
    match_issue,
    shipped_known_issues,
)
from wedgewatch.io import restarters
from wedgewatch.lab.demo_story import (
    Event,
    Story,
    advance,
    bundle_report,
    render_engines,
    render_header,
    render_summary,
    target_of,
)
from wedgewatch.lab.sim import load as sim_load
from wedgewatch.lab.sim.api import builtin_connector
from wedgewatch.lab.sim.args import ServeArgs, parse_serve_args
from wedgewatch.lab.sim.version import EMULATED_RELEASES, sim_vllm_version
from wedgewatch.lab.sim.vllm_shim import install_shim
from wedgewatch.vllm.build_info import features, serve_flags
from wedgewatch.vllm.profiles import Profile, builtin_profiles

DEMO_MODEL = "Qwen/Qwen3-0.6B"
#: The demo's launch profile, shipped in profiles.toml: the `tp2-offload` flags (TP 2, 60 GiB
#: native CPU offloading, 6 sequences, 4096 batched tokens, prefix caching, chunked prefill)
#: without its `VLLM_USE_SIMPLE_KV_OFFLOAD=1`, so vLLM builds `OffloadingConnector`: the
#: connector whose wedge vLLM 0.30.0 has on this traffic (SimpleCPUOffloadConnector never
#: wedged on it).
BASE_PROFILE = "tp2-offload"
DEMO_PROFILE = "tp2-offload-connector"
SIMPLE_OFFLOAD_ENV = "VLLM_USE_SIMPLE_KV_OFFLOAD"
#: The scheduler structure the simulator serves (`--vllm-structure`): vLLM 0.30.0's.
DEMO_STRUCTURE = "0.30"
#: The known issue whose path the demo takes (wedgewatch/vllm/known_issues.toml).
DEMO_ISSUE = "vllm-57841"
#: The traffic's seed: agentic-burst under it wedges the simulator's stock scheduler a few
#: seconds into the load on most runs (arrivals and steps interleave in wall-clock time).
DEMO_SEED = 16
#: One agentic-burst run: the burst comes a few seconds in, the wedge (when it comes) soon
#: after. A run that ends without a wedge is followed by a fresh server and the same run
#: again (a server that got through a burst rarely wedges from the next one).
BURST_SECONDS = 30.0
RECOVERY_SECONDS = 60.0  # healthy `agentic` traffic after the restart, until recovery shows
REFRESH_SECONDS = 1.0
#: The least `hang_after_seconds` the demo uses (twice the stall threshold when that is more):
#: a frozen loop is called a hang after this long. tests/lab/test_demo_abort.py lowers it in
#: the demo's own process to run the same story sooner; `wedgewatch demo` never changes it.
HANG_FLOOR_SECONDS = 30.0
#: vLLM's own flag: full-ISL admission off. With it vLLM 0.30.0's real scheduler wedges on 30 of
#: 30 agentic-burst seeds; with the default (on) on 1 of 30 (docs/simulator.md, "Fidelity").
#: And the simulator's: which release's scheduler structure it serves (and reports).
DEMO_SERVE_FLAGS = ("--no-scheduler-reserve-full-isl", "--vllm-structure", DEMO_STRUCTURE)


def demo_profiles() -> dict[str, Profile]:
    """The shipped profiles: the demo's, DEMO_PROFILE, is one of them (profiles.toml), so
    `wedgewatch launch --profile tp2-offload-connector` starts what the demo starts."""
    return builtin_profiles()


@dataclass(frozen=True, slots=True)
class DemoStory:
    """What the demo says it runs, derived from the command it prints: the connector vLLM
    would build from those flags and that environment, the one the simulator runs, the
    release it emulates and reports, and the known issue whose path that release takes."""

    connector: str  # what a real vLLM builds from the printed command
    simulated_connector: str  # what the simulator's built-in model runs
    release: str  # e.g. 0.30.0
    reported_version: str  # what the simulator's /version says: 0.30.0+wedgewatch.sim
    issue: KnownIssue
    async_scheduling: bool = True
    full_isl: bool = True  # scheduler_reserve_full_isl
    flags: Mapping[str, str] = field(default_factory=dict)  # of the printed command
    env: Mapping[str, str] = field(default_factory=dict)

    def disagreements(self) -> list[str]:
        """Where the printed command, what runs and the known issue tell different stories."""
        problems = []
        if self.connector != self.simulated_connector:
            problems.append(
                f"the printed command makes vLLM build {self.connector}, but the simulator "
                f"runs {self.simulated_connector}"
            )
        wedge = {"running": 0, "waiting": 3, "waiting_by_reason": {"capacity": 1, "deferred": 2}}
        facts = Facts(
            "deferred_stall",
            "scheduler_wedge",
            self.reported_version,
            features(self.flags, self.env, {}, wedge),
        )
        match = match_issue(self.issue, facts)
        if match is None:
            problems.append(
                f"{self.issue.ref} does not match a wedge of vLLM {self.reported_version} "
                f"with {self.connector}"
            )
        elif match.possible:
            problems.append(f"{self.issue.ref} is only a possibility for this configuration")
        return problems

    def scheduler_note(self) -> str:
        """The header line: which scheduler, which connector, which known path, what closes it."""
        issue = self.issue
        closes = (
            f"vLLM {issue.fixed_in} and later close it ({', '.join(issue.refs[1:]) or issue.ref})"
            if issue.fixed_in
            else "no release closes it"
        )
        return (
            f"  scheduler  the simulator's model of vLLM {self.release}'s scheduler "
            f"({'async' if self.async_scheduling else 'sync'} scheduling, "
            f"{self.simulated_connector}, full-ISL admission {'on' if self.full_isl else 'off'}), "
            "reporting "
            f"/version {self.reported_version}: it takes the {issue.ref} path on this "
            f"traffic, as vLLM {self.release} does; {closes}"
        )


def vllm_connector(flags: Mapping[str, str], env: Mapping[str, str]) -> str:
    """The KV connector a real vLLM builds from `vllm serve` flags and its environment."""
    found = features(flags, env, {}, None)
    if "simple_cpu_offload" in found:
        return "SimpleCPUOffloadConnector"
    if "offloading_connector" in found:
        return "OffloadingConnector"
    return "none"


def demo_story(command: launch.LaunchCommand) -> DemoStory:
    """The story of a demo command line (pure); LaunchError when the simulator cannot run it."""
    parsed = parse_serve_args(command.argv[command.argv.index("serve") + 1 :])
    if not isinstance(parsed, ServeArgs):
        raise launch.LaunchError(f"the simulator cannot serve {command.render()}: {parsed}")
    _, flags = serve_flags(command.argv)
    issues = {i.id: i for i in shipped_known_issues()}
    return DemoStory(
        connector=vllm_connector(flags, command.env),
        simulated_connector=builtin_connector(parsed),
        release=EMULATED_RELEASES[parsed.vllm_structure],
        reported_version=sim_vllm_version(parsed.vllm_structure),
        issue=issues[DEMO_ISSUE],
        async_scheduling=parsed.async_scheduling,
        full_isl=parsed.scheduler_reserve_full_isl,
        flags=flags,
        env=dict(command.env),
    )


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """`wedgewatch demo` settings."""

    directory: Path = Path("wedgewatch-demo")
    keep_running: bool = False
    seed: int = DEMO_SEED
    stall_after_seconds: float = 10.0
    timeout_seconds: float = 300.0
    real: bool = False  # a real CPU vLLM and the seed's wedge (wedgewatch/lab/demo_real.py)
    abort_first: bool = False  # --real --abort-first: the abort cure on the real server


def demo_settings(options: DemoOptions, *, listen_port: int) -> dict[str, Any]:
    """The watchdog's settings for the demo: short thresholds, private directories."""
    stall = options.stall_after_seconds
    return {
        "interval_seconds": 1.0,
        "stall_after_seconds": stall,
        "hang_after_seconds": max(HANG_FLOOR_SECONDS, 2 * stall),
        "output_stall_after_seconds": max(60.0, 4 * stall),
        "deferred_only_after_seconds": Config().deferred_only_after_seconds,  # the default
        "unreachable_after_seconds": max(10.0, stall),
        "startup_timeout_seconds": 120.0,
        "grace_seconds": 5.0,
        "listen_host": "127.0.0.1",
        "listen_port": listen_port,
        "state_dir": options.directory / "state",
        "evidence_dir": options.directory / "evidence",
        "log_level": "info",
    }


# ---- the shell (IO) ---------------------------------------------------------------------------


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _children_to_log(log_path: Path) -> Iterator[TextIO]:
    """Send fds 1 and 2 (ours, the server's, the watchdog's) to the log; yield the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    view = os.fdopen(os.dup(saved_out), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield view
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err, log_fd):
            os.close(fd)
        view.close()


class Screen:
    """The live view: redrawn in place on a terminal, plain lines otherwise."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self._drawn = 0

    def event(self, event: Event) -> None:
        """A story step, kept on screen above the view."""
        self._clear()
        marker = {"wedged": "!!", "recovered": "OK", "restarting": ">>"}.get(event.kind, "--")
        self.out.write(f"[t+{event.at:5.1f}s] {marker} {event.text}\n")

    def lines(self, lines: Sequence[str]) -> None:
        """Plain lines that stay (notes, the summary)."""
        self._clear()
        for line in lines:
            self.out.write(line + "\n")

    def view(self, lines: Sequence[str]) -> None:
        """The refreshing part: replaced on a terminal, appended otherwise."""
        self._clear()
        for line in lines:
            self.out.write(line + "\n")
        self._drawn = len(lines) if self.tty else 0
        self.out.flush()

    def _clear(self) -> None:
        if self.tty and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")
        self._drawn = 0


@dataclass(slots=True)
class _Traffic:
    """The load generator's progress, for the header line."""

    name: str = "none"
    sent: int = 0
    completed: int = 0
    failed: int = 0
    task: asyncio.Task[Any] | None = field(default=None)

    def describe(self) -> str:
        if self.task is None:
            return "none"
        running = "" if not self.task.done() else " (stopped)"
        return (
            f"{self.name}{running}: {self.sent} sent, {self.completed} completed, "
            f"{self.failed} failed"
        )

    def start(
        self,
        name: sim_load.ProfileName,
        url: str,
        seed: int,
        seconds: float,
        *,
        before: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Run `name` traffic against `url` (after `before`, e.g. a fresh server)."""
        self.stop()
        if self.finished and self.task is not None:
            self.task.exception()  # retrieved: a run that failed (server gone) is not an error
        self.name, self.sent, self.completed, self.failed = name, 0, 0, 0

        def progress(elapsed: float, sent: int, completed: int, failed: int) -> None:
            self.sent, self.completed, self.failed = sent, completed, failed

        async def run() -> sim_load.LoadSummary:
            if before is not None:
                await before()
            return await sim_load.run_load(
                url,
                sim_load.plan_requests(name, seed, seconds),
                profile=name,
                seed=seed,
                duration_seconds=seconds,
                # Clients keep waiting: one that gives up aborts its request, which frees
                # the parked loads' blocks and ends the wedge before the watchdog acts.
                request_timeout_seconds=300.0,
                progress=progress,
            )

        self.task = asyncio.create_task(run(), name=f"load-{name}")

    @property
    def finished(self) -> bool:
        """The current run ended by itself (sent its plan and drained)."""
        return self.task is not None and self.task.done() and not self.task.cancelled()

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _stalling(status: Mapping[str, Any]) -> bool:
    """An engine is suspect or worse right now."""
    target = target_of(status) or {}
    return any(e.get("state") not in CALM for e in target.get("engines") or [])


def _fresh_server(
    supervisor: restarters.Supervisor, url: str, grace_seconds: float
) -> Callable[[], Awaitable[None]]:
    """Restart the server (not a remedy: nothing is wedged) and wait until it answers."""

    async def fresh() -> None:
        await supervisor.restart(grace_seconds)
        async with httpx.AsyncClient(timeout=2.0) as client:
            for _ in range(600):
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{url}/health")).status_code == 200:
                        return
                await asyncio.sleep(0.1)

    return fresh


def _read_summary(bundle: str) -> Mapping[str, Any] | None:
    try:
        data = json.loads((Path(bundle) / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _show_bundle(screen: Screen, bundle: str | None, at: float) -> list[str]:
    """Print what a completed wedge bundle holds; [] while it is not complete yet."""
    summary = _read_summary(bundle) if bundle is not None else None
    if summary is None or summary.get("verdict") != CapturePhase.WEDGED:
        return []
    lines = bundle_report(summary)
    for line in lines:
        screen.event(Event(at, "bundle", line))
    return lines


def _rates(
    status: Mapping[str, Any], last: dict[str, tuple[float, float]], now: float
) -> dict[str, float]:
    """Generated tokens per second per engine since the previous refresh."""
    rates: dict[str, float] = {}
    target = target_of(status) or {}
    for engine in target.get("engines") or []:
        key = str(engine.get("engine"))
        tokens = float((engine.get("last_reading") or {}).get("generation_tokens") or 0.0)
        before = last.get(key)
        if before is not None and now > before[1] and tokens >= before[0]:
            rates[key] = (tokens - before[0]) / (now - before[1])
        last[key] = (tokens, now)
    return rates


async def _run(
    *,
    options: DemoOptions,
    screen: Screen,
    settings: Mapping[str, Any],
    config: Config,
    shim: Path,
    stop: asyncio.Event,
    log_path: Path,
) -> int:
    port = free_port()
    profiles = demo_profiles()
    prepared = launch.prepare(
        launch.LaunchOptions(
            model=DEMO_MODEL,
            profile=DEMO_PROFILE,
            vllm_bin=str(shim),
            extra_args=("--host", "127.0.0.1", "--port", str(port), *DEMO_SERVE_FLAGS),
            watch=True,
        ),
        profiles,
    )
    binary = prepared.binary
    assert binary is not None  # noqa: S101 - prepare() raises when the shim cannot run
    launch.preflight(prepared.command, binary, config)
    story_told = demo_story(prepared.command)
    if story_told.disagreements():
        raise launch.LaunchError(
            "the demo would tell two stories: " + "; ".join(story_told.disagreements())
        )
    server_url = f"http://127.0.0.1:{port}"
    status_url = f"http://127.0.0.1:{config.listen_port}/status"
    screen.lines(
        [
            f"wedgewatch demo: a simulated vLLM (no GPU) with the {DEMO_PROFILE} profile "
            f"({BASE_PROFILE} without {SIMPLE_OFFLOAD_ENV}, so {story_told.connector}), "
            "watched by wedgewatch, driven into the scheduler wedge by agentic-burst traffic.",
            f"  server     {prepared.command.render()}",
            story_told.scheduler_note(),
            f"  watchdog   launch --watch in this process, remedy supervise, "
            f"stall_after_seconds = {settings['stall_after_seconds']:g} "
            f"(demo; default {Config().stall_after_seconds:g})",
            f"  endpoints  {status_url}   logs: {log_path}",
            "",
        ]
    )
    watch_stop = asyncio.Event()
    supervisors: list[restarters.Supervisor] = []
    watched = asyncio.create_task(
        launch.watch(prepared.command, config, stop=watch_stop, on_started=supervisors.append),
        name="launch-watch",
    )
    traffic = _Traffic()
    story = Story()
    started = time.monotonic()
    last_tokens: dict[str, tuple[float, float]] = {}
    checked_bundle: str | None = None
    bundle_lines: list[str] = []
    endpoints_shown = False
    status: Mapping[str, Any] = {}
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            while not stop.is_set() and not watched.done():
                now = time.monotonic()
                elapsed = now - started
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    status = (await client.get(status_url)).json()
                story, events = advance(story, status, elapsed)
                refreshing = traffic.name == "agentic-burst" and traffic.sent == 0
                for event in events:
                    if event.kind == "suspect" and event.family == "unreachable" and refreshing:
                        continue  # the fresh server the demo asked for is starting
                    if event.kind == "restarting" and story.bundle != checked_bundle:
                        bundle_lines = _show_bundle(screen, story.bundle, elapsed) or bundle_lines
                        checked_bundle = story.bundle if bundle_lines else checked_bundle
                    screen.event(event)
                    if event.kind == "up":
                        screen.event(
                            Event(elapsed, "version", await _served_version(client, server_url))
                        )
                    if event.kind == "up" and story.restart_at is None:
                        traffic.start("agentic-burst", server_url, options.seed, BURST_SECONDS)
                    elif event.kind == "restarting":
                        traffic.stop()
                    elif event.kind == "back":
                        traffic.start("agentic", server_url, options.seed, RECOVERY_SECONDS)
                if (
                    story.up_at is not None
                    and story.wedged_at is None
                    and traffic.finished
                    and not _stalling(status)
                    and supervisors
                ):
                    screen.event(
                        Event(
                            elapsed,
                            "burst",
                            "no wedge from this burst (whether one wedges depends on how "
                            "arrivals and engine steps interleave in time); a fresh server and "
                            "the same burst again",
                        )
                    )
                    fresh = _fresh_server(supervisors[0], server_url, config.grace_seconds)
                    traffic.start(
                        "agentic-burst", server_url, options.seed, BURST_SECONDS, before=fresh
                    )
                if story.bundle is not None and story.bundle != checked_bundle:
                    shown = _show_bundle(screen, story.bundle, elapsed)
                    if shown:
                        bundle_lines, checked_bundle = shown, story.bundle
                rates = _rates(status, last_tokens, now)
                header = render_header(status, elapsed, traffic.describe(), config.restart_budget)
                screen.view([header, *render_engines(status, settings, rates, colour=screen.tty)])
                if story.complete and checked_bundle is not None:
                    if not options.keep_running:
                        break
                    if not endpoints_shown:
                        endpoints_shown = True
                        traffic.stop()
                        screen.lines(_endpoint_notes(config, server_url, options.seed))
                if not options.keep_running and elapsed > options.timeout_seconds:
                    screen.lines(
                        [f"the story did not complete within {options.timeout_seconds:g} s"]
                    )
                    break
                await _sleep_or_stop(REFRESH_SECONDS, stop)
        if watched.done() and not stop.is_set():
            code = watched.result()
            screen.lines([f"the server and the watchdog ended early (exit status {code})"])
    finally:
        traffic.stop()
        watch_stop.set()
        with contextlib.suppress(Exception):
            await watched
        if traffic.task is not None:
            await asyncio.gather(traffic.task, return_exceptions=True)
    screen.lines(render_summary(story, settings, bundle_lines, log_path))
    if checked_bundle is not None:
        screen.lines(await asyncio.to_thread(write_demo_report, Path(checked_bundle)))
        screen.lines(
            next_commands(Path(checked_bundle), Path(settings["evidence_dir"]), _program())
        )
    if not story.complete:
        return 1
    return 0 if checked_bundle is not None else 1


async def _run_real(
    *,
    options: DemoOptions,
    screen: Screen,
    settings: Mapping[str, Any],
    config: Config,
    shim: Path,
    stop: asyncio.Event,
    log_path: Path,
) -> int:
    """The story against a real CPU vLLM (wedgewatch/lab/demo_real.py); the same summary."""
    from wedgewatch.lab import demo_real  # noqa: PLC0415  (only `--real` needs it)

    del shim  # a real vllm serves, not the simulator
    port = free_port()
    cured: list[str] = []
    story = await demo_real.run_real(
        directory=options.directory,
        screen=screen,
        settings=settings,
        config=config,
        stop=stop,
        log_path=log_path,
        timeout_seconds=options.timeout_seconds,
        port=port,
        abort_first=options.abort_first,
        cured=cured,
    )
    if options.abort_first:
        ok = bool(cured) and cured[0] != ""
        screen.lines(
            [
                "",
                "the abort cure on a real vLLM 0.30.0: "
                + ("the wedge cured without a restart" if ok else "it did NOT cure the wedge"),
                *(f"  {line}" for line in cured if line),
                f"  the bundles: {settings['evidence_dir']}   the log: {log_path}",
            ]
        )
        return 0 if ok else 1
    bundle_lines = _show_bundle(screen, story.bundle, 0.0) if story.bundle else []
    screen.lines(render_summary(story, settings, bundle_lines, log_path))
    if story.bundle is not None:
        screen.lines(await asyncio.to_thread(write_demo_report, Path(story.bundle)))
        screen.lines(next_commands(Path(story.bundle), Path(settings["evidence_dir"]), _program()))
    return 0 if story.complete else 1


async def _served_version(client: httpx.AsyncClient, server_url: str) -> str:
    """What the server says it is (`GET /version`), as a story line."""
    try:
        answer = (await client.get(f"{server_url}/version")).json()
    except (httpx.HTTPError, ValueError) as exc:
        return f"GET /version failed: {exc}"
    version = answer.get("version") if isinstance(answer, dict) else None
    return f"GET /version: {version}"


def write_demo_report(bundle: Path) -> list[str]:
    """Write the bundle's report and upstream Markdown (wedgewatch report); say where, and
    which known issue the bundle matches with what to do about it."""
    from wedgewatch.report.commands import write_report  # noqa: PLC0415

    try:
        written = write_report(bundle)
        upstream = write_report(bundle, upstream=True)
    except OSError as exc:
        return [f"  report     not written: {exc.strerror or exc}"]
    lines = [
        f"  report     {written.paths[0]}  (open it in a browser; Markdown: {written.paths[1]})",
        f"  upstream   {upstream.paths[0]}  (attach it to the upstream vLLM issue)",
    ]
    lines.extend(f"             note: {note}" for note in written.notes)
    summary = _read_summary(str(bundle)) or {}
    matches = [m for m in summary.get("known_issues") or [] if isinstance(m, dict)]
    lines.extend(f"  known      {m['action']}" for m in matches if not m.get("possibility"))
    refs = {issue.id: issue.ref for issue in shipped_known_issues()}  # "#45406", as above
    possible = [
        refs.get(str(m.get("id")), str(m.get("id"))) for m in matches if m.get("possibility")
    ]
    if possible:
        lines.append(f"             possibly also {', '.join(possible)} (see the report)")
    return lines


def _program() -> str:
    """How the user ran wedgewatch, so the printed commands run the same one."""
    from wedgewatch.report.render import wedgewatch_program  # noqa: PLC0415

    return wedgewatch_program()


def next_commands(bundle: Path, evidence_dir: Path, program: str) -> list[str]:
    """The commands that list and reopen the demo's bundles, exactly as they run from here."""
    directory = shlex.quote(str(evidence_dir))
    return [
        "",
        "Next (the demo's bundles are in its own evidence directory, not the default "
        "/var/lib/wedgewatch/evidence):",
        f"  {program} bundles --evidence-dir {directory}",
        f"  {program} report {shlex.quote(str(bundle))}",
        f"  {program} report --upstream {shlex.quote(str(bundle))}",
    ]


def _endpoint_notes(config: Config, server_url: str, seed: int) -> list[str]:
    base = f"http://{config.listen_host}:{config.listen_port}"
    return [
        "",
        "Still running (--keep-running); explore, then Ctrl-C to stop:",
        f"  {base}/status    every engine, state, episode, last bundle (JSON)",
        f"  {base}/probe     200, or 503 while wedged (a liveness probe for vLLM)",
        f"  {base}/metrics   wedgewatch's own Prometheus metrics",
        f"  {base}/health    wedgewatch's own liveness",
        f"  {server_url}/metrics   the simulated vLLM's metrics",
        f"  wedge it again:  {_program()} sim load --url "
        f"{server_url} --profile agentic-burst --seed {seed} --duration 120",
        "",
    ]


async def _sleep_or_stop(seconds: float, stop: asyncio.Event) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def prepare_directory(directory: Path) -> Path:
    """Create the demo directory; a previous demo's state is removed, its evidence kept."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(directory / "state", ignore_errors=True)
    (directory / "evidence").mkdir(exist_ok=True)
    return directory / "demo.log"


Runner = Callable[..., Awaitable[int]]
"""One story: `_run`'s keyword arguments, its exit code."""


def run_demo(
    options: DemoOptions,
    *,
    configure_logging: Callable[[str], None],
    runner: Runner | None = None,
    adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> int:
    """`wedgewatch demo`: 0 when the whole story happened, 1 when it did not, 130 on Ctrl-C.

    `runner` tells another story with the same set-up (`adjust` changes its settings).
    """
    log_path = prepare_directory(options.directory)
    settings = demo_settings(options, listen_port=free_port())
    if options.real:
        from wedgewatch.lab import demo_real  # noqa: PLC0415  (only `--real` needs it)

        settings = demo_real.real_settings(settings)
    if adjust is not None:
        settings = adjust(settings)
    elif options.abort_first:  # --real --abort-first: the launcher makes the remedy supervise
        settings = {**settings, "abort_first": True, "remedy": "supervise"}
    config = load_config(flags=settings).config
    with tempfile.TemporaryDirectory(prefix="wedgewatch-demo-") as shim_dir:
        shim = install_shim(Path(shim_dir))
        with _children_to_log(log_path) as view:
            configure_logging(config.log_level)  # now JSON lines into the log
            screen = Screen(view)
            return asyncio.run(
                _main(
                    options=options,
                    screen=screen,
                    settings=settings,
                    config=config,
                    shim=shim,
                    log_path=log_path,
                    runner=runner,
                )
            )


async def _main(
    *,
    options: DemoOptions,
    screen: Screen,
    settings: Mapping[str, Any],
    config: Config,
    shim: Path,
    log_path: Path,
    runner: Runner | None = None,
) -> int:
    stop = asyncio.Event()
    interrupted: list[str] = []
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        interrupted.append(sig.name)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        run = runner or (_run_real if options.real else _run)
        code = await run(
            options=options,
            screen=screen,
            settings=settings,
            config=config,
            shim=shim,
            stop=stop,
            log_path=log_path,
        )
    except launch.LaunchError as exc:
        screen.lines([f"wedgewatch demo: {exc}"])
        return 2
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    if interrupted and not options.keep_running:
        return 130  # Ctrl-C before the story ended, as a shell reports SIGINT
    return code
