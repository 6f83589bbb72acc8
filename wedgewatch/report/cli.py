"""The `wedgewatch bundles` and `wedgewatch report` commands (registered in wedgewatch.cli)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from wedgewatch import config

_CONFIG_FILE_OPTION = typer.Option(
    "--config",
    help="TOML config file (default: $WEDGEWATCH_CONFIG). See docs/configuration.md.",
    dir_okay=False,
    show_default=False,
)
_EVIDENCE_DIR_OPTION = typer.Option(
    "--evidence-dir",
    file_okay=False,
    help="Where the bundles are (default: evidence_dir of the configuration).",
    show_default=False,
)


def _fail(messages: tuple[str, ...] | list[str], code: int) -> typer.Exit:
    for message in messages:
        typer.echo(f"wedgewatch: {message}", err=True)
    return typer.Exit(code)


def _evidence_dir(evidence_dir: Path | None, config_file: Path | None) -> Path:
    if evidence_dir is not None:
        return evidence_dir
    try:
        loaded = config.load_config(config_file=config_file, environ=os.environ, flags={})
    except config.ConfigError as exc:
        raise _fail(exc.messages, 2) from None
    return Path(loaded.config.evidence_dir)


def bundles(
    evidence_dir: Annotated[Path | None, _EVIDENCE_DIR_OPTION] = None,
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
) -> None:
    """List the evidence bundles, newest first: when, target, engine, family, phase, triage,
    known-issue match, remedy outcome, size."""
    from wedgewatch.report import commands  # noqa: PLC0415 (keeps other commands' start lean)

    directory = _evidence_dir(evidence_dir, config_file)
    rows = commands.bundle_rows(directory)
    if not rows:
        typer.echo(f"no evidence bundles in {directory}")
        return
    typer.echo(commands.format_bundles(rows))


def report(
    bundle: Annotated[
        Path | None,
        typer.Argument(help="A bundle directory (default: the newest bundle).", show_default=False),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="A directory, or a .html/.md file (default: into the bundle)."
        ),
    ] = None,
    upstream: Annotated[
        bool,
        typer.Option("--upstream", help="Write a Markdown body for a GitHub issue on vLLM."),
    ] = False,
    evidence_dir: Annotated[Path | None, _EVIDENCE_DIR_OPTION] = None,
    config_file: Annotated[Path | None, _CONFIG_FILE_OPTION] = None,
) -> None:
    """Write a self-contained HTML report and a Markdown file of a bundle; print their paths.

    Exit 0 when written (a bundle with missing parts still renders; they are listed), 2 when
    there is no such bundle.
    """
    from wedgewatch.report import commands  # noqa: PLC0415 (keeps other commands' start lean)

    chosen = commands.resolve_bundle(
        bundle, _evidence_dir(evidence_dir, config_file) if bundle is None else Path(".")
    )
    if isinstance(chosen, str):
        raise _fail([chosen], 2)
    try:
        written = commands.write_report(chosen, output, upstream=upstream)
    except OSError as exc:
        raise _fail([f"cannot write the report: {exc.strerror or exc}"], 1) from None
    for note in written.notes:
        typer.echo(f"note: {note}", err=True)
    for path in written.paths:
        typer.echo(str(path))
