"""Values from the target are data in text: how a string is made safe for where it goes. Pure.

A model name, `/version`, an argument or a frame name comes from the watched server (or a
bundle), so it may hold NUL bytes, control characters, terminal escape sequences, Unicode
direction overrides, Markdown or Slack markup, or megabytes. Before such a string reaches a
terminal, a log line, Markdown or Slack text it passes one of these:

* `neutralise`: control characters (C0 but tab and, if kept, newline; DEL; C1) and
  direction overrides become visible escapes (`\\x1b`, `\\u202e`); longer than `limit`
  characters it is cut with `vllm.signals.truncate`'s marker (`…[+N chars, #digest]`). A
  terminal escape sequence cannot start without its ESC, so none survives.
* `md_inline`: an inline code span with a backtick run longer than any in the value (and
  newlines as spaces), so nothing in it renders: no link, no image, no HTML.
* `md_fence`: a fenced block whose fence is longer than any backtick run in the body, so
  the body cannot close it.
* `md_text`: plain Markdown text with every character that could start markup escaped
  (`\\[`, `\\<`, `\\*`, `` \\` ``, `\\|`), so no link, image, HTML or emphasis comes of it.
* `slack_text`: Slack's `mrkdwn` rules: `&`, `<` and `>` as `&amp;`, `&lt;` and `&gt;`.

The helpers escape; they do not redact. A value is redacted before it reaches them (a
report's bundle as it is read: `io.bundles.bundle_bytes`), never in the rendered text, where
masking could swallow an escape's backslash (`\\<`) and let markup out.
"""

from __future__ import annotations

import re

from wedgewatch.core.text.patterns import on_first_use
from wedgewatch.core.text.redact import redact_text
from wedgewatch.vllm.signals import TRUNCATION_MARKER, truncate

__all__ = [
    "TRUNCATION_MARKER",
    "md_fence",
    "md_inline",
    "md_text",
    "neutralise",
    "safe_line",
    "slack_text",
    "truncate",
]
# C0 controls but tab and newline, DEL, C1 controls, Unicode direction overrides and isolates,
# line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_CONTROL_NO_NEWLINE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_BACKTICKS = on_first_use(globals(), "_BACKTICKS", "`+")
# Enough that no link, image, autolink, HTML, code span, emphasis or table cell comes of a
# value: `_` (intraword in names) and `(` (harmless without `[`) stay readable.
_MD_SPECIAL = on_first_use(globals(), "_MD_SPECIAL", r"([\\`*\[\]<>|])")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def neutralise(text: str, limit: int = 4096, *, newlines: bool = True) -> str:
    """`text` with control characters as visible escapes, then cut at `limit` (see the module).

    Escaped first, then cut: the result is at most `limit` characters and the marker, whatever
    the text held (a NUL is 4 characters once visible)."""
    pattern = _CONTROL if newlines else _CONTROL_NO_NEWLINE
    if pattern.search(text):
        text = pattern.sub(_visible, text)
    return truncate(text, limit)


def safe_line(text: str, limit: int = 4096) -> str:
    """One line for a terminal or a log: secrets redacted, then `neutralise`d on one line."""
    return neutralise(redact_text(text), limit, newlines=False)


def _longest_backticks(text: str) -> int:
    return max((len(m) for m in _BACKTICKS.findall(text)), default=0)


def md_inline(text: object, limit: int = 400) -> str:
    """An inline Markdown code span holding `text` verbatim (on one line, neutralised)."""
    value = neutralise(str(text), limit, newlines=False)
    ticks = "`" * (_longest_backticks(value) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or not value.strip() else ""
    return f"{ticks}{pad}{value}{pad}{ticks}"


def md_fence(body: str, info: str = "", limit: int = 200_000) -> list[str]:
    """The lines of a fenced Markdown block holding `body`: the fence is longer than any
    backtick run in it (at least three), so the body never closes it."""
    value = neutralise(body, limit)
    fence = "`" * max(3, _longest_backticks(value) + 1)
    return [fence + info, value, fence]


def md_text(text: object, limit: int = 2000) -> str:
    """Plain Markdown text: every markup character escaped, on one line, neutralised."""
    return _MD_SPECIAL.sub(r"\\\1", neutralise(str(text), limit, newlines=False))


def slack_text(text: str) -> str:
    """Text for a Slack message: `&`, `<`, `>` escaped, so no link, mention or markup comes
    of a value (`<!channel>`, `<http://x|y>`)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
