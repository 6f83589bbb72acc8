"""daemon/target.py is shell only: time from the injected clock, the world through `Deps`."""

from __future__ import annotations

import ast
from pathlib import Path

TARGET = Path(__file__).resolve().parents[2] / "wedgewatch" / "daemon" / "target.py"


def test_the_target_shell_reads_no_clock_and_no_adapter_module_of_its_own() -> None:
    """No `time` import (the clock is `deps.clock`) and no import of `daemon.adapters` (the
    real adapters come in through `Deps`), so a fake clock and fakes drive all of it."""
    tree = ast.parse(TARGET.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert "time" not in imported
    assert "wedgewatch.daemon.adapters" not in imported
