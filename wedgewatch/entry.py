"""The `wedgewatch` command's entry point, with a fast path for exec probes.

A Kubernetes exec probe runs `wedgewatch check URL --for=0 --state-file=PATH ...` every few
seconds. The full command line interface (typer, rich, pydantic for the configuration)
costs more to import than the probe itself takes, so this module answers the common probe
invocation without it:

* the arguments are parsed strictly here; anything this parser does not know exactly
  (`--help`, an unknown or repeated option, a bad value, no `--state-file`) goes to the
  full CLI, which gives the usual messages and exit codes;
* the settings come from the probe's state file, where the previous run cached them under
  a digest of everything they are made from (the URL, the config file's bytes, every
  `WEDGEWATCH_*` variable and the flags, see `check.settings.settings_key`). A changed input is a
  different digest: that run takes the full CLI, validates the configuration and caches
  the new settings. Nothing is validated twice and nothing stale is used.

Both paths run the same `check.execute`, which scrapes with the standard library and no
event loop; tests/cli/test_entry.py checks that they agree and that the fast path imports
nothing heavy (asyncio, httpx, pydantic, typer, structlog, prometheus_client, ...).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wedgewatch.core.values import immutable
from wedgewatch.io import stdout

#: Flags of `check` that are settings, and how the full CLI converts their values.
_SETTING_FLAGS: dict[str, tuple[str, type[float] | type[int] | type[str]]] = {
    "--interval-seconds": ("interval_seconds", float),
    "--stall-after-seconds": ("stall_after_seconds", float),
    "--hang-after-seconds": ("hang_after_seconds", float),
    "--output-stall-after-seconds": ("output_stall_after_seconds", float),
    "--deferred-only-after-seconds": ("deferred_only_after_seconds", float),
    "--unreachable-after-seconds": ("unreachable_after_seconds", float),
    "--startup-timeout-seconds": ("startup_timeout_seconds", float),
    "--scrape-timeout-seconds": ("scrape_timeout_seconds", float),
    "--max-body-bytes": ("max_body_bytes", str),
    "--max-engines": ("max_engines", int),
    "--log-level": ("log_level", str),
}
_VALUE_OPTIONS = frozenset({"--for", "--state-file", "--config", *_SETTING_FLAGS})
_SWITCHES = frozenset({"--json", "--critical-only"})


@immutable
class ProbeArgs:
    """A `check` invocation the fast path can answer."""

    url: str
    window_seconds: float
    state_file: Path
    config_file: Path | None
    as_json: bool
    critical_only: bool
    flags: dict[str, Any]


def parse_probe_args(args: list[str]) -> ProbeArgs | None:
    """The arguments after `check`, or None when the full CLI must handle them."""
    values: dict[str, str] = {}
    switches: set[str] = set()
    positional: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg.startswith("--"):
            name, eq, inline = arg.partition("=")
            if name in _SWITCHES and not eq:
                if name in switches:
                    return None
                switches.add(name)
            elif name in _VALUE_OPTIONS:
                if name in values:
                    return None
                if eq:
                    values[name] = inline
                elif rest:
                    values[name] = rest.pop(0)
                else:
                    return None
            else:
                return None  # --help, --, an unknown option: the full CLI explains
        elif arg.startswith("-") and arg != "-":
            return None
        else:
            positional.append(arg)
    if len(positional) != 1 or "--state-file" not in values or not values["--state-file"]:
        return None
    try:
        window = float(values.get("--for", "10"))
        flags: dict[str, Any] = {}
        for flag, (name, convert) in _SETTING_FLAGS.items():
            if flag in values:
                flags[name] = convert(values[flag])
    except ValueError:
        return None
    if not (math.isfinite(window) and window >= 0):
        return None
    config = values.get("--config")
    if config == "":
        return None
    return ProbeArgs(
        url=positional[0],
        window_seconds=window,
        state_file=Path(values["--state-file"]),
        config_file=None if config is None else Path(config),
        as_json="--json" in switches,
        critical_only="--critical-only" in switches,
        flags=flags,
    )


def fast_check(args: list[str]) -> int | None:
    """Run a probe-mode check without the full CLI; None when it must take the full CLI."""
    parsed = parse_probe_args(args)
    if parsed is None:
        return None
    # The imports are most of a probe's CPU; they make thousands of objects and no garbage
    # worth a collection, so the cyclic collector waits until they are done.
    gc.disable()
    try:
        from wedgewatch import check  # noqa: PLC0415 - the fast path's imports
        from wedgewatch.check import settings as check_settings  # noqa: PLC0415 - ditto
    finally:
        gc.enable()

    key = check_settings.settings_key(parsed.url, parsed.config_file, os.environ, parsed.flags)
    if key is None:
        return None
    cached = check_settings.cached_settings(parsed.state_file, key)
    if cached is None:
        return None
    metrics_url, settings = cached
    check.set_log_level(settings.log_level)
    options = check.options_for(
        metrics_url,
        settings,
        window_seconds=parsed.window_seconds,
        state_file=parsed.state_file,
        settings_cache={"key": key, "metrics_url": metrics_url, "values": settings.to_json()},
    )
    return check.execute(options, as_json=parsed.as_json, critical_only=parsed.critical_only)


#: Optional imports of libraries the CLI and the daemon use that wedgewatch never needs:
#: structlog imports rich and pygments (typer brings them) to draw tracebacks, which
#: `logsetup` never lets it draw (an exception is text before any renderer sees it); httpx
#: imports them for its own command line. Together about 90 modules and 4 MiB of the
#: daemon's memory (docs/benchmarks.md, "The daemon's memory").
UNUSED_EXTRAS = ("rich", "pygments")


@contextlib.contextmanager
def unused_extras_hidden() -> Iterator[None]:
    """Within the block, `import rich` and `import pygments` fail (when neither is imported
    yet), so a library that imports them only when it can goes without.

    They stay importable afterwards: typer imports rich to lay out help and usage errors.
    """
    hidden = [name for name in UNUSED_EXTRAS if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # None: the import fails
    try:
        yield
    finally:
        for name in hidden:
            del sys.modules[name]


def _dispatch() -> int | str | None:
    """The probe fast path, the daemon (`wedgewatch run`, its configuration validated by the
    full CLI in a child: `daemon.start`), else the full CLI; the exit status."""
    if sys.argv[1:2] == ["check"]:
        code = fast_check(sys.argv[2:])
        if code is not None:
            return code
    if sys.argv[1:2] == ["run"]:
        from wedgewatch.config import child  # noqa: PLC0415 - the daemon, without the CLI

        if not child.is_child():
            with unused_extras_hidden():  # structlog would import rich
                from wedgewatch.daemon import start  # noqa: PLC0415 - ditto
                from wedgewatch.logsetup import configure_logging  # noqa: PLC0415 - ditto

            return start.run(
                sys.argv[1:],
                configure_logging=configure_logging,
                extras_hidden=unused_extras_hidden,
            )
    with unused_extras_hidden():
        from wedgewatch.cli import main as cli_main  # noqa: PLC0415 - the full CLI, on demand

    try:
        cli_main(extras_hidden=unused_extras_hidden)
    except SystemExit as exc:
        return exc.code
    return 0


def main() -> None:
    """Console-script entry point: the command's exit status, or its failure status with one
    line on stderr when standard output cannot take its output (`io.stdout`)."""
    command = sys.argv[1] if len(sys.argv) > 1 else None
    stdout.watch()
    try:
        code = _dispatch()
    except OSError as exc:
        failure = stdout.output_failure(exc)
        if failure is None:
            raise
        sys.exit(stdout.failed(failure, command))
    if isinstance(code, int) or code is None:
        code = stdout.finish(code or 0, command)
    sys.exit(code)
