"""The `wedgewatch` command: one typer app; each command lives with the stage it drives.

Several people add commands here: add yours as a small, separate block that calls into
your own module, and edit with targeted replacements rather than rewriting the file.
"""

from __future__ import annotations

import typer

from wedgewatch import __version__
from wedgewatch.sim.cli import sim_app

app = typer.Typer(
    name="wedgewatch",
    help="Watchdog for vLLM servers that wedge while /health stays green.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(sim_app, name="sim")


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


def main() -> None:
    """Console-script entry point."""
    app()
