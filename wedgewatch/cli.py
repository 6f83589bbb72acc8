"""The `wedgewatch` command: one typer app; each command lives with the stage it drives.

Several people add commands here: add yours as a small, separate block that calls into
your own module, and edit with targeted replacements rather than rewriting the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand

from wedgewatch import __version__, check, config
from wedgewatch.check import settings as check_settings
from wedgewatch.config import SETTINGS, Config
from wedgewatch.core.text import nagios
from wedgewatch.core.text.escape import safe_line
from wedgewatch.core.text.redact import redact_url, redact_value
from wedgewatch.logsetup import configure_logging

#: Help piped into a file or a pager (no terminal, no COLUMNS) is laid out this wide, not at
#: rich's 80 columns, where the option table cut long flag names short ("--stall-after-seco…").
PIPED_HELP_WIDTH = 140

app = typer.Typer(
    name="wedgewatch",
    help="Watchdog for vLLM servers that wedge while /health stays green.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"wedgewatch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Watchdog for vLLM servers that wedge while /health stays green."""


# -- logging (configured once, here) ---------------------------------------------------


# -- config flags: one typer option per Config field, generated from the model ---------

_Command = TypeVar("_Command", bound=Callable[..., Any])


def _flag_annotation(name: str, panel: str | None = None) -> Any:
    setting = SETTINGS[name]
    first_sentence = setting.description.split(". ")[0].rstrip(".")
    default = "none" if setting.default in ((), None) else str(setting.default)
    help_text = f"{first_sentence}. (default: {default}; env: {setting.env})"
    if setting.kind == "bool":
        flag = f"{setting.flag}/--no-{setting.flag[2:]}"
        return Annotated[
            bool | None,
            typer.Option(flag, help=help_text, show_default=False, rich_help_panel=panel),
        ]
    if setting.kind in ("list", "targets"):
        return Annotated[
            list[str] | None,
            typer.Option(setting.flag, help=help_text, show_default=False, rich_help_panel=panel),
        ]
    annotation = Config.model_fields[name].annotation
    python_type = annotation if annotation in (float, int, Path) else str
    if setting.name.endswith("_bytes"):
        python_type = str  # sizes accept units: 16MiB
    return Annotated[
        python_type | None,
        typer.Option(setting.flag, help=help_text, show_default=False, rich_help_panel=panel),
    ]


def with_config_flags(*names: str, panel: str | None = None) -> Callable[[_Command], _Command]:
    """Give a command one option per named Config field; it receives `flags={field: value}`.

    `panel` groups them under that heading in `--help` (typer's rich_help_panel).

    Options left out on the command line are absent from `flags`, so `load_config` keeps
    the value from the file, the environment or the default, and records the source.
    """

    def decorate(command: _Command) -> _Command:
        signature = inspect.signature(command, eval_str=True)
        params = [p for p in signature.parameters.values() if p.name != "flags"]
        for name in names:
            params.append(
                inspect.Parameter(
                    name,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=None,
                    annotation=_flag_annotation(name, panel),
                )
            )

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            flags: dict[str, Any] = {}
            for name in names:
                value = kwargs.pop(name)
                if value is None or value == []:
                    continue
                kind = SETTINGS[name].kind
                if kind in ("list", "targets"):
                    value = tuple(value)
                elif kind == "argv":
                    try:
                        value = tuple(shlex.split(value))
                    except ValueError as exc:
                        raise typer.BadParameter(
                            f"not a valid shell-quoted command ({exc})",
                            param_hint=SETTINGS[name].flag,
                        ) from None
                flags[name] = value
            return command(**kwargs, flags=flags)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


_CONFIG_FILE_OPTION = typer.Option(
    "--config",
    help="TOML config file (default: $WEDGEWATCH_CONFIG). See docs/configuration.md.",
    dir_okay=False,
    show_default=False,
)


def _echo_json(document: Mapping[str, Any]) -> None:
    """One JSON document on stdout, the one place the command line's documents are redacted
    (`check`'s report is `check.render`'s; `config show` reveals only on request)."""
    typer.echo(json.dumps(redact_value(document)))


def _fail(messages: tuple[str, ...] | list[str], code: int) -> typer.Exit:
    for message in messages:
        typer.echo(f"wedgewatch: {message}", err=True)
    return typer.Exit(code)


# -- wedgewatch config ... ---------------------------------------------------------------

config_app = typer.Typer(
    help="Show, check and document wedgewatch's configuration.", no_args_is_help=True
)
app.add_typer(config_app, name="config")


@config_app.command("show")
@with_config_flags(*SETTINGS)
def _config_show(
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    as_toml: Annotated[bool, typer.Option("--toml", help="Print TOML even on a terminal.")] = False,
    reveal: Annotated[
        bool,
        typer.Option(
            "--reveal",
            help="Show secrets (webhook URL paths and queries, URL credentials, secret-looking "
            "arguments and environment values) instead of ***.",
        ),
    ] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Print the effective configuration and where each value came from (secrets masked)."""
    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    if as_json:
        typer.echo(json.dumps(config.config_as_json(loaded, reveal=reveal), indent=2))
    elif sys.stdout.isatty() and not as_toml:
        typer.echo(config.render_table(loaded, reveal=reveal), nl=False)
    else:
        typer.echo(config.render_toml(loaded, reveal=reveal), nl=False)


@config_app.command("check")
def _config_check(
    file: Annotated[Path, typer.Argument(help="The TOML config file to validate.")],
) -> None:
    """Validate a config file on its own (defaults + file): exit 0, or 2 with the problems."""
    try:
        loaded = config.load_config(config_file=file, environ={})
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    given = sum(1 for source in loaded.sources.values() if source.startswith("file:"))
    typer.echo(f"{file}: valid ({given} setting{'s' if given != 1 else ''} set)")


@config_app.command("reference")
def _config_reference(
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file instead of stdout.")
    ] = None,
) -> None:
    """Print the configuration reference (docs/configuration.md) generated from the model.

    Exit 0 when written, 1 when --output cannot be written.
    """
    text = config.render_reference()
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _fail([f"cannot write {output}: {exc.strerror or exc}"], 1) from None


# -- wedgewatch check ----------------------------------------------------------------------


#: click's exit code for a usage error (a bad option or argument, a missing one).
CLICK_USAGE_EXIT = 2


def _usage_error(exc: Exception) -> bool:
    """`exc` is click's usage error (exit 2), whichever click typer runs on.

    Since typer 0.26 that is typer's private copy of click, before it the click package, and
    typer exports neither `UsageError` nor a common base for both, so it is known by what
    click documents of it: `exit_code` 2 and `format_message()`. `typer.Exit(2)` is not one.
    """
    return (
        not isinstance(exc, typer.Exit)
        and getattr(exc, "exit_code", None) == CLICK_USAGE_EXIT
        and callable(getattr(exc, "format_message", None))
    )


class _NagiosCommand(TyperCommand):
    """A command whose usage errors exit 3 (UNKNOWN), as Nagios plugins must.

    With `--json` the error is also printed as the command's JSON object on stdout, so a
    caller that parses stdout gets `{"status": "unknown", ...}` rather than nothing. The
    context is typed `Any`: its class is typer's private click `Context` since typer 0.26
    (`typer.Context` is a subclass, too narrow for these overrides).
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        wants_json = "--json" in args  # before parsing: click consumes the list in place
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:
            self._unknown(exc, wants_json=wants_json)
            raise

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            self._unknown(exc, wants_json=bool(ctx.params.get("as_json")))
            raise

    @staticmethod
    def _unknown(exc: Exception, *, wants_json: bool) -> None:
        """A usage error leaves with exit 3 (and as JSON with --json); others are untouched."""
        if not _usage_error(exc):
            return
        if wants_json:
            message = exc.format_message()  # type: ignore[attr-defined]
            _echo_json({"status": "unknown", "engines": [], "error": message})
        exc.exit_code = check.EXIT_UNKNOWN  # type: ignore[attr-defined]


@app.command("check", cls=_NagiosCommand)
@with_config_flags(*check_settings.CHECK_FLAG_SETTINGS)
def _check(
    url: Annotated[
        str,
        typer.Argument(
            help="The server's base URL (http://127.0.0.1:8000) or its /metrics URL.",
            show_default=False,
        ),
    ],
    *,
    window_seconds: Annotated[
        float,
        typer.Option(
            "--for",
            min=0,
            help="Seconds to scrape for. Without --state-file every threshold is capped at "
            "this window (a stall lasting the whole window is a wedge). With --state-file "
            "0 means one scrape.",
        ),
    ] = 10.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    state_file: Annotated[
        Path | None,
        typer.Option(
            "--state-file",
            dir_okay=False,
            help="Keep the detector state in this file between runs (probe mode): the "
            "configured thresholds apply over the whole history.",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
    critical_only: Annotated[
        bool,
        typer.Option(
            "--critical-only",
            help="Exit 0 for WARNING (suspect, or wedged with no restart allowed) and for a "
            "judged UNKNOWN (NaN/Inf readings, a body that is not vLLM's, a URL reaching several "
            "servers), still printing the line: only CRITICAL (2) fails. For Kubernetes exec "
            "probes, where any non-zero exit restarts the server and an engine is suspect long "
            "before it is wedged. Bad arguments, configuration and internal errors still exit 3, "
            "so a broken probe is seen. See docs/check.md.",
        ),
    ] = False,
    warning: Annotated[
        str | None,
        typer.Option(
            "-w",
            "--warning",
            help="WARNING when an engine's stalled seconds cross this Nagios range "
            "(30: above 30 s).",
            show_default=False,
        ),
    ] = None,
    critical: Annotated[
        str | None,
        typer.Option(
            "-c",
            "--critical",
            help="CRITICAL when an engine's stalled seconds cross this Nagios range.",
            show_default=False,
        ),
    ] = None,
    flags: dict[str, Any],
) -> None:
    """Judge one vLLM server now, Nagios style.

    Scrapes URL every --interval-seconds for --for seconds, judging each engine like `run`.

    Exit 0: ok, idle, sleeping or starting. 1: suspect. 2: wedged or unreachable.
    3: unknown: not a vLLM metrics body, too many engines, non-finite values, a URL that
    reaches more than one server, bad arguments, or an internal error.
    """
    try:
        if not 0 <= window_seconds < float("inf"):
            raise typer.BadParameter("must be a finite number of seconds", param_hint="--for")
        if state_file is None and window_seconds == 0:
            raise typer.BadParameter(
                "--for 0 needs --state-file: a single scrape cannot show a stall",
                param_hint="--for",
            )
        thresholds = _stall_thresholds(warning, critical, critical_only=critical_only)
        try:
            metrics_url = config.metrics_url_of(url)
        except ValueError as exc:
            raise typer.BadParameter(f"{safe_line(url)!r} {exc}", param_hint="URL") from None
        try:
            loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
        except config.ConfigError as exc:
            if as_json:
                error = "; ".join(exc.messages)
                _echo_json({"status": "unknown", "engines": [], "error": error})
            raise _fail(exc.messages, check.EXIT_UNKNOWN) from None
        settings = check_settings.CheckSettings.from_config(loaded.config)
        configure_logging(settings.log_level)
        check.set_log_level(settings.log_level)
        cache = None
        if state_file is not None:
            key = check_settings.settings_key(url, config_file, os.environ, flags)
            # A URL with a secret is never written to the file: no cache, no fast path.
            if key is not None and redact_url(metrics_url) == metrics_url:
                cache = {"key": key, "metrics_url": metrics_url, "values": settings.to_json()}
        options = check.options_for(
            metrics_url,
            settings,
            window_seconds=window_seconds,
            state_file=state_file,
            settings_cache=cache,
            thresholds=thresholds,
        )
        raise typer.Exit(check.execute(options, as_json=as_json, critical_only=critical_only))
    except (typer.BadParameter, typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # the Nagios contract: UNKNOWN, never a traceback
        raise _internal_error(exc, as_json=as_json) from None


def _stall_thresholds(
    warning: str | None, critical: str | None, *, critical_only: bool
) -> check.StallThresholds | None:
    """`-w`/`-c` as Nagios ranges; a bad range or one beside --critical-only is a usage error."""
    if warning is None and critical is None:
        return None
    if critical_only:
        raise typer.BadParameter(
            "-w/-c are for Nagios-style callers; --critical-only is for a liveness probe, "
            "where the detector and the restart budget decide alone",
            param_hint="-w/-c",
        )
    ranges: list[nagios.Range | None] = []
    for hint, spec in (("-w", warning), ("-c", critical)):
        try:
            ranges.append(None if spec is None else nagios.Range.parse(spec))
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint=hint) from None
    return check.StallThresholds(warning=ranges[0], critical=ranges[1])


def _internal_error(exc: BaseException, *, as_json: bool) -> typer.Exit:
    """Any failure inside `check` that is not a verdict: one line (or one JSON object), exit 3."""
    detail = safe_line(" ".join(f"{type(exc).__name__}: {exc}".split()))
    message = f"internal error in wedgewatch check ({detail})"
    if as_json:
        _echo_json({"status": "unknown", "engines": [], "error": message})
    else:
        typer.echo(f"UNKNOWN: {message}")
    return typer.Exit(check.EXIT_UNKNOWN)


# -- wedgewatch run / capture (the daemon; see wedgewatch/daemon/loop.py, docs/daemon.md)


@app.command("run")
@with_config_flags(*SETTINGS)
def _run(
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Watch vLLM servers: detect wedges, capture evidence, restart within a budget.

    Serves /health, /probe, /metrics and /status on --listen-host:--listen-port.
    Stops cleanly on SIGTERM or SIGINT; SIGHUP reloads the configuration when it
    validates (else the running one is kept, and the log says why). See docs/daemon.md.
    """
    from wedgewatch.config import child, plain  # noqa: PLC0415 - only `run` hands a config over

    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
    except config.ConfigError as exc:
        child.hand_over(("error", exc.messages))
        raise _fail(exc.messages, 2) from None
    settings = config.to_plain(loaded.config)
    if child.hand_over(("config", settings)):  # the daemon (`daemon.start`) asked: its own
        raise typer.Exit(0)
    if not settings.targets:
        raise _fail([plain.NO_TARGETS], 2)
    configure_logging(settings.log_level)
    from wedgewatch.daemon import start  # noqa: PLC0415 - only for `run`

    def reload_config() -> config.Config:
        """SIGHUP: the configuration read again from the same file, environment and flags."""
        reloaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
        return config.to_plain(reloaded.config)

    raise typer.Exit(start.serve_checked(settings, reload_config, _extras_hidden))


# -- wedgewatch doctor (see wedgewatch/io/doctor.py, docs/remedies.md) ---------------------


@app.command("doctor")
@with_config_flags(*SETTINGS)
def _doctor(
    target: Annotated[
        str | None,
        typer.Argument(
            help="Check only this target (its name or URL); a URL not in the configuration "
            "is checked as an extra target.",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Check every cure and capture the configuration relies on, before a wedge needs them.

    ptrace rights (kernel.yama.ptrace_scope), py-spy and one real attach (--nonblocking),
    the right to signal the server, the remedy's command or unit, whether the server answers
    vLLM's abort endpoint (looked up, never called), and whether its dev routes are exposed
    beyond loopback. Prints what will work and what will not, each with the fix. Exit 0 when
    everything the configuration relies on can work, 1 when something cannot, 2 for a bad
    configuration.
    """
    from wedgewatch.io import doctor  # noqa: PLC0415  (local: this block is added to a shared file)

    if target is not None and "://" in target:
        flags = {**flags, "targets": (*flags.get("targets", ()), target)}
    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    settings = loaded.config
    if not settings.targets:
        raise _fail(["no targets to check: give a TARGET URL, --target URL or --config"], 2)
    only = target
    if target is not None and "://" in target:
        only = config.Target.model_validate(target).name
    elif target is not None and target not in {t.name for t in settings.targets}:
        raise _fail([f"no target named {safe_line(target)!r} in the configuration"], 2)
    findings = doctor.examine(settings, only=only)
    if as_json:
        _echo_json({"findings": [f.to_json() for f in findings]})
    else:
        for line in doctor.render(findings):
            typer.echo(safe_line(line))
    raise typer.Exit(doctor.exit_code(findings))


@app.command("capture")
@with_config_flags(
    "evidence_dir",
    "capture_locals",
    "pyspy_path",
    "pyspy_timeout_seconds",
    "process_sample_seconds",
    "evidence_keep",
    "evidence_max_bytes",
    "scrape_timeout_seconds",
    "max_body_bytes",
    "log_level",
)
def _capture(
    target_url: Annotated[
        str | None,
        typer.Option(
            "--target",
            help="The server's base URL or /metrics URL: saves its /metrics and finds its "
            "processes from the listening port.",
            show_default=False,
        ),
    ] = None,
    pid: Annotated[
        int | None,
        typer.Option(
            "--pid", min=1, help="The API server's pid (overrides discovery).", show_default=False
        ),
    ] = None,
    pid_file: Annotated[
        Path | None,
        typer.Option(
            "--pid-file",
            dir_okay=False,
            help="A file holding the API server's pid.",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    *,
    flags: dict[str, Any],
) -> None:
    """Take an evidence bundle now: py-spy stacks, process tree, /metrics, triage.

    Without --target/--pid/--pid-file the single target of --config is used.
    Exit 0 when a bundle was written (even with failed steps, listed), 1 when none was or
    a file of it could not be written (a full disk, a read-only directory: listed).
    """
    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    settings = loaded.config
    name: str | None = None
    if target_url is None and pid is None and pid_file is None:
        if len(settings.targets) != 1:
            raise _fail(["say what to capture: --target URL, --pid PID or --pid-file FILE"], 2)
        only = settings.targets[0]
        target_url, pid, pid_file, name = only.url, only.pid, only.pid_file, only.name
    elif target_url is not None:
        try:
            config.metrics_url_of(target_url)
        except ValueError as exc:
            raise typer.BadParameter(
                f"{safe_line(target_url)!r} {exc}", param_hint="--target"
            ) from None
    configure_logging(settings.log_level)
    with _extras_hidden():
        from wedgewatch.daemon.adapters import capture_on_demand  # noqa: PLC0415 - heavy: only for `capture`

    with _extras_hidden():  # httpx, imported when the capture fetches, would import rich
        result = asyncio.run(
            capture_on_demand(settings, url=target_url, pid=pid, pid_file=pid_file, name=name)
        )
    if as_json:
        _echo_json(
            {
                "bundle": None if result.bundle is None else str(result.bundle),
                "triage": result.triage.to_json(),
                "failures": list(result.failures),
                "ptrace_denied": result.ptrace_denied,
                "duration_seconds": round(result.duration_seconds, 3),
            }
        )
    else:
        if result.bundle is not None:
            typer.echo(safe_line(f"bundle: {result.bundle}"))
        typer.echo(safe_line(f"triage: {result.triage.kind}: {result.triage.summary}"))
        for failure in result.failures:
            typer.echo(safe_line(f"failed: {failure}"), err=True)
    unwritten = [f for f in result.failures if f.startswith(_WRITE_FAILURE_PREFIX)]
    raise typer.Exit(0 if result.bundle is not None and not unwritten else 1)


#: How a capture words a file of its bundle that could not be written (io/bundles.py,
#: io/evidence.py): `writing summary.json: No space left on device`.
_WRITE_FAILURE_PREFIX = "writing "


# -- wedgewatch reset-restarts (see wedgewatch/io/statefile.py, docs/remedies.md) ------------


@app.command("reset-restarts")
@with_config_flags("state_dir")
def _reset_restarts(
    target: Annotated[
        str | None,
        typer.Argument(help="The target's name (default: every target).", show_default=False),
    ] = None,
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
    *,
    flags: dict[str, Any],
) -> None:
    """Reset the restart budget and backoff, and leave gave_up.

    Hands the reset to a wedgewatch running on the same state_dir, else edits its state file.
    """
    import time  # noqa: PLC0415  (local: this block is added to a shared file)

    from wedgewatch.io import statefile  # noqa: PLC0415  (ditto)

    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    result = statefile.reset_restarts(loaded.config.state_dir, target, time.time())
    if isinstance(result, statefile.ResetFailed):
        raise _fail([result.message], 1)
    typer.echo(result.message)


# -- wedgewatch launch (see wedgewatch/launch.py, docs/launcher.md) --------------------------

# The watchdog part of `launch --watch` takes every setting except those the launcher fixes
# itself: the target (the launched server), the remedy (supervise) and its other remedies.
_LAUNCH_SETTINGS = tuple(
    name
    for name in SETTINGS
    if name not in ("targets", "remedy", "systemd_unit", "exec_command", "profiles")
)


LAUNCHER_PANEL = "The launcher"
WATCHDOG_PANEL = "The watchdog (with --watch; like `wedgewatch run`)"


@app.command("launch")
@with_config_flags(*_LAUNCH_SETTINGS, panel=WATCHDOG_PANEL)
def _launch(
    *,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="The model to serve (Hugging Face id or local path).",
            show_default=False,
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = None,
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="Launch profile (see --list-profiles).",
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = "plain",
    vllm_bin: Annotated[
        str,
        typer.Option(
            "--vllm-bin",
            help="The vllm executable (name on PATH or a path).",
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = "vllm",
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the exact command line and environment; exit.",
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Run the server as a child and watch it in this process: on a wedge, capture "
            "evidence and restart it (remedy supervise, within the restart budget).",
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = False,
    dev_endpoints: Annotated[
        bool,
        typer.Option(
            "--dev-endpoints",
            help="Start vLLM with VLLM_SERVER_DEV_MODE=1: its abort endpoint, which the "
            "abort cure (--abort-first) needs, and its other dev routes, unauthenticated, on the "
            "API port (docs/launcher.md). Off unless given here or by the profile.",
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = False,
    list_profiles: Annotated[
        bool,
        typer.Option(
            "--list-profiles",
            help="List the launch profiles and exit.",
            rich_help_panel=LAUNCHER_PANEL,
        ),
    ] = False,
    extra_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="`vllm serve` flags after `--`; they win over the profile's.",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="TOML config file (default: $WEDGEWATCH_CONFIG); its profiles.NAME tables add "
            "launch profiles, the rest configures the watchdog. See docs/configuration.md.",
            dir_okay=False,
            show_default=False,
            rich_help_panel=WATCHDOG_PANEL,
        ),
    ] = None,
    flags: dict[str, Any],
) -> None:
    """Start `vllm serve MODEL` from a named profile, the same way every time.

    Example: wedgewatch launch --model Qwen/Qwen3-8B --watch -- --port 8000

    Without --watch the launcher execs the server: it gets the signals, its status is ours.

    The watchdog's settings (their own panel below) apply only with --watch.
    """
    from wedgewatch import launch  # noqa: PLC0415  (local: this block is added to a shared file)
    from wedgewatch.vllm.profiles import builtin_profiles, merge_profiles  # noqa: PLC0415

    if watch:  # the launcher's watchdog restarts its own child: remedy supervise (watch_config)
        flags = {**flags, "remedy": "supervise"}
    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags=flags)
        profiles = merge_profiles(builtin_profiles(), loaded.config.profiles)
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    if list_profiles:
        typer.echo(launch.render_profiles(profiles), nl=False)
        return
    if model is None:
        raise _fail(["--model is required (or --list-profiles)"], 2)
    configure_logging(loaded.config.log_level)
    options = launch.LaunchOptions(
        model=model,
        profile=profile,
        vllm_bin=vllm_bin,
        extra_args=tuple(extra_args or ()),
        dry_run=dry_run,
        watch=watch,
        dev_endpoints=dev_endpoints,
    )
    try:
        code = launch.launch(options, loaded.config, profiles)
    except launch.LaunchError as exc:
        raise _fail([str(exc)], 2) from None
    raise typer.Exit(code)


# -- wedgewatch demo (see wedgewatch/lab/demo.py, docs/demo.md) -----------------------------------


@app.command("demo")
def _demo(
    *,
    keep_running: Annotated[
        bool,
        typer.Option(
            "--keep-running",
            help="After the story, leave the server and the watchdog up to explore their "
            "endpoints; Ctrl-C stops them.",
        ),
    ] = False,
    directory: Annotated[
        Path,
        typer.Option(
            "--dir", help="Where the evidence bundles, the state and demo.log go.", file_okay=False
        ),
    ] = Path("wedgewatch-demo"),
    stall_after_seconds: Annotated[
        float,
        typer.Option(
            "--stall-after-seconds",
            min=1,
            help="The wedge threshold for the demo (the production default is 60).",
        ),
    ] = 10.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the agentic-burst traffic.")] = 16,
    timeout_seconds: Annotated[
        float | None,
        typer.Option(
            "--timeout-seconds",
            min=30,
            help="Give up when the story takes longer (default 300; 1800 with --real).",
        ),
    ] = None,
    abort_first: Annotated[
        bool,
        typer.Option(
            "--abort-first",
            help="The abort cure: the wedge cured without a restart (same pids, restarts 0), "
            "then a frozen loop that the abort cannot reach, restarted.",
        ),
    ] = False,
    real: Annotated[
        bool,
        typer.Option(
            "--real",
            help="Against a real vLLM 0.30.0 (its CPU build, built on first use: about 3.5 GB, "
            "about 3 minutes) driven into the seed's wedge through its API.",
        ),
    ] = False,
) -> None:
    """Watch a simulated vLLM wedge, get caught, leave evidence, restart and recover.

    No GPU needed: the simulator, as vLLM 0.30.0 with the tp2-offload flags and
    OffloadingConnector, runs through `wedgewatch launch --watch` in this process;
    agentic-burst traffic wedges it (the #57841 path, closed from vLLM 0.31.0) and a live
    view shows every engine. It ends with the report and the commands that reopen its
    bundles. With --real, a real CPU vLLM 0.30.0 and the seed's wedge reached through its API
    (docs/real-vllm.md). Exit 0 when the whole story happened, 1 when it did not. See
    docs/demo.md.
    """
    from wedgewatch.lab import demo  # noqa: PLC0415  (local: this block is added to a shared file)

    if real and keep_running:
        typer.echo("wedgewatch demo: --keep-running is not available with --real", err=True)
        raise typer.Exit(2)
    options = demo.DemoOptions(
        directory=directory,
        keep_running=keep_running,
        seed=seed,
        stall_after_seconds=stall_after_seconds,
        timeout_seconds=timeout_seconds or (1800.0 if real else 300.0),
        real=real,
    )
    if abort_first and not real:
        from wedgewatch.lab import demo_abort  # noqa: PLC0415  (local: added to a shared file)

        raise typer.Exit(demo_abort.run_demo(options, configure_logging=configure_logging))
    if abort_first:
        options = replace(options, abort_first=True)
    raise typer.Exit(demo.run_demo(options, configure_logging=configure_logging))


# -- commands mounted on demand: the simulator (wedgewatch/lab/sim/cli.py), `bundles` and
# `report` (wedgewatch/report/cli.py). `wedgewatch run` and `capture` never import them: the
# daemon's memory and start-up stay free of the lab and the report renderer
# (tests/meta/test_import_closures.py lists what each path imports).


def _mount_sim() -> None:
    from wedgewatch.lab.sim.cli import sim_app  # noqa: PLC0415 - on demand

    app.add_typer(sim_app, name="sim")


def _mount_bundles() -> None:
    from wedgewatch.report import cli as report_cli  # noqa: PLC0415 - on demand

    app.command("bundles")(report_cli.bundles)


def _mount_report() -> None:
    from wedgewatch.report import cli as report_cli  # noqa: PLC0415 - on demand

    app.command("report")(report_cli.report)


#: The commands mounted on demand, by name, in the order the help lists them.
ON_DEMAND: dict[str, Callable[[], None]] = {
    "bundles": _mount_bundles,
    "report": _mount_report,
    "sim": _mount_sim,
}
GROUPS_ON_DEMAND = frozenset({"sim"})
_mounted: set[str] = set()


def mount_commands(command: str | None = None) -> typer.Typer:
    """`app` with the on-demand command `command` mounted, or every one of them (None).

    The tests and the help listing call it with None; `main` with the command it runs.
    """
    for name in ON_DEMAND if command is None else [command]:
        if name in ON_DEMAND and name not in _mounted:
            _mounted.add(name)
            ON_DEMAND[name]()
    return app


#: Hides the optional imports of the daemon's libraries while `run` and `capture` import
#: the daemon (`entry.unused_extras_hidden`, given to `main`); nothing when called otherwise.
_extras_hidden: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext


def _command_of(argv: list[str]) -> str | None:
    """The command `argv` runs, or None when it names none (help, --version)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def _lay_out_piped_help(argv: list[str]) -> None:
    """Give help printed into a pipe `PIPED_HELP_WIDTH` columns.

    typer imports its rich layout only when it prints help or an error, so this imports it
    only when the command line asks for help (`--help`, or a command group on its own).
    """
    command = _command_of(argv)
    groups = {group.name for group in app.registered_groups} | GROUPS_ON_DEMAND
    wants_help = "--help" in argv or command is None or (argv == [command] and command in groups)
    if not wants_help or os.environ.get("COLUMNS") or sys.stdout.isatty():
        return
    import typer.rich_utils  # noqa: PLC0415 - rich: only for help

    if typer.rich_utils.MAX_WIDTH is None:
        typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH


def main(
    extras_hidden: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
) -> None:
    """Console-script entry point (through `entry.main`, which gives `extras_hidden`)."""
    global _extras_hidden  # noqa: PLW0603 - one process runs one command
    _extras_hidden = extras_hidden
    argv = sys.argv[1:]
    command = _command_of(argv)
    eager = {info.name for info in app.registered_commands} | {
        group.name for group in app.registered_groups
    }
    known = command in eager or command in ON_DEMAND
    # A command loads only itself; the top-level help, and a name that is no command (the
    # error may list them), mount every one.
    mount_commands(command if known else None)
    _lay_out_piped_help(argv)
    app()
