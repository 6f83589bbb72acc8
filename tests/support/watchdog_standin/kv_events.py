"""Stand-in for vLLM's KV-event publisher: `publish` puts on a bounded queue nobody drains,
as `ZmqEventPublisher.publish` does in `vllm/distributed/kv_events.py` (vLLM #53859)."""

from __future__ import annotations

import queue


class ZmqEventPublisher:
    """A publisher whose sender never drains its one-slot queue."""

    def __init__(self) -> None:
        self._event_queue: queue.Queue[object] = queue.Queue(maxsize=1)

    def publish(self, events: object) -> None:
        """Blocks once the queue is full, like the real one."""
        self._event_queue.put(events)
