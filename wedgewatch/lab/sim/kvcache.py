"""KV memory for the simulated scheduler: the GPU block pool with a prefix cache.

Pure bookkeeping with no notion of time except the step numbers passed in. Mirrors the parts of
vLLM's ``BlockPool`` / ``KVCacheManager`` that decide whether a request can be admitted:

* The GPU pool has ``num_blocks`` blocks with reference counts, block 0 being vLLM's null block
  (never allocated), so ``num_blocks - 1`` are usable. A block with no references sits
  in the free queue, oldest first; allocation takes from the head, so the least recently freed
  block is evicted first. A freed block keeps its content hash, so it stays reusable through the
  prefix cache until it is reallocated (cached-but-free blocks count as free).
* The CPU tier and the transfers between the two live in ``wedgewatch/lab/sim/offload.py``.

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
        # Free queue: insertion order is eviction order (head = least recently freed). Block 0 is
        # vLLM's null block: never handed out, not counted in the usage.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self._cached: dict[BlockHash, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks with no reference, cached or not (what an allocation may take)."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by some request (cached-but-free blocks count as
        free; the null block is not usable)."""
        return 1.0 - len(self._free) / max(self.num_blocks - 1, 1)

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
