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

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture
def umask_zero() -> Iterator[None]:
    """Run with umask 0, so only explicit modes can make files private."""
    old = os.umask(0)
    yield
    os.umask(old)
