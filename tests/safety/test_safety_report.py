"""`report` and `bundles` read a bundle as untrusted input (issue #21).

A bundle may have been written by someone else (or edited): `wedgewatch report`, run as
root, must not follow a symlink out of it, block on a FIFO, reuse a planted temporary file,
let a planted secret through, or let a hostile string break its Markdown. Each test runs
the real command in a child process against a real bundle on disk.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from report_bundles import make_bundle

from wedgewatch.report.commands import write_report

S = "PLANTEDSECRET"
WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]


def _report(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`wedgewatch report ...`; a hang on a FIFO fails on the timeout."""
    return subprocess.run(
        [*WEDGEWATCH, "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")},
    )


def _outside(tmp_path: Path) -> Path:
    """A directory beside the bundle holding 'root-only' files with a planted secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow.txt").write_text(f"root:{S}:19000:0:99999:7:::\n")
    (outside / "api_server-1.txt").write_text(f"Process 1: {S}\n")
    (outside / "api_server-1.json").write_text(json.dumps([{"frames": [{"name": S}]}]))
    for path in outside.iterdir():
        path.chmod(0o600)
    return outside


def test_report_follows_no_symlink_out_of_the_bundle(tmp_path: Path) -> None:
    """`pyspy` and `build.json` pointing outside are not read: their contents never reach
    the world-readable-by-mistake report, and the report says why they are missing."""
    bundle = make_bundle(tmp_path / "evidence")
    outside = _outside(tmp_path)
    for entry in (bundle / "pyspy").iterdir():  # the same dumps, outside, with a secret
        (outside / entry.name).write_text(entry.read_text().replace('"name": "', f'"name": "{S}'))
        (outside / entry.name).chmod(0o600)
        entry.unlink()
    (bundle / "pyspy").rmdir()
    (bundle / "pyspy").symlink_to(outside, target_is_directory=True)
    (bundle / "build.json").unlink()
    (bundle / "build.json").symlink_to(outside / "shadow.txt")
    done = _report(bundle)
    assert done.returncode == 0, done.stderr
    assert "build.json: a symlink (not followed)" in done.stderr
    for path in (bundle / "report.html", bundle / "report.md"):
        assert S not in path.read_text(), path
        assert path.stat().st_mode & 0o777 == 0o600
    upstream = _report(bundle, "--upstream", "-o", tmp_path / "up.md")
    assert upstream.returncode == 0, upstream.stderr
    assert S not in (tmp_path / "up.md").read_text()


def test_report_and_bundles_never_block_on_a_fifo_or_read_a_device(tmp_path: Path) -> None:
    """FIFOs and devices in place of bundle files are refused without blocking."""
    evidence = tmp_path / "evidence"
    bundle = make_bundle(evidence)
    for name in ("build.json", "summary.json"):
        (bundle / name).unlink()
        os.mkfifo(bundle / name)
    (bundle / "history.jsonl").unlink()
    (bundle / "history.jsonl").symlink_to("/dev/zero")
    done = _report(bundle)
    assert done.returncode == 0, done.stderr
    assert "build.json: not a regular file (not read)" in done.stderr
    listing = subprocess.run(
        [*WEDGEWATCH, "bundles", "--evidence-dir", str(evidence)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listing.returncode == 0, listing.stderr
    assert bundle.name in listing.stdout


def test_report_never_reuses_a_planted_temporary_file(tmp_path: Path) -> None:
    """A pre-created world-writable `.report.md.tmp` and a `.report.html.tmp` symlink to a
    victim file are left alone: the report files are new, 0600, and the victim unchanged."""
    bundle = make_bundle(tmp_path / "evidence")
    planted = bundle / ".report.md.tmp"
    planted.write_text("planted")
    planted.chmod(0o666)
    victim = tmp_path / "victim"
    victim.write_text("victim")
    (bundle / ".report.html.tmp").symlink_to(victim)
    done = _report(bundle)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "victim"
    assert planted.read_text() == "planted"
    for path in (bundle / "report.html", bundle / "report.md"):
        assert path.stat().st_mode & 0o777 == 0o600
        assert path.stat().st_ino not in (planted.stat().st_ino, victim.stat().st_ino)
    assert (bundle / "report.md").read_text().startswith("# wedgewatch report")


def _hostile_bundle(tmp_path: Path) -> Path:
    """A bundle whose every target-supplied string is hostile, and written unredacted."""
    bundle = make_bundle(tmp_path / "evidence")
    hostile = "x```\n![pwn](http://evil.example/p.png)<img src=http://evil.example/i>`INSIDE"
    build = json.loads((bundle / "build.json").read_text())
    build["version"] = {"status": "ok", "version": hostile + "\x1b]0;title\x07"}
    build["model"] = hostile
    build["command_line"] = [
        "vllm", "serve", hostile, "--api-key", f"two {S} words",
        "--kv-transfer-config", json.dumps({"secret_access_key": S}),
    ]  # fmt: skip
    build["engine_env"] = {
        "VLLM_STORE_URL": f"http://user:{S}@10.0.0.1/",
        "VLLM_PLAIN": hostile,
        "HF_TOKEN": S,
    }
    (bundle / "build.json").write_text(json.dumps(build))
    summary = json.loads((bundle / "summary.json").read_text())
    summary["target"] = hostile
    summary["engine_labels"]["model_name"] = hostile
    summary["triage"]["details"] = [hostile, f"title vllm --api-key {S}"]
    summary["triage"]["summary"] = hostile
    (bundle / "summary.json").write_text(json.dumps(summary))
    for path in (bundle / "pyspy").glob("*.json"):
        path.write_text(path.read_text().replace('"name": "', '"name": "```` <b>', 1))
    (bundle / "pyspy" / "api_server-1.txt").write_text(
        f"Process 1: vllm serve --chat-template {{{{x}}}}\n{{{{y}}}} --api-key {S}\n"
    )
    return bundle


def _outside_fences(markdown: str) -> tuple[list[str], list[str], bool]:
    """(lines outside fenced blocks, lines inside, whether every fence was closed), read as
    CommonMark does: a fence closes only with a backtick run at least as long."""
    outside: list[str] = []
    inside: list[str] = []
    fence = ""
    for line in markdown.splitlines():
        run = re.match(r"^(`{3,})", line)
        if not fence and run:
            fence = run.group(1)
        elif fence and re.fullmatch(rf"{fence}`*\s*", line):
            fence = ""
        else:
            (inside if fence else outside).append(line)
    return outside, inside, fence == ""


def _code_free(line: str) -> str:
    """A line without its inline code spans (whose content never renders)."""
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", line)


def test_markdown_of_a_hostile_bundle_renders_no_image_no_html_and_no_broken_fence(
    tmp_path: Path,
) -> None:
    """report.md and the upstream body: every hostile string is escaped, in inline code or
    in a fence it cannot close; the planted secrets are masked; no escape sequence."""
    bundle = _hostile_bundle(tmp_path)
    written = write_report(bundle)
    upstream = write_report(bundle, tmp_path / "up.md", upstream=True)
    for path in (*written.paths, *upstream.paths):
        text = path.read_text()
        assert S not in text, path
        assert "\x1b" not in text, path
        if path.suffix != ".md":
            continue
        outside, inside, closed = _outside_fences(text)
        assert closed, path
        for line in outside:
            rendered = _code_free(line.replace("\\`", "").replace("\\<", "").replace("\\[", ""))
            assert "![" not in rendered, (path, line)
            assert "<img" not in rendered, (path, line)
            assert "`" not in rendered, (path, line)  # no unbalanced code span
        assert "INSIDE" in text, path
        if path in upstream.paths:  # the command line is in a fence it cannot close
            assert any("INSIDE" in line for line in inside), path
