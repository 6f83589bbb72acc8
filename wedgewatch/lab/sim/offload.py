"""The KV connector of the scheduler model: vLLM's ``OffloadingConnector`` and its workers (pure).

Two halves, as in vLLM:

* ``OffloadConnector`` is the scheduler side (vLLM 0.30's
  ``offloading/scheduler.py``). Every step it turns the blocks that the batch completes into
  *store jobs* (stores as blocks are computed, not only at preemption), issues a *load job* for
  each admitted request with a CPU hit, and asks for a *flush* of the jobs of preempted
  requests and of jobs whose GPU blocks were handed out again. A request with any job in flight
  gets ``None`` from ``lookup`` ("still has in-flight transfers"), as does a request whose hit
  reaches a block still being stored (``HIT_PENDING``) or a chunk another request is loading
  ("chunks being loaded"). ``None`` makes the scheduler skip the request this pass, holding no
  blocks.
* ``ConnectorWorkers`` emulates the per-rank worker side exactly as
  ``wedgewatch/lab/real/vllm_engine.py`` does for the real scheduler: a store waits for the next
  step,
  then drains through one FIFO pipe of ``store_blocks_per_step`` blocks per step (0: the whole
  pipe drains every step); a flushed
  job completes at once; a load lands ``load_steps`` steps after it started. Completions travel
  back with the step's output, so under async scheduling the scheduler learns of them one
  ``schedule()`` late.

Faults (``arm``), as ``vllm_engine``'s worker emulation has them: ``lost-store-event`` drops the
completion of the next store job on one TP rank (the job, and the CPU copy of its blocks, stay
pending forever); ``hung-load`` never finishes the next load (its request stays parked, holding
its blocks, and its chunks stay "being loaded"). That rank reports its copies in order, so every
later transfer of the same direction stays unreported too.

``simple=True`` models ``SimpleCPUOffloadConnector`` instead: its lookup never answers ``None``
(a hit is finished or it is 0), and the GPU blocks of a store stay pinned until every rank has
confirmed it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from wedgewatch.lab.sim.kvcache import BlockHash

TransferFault = Literal["lost-store-event", "hung-load"]


@dataclass(slots=True)
class TransferJob:
    """One store or load of some blocks of one request."""

    job_id: int
    owner: object
    """The scheduler's request object (identity only)."""
    keys: tuple[BlockHash, ...]
    gpu_blocks: tuple[int, ...]
    is_store: bool


@dataclass(slots=True)
class ConnectorMeta:
    """What one ``schedule()`` hands the workers (vLLM's ``OffloadingConnectorMetadata``)."""

    load_jobs: list[TransferJob] = field(default_factory=list)
    store_jobs: list[TransferJob] = field(default_factory=list)
    jobs_to_flush: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class ConnectorOutput:
    """What the workers report with a step's output."""

    completed_jobs: tuple[int, ...] = ()
    finished_recving: tuple[object, ...] = ()


@dataclass(slots=True)
class _PipeEntry:
    """A store in the workers' FIFO pipe, with the blocks it still has to move."""

    job: TransferJob
    left: int


class CpuTier:
    """The CPU tier: an LRU set of block keys, each pending until its store completes."""

    __slots__ = ("_entries", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[BlockHash, bool] = OrderedDict()  # key -> stored (ready)

    def __len__(self) -> int:
        return len(self._entries)

    def prepare_store(self, keys: Iterable[BlockHash]) -> list[BlockHash]:
        """The keys not held yet; they are added as pending (a store of them starts)."""
        entries = self._entries
        new: list[BlockHash] = []
        for key in keys:
            if key in entries:
                entries.move_to_end(key)
                continue
            entries[key] = False
            new.append(key)
        self._evict()
        return new

    def complete_store(self, keys: Iterable[BlockHash]) -> None:
        """The store of ``keys`` landed: they become readable."""
        entries = self._entries
        for key in keys:
            if key in entries:
                entries[key] = True

    def match(self, keys: Iterable[BlockHash]) -> int | None:
        """Length of the run of ``keys`` held here, or None if it reaches a pending store."""
        entries = self._entries
        count = 0
        for key in keys:
            ready = entries.get(key)
            if ready is None:
                break
            if not ready:
                return None
            count += 1
        return count

    def touch(self, keys: Iterable[BlockHash]) -> None:
        """Mark keys as just used (a load reads them)."""
        entries = self._entries
        for key in keys:
            if key in entries:
                entries.move_to_end(key)

    def _evict(self) -> None:
        entries = self._entries
        while len(entries) > self.capacity:
            victim = next((key for key, ready in entries.items() if ready), None)
            if victim is None:
                return  # only pending stores left: they cannot be evicted
            del entries[victim]


class OffloadConnector:
    """The scheduler side of the offloading connector."""

    def __init__(self, capacity_blocks: int, *, simple: bool = False) -> None:
        self.tier = CpuTier(capacity_blocks)
        self.simple = simple
        self.jobs: dict[int, TransferJob] = {}
        self.jobs_of: dict[object, set[int]] = {}
        self.chunks_being_loaded: set[BlockHash] = set()
        self.next_stored: dict[object, int] = {}
        self._next_job_id = 0
        self._meta = ConnectorMeta()
        self._fenced: dict[int, set[int]] = {}  # GPU block of a finished request -> jobs

    # -------------------------------------------------------------- lookup and loads

    def has_jobs(self, owner: object) -> bool:
        """A store or load of this request is still in flight."""
        return bool(self.jobs_of.get(owner))

    def lookup(self, owner: object, keys: Sequence[BlockHash]) -> int | None:
        """Blocks of ``keys`` (those beyond the GPU hit) loadable from the CPU, or None."""
        if not self.simple and self.has_jobs(owner):
            return None  # "still has in-flight transfers"
        hit = self.tier.match(keys)
        if hit is None:
            if self.simple:
                return 0  # SimpleCPUOffload: a pending store is a miss, never "not yet"
            return None  # HIT_PENDING
        loading = self.chunks_being_loaded
        if hit and not self.simple and loading and any(key in loading for key in keys[:hit]):
            return None  # chunks being loaded by another request
        return hit

    def issue_load(
        self, owner: object, keys: Sequence[BlockHash], gpu_blocks: Sequence[int]
    ) -> None:
        """Start loading ``keys`` into ``gpu_blocks`` (vLLM: ``update_state_after_alloc``)."""
        job = self._new_job(owner, tuple(keys), tuple(gpu_blocks), is_store=False)
        self.tier.touch(keys)
        self._meta.load_jobs.append(job)
        self.chunks_being_loaded.update(keys)

    # -------------------------------------------------------------- stores

    def store(
        self,
        owner: object,
        keys: Sequence[BlockHash],
        gpu_blocks: Sequence[int],
        upto: int,
        *,
        fence: bool = False,
    ) -> TransferJob | None:
        """Store the request's blocks ``[next_stored, upto)`` not held by the tier yet."""
        start = self.next_stored.get(owner, 0)
        if upto <= start:
            return None
        self.next_stored[owner] = upto
        new_keys = set(self.tier.prepare_store(keys[start:upto]))
        if not new_keys:
            return None
        pairs = [(k, b) for k, b in zip(keys[start:upto], gpu_blocks[start:upto], strict=True)]
        chosen = [(k, b) for k, b in pairs if k in new_keys]
        job = self._new_job(
            owner, tuple(k for k, _ in chosen), tuple(b for _, b in chosen), is_store=True
        )
        self._meta.store_jobs.append(job)
        if fence:
            self._fence(job)
        return job

    def flush(self, owner: object) -> None:
        """A preempted request: its pending stores are flushed (the worker waits for them)."""
        if not self.simple:
            self._meta.jobs_to_flush.update(self.jobs_of.get(owner, ()))

    def finished(self, owner: object) -> None:
        """The request finished: its blocks go back to the pool, fenced by its pending stores."""
        self.next_stored.pop(owner, None)
        for job_id in self.jobs_of.get(owner, ()):
            job = self.jobs[job_id]
            if job.is_store:
                self._fence(job)

    def blocks_reallocated(self, blocks: Iterable[int]) -> None:
        """GPU blocks handed out again: flush the pending stores still reading them."""
        if not self._fenced:
            return
        for block in blocks:
            jobs = self._fenced.get(block)
            if jobs:
                self._meta.jobs_to_flush.update(jobs)

    def take_meta(self) -> ConnectorMeta:
        """The metadata of this schedule (vLLM: ``build_connector_meta``)."""
        meta, self._meta = self._meta, ConnectorMeta()
        return meta

    # -------------------------------------------------------------- completions

    def update(self, output: ConnectorOutput) -> list[TransferJob]:
        """Apply the workers' report (vLLM: ``update_connector_output``); the stores done."""
        stores: list[TransferJob] = []
        for job_id in output.completed_jobs:
            job = self.jobs.pop(job_id, None)
            if job is None:
                continue
            owned = self.jobs_of.get(job.owner)
            if owned is not None:
                owned.discard(job_id)
                if not owned:
                    del self.jobs_of[job.owner]
            if job.is_store:
                stores.append(job)
                self.tier.complete_store(job.keys)
                for block in job.gpu_blocks:
                    jobs = self._fenced.get(block)
                    if jobs is not None:
                        jobs.discard(job_id)
                        if not jobs:
                            del self._fenced[block]
            else:
                self.chunks_being_loaded.difference_update(job.keys)
        return stores

    def _new_job(
        self,
        owner: object,
        keys: tuple[BlockHash, ...],
        gpu_blocks: tuple[int, ...],
        *,
        is_store: bool,
    ) -> TransferJob:
        self._next_job_id += 1
        job = TransferJob(self._next_job_id, owner, keys, gpu_blocks, is_store)
        self.jobs[job.job_id] = job
        self.jobs_of.setdefault(owner, set()).add(job.job_id)
        return job

    def _fence(self, job: TransferJob) -> None:
        for block in job.gpu_blocks:
            self._fenced.setdefault(block, set()).add(job.job_id)


class ConnectorWorkers:
    """The worker side on every TP rank, as ``vllm_engine._ConnectorWorkers`` emulates it."""

    def __init__(self, load_steps: int, store_blocks_per_step: int) -> None:
        self.load_steps = load_steps
        self.store_blocks_per_step = store_blocks_per_step
        self._deferred: list[TransferJob] = []
        self._pipe: deque[_PipeEntry] = deque()
        self._loads: list[tuple[int, TransferJob]] = []
        self._armed: list[TransferFault] = []
        self._stuck: set[bool] = set()  # directions (is_store) the faulty rank stopped reporting
        self.lost_jobs: set[int] = set()

    def arm(self, fault: TransferFault) -> None:
        """The next store (``lost-store-event``) or load (``hung-load``) never completes."""
        self._armed.append(fault)

    def _mark_faults(self, jobs: Iterable[TransferJob]) -> None:
        """The fault's transfer, and every later one of its direction: the faulty rank reports
        its copies in order (as both real workers poll their streams), so nothing after the
        lost one is reported either."""
        for job in jobs:
            wanted: TransferFault = "lost-store-event" if job.is_store else "hung-load"
            if wanted in self._armed:
                self._armed.remove(wanted)
                self._stuck.add(job.is_store)
            if job.is_store in self._stuck:
                self.lost_jobs.add(job.job_id)

    def execute(self, meta: ConnectorMeta, step: int) -> ConnectorOutput:
        """One step of every rank: flushes, stores through the pipe, loads that land."""
        if self._armed or self._stuck:
            self._mark_faults(meta.store_jobs)
            self._mark_faults(meta.load_jobs)
        completed: list[int] = []
        flushed = meta.jobs_to_flush
        if flushed:
            completed.extend(j.job_id for j in meta.store_jobs if j.job_id in flushed)
            completed.extend(e.job.job_id for e in self._pipe if e.job.job_id in flushed)
            completed.extend(j.job_id for j in self._deferred if j.job_id in flushed)
            meta.store_jobs = [j for j in meta.store_jobs if j.job_id not in flushed]
            self._pipe = deque(e for e in self._pipe if e.job.job_id not in flushed)
            self._deferred = [j for j in self._deferred if j.job_id not in flushed]
        for job in self._deferred:
            self._pipe.append(_PipeEntry(job, len(job.keys)))
        self._deferred = list(meta.store_jobs)
        for job in meta.load_jobs:
            self._loads.append((step + self.load_steps, job))
        budget = self.store_blocks_per_step or sum(e.left for e in self._pipe)
        while self._pipe:
            head = self._pipe[0]
            if head.left > 0:
                if budget <= 0:
                    break
                taken = min(budget, head.left)
                head.left -= taken
                budget -= taken
                if head.left > 0:
                    break
            self._pipe.popleft()
            completed.append(head.job.job_id)
        recving: list[object] = []
        still: list[tuple[int, TransferJob]] = []
        for due, job in self._loads:
            if due <= step:
                completed.append(job.job_id)
                if job.job_id not in self.lost_jobs:
                    recving.append(job.owner)
            else:
                still.append((due, job))
        self._loads = still
        lost = self.lost_jobs
        return ConnectorOutput(
            completed_jobs=tuple(j for j in completed if j not in lost),
            finished_recving=tuple(recving),
        )
