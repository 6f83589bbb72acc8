"""Hostile config files: 100,000 nested brackets (TOML, JSON and YAML alike) and a 100 MB
file make every command that reads a config exit 2 with one clear line, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wedgewatch.config.sources import MAX_CONFIG_BYTES

DEPTH = 100_000
CONTENTS = {
    "toml-arrays": "targets = " + "[" * DEPTH + "]" * DEPTH + "\n",
    "toml-inline-tables": "targets = " + "{a=" * DEPTH + "1" + "}" * DEPTH + "\n",
    "json": "[" * DEPTH + "]" * DEPTH + "\n",
    "yaml": "targets: " + "[" * DEPTH + "]" * DEPTH + "\n",
}
COMMANDS = {
    "config check": ["config", "check"],
    "config show": ["config", "show", "--json", "--config"],
    "run --config": ["run", "--listen-port", "0", "--config"],
}


def _wedgewatch(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "wedgewatch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def _assert_clear_usage_error(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert "RecursionError" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines[:5]
    assert says in lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", list(CONTENTS))
def test_deeply_nested_config_is_a_clear_error(tmp_path: Path, kind: str, command: str) -> None:
    """100,000 nested brackets: exit 2 and one line naming the file, never a traceback."""
    path = tmp_path / f"deep.{kind.split('-', maxsplit=1)[0]}"
    path.write_text(CONTENTS[kind])
    done = _wedgewatch([*COMMANDS[command], str(path)])
    _assert_clear_usage_error(done, f"config file {path}: ")


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_100_mb_config_is_refused_unread(tmp_path: Path, command: str) -> None:
    """A 100 MB file: exit 2 and one line saying it is too large."""
    path = tmp_path / "huge.toml"
    path.write_bytes(b"# a comment that never ends ")
    os.truncate(path, 100 * 1024 * 1024)  # sparse: the test writes 28 bytes
    done = _wedgewatch([*COMMANDS[command], str(path)])
    _assert_clear_usage_error(done, f"larger than {MAX_CONFIG_BYTES} bytes")


@pytest.mark.slow
def test_deeply_nested_json_in_the_environment_is_a_clear_error() -> None:
    """`WEDGEWATCH_PROFILES` (one JSON object) nested 60,000 deep (an environment string
    holds 128 KiB at most): exit 2 and one line, never a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    env["WEDGEWATCH_PROFILES"] = "[" * 60_000 + "]" * 60_000
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "config", "show", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    _assert_clear_usage_error(done, "nested too deeply")
