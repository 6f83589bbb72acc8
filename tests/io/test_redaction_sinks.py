"""Values go to the sinks raw, and each sink redacts them in its one place.

Each test plants secrets in what a sink is handed (or in what a report reads), and greps
what comes out: it fails if that sink stops redacting.
"""

from __future__ import annotations

import json
from pathlib import Path

from report_bundles import make_bundle

from wedgewatch.core.restart.server_proof import prove_server
from wedgewatch.io.bundles import (
    BUILD_FILE,
    REMEDY_LOG,
    bundle_bytes,
    json_bytes,
    note_remedy,
    write_bundle_file,
)
from wedgewatch.io.procs import ProcessSelector
from wedgewatch.report.model import read_bundle
from wedgewatch.report.render import render_html, render_markdown, render_upstream

S = "PLANTEDSECRET"


def _build_with_secrets() -> dict[str, object]:
    """A `build.json` whose secrets only the rules for an argument vector and an environment
    read as such find: a number after `--api-key`, and names that hold `AUTH` or `KEY` but
    do not end in a secret-looking word."""
    return {
        "command_line": ["vllm", "serve", "m", "--api-key", 42424242, "--port", 8000],
        "engine_env": {
            "VLLM_AUTH_HEADER": S,
            "VLLM_KEY_MATERIAL": S,
            "VLLM_PLAIN": "kept",
        },
    }


def test_build_json_is_redacted_as_an_argv_and_an_environment_when_written() -> None:
    """The writer masks `build.json`'s command line word by word and its environment by
    name; what is not secret is kept."""
    written = json.loads(bundle_bytes(BUILD_FILE, json_bytes(_build_with_secrets())))
    text = json.dumps(written)
    assert S not in text
    assert "42424242" not in text
    assert written["command_line"] == ["vllm", "serve", "m", "--api-key", "***", "--port", "8000"]
    assert written["engine_env"] == {
        "VLLM_AUTH_HEADER": "***",
        "VLLM_KEY_MATERIAL": "***",
        "VLLM_PLAIN": "kept",
    }


def test_reports_show_an_old_unredacted_build_json_redacted(tmp_path: Path) -> None:
    """A report reads `build.json` through the writer's pass (its one place): no renderer
    masks again, and none of the three outputs shows a planted secret."""
    bundle = make_bundle(tmp_path / "evidence")
    build = json.loads((bundle / BUILD_FILE).read_text())
    build.update(_build_with_secrets())
    (bundle / BUILD_FILE).write_text(json.dumps(build))  # as an old wedgewatch wrote it
    model = read_bundle(bundle)
    for output in (render_html(model, None), render_markdown(model), render_upstream(model)):
        assert S not in output
        assert "42424242" not in output
        assert "VLLM_PLAIN" in output
        assert "--api-key ***" in output


def test_remedy_log_lines_pass_the_writer(tmp_path: Path) -> None:
    """`note_remedy` appends through the same writer pass: a URL credential, a secret flag
    and a secret-looking key are masked in `remedy.jsonl`."""
    bundle = tmp_path / "b"
    bundle.mkdir()
    write_bundle_file(bundle, "summary.json", json_bytes({"schema": 1}))
    record = {
        "detail": f"exec http://user:{S}@127.0.0.1/ --api-key {S} failed",
        "api_token": S,
        "at": float("nan"),
    }
    assert note_remedy(bundle, record) is None
    text = (bundle / REMEDY_LOG).read_text()
    assert S not in text
    assert json.loads(text)["at"] == "nan"


def test_a_selector_url_goes_to_the_summary_raw_and_is_redacted_by_the_writer() -> None:
    """`describe` hands the URL over raw; the bundle's summary, as written, holds no credential
    or secret-looking query value."""
    selector = ProcessSelector(url=f"http://user:{S}@127.0.0.1:8000/metrics?token={S}")
    assert S in selector.describe()
    written = bundle_bytes("summary.json", json_bytes({"selector": selector.describe()}))
    assert S not in written.decode()
    assert b"127.0.0.1:8000/metrics" in written


def test_an_unproven_title_is_redacted_before_it_is_cut() -> None:
    """The refusal quotes the root's title cut to 80 characters: redacted first, so a cut
    through `user:password@` keeps no part of the password (the refusal feeds the capture's
    failures, doctor's findings, restart and abort outcomes)."""
    # The cut at 80 falls inside the password: a text pass after the cut sees no `@`.
    title = "python serve.py --upstream http://user:" + S * 4 + "@10.0.0.1:9000/"
    refusal = prove_server([(7, title)], explicit=False, own_pids=())
    assert refusal is not None
    assert S[:6] not in refusal
    assert "http://***@10.0.0.1:9000/" in refusal
