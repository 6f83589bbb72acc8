"""The configuration as the daemon holds it: plain frozen objects, without pydantic.

The command line validates the configuration with the pydantic model (`config.model`);
`wedgewatch run` then hands the daemon a *plain* copy (`model.to_plain`): an object graph of
`PlainConfig` and `PlainTarget` with the model's attribute names and values and the same
views (`detection_policy()`, `scrape_limits()`, `Target.metrics_url`, ...), which the model
and the plain classes take from the mixins here (`ConfigViews`, `TargetViews`). The plain
classes list no field: `to_plain` copies every field the model declares, so a field is
written once, in the model. The daemon's process imports this module, never pydantic
(docs/daemon.md, "Validation in a child process").

Also here: what both sides need and pydantic does not: `ConfigError`, the URL rules of a
target, and byte sizes.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from wedgewatch.core.detection.canary import CanaryPolicy
from wedgewatch.core.detection.detect import DetectionPolicy
from wedgewatch.core.detection.states import THRESHOLD_SETTINGS
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.io.scrape_rules import ScrapeLimits

#: What `wedgewatch run` says when the configuration names no target.
NO_TARGETS = "no targets to watch: give --target URL or [[targets]] in --config"

_SIZE_UNITS: Mapping[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class ConfigError(Exception):
    """Configuration that cannot be used; `messages` holds one clear sentence per problem."""

    def __init__(self, messages: Sequence[str]) -> None:
        self.messages = tuple(messages)
        super().__init__("\n".join(self.messages))


def parse_byte_size(value: object) -> object:
    """Turn `"16MiB"`, `"512 MB"` or `"4096"` into a byte count; other values pass through."""
    if not isinstance(value, str):
        return value
    match = _SIZE_RE.match(value)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(
            f"{value!r} is not a size: use a whole number of bytes or a number with a unit "
            "(B, KB, KiB, MB, MiB, GB, GiB)"
        )
    size = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if size != math.floor(size):
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(size)


def check_http_url(url: str) -> str:
    """Return `url` stripped if it is an absolute http(s) URL with a host, else raise."""
    url = url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("must start with http:// or https://")
    if not parts.hostname:
        raise ValueError("must name a host, e.g. http://127.0.0.1:8000")
    if port == 0:
        raise ValueError("must not use port 0")
    if parts.fragment:
        raise ValueError("must not contain a #fragment")
    return url


@functools.lru_cache(maxsize=4096)  # pure, and asked on every scrape
def metrics_url_of(url: str) -> str:
    """The `/metrics` URL of a server given its base URL or its `/metrics` URL.

    `http://h:8000`, `http://h:8000/` and `http://h:8000/metrics/` all become
    `http://h:8000/metrics` (vLLM's exact route, which always serves the whole text); a
    path prefix (a reverse proxy's `http://h/vllm`) is kept: `http://h/vllm/metrics`.
    """
    parts = urlsplit(check_http_url(url))
    path = parts.path.rstrip("/")
    if not path.endswith("/metrics"):
        path = f"{path}/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def default_target_name(url: str) -> str:
    """The name a target gets when none is given: `host:port` of its URL."""
    parts = urlsplit(check_http_url(url))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- the views, shared by the model and the plain copy ------------------------------------


class TargetViews:
    """What a target derives from its fields (`Target` and `PlainTarget`)."""

    if TYPE_CHECKING:  # the fields the views read (declared by the model, not here)
        url: str

    @property
    def metrics_url(self) -> str:
        """The URL that is scraped."""
        return metrics_url_of(self.url)


class ConfigViews:
    """The narrowed slices of the configuration (`Config` and `PlainConfig`): components
    never see the whole configuration."""

    if TYPE_CHECKING:  # the fields the views read (declared by the model, not here)
        startup_timeout_seconds: float
        max_engines: int
        canary_interval_seconds: float
        canary_timeout_seconds: float
        restart_budget: int
        restart_budget_window_seconds: float
        restart_backoff_seconds: float
        restart_backoff_max_seconds: float
        scrape_timeout_seconds: float
        max_body_bytes: int

    def detection_policy(self) -> DetectionPolicy:
        """The detector's slice of the configuration."""
        return DetectionPolicy(
            startup_timeout_seconds=self.startup_timeout_seconds,
            max_engines=self.max_engines,
            **{name: getattr(self, name) for name in THRESHOLD_SETTINGS},
        )

    def canary_policy(self) -> CanaryPolicy:
        """The canary core's slice of the configuration."""
        return CanaryPolicy(
            interval_seconds=self.canary_interval_seconds,
            timeout_seconds=self.canary_timeout_seconds,
        )

    def restart_policy(self) -> RestartPolicy:
        """The restart policy's slice of the configuration."""
        return RestartPolicy(
            restart_budget=self.restart_budget,
            restart_budget_window_seconds=self.restart_budget_window_seconds,
            restart_backoff_seconds=self.restart_backoff_seconds,
            restart_backoff_max_seconds=self.restart_backoff_max_seconds,
            startup_timeout_seconds=self.startup_timeout_seconds,
        )

    def scrape_limits(self) -> ScrapeLimits:
        """The scraper's slice of the configuration."""
        return ScrapeLimits(
            timeout_seconds=self.scrape_timeout_seconds,
            max_body_bytes=self.max_body_bytes,
            max_engines=self.max_engines,
        )


# -- the plain copy -------------------------------------------------------------------------


class _Frozen:
    """Named values fixed at construction; equal when the class and the values are."""

    _names: tuple[str, ...]

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_names", tuple(values))
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be set")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: {name} cannot be deleted")

    def _items(self) -> Iterator[tuple[str, Any]]:
        return ((name, getattr(self, name)) for name in self._names)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return tuple(self._items()) == tuple(other._items())

    def __hash__(self) -> int:
        return hash(tuple(value for _, value in self._items() if value.__hash__ is not None))

    def __repr__(self) -> str:
        # Names only: values may hold secrets (webhook URLs, URL credentials).
        return f"{type(self).__name__}({', '.join(self._names)})"


class PlainTarget(TargetViews, _Frozen):
    """A `Target` without pydantic (see the module docstring)."""


class PlainConfig(ConfigViews, _Frozen):
    """A `Config` without pydantic (see the module docstring)."""


def setting_names(config: object) -> tuple[str, ...]:
    """The settings `config` holds, in the model's order (a `Config` or its plain copy)."""
    if isinstance(config, _Frozen):
        return config._names
    return tuple(type(config).model_fields)  # type: ignore[attr-defined]  # a pydantic model
