"""Installing without a repository URL: a wheel built from the source tree (docs/systemd.md).

The tree is copied first (the build writes `build/` and `*.egg-info` where it runs), the
wheel is built with `pip wheel --no-deps .` exactly as the docs say, and installed into a
fresh venv with `--no-deps --no-index`. The fresh venv gets its dependencies from this test
venv through a path file, so nothing is downloaded; everything of wedgewatch itself comes
from the wheel, which the test checks.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from min_versions import floors

from wedgewatch import __version__

REPO = Path(__file__).resolve().parents[2]
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
    for data in (
        "vllm/profiles.toml",
        "vllm/known_issues.toml",
        "lab/real/install-vllm.sh",
        "py.typed",
    ):
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


#: Third-party modules that shipped files import without declaring them, and why.
UNDECLARED_ON_PURPOSE = {
    "vllm": "vLLM's own modules: lab/real/vllm_core.py and vllm_engine.py run in a vLLM venv",
    "torch": "ditto (lab/real/vllm_engine.py, inside a vLLM venv)",
    "transformers": "lab/real/tiny_model.py runs in a serving vLLM venv (install-vllm.sh --serve)",
    "tokenizers": "ditto (lab/real/tiny_model.py, inside a serving vLLM venv)",
    "certifi": "only inside `try: ... except ImportError` (io/http_get.py), as httpx does",
}


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> set[str]:
    """The distributions pyproject.toml declares: runtime dependencies and every extra."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements.extend(extra)
    return {_normalised(re.split(r"[\s\[<>=!~;]", r.strip(), maxsplit=1)[0]) for r in requirements}


def test_every_third_party_import_of_a_shipped_file_is_declared() -> None:
    """wedgewatch/ and deploy/: each imported distribution is a dependency or in an extra
    (PyYAML for deploy/generate.py is the `deploy` extra), or listed above with its reason."""
    declared = _declared()
    distributions = importlib.metadata.packages_distributions()
    undeclared = []
    for path in sorted([*(REPO / "wedgewatch").rglob("*.py"), *(REPO / "deploy").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in {"wedgewatch", "__future__"}:
                    continue
                if top in UNDECLARED_ON_PURPOSE:
                    continue
                owners = {_normalised(d) for d in distributions.get(top, [])}
                if not owners & declared:
                    undeclared.append(f"{path.relative_to(REPO)}: {name} ({owners or 'unknown'})")
    assert not undeclared, undeclared


def test_the_floors_job_pins_every_runtime_dependency_at_its_floor(tmp_path: Path) -> None:
    """tests/support/min_versions.py: one `name==floor` per dependency; a dependency without a floor
    is refused by name rather than tested at whatever pip picks."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = floors()
    assert len(pins) == len(project["dependencies"])
    assert "typer==0.15.4" in pins
    bare = tmp_path / "pyproject.toml"
    bare.write_text('[project]\ndependencies = ["httpx>=0.27", "typer"]\n')
    with pytest.raises(ValueError, match="'typer' declares no floor"):
        floors(bare)
