"""Validating `wedgewatch run`'s configuration in a child process, for a daemon without pydantic.

The daemon (`daemon.start`) runs the command line it was given once more as a child: the
full CLI (typer, pydantic) parses the flags, reads the file and the environment and
validates them exactly as ever (the same `--help`, messages and exit codes, which the
child prints itself at start-up), then hands the plain copy of the configuration
(`model.to_plain`), or the problems, back to its parent and exits. The hand-over goes
through a memfd that only the parent and this child hold (its number in `CHILD_FD_ENV`), as
a pickle of plain classes: no setting is ever put in an argument or a variable. SIGHUP
validates in a new child the same way, its output kept out of the daemon's log.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from wedgewatch.config.plain import ConfigError

if TYPE_CHECKING:
    from wedgewatch.config.model import Config

#: The variable that tells the command line it runs as the child, and where to write.
CHILD_FD_ENV = "_WEDGEWATCH_CONFIG_FD"
#: The child's program: the parent's `sys.argv[0]` comes first, so usage lines read the same.
_CHILD_CODE = "import sys; sys.argv[0] = sys.argv.pop(1); from wedgewatch.entry import main; main()"

#: What frames a usage error that typer lays out with rich: not words.
_FRAME = " \t│╭╮╰╯─"

Payload = tuple[Literal["config"], "Config"] | tuple[Literal["error"], tuple[str, ...]]


def _child_command(argv: Sequence[str]) -> list[str]:
    """This interpreter running the CLI on `argv`, named as this process was started."""
    if getattr(sys.modules.get("__main__"), "__package__", None) == "wedgewatch":
        return [sys.executable, "-m", "wedgewatch", *argv]  # the usage line says so too
    return [sys.executable, "-c", _CHILD_CODE, sys.argv[0], *argv]


def _in_child(argv: Sequence[str], *, quiet: bool) -> tuple[int, Payload | None, str]:
    """Run the child on `argv`: its exit code, what it handed over, and (when `quiet`) the
    last line of words it wrote to stderr. Otherwise the child writes to our stdout and stderr."""
    fd = os.memfd_create("wedgewatch-config")
    try:
        done = subprocess.run(
            _child_command(argv),
            env={**os.environ, CHILD_FD_ENV: str(fd)},
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL if quiet else None,
            stdout=subprocess.DEVNULL if quiet else None,
            stderr=subprocess.PIPE if quiet else None,
            check=False,
        )
        with os.fdopen(os.dup(fd), "rb") as handed:
            handed.seek(0)
            data = handed.read()
    finally:
        os.close(fd)
    code = done.returncode if done.returncode >= 0 else 128 - done.returncode
    said = (
        line.strip(_FRAME) for line in (done.stderr or b"").decode("utf-8", "replace").split("\n")
    )
    last = [line for line in said if line][-1:]
    return code, pickle.loads(data) if data else None, "".join(last)  # noqa: S301 - our child's


def validate(argv: Sequence[str]) -> Config | int:
    """`wedgewatch ARGV` validated in a child: the plain configuration, or the exit code the
    child left with (it printed the help, the usage error or the problems itself)."""
    code, payload, _ = _in_child(argv, quiet=False)
    if payload is not None and payload[0] == "config":
        return payload[1]
    return code


def revalidate(argv: Sequence[str]) -> Config:
    """`wedgewatch ARGV` validated again in a quiet child (SIGHUP): the plain configuration;
    ConfigError with the problems when it does not validate."""
    code, payload, last = _in_child(argv, quiet=True)
    if payload is None:
        raise ConfigError([f"the configuration could not be validated (exit {code}): {last}"])
    if payload[0] == "error":
        raise ConfigError(payload[1])
    return payload[1]


def is_child() -> bool:
    """This process is the child of `validate` or `revalidate`: it runs the full CLI."""
    return CHILD_FD_ENV in os.environ


def hand_over(payload: Payload) -> bool:
    """In the child: give `payload` to the parent; False when this is no child of `run`."""
    fd = os.environ.pop(CHILD_FD_ENV, None)
    if fd is None or not fd.isdigit():
        return False
    with os.fdopen(int(fd), "wb") as handed:
        pickle.dump(payload, handed, protocol=pickle.HIGHEST_PROTOCOL)
    return True
