"""The probe's state file (`wedgewatch check --state-file`): what one run leaves the next.

One JSON object, written atomically (`io.atomic.write_atomic`) and read never through a
symlink nor from another user (`io.private_paths`):

* `version` (`STATE_FILE_VERSION`; 1 held the detector only), `metrics_url` (redacted: no
  credential on disk), `saved_timestamp`;
* `detector`: the detector's state (`core.detect_state`), trusted only while it is younger
  than the shortest wedge threshold and from this boot;
* `restart_policy` and `probe`: the restart state, through `core.restart_codec`, the same
  codec as the daemon's `state.json` (so the two files cannot disagree on its shape);
* `settings`: the validated settings cache of `check.settings` (the exec probe's fast path).

A corrupt, unreadable, foreign (another URL) or outdated file is reported as a note and
replaced, never a crash; overlapping probes take turns on a lock beside the file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from wedgewatch.check.log import log
from wedgewatch.core.detection.detect import DetectionPolicy, TargetState
from wedgewatch.core.detection.detect_state import dump_state, load_state
from wedgewatch.core.restart import probe_step, restart_codec
from wedgewatch.core.restart.probe_step import ProbeState
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.core.text.redact import redact_url
from wedgewatch.io.atomic import write_atomic
from wedgewatch.io.private_paths import open_lock_file, private_dir, read_private

STATE_FILE_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # version 1 held the detector only

#: How often a check waiting for the state file's lock tries again.
LOCK_RETRY_SECONDS = 0.05
#: Slack on top of a check's own bound (window plus one scrape) when waiting for the lock.
LOCK_WAIT_MARGIN_SECONDS = 2.0

#: Monotonic seconds, and a sleep (blocking or asyncio's): injected, so tests never wait.
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class StateFile:
    """One probe's state file and what its contents are judged by."""

    path: Path
    metrics_url: str
    policy: DetectionPolicy  # the detector's thresholds: how old a detector history may be
    restart: RestartPolicy | None  # None: no restart state is kept
    settings_cache: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Saved:
    """What the state file carries from one check to the next."""

    detector: TargetState = field(default_factory=TargetState.initial)
    probe: ProbeState = field(default_factory=ProbeState)


async def lock_beside(path: Path, wait_seconds: float, clock: Clock, sleep: Sleep) -> int:
    """Take an exclusive lock beside the state file, so overlapping probes take turns.

    Returns the lock's file descriptor; closing it releases the lock. Every check ends
    within its window plus one scrape timeout, so a probe waits that long (`wait_seconds`)
    and a margin at most: a lock held longer is someone else's doing, and the check is
    UNKNOWN (an OSError) rather than blocked for ever. The directory is created 0700 or
    checked, and the lock file is 0600 and never opened through a symlink.
    """
    private_dir(path.parent, "the state file's directory")
    lock = path.with_name(path.name + ".lock")
    fd = open_lock_file(lock)
    wait = wait_seconds + LOCK_WAIT_MARGIN_SECONDS
    deadline = clock() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if clock() >= deadline:
                    raise TimeoutError(
                        f"its lock {lock} was held by another process for {wait:g} s, longer "
                        "than any check lasts; is something else holding it?"
                    ) from None
            await sleep(LOCK_RETRY_SECONDS)
    except BaseException:
        os.close(fd)
        raise


def max_state_age(policy: DetectionPolicy) -> float:
    """State older than the shortest wedge threshold could fake a stall across the gap."""
    return min(
        policy.stall_after_seconds, policy.hang_after_seconds, policy.output_stall_after_seconds
    )


def load(store: StateFile, now: float, timestamp: float, notes: list[str]) -> Saved:
    """The state saved by the previous check, or a fresh one with a note why.

    The restart state survives any gap between runs (a container restart takes a model
    load); the detector's history only a short one.
    """
    path = store.path

    def fresh(why: str, kept: Saved | None = None) -> Saved:
        note = f"state file {path} {why}; starting a new history"
        notes.append(note)
        log("warning", "state_file_replaced", path=str(path), reason=why)
        return kept if kept is not None else Saved()

    try:
        raw = read_private(path)  # never through a symlink, never another user's file
    except FileNotFoundError:
        return Saved()
    except OSError as exc:
        return fresh(f"cannot be read ({exc.strerror or exc})")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return fresh(f"is not valid JSON ({exc})")
    if not isinstance(data, dict):
        return fresh("does not hold a JSON object")
    if data.get("version") not in _READABLE_VERSIONS:
        return fresh(f"has version {data.get('version')!r}, expected {STATE_FILE_VERSION}")
    shown = stored_url(store.metrics_url)  # the form `save` writes
    if data.get("metrics_url") not in (shown, store.metrics_url):  # the raw form: an older file
        # A note is check output, which `CheckReport.render_text` redacts.
        return fresh(f"belongs to {str(data.get('metrics_url'))!r}, not {shown}")
    kept = Saved()
    if store.restart is not None:
        policy = restart_codec.decode(data.get("restart_policy"), None)
        if isinstance(policy, str):
            return fresh(f"holds a malformed restart state ({policy})")
        served = restart_codec.decode(None, data.get("probe"))
        if isinstance(served, str):  # the budget is kept: only the unproven failures go
            notes.append(
                f"state file {path} holds malformed probe failures ({served}); forgot them"
            )
            served = restart_codec.RestartRecord()
        record = restart_codec.RestartRecord(policy.policy, served.probe)
        probe = probe_step.from_record(record, store.restart, now, timestamp, keep_health=True)
        kept = Saved(probe=probe)
    try:
        state = load_state(data.get("detector"))  # type: ignore[arg-type]  # checked by load_state
    except (ValueError, TypeError, AttributeError) as exc:
        return fresh(f"is malformed ({exc})", kept)
    if state.last_at is not None:
        age = now - state.last_at
        limit = max_state_age(store.policy)
        if age < 0:
            return fresh("is from before this boot (the monotonic clock went backwards)", kept)
        if age > limit:
            return fresh(
                f"is {age:.0f} s old, older than the shortest wedge threshold ({limit:g} s)",
                kept,
            )
    return replace(kept, detector=state)


def stored_url(metrics_url: str) -> str:
    """The target's URL as the state file keeps it, and matches it by: without credentials
    (`redact_url`; no secret on disk)."""
    return redact_url(metrics_url)


def save(store: StateFile, saved: Saved, at: float, timestamp: float) -> None:
    """Write the state atomically (temporary file, fsync, rename); OSError if it cannot."""
    payload: dict[str, Any] = {
        "version": STATE_FILE_VERSION,
        "metrics_url": stored_url(store.metrics_url),
        "saved_timestamp": timestamp,
        "detector": dump_state(saved.detector),
    }
    if store.restart is not None:
        payload.update(restart_codec.encode(probe_step.to_record(saved.probe, at, timestamp)))
    if store.settings_cache is not None:
        payload["settings"] = dict(store.settings_cache)
    write_atomic(
        store.path,
        json.dumps(payload, allow_nan=False, separators=(",", ":")).encode(),
        make_parents=True,
    )
