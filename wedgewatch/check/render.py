"""What `wedgewatch check` prints: the Nagios line with perfdata, the `--json` document, the
exit code.

A `CheckReport` is the outcome of one check (`check.run`); its exit code follows the Nagios
plugin conventions (`EXIT_CODES`, from the detector's states in `core.states`), raised by
`-w`/`-c` (`StallThresholds`), lowered to WARNING for a wedge the restart budget will not
restart. The target's values are data: secrets masked, no control character reaches the
terminal, and a `|` outside the perfdata is printed as `¦`.
"""

from __future__ import annotations

import math
from typing import Any

from wedgewatch.core.detection.detect import EngineVerdict
from wedgewatch.core.detection.states import ACTED_ON, STALLED, EngineState
from wedgewatch.core.restart.probe_policy import ProbeVerdict
from wedgewatch.core.restart.restart_policy import PolicyEvent
from wedgewatch.core.text import nagios
from wedgewatch.core.text.escape import safe_line
from wedgewatch.core.text.redact import redact_value
from wedgewatch.core.values import immutable

#: A check's status is the detector's state of the target (`core.states.EngineState`).
Status = EngineState
EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN = 0, 1, 2, 3


def _exit_code(state: EngineState) -> int:
    if state in ACTED_ON:  # what the daemon restarts and /probe fails for
        return EXIT_CRITICAL
    if state in STALLED:  # a stall not (yet) acted on
        return EXIT_WARNING
    return EXIT_UNKNOWN if state is EngineState.UNKNOWN else EXIT_OK


#: The Nagios exit code of each state.
EXIT_CODES: dict[Status, int] = {state: _exit_code(state) for state in EngineState}
_NAGIOS_WORDS = {0: "OK", 1: "WARNING", 2: "CRITICAL", 3: "UNKNOWN"}


@immutable
class StallThresholds:
    """`-w`/`-c`: Nagios ranges on each engine's stalled seconds."""

    warning: nagios.Range | None = None
    critical: nagios.Range | None = None

    def exit_code(self, stalled_seconds: float) -> int:
        """CRITICAL or WARNING when a range alerts for `stalled_seconds`, else OK."""
        if self.critical is not None and self.critical.alerts(stalled_seconds):
            return EXIT_CRITICAL
        if self.warning is not None and self.warning.alerts(stalled_seconds):
            return EXIT_WARNING
        return EXIT_OK


@immutable
class CheckReport:
    """The outcome of one check: the worst state, the engines' verdicts, and any error."""

    status: Status
    metrics_url: str
    engines: tuple[EngineVerdict, ...]
    error: str | None
    notes: tuple[str, ...]
    scrapes: int
    at: float | None
    restart_policy: ProbeVerdict | None = None  # probe mode only
    events: tuple[PolicyEvent, ...] = ()
    thresholds: StallThresholds | None = None
    scrape_seconds: float | None = None  # how long the last scrape took
    # The probe itself is broken (its state file cannot be used: refused, unwritable, its
    # lock held past the bounded wait): exit 3 even with --critical-only.
    probe_broken: bool = False

    @property
    def exit_code(self) -> int:
        """The Nagios exit code of `status`; WARNING for a wedge the budget will not restart.

        `-w`/`-c` raise it (never lower it) when an engine's stall crosses their range; an
        UNKNOWN stays UNKNOWN.
        """
        code = EXIT_CODES[self.status]
        if code == EXIT_CRITICAL and self.restart_policy is not None and self.restart_policy.ok:
            code = EXIT_WARNING
        if code == EXIT_UNKNOWN or self.thresholds is None:
            return code
        return max([code, *(self.thresholds.exit_code(e.stalled_seconds) for e in self.engines)])

    def to_json(self) -> dict[str, Any]:
        """`{"status", "engines": [...], "error"}`, the documented `--json` schema.

        In probe mode also `gave_up` and `restart_policy` (the probe verdict's decision).
        """
        document: dict[str, Any] = {
            "status": self.status.value,
            "engines": [_engine_json(verdict) for verdict in self.engines],
            "error": self.error,
        }
        if self.restart_policy is not None:
            document["gave_up"] = self.restart_policy.gave_up
            document["restart_policy"] = self.restart_policy.to_json()
        return dict(redact_value(document))

    def render_text(self) -> str:
        """A Nagios-style summary line with the perfdata after `|`, one line per engine, notes.

        A `|` elsewhere (in a URL or a model name) is printed as `¦`: Nagios reads every `|`
        as the start of performance data.
        """
        word = _NAGIOS_WORDS[self.exit_code]
        count = len(self.engines)
        summary = (
            f"{word}: {self.status.value} - {self.metrics_url}, "
            f"{count} engine{'s' if count != 1 else ''}, "
            f"{self.scrapes} scrape{'s' if self.scrapes != 1 else ''}"
        )
        beyond = self._threshold_crossed()
        if beyond:
            summary += f"; {beyond}"
        lines = [summary]
        lines.extend(_engine_line(verdict, self.at) for verdict in self.engines)
        if self.error:
            lines.append(f"error: {self.error}")
        verdict = self.restart_policy
        # Observe mode says so only about a target it would otherwise have failed.
        if verdict is not None and (
            bool(verdict.detail) if verdict.decision == "observe" else verdict.decision != "healthy"
        ):
            lines.append(
                f"restart policy: {verdict.decision}"
                + (f": {verdict.detail}" if verdict.detail else "")
            )
        lines.extend(f"note: {note}" for note in self.notes)
        # The target's values are data: secrets masked, no control character reaches the
        # terminal, one line stays one line.
        text = "\n".join(safe_line(line) for line in lines)
        text = text.replace("|", "\u00a6")
        perfdata = nagios.render_perfdata(self.perfdata())
        if not perfdata:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first} | {perfdata}{newline}{rest}"

    def perfdata(self) -> list[nagios.PerfDatum]:
        """Per engine: stalled seconds (with -w/-c), running, waiting and waiting by reason;
        then how long the last scrape took. Labels carry the engine (and the model when
        there are several) only where there are several engines; unknown values are left out.
        """
        data: list[nagios.PerfDatum] = []
        models = {verdict.key.model_name for verdict in self.engines}
        warn = crit = ""
        if self.thresholds is not None:
            warn = "" if self.thresholds.warning is None else self.thresholds.warning.text
            crit = "" if self.thresholds.critical is None else self.thresholds.critical.text
        for verdict in self.engines:
            prefix = ""
            if len(self.engines) > 1:
                prefix = f"e{verdict.key.engine}_"
                if len(models) > 1:
                    prefix = f"{verdict.key.model_name}_{prefix}"
            if math.isfinite(verdict.stalled_seconds):
                data.append(
                    nagios.PerfDatum(
                        f"{prefix}stalled", verdict.stalled_seconds, "s", warn, crit, 0.0
                    )
                )
            reading = verdict.reading
            if reading is None:
                continue
            counts = [("running", reading.running), ("waiting", reading.waiting)]
            counts += [
                (f"waiting_{reason}", value)
                for reason, value in sorted(reading.waiting_by_reason.items())
            ]
            data.extend(
                nagios.PerfDatum(f"{prefix}{name}", value, "", "", "", 0.0)
                for name, value in counts
                if math.isfinite(value)
            )
        if self.scrape_seconds is not None:
            data.append(nagios.PerfDatum("scrape_time", self.scrape_seconds, "s", minimum=0.0))
        return data

    def _threshold_crossed(self) -> str:
        """`stalled 42.0 s beyond -c 30` for the worst engine a threshold alerts for, or ''."""
        if self.thresholds is None or EXIT_CODES[self.status] == EXIT_UNKNOWN:
            return ""
        for flag, spec in (("-c", self.thresholds.critical), ("-w", self.thresholds.warning)):
            if spec is None:
                continue
            crossing = [e.stalled_seconds for e in self.engines if spec.alerts(e.stalled_seconds)]
            if crossing:
                return f"stalled {max(crossing):.1f} s beyond {flag} {spec.text}"
        return ""


def _engine_json(verdict: EngineVerdict) -> dict[str, Any]:
    reading = verdict.reading
    return {
        "model_name": verdict.key.model_name,
        "engine": verdict.key.engine,
        "state": verdict.state.value,
        "family": None if verdict.family is None else verdict.family.value,
        "running": None if reading is None else _json_number(reading.running),
        "waiting": None if reading is None else _json_number(reading.waiting),
        "waiting_by_reason": None
        if reading is None
        else {k: _json_number(v) for k, v in sorted(reading.waiting_by_reason.items())},
        "stalled_seconds": round(verdict.stalled_seconds, 3),
    }


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _num(value: float) -> str:
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _engine_line(verdict: EngineVerdict, at: float | None) -> str:
    family = verdict.family.value if verdict.family is not None else "-"
    where = f"{verdict.key.model_name} engine {verdict.key.engine}"
    reading = verdict.reading
    if reading is None:
        work = "missing from /metrics" if verdict.missing else "no reading (scrape failed)"
    else:
        work = f"running {_num(reading.running)}, waiting {_num(reading.waiting)}"
        if reading.waiting_by_reason:
            reasons = ", ".join(
                f"{reason} {_num(value)}"
                for reason, value in sorted(reading.waiting_by_reason.items())
            )
            work += f" ({reasons})"
    if verdict.state in (EngineState.SUSPECT, EngineState.WEDGED, EngineState.UNREACHABLE):
        since = f"stalled {verdict.stalled_seconds:.1f} s"
    elif (
        verdict.state is not EngineState.UNKNOWN
        and at is not None
        and verdict.last_progress_at is not None
    ):
        since = f"last progress {max(0.0, at - verdict.last_progress_at):.1f} s ago"
    else:
        since = ""
    parts = [f"{verdict.state.value:<11} {family:<15} {where}: {work}"]
    if since:
        parts.append(since)
    if verdict.state is EngineState.UNKNOWN:
        parts.append(verdict.reason)
    return "; ".join(parts)
