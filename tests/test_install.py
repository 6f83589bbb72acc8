"""Installing without a repository URL: a wheel built from the source tree (docs/systemd.md).

The tree is copied first (the build writes `build/` and `*.egg-info` where it runs), the
wheel is built with `pip wheel --no-deps .` exactly as the docs say, and installed into a
fresh venv with `--no-deps --no-index`. The fresh venv gets its dependencies from this test
venv through a path file, so nothing is downloaded; everything of wedgewatch itself comes
from the wheel, which the test checks.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from wedgewatch import __version__

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, cwd=cwd)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


def test_the_wheel_builds_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    """`pip wheel --no-deps .`, `pip install WHEEL` in a new venv, `wedgewatch --version`."""
    tree = tmp_path / "wedgewatch"
    shutil.copytree(
        REPO,
        tree,
        ignore=shutil.ignore_patterns(
            ".git", ".venv*", ".vllm-venvs", "__pycache__", "build", "*.egg-info", "dist"
        ),
        symlinks=True,
    )
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", "."], cwd=tree)
    (wheel,) = (tree / "dist").glob("wedgewatch-*.whl")
    assert wheel.name == f"wedgewatch-{__version__}-py3-none-any.whl"
    names = set(zipfile.ZipFile(wheel).namelist())
    for data in ("vllm/profiles.toml", "vllm/known_issues.toml", "sim/install-vllm.sh", "py.typed"):
        assert f"wedgewatch/{data}" in names, data

    fresh = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", str(fresh)])
    python = fresh / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)])
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
        ).stdout.strip()
    )
    (purelib / "test-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")

    done = _run([str(fresh / "bin" / "wedgewatch"), "--version"])
    assert __version__ in done.stdout
    where = _run(  # from tmp_path: `python -c` puts the working directory first on sys.path
        [str(python), "-c", "import wedgewatch; print(wedgewatch.__file__)"], cwd=tmp_path
    ).stdout
    assert Path(where.strip()).is_relative_to(purelib), where  # the wheel's, not this tree's
    profiles = _run([str(fresh / "bin" / "wedgewatch"), "launch", "--list-profiles"]).stdout
    assert "plain: " in profiles
    assert "tp2-offload: " in profiles
    _run([str(python), "-m", "pip", "check"])  # the wheel's requirements are all met
