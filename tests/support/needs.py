"""What a test needs from outside the venv, read from its code: the markers conftest.py applies.

A test needs a tool when its own code, its decorators, the fixtures it requests, its module's
`pytestmark`, or any helper of this test tree it reaches (module-level functions, classes and
constants, in its module or imported from another module under tests/) looks the tool up
(`shutil.which("promtool")`, `which("kubectl")`) or runs it (`["promtool", ...]`). It needs a
vLLM venv when it reaches `vllm_venvs.vllm_python`. So a test added later that copies any
existing way of finding a tool is marked without anyone remembering to.

| marker | the test needs | found by |
|---|---|---|
| `vllm` | a real vLLM's venv (`run.sh --real` builds them) | `vllm_python`, `serve_python` |
| `prometheus` | Debian's `prometheus` (prometheus, promtool) | `promtool`, `prometheus` |
| `chromium` | Chromium (renders the report) | `chromium`, `chromium-browser` |
| `kubectl` | kubectl >= 1.21 (`kubectl kustomize`) | `kubectl` |
| `systemd` | systemd-analyze (unit verification) | `systemd-analyze` |
| `node` | Node.js (evaluates the polkit rule) | `node` |

The same reading marks a test `slow` when it starts the simulator or the daemon as a process:
an argv (a list, a tuple, or the arguments of a call) with `"sim", "serve"` in a row, or
`"run"` right after the wedgewatch command (`*WEDGEWATCH`, `"-m", "wedgewatch"`, or a call of
a helper named `..wedgewatch..`). `support/simproc.py`'s `SimProcess` and
`support/wedgewatch_daemon.py`'s `DaemonProcess` build such an argv, so every test that
reaches them is slow.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

TESTS = Path(__file__).resolve().parents[1]
TOOLS = {
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "chromium": "chromium",
    "chromium-browser": "chromium",
    "kubectl": "kubectl",
    "systemd-analyze": "systemd",
    "node": "node",
}
ROOTS = {("vllm_venvs", "vllm_python"): "vllm", ("real_vllm", "serve_python"): "vllm"}
MARKERS = {
    "vllm": "needs a venv with a real vLLM (the real tier: tests/run.sh --real)",
    "prometheus": "needs Debian's prometheus (prometheus, promtool)",
    "chromium": "needs Chromium",
    "kubectl": "needs kubectl 1.21 or newer",
    "systemd": "needs systemd-analyze",
    "node": "needs Node.js",
}


def _tool_of_call(node: ast.Call) -> str | None:
    """The tool a `which("x")` call or an argv list `["x", ...]` passed to a call names."""
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name == "which" and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return TOOLS.get(first.value)
    for arg in node.args:
        if isinstance(arg, ast.List) and arg.elts:
            first = arg.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                return TOOLS.get(first.value)
    return None


SLOW = "slow"


def _argv_words(items: list[ast.expr]) -> list[str | None]:
    """The words of an argv display: string constants, `wedgewatch` for the command (a
    starred expression naming WEDGEWATCH, or `-m wedgewatch`), None for anything else."""
    words: list[str | None] = []
    for item in items:
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            word: str | None = item.value
            if word == "wedgewatch" and not (words and words[-1] == "-m"):
                word = None  # a manifest's `wedgewatch run` is data, not a process started here
            words.append(word)
        elif isinstance(item, ast.Starred) and any(
            isinstance(sub, ast.Name) and sub.id == "WEDGEWATCH" for sub in ast.walk(item)
        ):
            words.append("wedgewatch")
        else:
            words.append(None)
    return words


def starts_sim_or_daemon(node: ast.AST) -> bool:
    """`node` is an argv that starts the simulator (`sim serve`) or the daemon (`run`)."""
    if isinstance(node, ast.List | ast.Tuple):
        words = _argv_words(node.elts)
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        words = _argv_words(node.args)
        if "wedgewatch" in name.lower():
            words.insert(0, "wedgewatch")  # a helper that runs wedgewatch with its arguments
    else:
        return False
    pairs = set(itertools.pairwise(words))
    return ("sim", "serve") in pairs or ("wedgewatch", "run") in pairs


class _ModuleNeeds:
    """One module's top-level definitions: the tools each names and the names each uses."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.nodes: dict[str, list[ast.AST]] = {}
        self._edge_cache: dict[
            str, tuple[frozenset[str], tuple[tuple[_ModuleNeeds, str], ...]]
        ] = {}
        try:
            tree = ast.parse(inspect.getsource(module))
        except (OSError, TypeError, SyntaxError):
            return
        for stmt in tree.body:
            for name, node in self._defines(stmt):
                self.nodes.setdefault(name, []).append(node)

    @staticmethod
    def _defines(stmt: ast.stmt) -> list[tuple[str, ast.AST]]:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            return [(stmt.name, stmt)]
        if isinstance(stmt, ast.ClassDef):
            found: list[tuple[str, ast.AST]] = [(stmt.name, stmt)]
            for inner in stmt.body:  # Class.method and the class's own pytestmark
                if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.append((f"{stmt.name}.{inner.name}", inner))
                elif isinstance(inner, ast.Assign | ast.AnnAssign):
                    found.append((f"{stmt.name}.<body>", inner))
            return found
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        return [(t.id, stmt) for t in targets if isinstance(t, ast.Name)]

    def needs(self, name: str, seen: set[tuple[str, str]]) -> set[str]:
        # `tests.support.real_vllm` and `real_vllm` are one helper module, however imported.
        key = (self.module.__name__.removeprefix("tests.support."), name)
        if key in seen:
            return set()
        seen.add(key)
        found: set[str] = set()
        if key in ROOTS:
            found.add(ROOTS[key])
        direct, references = self._edges(name)
        found |= direct
        for home, target in references:
            found |= home.needs(target, seen)
        return found

    def _edges(self, name: str) -> tuple[frozenset[str], tuple[tuple[_ModuleNeeds, str], ...]]:
        """What definition `name` names itself, and the test-tree definitions it refers to:
        read once per definition (a collection asks for the same helpers thousands of times)."""
        known = self._edge_cache.get(name)
        if known is not None:
            return known
        found: set[str] = set()
        references: dict[tuple[_ModuleNeeds, str], None] = {}
        for node in self.nodes.get(name, []):
            for sub in ast.walk(node):
                if starts_sim_or_daemon(sub):
                    found.add(SLOW)
                if isinstance(sub, ast.Call) and (tool := _tool_of_call(sub)):
                    found.add(tool)
                elif isinstance(sub, ast.Name) and sub.id != name.split(".", maxsplit=1)[0]:
                    if (reference := self._global(sub.id)) is not None:
                        references[reference] = None
                elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
                    target = getattr(self.module, sub.value.id, None)
                    if isinstance(target, ModuleType) and _in_tests(target):
                        references[(_module_needs(target), sub.attr)] = None
        known = (frozenset(found), tuple(references))
        self._edge_cache[name] = known
        return known

    def _global(self, name: str) -> tuple[_ModuleNeeds, str] | None:
        """The test-tree definition a global name of this module stands for, if any."""
        if name in self.nodes:
            return (self, name)
        obj = getattr(self.module, name, None)
        home = sys.modules.get(getattr(obj, "__module__", "") or "")
        if home is None or home is self.module or not _in_tests(home):
            return None
        return (_module_needs(home), getattr(obj, "__name__", name))


TEST_TREES = [TESTS]
"""Where helpers are read: this tests/ folder, and the rootdir of a session that is not this
checkout's (tests/meta/test_needs.py runs such sessions); never the package or site-packages."""


def add_test_tree(rootdir: Path) -> None:
    """Read helpers under `rootdir` too, unless it holds this tests/ folder (the checkout)."""
    if not TESTS.is_relative_to(rootdir.resolve()):
        TEST_TREES.append(rootdir.resolve())


def _in_tests(module: ModuleType) -> bool:
    file = getattr(module, "__file__", None)
    return bool(file) and any(Path(file).resolve().is_relative_to(t) for t in TEST_TREES)


@cache
def _module_needs(module: ModuleType) -> _ModuleNeeds:
    return _ModuleNeeds(module)


def needs_of(item: pytest.Item) -> set[str]:
    """The markers test `item` needs (keys of MARKERS), and SLOW when it starts the simulator
    or the daemon."""
    function = getattr(item, "function", None)
    module = getattr(item, "module", None)
    if function is None or module is None or not _in_tests(module):
        return set()
    seen: set[tuple[str, str]] = set()
    analysis = _module_needs(module)
    found = analysis.needs(function.__qualname__.split(".<locals>")[0], seen)
    found |= analysis.needs("pytestmark", seen)
    if "." in function.__qualname__:
        found |= analysis.needs(function.__qualname__.split(".")[0] + ".<body>", seen)
    fixtureinfo = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", []):
        for fixturedef in fixtureinfo.name2fixturedefs.get(name, ()) if fixtureinfo else ():
            home = sys.modules.get(getattr(fixturedef.func, "__module__", "") or "")
            if home is not None and _in_tests(home):
                found |= _module_needs(home).needs(fixturedef.func.__name__, seen)
    return found
