"""An evidence bundle on disk: names, redaction, private files, reading back, retention."""

from __future__ import annotations

import datetime as dt
import json
import stat
from pathlib import Path

import pytest
from bundle_files import assert_private, fake_bundle

from wedgewatch.io.atomic import write_atomic
from wedgewatch.io.bundles import (
    apply_retention,
    bundle_bytes,
    bundle_name,
    ensure_private_dir,
    history_lines,
    json_safe,
    make_bundle_dir,
    sanitise,
    scan_bundles,
    timestamp_of_name,
    write_bundle_file,
    write_private,
)
from wedgewatch.io.evidence import SCHEMA

#: A byte budget no test bundle comes near (retention here is about counts).
MAX_BYTES = 512 * 1024 * 1024


# ---------------------------------------------------------------- names and redaction


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        pytest.param("local", "local", id="plain"),
        pytest.param("127.0.0.1:8000", "127.0.0.1-8000", id="host-port"),
        pytest.param("[::1]:8000", "1-8000", id="ipv6"),
        pytest.param("../../etc/passwd", "etc-passwd", id="traversal"),
        pytest.param("..", "x", id="dotdot"),
        pytest.param("", "x", id="empty"),
        pytest.param("a" * 80, "a" * 48, id="long"),
    ],
)
def test_sanitise(raw: str, clean: str) -> None:
    """Path components keep only safe characters and can never climb out of the directory."""
    assert sanitise(raw) == clean


def test_bundle_name_has_utc_time_target_engine_family() -> None:
    """Bundle names read `UTC_target_engineN_family`."""
    when = dt.datetime(2026, 12, 2, 10, 15, 0, tzinfo=dt.UTC).timestamp()
    assert bundle_name(when, "local", "0", "deferred_stall") == (
        "20261202T101500Z_local_engine0_deferred_stall"
    )
    assert bundle_name(when, "vllm:8000", None, "manual") == "20261202T101500Z_vllm-8000_manual"
    assert timestamp_of_name("20261202T101500Z_local_engine0_deferred_stall") == when
    assert timestamp_of_name("notes") is None
    assert timestamp_of_name("20261399T999999Z_x") is None


@pytest.mark.parametrize(
    ("title", "redacted"),
    [
        pytest.param(
            "vllm serve m --api-key sk-1 --port 8000",
            "vllm serve m --api-key *** --port 8000",
            id="api-key",
        ),
        pytest.param("vllm serve m --api-key=sk-1", "vllm serve m --api-key=***", id="equals"),
        pytest.param("x --hf-token hf_abc", "x --hf-token ***", id="token"),
        pytest.param("x --DB_PASSWORD=p", "x --DB_PASSWORD=***", id="password"),
        pytest.param(
            "x --max-num-batched-tokens 8192", "x --max-num-batched-tokens 8192", id="tokens-flag"
        ),
        pytest.param("x --ssl-keyfile /k.pem", "x --ssl-keyfile /k.pem", id="keyfile-path"),
        pytest.param("VLLM::EngineCore", "VLLM::EngineCore", id="title"),
    ],
)
def test_a_title_is_redacted_by_the_writer(title: str, redacted: str) -> None:
    """Values of secret flags are masked; ordinary flags are left alone."""
    assert bundle_bytes("processes.txt", title.encode()).decode() == redacted


def test_pyspy_text_header_is_redacted_by_the_writer() -> None:
    """py-spy's `Process N: cmdline` header is redacted, the stacks are not touched."""
    text = (
        "Process 7: vllm serve m --api-key sk-1\nPython v3.11\n\nThread 7 (idle)\n    f (a.py:1)\n"
    )
    assert bundle_bytes("pyspy/api_server-7.txt", text.encode()).decode() == (
        "Process 7: vllm serve m --api-key ***\nPython v3.11\n\nThread 7 (idle)\n    f (a.py:1)\n"
    )


def test_history_lines_are_strict_json() -> None:
    """The flight recorder is one strict JSON object per line (NaN becomes a string)."""
    lines = history_lines([{"at": 1.0, "kv": float("nan")}, {"at": 2.0, "key": ("a", 1)}])
    assert lines == b'{"at": 1.0, "kv": "nan"}\n{"at": 2.0, "key": ["a", 1]}\n'
    assert json_safe({1: float("inf"), "p": Path("/x")}) == {"1": "inf", "p": "/x"}


# ---------------------------------------------------------------- private files


def test_private_dirs_and_files_ignore_the_umask(tmp_path: Path, umask_zero: None) -> None:
    """Bundle directories are 0700 and files 0600 even with umask 0."""
    root = tmp_path / "a" / "evidence"
    ensure_private_dir(root)
    bundle = make_bundle_dir(root, "20261202T101500Z_local_manual")
    write_private(bundle / "f.txt", b"data")
    write_atomic(bundle / "summary.json", b"{}")
    write_atomic(bundle / "summary.json", b'{"v": 2}')
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert_private(bundle)
    assert (bundle / "summary.json").read_bytes() == b'{"v": 2}'
    assert sorted(p.name for p in bundle.iterdir()) == ["f.txt", "summary.json"]


def test_bundle_dir_name_collision_gets_a_suffix(tmp_path: Path) -> None:
    """Two captures in the same second get distinct directories."""
    first = make_bundle_dir(tmp_path, "20261202T101500Z_local_manual")
    second = make_bundle_dir(tmp_path, "20261202T101500Z_local_manual")
    assert second.name == "20261202T101500Z_local_manual-2"
    assert first != second


def test_write_private_never_overwrites_or_follows_links(tmp_path: Path) -> None:
    """An existing file or a planted symlink makes the write fail instead of clobbering."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(FileExistsError):
        write_private(tmp_path / "link", b"x")
    with pytest.raises(FileExistsError):
        write_private(victim, b"x")
    assert victim.read_text() == "keep"


def test_apply_retention_deletes_only_bundles(tmp_path: Path) -> None:
    """Retention deletes evicted bundles and never touches other entries in evidence_dir."""
    root = tmp_path / "evidence"
    fake_bundle(root, "20261201T000000Z_a_wedged", "wedged")
    fake_bundle(root, "20261201T010000Z_a_manual", "manual")
    fake_bundle(root, "20261201T020000Z_a_suspect", "resolved")
    fake_bundle(root, "20261201T030000Z_a_suspect", "suspect")
    (root / "notes").mkdir()
    (root / "README").write_text("mine")
    evicted, failures = apply_retention(
        root, keep=2, max_bytes=MAX_BYTES, protect=["20261201T030000Z_a_suspect"]
    )
    assert evicted == ("20261201T010000Z_a_manual", "20261201T020000Z_a_suspect")
    assert failures == ()
    assert sorted(p.name for p in root.iterdir()) == [
        "20261201T000000Z_a_wedged",
        "20261201T030000Z_a_suspect",
        "README",
        "notes",
    ]
    wedge = next(x for x in scan_bundles(root) if x.name.endswith("wedged"))
    assert wedge.wedge
    assert wedge.size_bytes > 100


def test_apply_retention_routine_bundle_keeps_wedges_until_it_becomes_one(tmp_path: Path) -> None:
    """A suspect bundle over a full set of wedges evicts none; once wedged it evicts the oldest."""
    root = tmp_path / "evidence"
    wedges = [f"20261201T0{h}0000Z_a_wedged" for h in range(3)]
    for name in wedges:
        fake_bundle(root, name, "wedged")
    suspect = "20261201T030000Z_a_suspect"
    fake_bundle(root, suspect, "suspect")
    evicted, failures = apply_retention(root, keep=3, max_bytes=MAX_BYTES, protect=[suspect])
    assert evicted == ()
    assert len(failures) == 1
    assert failures[0].startswith("retention: over evidence_keep or evidence_max_bytes")
    assert sorted(p.name for p in root.iterdir()) == [*wedges, suspect]
    summary = root / suspect / "summary.json"
    summary.write_text(json.dumps({"schema": SCHEMA, "verdict": "wedged"}))
    evicted, failures = apply_retention(root, keep=3, max_bytes=MAX_BYTES, protect=[suspect])
    assert (evicted, failures) == ((wedges[0],), ())
    assert sorted(p.name for p in root.iterdir()) == [*wedges[1:], suspect]


@pytest.mark.parametrize(
    ("data", "written"),
    [
        pytest.param(b"", b"", id="empty"),  # was ValueError: max_chars must be >= 1, got 0
        pytest.param(b"a\x00b\x1b[2J", b"a\\x00b\\x1b[2J", id="escaped-never-cut"),
    ],
)
def test_bundle_bytes_of_a_text_file_never_fails_nor_cuts(data: bytes, written: bytes) -> None:
    """A text file (an empty py-spy stderr, a title full of escapes) is written whole."""
    assert bundle_bytes("pyspy/x.txt", data) == written


@pytest.mark.parametrize(
    ("rel", "raw"),
    [
        (
            "build.json",
            {"status": "failed", "url": "http://u:planted-1@127.0.0.1:1/version?token=planted-2"},
        ),
        (
            "processes.json",
            {"processes": [{"pid": 7, "title": "vllm serve m --api-key planted-3"}]},
        ),
        ("stacks/api_server.txt", "Process 7: vllm serve m --api-key planted-4\nThread 1\n"),
    ],
)
def test_the_bundle_writer_alone_redacts_what_evidence_hands_it_raw(
    tmp_path: Path, rel: str, raw: object
) -> None:
    """Evidence hands the writer raw titles, URLs and py-spy text: the file on disk holds no
    secret, because `write_bundle_file` is the one place a bundle file is redacted."""
    data = raw.encode() if isinstance(raw, str) else json.dumps(raw).encode()
    (tmp_path / "stacks").mkdir()
    write_bundle_file(tmp_path, rel, data)
    text = (tmp_path / rel).read_text(encoding="utf-8")
    assert "planted" not in text
    assert "127.0.0.1" in text or "vllm serve m" in text
