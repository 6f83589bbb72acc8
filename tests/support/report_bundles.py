"""Evidence bundles for report tests, written the way `evidence.py` lays them out.

Stacks are the recorded real py-spy dumps in `tests/fixtures/stacks/` (a stand-in tree
with vLLM's function names); triage is run over them with the real `triage`, so each
bundle's summary says what a capture of that tree would say.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wedgewatch.core.evidence.triage import ProcessStacks, StackRound, parse_pyspy_json, triage
from wedgewatch.core.text.redact import redact_argv
from wedgewatch.io.procs import Role
from wedgewatch.vllm.build_info import serve_flags

STACKS = Path(__file__).parents[1] / "fixtures" / "stacks"
TP2_OFFLOAD = (
    "--tensor-parallel-size", "2", "--kv-offloading-size", "60", "--kv-offloading-backend",
    "native", "--max-num-seqs", "6", "--max-num-batched-tokens", "4096",
    "--enable-prefix-caching", "--enable-chunked-prefill",
)  # fmt: skip
SIMPLE_ENV = {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1", "CUDA_VISIBLE_DEVICES": "0,1"}


def reading(  # noqa: PLR0917 (a reading reads best positionally: running, capacity, deferred)
    running: float = 0,
    capacity: float = 0,
    deferred: float = 0,
    kv: float = 0.3,
    generation: float = 1000,
    preemptions: float = 0,
) -> dict[str, Any]:
    """One engine reading as the flight recorder stores it."""
    return {
        "running": running,
        "waiting": capacity + deferred,
        "waiting_by_reason": {"capacity": capacity, "deferred": deferred},
        "kv_cache_usage": kv,
        "generation_tokens": generation,
        "prompt_tokens": generation * 4,
        "request_success": 10,
        "preemptions": preemptions,
        "iterations": 100,
    }


def make_bundle(
    root: Path,
    name: str = "20261202T101500Z_local_engine0_deferred_stall",
    *,
    family: str = "deferred_stall",
    stacks: str | None = "scheduler_wedge",
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    version: str | None = "0.33.0",
    wedge: Mapping[str, Any] | None = None,
    before: Mapping[str, Any] | None = None,
    rename_frames: Mapping[str, str] | None = None,
    remedy: Sequence[Mapping[str, Any]] = (),
    unreachable: bool = False,
) -> Path:
    """Write one wedge bundle: 20 s of healthy readings, then 15 s of the wedge reading."""
    bundle = root / name
    (bundle / "pyspy").mkdir(parents=True)
    wedge = wedge if wedge is not None else reading(capacity=75, deferred=3)
    before = before if before is not None else reading(running=4, capacity=2)
    history = []
    generation = float(before.get("generation_tokens", 1000))
    for i in range(36):
        t = 1000.0 + i
        if i < 20:
            generation += 150
            entry_reading = {**before, "generation_tokens": generation,
                             "prompt_tokens": generation * 4}  # fmt: skip
            state = "ok"
        else:
            entry_reading = {**wedge, "generation_tokens": generation,
                             "prompt_tokens": generation * 4}  # fmt: skip
            state = "suspect" if i < 30 else "wedged"
        entry: dict[str, Any] = {"timestamp": t, "state": state}
        if unreachable and i >= 20:
            entry["failure"] = {"reason": "refused", "detail": "connection refused"}
            entry["engines"] = []
        else:
            entry["engines"] = [
                {"model_name": "Qwen/Qwen3-0.6B", "engine": "0", "state": state, **entry_reading}
            ]
        history.append(entry)
    (bundle / "history.jsonl").write_text("".join(json.dumps(h) + "\n" for h in history))

    processes: list[dict[str, Any]] = []
    records: list[dict[str, Any]] = []
    round_processes: list[ProcessStacks] = []
    if stacks is not None:
        recording = json.loads((STACKS / stacks / "recording.json").read_text())
        for proc in recording["processes"]:
            text = (STACKS / stacks / proc["file"]).read_text()
            for old, new in (rename_frames or {}).items():
                text = text.replace(f'"{old}"', f'"{new}"')
            rel = f"pyspy/{proc['role']}-{proc['pid']}.json"
            (bundle / rel).write_text(text)
            threads = parse_pyspy_json(json.loads(text))
            assert not isinstance(threads, str)
            round_processes.append(
                ProcessStacks(proc["pid"], proc["ppid"], Role(proc["role"]), proc["title"], threads)
            )
            processes.append({k: proc[k] for k in ("pid", "ppid", "role", "title")})
            records.append({**processes[-1], "status": "ok", "files": [rel]})
    discovery_error = None if stacks is not None else "no process listens on port 8000"
    verdict = triage([StackRound("wedged", tuple(round_processes), discovery_error)], "0")
    argv = ["/usr/bin/python3", "/opt/venv/bin/vllm", "serve", "Qwen/Qwen3-0.6B", *flags]
    model, parsed = serve_flags(redact_argv(argv))
    build: dict[str, Any] = {
        "version": {"status": "ok", "version": version}
        if version
        else {"status": "failed", "error": "refused: connection refused"},
        "api_server_pid": processes[0]["pid"] if processes else None,
        "command_line": redact_argv(argv),
        "model": model,
        "flags": parsed,
        "engine_env": dict(env or {}),
    }
    (bundle / "build.json").write_text(json.dumps(build))
    (bundle / "processes.json").write_text(
        json.dumps({"discovery": {"processes": processes}, "processes": processes})
    )
    summary = {
        "schema": "wedgewatch.evidence/1",
        "bundle": name,
        "target": "local",
        "selector": "listener of http://127.0.0.1:8000",
        "engine_labels": {"model_name": "Qwen/Qwen3-0.6B", "engine": "0"},
        "verdict": "wedged",
        "family": family,
        "reason": f"{family}: no progress",
        "verdict_detail": {"stalled_seconds": 15.0, "family": family},
        "thresholds": {"stall_after_seconds": 10.0, "hang_after_seconds": 10.0},
        "verdict_at": 1030.0,
        "created_timestamp": 1796205300.0,
        "wedgewatch_version": "0.1.0",
        "host": "test",
        "triage": verdict.to_json(),
        "failures": [],
        "phases": {
            "wedged": {
                "started_at": 1030.5,
                "discovery": {"processes": processes, "error": discovery_error},
                "stacks": records,
            }
        },
    }
    (bundle / "summary.json").write_text(json.dumps(summary))
    if remedy:
        (bundle / "remedy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in remedy))
    return bundle


def copy_bundle(source: Path, root: Path) -> Path:
    """A copy of a bundle directory under `root` (to damage it without touching the original)."""
    target = root / source.name
    shutil.copytree(source, target)
    return target
