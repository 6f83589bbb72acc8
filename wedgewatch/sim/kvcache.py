"""KV memory for the simulated scheduler: the GPU block pool with a prefix cache, and a CPU tier.

Pure bookkeeping with no notion of time except the step numbers passed in. Mirrors the parts of
vLLM's ``BlockPool`` / ``KVCacheManager`` and of a CPU offloading connector that decide whether a
request can be admitted:

* The GPU pool has ``num_blocks`` blocks with reference counts. A block with no references sits
  in the free queue, oldest first; allocation takes from the head, so the least recently freed
  block is evicted first. A freed block keeps its content hash, so it stays reusable through the
  prefix cache until it is reallocated (cached-but-free blocks count as free).
* The CPU tier holds up to ``capacity`` block hashes, least recently used first. A stored block is
  *pending* until its store lands; a lookup that reaches a pending block cannot say how many
  tokens match yet (vLLM's connector returns ``None``: the ``HIT_PENDING`` case).

A block's identity is its content: the ``n``-th block of a request's shared prefix is the same
block for every request with that prefix; every other block belongs to one request only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

BlockHash = tuple[str, str, int]
"""Content identity of a full block: ("prefix", prefix id, index) for a block inside a shared
prefix, otherwise ("request", request id, index)."""


class BlockPool:
    """The GPU KV blocks: reference counts, an LRU free queue and the prefix-cache index."""

    __slots__ = ("_cached", "_enable_caching", "_free", "_hash", "_ref", "num_blocks")

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self._enable_caching = enable_caching
        self._ref = [0] * num_blocks
        self._hash: list[BlockHash | None] = [None] * num_blocks
        # Free queue: insertion order is eviction order (head = least recently freed).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks with no reference, cached or not (what an allocation may take)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by some request; cached-but-free blocks count as free."""
        return 1.0 - len(self._free) / self.num_blocks

    def find_cached_prefix(self, hashes: Iterable[BlockHash]) -> list[int]:
        """The blocks of the longest run of ``hashes`` that is cached, in order."""
        if not self._enable_caching:
            return []
        found: list[int] = []
        cached = self._cached
        for block_hash in hashes:
            block = cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        return found

    def num_unreferenced(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (touching them takes free capacity)."""
        ref = self._ref
        return sum(1 for block in blocks if ref[block] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Reference cached blocks (a prefix-cache hit), pulling free ones off the free queue."""
        ref = self._ref
        free = self._free
        for block in blocks:
            if ref[block] == 0:
                del free[block]
            ref[block] += 1

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` blocks from the head of the free queue, evicting their cached content."""
        if count > len(self._free):
            raise ValueError(f"cannot allocate {count} blocks: only {len(self._free)} are free")
        blocks: list[int] = []
        free = self._free
        for _ in range(count):
            block, _none = free.popitem(last=False)
            old_hash = self._hash[block]
            if old_hash is not None:
                if self._cached.get(old_hash) == block:
                    del self._cached[old_hash]
                self._hash[block] = None
            self._ref[block] = 1
            blocks.append(block)
        return blocks

    def cache(self, block: int, block_hash: BlockHash) -> None:
        """Record that ``block`` now holds the content ``block_hash`` (it becomes reusable)."""
        if not self._enable_caching or self._hash[block] is not None:
            return
        if block_hash in self._cached:
            # Another block already holds this content; this copy stays private.
            return
        self._hash[block] = block_hash
        self._cached[block_hash] = block

    def free(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks reaching zero join the free queue.

        Blocks are released tail first, so a request's last blocks are evicted before its
        first ones (its prefix stays cached longest), as in vLLM.
        """
        ref = self._ref
        free = self._free
        for block in reversed(blocks):
            ref[block] -= 1
            if ref[block] == 0:
                free[block] = None


class CpuTier:
    """The CPU offload tier: an LRU set of block hashes, each pending until its store lands.

    Stores go through one FIFO pipe that moves ``store_blocks_per_step`` blocks per step, so
    a burst of long requests backs the pipe up and their blocks stay pending for longer (what
    SimpleCPUOffload's ``pending_store_blocks`` gauge shows). 0 means stores land at once.
    """

    __slots__ = ("_entries", "_pipe_cursor", "capacity", "store_blocks_per_step")

    def __init__(self, capacity: int, store_blocks_per_step: int = 0) -> None:
        self.capacity = capacity
        self.store_blocks_per_step = store_blocks_per_step
        # hash -> step from which its CPU copy is readable.
        self._entries: OrderedDict[BlockHash, int] = OrderedDict()
        # Blocks ever pushed into the store pipe, in pipe slots (step * blocks per step).
        self._pipe_cursor = 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(self, hashes: Iterable[BlockHash], now: int) -> None:
        """Offload blocks freed at step ``now``: new ones join the pipe, known ones refresh."""
        if self.capacity <= 0:
            return
        entries = self._entries
        rate = self.store_blocks_per_step
        cursor = max(self._pipe_cursor, now * rate)
        for block_hash in hashes:
            if block_hash in entries:
                entries.move_to_end(block_hash)
                continue
            if rate:
                cursor += 1
                entries[block_hash] = -(-cursor // rate)
            else:
                entries[block_hash] = now
        self._pipe_cursor = cursor
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def match(self, hashes: Iterable[BlockHash], now: int) -> int | None:
        """Length of the run of ``hashes`` held here, or None if the run reaches a pending store."""
        entries = self._entries
        count = 0
        for block_hash in hashes:
            ready_at = entries.get(block_hash)
            if ready_at is None:
                break
            if ready_at > now:
                return None
            count += 1
        return count

    def touch(self, hashes: Iterable[BlockHash]) -> None:
        """Mark blocks as just used (a load reads them), protecting them from LRU eviction."""
        entries = self._entries
        for block_hash in hashes:
            if block_hash in entries:
                entries.move_to_end(block_hash)
