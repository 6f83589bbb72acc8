"""Values a target supplies are data: bounded and free of control characters. Pure.

A watched server names its own models and engines (`model_name`, `engine` labels), and
those names flow into log lines, `/status`, webhooks, evidence and the environment of an
`exec` remedy. A hostile or broken server can make them huge (2 MB) or put bytes in them
that break a consumer: a NUL byte cannot be in an environment variable at all (building
one raises), escape sequences drive a terminal.

- `truncate(text, max_chars)` (from `vllm.signals`, which bounds every label it reads
  with it) keeps the first characters and says how many were cut, with a short digest of
  the whole value so that two long values sharing a prefix stay distinct:
  `aaaa…[+2097000 chars, #1f3a9c2e]`.
- `neutralise(text, max_chars)` also writes every control character (C0, DEL, C1,
  including NUL, ESC, CR and LF) as a visible `\\xNN` escape, then truncates: the result
  can go into an environment variable, a log line or a terminal as it is.

Escaping for a format (Markdown, Slack, HTML) is the writer's job on top of this.
"""

from __future__ import annotations

import re
from typing import Final

from wedgewatch.vllm.signals import TRUNCATION_MARKER, truncate

__all__ = ["ENV_VALUE_MAX_CHARS", "TRUNCATION_MARKER", "neutralise", "truncate"]

#: Bound of one `WEDGEWATCH_*` value given to an `exec` remedy (Linux allows 128 KiB).
ENV_VALUE_MAX_CHARS: Final = 4096

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def neutralise(text: str, max_chars: int = ENV_VALUE_MAX_CHARS) -> str:
    """`text` with control characters as `\\xNN` escapes, then truncated to `max_chars`."""
    return truncate(_CONTROL.sub(_escape, text), max_chars)


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group(0)):02x}"
