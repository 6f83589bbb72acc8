"""wedgewatch/lab/real/install-vllm.sh keeps the vLLM venvs in the cache: reused, redone when
broken.

The real script runs against a stand-in `python3` whose `-m venv` makes a venv whose python
records its pip installs and answers the import probe (the real build downloads ~3 GB and
takes minutes: the real tier, `bash tests/run.sh --real`, builds and uses the real venvs).
Everything else (paths, the stamp, the lock, what is deleted and when) is the script's own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "wedgewatch" / "lab" / "real" / "install-vllm.sh"

FAKE_PYTHON3 = """#!/bin/bash
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && echo "home = /usr/bin" > "$3/pyvenv.cfg"
    cp "$(dirname "$0")/venv-python" "$3/bin/python"
    exit 0
fi
exec {real} "$@"
"""
FAKE_VENV_PYTHON = """#!/bin/bash
venv="$(cd "$(dirname "$0")/.." && pwd)"
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    shift 5  # -m pip install -q --disable-pip-version-check
    echo "$(basename "$venv"): $*" >> "$CALLS"
    if [ "$1" = "-e" ]; then  # the editable checkout: its entry point and its import
        touch "$venv/bin/wedgewatch" "$venv/editable" && chmod +x "$venv/bin/wedgewatch"
    fi
    exit 0
fi
if [ "$1" = "-c" ] && [[ "$2" == "import wedgewatch"* ]]; then
    # Like python -c: the current directory comes first on sys.path.
    [ -e "$venv/editable" ] || [ -d "$PWD/wedgewatch" ]
    exit
fi
[ ! -e "$venv/broken" ]
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment whose python3 is the stand-in and whose cache is under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON3.format(real=sys.executable))
    (bin_dir / "venv-python").write_text(FAKE_VENV_PYTHON)
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        WEDGEWATCH_VLLM_VENVS=str(tmp_path / "cache"),
        CALLS=str(tmp_path / "calls.log"),
    )


def install(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(INSTALL), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
        check=False,
    )


def venv_of(env: dict[str, str], version: str) -> Path:
    done = install(env, "--dir", version)
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def calls(env: dict[str, str]) -> list[str]:
    path = Path(env["CALLS"])
    return path.read_text().splitlines() if path.exists() else []


def test_the_venv_lives_in_the_cache_keyed_by_version_and_python(
    env: dict[str, str], tmp_path: Path
) -> None:
    """`--dir` names VERSION-pyX.Y-KEY under the cache root, one per version; nothing built."""
    one, other = venv_of(env, "0.30.0"), venv_of(env, "0.33.0")
    assert one.parent == other.parent == tmp_path / "cache"
    assert one.name.startswith(f"0.30.0-py{sys.version_info[0]}.{sys.version_info[1]}-")
    assert other.name.startswith("0.33.0-")
    assert one.name.split("-")[-1] == other.name.split("-")[-1]  # the same recipe
    assert not one.exists()
    env.pop("WEDGEWATCH_VLLM_VENVS")
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    assert venv_of(env, "0.30.0").parent == tmp_path / "xdg" / "wedgewatch" / "vllm-venvs"


def test_a_venv_is_built_once_stamped_last_and_then_reused(env: dict[str, str]) -> None:
    """The first run installs torch, vLLM without deps, its imports and wedgewatch's
    dependencies, then stamps; the second installs nothing."""
    venv = venv_of(env, "0.30.0")
    first = install(env, "0.30.0")
    assert first.returncode == 0, first.stderr
    installed = calls(env)
    assert installed[:2] == [f"{venv.name}: torch==2.13.0", f"{venv.name}: --no-deps vllm==0.30.0"]
    assert any("httpx>=" in line and "uvicorn>=" in line for line in installed)
    assert (venv / ".wedgewatch-complete").is_file()
    again = install(env, "0.30.0")
    assert again.returncode == 0, again.stderr
    assert "ready" in again.stdout
    assert calls(env) == installed


def test_an_interrupted_build_is_deleted_and_done_again(env: dict[str, str]) -> None:
    """A venv directory without the stamp (the build was killed) is not used: it is deleted,
    leftovers and all, and built again."""
    venv = venv_of(env, "0.33.0")
    assert install(env, "0.33.0").returncode == 0
    (venv / ".wedgewatch-complete").unlink()
    (venv / "half-written").write_text("x")
    done = install(env, "0.33.0")
    assert done.returncode == 0, done.stderr
    assert "not complete" in done.stderr
    assert not (venv / "half-written").exists()
    assert (venv / ".wedgewatch-complete").is_file()
    assert calls(env).count(f"{venv.name}: torch==2.13.0") == 2


def test_a_venv_that_no_longer_imports_vllm_is_rebuilt(env: dict[str, str]) -> None:
    """Stamped but broken (the import probe fails): deleted and built again."""
    venv = venv_of(env, "0.30.0")
    assert install(env, "0.30.0").returncode == 0
    (venv / "broken").write_text("x")
    done = install(env, "0.30.0")
    assert done.returncode == 0, done.stderr
    assert "no longer imports" in done.stderr
    assert not (venv / "broken").exists()
    assert calls(env).count(f"{venv.name}: torch==2.13.0") == 2


def test_a_directory_of_your_own_that_is_no_venv_is_left_alone(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Given a VENV of the user's that is not a venv, the script refuses and deletes nothing."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    done = install(env, "0.30.0", str(mine))
    assert done.returncode == 1
    assert "is not a venv; not touching it" in done.stderr
    assert (mine / "notes.txt").read_text() == "keep"


def test_an_own_venv_built_from_the_checkout_root_gets_the_checkout_installed(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Run from the repository root (where `python -c` would import the checkout itself), a
    venv of your own still gets the checkout installed editable, and so VENV/bin/wedgewatch."""
    venv = tmp_path / "own-venv"
    done = install(env, "0.30.0", str(venv), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert f"own-venv: -e {ROOT}" in calls(env)
    assert (venv / "bin" / "wedgewatch").is_file()
