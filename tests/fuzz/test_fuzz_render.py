"""Fuzz: the report renderers and the escape helpers turn any bundle text into inert output.

A bundle is untrusted input. Whatever its strings hold, a report's Markdown (report.md, the
upstream issue body) parses as CommonMark with no raw HTML and no remote image, the HTML page
has no tag a value brought, the planted secrets are masked, and rendering takes bounded CPU.
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

from commonmark_check import raw_html_and_remote_images
from fuzzing import FUZZ, hostile_text, within_cpu
from hypothesis import example, given
from hypothesis import strategies as st
from report_bundles import make_bundle

from wedgewatch.core.text.escape import md_fence, md_inline, md_text
from wedgewatch.io.bundles import bundle_bytes
from wedgewatch.report.model import build_model, load_files
from wedgewatch.report.render import render_html, render_markdown, render_upstream

PLANTED = "ZQPLANTEDZQ"  # a planted secret in secret-looking places; never in any output
TAG = "<wwpwn"  # a tag no renderer makes: in the output only if a value brought it raw


@functools.cache
def _base_files() -> dict[str, bytes | str]:
    """A real wedge bundle's files, as `load_files` reads them (made once, then removed)."""
    with tempfile.TemporaryDirectory() as directory:
        bundle = make_bundle(
            Path(directory) / "evidence", stacks="collective_hang", family="progress_stall"
        )
        return load_files(bundle)


def _hostile_files(values: list[str]) -> dict[str, bytes | str]:
    """The base bundle with hostile strings wherever a target's text goes, read as a bundle is
    read (`bundle_bytes`, the reader's redaction)."""
    files = dict(_base_files())
    pick = [f"{v} {TAG} x=1>" for v in values] or [TAG]

    def value(i: int) -> str:
        return pick[i % len(pick)]

    build = json.loads(files["build.json"])
    build["version"] = {"status": "ok", "version": value(0)}
    build["model"] = value(1)
    build["command_line"] = ["vllm", "serve", value(2), "--api-key", PLANTED, value(3)]
    build["engine_env"] = {"HF_TOKEN": PLANTED, "VLLM_PLAIN": value(4)}
    summary = json.loads(files["summary.json"])
    summary["target"] = value(5)
    summary["engine_labels"]["model_name"] = value(6)
    summary["triage"]["summary"] = value(7)
    summary["triage"]["details"] = [value(8), f"vllm --hf-token {PLANTED}"]
    for rel, data in (("build.json", build), ("summary.json", summary)):
        files[rel] = bundle_bytes(rel, json.dumps(data).encode())
    for rel in [r for r in files if r.startswith("pyspy/") and r.endswith(".json")]:
        text = files[rel]
        assert isinstance(text, bytes)
        renamed = text.decode().replace('"Worker.barrier"', json.dumps(f"Worker.nccl{value(9)}"))
        files[rel] = bundle_bytes(rel, renamed.encode())
    return files


@FUZZ
@given(st.lists(hostile_text.map(lambda t: t[:20_000]), min_size=1, max_size=10))
@example(["0" * 5000])  # a /version of 5,000 digits: `int` of it raised
def test_any_bundle_text_renders_inert_markdown_and_html(values: list[str]) -> None:
    """Hostile strings in every target-supplied field: no raw HTML or remote image in either
    Markdown, no value's tag in the HTML page, no planted secret anywhere."""
    model = within_cpu(lambda: build_model("b", "/evidence/b", _hostile_files(values)))
    for markdown in (
        within_cpu(lambda: render_markdown(model)),
        within_cpu(lambda: render_upstream(model)),
    ):
        assert raw_html_and_remote_images(markdown) == []
        assert PLANTED not in markdown
    page = within_cpu(lambda: render_html(model, None))
    assert TAG not in page
    assert PLANTED not in page


@FUZZ
@given(hostile_text)
def test_the_escape_helpers_make_any_text_inert_markdown(text: str) -> None:
    """`md_text`, `md_inline` and `md_fence` of any text, in a line of a document: CommonMark
    finds no raw HTML and no remote image, and a fence is never closed early."""
    document = "\n".join(
        [
            f"- Matched on: {within_cpu(lambda: md_text(text))}",
            f"- model: {within_cpu(lambda: md_inline(text))}",
            "",
            *within_cpu(lambda: md_fence(text)),
            "",
            "after the fence",
        ]
    )
    assert raw_html_and_remote_images(document) == []
    assert document.endswith("\nafter the fence")
    last = [line for line in document.splitlines() if line.startswith("```")][-1]
    assert document.count(last) >= 2  # the fence that opened is the one that closes
