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

import importlib
from typing import TYPE_CHECKING, Any

from wedgewatch.config.plain import (
    ConfigError,
    default_target_name,
    metrics_url_of,
    parse_byte_size,
)

if TYPE_CHECKING:
    from wedgewatch.config.model import SECTIONS, Config, Target
    from wedgewatch.config.reference import (
        config_as_json,
        render_reference,
        render_table,
        render_toml,
    )
    from wedgewatch.config.settings import SETTINGS, Setting
    from wedgewatch.config.sources import LoadedConfig, load_config

#: The names that need pydantic, by the module that defines them.
_ON_DEMAND = {
    "SECTIONS": "model",
    "Config": "model",
    "Target": "model",
    "config_as_json": "reference",
    "render_reference": "reference",
    "render_table": "reference",
    "render_toml": "reference",
    "SETTINGS": "settings",
    "Setting": "settings",
    "LoadedConfig": "sources",
    "load_config": "sources",
}


def __getattr__(name: str) -> Any:
    """A name of `_ON_DEMAND`, imported with its module on first use."""
    module = _ON_DEMAND.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


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
]
