"""wedgewatch's one configuration: the frozen model, its four sources and its renderers.

`model` holds `Config` and the per-field metadata, `sources` merges defaults < TOML file <
environment < flags into a `LoadedConfig`, and `reference` renders the effective config and
docs/configuration.md. Callers import from this package: `from wedgewatch.config import
Config, load_config`.

`plain` holds what needs no pydantic (`ConfigError`, the URL rules, the views and the
daemon's plain copy of a `Config`): importing this package imports only that. The names
that need the model (`Config`, `load_config`, ...) are loaded when first asked for, so the
daemon, which holds a plain copy, never imports pydantic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from wedgewatch.config.plain import (
    ConfigError,
    default_target_name,
    metrics_url_of,
    parse_byte_size,
)

if TYPE_CHECKING:
    from wedgewatch.config.model import SECTIONS, Config, Target, to_plain
    from wedgewatch.config.reference import (
        config_as_json,
        render_reference,
        render_table,
        render_toml,
    )
    from wedgewatch.config.settings import SETTINGS, Setting
    from wedgewatch.config.sources import LoadedConfig, load_config


def __getattr__(name: str) -> Any:
    """A name that needs pydantic, imported with its module on first use."""
    if name in ("SECTIONS", "Config", "Target", "to_plain"):
        from wedgewatch.config import model  # noqa: PLC0415 - on first use

        return getattr(model, name)
    if name in ("config_as_json", "render_reference", "render_table", "render_toml"):
        from wedgewatch.config import reference  # noqa: PLC0415 - on first use

        return getattr(reference, name)
    if name in ("SETTINGS", "Setting"):
        from wedgewatch.config import settings  # noqa: PLC0415 - on first use

        return getattr(settings, name)
    if name in ("LoadedConfig", "load_config"):
        from wedgewatch.config import sources  # noqa: PLC0415 - on first use

        return getattr(sources, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SECTIONS",
    "SETTINGS",
    "Config",
    "ConfigError",
    "LoadedConfig",
    "Setting",
    "Target",
    "config_as_json",
    "default_target_name",
    "load_config",
    "metrics_url_of",
    "parse_byte_size",
    "render_reference",
    "render_table",
    "render_toml",
    "to_plain",
]
