"""The one atomic file writer: whole old or whole new contents, private, no temporary left."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from wedgewatch.io.atomic import remove_leftovers, write_atomic


def test_replaces_the_file_with_private_contents(tmp_path: Path) -> None:
    """The new contents replace the old, mode 0600 whatever the umask, no temporary left."""
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    old_umask = os.umask(0)
    try:
        write_atomic(path, b"new")
    finally:
        os.umask(old_umask)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_makes_missing_directories_only_when_asked(tmp_path: Path) -> None:
    """A missing directory is an error unless `make_parents`, which creates it 0700."""
    path = tmp_path / "a" / "b" / "state.json"
    with pytest.raises(FileNotFoundError):
        write_atomic(path, b"x")
    write_atomic(path, b"x", make_parents=True)
    assert path.read_bytes() == b"x"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    """When the rename fails the target is untouched and the temporary file is gone."""
    target = tmp_path / "busy"
    target.mkdir()
    (target / "inside").write_bytes(b"keep")
    with pytest.raises(OSError, match="directory"):
        write_atomic(target, b"new")
    assert (target / "inside").read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]


def test_a_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    """Writing over a symlink replaces the link; the file it pointed to is not touched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    link = tmp_path / "state.json"
    link.symlink_to(victim)
    write_atomic(link, b"new")
    assert victim.read_bytes() == b"precious"
    assert not link.is_symlink()
    assert link.read_bytes() == b"new"


def test_leftovers_of_dead_writers_are_removed(tmp_path: Path) -> None:
    """Only this file's temporaries go; other files, even other temporaries, stay."""
    path = tmp_path / "state.json"
    leftover = tmp_path / ".state.json.abc123.tmp"
    leftover.write_bytes(b"{half")
    other = tmp_path / ".other.json.abc123.tmp"
    other.write_bytes(b"x")
    remove_leftovers(path)
    assert not leftover.exists()
    assert other.exists()
