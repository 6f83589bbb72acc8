"""Real child processes for the restarters, restart-policy and statefile tests (run as a
script, never imported).

Modes:
  tree DIR [--stubborn ROLE,...] [--escape ROLE] [--orphan ROLE]
      A server-like tree: `root` starts `child0` and `child1`, each starts one grandchild
      (`grand0`, `grand1`). Every process writes DIR/<role>.pid once it is set up, then
      sleeps. Roles in --stubborn ignore SIGTERM; the --escape role calls setsid() and so
      leaves the process group (only the tree snapshot can find it); the --orphan role
      exits once its child runs, so that child is orphaned (only the group can find it).
  parent DIR [tree options]
      A supervising parent: writes DIR/parent.pid and runs `tree` as its child in its own
      process group (no new session), then sleeps; it does not restart anything.
  exit CODE
      Exits with CODE after a moment.
  env-dump FILE
      Writes its WEDGEWATCH_* environment variables to FILE as JSON.
  fail CODE MESSAGE
      Prints MESSAGE on stderr and exits with CODE.
  spawn-and-sleep DIR
      Starts a grandchild that writes DIR/grandchild.pid and sleeps; then sleeps itself.
  write-state PATH TARGETS
      Saves state files in a loop: every save holds TARGETS targets that all carry the same
      counter, so a torn file would show two different counters. Prints "ready" after the
      first save.
  read-state PATH
      Loads the state file and prints {"problem": ..., "counters": [...]} as JSON.
  burn-budget STATE_DIR
      Spends the whole default restart budget with real clocks, saving after every step,
      prints "spent", then keeps saving until it is killed.
  hold-lock STATE_DIR
      Takes the state directory lock, prints "locked" and sleeps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _ready(directory: Path, role: str) -> None:
    temp = directory / f".{role}.pid.tmp"
    temp.write_text(str(os.getpid()))
    temp.rename(directory / f"{role}.pid")


def _tree(directory: Path, role: str, stubborn: set[str], escape: str, orphan: str) -> None:
    if role in stubborn:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if role == escape:
        os.setsid()
    children = {"root": ["child0", "child1"], "child0": ["grand0"], "child1": ["grand1"]}
    for child in children.get(role, []):
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "tree-node",
                str(directory),
                child,
                ",".join(sorted(stubborn)),
                escape,
                orphan,
            ]
        )
    if role == orphan:
        grandchild = directory / ("grand" + role[-1] + ".pid")
        while not grandchild.exists():
            time.sleep(0.01)
        _ready(directory, role)
        return
    _ready(directory, role)
    _sleep_forever()


def _tree_options(args: list[str]) -> tuple[set[str], str, str]:
    stubborn: set[str] = set()
    escape = orphan = ""
    while args:
        flag = args.pop(0)
        if flag == "--stubborn":
            stubborn = {r for r in args.pop(0).split(",") if r}
        elif flag == "--escape":
            escape = args.pop(0)
        elif flag == "--orphan":
            orphan = args.pop(0)
        else:
            raise SystemExit(f"unknown option {flag}")
    return stubborn, escape, orphan


def _write_state(path: Path, targets: int) -> None:
    from wedgewatch.core.restart.restart_policy import Phase, PolicyRecord
    from wedgewatch.io import statefile

    counter = 0
    while True:
        counter += 1
        record = PolicyRecord(
            phase=Phase.ARMED,
            restart_timestamps=(float(counter),) * 3,
            consecutive=counter,
            not_before_timestamp=None,
            phase_since_timestamp=float(counter),
        )
        state = statefile.SavedState(
            targets={
                f"target-{i:03d}": statefile.TargetRecord(
                    restart_policy=record, detector={"padding": "x" * 200, "counter": counter}
                )
                for i in range(targets)
            }
        )
        result = statefile.save(path, state, time.time())
        if not isinstance(result, statefile.Saved):
            raise SystemExit(result.message)
        if counter == 1:
            print("ready", flush=True)


def _read_state(path: Path) -> None:
    from wedgewatch.io import statefile

    loaded = statefile.load(path)
    counters = sorted(
        {
            record.restart_policy.consecutive
            for record in loaded.state.targets.values()
            if record.restart_policy is not None
        }
        | {
            int(record.detector["counter"])
            for record in loaded.state.targets.values()
            if record.detector is not None
        }
    )
    print(
        json.dumps(
            {
                "problem": loaded.problem,
                "targets": len(loaded.state.targets),
                "counters": counters,
            }
        )
    )


def _burn_budget(state_dir: Path) -> None:
    from wedgewatch.core.restart import restart_policy
    from wedgewatch.io import statefile

    policy = restart_policy.RestartPolicy(
        restart_backoff_seconds=0.0, restart_backoff_max_seconds=0.0
    )
    state = restart_policy.PolicyState()
    path = statefile.state_path(state_dir)

    def save() -> None:
        record = restart_policy.to_record(state, time.monotonic(), time.time())
        saved = statefile.save(
            path,
            statefile.SavedState(targets={"vllm": statefile.TargetRecord(restart_policy=record)}),
            time.time(),
        )
        if not isinstance(saved, statefile.Saved):
            raise SystemExit(saved.message)

    for _ in range(policy.restart_budget):
        decision, step = restart_policy.decide(state, policy, time.monotonic(), time.time())
        if not isinstance(decision, restart_policy.Allow):
            raise SystemExit(f"expected Allow, got {decision}")
        state = step.state
        save()
        outcome = restart_policy.RestartOutcome(ok=True, detail="test", duration_seconds=0.0)
        state = restart_policy.record_restart(
            state, policy, time.monotonic(), time.time(), outcome
        ).state
        save()
        state = restart_policy.record_good_scrape(
            state, policy, time.monotonic(), time.time()
        ).state
        save()
    print("spent", flush=True)
    while True:
        save()


def main(argv: list[str]) -> None:
    mode, args = argv[0], argv[1:]
    if mode == "tree":
        stubborn, escape, orphan = _tree_options(args[1:])
        _tree(Path(args[0]), "root", stubborn, escape, orphan)
    elif mode == "tree-node":
        _tree(Path(args[0]), args[1], {r for r in args[2].split(",") if r}, args[3], args[4])
    elif mode == "parent":
        directory = Path(args[0])
        subprocess.Popen([sys.executable, __file__, "tree", *args])
        _ready(directory, "parent")
        _sleep_forever()
    elif mode == "exit":
        time.sleep(0.2)
        raise SystemExit(int(args[0]))
    elif mode == "env-dump":
        env = {k: v for k, v in os.environ.items() if k.startswith("WEDGEWATCH_")}
        Path(args[0]).write_text(json.dumps(env))
    elif mode == "fail":
        print(args[1], file=sys.stderr)
        raise SystemExit(int(args[0]))
    elif mode == "spawn-and-sleep":
        directory = Path(args[0])
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import os, pathlib, sys, time; "
                "pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); "
                "time.sleep(3600)",
                str(directory / "grandchild.pid"),
            ]
        )
        while not (directory / "grandchild.pid").exists():
            time.sleep(0.01)
        print("grandchild running", file=sys.stderr, flush=True)
        _sleep_forever()
    elif mode == "write-state":
        _write_state(Path(args[0]), int(args[1]))
    elif mode == "read-state":
        _read_state(Path(args[0]))
    elif mode == "burn-budget":
        _burn_budget(Path(args[0]))
    elif mode == "hold-lock":
        from wedgewatch.io import statefile

        lock = statefile.lock_state_dir(Path(args[0]))
        if isinstance(lock, statefile.LockFailed):
            raise SystemExit(lock.message)
        print("locked", flush=True)
        _sleep_forever()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
