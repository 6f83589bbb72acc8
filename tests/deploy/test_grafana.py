"""The Grafana dashboard and alerting provisioning: structure, variables and query syntax."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.repo import GRAFANA, load_generate
from wedgewatch.core.detection.states import EngineState

generate = load_generate()
BUILTIN_VARIABLES = {"__rate_interval", "__range", "__interval"}


def _dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads((GRAFANA / "dashboard.json").read_text(encoding="utf-8"))
    return board


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _variables() -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in _dashboard()["templating"]["list"]}


def _used_variables(text: str) -> set[str]:
    return set(re.findall(r"\$\{?(\w+)", text))


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """PromQL with Grafana's variables replaced: `All` (`.*`) unless a value is given."""
    values = values or {}
    builtins = {"__rate_interval": "1m", "__range": "1h", "__interval": "15s"}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        return values.get(name, ".*")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


def test_dashboard_identity() -> None:
    """The dashboard has a stable uid, a title, tags and a current schema version."""
    board = _dashboard()
    assert board["uid"] == "wedgewatch-vllm"
    assert board["title"]
    assert board["schemaVersion"] >= 39
    assert {"vllm", "wedgewatch"} <= set(board["tags"])


def test_every_panel_queries_the_datasource_variable() -> None:
    """Panels and their queries use `${datasource}`, never a fixed data source uid."""
    for panel in _panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
    datasource = _variables()["datasource"]
    assert datasource["type"] == "datasource"
    assert datasource["query"] == "prometheus"


def test_panel_ids_are_unique_and_the_grid_does_not_overlap() -> None:
    """Panel ids are unique and no two panels share a cell of the 24-column grid."""
    panels = _dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = []
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells.append((panel["title"], grid))
    for (a, ga), (b, gb) in combinations(cells, 2):
        apart = (
            ga["x"] + ga["w"] <= gb["x"]
            or gb["x"] + gb["w"] <= ga["x"]
            or ga["y"] + ga["h"] <= gb["y"]
            or gb["y"] + gb["h"] <= ga["y"]
        )
        assert apart, f"{a!r} overlaps {b!r}"


def test_every_variable_used_is_defined_and_every_defined_one_used() -> None:
    """Queries use only defined variables (or Grafana's builtins), and none is defined in vain."""
    variables = _variables()
    used: set[str] = set()
    for _where, expr in generate.dashboard_queries(_dashboard()):
        used |= _used_variables(expr)
    for variable in variables.values():
        used |= _used_variables(str(variable.get("definition", "")))
    assert used - set(variables) - BUILTIN_VARIABLES == set()
    assert set(variables) - {"datasource"} <= used
    for panel in _panels():
        used_in_panel = _used_variables(json.dumps(panel))
        assert "datasource" in used_in_panel


def test_selector_variables_are_multi_value_with_all() -> None:
    """Each selector variable allows several values and All, which matches missing labels too."""
    for name, variable in _variables().items():
        if name == "datasource":
            continue
        assert variable["type"] == "query"
        assert variable["definition"].startswith("label_values(")
        assert variable["multi"] is True
        assert variable["includeAll"] is True
        assert variable["allValue"] == ".*"


def test_state_panels_map_every_detector_state() -> None:
    """The state timelines name every state the detector has, and nothing else."""
    mapped = {state for state, _color in generate.STATES}
    assert mapped == {state.value for state in EngineState}
    timelines = [p for p in _panels() if p["type"] == "state-timeline"]
    assert len(timelines) == 2
    for panel in timelines:
        (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
        texts = {entry["text"] for entry in mapping["options"].values()}
        assert texts == mapped


def test_panels_cover_the_issue_list() -> None:
    """Running and waiting by reason, progress, state, stall time, wedges, restarts, evidence."""
    exprs = " ".join(expr for _where, expr in generate.dashboard_queries(_dashboard()))
    for metric in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting_by_reason",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:request_success_total",
        "wedgewatch_engine_state",
        "wedgewatch_engine_stalled_seconds",
        "wedgewatch_wedges_total",
        "wedgewatch_restarts_total",
        "wedgewatch_evidence_captures_total",
    ):
        assert metric in exprs, metric


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is missing")
def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """With the variables substituted, every query passes promtool's PromQL parser."""
    queries = generate.dashboard_queries(_dashboard())
    queries += [
        (f"variable {name}", re.sub(r"^label_values\((.*), \w+\)$", r"\1", v["definition"]))
        for name, v in _variables().items()
        if "definition" in v
    ]
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{n}", "expr": substitute(expr)}
                    for n, (_where, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules), encoding="utf-8")
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_substitute_replaces_variables_and_builtins() -> None:
    """`$var`, `${var}` and Grafana's interval builtins are all replaced."""
    expr = 'rate(x{job=~"$job", engine=~"${engine}"}[$__rate_interval])'
    assert substitute(expr, {"engine": "0"}) == 'rate(x{job=~".*", engine=~"0"}[1m])'


def test_alerting_provisioning_shape() -> None:
    """alerting.yaml is Grafana's apiVersion 1 with folder, interval and a B condition per rule."""
    alerting = yaml.safe_load((GRAFANA / "alerting.yaml").read_text(encoding="utf-8"))
    assert alerting["apiVersion"] == 1
    uids = []
    for group in alerting["groups"]:
        assert group["folder"] == "wedgewatch"
        assert group["interval"] == "1m"
        for rule in group["rules"]:
            uids.append(rule["uid"])
            query, condition = rule["data"]
            assert query["refId"] == "A"
            assert query["model"]["instant"] is True
            assert condition["datasourceUid"] == "__expr__"
            assert condition["model"] == {
                "refId": "B",
                "type": "math",
                "expression": "is_number($A)",
                "datasource": {"type": "__expr__", "uid": "__expr__"},
            }
    assert len(uids) == len(set(uids))
