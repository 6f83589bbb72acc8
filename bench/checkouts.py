"""Another commit's code beside this checkout's, for benchmarks that run both side by side."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def extract(ref: str, into: Path) -> Path:
    """The tree of `ref` (its wedgewatch package) under `into`, by `git archive`: put it
    first on PYTHONPATH, with PYTHONSAFEPATH=1, to run that commit's code."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "wedgewatch"], stdout=out, check=True
        )
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"
