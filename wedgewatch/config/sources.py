"""Loading the configuration from its four sources: defaults < TOML file < environment < flags.

`load_config` merges them, records where every value came from, and turns validation
failures into one clear message per field (setting, value, source, rule).
"""

from __future__ import annotations

import difflib
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from wedgewatch.config.model import (
    CONFIG_FILE_ENV,
    ENV_PREFIX,
    Config,
    FieldRuleError,
    Target,
)
from wedgewatch.config.plain import ConfigError
from wedgewatch.config.settings import SETTINGS, Setting
from wedgewatch.core.text.redact import redact_url, redact_webhook_url
from wedgewatch.core.values import immutable

Source = str  # "default" | "file:PATH" | "env:NAME" | "flag:--x"

#: The largest config file read (a real one is a few KiB): a bigger one is refused after
#: reading this much, never loaded whole.
MAX_CONFIG_BYTES = 1024 * 1024


@immutable
class LoadedConfig:
    """The effective configuration and where each value came from."""

    config: Config
    sources: Mapping[str, Source]


def _suggest(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a TOML config file; unreadable files, bad TOML and unknown keys raise ConfigError.

    So do a file over `MAX_CONFIG_BYTES` and one nested too deeply for the parser (TOML
    arrays and inline tables nest by recursion): a clear message, never a traceback.
    """
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_CONFIG_BYTES + 1)
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError([f"config file {path}: no such file"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"config file {path}: cannot be read ({exc})"]) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            [f"config file {path}: larger than {MAX_CONFIG_BYTES} bytes; not a wedgewatch config"]
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"config file {path}: not valid TOML: {exc}"]) from None
    except RecursionError:
        raise ConfigError(
            [f"config file {path}: arrays or tables nested too deeply to parse"]
        ) from None
    unknown = [key for key in data if key not in SETTINGS]
    if unknown:
        known = list(SETTINGS)
        raise ConfigError(
            [
                f"config file {path}: unknown setting {key!r}{_suggest(key, known)}"
                for key in unknown
            ]
        )
    return data


def _env_value(setting: Setting, raw: str) -> Any:
    """Convert an environment string to what the model accepts for this field."""
    if setting.kind in ("list", "targets"):
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    if setting.kind == "argv":
        try:
            return tuple(shlex.split(raw))
        except ValueError as exc:
            raise ConfigError(
                [f"{setting.env}: {raw!r} is not a valid shell-quoted command ({exc})"]
            ) from None
    return raw


def read_environment(environ: Mapping[str, str]) -> dict[str, tuple[str, Any]]:
    """`WEDGEWATCH_*` variables as {field: (variable, value)}; unknown names raise ConfigError."""
    values: dict[str, tuple[str, Any]] = {}
    problems: list[str] = []
    known_envs = [setting.env for setting in SETTINGS.values()] + [CONFIG_FILE_ENV]
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable == CONFIG_FILE_ENV:
            continue
        name = variable[len(ENV_PREFIX) :].lower()
        setting = SETTINGS.get(name)
        if setting is None or variable != setting.env:
            problems.append(
                f"environment variable {variable} is not a wedgewatch setting"
                f"{_suggest(variable, known_envs)}"
            )
            continue
        try:
            values[name] = (variable, _env_value(setting, environ[variable]))
        except ConfigError as exc:
            problems.extend(exc.messages)
    if problems:
        raise ConfigError(problems)
    return values


def _describe_source(source: Source) -> str:
    kind, _, where = source.partition(":")
    return {
        "file": f"config file {where}",
        "env": f"environment {where}",
        "flag": f"flag {where}",
    }.get(kind, "default")


def _rule_text(error: Mapping[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, FieldRuleError):
        return cause.rule
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if message.startswith("Input should be"):
        message = "must be" + message[len("Input should be") :]
    if error["type"] == "extra_forbidden":
        message = "is not a known key"
    return message


def _redact_value(field: str, value: Any) -> Any:
    """A setting's value as it may be printed in an error message: secrets masked."""
    if isinstance(value, str) and field == "webhook_urls":
        return redact_webhook_url(value)
    if isinstance(value, str) and field == "targets":
        return redact_url(value) if "://" in value else value
    if isinstance(value, tuple | list):
        return type(value)(_redact_value(field, item) for item in value)
    if isinstance(value, Mapping) and field == "targets" and isinstance(value.get("url"), str):
        return {**value, "url": redact_url(value["url"])}
    return value


def _format_errors(error: ValidationError, sources: Mapping[str, Source]) -> list[str]:
    messages: list[str] = []
    for item in error.errors():
        loc = list(item["loc"])
        value = item.get("input")
        ctx = item.get("ctx") or {}
        cause = ctx.get("error")
        if isinstance(cause, FieldRuleError):
            loc, value = [cause.field], cause.value
        if not loc:
            messages.append(_rule_text(item))
            continue
        field = str(loc[0])
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc[1:])
        source = _describe_source(sources.get(field, "default"))
        if item["type"] == "extra_forbidden" and len(loc) > 1:
            known = list(Target.model_fields)
            messages.append(
                f"{field}{where[: where.rfind('.')]}: unknown key {str(loc[-1])!r}"
                f"{_suggest(str(loc[-1]), known)} (from {source})"
            )
            continue
        if item["type"] == "missing":
            messages.append(f"{field}{where}: is required (from {source})")
            continue
        shown = _redact_value(field, value)
        messages.append(f"{field}{where} = {shown!r} (from {source}): {_rule_text(item)}")
    return messages


def load_config(
    *,
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> LoadedConfig:
    """Merge defaults < `config_file` < `WEDGEWATCH_*` in `environ` < `flags`, then validate.

    `config_file` defaults to `$WEDGEWATCH_CONFIG` when set. `flags` maps field names to
    values given on the command line (absent or None = not given). Raises ConfigError with
    one message per problem, each naming the field, the value, its source and the rule.
    """
    environ = {} if environ is None else environ
    merged: dict[str, Any] = {}
    sources: dict[str, Source] = dict.fromkeys(SETTINGS, "default")
    if config_file is None and environ.get(CONFIG_FILE_ENV):
        config_file = Path(environ[CONFIG_FILE_ENV])
    if config_file is not None:
        for key, value in read_config_file(config_file).items():
            merged[key] = value
            sources[key] = f"file:{config_file}"
    for name, (variable, value) in read_environment(environ).items():
        merged[name] = value
        sources[name] = f"env:{variable}"
    for name, value in (flags or {}).items():
        if name not in SETTINGS:
            raise ConfigError([f"unknown setting {name!r}{_suggest(name, list(SETTINGS))}"])
        if value is None:
            continue
        merged[name] = value
        sources[name] = f"flag:{SETTINGS[name].flag}"
    try:
        config = Config.model_validate(merged)
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc, sources)) from None
    except RecursionError:
        raise ConfigError(["a setting's value is nested too deeply to validate"]) from None
    return LoadedConfig(config=config, sources=sources)
