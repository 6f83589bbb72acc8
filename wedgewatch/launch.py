"""`wedgewatch launch`: start `vllm serve` from a named profile, the same way every time.

Building the command line is pure (profiles + extra arguments -> argv and environment);
the checks before launch (binary, port, GPUs) and running the server are thin IO at the edge.

Rules for merging flags, in order of precedence (highest first):
1. extra arguments given after `--` on the launch command line;
2. the profile's optional knobs (kv_cache_dtype, block_size, speculative_config,
   prefix_cache_retention_interval);
3. the profile's `args`.
A flag is identified by its name without a `--no-` prefix, so `--no-enable-prefix-caching`
given after `--` removes the profile's `--enable-prefix-caching`.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import errno
import os
import re
import shlex
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import NoReturn, TextIO

import structlog

from wedgewatch.config import Config, Target, default_target_name
from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.values import immutable
from wedgewatch.daemon.adapters import (
    FileStateStore,
    evidence_settings,
    process_selector,
    real_deps,
)
from wedgewatch.daemon.loop import Daemon
from wedgewatch.daemon.loop import run as run_watchdog
from wedgewatch.daemon.report import run_bundle_hook
from wedgewatch.daemon.roles import Deps
from wedgewatch.io import evidence, restarters, runner
from wedgewatch.io.bundle_hook import BundleHook
from wedgewatch.io.nvidia_smi import count_gpus
from wedgewatch.vllm.profiles import Profile

#: vLLM versions from this one on have `--prefix-cache-retention-interval` (vLLM PR #52216,
#: merged 2026-08, first released in 0.27); older ones read the environment variable.
RETENTION_FLAG_SINCE = (0, 27, 0)
RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
SIMULATOR_MARKER = "wedgewatch"
DEFAULT_PROFILE = "plain"  # `vllm serve MODEL` and the user's flags, nothing added
DEFAULT_VLLM_PORT = 8000
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"
#: What `VLLM_SERVER_DEV_MODE=1` opens on vLLM 0.30.0's API port (vllm/entrypoints/serve/dev/).
DEV_ROUTES = (
    "/abort_requests",
    "/pause",
    "/resume",
    "/is_paused",
    "/sleep",
    "/wake_up",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/server_info",
    "/update_weights and the other weight-transfer routes",
)

log = structlog.get_logger("wedgewatch.launch")


class LaunchError(Exception):
    """A check before launch failed; the message says what to do."""


@immutable
class LaunchCommand:
    """What to execute: the full argv and the environment variables set on top of ours."""

    argv: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def port(self) -> int:
        """The port `vllm serve` will listen on (vLLM's default is 8000)."""
        value = flag_value(self.argv, "--port")
        if value is None:
            return DEFAULT_VLLM_PORT
        try:
            return int(value)
        except ValueError:
            raise LaunchError(f"--port {value!r} is not a port number") from None

    @property
    def host(self) -> str | None:
        """The host `vllm serve` will bind, or None for vLLM's default (all interfaces)."""
        return flag_value(self.argv, "--host")

    @property
    def tensor_parallel_size(self) -> int:
        """The tensor-parallel size the command asks for (1 when absent)."""
        value = flag_value(self.argv, "--tensor-parallel-size", "-tp")
        if value is None:
            return 1
        try:
            return int(value)
        except ValueError:
            raise LaunchError(f"--tensor-parallel-size {value!r} is not a number") from None

    def render(self) -> str:
        """Shell-quoted, copy-paste ready: `VAR=value ... /path/vllm serve MODEL ...`."""
        assignments = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        return " ".join([*assignments, *(shlex.quote(part) for part in self.argv)])


def select_profile(profiles: Mapping[str, Profile], name: str) -> Profile:
    """The named profile, or LaunchError listing the ones that exist."""
    try:
        return profiles[name]
    except KeyError:
        known = ", ".join(sorted(profiles)) or "none"
        close = difflib.get_close_matches(name, list(profiles), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise LaunchError(
            f"unknown profile {name!r}{hint} (known: {known}; add your own as "
            "[profiles.NAME] in the config file)"
        ) from None


def render_profiles(profiles: Mapping[str, Profile]) -> str:
    """`--list-profiles`: each profile's name, description, flags, environment and knobs."""
    lines: list[str] = []
    for name in sorted(profiles):
        profile = profiles[name]
        command = build_command(vllm_bin="vllm", model="MODEL", profile=profile)
        lines.append(f"{name}: {profile.description or '(no description)'}")
        lines.append(f"    {command.render()}")
    return "\n".join(lines) + "\n"


@immutable
class _Flag:
    key: str  # name without leading dashes and without a `no-` prefix
    tokens: tuple[str, ...]


def _split_flags(args: Sequence[str]) -> list[_Flag]:
    """Group argv into flags with their values; a value is a token not starting with `--`."""
    flags: list[_Flag] = []
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("-"):
            flags.append(_Flag(key=f"positional:{token}", tokens=(token,)))
            index += 1
            continue
        name = token.split("=", 1)[0].lstrip("-")
        key = name.removeprefix("no-")
        if "=" in token or index + 1 >= len(args) or args[index + 1].startswith("--"):
            flags.append(_Flag(key=key, tokens=(token,)))
            index += 1
        else:
            flags.append(_Flag(key=key, tokens=(token, args[index + 1])))
            index += 2
    return flags


def merge_args(*layers: Sequence[str]) -> tuple[str, ...]:
    """Merge flag lists; a later layer's flag replaces an earlier layer's flag of the same name."""
    merged: dict[str, _Flag] = {}
    for layer in layers:
        for flag in _split_flags(layer):
            merged.pop(flag.key, None)
            merged[flag.key] = flag
    return tuple(token for flag in merged.values() for token in flag.tokens)


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag (`--x v` or `--x=v`), or None."""
    found: str | None = None
    for index, token in enumerate(argv):
        head, sep, tail = token.partition("=")
        if head in names:
            if sep:
                found = tail
            elif index + 1 < len(argv):
                found = argv[index + 1]
    return found


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first `X.Y.Z` in a `vllm --version` output, or None."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        return None
    return (int(match[1]), int(match[2]), int(match[3]))


def build_command(
    *,
    vllm_bin: str,
    model: str,
    profile: Profile,
    extra_args: Sequence[str] = (),
    vllm_version: tuple[int, int, int] | None = None,
    dev_endpoints: bool = False,
) -> LaunchCommand:
    """Build the `vllm serve` argv and environment for a profile (pure).

    `dev_endpoints` (`--dev-endpoints`) or the profile's `dev_endpoints` sets
    `VLLM_SERVER_DEV_MODE=1`; nothing else does (see `server_environment`).
    """
    knobs: list[str] = []
    env = dict(profile.env)
    if dev_endpoints or profile.dev_endpoints:
        env[DEV_MODE_ENV] = "1"
    if profile.kv_cache_dtype is not None:
        knobs += ["--kv-cache-dtype", profile.kv_cache_dtype]
    if profile.block_size is not None:
        knobs += ["--block-size", str(profile.block_size)]
    if profile.speculative_config is not None:
        knobs += ["--speculative-config", profile.speculative_config]
    if profile.prefix_cache_retention_interval is not None:
        interval = str(profile.prefix_cache_retention_interval)
        if vllm_version is None or vllm_version >= RETENTION_FLAG_SINCE:
            knobs += ["--prefix-cache-retention-interval", interval]
        else:
            env[RETENTION_ENV] = interval
    flags = merge_args(profile.args, knobs, extra_args)
    return LaunchCommand(argv=(vllm_bin, "serve", model, *flags), env=env)


# ---- checks before launch (IO) -------------------------------------------------------------


@immutable
class VllmBinary:
    """A resolved vllm executable and what it says about itself."""

    path: str
    version_text: str

    @property
    def is_simulator(self) -> bool:
        """True for `wedgewatch sim`'s drop-in `vllm` (it names itself in `--version`)."""
        return SIMULATOR_MARKER in self.version_text

    @property
    def version(self) -> tuple[int, int, int] | None:
        """The vLLM version it reports, if any."""
        return parse_version(self.version_text)


#: `vllm --version` prints one line; more than this is kept only in part.
VERSION_OUTPUT_BYTES = 64 * 1024
#: How long `nvidia-smi -L` may take to list the GPUs (a wedged GPU can hang it).
GPU_COUNT_TIMEOUT_SECONDS = 30.0


def resolve_vllm(vllm_bin: str, timeout_seconds: float = 120.0) -> VllmBinary:
    """Find the vllm executable and ask its version; LaunchError if it is missing or broken."""
    path = shutil.which(vllm_bin)
    if path is None:
        raise LaunchError(
            f"vllm executable {vllm_bin!r} not found (not on PATH and not an executable file); "
            "install vLLM or pass --vllm-bin PATH"
        )
    done = runner.blocking(
        runner.run_command(
            [path, "--version"],
            timeout_seconds=timeout_seconds,
            stdout_bytes=VERSION_OUTPUT_BYTES,
            stderr_bytes=VERSION_OUTPUT_BYTES,
        )
    )
    if done.start_error is not None:
        exc = done.start_error
        raise LaunchError(f"cannot run {path}: {exc.strerror or exc}")
    if done.timed_out:
        raise LaunchError(f"{path} --version did not answer within {timeout_seconds:g}s")
    stdout = done.stdout.decode("utf-8", errors="replace")
    stderr = done.stderr.decode("utf-8", errors="replace")
    if done.returncode != 0:
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        raise LaunchError(f"{path} --version failed with status {done.returncode}: {tail[0]}")
    return VllmBinary(path=path, version_text=(stdout or stderr).strip())


def check_port_free(host: str | None, port: int) -> None:
    """LaunchError when something already listens on the port the server needs."""
    address = host if host not in (None, "", "0.0.0.0", "::") else "0.0.0.0"
    family = socket.AF_INET6 if address and ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As servers bind (uvicorn, vLLM): connections of a just-stopped server lingering in
        # TIME_WAIT do not block the port, only a socket that is bound or listening does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(
                    f"port {port} is already in use on {address}; stop what listens there "
                    "or pass a different --port after --"
                ) from exc
            raise LaunchError(f"cannot bind {address}:{port}: {exc.strerror}") from exc


def count_visible_gpus(environ: Mapping[str, str]) -> int | None:
    """Usable GPUs: CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`; None if unknown."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([item for item in visible.split(",") if item.strip() not in ("", "-1")])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    return runner.blocking(count_gpus(smi, GPU_COUNT_TIMEOUT_SECONDS))


#: vLLM's CPU build names itself in its version (`0.32.0+cpu`); its platform detection
#: looks for the same marker. VLLM_TARGET_DEVICE=cpu asks for it explicitly.
CPU_VERSION_MARKER = "+cpu"
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def runs_on_cpu(command: LaunchCommand, binary: VllmBinary, environ: Mapping[str, str]) -> bool:
    """True for vLLM's CPU build (`--version` says `+cpu`) or VLLM_TARGET_DEVICE=cpu."""
    device = {**environ, **command.env}.get("VLLM_TARGET_DEVICE", "")
    return CPU_VERSION_MARKER in binary.version_text or device.strip().lower() == "cpu"


def check_cpu_ranks(command: LaunchCommand, environ: Mapping[str, str]) -> None:
    """vLLM on a CPU runs tensor parallel ranks only with one OpenMP core set per rank."""
    needed = command.tensor_parallel_size
    if needed <= 1:
        return
    bind = {**environ, **command.env}.get(CPU_BIND_ENV, "")
    sets = [part for part in bind.split("|") if part.strip()]
    if len(sets) < needed:
        raise LaunchError(
            f"tensor parallel size {needed} on a CPU needs {CPU_BIND_ENV} with one core set "
            f"per rank separated by '|' (e.g. '0|1'), but it is {bind!r}; without it vLLM "
            "fails with 'Not enough allowed NUMA nodes'"
        )


def check_gpus(command: LaunchCommand, binary: VllmBinary, environ: Mapping[str, str]) -> None:
    """Real vLLM needs a visible GPU per tensor-parallel rank; the simulator needs none, and
    vLLM's CPU build needs a core set per rank instead."""
    if binary.is_simulator:
        return
    if runs_on_cpu(command, binary, environ):
        check_cpu_ranks(command, environ)
        return
    needed = command.tensor_parallel_size
    found = count_visible_gpus({**environ, **command.env})
    if found is None:
        raise LaunchError(
            "cannot count GPUs (no nvidia-smi, no CUDA_VISIBLE_DEVICES); "
            f"the profile needs {needed}"
        )
    if found < needed:
        raise LaunchError(
            f"tensor parallel size {needed} needs {needed} GPUs but {found} are visible "
            "(check CUDA_VISIBLE_DEVICES and nvidia-smi)"
        )


def server_environment(command: LaunchCommand, environ: Mapping[str, str]) -> dict[str, str]:
    """Our environment with the profile's variables on top.

    `VLLM_SERVER_DEV_MODE` is not inherited: vLLM's dev endpoints are on only when the
    operator opted in (`--dev-endpoints`, a profile's `dev_endpoints` or its `env`).
    """
    inherited = {k: v for k, v in environ.items() if k != DEV_MODE_ENV}
    return {**inherited, **command.env}


def dev_mode_on(env: Mapping[str, str]) -> bool:
    """vLLM's reading of `VLLM_SERVER_DEV_MODE` (`bool(int(...))`; not a number: off here)."""
    try:
        return bool(int(env.get(DEV_MODE_ENV, "0")))
    except ValueError:
        return False


def dev_mode_notice(
    command: LaunchCommand, environ: Mapping[str, str], *, abort_first: bool = False
) -> list[str]:
    """What the launcher says at start about vLLM's dev endpoints (pure)."""
    if dev_mode_on(command.env):
        host = command.host or "0.0.0.0"
        where = (
            f"the server listens on {host}, loopback only"
            if host.startswith("127.") or host in ("localhost", "::1")
            else f"the server listens on {host}: anyone who reaches port {command.port} can "
            "call them; keep them off the client path (--host 127.0.0.1 behind a proxy that "
            "forwards only /v1/, or a NetworkPolicy)"
        )
        return [
            f"vLLM's development endpoints are ON ({DEV_MODE_ENV}=1, opted in): on the API "
            f"port, without --api-key: {', '.join(DEV_ROUTES)}; {where}",
        ]
    notes = []
    if dev_mode_on(environ):
        notes.append(
            f"{DEV_MODE_ENV} in this environment is not passed to the server: the launcher "
            "turns vLLM's development endpoints on only with --dev-endpoints or a profile's "
            "dev_endpoints = true"
        )
    if abort_first:
        notes.append(
            "abort_first is on but vLLM's development endpoints are off: the abort cure "
            "cannot be sent, every wedge goes to the restart (add --dev-endpoints)"
        )
    return notes


# ---- the watchdog's view of the launched server (pure) -------------------------------------


def target_url(command: LaunchCommand) -> str:
    """Where the watchdog reaches the server: its --host (loopback for all interfaces), --port."""
    host = command.host
    if host in (None, "", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{command.port}"


def watch_config(config: Config, command: LaunchCommand) -> Config:
    """The watchdog's configuration: one target, the launched server; `remedy = "supervise"`."""
    url = target_url(command)
    target = Target(name=default_target_name(url), url=url)
    return Config.model_validate(
        {**config.model_dump(), "targets": (target.model_dump(),), "remedy": "supervise"}
    )


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


# ---- what `wedgewatch launch` does (IO) -----------------------------------------------------


@immutable
class LaunchOptions:
    """The launch command line, parsed."""

    model: str
    profile: str = DEFAULT_PROFILE
    vllm_bin: str = "vllm"
    extra_args: tuple[str, ...] = ()
    dry_run: bool = False
    watch: bool = False
    dev_endpoints: bool = False


@immutable
class Prepared:
    """A command ready to run, and the binary it was built for (None: not found, dry run)."""

    command: LaunchCommand
    binary: VllmBinary | None
    profile: Profile


def prepare(
    options: LaunchOptions,
    profiles: Mapping[str, Profile],
    *,
    resolve: Callable[[str], VllmBinary] = resolve_vllm,
) -> Prepared:
    """Pick the profile, resolve vllm (a dry run goes on without it), build the command."""
    if not options.model.strip():
        raise LaunchError("--model must name a model (a Hugging Face id or a local path)")
    profile = select_profile(profiles, options.profile)
    binary: VllmBinary | None
    try:
        binary = resolve(options.vllm_bin)
    except LaunchError:
        if not options.dry_run:
            raise
        binary = None
    command = build_command(
        vllm_bin=binary.path if binary is not None else options.vllm_bin,
        model=options.model,
        profile=profile,
        extra_args=options.extra_args,
        vllm_version=binary.version if binary is not None else None,
        dev_endpoints=options.dev_endpoints,
    )
    _ = (command.port, command.tensor_parallel_size)  # LaunchError now for a non-number
    return Prepared(command=command, binary=binary, profile=profile)


def describe_dry_run(prepared: Prepared, options: LaunchOptions, config: Config | None) -> str:
    """Notes for stderr next to a dry run: profile, binary, and the watchdog when --watch."""
    notes = [f"# profile {options.profile}: {prepared.profile.description or '(no description)'}"]
    binary = prepared.binary
    if binary is None:
        notes.append(
            f"# vllm {options.vllm_bin!r} was not found; its version is unknown, so version-"
            "dependent flags assume a current vLLM"
        )
    else:
        kind = "the wedgewatch simulator" if binary.is_simulator else "vLLM"
        notes.append(f"# {binary.path}: {kind}, `--version` says {binary.version_text!r}")
    if config is not None:
        watched = watch_config(config, prepared.command)
        notes.append(
            f"# --watch: wedgewatch watches {watched.targets[0].metrics_url} in the same "
            f'process with remedy = "supervise"; its endpoints: '
            f"http://{watched.listen_host}:{watched.listen_port}/status"
        )
    return "\n".join(notes) + "\n"


def preflight(command: LaunchCommand, binary: VllmBinary, config: Config | None = None) -> None:
    """Every check before launch, in the order an operator would fix them.

    With `config` (--watch) the watchdog's own listen port is checked too, so that a
    busy port fails before the server starts rather than right after.
    """
    check_port_free(command.host, command.port)
    if config is not None:
        if command.port == 0:
            raise LaunchError(
                "--watch needs a fixed server port: the watchdog must know where to scrape "
                "(pass --port N after --)"
            )
        if config.listen_port != 0:
            try:
                check_port_free(config.listen_host, config.listen_port)
            except LaunchError as exc:
                raise LaunchError(
                    f"wedgewatch's own endpoints: {exc} (set --listen-port, or 0 for any)"
                ) from None
    check_gpus(command, binary, os.environ)


def exec_server(command: LaunchCommand, environ: Mapping[str, str]) -> NoReturn:
    """Replace this process with the server: signals reach it directly, its status is ours."""
    log.info("server_exec", command=command.render())
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # S606: exec without a shell is the point: the argv is exactly what --dry-run printed.
        os.execve(  # noqa: S606
            command.argv[0], list(command.argv), server_environment(command, environ)
        )
    except OSError as exc:
        raise LaunchError(f"cannot run {command.argv[0]}: {exc.strerror or exc}") from exc


DepsFactory = Callable[..., Deps]


async def watch(
    command: LaunchCommand,
    config: Config,
    *,
    environ: Mapping[str, str] | None = None,
    stop: asyncio.Event | None = None,
    make_deps: DepsFactory = real_deps,
    on_started: Callable[[restarters.Supervisor], None] | None = None,
) -> int:
    """Run the server under a Supervisor and the watchdog beside it; the launcher's exit code.

    `config` is the watchdog's configuration as given; the target and `remedy =
    "supervise"` are derived from the command here. The server runs in its own process
    group. The first SIGTERM/SIGINT (or `stop`) stops the watchdog (an in-flight capture or
    restart finishes) and then the server's whole group (TERM, grace_seconds, KILL); a
    second signal cuts the watchdog's shutdown short. When the server exits by itself the
    watchdog stops too. The result is the server's exit status (128 + N for signal N), or
    1 when the watchdog failed.
    """
    env = dict(os.environ if environ is None else environ)
    watched = watch_config(config, command)
    supervisor = restarters.Supervisor(command.argv, env=server_environment(command, env))
    try:
        deps = make_deps(watched, supervisor=supervisor, environ=env)
    except (RuntimeError, ValueError) as exc:
        raise LaunchError(f"the watchdog cannot start: {exc}") from exc
    try:
        return await _watch(
            command=command,
            config=watched,
            deps=deps,
            supervisor=supervisor,
            stop=stop,
            on_started=on_started,
        )
    finally:
        if isinstance(deps.state_store, FileStateStore):
            deps.state_store.close()


async def _watch(
    *,
    command: LaunchCommand,
    config: Config,
    deps: Deps,
    supervisor: restarters.Supervisor,
    stop: asyncio.Event | None,
    on_started: Callable[[restarters.Supervisor], None] | None,
) -> int:
    try:
        await supervisor.start()
    except restarters.SupervisorError as exc:
        raise LaunchError(str(exc)) from exc
    log.info(
        "server_started",
        pid=supervisor.pid,
        process_group=supervisor.pgid,
        target=config.targets[0].metrics_url,
        command=command.render(),
    )
    if on_started is not None:
        on_started(supervisor)
    stop_event = stop if stop is not None else asyncio.Event()
    daemon_stop = asyncio.Event()
    server_task = asyncio.create_task(supervisor.wait(), name="server")

    async def on_stopped(daemon: Daemon) -> None:
        # Ending by itself (no stop asked) is a crash whatever the status: vLLM exits 0
        # after its engine died.
        if server_task.done() and not server_task.cancelled() and not stop_event.is_set():
            status = exit_status(server_task.result())
            await crash_bundles(config, daemon, status, hook=deps.bundle_hook)

    daemon_task = asyncio.create_task(
        run_watchdog(config, deps, stop=daemon_stop, on_stopped=on_stopped), name="watchdog"
    )
    stop_task = asyncio.create_task(stop_event.wait(), name="stop")
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    received: list[str] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig.name)
        if stop_event.is_set():
            daemon_task.cancel()  # the second signal: do not wait for a capture or restart
        stop_event.set()

    if stop is None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
    try:
        await asyncio.wait(
            {daemon_task, server_task, stop_task}, return_when=asyncio.FIRST_COMPLETED
        )
        watchdog_failed = False
        if server_task.done():
            log.warning(
                "server_exited",
                status=exit_status(server_task.result()),
                reason="the server ended by itself; stopping the watchdog",
            )
        elif daemon_task.done():
            watchdog_failed = True
            problem = daemon_task.exception() if not daemon_task.cancelled() else None
            log.error(
                "watchdog_failed",
                reason=str(problem) if problem else "the watchdog stopped unexpectedly",
            )
        else:
            log.info("launcher_stopping", signal=received[0] if received else None)
        daemon_stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(daemon_task, return_exceptions=True)
        status = await supervisor.stop(config.grace_seconds)
        if server_task.done() and not server_task.cancelled():
            status = server_task.result()
        else:
            server_task.cancel()
        code = exit_status(status if status is not None else 0)
        log.info("server_stopped", status=code, restarts=supervisor.starts - 1)
        return 1 if watchdog_failed else code
    finally:
        stop_task.cancel()
        for task in (daemon_task, server_task):
            if not task.done():
                task.cancel()
        await asyncio.gather(daemon_task, server_task, stop_task, return_exceptions=True)
        if supervisor.returncode is None:
            await supervisor.stop(config.grace_seconds)  # never leave the server behind
        for sig in installed:
            loop.remove_signal_handler(sig)


async def crash_bundles(
    config: Config, daemon: Daemon, status: int, *, hook: BundleHook | None = None
) -> None:
    """The server crashed (exited by itself, with any status: vLLM exits 0 after its engine
    died): a bundle per target from the watchdog's flight recorder and last good /metrics
    body, with what is left of the server (usually nothing: outcome `server_gone`). Logged
    as `crash_bundle_written`; the `on_bundle` hook, when set, runs for it before the
    launcher exits."""
    deps = evidence.EvidenceDeps(settings=evidence_settings(config))
    for target, history, body in daemon.flight_records():
        result = await evidence.capture_bundle(
            evidence.CaptureRequest(
                target=target.name,
                selector=process_selector(target),
                phase=CapturePhase.MANUAL,
                family="crash",
                metrics_body=body,
                metrics_error=None if body is not None else "no good scrape kept",
                history=history,
                verdict={
                    "reason": f"the server exited by itself with status {status}: a crash "
                    "bundle from the watchdog's flight recorder"
                },
            ),
            deps,
        )
        log.warning(
            "crash_bundle_written",
            target=target.name,
            status=status,
            bundle=None if result.bundle is None else str(result.bundle),
            server_gone=result.server_gone,
            failures=list(result.failures),
        )
        if hook is not None and result.bundle is not None:
            await run_bundle_hook(hook, str(result.bundle), target=target.name, phase="crash")


def launch(
    options: LaunchOptions,
    config: Config,
    profiles: Mapping[str, Profile],
    *,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> int:
    """`wedgewatch launch`: dry run, exec the server, or run it watched; the exit code.

    Raises LaunchError (the CLI prints it and exits 2) when a check before launch fails.
    """
    prepared = prepare(options, profiles)
    notice = dev_mode_notice(
        prepared.command, os.environ, abort_first=options.watch and config.abort_first
    )
    if options.dry_run:
        stderr.write(describe_dry_run(prepared, options, config if options.watch else None))
        stderr.writelines(f"# {line}\n" for line in notice)
        stdout.write(prepared.command.render() + "\n")
        return 0
    for line in notice:
        log.warning("dev_endpoints", note=line)
        stderr.write(f"wedgewatch launch: {line}\n")
    binary = prepared.binary
    assert binary is not None  # noqa: S101 - prepare() raises when it is missing outside a dry run
    preflight(prepared.command, binary, config if options.watch else None)
    if not options.watch:
        exec_server(prepared.command, os.environ)
    return asyncio.run(watch(prepared.command, config))
