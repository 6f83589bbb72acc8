"""The command line's JSON documents (`doctor --json`, `capture --json`, `check`'s UNKNOWN
errors) pass through one place that redacts them, whatever a finding or a failure quotes."""

from __future__ import annotations

import json

import pytest

from wedgewatch import cli


def test_a_document_is_redacted_where_it_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    planted = "pl4nted-pw-0123456789"
    cli._echo_json(
        {
            "failures": [f"metrics: refused by http://admin:{planted}@10.0.0.7:8000/metrics"],
            "findings": [{"message": f"argv: vllm serve --api-key {planted}"}],
            "token": planted,
        }
    )
    out = capsys.readouterr().out
    assert planted not in out
    document = json.loads(out)
    assert document["failures"][0].startswith("metrics: refused by http://")
    assert "10.0.0.7:8000/metrics" in document["failures"][0]
