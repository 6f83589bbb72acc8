"""Shared test setup: the helper modules beside this file import from any test folder.

The test folders mirror the package (tests/core, tests/io, tests/daemon, ...) and are not
packages, so pytest puts only each test's own folder on `sys.path`; the helpers that start
real servers and processes (`scripted_http`, `standin_tree`, `fixtures.vllm_exposition`)
live here, one level up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

_TESTS = Path(__file__).resolve().parent
for _path in (str(_TESTS), str(_TESTS / "support")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

# Property tests judge behaviour, not speed: on a loaded 2-core CI machine one example can
# take longer than hypothesis's default 200 ms deadline, which would fail a correct test.
# Two example counts (a test asking for more scales `settings.default.max_examples`):
# `full`, what .ci/run and a plain `pytest` use, and `quick`, what the default tier of
# tests/run.sh uses unless TEST_HYPOTHESIS_PROFILE says otherwise.
HYPOTHESIS_PROFILES = {"full": 300, "quick": 50}
for _name, _examples in HYPOTHESIS_PROFILES.items():
    settings.register_profile(_name, deadline=None, max_examples=_examples)
settings.load_profile(os.environ.get("TEST_HYPOTHESIS_PROFILE", "full"))


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """Run with umask 0, so only explicit modes can make files private."""
    old = os.umask(0)
    yield
    os.umask(old)


# The suite ends by checking that no process it started is still alive (tests/support/leakcheck.py).
import leakcheck  # noqa: E402
from leakcheck import pytest_sessionfinish, pytest_testnodedown  # noqa: E402
from needs import MARKERS, add_test_tree, needs_of  # noqa: E402

__all__ = ["pytest_sessionfinish", "pytest_testnodedown"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the need markers (tests/support/needs.py) and mark the session for the leak
    check."""
    for name, meaning in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning} (applied by tests/support/needs.py)")
    add_test_tree(config.rootpath)
    leakcheck.pytest_configure(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with what it needs (tests/support/needs.py), so `-m` selections are honest;
    then put the slow tests first, in their own order (the workers' ends are left to the quick
    ones: tests/support/scheduling.py)."""
    for item in items:
        needs = needs_of(item)
        for need in sorted(needs):
            item.add_marker(need)
        if "vllm" in needs:  # importing torch and vLLM alone takes seconds
            item.add_marker("slow")
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's default (`-n` alone, `--dist load`): one test at a time, slow ones first,
    a module with a shared fixture on one worker (tests/support/scheduling.py)."""
    if config.getvalue("dist") != "load":
        return None
    from scheduling import OneTestAtATime  # only with pytest-xdist

    return OneTestAtATime(config, log)
