"""`wedgewatch run` without the command line's libraries: the daemon's own entry point.

`entry.main` sends `wedgewatch run ...` here. The configuration is validated by the full
command line in a child process (`config.child`), which prints `--help`, usage errors and
bad settings itself and hands back a plain copy of the configuration (`config.plain`). This
process then imports the daemon and serves it, never typer or pydantic: the daemon runs for
weeks in every pod, and every module it holds is resident memory (docs/daemon.md,
"Validation in a child process"). SIGHUP validates in a new child.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from wedgewatch.config import child
from wedgewatch.config.plain import NO_TARGETS

if TYPE_CHECKING:
    from wedgewatch.config import Config


ExtrasHidden = Callable[[], contextlib.AbstractContextManager[None]]


def serve_checked(
    config: Config,
    load_config: Callable[[], Config],
    extras_hidden: ExtrasHidden = contextlib.nullcontext,
) -> int:
    """Serve a validated configuration (with targets) until stopped, the start-up check of
    the cures beside it; the exit code. `load_config` validates again on SIGHUP.

    The daemon runs within `extras_hidden` (`entry.unused_extras_hidden`) from its imports
    to its stop: httpx, imported only when a canary, an abort or a webhook is first sent,
    would otherwise import rich and pygments for its own command line.
    """
    with extras_hidden():
        from wedgewatch.daemon.loop import serve  # noqa: PLC0415 - the daemon, once validated
        from wedgewatch.io import doctor  # noqa: PLC0415 - ditto

        doctor.check_in_background(config)
        return serve(config, load_config=load_config)


def run(
    argv: Sequence[str],
    *,
    configure_logging: Callable[[str], None],
    extras_hidden: ExtrasHidden = contextlib.nullcontext,
) -> int:
    """`wedgewatch ARGV` (ARGV starting with `run`): validate in a child, then serve.

    `configure_logging` is `logsetup.configure_logging` (given: the daemon layer does not
    reach up to the top level)."""
    validated = child.validate(argv)
    if isinstance(validated, int):
        return validated
    if not validated.targets:
        print(f"wedgewatch: {NO_TARGETS}", file=sys.stderr)
        return 2
    configure_logging(validated.log_level)
    return serve_checked(validated, lambda: child.revalidate(argv), extras_hidden)
