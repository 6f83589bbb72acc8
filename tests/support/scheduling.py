"""How pytest-xdist hands out the tests (tests/conftest.py; `bash tests/run.sh`).

The slow tests come first in the collection (tests/conftest.py sorts them there), and each
test goes to the next idle worker on its own, so a long end-to-end run never starts last
while the other workers have finished: the quick tests fill the workers' ends. A module
that sets up a fixture once for all its tests (`scope="module"`: a Prometheus scene, a
browser, a stand-in process tree) goes to one worker whole, which builds it once.

This is pytest-xdist's `loadscope` scheduler with a scope per test, except for those
modules. (Its `loadgroup` mode would do the same from `xdist_group` marks, but pytest-xdist
3.8 cannot rename the test ids under pytest 9, so the marks have no effect there.)
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

_SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\(\s*scope\s*=\s*["'](module|class|package)["']""")


@functools.cache
def shares_a_fixture(path: Path) -> bool:
    """Whether the test module at `path` defines a fixture set up once for many tests."""
    try:
        return bool(_SHARED_FIXTURE.search(path.read_text(encoding="utf-8")))
    except OSError:
        return False


class OneTestAtATime(LoadScopeScheduling):
    """`loadscope` with one test a unit, a module with a shared fixture one unit."""

    def __init__(self, config: object, log: object = None) -> None:
        super().__init__(config, log)  # type: ignore[arg-type]
        self.rootpath: Path = config.rootpath  # type: ignore[attr-defined]

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if shares_a_fixture(self.rootpath / module) else nodeid
