"""`wedgewatch run` validates its configuration in a child process (`config.child`): the same
configuration, or the same problems, as validating in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from wedgewatch.config import ConfigError, load_config, to_plain
from wedgewatch.config.child import revalidate, validate
from wedgewatch.config.plain import PlainConfig


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_the_child_hands_back_the_plain_configuration(tmp_path: Path) -> None:
    """A valid file and flags: the plain copy of what `load_config` makes of them."""
    config = _write(
        tmp_path / "w.toml",
        'interval_seconds = 2.0\n[[targets]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n',
    )
    got = revalidate(["run", "--config", str(config), "--stall-after-seconds", "120"])
    assert isinstance(got, PlainConfig)
    expected = load_config(config_file=config, flags={"stall_after_seconds": 120.0}).config
    assert got == to_plain(expected)


def test_the_child_hands_back_the_problems_of_a_bad_configuration(tmp_path: Path) -> None:
    """A bad file: ConfigError with the messages `load_config` gives, nothing printed."""
    config = _write(tmp_path / "w.toml", "interval_seconds = -1\nstall_after_secs = 3\n")
    with pytest.raises(ConfigError) as raised:
        revalidate(["run", "--config", str(config)])
    with pytest.raises(ConfigError) as here:
        load_config(config_file=config)
    assert raised.value.messages == here.value.messages
    assert "did you mean 'stall_after_seconds'?" in raised.value.messages[0]


def test_a_usage_error_in_a_reload_is_a_config_error() -> None:
    """A command line the CLI refuses (never at a reload in practice): its last line."""
    with pytest.raises(ConfigError, match=r"exit 2\): .*No such option"):
        revalidate(["run", "--no-such-option"])


def test_help_and_bad_settings_come_from_the_child_with_its_exit_code(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """At start-up the child prints the help or the problems itself; its exit code is kept."""
    assert validate(["run", "--help"]) == 0
    assert "run [OPTIONS]" in capfd.readouterr().out
    config = _write(tmp_path / "w.toml", "interval_seconds = -1\n")
    assert validate(["run", "--config", str(config)]) == 2
    assert "interval_seconds = -1" in capfd.readouterr().err
