"""What of the episode core survives a restart of wedgewatch (rule S1 of `core.episode`).

`saved` keeps the policy (`restart_policy.to_record`) and the open episode (id, engine,
family, opened timestamp, bundle); `restored` rebases them onto the new process's clock;
the episode only comes back with the detector state (same boot, `same_boot`), so a
restored wedge emits no second capture or restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from wedgewatch.core.detection.detect import TargetState
from wedgewatch.core.detection.detect_state import dump_state, load_state
from wedgewatch.core.episode.episode import Episode, EpisodeState, Rules
from wedgewatch.core.restart import restart_policy
from wedgewatch.core.text.redact import redact_text, redact_url
from wedgewatch.core.values import immutable
from wedgewatch.vllm.signals import EngineKey

# A saved detector state is trusted only when the monotonic clock kept running between the
# save and the load (same boot): the wall and monotonic gaps may then differ by this much.
SAME_BOOT_TOLERANCE_SECONDS = 60.0


@immutable
class EpisodeRecord:
    """An open episode as the state file keeps it (Unix seconds)."""

    episode_id: str
    model_name: str
    engine: str
    family: str
    opened_timestamp: float
    bundle_path: str | None = None


def saved(
    state: EpisodeState, at: float, timestamp: float
) -> tuple[restart_policy.PolicyRecord, tuple[EpisodeRecord, ...]]:
    """What survives a restart of wedgewatch: the policy record and the open episode."""
    episode = state.episode
    episodes: tuple[EpisodeRecord, ...] = ()
    if episode is not None:
        episodes = (
            EpisodeRecord(
                episode_id=episode.episode_id,
                model_name=redact_text(episode.key.model_name),  # a file keeps no secret
                engine=episode.key.engine,
                family=episode.family,
                opened_timestamp=episode.opened_timestamp,
                bundle_path=episode.bundle,
            ),
        )
    return restart_policy.to_record(state.policy, at, timestamp), episodes


@immutable
class Restored:
    """What a new process starts from for one target."""

    state: EpisodeState
    detector: TargetState | None  # None: start the detector afresh
    problem: str | None = None  # why a saved detector state was malformed (for a log line)


def restored(
    policy: restart_policy.PolicyRecord | None,
    episodes: tuple[EpisodeRecord, ...],
    rules: Rules,
    at: float,
    timestamp: float,
    *,
    saved_detector: Mapping[str, Any] | None,
    url: str,
) -> Restored:
    """S1: the policy always; the detector only when it watched this `url` in this boot
    (`same_boot`); the open episode only with the detector, so a restored wedge emits no
    second capture or restart."""
    state = EpisodeState()
    if policy is not None:
        state = replace(
            state,
            policy=restart_policy.from_record(policy, rules.restart_policy, at, timestamp),
        )
    detector, problem = trusted_detector(saved_detector, url, at, timestamp)
    if detector is not None and episodes:
        record = episodes[0]
        episode = Episode(
            episode_id=record.episode_id,
            key=EngineKey(record.model_name, record.engine),
            family=record.family,
            opened_at=at - max(timestamp - record.opened_timestamp, 0.0),
            opened_timestamp=record.opened_timestamp,
            bundle=record.bundle_path,
            suspect_asked=record.bundle_path is not None,
        )
        state = replace(state, episode=episode, last_bundle=record.bundle_path)
    return Restored(state, detector, problem)


def saved_detector(detector: TargetState, url: str, at: float, timestamp: float) -> dict[str, Any]:
    """The detector state as the state file keeps it, with what `restored` checks it by."""
    return {
        "url": redact_url(url),  # a file on disk keeps no credential: the shown form
        "saved_at": at,
        "saved_timestamp": timestamp,
        "state": dump_state(detector),
    }


def trusted_detector(
    saved: Mapping[str, Any] | None, url: str, at: float, timestamp: float
) -> tuple[TargetState | None, str | None]:
    """(the saved detector state if still meaningful, why it was malformed)."""
    if saved is None:
        return None, None
    try:
        if saved.get("url") not in (redact_url(url), url):  # url: an older file
            return None, None  # the name now points at another server
        if not same_boot(float(saved["saved_at"]), float(saved["saved_timestamp"]), at, timestamp):
            return None, None  # another boot: monotonic instants mean nothing now
        return load_state(saved["state"]), None
    except (KeyError, TypeError, ValueError) as exc:
        return None, str(exc)


def same_boot(saved_at: float, saved_timestamp: float, at: float, timestamp: float) -> bool:
    """Monotonic instants saved at (saved_at, saved_timestamp) still mean something now."""
    drift = abs((timestamp - saved_timestamp) - (at - saved_at))
    return at >= saved_at and drift <= SAME_BOOT_TOLERANCE_SECONDS
