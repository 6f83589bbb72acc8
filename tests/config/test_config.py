"""The one config model: sources and their order, provenance, messages, narrowing, docs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pydantic
import pytest

from wedgewatch import config as config_module
from wedgewatch.config import (
    SECTIONS,
    SETTINGS,
    Config,
    ConfigError,
    LoadedConfig,
    Target,
    default_target_name,
    load_config,
    metrics_url_of,
    render_reference,
    render_table,
    render_toml,
)
from wedgewatch.core.detection.canary import CanaryPolicy
from wedgewatch.core.detection.detect import DetectionPolicy
from wedgewatch.core.detection.states import THRESHOLD_SETTING, THRESHOLD_SETTINGS
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.io.scrape_rules import ScrapeLimits
from wedgewatch.vllm.signals import DEFAULT_MAX_ENGINES

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "wedgewatch.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def errors_of(**kwargs: object) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        load_config(**kwargs)  # type: ignore[arg-type]
    return caught.value.messages


# -- the model ---------------------------------------------------------------------------


def test_defaults_load_from_nothing() -> None:
    """With no file, environment or flags every value is its documented default."""
    loaded = load_config()
    assert loaded.config == Config()
    assert set(loaded.sources.values()) == {"default"}
    assert loaded.config.stall_after_seconds == 60
    assert loaded.config.startup_timeout_seconds == 900
    assert loaded.config.max_body_bytes == 16 * 1024 * 1024


def test_every_field_is_documented_in_a_known_section() -> None:
    """Every field has a description and one of the documented sections."""
    for name, field in Config.model_fields.items():
        assert field.description, name
        assert SETTINGS[name].section in SECTIONS, name


def test_config_is_frozen() -> None:
    """A loaded config cannot be changed afterwards."""
    config = Config()
    with pytest.raises(pydantic.ValidationError):
        config.stall_after_seconds = 1


def test_spellings_are_derived_from_the_field_name() -> None:
    """Field, TOML key, environment variable and flag are one name in four spellings."""
    setting = SETTINGS["stall_after_seconds"]
    assert setting.env == "WEDGEWATCH_STALL_AFTER_SECONDS"
    assert setting.flag == "--stall-after-seconds"
    assert SETTINGS["targets"].flag == "--target"
    assert SETTINGS["webhook_urls"].flag == "--webhook-url"


# -- sources and provenance --------------------------------------------------------------


def test_file_env_and_flags_apply_in_order_and_are_recorded(tmp_path: Path) -> None:
    """Flags beat the environment, which beats the file, which beats the defaults."""
    path = write(
        tmp_path,
        "stall_after_seconds = 10\nhang_after_seconds = 20\nunreachable_after_seconds = 25\n",
    )
    loaded = load_config(
        config_file=path,
        environ={
            "WEDGEWATCH_HANG_AFTER_SECONDS": "30",
            "WEDGEWATCH_UNREACHABLE_AFTER_SECONDS": "35",
        },
        flags={"unreachable_after_seconds": 40.0, "interval_seconds": None},
    )
    config = loaded.config
    assert (config.stall_after_seconds, config.hang_after_seconds) == (10, 30)
    assert config.unreachable_after_seconds == 40
    assert loaded.sources["stall_after_seconds"] == f"file:{path}"
    assert loaded.sources["hang_after_seconds"] == "env:WEDGEWATCH_HANG_AFTER_SECONDS"
    assert loaded.sources["unreachable_after_seconds"] == "flag:--unreachable-after-seconds"
    assert loaded.sources["interval_seconds"] == "default"


def test_config_file_can_come_from_the_environment(tmp_path: Path) -> None:
    """WEDGEWATCH_CONFIG names the file when --config is not given."""
    path = write(tmp_path, "listen_port = 9400\n")
    loaded = load_config(environ={"WEDGEWATCH_CONFIG": str(path)})
    assert loaded.config.listen_port == 9400
    assert loaded.sources["listen_port"] == f"file:{path}"


def test_environment_strings_are_converted_per_field() -> None:
    """Booleans, sizes, lists and commands are read from their environment forms."""
    config = load_config(
        environ={
            "WEDGEWATCH_CAPTURE_LOCALS": "true",
            "WEDGEWATCH_MAX_BODY_BYTES": "32MiB",
            "WEDGEWATCH_WEBHOOK_URLS": "http://a.example/hook, https://b.example/x",
            "WEDGEWATCH_REMEDY": "exec",
            "WEDGEWATCH_EXEC_COMMAND": "systemctl restart 'vllm server.service'",
            "WEDGEWATCH_TARGETS": "qwen=http://127.0.0.1:8000,http://10.0.0.2:8001/metrics",
        }
    ).config
    assert config.capture_locals is True
    assert config.max_body_bytes == 32 * 1024 * 1024
    assert config.webhook_urls == ("http://a.example/hook", "https://b.example/x")
    assert config.exec_command == ("systemctl", "restart", "vllm server.service")
    assert [(t.name, t.metrics_url) for t in config.targets] == [
        ("qwen", "http://127.0.0.1:8000/metrics"),
        ("10.0.0.2:8001", "http://10.0.0.2:8001/metrics"),
    ]


def test_unrelated_environment_is_ignored() -> None:
    """Variables without the WEDGEWATCH_ prefix are none of wedgewatch's business."""
    assert load_config(environ={"PATH": "/bin", "STALL_AFTER_SECONDS": "x"}).config == Config()


# -- unknown keys and bad values ------------------------------------------------------------


def test_unknown_file_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    """A misspelt TOML key is an error naming it, the file, and the closest known key."""
    path = write(tmp_path, "stall_after_second = 30\n")
    (message,) = errors_of(config_file=path)
    assert message == (
        f"config file {path}: unknown setting 'stall_after_second'; "
        "did you mean 'stall_after_seconds'?"
    )


def test_unknown_environment_variable_is_named_with_a_suggestion() -> None:
    """A misspelt WEDGEWATCH_ variable is an error naming it and the closest known one."""
    (message,) = errors_of(environ={"WEDGEWATCH_STAL_AFTER_SECONDS": "30"})
    assert "WEDGEWATCH_STAL_AFTER_SECONDS is not a wedgewatch setting" in message
    assert "did you mean 'WEDGEWATCH_STALL_AFTER_SECONDS'?" in message


def test_unknown_key_inside_a_target_table_is_named(tmp_path: Path) -> None:
    """A misspelt key in a [[targets]] table names the target and suggests the key."""
    path = write(tmp_path, '[[targets]]\nurl = "http://127.0.0.1:8000"\npidfile = "/run/v.pid"\n')
    (message,) = errors_of(config_file=path)
    assert message.startswith("targets[0]: unknown key 'pidfile'; did you mean 'pid_file'?")


def test_bad_value_names_field_value_source_and_rule() -> None:
    """A negative threshold from the environment is reported with everything needed to fix it."""
    (message,) = errors_of(environ={"WEDGEWATCH_STALL_AFTER_SECONDS": "-5"})
    assert message == (
        "stall_after_seconds = '-5' (from environment WEDGEWATCH_STALL_AFTER_SECONDS): "
        "must be greater than 0"
    )


def test_every_bad_value_is_reported_at_once(tmp_path: Path) -> None:
    """Two bad values give two messages, one per field."""
    path = write(tmp_path, 'interval_seconds = 0\nlog_level = "loud"\n')
    messages = errors_of(config_file=path)
    assert len(messages) == 2
    assert messages[0].startswith(f"interval_seconds = 0 (from config file {path}): must be")
    assert messages[1].startswith("log_level = 'loud'")
    assert "'debug', 'info', 'warning' or 'error'" in messages[1]


def test_wrong_type_in_file_is_reported(tmp_path: Path) -> None:
    """A string where a number belongs names the field and the expected type."""
    path = write(tmp_path, 'hang_after_seconds = "two minutes"\n')
    (message,) = errors_of(config_file=path)
    assert message.startswith("hang_after_seconds = 'two minutes' (from config file")
    assert "must be a valid number" in message


def test_flag_value_names_the_flag() -> None:
    """A bad flag value says it came from that flag."""
    (message,) = errors_of(flags={"listen_port": 70000})
    assert (
        message
        == "listen_port = 70000 (from flag --listen-port): must be less than or equal to 65535"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("stall_after_seconds = \n", "not valid TOML", id="syntax"),
        pytest.param("\xff\xfe", "cannot be read", id="not-utf8"),
    ],
)
def test_unreadable_file_is_reported(tmp_path: Path, text: str, expected: str) -> None:
    """A file that is not TOML is reported with its path and the reason."""
    path = tmp_path / "bad.toml"
    path.write_bytes(text.encode("latin-1"))
    (message,) = errors_of(config_file=path)
    assert message.startswith(f"config file {path}: {expected}")


def test_missing_file_is_reported(tmp_path: Path) -> None:
    """A config file that does not exist is one clear message."""
    (message,) = errors_of(config_file=tmp_path / "nope.toml")
    assert message == f"config file {tmp_path / 'nope.toml'}: no such file"


# -- cross-field rules ------------------------------------------------------------------


def test_exec_remedy_needs_a_command() -> None:
    """remedy = "exec" without exec_command names exec_command and the rule."""
    (message,) = errors_of(flags={"remedy": "exec"})
    assert message == 'exec_command = () (from default): must not be empty when remedy = "exec"'


def test_backoff_cap_must_not_be_below_the_backoff() -> None:
    """restart_backoff_max_seconds below restart_backoff_seconds is refused."""
    (message,) = errors_of(
        flags={"restart_backoff_seconds": 100.0, "restart_backoff_max_seconds": 50.0}
    )
    assert message.startswith("restart_backoff_max_seconds = 50.0 (from flag")
    assert "must be at least restart_backoff_seconds (100.0)" in message


def test_thresholds_must_cover_one_interval() -> None:
    """A stall threshold shorter than the scrape interval cannot be observed and is refused."""
    (message,) = errors_of(flags={"interval_seconds": 10.0, "unreachable_after_seconds": 5.0})
    assert message.startswith("unreachable_after_seconds = 5.0 (from flag")
    assert "must be at least interval_seconds (10.0)" in message


def test_target_names_must_be_unique() -> None:
    """Two targets with one name are refused, naming the name."""
    (message,) = errors_of(flags={"targets": ("a=http://h:1", "a=http://h:2")})
    assert message.startswith("targets = 'a'")
    assert "unique" in message


# -- targets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "metrics_url"),
    [
        pytest.param("http://127.0.0.1:8000", "http://127.0.0.1:8000/metrics", id="base"),
        pytest.param("http://127.0.0.1:8000/", "http://127.0.0.1:8000/metrics", id="slash"),
        pytest.param("http://h:8000/metrics", "http://h:8000/metrics", id="metrics"),
        pytest.param("http://h:8000/metrics/", "http://h:8000/metrics", id="metrics-slash"),
        pytest.param("https://proxy/vllm/", "https://proxy/vllm/metrics", id="prefix"),
        pytest.param("http://[::1]:8000", "http://[::1]:8000/metrics", id="ipv6"),
    ],
)
def test_metrics_url_normalisation(url: str, metrics_url: str) -> None:
    """A base URL gets /metrics; a /metrics URL is kept; a path prefix is kept."""
    assert metrics_url_of(url) == metrics_url


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        pytest.param("ftp://h/metrics", "must start with http:// or https://", id="scheme"),
        pytest.param("127.0.0.1:8000", "must start with http:// or https://", id="no-scheme"),
        pytest.param("http:///metrics", "must name a host", id="no-host"),
        pytest.param("http://h:99999", "is not a valid URL", id="bad-port"),
    ],
)
def test_bad_target_urls_are_refused(url: str, rule: str) -> None:
    """A URL wedgewatch cannot scrape is refused with the rule it breaks."""
    (message,) = errors_of(flags={"targets": (url,)})
    assert message.startswith(f"targets[0].url = {url!r} (from flag --target): {rule}")


def test_target_default_names() -> None:
    """A target without a name is named host:port, with the scheme's default port."""
    assert default_target_name("http://10.1.2.3:8000/metrics") == "10.1.2.3:8000"
    assert default_target_name("https://vllm.internal") == "vllm.internal:443"
    assert default_target_name("http://[::1]:8000") == "[::1]:8000"


def test_targets_from_toml_tables_and_strings(tmp_path: Path) -> None:
    """[[targets]] tables and name=url strings both work in TOML."""
    path = write(
        tmp_path,
        'targets = ["a=http://127.0.0.1:8000", {url = "http://127.0.0.1:8001", pid = 42}]\n',
    )
    targets = load_config(config_file=path).config.targets
    assert targets[0] == Target(name="a", url="http://127.0.0.1:8000")
    assert targets[1].name == "127.0.0.1:8001"
    assert targets[1].pid == 42


def test_target_spec_with_query_is_not_split_as_a_name() -> None:
    """A bare URL whose query holds '=' is a URL, not name=url."""
    target = Target.model_validate("http://h:8000/metrics?x=1")
    assert target.url == "http://h:8000/metrics?x=1"
    assert target.name == "h:8000"


# -- narrowing ---------------------------------------------------------------------------


def test_policy_and_scrape_limits_are_narrowed_from_the_config() -> None:
    """Components receive their own slice of the configuration, with the same values."""
    config = load_config(
        flags={"stall_after_seconds": 7.0, "scrape_timeout_seconds": 2.0, "max_body_bytes": "1MiB"}
    ).config
    assert config.detection_policy() == DetectionPolicy(
        stall_after_seconds=7.0,
        hang_after_seconds=120.0,
        output_stall_after_seconds=300.0,
        unreachable_after_seconds=30.0,
        startup_timeout_seconds=900.0,
    )
    assert config.scrape_limits() == ScrapeLimits(timeout_seconds=2.0, max_body_bytes=1024 * 1024)


def test_the_default_config_narrows_to_the_core_defaults() -> None:
    """Each default is written once: the default Config's slices equal the core dataclasses'
    own defaults (detector, restart policy, canary)."""
    config = Config()
    assert config.detection_policy() == DetectionPolicy()
    assert config.restart_policy() == RestartPolicy()
    assert config.canary_policy() == CanaryPolicy()
    assert (
        config.scrape_limits().max_engines == DEFAULT_MAX_ENGINES == DetectionPolicy().max_engines
    )


def test_the_detector_policy_holds_every_threshold_of_the_table() -> None:
    """DetectionPolicy's fields are the threshold table's settings plus the start-up timeout and
    max_engines, each narrowed from the Config field of the same name, and the vanished
    engine expiry (a documented constant, not a setting)."""
    assert {f.name for f in dataclasses.fields(DetectionPolicy)} == {
        *THRESHOLD_SETTINGS,
        "startup_timeout_seconds",
        "max_engines",
        "vanished_engine_expiry_seconds",
    }
    values = {name: 1000.0 + i for i, name in enumerate(THRESHOLD_SETTINGS)}
    flags = {**values, "startup_timeout_seconds": 77.0, "max_engines": 9}
    policy = load_config(flags=flags).config.detection_policy()
    assert {name: getattr(policy, name) for name in values} == values
    assert policy.startup_timeout_seconds == 77.0
    assert policy.max_engines == 9


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("4096", 4096, id="plain"),
        pytest.param("16MiB", 16 * 1024 * 1024, id="mib"),
        pytest.param("2 MB", 2_000_000, id="mb"),
        pytest.param("1.5KiB", 1536, id="fraction"),
    ],
)
def test_sizes_accept_units(text: str, value: int) -> None:
    """Byte sizes accept a whole number or a number with a unit."""
    assert load_config(flags={"max_body_bytes": text}).config.max_body_bytes == value


def test_bad_size_is_explained() -> None:
    """An unknown unit is refused with the units that work."""
    (message,) = errors_of(flags={"max_body_bytes": "16 parsecs"})
    assert "is not a size" in message
    assert "MiB" in message


# -- rendering -----------------------------------------------------------------------------


def test_rendered_toml_loads_back_to_the_same_config(tmp_path: Path) -> None:
    """`config show` TOML output is a valid config file describing the same configuration."""
    original = load_config(
        flags={
            "targets": ("a=http://127.0.0.1:8000", "http://10.0.0.2:8001"),
            "remedy": "exec",
            "exec_command": ("/bin/echo", 'say "hi"'),
            "stall_after_seconds": 45.0,
            "capture_locals": True,
        }
    )
    text = render_toml(original)
    assert "stall_after_seconds = 45.0" in text
    assert "# flag:--stall-after-seconds" in text
    path = write(tmp_path, text)
    assert load_config(config_file=path).config == original.config


def test_table_lists_every_setting_with_its_source() -> None:
    """The terminal table has one row per setting and shows each source."""
    loaded = load_config(environ={"WEDGEWATCH_LOG_LEVEL": "debug"})
    lines = render_table(loaded).splitlines()
    assert len(lines) == len(SETTINGS) + 1
    (row,) = [line for line in lines if line.startswith("log_level ")]
    assert row.split() == ["log_level", "debug", "env:WEDGEWATCH_LOG_LEVEL"]


def test_reference_doc_is_current() -> None:
    """docs/configuration.md is what `wedgewatch config reference` renders from the model."""
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == render_reference(), (
        "docs/configuration.md is stale: run `wedgewatch config reference -o docs/configuration.md`"
    )


def test_readme_state_table_names_each_family_with_its_setting_and_default() -> None:
    """The README's state table is the one family -> setting table: after each family's name
    the first setting named is THRESHOLD_SETTING's, with the Config default."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| state | meaning |") :]
    table = table[: table.index("\n\n")]
    for family, setting in THRESHOLD_SETTING.items():
        after = table[table.index(f"`{family}`") + len(family) + 2 :]
        named = re.search(r"`([a-z_]+_seconds)` = (\d+(?:\.\d+)?) s", after)
        assert named is not None, family
        assert named.group(1) == setting, family
        assert float(named.group(2)) == getattr(Config(), setting), family


def test_reference_names_every_setting_and_spelling() -> None:
    """The reference documents every field with its environment variable and flag."""
    text = render_reference()
    for setting in SETTINGS.values():
        assert f"### `{setting.name}`" in text
        assert f"`{setting.env}`" in text
        assert f"`{setting.flag}`" in text


# -- the commands --------------------------------------------------------------------------


def wedgewatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "wedgewatch", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_config_show_json_reports_values_and_sources(tmp_path: Path) -> None:
    """`config show --json` gives the effective values and where each came from."""
    path = write(tmp_path, "hang_after_seconds = 200\n")
    done = wedgewatch(
        "config", "show", "--json", "--config", str(path), "--stall-after-seconds", "15",
        env={"WEDGEWATCH_LOG_LEVEL": "warning"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["config"]["stall_after_seconds"] == 15
    assert shown["config"]["hang_after_seconds"] == 200
    assert shown["sources"]["stall_after_seconds"] == "flag:--stall-after-seconds"
    assert shown["sources"]["hang_after_seconds"] == f"file:{path}"
    assert shown["sources"]["log_level"] == "env:WEDGEWATCH_LOG_LEVEL"


@pytest.mark.slow
def test_config_show_prints_toml_when_piped() -> None:
    """Without a terminal `config show` prints annotated TOML that parses."""
    done = wedgewatch("config", "show", "--target", "a=http://127.0.0.1:8000")
    assert done.returncode == 0, done.stderr
    parsed = tomllib.loads(done.stdout)
    assert parsed["targets"] == [{"name": "a", "url": "http://127.0.0.1:8000"}]


@pytest.mark.slow
def test_config_show_rejects_bad_environment() -> None:
    """An unknown WEDGEWATCH_ variable makes `config show` exit 2 with the message."""
    done = wedgewatch("config", "show", env={"WEDGEWATCH_STALL": "1"})
    assert done.returncode == 2
    assert "WEDGEWATCH_STALL is not a wedgewatch setting" in done.stderr


@pytest.mark.slow
def test_config_check_accepts_a_valid_file(tmp_path: Path) -> None:
    """`config check` exits 0 for a valid file and says how many settings it sets."""
    path = write(tmp_path, 'remedy = "systemd"\n[[targets]]\nurl = "http://127.0.0.1:8000"\n')
    done = wedgewatch("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{path}: valid (2 settings set)"


@pytest.mark.slow
def test_config_check_rejects_a_bad_file_with_every_message(tmp_path: Path) -> None:
    """`config check` exits 2 and prints one message per problem."""
    path = write(tmp_path, "stall_after_seconds = -1\nlisten_port = 99999\n")
    done = wedgewatch("config", "check", str(path), env={"WEDGEWATCH_BOGUS": "ignored here"})
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("wedgewatch: stall_after_seconds = -1 (from config file")
    assert lines[1].startswith("wedgewatch: listen_port = 99999")


@pytest.mark.slow
def test_config_reference_command_prints_the_doc() -> None:
    """`config reference` prints exactly the generated reference."""
    done = wedgewatch("config", "reference")
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_reference()


def test_loaded_config_is_a_plain_value() -> None:
    """LoadedConfig holds the model and a mapping of sources, nothing live."""
    loaded = load_config()
    assert isinstance(loaded, LoadedConfig)
    assert dict(loaded.sources) == dict.fromkeys(SETTINGS, "default")


# -- safety: remote signal targets, secrets ---------------------------------------------------


def test_signal_remedy_refuses_a_remote_target() -> None:
    """`remedy = "signal"` for a server on another host is a config error naming the target."""
    (message,) = errors_of(flags={"remedy": "signal", "targets": ("far=http://192.0.2.7:8000",)})
    assert message.startswith("remedy = 'signal' (from flag --remedy): target 'far'")
    assert "192.0.2.7 is not this machine" in message


@pytest.mark.parametrize(
    "target",
    [
        pytest.param({"url": "http://127.0.0.1:8000"}, id="loopback"),
        pytest.param({"url": "http://localhost:8000"}, id="localhost"),
        pytest.param({"url": "http://192.0.2.7:8000", "pid": 1234}, id="remote-with-pid"),
    ],
)
def test_signal_remedy_accepts_a_local_or_named_server(target: dict[str, object]) -> None:
    """A local URL, or a remote one whose process is named by pid, may use `signal`."""
    loaded = load_config(flags={"remedy": "signal", "targets": (target,)})
    assert loaded.config.remedy == "signal"


def test_error_messages_never_show_a_webhook_secret() -> None:
    """A bad webhook URL is reported without its path or query."""
    (message,) = errors_of(flags={"webhook_urls": ("ftp://hooks.example/T0/SECRETPATH?k=QSECRET",)})
    assert "SECRETPATH" not in message
    assert "QSECRET" not in message
    assert "ftp://hooks.example/***" in message


def test_config_show_masks_secrets_unless_revealed() -> None:
    """Rendered config hides webhook paths, URL credentials and secret env; --reveal shows them."""
    loaded = load_config(
        flags={
            "webhook_urls": ("https://hooks.slack.com/services/T0/B0/SLACKSECRET",),
            "targets": ("a=http://bob:PWSECRET@127.0.0.1:8000",),
            "remedy": "exec",
            "exec_command": ("notify", "--api-key", "EXECSECRET"),
            "profiles": '{"mine": {"env": {"HF_TOKEN": "HFSECRET"}}}',
        }
    )
    shown = [
        config_module.render_toml(loaded),
        config_module.render_table(loaded),
        json.dumps(config_module.config_as_json(loaded)),
    ]
    for text in shown:
        for secret in ("SLACKSECRET", "PWSECRET", "EXECSECRET", "HFSECRET"):
            assert secret not in text
    revealed = config_module.render_toml(loaded, reveal=True)
    for secret in ("SLACKSECRET", "PWSECRET", "EXECSECRET", "HFSECRET"):
        assert secret in revealed
