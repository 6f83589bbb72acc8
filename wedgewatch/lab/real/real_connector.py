"""An out-of-tree KV connector for a real CPU `vllm serve`: a CPU tier emulated in memory.

vLLM's built-in offloading connectors refuse the CPU platform, but vLLM loads a connector from
any importable module (``--kv-transfer-config`` with ``kv_connector_module_path``). This one
follows the protocol of vLLM's ``OffloadingConnector`` as far as the scheduler can see it
(../docs/real-vllm.md, "The seed's wedge"):

* **lookups** (``get_num_new_matched_tokens``) answer ``None`` ("not yet, ask again") while any
  block of the request's prompt is still being stored, else the number of tokens the tier holds
  beyond the local prefix-cache hit, loaded asynchronously;
* **loads** are asynchronous: the request is parked ``WAITING_FOR_REMOTE_KVS`` holding its
  blocks, and the worker reports it in ``finished_recving`` ``load_seconds`` after it started;
* **stores** start when a request finishes (its prompt's full blocks) and stay pending for
  ``store_seconds``; then the tier holds those blocks.

What is emulated: the tier holds block hashes, not bytes, and a load leaves the destination
blocks as they are (the tiny model's weights are random: its text is noise either way). What
is real: vLLM's scheduler, KV-cache manager, prefix cache, engine loop and worker calling this
connector through its own interface.

Configuration (``kv_connector_extra_config``): ``store_seconds`` (default 3.0),
``load_seconds`` (default 8.0), ``event_log`` (a file: one JSON line per lookup deferred, load
started, store started or done, read by ``wedgewatch.lab.real.real_wedge``).

This module imports vLLM: it runs only in a serving venv (``install-vllm.sh --serve``).
mypy does not see vLLM: its objects are typed ``Any`` here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore[import-not-found, unused-ignore]
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

STORE_SECONDS = 3.0
LOAD_SECONDS = 8.0


@dataclass
class EmulatedTierMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """Scheduler -> worker: the requests whose asynchronous load starts this step."""

    loads: list[str] = field(default_factory=list)


class _EventLog:
    """One JSON line per event, appended (the scenario driver awaits them)."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        if not self._path:
            return
        line = json.dumps({"t": round(time.time(), 4), "event": event, **fields})
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


class EmulatedTierConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """Both sides of the connector: the scheduler side (tier, lookups) and the worker side."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self.store_seconds = float(extra.get("store_seconds", STORE_SECONDS))
        self.load_seconds = float(extra.get("load_seconds", LOAD_SECONDS))
        self.block_size = int(vllm_config.cache_config.block_size)
        self.is_scheduler = role == KVConnectorRole.SCHEDULER
        self.log = _EventLog(extra.get("event_log") if self.is_scheduler else None)
        # scheduler side
        self.tier: set[Any] = set()
        self.storing: dict[Any, float] = {}  # block hash -> when its store completes
        self.deferred: set[str] = set()
        self.new_loads: list[str] = []
        # worker side
        self.loading: dict[str, float] = {}  # request id -> when its load completes
        self.log.write("ready", pid=os.getpid(), block_size=self.block_size)

    # ------------------------------------------------------------ scheduler side

    def _settle_stores(self) -> None:
        now = time.monotonic()
        done = [h for h, due in self.storing.items() if due <= now]
        for block_hash in done:
            del self.storing[block_hash]
            self.tier.add(block_hash)
        if done:
            self.log.write("stored", blocks=len(done), tier_blocks=len(self.tier))

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._settle_stores()
        prompt_blocks = request.num_prompt_tokens // self.block_size
        hashes = list(request.block_hashes[:prompt_blocks])
        if any(h in self.storing for h in hashes):
            if request.request_id not in self.deferred:
                self.deferred.add(request.request_id)
                self.log.write("deferred", request=request.request_id, tokens=request.num_tokens)
            return None, False
        # A request must compute at least its last token itself.
        limit = (request.num_tokens - 1) // self.block_size
        start = num_computed_tokens // self.block_size
        hits = 0
        for block_hash in hashes[start:limit]:
            if block_hash not in self.tier:
                break
            hits += 1
        if hits == 0:
            return 0, False
        return hits * self.block_size, True

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if num_external_tokens > 0:
            self.new_loads.append(request.request_id)
            self.log.write(
                "load",
                request=request.request_id,
                tokens=request.num_tokens,
                load_tokens=num_external_tokens,
            )

    def build_connector_meta(self, scheduler_output: Any) -> EmulatedTierMetadata:
        self._settle_stores()
        meta = EmulatedTierMetadata(loads=self.new_loads)
        self.new_loads = []
        return meta

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any] | None]:
        self.deferred.discard(request.request_id)
        prompt_blocks = (
            min(request.num_prompt_tokens, request.num_computed_tokens) // self.block_size
        )
        due = time.monotonic() + self.store_seconds
        new = [
            h
            for h in request.block_hashes[:prompt_blocks]
            if h not in self.tier and h not in self.storing
        ]
        for block_hash in new:
            self.storing[block_hash] = due
        if new:
            self.log.write(
                "store",
                request=request.request_id,
                tokens=request.num_tokens,
                blocks=len(new),
                seconds=self.store_seconds,
            )
        return False, None

    # ------------------------------------------------------------ worker side

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        due = time.monotonic() + self.load_seconds
        for request_id in getattr(meta, "loads", ()):
            self.loading[request_id] = due

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return

    def wait_for_save(self) -> None:
        return

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        now = time.monotonic()
        done = {r for r, due in self.loading.items() if due <= now}
        for request_id in done:
            del self.loading[request_id]
        return None, (done or None)
