"""The demo's story, read from the watchdog's `/status` as an operator would, and its live
view (pure: `advance` a `Story` by one `/status` document, `render_*` text for the screen).

`wedgewatch.lab.demo` is the shell that runs the simulator and the watchdog and feeds this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from wedgewatch.config import Config
from wedgewatch.core.detection.states import (
    ACTED_ON,
    CALM,
    THRESHOLD_SETTING,
    CapturePhase,
    EngineState,
    Family,
)

#: Recovered = after the restart, every engine calm for this long while tokens are generated.
RECOVERED_AFTER_SECONDS = 5.0


# ---- the story, read from /status (pure) ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One step of the story, printed as it happens."""

    at: float  # seconds since the demo started
    kind: str  # up, suspect, wedged, bundle, restarting, back, recovered, burst
    text: str
    family: str | None = None  # of a suspect or wedged engine


@dataclass(frozen=True, slots=True)
class Story:
    """What has happened so far; instants are seconds since the demo started."""

    up_at: float | None = None
    suspect_at: float | None = None
    wedged_at: float | None = None
    wedge: Mapping[str, Any] | None = None  # the wedged engine as /status showed it
    bundle: str | None = None
    restart_at: float | None = None
    back_at: float | None = None
    recovered_at: float | None = None
    restarts: int = 0
    tokens_at_back: float | None = None
    tokens_since_back: float = 0.0
    calm_since: float | None = None  # after the restart: every engine calm since then

    @property
    def complete(self) -> bool:
        """Detection, evidence, restart and recovery all happened."""
        return (
            self.wedged_at is not None
            and self.bundle is not None
            and self.restart_at is not None
            and self.recovered_at is not None
        )

    def missing(self) -> list[str]:
        """The steps that did not happen, in story order."""
        steps = [
            ("the server never answered", self.up_at),
            ("no wedge was detected", self.wedged_at),
            ("no evidence bundle was written", self.bundle),
            ("the server was not restarted", self.restart_at),
            ("the server did not recover", self.recovered_at),
        ]
        return [what for what, value in steps if value is None]


def target_of(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The demo's one target in a /status document, if it is there."""
    targets = status.get("targets") or []
    return targets[0] if targets else None


def _generated(target: Mapping[str, Any]) -> float:
    total = 0.0
    for engine in target.get("engines") or []:
        reading = engine.get("last_reading") or {}
        total += float(reading.get("generation_tokens") or 0.0)
    return total


def _engine_name(engine: Mapping[str, Any]) -> str:
    return f"engine {engine.get('engine')} ({engine.get('model_name')})"


def advance(story: Story, status: Mapping[str, Any], at: float) -> tuple[Story, list[Event]]:
    """Fold one /status document into the story; the steps it completed, in order."""
    target = target_of(status)
    if target is None:
        return story, []
    events: list[Event] = []
    state = str(target.get("state"))
    engines = list(target.get("engines") or [])
    restarts = int(target.get("restarts") or 0)
    in_restart = bool(target.get("restart_in_progress"))

    if story.up_at is None and engines and state != EngineState.STARTING:
        story = replace(story, up_at=at)
        names = ", ".join(f"{_engine_name(e)} {e.get('state')}" for e in engines)
        events.append(Event(at, "up", f"the server answers: {names}"))

    if story.wedged_at is None:
        suspect = next((e for e in engines if e.get("state") == EngineState.SUSPECT), None)
        wedged = next((e for e in engines if e.get("state") in ACTED_ON), None)
        if suspect is None and wedged is None and story.suspect_at is not None:
            story = replace(story, suspect_at=None)  # it cleared: the next stall is new
        if story.suspect_at is None and suspect is not None and wedged is None:
            story = replace(story, suspect_at=at)
            events.append(
                Event(
                    at,
                    "suspect",
                    f"{_engine_name(suspect)} suspect: {suspect.get('reason')}",
                    suspect.get("family"),
                )
            )
        if wedged is not None:
            story = replace(story, wedged_at=at, wedge=dict(wedged))
            events.append(
                Event(
                    at,
                    "wedged",
                    f"WEDGE DETECTED: {_engine_name(wedged)} {wedged.get('family')}: "
                    f"{wedged.get('reason')}",
                    wedged.get("family"),
                )
            )

    episode = target.get("episode") or {}
    bundle = episode.get("bundle") or target.get("last_bundle")
    if story.wedged_at is not None and bundle and bundle != story.bundle:
        story = replace(story, bundle=str(bundle))
        events.append(Event(at, "bundle", f"evidence bundle: {bundle}"))

    if restarts > story.restarts:
        story = replace(story, restarts=restarts, back_at=None, tokens_at_back=None)
        if story.restart_at is None:
            story = replace(story, restart_at=at)
        events.append(
            Event(
                at,
                "restarting",
                "restarting: SIGTERM to the server's process group (API server, EngineCore, "
                "both TP workers), SIGKILL after grace_seconds, then the same command again",
            )
        )

    restart_at = story.restart_at
    if (
        restart_at is not None
        and story.back_at is None
        and not in_restart
        and engines
        and state not in ("starting", *ACTED_ON)
    ):
        story = replace(story, back_at=at, tokens_at_back=_generated(target))
        took = at - restart_at
        events.append(
            Event(at, "back", f"the restarted server answers its first scrape ({took:.1f} s)")
        )

    back_at = story.back_at
    if back_at is not None and story.tokens_at_back is not None and story.recovered_at is None:
        generated = max(_generated(target) - story.tokens_at_back, 0.0)
        calm = bool(engines) and all(e.get("state") in CALM for e in engines)
        calm_since = (story.calm_since if story.calm_since is not None else at) if calm else None
        story = replace(story, tokens_since_back=generated, calm_since=calm_since)
        if (
            calm_since is not None
            and at - calm_since >= RECOVERED_AFTER_SECONDS
            and generated > 0
            and state == "ok"
        ):
            story = replace(story, recovered_at=at)
            events.append(
                Event(
                    at,
                    "recovered",
                    f"RECOVERED: serving again, {generated:.0f} tokens generated in the "
                    f"{at - back_at:.0f} s since the restart, every engine ok",
                )
            )
    return story, events


# ---- the live view (pure) ---------------------------------------------------------------------


def threshold_for(family: str | None, settings: Mapping[str, Any]) -> tuple[str, float] | None:
    """The setting (name, seconds) after which a stall of `family` is a wedge."""
    if family is None or family not in THRESHOLD_SETTING:
        return None
    name = THRESHOLD_SETTING[Family(family)]
    return name, float(settings[name])


def _waiting(reading: Mapping[str, Any]) -> str:
    waiting = reading.get("waiting")
    by_reason = reading.get("waiting_by_reason") or {}
    text = "-" if waiting is None else f"{waiting:.0f}"
    reasons = ", ".join(f"{k} {v:.0f}" for k, v in sorted(by_reason.items()) if v)
    return f"{text} ({reasons})" if reasons else text


_COLOURS = {
    "ok": "32",
    "idle": "32",
    "sleeping": "36",
    "starting": "33",
    "suspect": "33",
    "wedged": "31;1",
    "unreachable": "31;1",
}


def render_engines(
    status: Mapping[str, Any],
    settings: Mapping[str, Any],
    rates: Mapping[str, float],
    *,
    colour: bool,
) -> list[str]:
    """One line per engine: state, running, waiting by reason, progress, countdown."""
    target = target_of(status)
    if target is None:
        return ["  (no target yet)"]
    engines = list(target.get("engines") or [])
    if not engines:
        state = str(target.get("state"))
        return [f"  server {state}: {target.get('reason')}"]
    lines = []
    for engine in engines:
        state = str(engine.get("state"))
        shown = f"{state:<11}"
        if colour:
            shown = f"\x1b[{_COLOURS.get(state, '0')}m{shown}\x1b[0m"
        reading = engine.get("last_reading") or {}
        running = reading.get("running")
        rate = rates.get(str(engine.get("engine")), 0.0)
        line = (
            f"  engine {engine.get('engine')}  {shown} running "
            f"{'-' if running is None else f'{running:.0f}'}  waiting {_waiting(reading)}  "
            f"progress {rate:+.0f} tok/s"
        )
        limit = threshold_for(engine.get("family"), settings)
        stalled = float(engine.get("stalled_seconds") or 0.0)
        if state == "suspect" and limit is not None:
            name, seconds = limit
            line += f"  wedge in {max(seconds - stalled, 0.0):.1f} s ({name} = {seconds:g})"
        elif state in ACTED_ON and limit is not None:
            name, seconds = limit
            line += f"  stalled {stalled:.1f} s >= {name} = {seconds:g}"
        lines.append(line)
    return lines


def render_header(status: Mapping[str, Any], elapsed: float, load: str, budget: int | None) -> str:
    """The first line of the view: time, target state, restarts, traffic."""
    target = target_of(status) or {}
    restarts = target.get("restarts", 0)
    remaining = target.get("restart_budget_remaining")
    budget_text = f" (budget left {remaining}/{budget})" if budget and remaining is not None else ""
    return (
        f"t+{elapsed:5.1f}s  server {target.get('state', 'starting')}  restarts {restarts}"
        f"{budget_text}  traffic: {load}"
    )


def bundle_report(summary: Mapping[str, Any]) -> list[str]:
    """What a completed bundle holds, in a few lines: verdict, triage, stacks by role."""
    triage = summary.get("triage") or {}
    phases = summary.get("phases") or {}
    stacks = (phases.get(CapturePhase.WEDGED) or phases.get(CapturePhase.SUSPECT) or {}).get(
        "stacks"
    ) or []
    dumped = [s for s in stacks if s.get("have_json")]
    roles: dict[str, int] = {}
    for record in dumped:
        role = str(record.get("role"))
        roles[role] = roles.get(role, 0) + 1
    by_role = ", ".join(f"{role} x{n}" if n > 1 else role for role, n in sorted(roles.items()))
    lines = [
        f"triage: {triage.get('kind')}: {triage.get('summary')}",
        f"py-spy stacks of {len(dumped)} processes ({by_role or 'none'}), process tree, "
        "/metrics at suspect and at the wedge, the flight recorder",
    ]
    if summary.get("ptrace_denied"):
        lines.append(
            "py-spy was not allowed to read the stacks (ptrace denied): run the demo as root, "
            "or allow it with `sudo sysctl -w kernel.yama.ptrace_scope=0`"
        )
    return lines


def render_summary(
    story: Story,
    settings: Mapping[str, Any],
    bundle_lines: Sequence[str],
    log_path: Path,
) -> list[str]:
    """The closing summary: detection, evidence, restart, recovery (or what is missing)."""
    lines = ["", "Summary"]
    wedge = story.wedge or {}
    if story.wedged_at is not None:
        since = story.suspect_at if story.suspect_at is not None else story.wedged_at
        lines.append(
            f"  detected   {wedge.get('family')} on engine {wedge.get('engine')} at "
            f"t+{story.wedged_at:.0f}s, {story.wedged_at - since:.0f} s after it turned "
            f"suspect (stall_after_seconds = {settings['stall_after_seconds']:g} for the demo; "
            f"{Config().stall_after_seconds:g} by default)"
        )
        lines.append(f"             {wedge.get('reason')}")
    if story.bundle is not None:
        lines.append(f"  evidence   {story.bundle}")
        lines.extend(f"             {line}" for line in bundle_lines)
    if story.restart_at is not None:
        back = "" if story.back_at is None else f", back {story.back_at - story.restart_at:.1f} s"
        lines.append(
            f"  restart    {story.restarts} restart(s) by the launcher (remedy supervise) at "
            f"t+{story.restart_at:.0f}s{back}"
        )
    if story.recovered_at is not None:
        lines.append(
            f"  recovery   serving again at t+{story.recovered_at:.0f}s "
            f"({story.tokens_since_back:.0f} tokens since the restart)"
        )
    for what in story.missing():
        lines.append(f"  MISSING    {what}")
    lines.append(f"  logs       {log_path} (the server's and the watchdog's, JSON lines)")
    return lines
