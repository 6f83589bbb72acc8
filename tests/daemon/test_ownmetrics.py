"""wedgewatch's own metrics: the exposition is pinned by a golden file and checked by promtool."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from wedgewatch.core.detection.states import (
    SCRAPE_FAILURE_REASONS,
    CaptureFailureReason,
    CapturePhase,
)
from wedgewatch.daemon.ownmetrics import EngineSample, OwnMetrics, render

GOLDEN = Path(__file__).parent / "golden" / "ownmetrics.prom"
STATES = ("starting", "ok", "idle", "sleeping", "suspect", "wedged", "unreachable", "unknown")
FAMILIES = (
    "deferred_stall",
    "deferred_only_stall",
    "admission_stall",
    "progress_stall",
    "output_stall",
    "unreachable",
    "canary_stall",
)
REASONS = (
    "timeout",
    "refused",
    "http_status",
    "parse_error",
    "too_large",
    "connect_error",
    "too_many_engines",
)


def _metrics() -> tuple[CollectorRegistry, OwnMetrics]:
    registry = CollectorRegistry()
    metrics = OwnMetrics(
        registry,
        version="1.2.3",
        states=STATES,
        families=FAMILIES,
        scrape_failure_reasons=REASONS,
    )
    return registry, metrics


def _story(metrics: OwnMetrics) -> None:
    """A wedge story on two targets: one wedges, is captured, aborted, restarted; one stays
    healthy."""
    metrics.add_target("llama", state="starting", remedy="signal", budget_remaining=3)
    metrics.add_target("qwen", state="starting", remedy="none", budget_remaining=3)
    metrics.add_canary("qwen")
    metrics.observe_canary(
        "qwen", first_token_seconds=0.031, failure_reason=None, success_timestamp=1_699_999_990.0
    )
    metrics.observe_canary(
        "qwen", first_token_seconds=None, failure_reason="timeout", success_timestamp=None
    )
    metrics.mark_tick(1_700_000_000.0)
    metrics.observe_scrape("llama", duration_seconds=0.012, failure_reason=None)
    metrics.observe_scrape("qwen", duration_seconds=2.0, failure_reason="timeout")
    metrics.set_engines(
        "llama",
        "wedged",
        [
            EngineSample("meta-llama/Llama-3.1-8B", "0", "wedged", 95.5, 1_699_999_904.5),
            EngineSample("meta-llama/Llama-3.1-8B", "1", "ok", 0.0, 1_700_000_000.0),
        ],
    )
    metrics.set_engines("qwen", "unreachable", [])
    metrics.count_suspect("llama", "deferred_stall")
    metrics.count_wedge("llama", "deferred_stall")
    metrics.count_capture("llama", phase="suspect", duration_seconds=0.8)
    metrics.count_capture("llama", phase="wedged", duration_seconds=1.7)
    metrics.count_capture_failure("llama", "ptrace_denied")
    metrics.count_restart("llama", "signal")
    metrics.count_restart_failure("llama", "not_recovered")
    metrics.count_recovery("llama", "abort", "escalated")
    metrics.count_recovery("llama", "restart", "failed")
    metrics.set_restart_budget("llama", remaining=2, gave_up=False)
    metrics.set_restart_budget("qwen", remaining=0, gave_up=True)
    metrics.count_webhook_failure()


def _normalised(body: bytes) -> str:
    """The exposition as text (it holds no clock-dependent `_created` series)."""
    return body.decode()


def test_exposition_matches_golden_file() -> None:
    """The full exposition after a wedge story is byte-identical to the golden file."""
    registry, metrics = _metrics()
    _story(metrics)
    body, _ = render(registry)
    text = _normalised(body)
    if os.environ.get("WEDGEWATCH_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_exposition() -> None:
    """`promtool check metrics` finds no lint problem in wedgewatch's own exposition."""
    registry, metrics = _metrics()
    _story(metrics)
    body, _ = render(registry)
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_rejects_a_misnamed_counter() -> None:
    """The promtool check can fail: a counter without `_total` is reported."""
    body = b"# HELP wedgewatch_bad x\n# TYPE wedgewatch_bad counter\nwedgewatch_bad 1\n"
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert result.returncode != 0


def _samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body, _ = render(registry)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_engine_state_is_one_hot() -> None:
    """Exactly one state series of an engine is 1, and it follows the latest state."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="none", budget_remaining=3)
    metrics.set_engines("t", "suspect", [EngineSample("m", "0", "suspect", 12.0, None)])
    metrics.set_engines("t", "ok", [EngineSample("m", "0", "ok", 0.0, 5.0)])
    states = {
        dict(labels)["state"]: value
        for (name, labels), value in _samples(registry).items()
        if name == "wedgewatch_engine_state"
    }
    assert states == {s: (1.0 if s == "ok" else 0.0) for s in STATES}


def test_a_secret_in_the_model_name_never_reaches_the_metrics_page() -> None:
    """#21: the model_name label is the redacted form; the engine's series still follow it."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="none", budget_remaining=3)
    hostile = "m http://PLANTEDtok@h/?apikey=PLANTEDq"
    metrics.set_engines("t", "wedged", [EngineSample(hostile, "0", "wedged", 9.0, None)])
    names = {dict(labels).get("model_name") for _, labels in _samples(registry)}
    assert not any("PLANTED" in str(n) for n in names), names
    assert "m http://***@h/?apikey=***" in names, names
    metrics.set_engines("t", "ok", [])  # vanished: its series go, under the same label
    assert not any(dict(labels).get("model_name") for _, labels in _samples(registry))


def test_vanished_engine_loses_its_series() -> None:
    """An engine that is no longer reported has no state, stall or progress series left."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="none", budget_remaining=3)
    metrics.set_engines(
        "t",
        "ok",
        [EngineSample("m", "0", "ok", 0.0, 5.0), EngineSample("m", "1", "ok", 0.0, 5.0)],
    )
    metrics.set_engines("t", "ok", [EngineSample("m", "0", "ok", 0.0, 6.0)])
    engines = {
        dict(labels).get("engine")
        for (name, labels), _ in _samples(registry).items()
        if name.startswith("wedgewatch_engine_")
    }
    assert engines == {"0"}


def test_an_engine_that_comes_back_has_its_series_again_with_the_same_values() -> None:
    """Gauges are set only when their value changes: an engine whose series were removed
    gets them back when it returns, even with the values it had before it vanished."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="none", budget_remaining=3)
    both = [EngineSample("m", "0", "ok", 0.0, 5.0), EngineSample("m", "1", "suspect", 7.5, 5.0)]
    metrics.set_engines("t", "suspect", both)
    metrics.set_engines("t", "ok", both[:1])
    metrics.set_engines("t", "suspect", both)
    metrics.set_ready("t", True)
    metrics.set_ready("t", True)
    samples = _samples(registry)
    stalled = {
        dict(labels)["engine"]: value
        for (name, labels), value in samples.items()
        if name == "wedgewatch_engine_stalled_seconds"
    }
    assert stalled == {"0": 0.0, "1": 7.5}
    assert samples["wedgewatch_target_ready", frozenset({("target", "t")})] == 1.0


def test_unknown_progress_has_no_timestamp_series() -> None:
    """An engine that never showed progress exports no last-progress timestamp (not a fake 0)."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="none", budget_remaining=3)
    metrics.set_engines("t", "ok", [EngineSample("m", "0", "ok", 0.0, 5.0)])
    metrics.set_engines("t", "starting", [EngineSample("m", "0", "starting", 0.0, None)])
    names = {name for (name, _), _ in _samples(registry).items()}
    assert "wedgewatch_engine_last_progress_timestamp_seconds" not in names


def test_counters_start_at_zero_for_known_labels() -> None:
    """A new target's failure, wedge and restart counters exist at 0 before anything happens."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="signal", budget_remaining=3)
    samples = _samples(registry)
    assert (
        samples[
            ("wedgewatch_wedges_total", frozenset({("target", "t"), ("family", "deferred_stall")}))
        ]
        == 0
    )
    assert (
        samples[
            (
                "wedgewatch_scrape_failures_total",
                frozenset({("target", "t"), ("reason", "refused")}),
            )
        ]
        == 0
    )
    assert (
        samples[("wedgewatch_restarts_total", frozenset({("target", "t"), ("remedy", "signal")}))]
        == 0
    )


def test_two_registries_do_not_collide() -> None:
    """Two OwnMetrics in one process each own their registry (no global registration)."""
    first_registry, first = _metrics()
    second_registry, second = _metrics()
    first.add_target("a", state="starting", remedy="none", budget_remaining=1)
    second.add_target("b", state="starting", remedy="none", budget_remaining=1)
    targets = {
        dict(labels).get("target") for (name, labels), _ in _samples(second_registry).items()
    }
    assert "a" not in targets
    assert "b" in targets
    assert first_registry is not second_registry


@pytest.mark.parametrize("accept", ["", "application/openmetrics-text; version=1.0.0"])
def test_the_exposition_has_no_created_series(accept: str) -> None:
    """No `*_created` series in either format, while the counters and histograms remain."""
    registry, metrics = _metrics()
    _story(metrics)
    body, _ = render(registry, accept)
    text = body.decode()
    assert "_created" not in text
    assert "wedgewatch_wedges_total{" in text
    assert "wedgewatch_evidence_capture_duration_seconds_bucket{" in text
    # The registry itself still has them: only the exposition leaves them out.
    assert any(s.name.endswith("_created") for family in registry.collect() for s in family.samples)


def test_openmetrics_is_negotiated() -> None:
    """A scraper that asks for OpenMetrics gets it; a plain scrape gets text 0.0.4."""
    registry, metrics = _metrics()
    metrics.add_target("t", state="starting", remedy="none", budget_remaining=3)
    _, plain = render(registry, "")
    body, open_metrics = render(registry, "application/openmetrics-text; version=1.0.0")
    assert plain.startswith("text/plain; version=0.0.4")
    assert open_metrics.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_the_golden_story_uses_the_real_label_values() -> None:
    """The states, families and scrape failure reasons pinned here are the daemon's own."""
    from wedgewatch.core.detection.states import SCRAPE_FAILURE_REASONS, EngineState, Family

    assert tuple(EngineState) == STATES
    assert tuple(Family) == FAMILIES
    assert set(SCRAPE_FAILURE_REASONS) == set(REASONS)


DAEMON_DOC = Path(__file__).parents[2] / "docs" / "daemon.md"


@pytest.mark.parametrize(
    ("metric", "words"),
    [
        pytest.param("wedgewatch_scrape_failures_total", SCRAPE_FAILURE_REASONS, id="scrape"),
        pytest.param("wedgewatch_evidence_captures_total", tuple(CapturePhase), id="phase"),
        pytest.param(
            "wedgewatch_evidence_capture_failures_total", tuple(CaptureFailureReason), id="capture"
        ),
    ],
)
def test_the_metric_table_lists_each_closed_set_of_label_values(
    metric: str, words: tuple[str, ...]
) -> None:
    """docs/daemon.md names every label value of a closed set (from core/states), no other."""
    (row,) = [line for line in DAEMON_DOC.read_text().splitlines() if f"| `{metric}` |" in line]
    listed = set(re.findall(r"`([a-z_]+)`", row.rsplit("|", 2)[1]))
    assert listed == {str(word) for word in words}
