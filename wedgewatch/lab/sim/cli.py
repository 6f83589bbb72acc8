"""`wedgewatch sim ...` commands: serve, load, install-vllm-shim."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from wedgewatch.lab.sim.vllm_shim import ShimError, install_shim

# The server and the load generator are imported by their commands only: every other
# `wedgewatch` command (a probe above all) would pay for their imports on each start.

sim_app = typer.Typer(
    help="A vLLM stand-in for tests and demos without a GPU.", no_args_is_help=True
)


@sim_app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve_command(ctx: typer.Context) -> None:
    """Serve like `vllm serve [MODEL] [flags]` from a simulated scheduler (--help for flags)."""
    from wedgewatch.lab.sim.serve import run_serve  # noqa: PLC0415 - see the imports above

    raise typer.Exit(run_serve(list(ctx.args)))


@sim_app.command("load")
def load_command(  # noqa: PLR0917 - typer maps every parameter to a flag
    url: Annotated[
        str,
        typer.Option("--url", help="Base URL of the server, e.g. http://127.0.0.1:8000."),
    ],
    profile: Annotated[
        str,
        typer.Option(
            "--profile",
            help="agentic, agentic-burst, steady, long-prefill, long-prompt or streaming-session.",
        ),
    ] = "agentic",
    seed: Annotated[int, typer.Option("--seed", help="Seed of the request sequence.")] = 0,
    duration: Annotated[
        float,
        typer.Option(
            "--duration", help="Seconds to send for; requests in flight are then awaited."
        ),
    ] = 60.0,
    concurrency: Annotated[
        int, typer.Option("--concurrency", help="Most requests in flight at once.")
    ] = 256,
    request_timeout_seconds: Annotated[
        float,
        typer.Option("--request-timeout-seconds", help="Give up on a request after this long."),
    ] = 30.0,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            help="Send a timed-out request again (as a new request), up to N times, while "
            "--duration lasts; the abandoned attempt is aborted by the server.",
        ),
    ] = 0,
    retry_backoff_seconds: Annotated[
        float,
        typer.Option("--retry-backoff-seconds", help="Pause before sending a request again."),
    ] = 1.0,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Model name to send (default: the first of /v1/models)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Send a traffic profile to a server; print sent/completed/failed and latencies."""
    from wedgewatch.lab.sim.load import (  # noqa: PLC0415 - see the imports at the top
        PROFILE_NAMES,
        LoadError,
        LoadSummary,
        plan_requests,
        print_summary,
        run_load,
        terminal_progress,
    )

    if profile not in PROFILE_NAMES:
        typer.echo(
            f"error: unknown profile {profile!r}; choose one of {', '.join(PROFILE_NAMES)}",
            err=True,
        )
        raise typer.Exit(2)
    for name, value in (
        ("--duration", duration),
        ("--concurrency", concurrency),
        ("--request-timeout-seconds", request_timeout_seconds),
    ):
        if value <= 0:
            typer.echo(f"error: {name} must be positive, got {value}", err=True)
            raise typer.Exit(2)
    for name, value in (("--retries", retries), ("--retry-backoff-seconds", retry_backoff_seconds)):
        if value < 0:
            typer.echo(f"error: {name} must be >= 0, got {value}", err=True)
            raise typer.Exit(2)
    planned = plan_requests(profile, seed, duration)
    progress = terminal_progress(sys.stdout) if sys.stdout.isatty() else None

    async def main() -> LoadSummary:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await run_load(
            url,
            planned,
            profile=profile,
            seed=seed,
            duration_seconds=duration,
            concurrency=concurrency,
            request_timeout_seconds=request_timeout_seconds,
            retries=retries,
            retry_backoff_seconds=retry_backoff_seconds,
            model=model,
            progress=progress,
            stop=stop,
        )

    try:
        summary = asyncio.run(main())
    except LoadError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if progress is not None:
        sys.stdout.write("\n")
    print_summary(summary, json_output)
    incomplete = summary.count("failed") + summary.count("timed_out")
    raise typer.Exit(1 if incomplete else 0)


@sim_app.command("install-vllm-shim")
def install_vllm_shim_command(
    directory: Annotated[
        Path, typer.Argument(help="Directory to write the `vllm` script into.", show_default=False)
    ],
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing `vllm` there.")
    ] = False,
) -> None:
    """Write DIR/vllm, a drop-in `vllm` that runs the simulator; put DIR first on PATH."""
    try:
        path = install_shim(directory, force=force)
    except ShimError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(str(path))
