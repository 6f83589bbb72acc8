"""The daemon's plain configuration (`config.plain`) is the model's, field by field and view by
view, and holds no pydantic."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from wedgewatch.config import Config, load_config, to_plain
from wedgewatch.config.plain import PlainConfig, PlainTarget, setting_names

ROOT = Path(__file__).resolve().parents[2]

#: A configuration that sets a value other than the default wherever it can.
EVERYTHING: dict[str, Any] = {
    "interval_seconds": 2.0,
    "stall_after_seconds": 90.0,
    "hang_after_seconds": 400.0,
    "unreachable_after_seconds": 45.0,
    "scrape_timeout_seconds": 3.0,
    "max_body_bytes": "8MiB",
    "canary_interval_seconds": 30.0,
    "canary_model": "tiny",
    "listen_host": "0.0.0.0",
    "listen_port": 0,
    "state_dir": "/tmp/wedgewatch-state",
    "evidence_dir": "/tmp/wedgewatch-evidence",
    "log_level": "debug",
    "remedy": "exec",
    "exec_command": ("systemctl", "restart", "vllm"),
    "on_bundle": ("/usr/local/bin/upload", "--fast"),
    "abort_first": True,
    "webhook_urls": ("https://hooks.example.com/services/T000/B000/XXXX",),
    "profiles": {"mine": {"description": "mine", "args": ["--max-model-len", "4096"]}},
    "targets": (
        {"name": "a", "url": "http://127.0.0.1:8000", "pid": 1234},
        {"name": "b", "url": "http://user:secret@127.0.0.1:8001/vllm", "systemd_unit": "b.service"},
        "http://127.0.0.1:8002",
    ),
}

CONFIGS = {
    "defaults": Config,
    "everything": lambda: Config.model_validate(EVERYTHING),
    "systemd": lambda: load_config(config_file=ROOT / "systemd" / "wedgewatch.toml").config,
}


@pytest.fixture(params=sorted(CONFIGS))
def model(request: pytest.FixtureRequest) -> Config:
    """Each configuration of `CONFIGS`, validated by the model."""
    return CONFIGS[request.param]()


def test_every_field_is_copied_with_its_value(model: Config) -> None:
    """The plain copy has the model's settings, in its order, each equal to the model's."""
    plain = to_plain(model)
    assert isinstance(plain, PlainConfig)
    assert setting_names(plain) == tuple(Config.model_fields) == setting_names(model)
    for name in Config.model_fields:
        assert getattr(plain, name) == getattr(model, name) or name == "targets", name
    assert len(plain.targets) == len(model.targets)
    for copied, target in zip(plain.targets, model.targets, strict=True):
        assert isinstance(copied, PlainTarget)
        for name in type(target).model_fields:
            assert getattr(copied, name) == getattr(target, name), name
        assert copied.metrics_url == target.metrics_url


def test_the_views_agree(model: Config) -> None:
    """Each component's slice is the same from the model and from its plain copy."""
    plain = to_plain(model)
    assert plain.detection_policy() == model.detection_policy()
    assert plain.canary_policy() == model.canary_policy()
    assert plain.restart_policy() == model.restart_policy()
    assert plain.scrape_limits() == model.scrape_limits()


def test_the_plain_copy_is_frozen_and_survives_a_pickle() -> None:
    """No setting can be changed; the hand-over's pickle gives an equal copy; its repr shows
    names, never values (a webhook's secret path)."""
    plain = to_plain(Config.model_validate(EVERYTHING))
    with pytest.raises(AttributeError, match="frozen"):
        plain.interval_seconds = 5.0  # type: ignore[misc]  # frozen on purpose
    with pytest.raises(AttributeError, match="frozen"):
        plain.targets[0].url = "http://elsewhere:1"  # type: ignore[misc]
    copy = pickle.loads(pickle.dumps(plain))  # noqa: S301 - our own bytes
    assert copy == plain
    assert copy != to_plain(Config())
    assert hash(copy.targets[0]) == hash(plain.targets[0])
    assert "XXXX" not in repr(plain)
    assert "secret" not in repr(plain.targets[1])


def test_a_reload_sees_what_changed_in_a_plain_copy() -> None:
    """`daemon.loop.changed_settings` compares plain copies by the model's field names."""
    from wedgewatch.daemon.loop import changed_settings

    old = to_plain(Config.model_validate(EVERYTHING))
    new = to_plain(Config.model_validate({**EVERYTHING, "interval_seconds": 1.0}))
    assert changed_settings(old, new) == ["interval_seconds"]
    assert changed_settings(old, to_plain(Config.model_validate(EVERYTHING))) == []
