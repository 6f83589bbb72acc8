"""Process titles and log prefixes, the way vLLM names its processes.

vLLM titles its children `VLLM::<name>` with setproctitle (prefix from
`VLLM_PROCESS_NAME_PREFIX`) and prefixes their log lines with `(<name> pid=N)`. Tools
that find engine processes read these titles from `/proc/<pid>/cmdline`.
"""

from __future__ import annotations

import logging
import os
import sys

import setproctitle

_LOG_FORMAT = (
    "(%(process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(module)s.py] %(message)s"
)


def process_name_prefix() -> str:
    """`VLLM` unless `VLLM_PROCESS_NAME_PREFIX` says otherwise."""
    return os.environ.get("VLLM_PROCESS_NAME_PREFIX", "VLLM")


def set_process_title(name: str) -> str:
    """Retitle the current process `VLLM::<name>` and return the full title."""
    title = f"{process_name_prefix()}::{name}"
    setproctitle.setproctitle(title)
    return title


class _ProcessNameFilter(logging.Filter):
    def __init__(self, process_name: str) -> None:
        super().__init__()
        self._process_name = process_name

    def filter(self, record: logging.LogRecord) -> bool:
        record.process_name = self._process_name
        return True


def configure_process_logging(process_name: str, level: int = logging.INFO) -> None:
    """Send this process's log lines to stderr as `(<name> pid=N) LEVEL time [file] msg`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT, datefmt="%m-%d %H:%M:%S"))
    handler.addFilter(_ProcessNameFilter(process_name))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
