"""The package's shape: no import cycle, a pure core, and layers that import only downwards.

Every module of `wedgewatch/` is parsed with `ast`; imports inside functions count like
top-level ones, because a cycle hidden in a function is still a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "wedgewatch"
#: What a pure module may not import: the world, and the layers that touch it.
IMPURE = (
    "asyncio",
    "fcntl",
    "httpx",
    "os",
    "psutil",
    "shutil",
    "signal",
    "socket",
    "subprocess",
    "tempfile",
    "time",
    "uvicorn",
    "starlette",
    "wedgewatch.io",
    "wedgewatch.daemon",
    "wedgewatch.config",
    "wedgewatch.cli",
    "wedgewatch.launch",
    "wedgewatch.check",
    "wedgewatch.lab",
)
PURE_PACKAGES = ("wedgewatch.core", "wedgewatch.vllm")


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(path, package): path for path in sorted(package.rglob("*.py"))}


MODULES = _modules()


def _imports(name: str, path: Path, modules: dict[str, Path] = MODULES) -> Iterator[str]:
    """Every module `name` imports, absolute, from anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            for alias in node.names:  # `from pkg import module` imports the module
                if f"{base}.{alias.name}" in modules:
                    yield f"{base}.{alias.name}"


def _graph(modules: dict[str, Path] = MODULES) -> dict[str, set[str]]:
    """Edges between wedgewatch modules (an import of `a.b.c` also runs `a` and `a.b`).

    The packages a module sits in have started importing before the module runs, so the
    implied edge to them is left out; but a package the source names itself (`from
    wedgewatch import x`, `from . import y`) is an edge like any other, so a cycle through a
    package `__init__` is caught.
    """
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for imported in _imports(name, path, modules):
            parts = imported.split(".")
            for end in range(1, len(parts) + 1):
                prefix = ".".join(parts[:end])
                named = prefix == imported
                implied_parent = name.startswith(prefix + ".")
                if prefix in modules and prefix != name and (named or not implied_parent):
                    targets.add(prefix)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_imports_inside_functions() -> None:
    """The checker finds a function-level import, so a cycle hidden in a function is caught."""
    assert "wedgewatch.lab.sim.serve" in _graph()["wedgewatch.lab.sim.vllm_shim"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_the_checker_catches_a_cycle_through_a_package_init(tmp_path: Path) -> None:
    """A package __init__ importing its own submodule that names the package is a cycle."""
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.cli import main\n",
            "pkg/cli.py": "from pkg import __version__\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/a.py": "from pkg.sub import b\n",
            "pkg/sub/b.py": "import pkg.sub.c\n",
            "pkg/sub/c.py": "x = 1\n",
        },
    )
    graph = _graph(_modules(package))
    assert _cycles(graph) == [["pkg", "pkg.cli"]]
    assert "pkg" not in graph["pkg.sub.b"]  # only implied by `import pkg.sub.c`: no edge


def test_the_checker_resolves_relative_imports(tmp_path: Path) -> None:
    """`from . import x` and `from ..y import z` become edges, so their cycles are caught."""
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/y.py": "z = 1\nfrom .sub import a\n",
            "pkg/sub/__init__.py": "from . import a\n",
            "pkg/sub/a.py": "def f():\n    from ..y import z\n    return z\n",
        },
    )
    graph = _graph(_modules(package))
    assert graph["pkg.sub"] == {"pkg.sub.a"}
    assert graph["pkg.sub.a"] == {"pkg.y"}
    assert _cycles(graph) == [["pkg.sub", "pkg.sub.a", "pkg.y"]]


def test_no_dynamic_imports_in_the_package() -> None:
    """No importlib.import_module or __import__: every import is one the cycle check can see."""
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in ("import_module", "__import__"):
                    found.append(f"{name}:{node.lineno}")
            elif (
                isinstance(node, ast.ImportFrom)
                and node.module == "importlib"
                and any(alias.name == "import_module" for alias in node.names)
            ):
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_no_import_cycle_anywhere_in_the_package() -> None:
    """No module of wedgewatch, sim/ included, reaches itself through its imports."""
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(PURE_PACKAGES)), ids=str)
def test_pure_layers_import_no_io(name: str) -> None:
    """core/ and vllm/ make decisions and know facts; they import nothing that touches the world."""
    imported = set(_imports(name, MODULES[name]))
    impure = sorted(
        module
        for module in imported
        if any(module == bad or module.startswith(bad + ".") for bad in IMPURE)
    )
    assert impure == [], f"{name} imports {impure}"


#: Each layer imports only from itself and the layers listed (the top level may import all).
LAYERS = {
    "wedgewatch.vllm": {"wedgewatch.vllm"},
    "wedgewatch.core": {"wedgewatch.vllm", "wedgewatch.core"},
    "wedgewatch.io": {"wedgewatch.vllm", "wedgewatch.core", "wedgewatch.io"},
    "wedgewatch.config": {
        "wedgewatch.vllm",
        "wedgewatch.core",
        "wedgewatch.io",
        "wedgewatch.config",
    },
    "wedgewatch.daemon": {
        "wedgewatch.vllm",
        "wedgewatch.core",
        "wedgewatch.io",
        "wedgewatch.config",
        "wedgewatch.daemon",
    },
    "wedgewatch.report": {
        "wedgewatch.vllm",
        "wedgewatch.core",
        "wedgewatch.io",
        "wedgewatch.config",
        "wedgewatch.report",
    },
    "wedgewatch.check": {
        "wedgewatch.vllm",
        "wedgewatch.core",
        "wedgewatch.io",
        "wedgewatch.config",
        "wedgewatch.check",
        "wedgewatch.logsetup",
    },
    # The simulator and the real-vLLM harness stand alone: they stand in for vLLM, so they
    # know nothing of the watchdog that watches them.
    "wedgewatch.lab.sim": {"wedgewatch.lab.sim", "wedgewatch.lab.real"},
    "wedgewatch.lab.real": {"wedgewatch.lab.sim", "wedgewatch.lab.real"},
}


#: Below every layer of the watchdog: the decorator of its value types (`@immutable`), which
#: even the vLLM layer uses. The lab stands alone and keeps the standard library's.
FOUNDATION = {"wedgewatch.core", "wedgewatch.core.values"}


def _layer(name: str) -> str | None:
    return next((layer for layer in LAYERS if name == layer or name.startswith(layer + ".")), None)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_only_downwards(layer: str) -> None:
    """vllm <- core <- io <- config <- daemon: no layer reaches up; the simulator stands alone."""
    graph = _graph()
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if _layer(name) == layer
        for target in targets
        if target != "wedgewatch"
        and not (target in FOUNDATION and not layer.startswith("wedgewatch.lab"))
        and (_layer(target) or target) not in LAYERS[layer]
    )
    assert upward == []


#: The top level of the package: entry points, the launcher and logging; features live below.
TOP_LEVEL = {
    "wedgewatch",
    "wedgewatch.__main__",
    "wedgewatch._version",
    "wedgewatch.cli",
    "wedgewatch.entry",
    "wedgewatch.launch",
    "wedgewatch.logsetup",
    "wedgewatch.lograte",
}
#: The only modules outside the lab that may import it: the command line, which dispatches
#: `wedgewatch demo` and `wedgewatch sim` to it.
LAB_DISPATCHERS = {"wedgewatch.cli"}


def test_the_top_level_holds_only_entry_points_the_launcher_and_logging() -> None:
    """A new feature module lands in a subpackage, not beside the entry points."""
    top = {name for name in MODULES if name.count(".") <= 1 and name not in _subpackages()}
    assert top == TOP_LEVEL


def _subpackages() -> set[str]:
    return {name for name, path in MODULES.items() if path.name == "__init__.py"} - {"wedgewatch"}


def test_the_lab_is_never_imported_by_the_watchdog() -> None:
    """The simulator, the real-vLLM harness and the demo stay out of what runs as root."""
    graph = _graph()
    reaching = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if not name.startswith("wedgewatch.lab") and name not in LAB_DISPATCHERS
        for target in targets
        if target == "wedgewatch.lab" or target.startswith("wedgewatch.lab.")
    )
    assert reaching == []
