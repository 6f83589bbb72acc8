"""The entry point's probe fast path: strict parsing, cached settings, same answers as the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always

from wedgewatch import entry
from wedgewatch.check import settings as check_settings
from wedgewatch.check.settings import settings_key
from wedgewatch.core.detection.detect import DetectionPolicy
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.io.scrape_rules import ScrapeLimits

FIXTURES = Path(__file__).parents[1] / "fixtures"
ENTRY = str(Path(sys.executable).with_name("wedgewatch"))


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without WEDGEWATCH_* settings, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}, **extra}


@pytest.mark.parametrize(
    "args",
    [
        ["http://h:1", "--for=0", "--state-file=/s"],
        ["http://h:1", "--for", "0", "--state-file", "/s", "--critical-only", "--json"],
        ["--config=/c.toml", "http://h:1", "--state-file=/s", "--stall-after-seconds", "5"],
        ["http://h:1", "--state-file=/s", "--max-body-bytes=16MiB", "--log-level", "debug"],
    ],
)
def test_the_fast_path_takes_the_probe_invocations(args: list[str]) -> None:
    """Probe-mode invocations, in any spelling the CLI accepts, are parsed by the fast path."""
    parsed = entry.parse_probe_args(args)
    assert parsed is not None
    assert parsed.url == "http://h:1"
    assert parsed.state_file == Path("/s")


@pytest.mark.parametrize(
    "args",
    [
        ["http://h:1"],  # one-shot: no state file
        ["http://h:1", "--state-file=/s", "--help"],
        ["http://h:1", "--state-file=/s", "--bogus"],
        ["http://h:1", "--state-file=/s", "--for=-1"],
        ["http://h:1", "--state-file=/s", "--for=inf"],
        ["http://h:1", "--state-file=/s", "--for=x"],
        ["http://h:1", "--state-file=/s", "--json", "--json"],
        ["http://h:1", "--state-file=/s", "--for=1", "--for=2"],
        ["http://h:1", "http://h:2", "--state-file=/s"],
        ["http://h:1", "--state-file=/s", "--stall-after-seconds=soon"],
        ["http://h:1", "--state-file=/s", "-h"],
        ["http://h:1", "--state-file"],
        ["http://h:1", "--state-file=/s", "--config="],
    ],
)
def test_anything_else_goes_to_the_full_cli(args: list[str]) -> None:
    """Help, unknown or repeated options and bad values are the full CLI's to explain."""
    assert entry.parse_probe_args(args) is None


def test_the_fast_path_runs_only_with_settings_the_cli_validated(tmp_path: Path) -> None:
    """No cache: None (full CLI). After a CLI run: same answer from the fast path, no typer."""
    state = tmp_path / "probe.json"
    body = (FIXTURES / "idle.prom").read_bytes()
    with ScriptedServer(always(Reply(body=body))) as server:
        args = [server.url, "--for=0", f"--state-file={state}", "--json"]
        assert entry.fast_check(args) is None
        full = subprocess.run(
            [ENTRY, "check", *args], capture_output=True, text=True, env=clean_env(), check=False
        )
        assert full.returncode == 0, full.stderr
        assert json.loads(full.stdout)["status"] == "idle"
        cache = json.loads(state.read_text())["settings"]
        assert cache["values"]["policy"]["stall_after_seconds"] == 60.0
        fast = subprocess.run(
            [sys.executable, "-X", "importtime", ENTRY, "check", *args],
            capture_output=True, text=True, env=clean_env(), check=False,
        )  # fmt: skip
        assert fast.returncode == 0
        assert json.loads(fast.stdout) == json.loads(full.stdout)
        imported = {line.rsplit("|", 1)[-1].strip() for line in fast.stderr.splitlines()}
        assert "wedgewatch.check" in imported
        assert not imported & {"typer", "pydantic", "rich", "click", "structlog"}, imported
        assert "prometheus_client" not in imported


def test_a_url_with_a_secret_is_never_cached_in_the_state_file(tmp_path: Path) -> None:
    """#21: the settings cache would keep the raw URL: with a secret in it there is none (the
    full CLI runs each time), and an old file's raw URL is not served from the cache."""
    state = tmp_path / "probe.json"
    body = (FIXTURES / "idle.prom").read_bytes()
    with ScriptedServer(always(Reply(body=body))) as server:
        url = server.url.replace("http://", "http://PLANTEDtok@") + "/?apikey=PLANTEDq"
        args = [url, "--for=0", f"--state-file={state}"]
        full = subprocess.run(
            [ENTRY, "check", *args], capture_output=True, text=True, env=clean_env(), check=False
        )
        assert full.returncode == 0, full.stdout + full.stderr
        assert "PLANTED" not in state.read_text()
        assert "settings" not in json.loads(state.read_text())
        assert entry.fast_check(args) is None
    key = settings_key(url, None, {}, {})
    assert key is not None
    state.write_text(json.dumps({"settings": {"key": key, "metrics_url": url, "values": {}}}))
    assert check_settings.cached_settings(state, key) is None


def test_a_changed_input_is_validated_again_never_served_from_the_cache(tmp_path: Path) -> None:
    """Config bytes, WEDGEWATCH_* variables and flags are in the key: a change misses."""
    config = tmp_path / "w.toml"
    config.write_text("stall_after_seconds = 30\n")
    state = tmp_path / "probe.json"
    flags: dict[str, object] = {"hang_after_seconds": 40.0}
    key = settings_key("http://h:1", config, {}, flags)
    assert key is not None
    settings = check_settings.CheckSettings.from_json(
        check_settings.CheckSettings(
            interval_seconds=1.0,
            policy=DetectionPolicy(),
            limits=ScrapeLimits(5.0, 1000),
            log_level="info",
            restart=RestartPolicy(),
            probe_respects_budget=True,
        ).to_json()
    )
    assert settings is not None
    state.write_text(
        json.dumps({"settings": {"key": key, "metrics_url": "u", "values": settings.to_json()}})
    )
    assert check_settings.cached_settings(state, key) == ("u", settings)
    config.write_text("stall_after_seconds = 31\n")
    assert settings_key("http://h:1", config, {}, flags) != key
    config.write_text("stall_after_seconds = 30\n")
    assert settings_key("http://h:1", config, {}, flags) == key
    assert settings_key("http://h:1", config, {"WEDGEWATCH_X": "1"}, flags) != key
    assert settings_key("http://h:1", config, {"OTHER": "1"}, flags) == key
    assert settings_key("http://h:1", config, {}, {"hang_after_seconds": 41.0}) != key
    assert settings_key("http://h:2", config, {}, flags) != key
    assert settings_key("http://h:1", tmp_path / "missing.toml", {}, flags) is None
    assert check_settings.CheckSettings.from_json({"interval_seconds": 1}) is None


def test_the_fast_parser_knows_exactly_the_settings_check_takes() -> None:
    """Every setting flag of `check` is parsed by the fast path, and no other."""
    assert {name for name, _ in entry._SETTING_FLAGS.values()} == set(
        check_settings.CHECK_FLAG_SETTINGS
    )
