"""Nothing tracked points outside the checkout: a fresh clone works on any machine.

Two things would make a clone depend on one development machine: tracked symlinks into that
machine's directories (`.venv-vllm-0.30.0 -> /work/vv/0.30.0`), and absolute paths of it
written into tracked files (its venvs, its checkout, its wheel directory, its home, the notes
beside the checkout in `../shared/`). Both are
checked over `git ls-files`, so the rule holds for files added later too.

Absolute paths the product itself uses (/var/lib/wedgewatch, /usr/bin/..., /proc, /etc/...,
/dev/shm, /opt/wedgewatch for the documented install) are fine; the patterns below name the
places only a development machine has.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEV_PATH = re.compile(
    r"(?<![\w./~-])(?:"
    r"/work/[\w.-]+"  # the dev machine's workspace (checkouts, shared/, venvs such as /work/vv)
    r"|/root/[\w.-]+"  # root's home (pyenv, caches, venvs)
    r"|/home/[a-z_][\w-]*/[\w.-]+"  # a user's home
    r"|/Users/[\w.-]+/"  # a macOS home
    r"|/opt/(?:wheels|pypi[\w-]*)\b"  # the dev machine's local wheel directory and indexes
    r"|\.\./shared/"  # the development notes beside the checkout (facts go into docs/)
    r")"
)
ALLOWED_FILES = {"tests/meta/test_repo_hygiene.py"}  # the patterns above, and their own tests


def tracked() -> list[str]:
    """The checkout's tracked paths (`git ls-files`), or skip outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc})")
    return [p for p in done.stdout.decode().split("\0") if p]


def tracked_text_lines() -> Iterator[tuple[str, int, str]]:
    """(path, line number, line) of every tracked text file (symlinks and binaries skipped)."""
    for name in tracked():
        path = ROOT / name
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for lineno, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            yield name, lineno, line


def escapes(root: Path, link: Path) -> str | None:
    """Why symlink `link` (inside `root`) leaves `root`, or None when it stays inside."""
    target = os.readlink(link)
    if os.path.isabs(target):
        return f"absolute target {target}"
    resolved = Path(os.path.normpath(link.parent / target))
    if not resolved.is_relative_to(root):
        return f"target {target} resolves outside the checkout"
    return None


def dev_paths(text: str) -> list[str]:
    """The development-machine paths in `text`."""
    return sorted({m.group(0) for m in DEV_PATH.finditer(text)})


def test_no_tracked_symlink_leaves_the_checkout() -> None:
    """Every tracked symlink's target is relative and resolves inside the checkout."""
    bad = []
    for name in tracked():
        path = ROOT / name
        if path.is_symlink():
            reason = escapes(ROOT, path)
            if reason:
                bad.append(f"{name}: {reason}")
    assert bad == [], "tracked symlinks that leave the checkout:\n" + "\n".join(bad)


def test_no_tracked_file_names_a_development_machines_path() -> None:
    """No tracked text file holds a path of a development machine (venvs, wheels, homes)."""
    bad = [
        f"{name}:{lineno}: {found}"
        for name, lineno, line in tracked_text_lines()
        if name not in ALLOWED_FILES
        for found in dev_paths(line)
    ]
    assert bad == [], "development-machine paths in tracked files:\n" + "\n".join(bad[:50])


def test_a_symlink_out_of_the_checkout_is_caught(tmp_path: Path) -> None:
    """The symlink rule flags absolute and escaping targets, and passes one that stays in."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("a\n")
    (root / "vv").symlink_to("/work/vv/0.30.0")
    (root / "up").symlink_to("../elsewhere")
    (root / "docs" / "inside").symlink_to("../docs/a.md")
    assert escapes(root, root / "vv") == "absolute target /work/vv/0.30.0"
    assert escapes(root, root / "up") == "target ../elsewhere resolves outside the checkout"
    assert escapes(root, root / "docs" / "inside") is None


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("ln -s /work/vv/0.30.0 .venv-vllm-0.30.0", ["/work/vv"]),
        ('"filename": "/root/.pyenv/versions/3.11.7/lib/x.py"', ["/root/.pyenv"]),
        ("pip install --find-links /opt/wheels torch", ["/opt/wheels"]),
        ("see /home/alice/src/wedgewatch/.venv", ["/home/alice/src"]),
        ("/Users/bob/wedgewatch", ["/Users/bob/"]),
        # the product's own absolute paths, and look-alikes inside URLs or relative paths
        ("state in /var/lib/wedgewatch, bins in /usr/bin, /proc/1/stat, /etc/wedgewatch", []),
        ("/dev/shm/x, /opt/wedgewatch/.venv/bin/wedgewatch, /tmp/work/x", []),
        ("https://example.com/work/x and docs/work/y and ~/work/z", []),
    ],
)
def test_the_dev_path_patterns(text: str, found: list[str]) -> None:
    """Development-machine paths are found; the product's own and look-alikes are not."""
    assert dev_paths(text) == found


NARRATION = re.compile(r"\b(?:stop|wave|session|round) #?\d+\b", re.IGNORECASE)
PRODUCT_TEXT = ("README.md", "docs/", "wedgewatch/", "deploy/", "systemd/", "bench/")


def test_no_product_text_narrates_the_tracker() -> None:
    """README, docs and the product's code name no tracker stop, wave, session or round:
    a figure carries its command and commit, not the history of the work."""
    bad = [
        f"{name}:{lineno}: {found}"
        for name, lineno, line in tracked_text_lines()
        if name.startswith(PRODUCT_TEXT)
        for found in NARRATION.findall(line)
    ]
    assert bad == [], "tracker narration in product text:\n" + "\n".join(bad[:50])


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("the 2-core CI machine showed it (stop 26)", ["stop 26"]),
        ("measured in Round 3 of the hardening", ["Round 3"]),
        ("a second round of stacks at the wedge; stop the worker; a session of its own", []),
    ],
)
def test_the_narration_pattern(text: str, found: list[str]) -> None:
    """Tracker numbers are found; the product's own rounds, stops and sessions are not."""
    assert NARRATION.findall(text) == found
