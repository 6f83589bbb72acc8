"""A real Prometheus (Debian's `/usr/bin/prometheus`) on 127.0.0.1 for the end-to-end tests.

Also the time scaling that lets production rules run in seconds: every duration in a rule
(range selectors, subquery ranges and steps, `offset`, `for:`) is divided by one factor,
so the relations between windows and `for:` stay as they are.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}
_DURATION = r"(?:[0-9]+(?:ms|[smhdwy]))+"
_RANGE = re.compile(rf"\[({_DURATION})(?::({_DURATION})?)?\]")
_OFFSET = re.compile(rf"(\boffset\s+)(-?)({_DURATION})")


def duration_seconds(text: str) -> float:
    """Seconds of a Prometheus duration such as `1h30m` or `500ms`."""
    if not re.fullmatch(_DURATION, text):
        raise ValueError(f"{text!r} is not a Prometheus duration")
    return sum(
        int(number) * _UNIT_SECONDS[unit]
        for number, unit in re.findall(r"([0-9]+)(ms|[smhdwy])", text)
    )


def format_duration(seconds: float) -> str:
    """A Prometheus duration for `seconds` (whole seconds when exact, else milliseconds)."""
    if seconds <= 0:
        raise ValueError(f"a scaled duration must stay positive, got {seconds}")
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


def scale_expr(expr: str, factor: float) -> str:
    """`expr` with every range, subquery and offset duration divided by `factor`."""

    def scale(text: str) -> str:
        return format_duration(duration_seconds(text) / factor)

    def ranged(match: re.Match[str]) -> str:
        window, step = match.group(1), match.group(2)
        if ":" not in match.group(0):
            return f"[{scale(window)}]"
        return f"[{scale(window)}:{scale(step) if step else ''}]"

    expr = _RANGE.sub(ranged, expr)
    return _OFFSET.sub(lambda m: m.group(1) + m.group(2) + scale(m.group(3)), expr)


def scale_rules(rules: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """A copy of a rules file with every duration divided by `factor`."""
    groups = []
    for group in rules["groups"]:
        scaled_rules = []
        for rule in group["rules"]:
            copy = dict(rule)
            copy["expr"] = scale_expr(rule["expr"], factor)
            if "for" in rule:
                copy["for"] = format_duration(duration_seconds(rule["for"]) / factor)
            scaled_rules.append(copy)
        scaled = {**group, "rules": scaled_rules}
        if "interval" in group:
            scaled["interval"] = format_duration(duration_seconds(group["interval"]) / factor)
        groups.append(scaled)
    return {"groups": groups}


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: its name and its host:port targets."""

    name: str
    targets: Sequence[str]


class PrometheusServer:
    """Prometheus as a child process with a generated config, and its HTTP API."""

    def __init__(
        self,
        binary: str,
        *,
        directory: Path,
        port: int,
        jobs: Sequence[ScrapeJob],
        rules: Mapping[str, Any],
        interval: str = "1s",
    ) -> None:
        self.base_url = f"http://127.0.0.1:{port}"
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "rules.yml").write_text(yaml.safe_dump(dict(rules)), encoding="utf-8")
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(directory / "rules.yml")],
            "scrape_configs": [
                {"job_name": job.name, "static_configs": [{"targets": list(job.targets)}]}
                for job in jobs
            ],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log_path = directory / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [
                    binary,
                    f"--config.file={directory / 'prometheus.yml'}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--storage.tsdb.retention.time=1h",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.client = httpx.Client(base_url=self.base_url, timeout=10)

    def wait_ready(self, timeout_seconds: float) -> None:
        """Wait until /-/ready answers 200; fail with the log if Prometheus exits or never does."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/-/ready").status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError(f"Prometheus did not become ready; log:\n{self.log_tail()}")

    def log_tail(self) -> str:
        """The end of Prometheus' log, for failure messages."""
        return self.log_path.read_text(errors="replace")[-4000:]

    def api(self, path: str, **params: Any) -> Any:
        """GET /api/v1/<path>; the `data` of a successful answer, else an AssertionError."""
        response = self.client.get(f"/api/v1/{path}", params=params)
        body = response.json()
        if response.status_code != 200 or body.get("status") != "success":
            raise AssertionError(f"/api/v1/{path} {params}: {response.status_code} {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (at Unix time `at`, default now)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        result: list[dict[str, Any]] = (
            data["result"] if data["resultType"] in ("vector", "matrix") else [data["result"]]
        )
        return result

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        """A range query's result matrix."""
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step
        )
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing) from /api/v1/alerts."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def alerting_rules(self) -> dict[str, dict[str, Any]]:
        """Alerting rules by name, with their active alerts and last evaluation time."""
        rules: dict[str, dict[str, Any]] = {}
        for group in self.api("rules", type="alert")["groups"]:
            for rule in group["rules"]:
                rules[rule["name"]] = rule
        return rules

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then SIGKILL) and close the client."""
        self.client.close()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
