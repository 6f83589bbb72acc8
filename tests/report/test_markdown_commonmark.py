"""Every Markdown the report writes, read by a CommonMark parser: no raw HTML, no remote image.

A bundle is untrusted input. The renderers redact each value and then escape it; the written
file is what a CommonMark reader (GitHub, an editor's preview) renders, so the test reads it
with one (markdown-it-py) instead of looking for strings.
"""

from __future__ import annotations

import json
from pathlib import Path

from commonmark_check import raw_html_and_remote_images
from report_bundles import make_bundle

from wedgewatch.report.commands import write_report

PLANTED = "PLANTEDSECRET"
# Masking `token=...` in the rendered text once swallowed the backslash of `\<` and `\>`.
SCRIPT = "token=a<script x=y token=b>alert(1)</script>"
HOSTILE = (
    f"{SCRIPT} <img src=http://evil.example/i.png> ![pwn](http://evil.example/p.png) "
    f"[x](javascript:alert(1)) <!-- c --> `tick ``` --api-key {PLANTED}"
)


def _hostile_bundle(root: Path) -> Path:
    """A bundle whose frame name reaches "Matched on" and whose every other target string
    (model, version, target, triage, command line, environment) is hostile too."""
    frame = f"Worker.nccl {SCRIPT} --api-key {PLANTED}"  # no dot after nccl: `worker:nccl*`
    bundle = make_bundle(
        root,
        stacks="collective_hang",
        family="progress_stall",
        rename_frames={"Worker.barrier": frame},
    )
    build = json.loads((bundle / "build.json").read_text())
    build["version"] = {"status": "ok", "version": HOSTILE}
    build["model"] = HOSTILE
    build["command_line"] = ["vllm", "serve", HOSTILE, "--api-key", f"two {PLANTED} words"]
    build["engine_env"] = {"VLLM_PLAIN": HOSTILE, "HF_TOKEN": PLANTED}
    (bundle / "build.json").write_text(json.dumps(build))
    summary = json.loads((bundle / "summary.json").read_text())
    summary["target"] = HOSTILE
    summary["engine_labels"]["model_name"] = HOSTILE
    summary["triage"]["details"] = [HOSTILE]
    (bundle / "summary.json").write_text(json.dumps(summary))
    return bundle


def test_a_hostile_matched_on_value_renders_no_raw_html_and_no_secret(tmp_path: Path) -> None:
    """report.md's "Matched on" line with `<script>` and a secret in a frame name: CommonMark
    finds no raw HTML and no remote image in it, and the secret is masked."""
    bundle = _hostile_bundle(tmp_path / "evidence")
    write_report(bundle)
    markdown = (bundle / "report.md").read_text()
    matched = [line for line in markdown.splitlines() if line.startswith("- Matched on:")]
    assert any("script" in line for line in matched), matched  # the frame reached the line
    assert raw_html_and_remote_images(markdown) == []
    assert PLANTED not in markdown


def test_every_markdown_output_of_a_hostile_bundle_renders_no_raw_html(tmp_path: Path) -> None:
    """report.md and the upstream issue body of a hostile bundle, parsed as CommonMark: no
    raw HTML but the body's own folds, no remote image, no planted secret."""
    bundle = _hostile_bundle(tmp_path / "evidence")
    written = write_report(bundle)
    upstream = write_report(bundle, tmp_path / "upstream.md", upstream=True)
    markdowns = [p for p in (*written.paths, *upstream.paths) if p.suffix == ".md"]
    assert len(markdowns) == 2
    for path in markdowns:
        text = path.read_text()
        assert "script" in text, path  # the hostile strings are shown, as text
        assert raw_html_and_remote_images(text) == [], path
        assert PLANTED not in text, path


def test_the_parser_check_finds_raw_html_and_a_remote_image() -> None:
    """The check itself: a raw tag, an HTML comment and a remote image are all reported."""
    found = raw_html_and_remote_images("a <b>x</b>\n\n<!-- c -->\n\n![p](http://e.example/p)\n")
    assert [f.split(":")[0] for f in found] == ["html_inline", "html_inline", "html_block", "image"]
