"""What of the episode core survives a restart of wedgewatch (rule S1 of `core.episode`).

`saved` keeps the policy (`restart_policy.to_record`) and the open episode (id, engine,
family, opened timestamp, bundle); `restored` rebases them onto the new process's clock;
the episode only comes back with the detector state (same boot, `same_boot`), so a
restored wedge emits no second capture or restart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from wedgewatch.core import restart_policy
from wedgewatch.core.episode import Episode, EpisodeState, Rules
from wedgewatch.vllm.signals import EngineKey

# A saved detector state is trusted only when the monotonic clock kept running between the
# save and the load (same boot): the wall and monotonic gaps may then differ by this much.
SAME_BOOT_TOLERANCE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
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
                model_name=episode.key.model_name,
                engine=episode.key.engine,
                family=episode.family,
                opened_timestamp=episode.opened_timestamp,
                bundle_path=episode.bundle,
            ),
        )
    return restart_policy.to_record(state.policy, at, timestamp), episodes


def restored(
    policy: restart_policy.PolicyRecord | None,
    episodes: tuple[EpisodeRecord, ...],
    rules: Rules,
    at: float,
    timestamp: float,
    *,
    detector_restored: bool,
) -> EpisodeState:
    """The state a new process starts from; the episode only with the detector (same boot)."""
    state = EpisodeState()
    if policy is not None:
        state = replace(
            state,
            policy=restart_policy.from_record(policy, rules.restart_policy, at, timestamp),
        )
    if detector_restored and episodes:
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
    return state


def same_boot(saved_at: float, saved_timestamp: float, at: float, timestamp: float) -> bool:
    """Monotonic instants saved at (saved_at, saved_timestamp) still mean something now."""
    drift = abs((timestamp - saved_timestamp) - (at - saved_at))
    return at >= saved_at and drift <= SAME_BOOT_TOLERANCE_SECONDS
