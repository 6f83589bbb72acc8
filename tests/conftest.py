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

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

# Property tests judge behaviour, not speed: on a loaded 2-core CI machine one example can
# take longer than hypothesis's default 200 ms deadline, which would fail a correct test.
settings.register_profile("wedgewatch", deadline=None)
settings.load_profile("wedgewatch")


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """Run with umask 0, so only explicit modes can make files private."""
    old = os.umask(0)
    yield
    os.umask(old)


# The suite ends by checking that no process it started is still alive (tests/leakcheck.py).
from leakcheck import pytest_configure, pytest_sessionfinish  # noqa: E402

__all__ = ["pytest_configure", "pytest_sessionfinish"]
