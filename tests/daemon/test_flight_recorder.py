"""The flight recorder's byte count: each entry as the JSON line an evidence bundle writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wedgewatch.daemon.report import FlightRecorder, json_line_size
from wedgewatch.io.bundles import history_lines


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param({"timestamp": 1.5, "state": "ok", "engines": []}, id="no-engines"),
        pytest.param(
            {"b": 1, "a": [{"z": None, "y": True, "x": 0.1 + 0.2}], "c": {"q": '"\\\n\t'}},
            id="unsorted-escaped",
        ),
        pytest.param({"model_name": "modèle-✓-\U0001f600", "value": 1e300}, id="non-ascii"),
        pytest.param({"v": float("nan"), "w": [float("-inf")], "x": {"y": 2.0}}, id="non-finite"),
        pytest.param({"path": Path("/tmp/x"), "n": 3}, id="not-json"),
    ],
)
def test_each_entry_counts_the_bytes_of_its_bundle_line(entry: dict[str, Any]) -> None:
    """An entry counts what `history_lines` writes for it, whatever order its keys are in and
    whatever it holds (escapes, non-ASCII, NaN, values json does not know)."""
    assert json_line_size(entry) == len(history_lines((entry,)))
    recorder = FlightRecorder(max_entries=10, max_bytes=10**6)
    recorder.append(entry)
    recorder.append(entry)
    assert recorder.size_bytes == len(history_lines(recorder.entries()))
