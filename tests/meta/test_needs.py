"""The need markers come from what a test's code reaches (tests/support/needs.py, via conftest.py).

Inner pytest sessions (in one interpreter) collect a test module written here, with this
tree's conftest.py as a plugin, and `-m MARKER` must select exactly the tests that reach the
tool: directly, through a helper or a constant of their module, through a fixture, through a
module-level `pytestmark`, or through a helper imported from another module of the test tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # inner pytest sessions

HELPERS = '''
import shutil

def render(directory):
    """Runs kubectl."""
    return [shutil.which("kubectl"), "kustomize", directory]
'''

MODULE = """
import shutil
import subprocess
import sys

import pytest
from inner_helpers import render
from simproc import SimProcess
from wedgewatch_daemon import WEDGEWATCH
from vllm_venvs import vllm_python

from tests.support import real_vllm

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def check_rules(path):
    subprocess.run(["promtool", "check", "rules", path], check=False)


@pytest.fixture
def browser():
    return shutil.which("chromium")


def test_plain():
    assert 1 + 1 == 2


def test_through_a_helper():
    check_rules("x.yml")


@pytest.mark.skipif(not PROMETHEUS, reason="no prometheus")
def test_through_a_constant_in_a_decorator():
    pass


def test_through_a_fixture(browser):
    pass


def test_through_an_imported_helper():
    render(".")


def test_through_the_vllm_helper():
    if False:
        vllm_python("0.30.0")


def test_through_the_serving_helper_of_the_tests_package():
    if False:
        real_vllm.serve_python("0.32.0")


def test_starts_the_simulator_through_its_helper():
    if False:
        SimProcess(["--port", "0"])


def test_starts_the_daemon():
    if False:
        subprocess.run([*WEDGEWATCH, "run", "--target", "http://127.0.0.1:1"], check=False)


def test_starts_the_simulator_by_module():
    if False:
        subprocess.run([sys.executable, "-m", "wedgewatch", "sim", "serve"], check=False)


def test_a_manifest_that_names_the_daemon_starts_nothing():
    assert ["wedgewatch", "run", "--config", "x.toml"][1] == "run"


class TestGrouped:
    def test_method_through_a_helper(self):
        check_rules("y.yml")

    def test_method_plain(self):
        pass
"""


# One interpreter runs the inner sessions one after another (`pytest.main` per selection): each
# still collects the module afresh and lets `-m` deselect after the markers are applied, without
# a new interpreter importing the tree's conftest.py and its helpers for every selection.
INNER_SESSIONS = """
import sys

import pytest

root = sys.argv[1]
for marker in sys.argv[2:]:
    print("=== -m " + marker, flush=True)
    code = pytest.main(["-p", "conftest", "-p", "no:cacheprovider", "--collect-only", "-q",
                        "-m", marker, "--rootdir", root, root + "/test_inner.py"])
    print("=== exit %d" % code, flush=True)
"""

MARKER_EXPRESSIONS = ("prometheus", "chromium", "kubectl", "vllm", "slow", "systemd or node")


def selected(inner: Path, markers: tuple[str, ...]) -> dict[str, set[str]]:
    """The test names the inner sessions select, `-m marker` by `-m marker`."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(inner), str(TESTS), str(TESTS / "support"), str(TESTS.parent)]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", INNER_SESSIONS, str(inner), *markers],
        capture_output=True, text=True, timeout=300, env=env, cwd=inner, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found: dict[str, set[str]] = {}
    codes: dict[str, str] = {}
    marker = ""
    for line in done.stdout.splitlines():
        if line.startswith("=== -m "):
            marker = line.removeprefix("=== -m ")
            found[marker] = set()
        elif line.startswith("=== exit "):
            codes[marker] = line.removeprefix("=== exit ")
        elif "::" in line:
            found[marker].add(line.split("::", 1)[1])
    # 0: collected, 5: nothing selected; anything else is a broken inner session.
    assert set(codes) == set(markers), done.stdout + done.stderr
    assert set(codes.values()) <= {"0", "5"}, done.stdout + done.stderr
    return found


@pytest.fixture(scope="module")
def selections(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    inner = tmp_path_factory.mktemp("inner")
    (inner / "inner_helpers.py").write_text(HELPERS)
    (inner / "test_inner.py").write_text(MODULE)
    return selected(inner, MARKER_EXPRESSIONS)


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        (
            "prometheus",
            {
                "test_through_a_helper",
                "test_through_a_constant_in_a_decorator",
                "TestGrouped::test_method_through_a_helper",
            },
        ),
        ("chromium", {"test_through_a_fixture"}),
        ("kubectl", {"test_through_an_imported_helper"}),
        (
            "vllm",
            {
                "test_through_the_vllm_helper",
                "test_through_the_serving_helper_of_the_tests_package",
            },
        ),
        (
            "slow",
            {
                "test_through_the_vllm_helper",
                "test_through_the_serving_helper_of_the_tests_package",
                "test_starts_the_simulator_through_its_helper",
                "test_starts_the_daemon",
                "test_starts_the_simulator_by_module",
            },
        ),
        ("systemd or node", set()),
    ],
)
def test_each_marker_selects_exactly_the_tests_that_reach_its_tool(
    selections: dict[str, set[str]], marker: str, expected: set[str]
) -> None:
    """`-m MARKER` selects the tests that need the tool and no other; `slow` also every test
    that starts the simulator or the daemon."""
    assert selections[marker] == expected
