"""Where the tests find a real vLLM: the venvs `wedgewatch/lab/real/install-vllm.sh` keeps in the
cache.

One venv per vLLM version, shared by every clone and CI run on the machine, under
`${WEDGEWATCH_VLLM_VENVS:-${XDG_CACHE_HOME:-~/.cache}/wedgewatch/vllm-venvs}` (the script
names the directory: `bash wedgewatch/lab/real/install-vllm.sh --dir VERSION`). It holds vLLM and
wedgewatch's dependencies, not wedgewatch: tests run this checkout there with
`PYTHONPATH=<checkout>` (`vllm_env`).

`bash tests/run.sh --real` builds the venvs and sets WEDGEWATCH_REQUIRE_VLLM=1, so a missing
or broken venv fails the test there; anywhere else such a test skips and says how to build.
conftest.py marks every test that reaches `vllm_python` with the `vllm` marker.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "wedgewatch" / "lab" / "real" / "install-vllm.sh"
STAMP = ".wedgewatch-complete"
REQUIRE_VARIABLE = "WEDGEWATCH_REQUIRE_VLLM"


def venv_dir(version: str, *, serve: bool = False) -> Path:
    """The cache directory of the vLLM `version` venv (built or not); `serve`: the serving one."""
    done = subprocess.run(
        ["bash", str(INSTALL), "--dir", *(["--serve"] if serve else []), version],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(done.stdout.strip())


def complete_python(version: str, *, serve: bool = False) -> Path:
    """The python of the complete venv; else skip (fail under --real) saying how to build it."""
    venv = venv_dir(version, serve=serve)
    python = venv / "bin" / "python"
    if (venv / STAMP).is_file() and python.exists():
        return python
    flag = "--serve " if serve else ""
    kind = "serving vLLM" if serve else "vLLM"
    message = (
        f"no complete {kind} {version} venv at {venv}; build it with "
        f"`bash wedgewatch/lab/real/install-vllm.sh {flag}{version}` "
        "(or run `bash tests/run.sh --real`)"
    )
    missing(message)


def missing(message: str) -> NoReturn:
    """Skip the test saying what is missing; fail instead under the real tier (--real)."""
    if os.environ.get(REQUIRE_VARIABLE) == "1":
        pytest.fail(message)
    pytest.skip(message)


def vllm_python(version: str) -> Path:
    """The python of the complete vLLM `version` venv (vLLM's scheduler, no server)."""
    return complete_python(version)


def vllm_env(**extra: str) -> dict[str, str]:
    """The environment to run this checkout with a vLLM venv's python."""
    return dict(os.environ, PYTHONPATH=str(ROOT), **extra)
