"""Shared test setup: the helper modules beside this file import from any test folder.

The test folders mirror the package (tests/core, tests/io, tests/daemon, ...) and are not
packages, so pytest puts only each test's own folder on `sys.path`; the helpers that start
real servers and processes (`scripted_http`, `standin_tree`, `fixtures.vllm_exposition`)
live here, one level up.
"""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
