"""A drop-in `vllm` executable that runs the simulator.

`wedgewatch sim install-vllm-shim DIR` writes `DIR/vllm`; with DIR first on PATH, the
launcher and the systemd units run `vllm serve MODEL ...` unchanged and get the simulator.
No `vllm` console script is installed with the package, so a real vLLM is never shadowed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from wedgewatch import __version__
from wedgewatch.lab.sim.version import SIM_VLLM_VERSION

SHIM_MARKER = "# wedgewatch sim vllm shim"
USAGE = """\
usage: vllm serve [MODEL] [flags]     run the wedgewatch simulator in place of vLLM
       vllm --version
This `vllm` is the wedgewatch simulator's shim; see `vllm serve --help`.
"""


class ShimError(Exception):
    """The shim cannot be installed where asked."""


def shim_script(python: str) -> str:
    """The text of the `vllm` script for the interpreter at `python`."""
    return (
        f"#!{python}\n"
        f"{SHIM_MARKER} (wedgewatch {__version__})\n"
        "from wedgewatch.lab.sim.vllm_shim import main\n"
        "main()\n"
    )


def install_shim(directory: Path, *, force: bool = False, python: str | None = None) -> Path:
    """Write `directory/vllm` (executable); refuse to replace a foreign `vllm` unless forced."""
    if directory.exists() and not directory.is_dir():
        raise ShimError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "vllm"
    if target.exists() and not force:
        try:
            existing = target.read_text(errors="replace")
        except OSError as exc:
            raise ShimError(f"cannot read the existing {target}: {exc}") from exc
        if SHIM_MARKER not in existing:
            raise ShimError(
                f"{target} exists and is not a wedgewatch shim; use --force to replace it"
            )
    temporary = directory / ".vllm.tmp"
    temporary.write_text(shim_script(python or sys.executable))
    temporary.chmod(0o755)
    os.replace(temporary, target)
    return target


def main(argv: list[str] | None = None) -> None:
    """`vllm serve ...` / `vllm --version` for the simulator."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        raise SystemExit(0 if args else 2)
    if args[0] in ("--version", "-v"):
        sys.stdout.write(f"{SIM_VLLM_VERSION}\n")
        raise SystemExit(0)
    if args[0] != "serve":
        sys.stderr.write(
            f"error: `vllm {args[0]}` is not simulated; this vllm is the wedgewatch simulator "
            "and only runs `vllm serve` and `vllm --version`\n"
        )
        raise SystemExit(2)
    # Imported here: `vllm --version` (which the launcher asks) need not load the simulator.
    from wedgewatch.lab.sim.serve import run_serve  # noqa: PLC0415

    raise SystemExit(run_serve(args[1:]))
