"""The settings of `wedgewatch check`, and their cache in the probe's state file.

A probe-mode check (`--state-file`) runs every few seconds; validating the configuration
with pydantic on every run would cost more than the check. The first run validates it
through the full command line and caches the narrowed `CheckSettings` in the state file
under a digest of everything they come from (`settings_key`); later runs with the same
digest read them back (`cached_settings`, used by `wedgewatch.entry`). Kept apart from
check.py and free of heavy imports: the probe path imports it on every run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wedgewatch.core.detection import states
from wedgewatch.core.detection.detect import DetectionPolicy
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.core.text.redact import redact_url
from wedgewatch.core.values import immutable
from wedgewatch.io.scrape_rules import ScrapeLimits

if TYPE_CHECKING:
    from wedgewatch.config import Config

#: Bumped when `CheckSettings` or the digest changes: an old cache entry then misses.
SETTINGS_CACHE_VERSION = 2

_CANARY_THRESHOLD = states.THRESHOLD_SETTING[states.Family.CANARY_STALL]
#: The settings `check` takes as flags (and from --config and WEDGEWATCH_* like any command):
#: every detector threshold but the canary's (`check` sends no canary).
CHECK_FLAG_SETTINGS = (
    "interval_seconds",
    *(name for name in states.THRESHOLD_SETTINGS if name != _CANARY_THRESHOLD),
    "startup_timeout_seconds",
    "scrape_timeout_seconds",
    "max_body_bytes",
    "max_engines",
    "log_level",
)


@immutable
class CheckSettings:
    """The slice of the configuration a check uses; cached in the probe's state file."""

    interval_seconds: float
    policy: DetectionPolicy
    limits: ScrapeLimits
    log_level: str
    restart: RestartPolicy
    probe_respects_budget: bool
    #: `remedy = "none"` set explicitly: observe mode, the probe never asks for a restart.
    #: Left unset, a check in probe mode is the restarting probe (its documented use).
    observe: bool = False

    @classmethod
    def from_config(cls, config: Config) -> CheckSettings:
        """Narrow a validated configuration."""
        return cls(
            interval_seconds=config.interval_seconds,
            policy=config.detection_policy(),
            limits=config.scrape_limits(),
            log_level=config.log_level,
            restart=config.restart_policy(),
            probe_respects_budget=config.probe_respects_budget,
            observe="remedy" in config.model_fields_set and config.remedy == "none",
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON, read back by `from_json`."""
        return {
            "interval_seconds": self.interval_seconds,
            "policy": asdict(self.policy),
            "limits": asdict(self.limits),
            "log_level": self.log_level,
            "restart": asdict(self.restart),
            "probe_respects_budget": self.probe_respects_budget,
            "observe": self.observe,
        }

    @classmethod
    def from_json(cls, raw: object) -> CheckSettings | None:
        """The settings `to_json` wrote, or None for anything else (then validate afresh)."""
        try:
            assert isinstance(raw, dict)  # noqa: S101 - caught below
            settings = cls(
                interval_seconds=float(raw["interval_seconds"]),
                policy=DetectionPolicy(**raw["policy"]),
                limits=ScrapeLimits(**raw["limits"]),
                log_level=str(raw["log_level"]),
                restart=RestartPolicy(**raw["restart"]),
                probe_respects_budget=bool(raw["probe_respects_budget"]),
                observe=bool(raw["observe"]),
            )
        except (AssertionError, KeyError, TypeError, ValueError):
            return None
        return settings if settings.to_json() == raw else None


def settings_key(
    url: str, config_file: Path | None, environ: Mapping[str, str], flags: Mapping[str, Any]
) -> str | None:
    """A digest of everything the settings of a check are made from, or None if unreadable.

    The URL, the config file's path and bytes, every `WEDGEWATCH_*` variable and the flags:
    equal digests mean `load_config` would validate the same input to the same settings.
    """
    if config_file is None and environ.get("WEDGEWATCH_CONFIG"):
        config_file = Path(environ["WEDGEWATCH_CONFIG"])
    try:
        content = b"" if config_file is None else config_file.read_bytes()
    except OSError:
        return None
    material = json.dumps(
        [
            SETTINGS_CACHE_VERSION,
            url,
            None if config_file is None else str(config_file),
            _sha256(content),
            sorted((k, v) for k, v in environ.items() if k.startswith("WEDGEWATCH_")),
            sorted((k, repr(v)) for k, v in flags.items()),
        ]
    )
    return _sha256(material.encode())


def _sha256(data: bytes) -> str:
    """The SHA-256 of `data`, in hex, from CPython's own implementation when it has one:
    `hashlib` loads OpenSSL's libcrypto first, a tenth of an exec probe's imports."""
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # noqa: PLC0415 - 3.11
    except ImportError:  # 3.12 renamed it; there the probe loads OpenSSL
        from hashlib import sha256  # noqa: PLC0415
    return str(sha256(data).hexdigest())


def cached_settings(state_file: Path, key: str) -> tuple[str, CheckSettings] | None:
    """(metrics URL, settings) cached under `key` in the state file, if it holds them."""
    cache = read_settings_cache(state_file)
    if cache is None or cache.get("key") != key:
        return None
    metrics_url = cache.get("metrics_url")
    settings = CheckSettings.from_json(cache.get("values"))
    if not isinstance(metrics_url, str) or settings is None:
        return None
    if redact_url(metrics_url) != metrics_url:  # a URL with a secret is not cached
        return None
    return metrics_url, settings


def read_settings_cache(path: Path) -> Mapping[str, Any] | None:
    """The `settings` entry of a state file, or None (no file, unreadable, not ours)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    cache = data.get("settings") if isinstance(data, dict) else None
    return cache if isinstance(cache, dict) else None
