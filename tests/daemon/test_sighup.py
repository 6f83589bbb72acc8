"""SIGHUP to a real `wedgewatch run`: the configuration is reloaded when it validates and
kept (with the reason logged) when it does not; the endpoints answer throughout and
SIGTERM still stops it cleanly."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always
from wedgewatch_daemon import DaemonProcess

pytestmark = pytest.mark.slow

IDLE = (Path(__file__).parents[1] / "fixtures" / "idle.prom").read_bytes()


def _config(path: Path, urls: dict[str, str], interval: float) -> Path:
    targets = "".join(f'[[targets]]\nname = "{n}"\nurl = "{u}"\n\n' for n, u in urls.items())
    path.write_text(f"interval_seconds = {interval}\n\n{targets}")
    return path


def test_sighup_reloads_a_valid_config_and_keeps_the_running_one_otherwise(
    tmp_path: Path,
) -> None:
    """A new target and interval after SIGHUP; a broken file then changes nothing; the
    process survives both and stops cleanly on SIGTERM."""
    with (
        ScriptedServer(always(Reply(body=IDLE))) as first,
        ScriptedServer(always(Reply(body=IDLE))) as second,
    ):
        path = _config(tmp_path / "wedgewatch.toml", {"a": first.url}, 0.5)
        daemon = DaemonProcess(["--config", str(path)], tmp_path)
        try:
            daemon.wait_for("daemon_started")
            assert [t["name"] for t in daemon.get("/status").json()["targets"]] == ["a"]

            _config(path, {"a": first.url, "b": second.url}, 0.25)
            daemon.proc.send_signal(signal.SIGHUP)
            reloaded = daemon.wait_for("config_reloaded")
            assert set(reloaded["changed"]) == {"targets", "interval_seconds"}
            assert daemon.proc.poll() is None
            names = [t["name"] for t in daemon.get("/status").json()["targets"]]
            assert names == ["a", "b"]
            assert daemon.get("/health").status_code == 200

            path.write_text("interval_seconds = -1\nnot toml at all [\n")
            daemon.proc.send_signal(signal.SIGHUP)
            rejected = daemon.wait_for("config_reload_rejected")
            assert "config file" in " ".join(rejected["reasons"])
            assert "running configuration" in rejected["kept"]
            assert daemon.proc.poll() is None
            names = [t["name"] for t in daemon.get("/status").json()["targets"]]
            assert names == ["a", "b"]
            assert daemon.get("/probe?target=b").status_code == 200
            assert not daemon.events("state_file_reset")
        finally:
            code = daemon.stop()
    assert code == 0
    assert daemon.events("daemon_stopping")
    assert len(daemon.events("http_listening")) == 1  # the endpoints stayed up throughout


def test_the_systemd_unit_reloads_with_sighup() -> None:
    """`systemctl reload wedgewatch` sends SIGHUP to the main process, as run handles it."""
    unit = (Path(__file__).parents[2] / "systemd" / "wedgewatch.service").read_text()
    assert "\nExecReload=/bin/kill -HUP $MAINPID\n" in unit
