"""vLLM's own watchdog as evidence: its dump files (written by a stand-in process in the
format and under the names of vLLM 0.34.0's `vllm/utils/watch_dog.py`) and its timeout
counter, read into a bundle, matched and shown in the report beside py-spy's stacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bundle_files import modes

from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.evidence.watchdog import (
    MAX_DUMP_BYTES,
    MAX_DUMP_FILES,
    parse_dump_name,
    parse_dump_text,
)
from wedgewatch.io.evidence import CaptureRequest, EvidenceDeps, EvidenceSettings, capture_bundle
from wedgewatch.io.procs import ProcessSelector
from wedgewatch.io.watchdog_dumps import read_watchdog_dumps
from wedgewatch.report.model import read_bundle
from wedgewatch.report.render import render_html, render_markdown
from wedgewatch.vllm.semantics import Role
from wedgewatch.vllm.signals import watchdog_timeouts

STANDIN = Path(__file__).resolve().parents[1] / "support" / "watchdog_standin" / "engine.py"
BODY = (
    b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
    b"# HELP vllm:watchdog_timeouts_total Number of watchdog feed timeouts.\n"
    b"# TYPE vllm:watchdog_timeouts_total counter\n"
    b'vllm:watchdog_timeouts_total{engine="0",name="engine_0"} 2.0\n'
)


def run_standin(dump_dir: Path) -> Path:
    """Run the stand-in EngineCore until its watchdog has dumped twice; the dump file."""
    done = subprocess.run(
        [sys.executable, str(STANDIN), str(dump_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("DUMPED ")]
    return Path(line.removeprefix("DUMPED "))


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped (nothing to dump stacks of)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dump_file_is_read_into_numbered_dumps_of_threads(tmp_path: Path) -> None:
    """The file name gives the role and pid; each `>>> Call stack dump #n` block gives its
    reason and every thread, innermost frame first; the loop thread is the one shown."""
    path = run_standin(tmp_path)
    named = parse_dump_name(path.name)
    assert named is not None
    assert (named.name, named.role) == ("engine_0", Role.ENGINE_CORE)
    dumps = parse_dump_text(path.read_text())
    assert [(d.seq, d.reason) for d in dumps] == [(1, "feed timeout"), (2, "SIGTERM")]
    main = dumps[-1].main
    assert main is not None
    assert [f.bare for f in main.frames[:4]] == ["wait", "put", "publish", "run_busy_loop"]
    assert main.frames[2].filename.endswith("kv_events.py")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("VLLM_STACK_DUMP_for_worker_3_77.log", ("worker_3", Role.WORKER, 77)),
        ("VLLM_STACK_DUMP_for_engine_9.log", ("engine", Role.ENGINE_CORE, 9)),
        ("VLLM_STACK_DUMP_for_api_5.log", ("api", Role.OTHER, 5)),
        ("VLLM_STACK_DUMP_for_engine_0_x.log", None),
        ("notes.log", None),
    ],
)
def test_dump_file_names(name: str, expected: tuple[str, Role, int] | None) -> None:
    """Names as the watchdog writes them (the PR's `engine`/`worker` and the release's
    `engine_<rank>`/`worker_<rank>`); anything else is not a dump file."""
    named = parse_dump_name(name)
    assert (None if named is None else (named.name, named.role, named.pid)) == expected


def test_a_tail_that_starts_inside_a_dump_keeps_its_whole_threads() -> None:
    """A dump cut at its start (the capture keeps the file's tail) is read from its first
    whole thread on, its reason unknown."""
    text = (
        '  File "/x/a.py", line 1 in lost\n\nThread 0x0000000000000001 (most recent call first):\n'
        '  File "/x/queue.py", line 140 in put\n\n' + "=" * 64 + "\n"
    )
    (dump,) = parse_dump_text(text)
    assert dump.reason.startswith("unknown")
    assert [f.bare for t in dump.threads for f in t.frames] == ["put"]


def test_the_directory_is_read_as_untrusted_and_bounded(tmp_path: Path) -> None:
    """Only regular files named like dumps are read (a symlink, a FIFO and other files are
    not), the newest MAX_DUMP_FILES of them, each to its last MAX_DUMP_BYTES."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    (dumps / "VLLM_STACK_DUMP_for_engine_0_1.log").symlink_to(secret)
    os.mkfifo(dumps / "VLLM_STACK_DUMP_for_engine_0_2.log")
    (dumps / "other.log").write_text("not a dump\n")
    for i in range(MAX_DUMP_FILES + 2):
        path = dumps / f"VLLM_STACK_DUMP_for_worker_{i}_{100 + i}.log"
        path.write_text("x" * (MAX_DUMP_BYTES + 10))
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
    capture = read_watchdog_dumps(str(dumps))
    names = sorted(capture.files)
    assert len(names) == MAX_DUMP_FILES
    assert "watchdog/VLLM_STACK_DUMP_for_worker_0_100.log" not in names  # the oldest two
    assert all(len(data) == MAX_DUMP_BYTES for data in capture.files.values())
    assert capture.summary["files_seen"] == MAX_DUMP_FILES + 2
    assert capture.summary["failures"] == []
    assert read_watchdog_dumps("").summary == {}
    missing = read_watchdog_dumps(str(tmp_path / "nowhere"))
    assert missing.files == {}
    assert "No such file" in missing.summary["failures"][0]


def test_the_timeout_counter_is_read_by_label_set() -> None:
    """`vllm:watchdog_timeouts_total` is read by its labels; its HELP/TYPE lines and other
    families are not; a body without it gives nothing."""
    assert watchdog_timeouts(BODY) == {'engine="0",name="engine_0"': 2.0}
    assert watchdog_timeouts(b"vllm:num_requests_running 1\n") == {}
    assert watchdog_timeouts(b"\xff\xfe") == {}


async def test_a_capture_carries_the_dumps_and_the_report_shows_them(tmp_path: Path) -> None:
    """With `watchdog_dump_dir` set the bundle carries the dump files (private), the summary
    the watchdog section and the counter, the known issue #53859 matches on the dumped
    `publish` frame, and the report shows the dumps beside py-spy's stacks."""
    dump_dir = tmp_path / "vllm-dumps"
    path = run_standin(dump_dir)
    settings = EvidenceSettings(
        evidence_dir=tmp_path / "evidence",
        process_sample_seconds=0.2,
        nvidia_smi_path="nvidia-smi-that-does-not-exist",
        watchdog_dump_dir=str(dump_dir),
    )
    gone = dead_pid()
    request = CaptureRequest(
        target="local",
        selector=ProcessSelector(pid=gone),
        phase=CapturePhase.WEDGED,
        family="progress_stall",
        engine="0",
        model_name="m",
        metrics_body=BODY,
    )
    result = await capture_bundle(request, EvidenceDeps(settings))
    assert result.bundle is not None
    summary: dict[str, Any] = json.loads((result.bundle / "summary.json").read_text())
    section = summary["watchdog"]
    assert section["timeouts_total"] == {'engine="0",name="engine_0"': 2.0}
    (entry,) = section["files"]
    assert (entry["file"], entry["role"], entry["dumps"]) == (path.name, "engine_core", 2)
    assert entry["digest"].startswith("wait < put < publish < run_busy_loop")
    copied = result.bundle / "watchdog" / path.name
    assert copied.read_bytes() == path.read_bytes()
    assert modes(copied) == {".": 0o600}
    assert "vllm-53859" in result.known_issues
    model = read_bundle(result.bundle)
    assert "vllm-53859" in {m.issue.id for m in model.matches}  # the report matches it too
    html = render_html(model, None)
    assert "<h2>vLLM's watchdog</h2>" in html
    assert "run_busy_loop" in html
    markdown = render_markdown(model)
    assert f"### {path.name}: dump #2" in markdown
    assert "vllm:watchdog_timeouts_total" in markdown


async def test_without_a_dump_dir_or_counter_the_summary_has_no_watchdog(tmp_path: Path) -> None:
    """Nothing configured and no counter in the body: no `watchdog` key, no section."""
    settings = EvidenceSettings(
        evidence_dir=tmp_path / "evidence",
        process_sample_seconds=0.2,
        nvidia_smi_path="nvidia-smi-that-does-not-exist",
    )
    gone = dead_pid()
    request = CaptureRequest(
        target="local", selector=ProcessSelector(pid=gone), metrics_body=BODY[:52]
    )
    result = await capture_bundle(request, EvidenceDeps(settings))
    assert result.bundle is not None
    summary = json.loads((result.bundle / "summary.json").read_text())
    assert "watchdog" not in summary
    assert "watchdog" not in render_markdown(read_bundle(result.bundle))
