"""`wedgewatch check`: scrape one server for a window, judge it with the detector, report.

One job per module:

* `check.run`: the scrape loop and the run's orchestration (one-shot, or probe mode with
  the state file and the daemon's own probe step, `core.probe_step`);
* `check.state`: the probe's state file (lock, load, save; the restart state through the
  one codec, `core.restart_codec`);
* `check.render`: the report and its output (Nagios line with perfdata, `--json`, exit code);
* `check.settings`: the settings `check` uses and their cache in the state file;
* `check.log`: log lines that import the logging stack only when something is logged.

This module exports what the command line (`cli`, `entry`) and the tests use.
"""

from __future__ import annotations

from wedgewatch.check.log import set_log_level
from wedgewatch.check.render import (
    EXIT_CODES,
    EXIT_CRITICAL,
    EXIT_OK,
    EXIT_UNKNOWN,
    EXIT_WARNING,
    CheckReport,
    StallThresholds,
    Status,
)
from wedgewatch.check.run import (
    CheckOptions,
    execute,
    one_shot_policy,
    options_for,
    run_blocking,
    run_check,
)
from wedgewatch.check.state import LOCK_RETRY_SECONDS, STATE_FILE_VERSION

__all__ = [
    "EXIT_CODES",
    "EXIT_CRITICAL",
    "EXIT_OK",
    "EXIT_UNKNOWN",
    "EXIT_WARNING",
    "LOCK_RETRY_SECONDS",
    "STATE_FILE_VERSION",
    "CheckOptions",
    "CheckReport",
    "StallThresholds",
    "Status",
    "execute",
    "one_shot_policy",
    "options_for",
    "run_blocking",
    "run_check",
    "set_log_level",
]
