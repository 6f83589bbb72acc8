"""Did a restart really replace the server? A pure judgement from two identities.

After a remedy, the first good scrape is not enough: an `exec` command that only asks
someone else to restart the server (`kubectl rollout restart`, a message to a supervisor)
can return while the old, still wedged server keeps answering. A restart counts only when
something shows a *new* server:

1. `process_start_time_seconds` changed (the serving process was started anew), or
2. the process listening on the target's port changed (another pid, or the same pid with
   another create time), or
3. a progress counter of an engine seen before and after went back (counters of a new
   process start from zero).

When nothing was known about the old server (it never answered and no process was found),
any answer comes from a server that started after wedgewatch looked: that counts as new.
Otherwise, without one of the three, the server is not (yet) proven replaced; the daemon
keeps waiting until `startup_timeout_seconds` and then reports `restart_failed` with
reason `not_replaced`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import field, replace

from wedgewatch.core.values import immutable
from wedgewatch.vllm.semantics import PROGRESS_COUNTERS, progress_counters
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition


def engine_counters(readings: Iterable[EngineReading]) -> dict[EngineKey, tuple[float, ...]]:
    """Each engine's progress counters (`vllm.semantics.progress_counters`, in that order).

    Counters of one server only grow, so they tell a server from its successor: this is
    the one place both `ServerIdentity` and the liveness probe's `ServerMark`
    (`core.probe_policy`) take them from.
    """
    return {reading.key: progress_counters(reading) for reading in readings}


@immutable
class ServerIdentity:
    """What tells one server from its successor, as seen at one instant (None: not known).

    Built from one good scrape's exposition (`of`), as it came; the port's listener is added
    after a restart (`with_listener`). It lives in memory only, for rule N1 of the episode
    core: did *our* restart replace the server? `core.probe_policy.ServerMark` describes the
    same server for another question (did a restart the *kubelet* made after a failed
    liveness probe replace it?) and differs on purpose: it must exist while scrapes fail (a
    probe fails exactly then), so it is read from the detector's last good readings; it is
    persisted in state files that `wedgewatch check` (an exec probe) also writes, so it
    keeps one finite sum per engine; and it has no listener (`check` never looks one up).
    Both take their counters from `engine_counters`.
    """

    process_start_time_seconds: float | None = None
    # engine -> its counters, in the order of `vllm.semantics.progress_counters`
    progress: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    listener_pid: int | None = None
    listener_create_time: float | None = None

    @classmethod
    def of(cls, exposition: Exposition) -> ServerIdentity:
        """What a good scrape says about which server answered."""
        counters = engine_counters(exposition.engines.values())
        return cls(
            process_start_time_seconds=exposition.process_start_time_seconds,
            progress={key.engine: values for key, values in counters.items()},
        )

    @property
    def known(self) -> bool:
        """Does this identity say anything at all?"""
        return (
            self.process_start_time_seconds is not None
            or bool(self.progress)
            or self.listener_pid is not None
        )


@immutable
class Replaced:
    """A new server answers; `proof` says what shows it."""

    proof: str


@immutable
class NotReplaced:
    """Nothing shows a new server (yet); `reason` says what was compared."""

    reason: str


def with_listener(
    identity: ServerIdentity | None, listener: tuple[int, float | None] | None
) -> ServerIdentity:
    """`identity` (or an unknown one) with the port's listener (pid, create time) added."""
    base = identity or ServerIdentity()
    if listener is None:
        return base
    return replace(base, listener_pid=listener[0], listener_create_time=listener[1])


def _counter_went_back(before: ServerIdentity, after: ServerIdentity) -> str | None:
    for engine in sorted(set(before.progress) & set(after.progress)):
        old, new = before.progress[engine], after.progress[engine]
        for name, was, now in zip(PROGRESS_COUNTERS, old, new, strict=True):
            if now < was:
                return f"engine {engine} {name} went back from {was:g} to {now:g}"
    return None


def judge_replacement(before: ServerIdentity, after: ServerIdentity) -> Replaced | NotReplaced:
    """Is the server seen `after` a restart a new one, compared with the one `before` it?"""
    if not before.known:
        return Replaced("nothing was known about the old server; this one answered after it")
    old_start, new_start = before.process_start_time_seconds, after.process_start_time_seconds
    if old_start is not None and new_start is not None and new_start != old_start:
        return Replaced(
            f"process_start_time_seconds changed from {old_start:.3f} to {new_start:.3f}"
        )
    if before.listener_pid is not None and after.listener_pid is not None:
        if after.listener_pid != before.listener_pid:
            return Replaced(
                f"the port's listener changed from pid {before.listener_pid} to pid "
                f"{after.listener_pid}"
            )
        if (
            before.listener_create_time is not None
            and after.listener_create_time is not None
            and after.listener_create_time != before.listener_create_time
        ):
            return Replaced(f"the port's listener pid {after.listener_pid} is a new process")
    went_back = _counter_went_back(before, after)
    if went_back is not None:
        return Replaced(f"progress counters went back: {went_back}")
    compared: list[str] = []
    if old_start is not None and new_start is not None:
        compared.append(f"process_start_time_seconds unchanged ({new_start:.3f})")
    if before.listener_pid is not None and after.listener_pid == before.listener_pid:
        compared.append(f"the port's listener is still pid {before.listener_pid}")
    if set(before.progress) & set(after.progress):
        compared.append("no progress counter went back")
    if not compared:
        compared.append("nothing comparable was seen yet")
    return NotReplaced("the old server still answers: " + ", ".join(compared))
