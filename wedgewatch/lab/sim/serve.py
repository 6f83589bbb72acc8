"""`vllm serve ...` for the simulator: parse the command line and run it (the shim and the CLI)."""

from __future__ import annotations

import sys

from wedgewatch.lab.real.vllm_core import missing_vllm
from wedgewatch.lab.sim.api import serve
from wedgewatch.lab.sim.args import SERVE_HELP, ArgsError, HelpRequested, parse_serve_args


def run_serve(argv: list[str]) -> int:
    """Parse a `vllm serve` command line and run the simulator; the process exit code."""
    parsed = parse_serve_args(argv)
    if isinstance(parsed, HelpRequested):
        sys.stdout.write(SERVE_HELP)
        return 0
    if isinstance(parsed, ArgsError):
        sys.stderr.write(f"error: {parsed.message}\n(see --help)\n")
        return 2
    if parsed.scheduler == "vllm" and (missing := missing_vllm()) is not None:
        sys.stderr.write(f"error: {missing}\n")
        return 2
    return serve(parsed)
