"""The property tests' example count: `quick` in the default tier, `full` in CI and plain pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

INNER = """
from hypothesis import settings


def test_examples():
    print("EXAMPLES", settings.default.max_examples, settings.default.deadline)
"""


def examples_under(tmp_path: Path, profile: str | None) -> str:
    """What an inner session with this tree's conftest.py prints for `settings.default`."""
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS / "support"), str(REPO)]),
    }
    env.pop("TEST_HYPOTHESIS_PROFILE", None)
    if profile is not None:
        env["TEST_HYPOTHESIS_PROFILE"] = profile
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-p",
         "no:xdist", "-s", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return next(line for line in done.stdout.splitlines() if line.startswith("EXAMPLES"))


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        pytest.param(None, "EXAMPLES 300 None", id="plain-pytest=full"),
        pytest.param("full", "EXAMPLES 300 None", id="full"),
        pytest.param("quick", "EXAMPLES 50 None", id="quick"),
    ],
)
def test_the_profile_sets_the_example_count(
    tmp_path: Path, profile: str | None, expected: str
) -> None:
    """TEST_HYPOTHESIS_PROFILE picks the example count; no deadline in either."""
    assert examples_under(tmp_path, profile) == expected


def test_the_variable_is_outside_the_settings_namespace() -> None:
    """The variable reaches every daemon a test starts, and every `WEDGEWATCH_*` variable is a
    setting (an unknown one is refused), so it must not start with `WEDGEWATCH_`."""
    conftest = (TESTS / "conftest.py").read_text()
    assert 'os.environ.get("TEST_HYPOTHESIS_PROFILE"' in conftest
    assert not "TEST_HYPOTHESIS_PROFILE".startswith("WEDGEWATCH_")


def test_the_default_tier_is_quick_and_ci_is_full() -> None:
    """tests/run.sh defaults to quick; .ci/run asks for full before it runs the default tier."""
    run_sh = (TESTS / "run.sh").read_text()
    assert 'TEST_HYPOTHESIS_PROFILE="${TEST_HYPOTHESIS_PROFILE:-quick}"' in run_sh
    ci = (REPO / ".ci" / "run").read_text()
    assert ci.index("export TEST_HYPOTHESIS_PROFILE=full") < ci.index("bash tests/run.sh")
