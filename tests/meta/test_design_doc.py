"""docs/design.md's package map names every module of `wedgewatch/`, and nothing that is gone.

The map is the fenced block that starts with `wedgewatch/`: a folder is a line ending in
`/`, a module a line whose first word ends in `.py` or `.toml` (or several, comma-separated),
indented under its folder. A new module that is not in the map fails here, and so does a
map entry whose file was moved or removed.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "wedgewatch"
#: Files every package has, or that say nothing about the design.
UNLISTED = {"__init__.py", "__main__.py", "_version.py", "py.typed"}
_ENTRY = re.compile(r"^(?P<indent> *)(?P<names>[\w./-]+(?:, [\w./-]+)*)(?:\s|$)")


def _map_block(text: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index("wedgewatch/")
    end = lines.index("```", start)
    return lines[start:end]


def listed_files(text: str) -> set[str]:
    """Paths (relative to the repository) that the design map names."""
    folders: list[tuple[int, str]] = []  # (indent, path) of the enclosing folders
    found: set[str] = set()
    for line in _map_block(text):
        match = _ENTRY.match(line)
        if match is None or not match["names"]:
            continue
        indent = len(match["indent"])
        while folders and folders[-1][0] >= indent:
            folders.pop()
        parent = folders[-1][1] if folders else ""
        first = match["names"].split(", ")[0]
        if first.endswith("/"):
            folders.append((indent, parent + first))
            continue
        if first.endswith((".py", ".toml", ".sh")):
            found.update(parent + name for name in match["names"].split(", "))
    return found


def shipped_files() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and path.suffix in {".py", ".toml", ".sh"}
        and path.name not in UNLISTED
        and "__pycache__" not in path.parts
    }


def test_the_design_map_names_every_module_and_nothing_else() -> None:
    listed = listed_files((ROOT / "docs" / "design.md").read_text(encoding="utf-8"))
    shipped = shipped_files()
    assert sorted(shipped - listed) == [], "modules missing from docs/design.md's map"
    assert sorted(listed - shipped) == [], "docs/design.md's map names files that are gone"


def test_the_map_reader_sees_folders_and_multi_name_lines() -> None:
    text = "```\nwedgewatch/\n  a/   x\n    b.py   y\n    c.py, d.py  z\n  e.py\n```\n"
    assert listed_files(text) == {
        "wedgewatch/a/b.py",
        "wedgewatch/a/c.py",
        "wedgewatch/a/d.py",
        "wedgewatch/e.py",
    }
