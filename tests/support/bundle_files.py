"""Helpers for tests that look at evidence bundles on disk: permissions and fake bundles."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from wedgewatch.io.evidence import SCHEMA


def modes(root: Path) -> dict[str, int]:
    """Permission bits of every path under root (root included), relative names."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def assert_private(root: Path) -> None:
    """Directories 0700, files 0600, nothing else."""
    for name, mode in modes(root).items():
        path = root / name
        expected = 0o700 if path.is_dir() else 0o600
        assert mode == expected, f"{name}: {oct(mode)}"


def fake_bundle(root: Path, name: str, verdict: str, size: int = 100) -> None:
    """A bundle directory with a summary of the given verdict."""
    path = root / name
    path.mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"schema": SCHEMA, "verdict": verdict}))
    (path / "pad.bin").write_bytes(b"\0" * size)
