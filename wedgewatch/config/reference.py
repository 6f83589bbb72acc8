"""Rendering the configuration: the effective config (`wedgewatch config show`) and the
reference document (docs/configuration.md, `wedgewatch config reference`)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from wedgewatch.config.model import MIB, SECTIONS, Config, Target
from wedgewatch.config.settings import SETTINGS, Setting
from wedgewatch.config.sources import LoadedConfig
from wedgewatch.core.text.redact import redact_argv, redact_env, redact_url, redact_webhook_url
from wedgewatch.vllm.profiles import Profile


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{_toml_value(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }" if pairs else "{}"
    text = str(value)
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\u{ord(m.group()):04x}", escaped)
    return f'"{escaped}"'


def _target_toml(target: Target) -> list[str]:
    lines = ["[[targets]]"]
    for key, value in target.model_dump(exclude_none=True).items():
        lines.append(f"{key} = {_toml_value(value)}")
    return lines


def redacted(config: Config) -> Config:
    """`config` as it may be printed: webhook URLs without their path and query, target URLs
    without credentials and query, `exec_command`'s, `on_bundle`'s and launch profiles'
    secret-looking arguments and environment values masked. `config show --reveal` skips this."""
    profiles = {
        name: (
            {**profile, "env": redact_env(profile["env"])}
            if isinstance(profile, Mapping) and isinstance(profile.get("env"), Mapping)
            else profile
        )
        for name, profile in config.profiles.items()
    }
    return config.model_copy(
        update={
            "webhook_urls": tuple(redact_webhook_url(url) for url in config.webhook_urls),
            "targets": tuple(
                t.model_copy(update={"url": redact_url(t.url)}) for t in config.targets
            ),
            "exec_command": tuple(redact_argv(config.exec_command)),
            "on_bundle": tuple(redact_argv(config.on_bundle)),
            "profiles": profiles,
        }
    )


def config_as_json(loaded: LoadedConfig, *, reveal: bool = False) -> dict[str, Any]:
    """The effective config and its sources as JSON-safe data (secrets masked unless `reveal`)."""
    config = loaded.config if reveal else redacted(loaded.config)
    return {
        "config": config.model_dump(mode="json"),
        "sources": dict(loaded.sources),
    }


def render_toml(loaded: LoadedConfig, *, reveal: bool = False) -> str:
    """The effective config as a TOML file, each line annotated with its source (secrets
    masked unless `reveal`)."""
    lines = ["# wedgewatch effective configuration; each comment says where the value came from"]
    config = loaded.config if reveal else redacted(loaded.config)
    if not reveal:
        lines.append("# secrets are masked as ***; `wedgewatch config show --reveal` shows them")
    for section in SECTIONS:
        section_settings = [s for s in SETTINGS.values() if s.section == section]
        lines.append("")
        lines.append(f"# -- {section}")
        for setting in section_settings:
            source = loaded.sources[setting.name]
            if setting.kind == "targets":
                lines.append(f"# targets: {len(config.targets)} (source: {source})")
                continue
            if setting.kind == "table":
                lines.append(f"# profiles: {len(config.profiles)} (source: {source})")
                continue
            value = _toml_value(getattr(config, setting.name))
            lines.append(f"{setting.name} = {value}".ljust(48) + f"  # {source}")
    for target in config.targets:
        lines.append("")
        lines.extend(_target_toml(target))
    for name, profile in config.profiles.items():
        lines.append("")
        lines.append(f"[profiles.{_toml_value(name)}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in profile.items())
    return "\n".join(lines) + "\n"


def render_table(loaded: LoadedConfig, *, reveal: bool = False) -> str:
    """The effective config as an aligned table: setting, value, source (secrets masked
    unless `reveal`)."""
    rows: list[tuple[str, str, str]] = [("SETTING", "VALUE", "SOURCE")]
    config = loaded.config if reveal else redacted(loaded.config)
    for setting in SETTINGS.values():
        value: Any = getattr(config, setting.name)
        if setting.kind == "targets":
            shown = ", ".join(f"{t.name}={t.metrics_url}" for t in config.targets) or "(none)"
        elif isinstance(value, tuple):
            shown = " ".join(shlex.quote(item) for item in value) or "(none)"
        elif setting.kind == "table":
            shown = ", ".join(value) or "(none)"
        else:
            shown = _toml_value(value).strip('"')
        rows.append((setting.name, shown, loaded.sources[setting.name]))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return (
        "\n".join(
            f"{name.ljust(widths[0])}  {value.ljust(widths[1])}  {source}".rstrip()
            for name, value, source in rows
        )
        + "\n"
    )


def _default_text(setting: Setting) -> str:
    value = setting.default
    if setting.kind == "targets":
        return "none"
    if isinstance(value, tuple):
        return "`[]`"
    if setting.kind == "table":
        return "none (only the shipped profiles)"
    if isinstance(value, int) and not isinstance(value, bool) and setting.name.endswith("_bytes"):
        return f"`{value}` ({value // MIB} MiB)"
    return f"`{_toml_value(value)}`"


def _profiles_reference() -> list[str]:
    """The keys of one launch profile and an override example, for the reference doc."""
    lines = ["Keys of one profile:", "", "| key | meaning |", "|---|---|"]
    for name, field in Profile.model_fields.items():
        lines.append(f"| `{name}` | {field.description} |")
    lines.extend(
        [
            "",
            "```toml",
            "# fp8 KV cache on top of the shipped tp2-offload profile, and a profile of your own",
            '[profiles."tp2-offload"]',
            'kv_cache_dtype = "fp8"',
            "",
            "[profiles.tp4]",
            'description = "Tensor parallel 4, no offloading"',
            'args = ["--tensor-parallel-size", "4", "--max-num-seqs", "64"]',
            'env = { VLLM_LOGGING_LEVEL = "INFO" }',
            "```",
            "",
        ]
    )
    return lines


def render_reference() -> str:
    """docs/configuration.md: every setting with its default, spellings and rule."""
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `wedgewatch config reference` from wedgewatch/config/; do not edit."
        " tests/config/test_config.py fails when this file is stale. -->",
        "",
        "Every setting has one name, spelled the same in all four sources, which are applied in",
        "this order (later wins):",
        "",
        "1. the default below;",
        "2. the TOML file given with `--config FILE` (or `$WEDGEWATCH_CONFIG`), key = the name;",
        "3. the environment variable `WEDGEWATCH_<NAME>` (upper case);",
        "4. the command-line flag `--<name-with-dashes>`.",
        "",
        "Unknown keys in the file and unknown `WEDGEWATCH_*` variables are errors that name the",
        "key and suggest the closest known one; a bad value is reported with the setting, the",
        "value, where it came from and the rule it breaks. `wedgewatch config show` prints the",
        "effective configuration and the source of every value, with secrets (webhook URL paths",
        "and queries, URL credentials, secret-looking arguments and environment values) masked",
        "as `***` (`--reveal` shows them); `wedgewatch config check FILE` validates a file",
        "(exit 0, or 2 with the messages; secrets are masked in the messages too).",
        "",
        "List settings: in the environment `targets` and `webhook_urls` are comma-separated and",
        "`exec_command` and `on_bundle` are one shell-quoted string each; the flags of the lists",
        "(`--target`, `--webhook-url`) are",
        "repeatable. Sizes (`*_bytes`) accept units: `16MiB`, `512 MB`. Durations are seconds.",
        "`profiles` is a table of tables in TOML and one JSON object in the environment and as",
        "a flag.",
        "",
    ]
    for section, blurb in SECTIONS.items():
        out.extend([f"## {section.capitalize()}", "", blurb, ""])
        for setting in (s for s in SETTINGS.values() if s.section == section):
            out.append(f"### `{setting.name}`")
            out.append("")
            out.append(setting.description)
            out.append("")
            out.append(f"- default: {_default_text(setting)}")
            if setting.rules:
                out.append(f"- must be: {'; '.join(setting.rules)}")
            out.append(f"- environment: `{setting.env}`")
            repeat = " (repeatable)" if setting.kind in ("list", "targets") else ""
            if setting.kind == "bool":
                out.append(f"- flag: `{setting.flag}` / `--no-{setting.flag[2:]}`")
            else:
                out.append(f"- flag: `{setting.flag}`{repeat}")
            out.append("")
        if section == "targets":
            out.extend(["Fields of one target:", ""])
            out.extend(["| key | meaning |", "|---|---|"])
            for name, field in Target.model_fields.items():
                out.append(f"| `{name}` | {field.description} |")
            out.append("")
        if section == "launcher":
            out.extend(_profiles_reference())
    out.extend(
        [
            "## Example",
            "",
            "```toml",
            "# /etc/wedgewatch/wedgewatch.toml",
            f"stall_after_seconds = {SETTINGS['stall_after_seconds'].default:g}",
            f"hang_after_seconds = {SETTINGS['hang_after_seconds'].default:g}",
            'listen_host = "0.0.0.0"',
            'remedy = "systemd"',
            'systemd_unit = "vllm.service"',
            "",
            "[[targets]]",
            'name = "qwen"',
            'url = "http://127.0.0.1:8000"',
            "```",
            "",
        ]
    )
    return "\n".join(out)
