"""Paths of the deploy artefacts and the generator module, shared by the deploy tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tests"
KUBERNETES = DEPLOY / "kubernetes"
BASE = KUBERNETES / "base"
EXEC_PROBE = KUBERNETES / "exec-probe"
PERSISTENT_EVIDENCE = KUBERNETES / "examples" / "persistent-evidence"
GRAFANA = DEPLOY / "grafana"
RUNBOOK = REPO / "docs" / "runbook.md"


def load_generate() -> ModuleType:
    """deploy/generate.py as a module (it is a script, not part of the package)."""
    name = "wedgewatch_deploy_generate"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, DEPLOY / "generate.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
