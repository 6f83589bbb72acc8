"""What a CommonMark reader would render as raw HTML or a remote image, for the Markdown tests.

A report's Markdown is read by GitHub, editors' previews and chat tools: the tests parse it
with a CommonMark parser (markdown-it-py) instead of looking for strings, and list every
raw HTML token (but the upstream issue body's own folds) and every image with a remote source.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from markdown_it import MarkdownIt
from markdown_it.token import Token

# The upstream body's own folding blocks: fixed tags around an escaped title.
_OWN_HTML = re.compile(r"<details><summary>py-spy stack: [^<>]*</summary>\n|</details>\n")
_PARSER = MarkdownIt("commonmark")


def _tokens(tokens: list[Token]) -> Iterator[Token]:
    for token in tokens:
        yield token
        yield from _tokens(token.children or [])


def raw_html_and_remote_images(markdown: str) -> list[str]:
    """Every raw HTML token (but the body's own folds) and remote image in `markdown`."""
    found: list[str] = []
    for token in _tokens(_PARSER.parse(markdown)):
        if token.type in ("html_block", "html_inline") and not _OWN_HTML.fullmatch(token.content):
            found.append(f"{token.type}: {token.content!r}")
        if token.type == "image":
            src = str(token.attrGet("src") or "")
            if ":" in src or src.startswith("//"):
                found.append(f"image: {src!r}")
    return found
