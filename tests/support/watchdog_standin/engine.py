"""Stand-in for an EngineCore with vLLM's stack-dump watchdog (`python engine.py DUMP_DIR`).

Its loop (`run_busy_loop`) blocks in the stand-in publisher's `Queue.put`; its watchdog thread
writes what vLLM 0.34.0's `vllm/utils/watch_dog.py` (`ThreadedWatchDog.dump_stack`) writes,
to the same file name: `VLLM_STACK_DUMP_for_engine_0_<pid>.log`, each dump opened by
`>>> Call stack dump #<n> at <time.ctime()> due to <reason>`, then `faulthandler`'s dump of
every thread, then a rule of 64 `=`. It dumps twice (the second with another reason), prints
`DUMPED <path>` and exits.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time

from kv_events import ZmqEventPublisher


def dump_stack(path: str, seq: int, reason: str) -> None:
    """One numbered dump, appended, in the watchdog's format."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"\n>>> Call stack dump #{seq} at {time.ctime()} due to {reason}\n\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.write("\n" + "=" * 64 + "\n")


def _check_loop(path: str) -> None:
    time.sleep(0.5)
    dump_stack(path, 1, "feed timeout")
    dump_stack(path, 2, "SIGTERM")
    print(f"DUMPED {path}", flush=True)
    os._exit(0)


def run_busy_loop(publisher: ZmqEventPublisher) -> None:
    """The engine loop: publishes every step, and blocks on the second publish."""
    while True:
        publisher.publish(object())


def main() -> None:
    """Start the watchdog thread, then block in the loop."""
    dump_dir = sys.argv[1]
    os.makedirs(dump_dir, exist_ok=True)
    path = os.path.join(dump_dir, f"VLLM_STACK_DUMP_for_engine_0_{os.getpid()}.log")
    threading.Thread(target=_check_loop, args=(path,), daemon=True).start()
    run_busy_loop(ZmqEventPublisher())


if __name__ == "__main__":
    main()
