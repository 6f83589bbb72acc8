"""Upstream wedge variants on vLLM's own code, on a CPU (runs in a vLLM venv).

Each scenario drives the real objects of the installed ``vllm`` into one upstream issue's
end state and prints one JSON line: the version, the scheduler's queues, and the Prometheus
exposition that vLLM's own ``PrometheusStatLogger`` writes for that state (fed the real
``Scheduler.make_stats()``), so a test can hand the body to wedgewatch's parser and detector
and pin the family a server in that state gets.

* ``parked-load-never-finished``: a request admitted as an async KV load whose transfer the
  connector never reports finished (``wedgewatch.lab.real.vllm_engine``'s ``hung-load``
  fault on the OffloadingConnector). vLLM #56640 (NIXL, a full prefix-cache hit never
  reported) and LMCache's stuck retrieves leave the scheduler in exactly this state: the
  request in ``WAITING_FOR_REMOTE_KVS`` with its blocks, promoted only when its id comes back
  in ``finished_recving``. The connector that loses the report differs; the scheduler and
  metric code that shows it do not.
* ``hit-pending``: a request whose prefix chunk is still being stored when the connector is
  asked, and whose store one TP rank never confirms (the ``lost-store-event`` fault): the
  OffloadingConnector answers "not yet" (``HIT_PENDING``) on every pass (vLLM #49829).
* ``publisher-blocked``: vLLM's ``ZmqEventPublisher`` with a one-slot queue whose sender
  thread is stalled; the calling thread (EngineCore's loop, in a server) blocks in
  ``publish`` -> ``Queue.put`` (vLLM #53859). Its stacks are dumped with ``faulthandler``
  in the format of vLLM's watchdog dump file (``VLLM_STACK_DUMP_for_<name>_<pid>.log``, as
  ``vllm/utils/watch_dog.py`` of 0.34.0 writes it). The calling thread's function is named
  ``run_busy_loop`` after the EngineCore loop it stands for; every frame above it is vLLM's.

``python -m wedgewatch.lab.real.variants SCENARIO`` prints the JSON line.
mypy does not see vLLM (it lives in another venv): its objects are typed ``Any`` here.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import tempfile
import threading
import time
from typing import Any

from wedgewatch.lab.real.vllm_engine import RealEngine, RealSettings
from wedgewatch.lab.sim.load import PlannedRequest

SCENARIOS = ("parked-load-never-finished", "hit-pending", "publisher-blocked")
POOL_BLOCKS = 96
"""A pool small enough that a second long prompt evicts the first one's cached blocks, so the
third request (the first one's prompt again) must come from the CPU tier."""
STEPS = 300


def _planned(index: int, prefix: str, tokens: int) -> PlannedRequest:
    return PlannedRequest(
        index=index,
        send_at_seconds=0.0,
        prompt_tokens=tokens,
        max_tokens=4,
        prefix_id=prefix,
        prefix_tokens=tokens,
    )


def _run(engine: RealEngine, steps: int) -> None:
    for _ in range(steps):
        if engine.has_work():
            engine.step()
        else:
            engine.step_count += 1


def exposition(engine: RealEngine) -> str:
    """The /metrics text vLLM's own PrometheusStatLogger writes for the scheduler's stats."""
    import prometheus_client  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415
    from vllm.v1.metrics.loggers import PrometheusStatLogger  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    model = engine.vllm_config.model_config
    if not hasattr(model, "served_model_name"):
        model.served_model_name = "wedgewatch/emulated"
    logger = PrometheusStatLogger(engine.vllm_config, [0])
    logger.record(scheduler_stats=engine.scheduler.make_stats(), iteration_stats=None)
    body: bytes = prometheus_client.generate_latest()
    return body.decode()


def scheduler_variant(fault: str) -> dict[str, Any]:
    """Run A, evict it with B, then ask for A's prompt again (C) under `fault`."""
    engine = RealEngine(
        RealSettings(num_gpu_blocks=POOL_BLOCKS, async_scheduling=False, fault=fault)
    )
    engine.add_request("a", _planned(0, "A", 640))
    _run(engine, 60)
    engine.add_request("b", _planned(1, "B", 1200))
    _run(engine, 60)
    engine.add_request("c", _planned(2, "A", 640))
    _run(engine, STEPS)
    stats = engine.scheduler.make_stats()
    return {
        "end_state": engine.end_state(),
        "stats": {
            "num_running_reqs": stats.num_running_reqs,
            "num_waiting_reqs": stats.num_waiting_reqs,
            "num_skipped_waiting_reqs": stats.num_skipped_waiting_reqs,
        },
        "exposition": exposition(engine),
    }


def publisher_blocked() -> dict[str, Any]:
    """Block the calling thread in vLLM's ZmqEventPublisher.publish; its watchdog-format dump."""
    from vllm.distributed.kv_events import KVEventBatch, ZmqEventPublisher  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    tmp = tempfile.mkdtemp(prefix="wedgewatch-publisher-")
    publisher = ZmqEventPublisher(0, endpoint=f"ipc://{tmp}/events", max_queue_size=1)
    gate = threading.Event()
    real_socket = publisher._pub

    class _StalledSocket:  # a subscriber that never drains: the sender thread never returns
        def __getattr__(self, name: str) -> Any:
            return getattr(real_socket, name)

        def send_multipart(self, _parts: object) -> None:
            gate.wait()

    publisher._pub = _StalledSocket()
    published: list[int] = []

    def run_busy_loop() -> None:
        """Stands in for EngineCore's loop (named as it is, so the dump reads as a server's
        would): in a server, Scheduler.update_from_output publishes every step."""
        for index in range(4):
            publisher.publish(KVEventBatch(ts=time.time(), events=[]))
            published.append(index)

    caller = threading.Thread(target=run_busy_loop, name="engine-core-loop", daemon=True)
    caller.start()
    caller.join(timeout=2.0)
    path = os.path.join(tmp, f"VLLM_STACK_DUMP_for_engine_0_{os.getpid()}.log")
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"\n>>> Call stack dump #1 at {time.ctime()} due to feed timeout\n\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.write("\n" + "=" * 64 + "\n")
    with open(path, encoding="utf-8") as f:
        dump = f.read()
    return {
        "blocked": caller.is_alive(),
        "published": len(published),
        "dump_name": os.path.basename(path),
        "dump": dump,
    }


def main(argv: list[str] | None = None) -> int:
    """Run one scenario and print its JSON line."""
    parser = argparse.ArgumentParser(prog="python -m wedgewatch.lab.real.variants")
    parser.add_argument("scenario", choices=SCENARIOS)
    args = parser.parse_args(argv)
    import vllm  # type: ignore[import-not-found, unused-ignore]  # noqa: PLC0415

    if args.scenario == "publisher-blocked":
        result = publisher_blocked()
    else:
        fault = "hung-load" if args.scenario == "parked-load-never-finished" else "lost-store-event"
        result = scheduler_variant(fault)
    print(json.dumps({"vllm": vllm.__version__, "scenario": args.scenario, **result}), flush=True)
    os._exit(0)  # the stalled publisher thread and vLLM's threads must not hold the exit


if __name__ == "__main__":
    raise SystemExit(main())
