"""The declared-minimum-versions job: wedgewatch on the floors its pyproject.toml declares.

    python3 tests/support/min_versions.py [PYTEST ARGS...]

builds (or reuses) a venv in ${XDG_CACHE_HOME:-~/.cache}/wedgewatch/min-versions/ with
exactly the lowest version of every runtime dependency that pyproject.toml allows
(`pip install --only-binary :all: 'httpx==0.27' ...` in one resolver call: a floor must
install from a wheel, as on a host without a compiler; what they need in turn is what pip
picks for them, as for a user who pinned them), installs this checkout into it with
`--no-deps`, checks with `pip check` that the floors are consistent, and runs the CLI's
smoke tests (tests/cli/test_smoke.py) against that venv's `wedgewatch` from .venv's pytest.
A floor that does not install or does not pass is a dishonest floor: raise it in
pyproject.toml. docs/development.md ("Dependency floors") says what was raised and why.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: A requirement with a lower bound: `name>=1.2` (more clauses and a comment may follow).
_FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def floors(pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """`name==floor` for every runtime dependency; ValueError names one without a floor."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins = []
    for requirement in dependencies:
        match = _FLOOR.match(requirement)
        if match is None:
            raise ValueError(f"{pyproject}: {requirement!r} declares no floor (name>=VERSION)")
        pins.append(f"{match.group(1)}=={match.group(2)}")
    return pins


def venv_dir(pins: list[str], environ: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """The cached venv for these pins and this Python: a new floor makes a new venv."""
    cache = Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    key = hashlib.sha256("\n".join([sys.version, *pins]).encode()).hexdigest()[:12]
    return (
        cache
        / "wedgewatch"
        / "min-versions"
        / f"py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    )


def _run(argv: list[str | Path]) -> None:
    print("+", " ".join(map(str, argv)), flush=True)
    subprocess.run(argv, check=True)


def build(pins: list[str]) -> Path:
    """The venv with exactly `pins` and this checkout (reinstalled every time); its bin/."""
    venv = venv_dir(pins)
    pip = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check", "-q"]
    done = venv / ".floors-installed"
    if not done.exists():
        _run([sys.executable, "-m", "venv", "--clear", venv])
        _run([*pip, "install", "--only-binary", ":all:", *pins])
        done.write_text("\n".join(pins) + "\n")
    with tempfile.TemporaryDirectory() as scratch:  # the build writes build/ where it runs:
        tree = Path(scratch) / "wedgewatch"  # a copy, so no stale file of an earlier build
        shutil.copytree(  # in the checkout can end up in the installed package
            REPO,
            tree,
            ignore=shutil.ignore_patterns(
                ".git", ".venv*", ".vllm-venvs", "__pycache__", "build", "*.egg-info", "dist"
            ),
            symlinks=True,
        )
        _run([*pip, "install", "--no-deps", "--force-reinstall", tree])
    _run([*pip, "check"])
    _run([*pip[:-1], "list", "--format=freeze"])  # the log shows what was tested
    return venv / "bin"


def main(pytest_args: list[str]) -> int:
    """Build the venv and run the smoke tests against its `wedgewatch`; pytest's exit code."""
    bin_dir = build(floors())
    env = {**os.environ, "WEDGEWATCH_SMOKE_BIN": str(bin_dir)}
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/cli/test_smoke.py"]
    print("+", "WEDGEWATCH_SMOKE_BIN=" + str(bin_dir), " ".join(argv[1:]), flush=True)
    return subprocess.run([*argv, *pytest_args], env=env, cwd=REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
