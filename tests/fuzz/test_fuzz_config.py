"""Fuzz: the config loaders take any file and any `WEDGEWATCH_*` value, and only say no.

`config check`, `config show` and `run --config` read a file and the environment that an
operator (or a template) wrote: whatever they hold, the loaders return a config or raise
`ConfigError` with one message or more, never another exception, in bounded CPU.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzzing import FUZZ, hostile_text, within_cpu
from hypothesis import given
from hypothesis import strategies as st

from wedgewatch.config.settings import SETTINGS
from wedgewatch.config.sources import ConfigError, LoadedConfig, load_config, read_config_file

NAMES = sorted(SETTINGS)
# A file of `name = value` lines: values any TOML type, as strings (JSON's escapes are TOML's).
toml_files = st.one_of(
    hostile_text,
    st.lists(
        st.tuples(
            st.sampled_from(NAMES) | hostile_text,
            hostile_text.map(json.dumps)
            | st.integers().map(str)
            | st.sampled_from(["true", "[]", "{}", "nan", "-inf", '["a", 1]', "1e999"]),
        ),
        max_size=8,
    ).map(lambda pairs: "".join(f"{name} = {value}\n" for name, value in pairs)),
)


@FUZZ
@given(toml_files)
def test_any_config_file_loads_or_is_refused_with_messages(text: str) -> None:
    """A hostile config file: a config, or `ConfigError`; nothing else escapes."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "wedgewatch.toml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            within_cpu(lambda: read_config_file(path))
            loaded: LoadedConfig | ConfigError = within_cpu(
                lambda: load_config(config_file=path, environ={})
            )
        except ConfigError as exc:
            loaded = exc
    assert isinstance(loaded, LoadedConfig) or loaded.messages, text[:200]


@FUZZ
@given(st.dictionaries(st.sampled_from(NAMES), hostile_text, max_size=4))
def test_any_environment_value_loads_or_is_refused_with_messages(values: dict[str, str]) -> None:
    """Hostile `WEDGEWATCH_*` values for real settings: a config, or `ConfigError`."""
    environ = {SETTINGS[name].env: value.replace("\x00", "") for name, value in values.items()}
    try:
        loaded: LoadedConfig | ConfigError = within_cpu(lambda: load_config(environ=environ))
    except ConfigError as exc:
        loaded = exc
    assert isinstance(loaded, LoadedConfig) or loaded.messages
