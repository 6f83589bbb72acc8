"""docs/design.md lists the modules that run as root in the sidecar, with their size.

The sidecar runs `wedgewatch run` (and, in the exec-probe variant, `wedgewatch check`) as
root with CAP_SYS_PTRACE. Those modules are what the command line loads at start, plus every
module the daemon and `check` reach (imports inside functions included): the static closure
of `daemon.start`, `daemon.loop`, `daemon.adapters` and `check` over the import graph of
tests/meta/test_architecture.py. The list in docs/design.md must name exactly those modules,
each with its line count within a tolerance (so an edit elsewhere does not fail it); the
failure message prints the table as it is now, ready to paste.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path

from test_architecture import MODULES, _graph

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
HEADING = "## What runs as root in the sidecar"
ROW = re.compile(r"^\s*(?P<path>wedgewatch/\S+\.py)\s+(?P<lines>\d+)\s*$")
ENTRY_POINTS = (
    "wedgewatch.entry",
    "wedgewatch.cli",
    "wedgewatch.daemon.start",
    "wedgewatch.daemon.loop",
    "wedgewatch.daemon.adapters",
    "wedgewatch.check",
)


def _loaded_at_start() -> set[str]:
    """The wedgewatch modules a fresh interpreter holds after importing the entry points."""
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in ENTRY_POINTS)
        + "print('\\n'.join(m for m in sys.modules if m.split('.')[0] == 'wedgewatch'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/"
    )
    return set(done.stdout.split())


def _reached(roots: tuple[str, ...]) -> set[str]:
    graph = _graph()
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(graph.get(name, ()))
    return seen


@functools.cache
def sidecar_modules() -> dict[str, int]:
    """Each module file (no package `__init__`) that runs in the sidecar: its line count."""
    names = _loaded_at_start() | _reached(ENTRY_POINTS[2:])
    files = {MODULES[name] for name in names if name in MODULES}
    return {
        path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(files)
        if path.name != "__init__.py"
    }


def render_table(modules: dict[str, int]) -> str:
    """The block docs/design.md holds: one module a line, its line count, then the total."""
    width = max(len(path) for path in modules) + 2
    rows = [f"{path.ljust(width)}{count:>5}" for path, count in modules.items()]
    total = sum(modules.values())
    rows.append(f"{'total (' + str(len(modules)) + ' modules)':<{width}}{total:>5}")
    return "\n".join(rows)


def documented() -> dict[str, int]:
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index(HEADING) :]
    block = section[section.index("```") + 3 :]
    block = block[: block.index("```")]
    return {
        match["path"]: int(match["lines"])
        for line in block.splitlines()
        if (match := ROW.match(line))
    }


def test_the_design_doc_lists_what_runs_as_root_with_its_size() -> None:
    """Every module the sidecar runs is listed, nothing else is, and each size is about right."""
    actual = sidecar_modules()
    listed = documented()
    fresh = f"the table as it is now:\n{render_table(actual)}"
    assert set(listed) == set(actual), fresh
    for path, count in actual.items():
        assert abs(listed[path] - count) <= max(20, count // 10), f"{path}: {fresh}"


def test_the_list_holds_the_daemon_and_not_the_report_renderer() -> None:
    """The closure is the daemon's: its target loop and the detector are in, the report page is
    not (only `wedgewatch report` loads it)."""
    actual = sidecar_modules()
    assert "wedgewatch/daemon/target.py" in actual
    assert "wedgewatch/core/detection/detect.py" in actual
    assert "wedgewatch/report/render.py" not in actual
