"""What a vLLM server was built and started with, read from what a capture saw. Pure.

The inputs are the API server's command line (`vllm serve MODEL --flag value ...`), the
EngineCore's environment (`VLLM_*`, `CUDA_*`, `NCCL_*`), the `vllm:cache_config_info`
labels of a `/metrics` body and the `GET /version` answer. `features` turns them, with the
metric readings at the wedge, into named facts (`simple_cpu_offload`, `mtp`,
`running_zero`, ...) that known-issue signatures refer to, each with the evidence behind it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

ENV_PREFIXES = ("VLLM_", "CUDA_", "NCCL_")
CACHE_CONFIG_INFO = "vllm:cache_config_info"

# Flags that take no value in `vllm serve` (store_true / BooleanOptionalAction).
_BOOLEAN_FLAGS = frozenset(
    {
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--enforce-eager",
        "--async-scheduling",
        "--no-async-scheduling",
        "--trust-remote-code",
        "--disable-log-requests",
        "--disable-log-stats",
        "--enable-log-requests",
        "--headless",
        "--enable-expert-parallel",
        "--disable-custom-all-reduce",
        "--disable-frontend-multiprocessing",
        "--enable-lora",
        "--enable-sleep-mode",
    }
)
_CACHE_LINE = re.compile(r"^vllm:cache_config_info\{(.*)\}\s+\S+\s*$", re.MULTILINE)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)")
_MAX_VERSION_DIGITS = 9  # per dotted part; real ones have at most 8 (a date: 20261202)
KV_POOL_FULL = 0.9  # KV cache usage at or above this counts as a full pool


def serve_flags(argv: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """(model, flags) of a `vllm serve` command line; a flag without a value maps to `""`.

    `--flag=value` and `--flag value` both work; `-tp 2` counts as
    `--tensor-parallel-size 2`. Words before `serve` (the python interpreter, `-m vllm...`)
    are skipped; without `serve`, the first positional word is the model.
    """
    words = list(argv)
    words = words[words.index("serve") + 1 :] if "serve" in words else words[1:]
    model: str | None = None
    flags: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word.startswith("-") and len(word) > 1:
            name, eq, value = word.partition("=")
            if name == "-tp":
                name = "--tensor-parallel-size"
            if eq:
                flags[name] = value
            elif (
                name not in _BOOLEAN_FLAGS
                and index < len(words)
                and not words[index].startswith("--")
            ):
                flags[name] = words[index]
                index += 1
            else:
                flags[name] = ""
        elif model is None and "=" not in word and not word.startswith("/usr"):
            model = word
    return model, flags


def cache_config_labels(body: str) -> dict[str, str]:
    """The labels of the first `vllm:cache_config_info` sample of a /metrics body (or {})."""
    match = _CACHE_LINE.search(body)
    if match is None:
        return {}
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(match[1])}


def build_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The `VLLM_*`, `CUDA_*` and `NCCL_*` variables of an environment (not yet redacted)."""
    return {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES)}


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """`0.33.0+wedgewatch.sim` -> (0, 33, 0); None when there is no leading number, or a part
    longer than any release's (a hostile `/version` of 5,000 digits is no version: `int` of it
    would raise)."""
    if not version:
        return None
    match = _VERSION.match(version.strip())
    if match is None:
        return None
    parts = match[1].split(".")
    if any(len(part) > _MAX_VERSION_DIGITS for part in parts):
        return None
    return tuple(int(p) for p in parts)


def _off(value: str | None) -> bool:
    return value is None or value.strip().lower() in ("", "none", "0", "0.0", "false")


def _int(value: str | None) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def features(
    flags: Mapping[str, str],
    env: Mapping[str, str],
    cache_config: Mapping[str, str],
    reading: Mapping[str, Any] | None,
    *,
    first_reading: Mapping[str, Any] | None = None,
    workers: int = 0,
) -> dict[str, str]:
    """Named facts about the server and its state at the wedge -> the evidence for each.

    `reading` is the engine's metric reading at the wedge (a flight-recorder engine entry:
    running, waiting_by_reason, kv_cache_usage, preemptions), `first_reading` the oldest
    one in the recorder; `workers` the number of worker processes seen.
    """
    out: dict[str, str] = {}
    transfer = flags.get("--kv-transfer-config", "")
    offload_size = flags.get("--kv-offloading-size")
    if not _off(offload_size):
        out["kv_offloading"] = f"--kv-offloading-size {offload_size}"
    elif not _off(cache_config.get("kv_offloading_size")):
        out["kv_offloading"] = (
            f"cache_config_info kv_offloading_size={cache_config['kv_offloading_size']}"
        )
    simple_env = env.get("VLLM_USE_SIMPLE_KV_OFFLOAD", "")
    if "SimpleCPUOffloadConnector" in transfer:
        out["simple_cpu_offload"] = "--kv-transfer-config names SimpleCPUOffloadConnector"
    elif "kv_offloading" in out and simple_env.strip().lower() in ("1", "true"):
        out["simple_cpu_offload"] = (
            f"{out['kv_offloading']} with VLLM_USE_SIMPLE_KV_OFFLOAD={simple_env}"
        )
    if "OffloadingConnector" in transfer.replace("SimpleCPUOffloadConnector", ""):
        out["offloading_connector"] = "--kv-transfer-config names OffloadingConnector"
    elif "kv_offloading" in out and "simple_cpu_offload" not in out:
        out["offloading_connector"] = f"{out['kv_offloading']} (OffloadingConnector)"
    if transfer:
        out["kv_connector"] = f"--kv-transfer-config {transfer[:80]}"
    elif "kv_offloading" in out:
        out["kv_connector"] = out["kv_offloading"]
    if "--async-scheduling" in flags:
        out["async_scheduling"] = "--async-scheduling"
    if "--no-async-scheduling" in flags:
        out["sync_scheduling"] = "--no-async-scheduling"
    spec = flags.get("--speculative-config")
    if spec:
        out["spec_decode"] = f"--speculative-config {spec[:80]}"
        method = ""
        try:
            parsed = json.loads(spec)
            if isinstance(parsed, dict):
                method = str(parsed.get("method", ""))
        except ValueError:
            method = spec
        if "mtp" in method.lower():
            out["mtp"] = f"speculative method {method}"
    tp = _int(flags.get("--tensor-parallel-size"))
    if tp is not None and tp > 1:
        out["tensor_parallel"] = f"--tensor-parallel-size {tp}"
    elif workers > 1:
        out["tensor_parallel"] = f"{workers} worker processes"
    mamba = flags.get("--mamba-cache-mode") or cache_config.get("mamba_cache_mode")
    if mamba and mamba.lower() not in ("none", ""):
        out["hybrid_mamba"] = f"mamba cache mode {mamba}"
        if mamba.lower() == "align":
            out["mamba_align"] = f"mamba cache mode {mamba}"
    if flags.get("--scheduling-policy") == "priority":
        out["priority_scheduling"] = "--scheduling-policy priority"
    if flags.get("--distributed-executor-backend") == "ray":
        out["ray"] = "--distributed-executor-backend ray"
    if reading:
        out.update(_state_features(reading, first_reading))
    return out


def _num(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _state_features(reading: Mapping[str, Any], first: Mapping[str, Any] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    running = _num(reading.get("running"))
    waiting = _num(reading.get("waiting"))
    reasons = reading.get("waiting_by_reason")
    by_reason = reasons if isinstance(reasons, Mapping) else {}
    capacity = _num(by_reason.get("capacity")) or 0.0
    deferred = _num(by_reason.get("deferred")) or 0.0
    kv = _num(reading.get("kv_cache_usage"))
    if running is not None:
        if running == 0:
            out["running_zero"] = "running 0 at the wedge"
        else:
            out["running_nonzero"] = f"running {running:g} at the wedge"
    if waiting:
        out["waiting"] = f"waiting {waiting:g} at the wedge"
    if capacity > 0:
        out["waiting_capacity"] = f"waiting on capacity {capacity:g}"
    if deferred > 0:
        out["waiting_deferred"] = f"waiting deferred {deferred:g}"
        if capacity == 0:
            out["waiting_only_deferred"] = f"every waiting request deferred ({deferred:g})"
    if kv is not None:
        if kv >= KV_POOL_FULL:
            out["kv_pool_full"] = f"KV cache usage {kv:.0%}"
        else:
            out["kv_free"] = f"KV cache usage {kv:.0%} (free blocks left)"
    if first is not None:
        before = _num(first.get("preemptions"))
        after = _num(reading.get("preemptions"))
        if before is not None and after is not None and after > before:
            out["preemptions_rising"] = f"preemptions {before:g} -> {after:g} over the recorder"
    return out
