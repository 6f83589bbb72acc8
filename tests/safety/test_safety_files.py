"""Adversarial tests (issue #21): state and evidence directories, locks and state files.

Real files, symlinks and directories; a real lock held by a child process; the real
`wedgewatch check` and `wedgewatch run` commands. Tests that give a directory to another
user need root (the suite runs as root in CI) and skip otherwise, saying so.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always
from wedgewatch_daemon import WEDGEWATCH, clean_env

from wedgewatch.io import statefile
from wedgewatch.io.bundles import make_bundle_dir
from wedgewatch.io.private_paths import UnsafePath, open_lock_file, private_dir, read_private

IDLE = (Path(__file__).parents[1] / "fixtures" / "idle.prom").read_bytes()
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _given_away(path: Path, mode: int) -> Path:
    """A new directory owned by user nobody with `mode` (needs root)."""
    path.mkdir()
    os.chown(path, NOBODY, NOBODY)
    path.chmod(mode)
    return path


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file a planted symlink points at: it must never be truncated or written."""
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


@pytest.fixture
def target() -> Iterator[str]:
    """A healthy (idle) vLLM stand-in's URL."""
    with ScriptedServer(always(Reply(body=IDLE))) as server:
        yield server.url


def _wedgewatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*WEDGEWATCH, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout,
        check=False,
    )


# -- symlinks -----------------------------------------------------------------------------------


def test_a_planted_lock_symlink_in_the_state_dir_is_refused(tmp_path: Path, victim: Path) -> None:
    """Before: root truncated the symlink's target and wrote its pid into it."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "lock").symlink_to(victim)
    locked = statefile.lock_state_dir(state)
    assert isinstance(locked, statefile.LockFailed)
    assert "symlink" in locked.message
    assert victim.read_text() == "precious\n"


def test_a_planted_state_file_symlink_is_never_read(tmp_path: Path, victim: Path) -> None:
    """state.json -> a file: not read (it is set aside as corrupt, the link itself moved)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "state.json").symlink_to(victim)
    loaded = statefile.load(statefile.state_path(state))
    assert loaded.problem is not None
    assert "symlink" in loaded.problem
    assert victim.read_text() == "precious\n"
    with pytest.raises(UnsafePath, match="symlink"):
        read_private(state / "state.json.corrupt")


@pytest.mark.parametrize("critical_only", [(), ("--critical-only",)], ids=["plain", "critical"])
def test_check_refuses_a_planted_lock_symlink_beside_its_state_file(
    tmp_path: Path, victim: Path, target: str, critical_only: tuple[str, ...]
) -> None:
    """`check --state-file`: UNKNOWN with the reason; the symlink's target is untouched.
    A probe that cannot use its state file is broken: exit 3 even with --critical-only."""
    directory = tmp_path / "probe"
    directory.mkdir(mode=0o700)
    (directory / "s.json.lock").symlink_to(victim)
    state_file = str(directory / "s.json")
    done = _wedgewatch("check", target, "--for", "0", "--state-file", state_file, *critical_only)
    assert done.returncode == 3, done
    assert "symlink" in done.stdout
    assert victim.read_text() == "precious\n"


# -- modes and owners ------------------------------------------------------------------------


def test_lock_files_are_private(tmp_path: Path) -> None:
    """A new lock file is 0600; an old 0644 one is made 0600 (others cannot hold it)."""
    state = tmp_path / "state"
    locked = statefile.lock_state_dir(state)
    assert isinstance(locked, statefile.StateLock)
    locked.release()
    assert _mode(state) == 0o700
    assert _mode(state / "lock") == 0o600
    old = tmp_path / "old.lock"
    old.write_text("")
    old.chmod(0o644)
    os.close(open_lock_file(old))
    assert _mode(old) == 0o600


def test_a_world_writable_directory_of_ours_is_tightened_and_a_sticky_one_kept(
    tmp_path: Path,
) -> None:
    """Ours and 0777 (a Kubernetes emptyDir): go-w, with a note. Ours and sticky: as it is."""
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    note = private_dir(loose, "state_dir")
    assert note is not None
    assert "0777" in note
    assert _mode(loose) == 0o755
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert private_dir(sticky, "state_dir") is None
    assert _mode(sticky) == 0o1777


@needs_root
def test_a_world_writable_state_dir_of_another_user_is_refused(
    tmp_path: Path, victim: Path
) -> None:
    """Before: accepted silently (and its planted files followed)."""
    state = _given_away(tmp_path / "state", 0o777)
    locked = statefile.lock_state_dir(state)
    assert isinstance(locked, statefile.LockFailed)
    assert f"owned by uid {NOBODY}" in locked.message
    assert "plant files" in locked.message
    assert not (state / "lock").exists()


@needs_root
def test_a_directory_owned_by_another_user_is_refused_even_if_not_writable(
    tmp_path: Path,
) -> None:
    """Its owner could plant files whatever the mode says."""
    evidence = _given_away(tmp_path / "evidence", 0o755)
    with pytest.raises(UnsafePath, match=f"owned by uid {NOBODY}"):
        make_bundle_dir(evidence, "bundle")


@needs_root
def test_a_state_dir_symlink_planted_by_another_user_is_refused(tmp_path: Path) -> None:
    """A symlink where the state directory should be, made by another user, points anywhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state = tmp_path / "state"
    state.symlink_to(elsewhere)
    os.lchown(state, NOBODY, NOBODY)
    locked = statefile.lock_state_dir(state)
    assert isinstance(locked, statefile.LockFailed)
    assert f"symlink created by uid {NOBODY}" in locked.message
    assert list(elsewhere.iterdir()) == []


@needs_root
def test_the_daemon_refuses_a_world_writable_evidence_dir_of_another_user(
    tmp_path: Path, target: str
) -> None:
    """`wedgewatch run` exits 2 at start-up naming the directory and what to change."""
    evidence = _given_away(tmp_path / "evidence", 0o777)
    done = _wedgewatch(
        "run", "--target", f"t={target}", "--listen-port", "0",
        "--state-dir", str(tmp_path / "state"), "--evidence-dir", str(evidence),
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "refusing evidence_dir" in done.stdout + done.stderr
    assert str(evidence) in done.stdout + done.stderr


# -- a lock held by someone else --------------------------------------------------------------

_HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("critical_only", [(), ("--critical-only",)], ids=["plain", "critical"])
def test_check_never_waits_for_ever_on_a_lock_held_by_another_process(
    tmp_path: Path, target: str, critical_only: tuple[str, ...]
) -> None:
    """A child holds the state file's lock for good: the check ends UNKNOWN, saying why,
    and exits 3 even with --critical-only (a probe that cannot work must fail, not pass).

    Before: `check --state-file` blocked in flock for as long as the holder lived.
    """
    state_file = tmp_path / "probe" / "s.json"
    state_file.parent.mkdir(mode=0o700)
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(state_file) + ".lock"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "held\n"
            done = _wedgewatch(
                "check", target, "--for", "0", "--scrape-timeout-seconds", "1",
                "--state-file", str(state_file), *critical_only,
            )  # fmt: skip
        finally:
            holder.kill()
    assert done.returncode == 3, done
    assert done.stdout.startswith("UNKNOWN")
    assert "held by another process" in done.stdout
