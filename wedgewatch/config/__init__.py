"""wedgewatch's one configuration: the frozen model, its four sources and its renderers.

`model` holds `Config` and the per-field metadata, `sources` merges defaults < TOML file <
environment < flags into a `LoadedConfig`, and `reference` renders the effective config and
docs/configuration.md. Callers import from this package: `from wedgewatch.config import
Config, load_config`.
"""

from wedgewatch.config.model import (
    SECTIONS,
    Config,
    ConfigError,
    Target,
    default_target_name,
    metrics_url_of,
    parse_byte_size,
)
from wedgewatch.config.reference import config_as_json, render_reference, render_table, render_toml
from wedgewatch.config.settings import SETTINGS, Setting
from wedgewatch.config.sources import LoadedConfig, load_config

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
