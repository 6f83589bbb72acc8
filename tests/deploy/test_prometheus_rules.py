"""The Prometheus rules: promtool checks and unit tests, their copies, and their runbook links."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.prometheus_server import duration_seconds, scale_expr, scale_rules
from deploy.repo import BASE, DEPLOY, GRAFANA, RULE_TESTS, RULES, RUNBOOK, load_generate

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is missing")

generate = load_generate()
RULE_TEST_FILES = sorted(RULE_TESTS.glob("*.yml"))


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, check=False
    )


def _rules() -> dict[str, Any]:
    rules: dict[str, Any] = generate.load_rules(RULES.read_text(encoding="utf-8"))
    return rules


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in _rules()["groups"] for rule in group["rules"] if "alert" in rule]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation gone, dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _runbook_anchors() -> set[str]:
    text = RUNBOOK.read_text(encoding="utf-8")
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, re.M)}


# -- promtool --------------------------------------------------------------------------


def test_rules_file_passes_promtool_check() -> None:
    """`promtool check rules` accepts the plain rules file."""
    done = _promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_rule_spec_passes_promtool_check(tmp_path: Path) -> None:
    """The PrometheusRule's spec, as a rules file, passes `promtool check rules` too."""
    manifest = yaml.safe_load((BASE / "prometheusrule.yaml").read_text(encoding="utf-8"))
    path = tmp_path / "spec.yml"
    path.write_text(yaml.safe_dump(manifest["spec"]), encoding="utf-8")
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("test_file", RULE_TEST_FILES, ids=lambda p: p.name)
def test_rule_unit_tests_pass(test_file: Path) -> None:
    """`promtool test rules` passes every unit test file."""
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_unit_tests_fire_and_clear_every_alert() -> None:
    """Every alert has a unit test where it fires and one where it must not."""
    fired: set[str] = set()
    silent: set[str] = set()
    for test_file in RULE_TEST_FILES:
        for case in yaml.safe_load(test_file.read_text(encoding="utf-8"))["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {alert["alert"] for alert in _alerts()}
    assert names - fired == set()
    assert names - silent == set()


@pytest.mark.parametrize(
    ("clause", "count", "failing_test"),
    [
        (
            "          unless ignoring (sleep_state) "
            'vllm:engine_sleep_state{sleep_state="awake"} == 0\n',
            3,
            "a sleeping engine",
        ),
        (
            "          unless ignoring (reason) max_over_time("
            'vllm:num_requests_waiting_by_reason{reason="capacity"}[5m]) == 0\n',
            1,
            "a streaming-input session paused",
        ),
    ],
    ids=["sleeping-exclusion", "deferred-only-exclusion"],
)
def test_unit_tests_can_fail(tmp_path: Path, clause: str, count: int, failing_test: str) -> None:
    """Without an exclusion clause the unit tests fail: they test the rules."""
    original = RULES.read_text(encoding="utf-8")
    assert original.count(clause) == count
    (tmp_path / "rules.yml").write_text(original.replace(clause, ""), encoding="utf-8")
    (tmp_path / "tests").mkdir()
    copy = tmp_path / "tests" / "vllm-wedge.yml"
    copy.write_text((RULE_TESTS / "vllm-wedge.yml").read_text(encoding="utf-8"), encoding="utf-8")
    done = _promtool("test", "rules", str(copy))
    assert done.returncode != 0
    assert failing_test in done.stdout + done.stderr


# -- conventions -----------------------------------------------------------------------


@pytest.mark.parametrize("alert", _alerts(), ids=lambda a: a["alert"])
def test_alert_has_severity_summary_description_and_runbook(alert: dict[str, Any]) -> None:
    """Each alert carries a severity and a summary, description and runbook text (no
    repository-relative link, which would be dead in a pager)."""
    assert alert["labels"]["severity"] in ("critical", "warning")
    assert set(alert["annotations"]) == {"summary", "description", "runbook"}
    assert len(alert["annotations"]["runbook"]) > 60
    assert "{{" not in alert["annotations"]["runbook"]


def test_every_alert_has_its_runbook_section() -> None:
    """Every alert's anchor (the link `--runbook-base` writes) is a heading of docs/runbook.md."""
    anchors = _runbook_anchors()
    for alert in _alerts():
        anchor = generate.runbook_url("https://x.example", alert["alert"]).split("#", 1)[1]
        assert anchor in anchors, f"{alert['alert']}: no heading for #{anchor} in docs/runbook.md"


def test_shipped_files_carry_no_relative_runbook_link() -> None:
    """No file under deploy/ points a pager at a repository-relative path."""
    for path in (RULES, BASE / "prometheusrule.yaml", GRAFANA / "alerting.yaml"):
        assert not re.search(r"^\s*runbook_url:", path.read_text(encoding="utf-8"), re.M), path


def test_observability_doc_describes_every_alert() -> None:
    """docs/observability.md names every alert of the rules file."""
    text = (RUNBOOK.parent / "observability.md").read_text(encoding="utf-8")
    missing = [a["alert"] for a in _alerts() if f"`{a['alert']}`" not in text]
    assert missing == []


def test_github_anchor_follows_githubs_rules() -> None:
    """Anchors are lower case without punctuation, spaces become dashes."""
    assert github_anchor("VLLMEngineWedged") == "vllmenginewedged"
    assert github_anchor("Before you restart: capture!") == "before-you-restart-capture"


# -- the copies ------------------------------------------------------------------------


def test_generated_files_are_up_to_date() -> None:
    """prometheusrule.yaml, alerting.yaml, dashboard.json and the docs table match generate.py."""
    stale = generate.stale(generate.repository_outputs())
    assert stale == [], "run: .venv/bin/python deploy/generate.py"


def test_prometheus_rule_carries_the_same_groups() -> None:
    """The PrometheusRule's groups equal the plain rules file's, rule by rule."""
    manifest = yaml.safe_load((BASE / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert manifest["spec"]["groups"] == _rules()["groups"]


def test_generate_check_reports_a_stale_copy() -> None:
    """`generate.py --check` passes on the repository; a differing copy counts as stale."""
    assert generate.main(["--check"]) == 0
    outputs = generate.repository_outputs()
    changed = {path: text + "# edited by hand\n" for path, text in outputs.items()}
    assert generate.stale(changed) == list(changed)


def test_generate_writes_copies_with_absolute_runbook_links(tmp_path: Path) -> None:
    """`--out --runbook-base` writes rule copies whose links point under the given base."""
    base = "https://git.example.com/ops/wedgewatch/blob/v0.1.0/"
    done = subprocess.run(
        [
            sys.executable,
            str(DEPLOY / "generate.py"),
            "--out",
            str(tmp_path),
            "--runbook-base",
            base,
            "--datasource-uid",
            "prom-main",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rules = yaml.safe_load((tmp_path / "rules.yml").read_text(encoding="utf-8"))
    urls = [
        rule["annotations"]["runbook_url"]
        for group in rules["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    assert len(urls) == len(_alerts())
    assert all(url.startswith(base + "docs/runbook.md#") for url in urls)
    anchors = _runbook_anchors()
    assert all(url.split("#", 1)[1] in anchors for url in urls)
    manifest = yaml.safe_load((tmp_path / "prometheusrule.yaml").read_text(encoding="utf-8"))
    assert manifest["spec"]["groups"] == rules["groups"]
    alerting = yaml.safe_load((tmp_path / "alerting.yaml").read_text(encoding="utf-8"))
    grafana_rules = [r for g in alerting["groups"] for r in g["rules"]]
    assert {r["data"][0]["datasourceUid"] for r in grafana_rules} == {"prom-main"}
    assert all(r["annotations"]["runbook_url"].startswith(base) for r in grafana_rules)
    assert _promtool("check", "rules", str(tmp_path / "rules.yml")).returncode == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--runbook-base", "https://x.example/w"], "give --out DIR"),
        (["--out", "/tmp/x", "--runbook-base", "docs/"], "must be an http(s) URL"),
    ],
    ids=["base-without-out", "relative-base"],
)
def test_generate_rejects_bad_options(args: list[str], message: str) -> None:
    """Copies need --out, and the runbook base must be a URL; both say so."""
    done = subprocess.run(
        [sys.executable, str(DEPLOY / "generate.py"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert message in done.stderr


# -- Grafana alerting equivalence --------------------------------------------------------


def _grafana_rules() -> list[dict[str, Any]]:
    alerting = yaml.safe_load((GRAFANA / "alerting.yaml").read_text(encoding="utf-8"))
    return [rule for group in alerting["groups"] for rule in group["rules"]]


def test_grafana_alerting_mirrors_every_alert() -> None:
    """Grafana has one rule per Prometheus alert, with the same for, labels and links."""
    grafana = {rule["title"]: rule for rule in _grafana_rules()}
    assert set(grafana) == {alert["alert"] for alert in _alerts()}
    for alert in _alerts():
        rule = grafana[alert["alert"]]
        assert rule["for"] == alert.get("for", "0s")
        assert rule["labels"] == alert["labels"]
        assert rule["annotations"]["runbook"] == alert["annotations"]["runbook"]
        assert rule["annotations"]["summary"] == alert["annotations"]["summary"]
        assert "$value " not in rule["annotations"]["description"]
        assert rule["condition"] == "B"
        assert rule["noDataState"] == "OK"
        assert rule["execErrState"] == "Error"


def test_grafana_queries_need_no_recording_rules() -> None:
    """Grafana's queries inline the recording rules (Grafana may not have them loaded)."""
    records = generate.recording_rules(_rules())
    for rule in _grafana_rules():
        expr = rule["data"][0]["model"]["expr"]
        for name in records:
            assert name not in expr, f"{rule['title']} still uses {name}"


def test_grafana_provisioning_survives_env_interpolation() -> None:
    """No `$` where Grafana interpolates environment variables (labels, uids, braced vars)."""
    for rule in _grafana_rules():
        assert "$" not in yaml.safe_dump(rule["labels"])
        assert "$" not in rule["data"][0]["datasourceUid"]
        assert "${" not in yaml.safe_dump(rule["annotations"])
        assert re.fullmatch(r"[a-z0-9-]{1,40}", rule["uid"])


def test_grafana_queries_behave_like_the_prometheus_alerts(tmp_path: Path) -> None:
    """The alert unit tests pass unchanged with the Grafana queries as the alert expressions."""
    grafana = {rule["title"]: rule for rule in _grafana_rules()}
    groups = []
    for group in _rules()["groups"]:
        alerts = []
        for rule in group["rules"]:
            if "alert" not in rule:
                continue
            copy = dict(rule)
            copy["expr"] = grafana[rule["alert"]]["data"][0]["model"]["expr"]
            alerts.append(copy)
        groups.append({"name": group["name"], "rules": alerts})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    (tmp_path / "tests").mkdir()
    for test_file in RULE_TEST_FILES:
        tests = yaml.safe_load(test_file.read_text(encoding="utf-8"))
        for case in tests["tests"]:
            case.pop("promql_expr_test", None)  # recording rules do not exist here
        copy_path = tmp_path / "tests" / test_file.name
        copy_path.write_text(yaml.safe_dump(tests), encoding="utf-8")
        done = _promtool("test", "rules", str(copy_path))
        assert done.returncode == 0, done.stdout + done.stderr


# -- time scaling for the end-to-end test ------------------------------------------------


def test_scaled_rules_keep_their_relations() -> None:
    """Scaling divides every window, offset and `for:` alike: 5m becomes 10s, 1h becomes 120s."""
    expr = 'increase(x{a=~"[0-9]+"}[5m]) > 0 unless y offset 1h and z[10m:30s]'
    scaled = 'increase(x{a=~"[0-9]+"}[10s]) > 0 unless y offset 120s and z[20s:1s]'
    assert scale_expr(expr, 30) == scaled
    assert duration_seconds("1h30m") == 5400
    rules = scale_rules(_rules(), 30)
    fors = {r["alert"]: r.get("for") for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert fors["VLLMEngineWedged"] == "2s"
    assert fors["WedgeWatchTargetUnreachable"] == "60s"
    scaled_text = yaml.safe_dump(rules)
    assert "[5m]" not in scaled_text
    assert "offset 1h" not in scaled_text
