"""`wedgewatch sim ...` commands."""

from __future__ import annotations

import typer

sim_app = typer.Typer(help="A vLLM stand-in for tests and demos without a GPU.", no_args_is_help=True)
