"""`vllm serve`-compatible command-line parsing for the simulator (pure).

The simulator must start from the exact argv a launcher or a systemd unit passes to
`vllm serve`, so this parser knows the vLLM flags the simulator models, accepts every
other vLLM flag with a warning, and adds a few simulator-only flags. It never exits the
process and never prints: `parse_serve_args` returns either `ServeArgs` or `ArgsError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from wedgewatch.lab.sim.faults import FaultSpec, parse_fault

SchedulerFix = Literal["stock", "skip-head-when-idle"]
SCHEDULER_FIXES: tuple[SchedulerFix, ...] = ("stock", "skip-head-when-idle")
SchedulerEngine = Literal["sim", "vllm"]
SCHEDULER_ENGINES: tuple[SchedulerEngine, ...] = ("sim", "vllm")
KV_OFFLOADING_BACKENDS = ("native", "lmcache")
VLLM_STRUCTURES = ("0.30", "0.31+")  # the scheduler model's release structures
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # what `vllm serve` without a model serves in recent releases
DEFAULT_STEP_TIME_SECONDS = 0.005


@dataclass(frozen=True, slots=True)
class ServeArgs:
    """Everything `sim serve` needs, as parsed from a `vllm serve` command line."""

    model: str = DEFAULT_MODEL
    served_model_name: tuple[str, ...] = ()
    host: str | None = None  # None: all interfaces, like vLLM
    port: int = 8000
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    api_server_count: int | None = None  # None: the data-parallel size, like vLLM
    kv_offloading_size: float | None = None  # GiB, summed across TP ranks
    kv_offloading_backend: str = "native"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    block_size: int = 16
    max_model_len: int = 32768
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    seed: int = 0
    disable_log_stats: bool = False
    disable_uvicorn_access_log: bool = False
    uvicorn_log_level: str = "info"
    # simulator-only
    num_gpu_blocks: int | None = None  # None: the scheduler model's default pool size
    step_time_seconds: float = DEFAULT_STEP_TIME_SECONDS
    prefill_step_time_seconds: float | None = None  # None: step_time_seconds
    scheduler_fix: SchedulerFix = "stock"
    kv_load_steps: int | None = None  # None: the scheduler model's default
    vllm_structure: str = "0.30"  # whose scheduler structure the model follows: 0.30 | 0.31+
    async_scheduling: bool = True  # vLLM's default on CUDA
    scheduler_reserve_full_isl: bool = True  # vLLM's default
    faults: tuple[FaultSpec, ...] = ()
    scheduler: SchedulerEngine = "sim"
    """`vllm`: the installed vLLM's own v1 scheduler runs in the EngineCore
    (lab/real/vllm_core.py)."""
    ignored_flags: tuple[str, ...] = field(default=())  # vLLM flags accepted but not modelled

    @property
    def model_name(self) -> str:
        """The name in responses and in the `model_name` metric label (first served name)."""
        return self.served_model_name[0] if self.served_model_name else self.model

    @property
    def effective_api_server_count(self) -> int:
        """How many API servers vLLM would run (its default is the data-parallel size)."""
        return (
            self.api_server_count
            if self.api_server_count is not None
            else (self.data_parallel_size)
        )

    @property
    def multiprocess_metrics(self) -> bool:
        """vLLM switches prometheus_client to multiprocess mode with more than one API server."""
        return self.effective_api_server_count > 1


@dataclass(frozen=True, slots=True)
class ArgsError:
    """A command line the simulator cannot run, with a message naming the culprit."""

    message: str


@dataclass(frozen=True, slots=True)
class HelpRequested:
    """`-h`/`--help` was given; the caller prints `SERVE_HELP`."""


def _positive_int(flag: str, text: str) -> int | ArgsError:
    value = _int(flag, text)
    if isinstance(value, ArgsError):
        return value
    if value <= 0:
        return ArgsError(f"{flag} must be a positive integer, got {text!r}")
    return value


def _non_negative_int(flag: str, text: str) -> int | ArgsError:
    value = _int(flag, text)
    if isinstance(value, ArgsError):
        return value
    if value < 0:
        return ArgsError(f"{flag} must be zero or a positive integer, got {text!r}")
    return value


def _int(flag: str, text: str) -> int | ArgsError:
    try:
        return int(text)
    except ValueError:
        return ArgsError(f"{flag} expects an integer, got {text!r}")


def _human_int(flag: str, text: str) -> int | ArgsError:
    """vLLM accepts `32k` (x1000) and `32K` (x1024) style sizes for token counts."""
    multipliers = {"k": 1000, "m": 1000**2, "K": 1024, "M": 1024**2}
    if text and text[-1] in multipliers:
        number = _int(flag, text[:-1])
        if isinstance(number, ArgsError):
            return ArgsError(f"{flag} expects an integer like 32768 or 32k, got {text!r}")
        value = number * multipliers[text[-1]]
    else:
        parsed = _int(flag, text)
        if isinstance(parsed, ArgsError):
            return parsed
        value = parsed
    if value <= 0:
        return ArgsError(f"{flag} must be positive, got {text!r}")
    return value


def _float(flag: str, text: str, *, low: float, high: float | None = None) -> float | ArgsError:
    try:
        value = float(text)
    except ValueError:
        return ArgsError(f"{flag} expects a number, got {text!r}")
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        return ArgsError(f"{flag} must be a number {bounds}, got {text!r}")
    return value


def _choice(flag: str, text: str, choices: Sequence[str]) -> str | ArgsError:
    if text not in choices:
        return ArgsError(f"{flag} must be one of {', '.join(choices)}; got {text!r}")
    return text


def _port(flag: str, text: str) -> int | ArgsError:
    value = _int(flag, text)
    if isinstance(value, ArgsError):
        return value
    if not 0 <= value <= 65535:
        return ArgsError(f"{flag} must be in 0..65535 (0 picks a free port), got {text!r}")
    return value


def _gpu_memory_utilization(flag: str, text: str) -> float | ArgsError:
    value = _float(flag, text, low=0.0, high=1.0)
    if isinstance(value, float) and value == 0.0:
        return ArgsError(f"{flag} must be in (0, 1], got {text!r}")
    return value


Converter = Callable[[str, str], object]

# flag -> (field name, converter). Flags that take exactly one value.
_VALUE_FLAGS: dict[str, tuple[str, Converter]] = {
    "--model": ("model", lambda _f, t: t),
    "--host": ("host", lambda _f, t: t),
    "--port": ("port", _port),
    "--tensor-parallel-size": ("tensor_parallel_size", _positive_int),
    "--data-parallel-size": ("data_parallel_size", _positive_int),
    "--api-server-count": ("api_server_count", _positive_int),
    "--kv-offloading-size": ("kv_offloading_size", lambda f, t: _float(f, t, low=0.0)),
    "--kv-offloading-backend": (
        "kv_offloading_backend",
        lambda f, t: _choice(f, t, KV_OFFLOADING_BACKENDS),
    ),
    "--max-num-seqs": ("max_num_seqs", _positive_int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", _human_int),
    "--block-size": ("block_size", _positive_int),
    "--max-model-len": ("max_model_len", _human_int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", _gpu_memory_utilization),
    "--kv-cache-dtype": ("kv_cache_dtype", lambda _f, t: t),
    "--max-num-queued-reqs": ("max_num_queued_reqs", _positive_int),
    "--max-num-queued-tokens": ("max_num_queued_tokens", _human_int),
    "--seed": ("seed", _int),
    "--uvicorn-log-level": (
        "uvicorn_log_level",
        lambda f, t: _choice(f, t, ("critical", "error", "warning", "info", "debug", "trace")),
    ),
    "--num-gpu-blocks-override": ("num_gpu_blocks", _positive_int),
    # simulator-only
    "--num-gpu-blocks": ("num_gpu_blocks", _positive_int),
    "--step-time-seconds": (
        "step_time_seconds",
        lambda f, t: _float(f, t, low=0.0, high=60.0),
    ),
    "--prefill-step-time-seconds": (
        "prefill_step_time_seconds",
        lambda f, t: _float(f, t, low=0.0, high=600.0),
    ),
    "--scheduler-fix": ("scheduler_fix", lambda f, t: _choice(f, t, SCHEDULER_FIXES)),
    "--kv-load-steps": ("kv_load_steps", _non_negative_int),
    "--scheduler": ("scheduler", lambda f, t: _choice(f, t, SCHEDULER_ENGINES)),
    "--vllm-structure": ("vllm_structure", lambda f, t: _choice(f, t, VLLM_STRUCTURES)),
}
_SHORT_ALIASES = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size"}

# flag -> (field name, value). Flags that take no value.
_SWITCHES: dict[str, tuple[str, bool]] = {
    "--enable-prefix-caching": ("enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("enable_prefix_caching", False),
    "--enable-chunked-prefill": ("enable_chunked_prefill", True),
    "--no-enable-chunked-prefill": ("enable_chunked_prefill", False),
    "--disable-log-stats": ("disable_log_stats", True),
    "--disable-uvicorn-access-log": ("disable_uvicorn_access_log", True),
    "--async-scheduling": ("async_scheduling", True),
    "--no-async-scheduling": ("async_scheduling", False),
    "--scheduler-reserve-full-isl": ("scheduler_reserve_full_isl", True),
    "--no-scheduler-reserve-full-isl": ("scheduler_reserve_full_isl", False),
}

# vLLM flags that take no value: accepted (with a warning) without swallowing the next
# argument, so `vllm serve --trust-remote-code MODEL` still finds MODEL.
_KNOWN_VLLM_SWITCHES = frozenset(
    {
        "--trust-remote-code",
        "--enforce-eager",
        "--disable-log-requests",
        "--enable-log-requests",
        "--enable-log-outputs",
        "--disable-custom-all-reduce",
        "--enable-auto-tool-choice",
        "--enable-server-load-tracking",
        "--enable-sleep-mode",
        "--enable-expert-parallel",
        "--enable-lora",
        "--enable-prompt-tokens-details",
        "--enable-force-include-usage",
        "--enable-mfu-metrics",
        "--enable-fault-tolerance",
        "--kv-cache-metrics",
        "--disable-fastapi-docs",
        "--disable-frontend-multiprocessing",
        "--skip-tokenizer-init",
        "--headless",
        "--disable-sliding-window",
        "--disable-cascade-attn",
        "--enable-request-id-headers",
        "--return-tokens-as-token-ids",
        "--enable-chunked-prefill-for-long-prompts",
    }
)


def _looks_like_value(token: str) -> bool:
    """True for tokens that are values rather than flags (`foo`, `-1`, `-0.5`)."""
    if not token.startswith("-"):
        return True
    try:
        float(token)
    except ValueError:
        return False
    return True


def _split_flag(token: str) -> tuple[str, str | None]:
    """`--port=8000` -> (`--port`, `8000`); `-tp` -> (`--tensor-parallel-size`, None)."""
    flag, sep, value = token.partition("=")
    return _SHORT_ALIASES.get(flag, flag), (value if sep else None)


def parse_serve_args(argv: Sequence[str]) -> ServeArgs | ArgsError | HelpRequested:
    """Parse the arguments after `serve` (`vllm serve` or `wedgewatch sim serve`)."""
    values: dict[str, object] = {}
    faults: list[FaultSpec] = []
    ignored: list[str] = []
    positional: list[str] = []
    served_names: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        arg = tokens[index]
        index += 1
        if arg in ("-h", "--help"):
            return HelpRequested()
        if arg == "--":
            positional.extend(tokens[index:])
            break
        if _looks_like_value(arg):
            positional.append(arg)
            continue
        flag, inline_value = _split_flag(arg)
        if flag in _SWITCHES:
            if inline_value is not None:
                return ArgsError(f"{flag} takes no value, got {arg!r}")
            name, switch_value = _SWITCHES[flag]
            values[name] = switch_value
            continue
        if flag == "--served-model-name":
            names = [inline_value] if inline_value is not None else []
            while (
                inline_value is None and index < len(tokens) and not tokens[index].startswith("-")
            ):
                names.append(tokens[index])
                index += 1
            if not names or not all(names):
                return ArgsError("--served-model-name expects at least one name")
            served_names.extend(names)
            continue
        if flag in _VALUE_FLAGS or flag == "--fault":
            if inline_value is None:
                if index >= len(tokens) or not _looks_like_value(tokens[index]):
                    return ArgsError(f"{flag} expects a value")
                inline_value = tokens[index]
                index += 1
            if flag == "--fault":
                fault = parse_fault(inline_value)
                if isinstance(fault, str):
                    return ArgsError(f"--fault {inline_value!r}: {fault}")
                faults.append(fault)
                continue
            name, convert = _VALUE_FLAGS[flag]
            converted = convert(flag, inline_value)
            if isinstance(converted, ArgsError):
                return converted
            values[name] = converted
            continue
        if not flag.startswith("--"):
            return ArgsError(f"unknown short option {arg!r} (use the long vLLM flag name)")
        # An unmodelled vLLM flag: accept it (and its value, if it has one) with a warning.
        if (
            inline_value is None
            and flag not in _KNOWN_VLLM_SWITCHES
            and not flag.startswith("--no-")
            and index < len(tokens)
            and _looks_like_value(tokens[index])
        ):
            index += 1
        ignored.append(flag)
    if len(positional) > 1:
        return ArgsError(
            "expected at most one positional MODEL argument, got "
            + " ".join(repr(p) for p in positional)
        )
    if positional:
        if "model" in values and values["model"] != positional[0]:
            return ArgsError(
                f"MODEL given twice: positional {positional[0]!r} and --model {values['model']!r}"
            )
        values["model"] = positional[0]
    if served_names:
        values["served_model_name"] = tuple(served_names)
    values["faults"] = tuple(faults)
    values["ignored_flags"] = tuple(dict.fromkeys(ignored))
    return _validate(replace(ServeArgs(), **cast(dict[str, Any], values)))


def _validate(args: ServeArgs) -> ServeArgs | ArgsError:
    if args.kv_offloading_size is not None and args.kv_offloading_size <= 0:
        return ArgsError("--kv-offloading-size must be a positive number of GiB")
    if not args.enable_chunked_prefill and args.max_num_batched_tokens < args.max_model_len:
        return ArgsError(
            f"--max-num-batched-tokens ({args.max_num_batched_tokens}) is smaller than "
            f"--max-model-len ({args.max_model_len}) with chunked prefill disabled; vLLM "
            "refuses this too. Raise --max-num-batched-tokens or lower --max-model-len."
        )
    if args.max_num_batched_tokens < args.max_num_seqs:
        return ArgsError(
            f"--max-num-batched-tokens ({args.max_num_batched_tokens}) must be >= "
            f"--max-num-seqs ({args.max_num_seqs})"
        )
    if args.scheduler == "vllm" and args.multiprocess_metrics:
        return ArgsError("--scheduler vllm runs a single API server (--api-server-count 1)")
    for fault in args.faults:
        if fault.name == "nan-gauges" and args.scheduler == "vllm":
            return ArgsError("--fault nan-gauges: with --scheduler vllm the gauges are vLLM's own")
        if fault.engine is not None and fault.engine >= args.data_parallel_size:
            return ArgsError(
                f"--fault {fault.name}@{fault.at_seconds:g}:{fault.engine} targets DP rank "
                f"{fault.engine}, but --data-parallel-size is {args.data_parallel_size}"
            )
    return args


SERVE_HELP = """\
usage: wedgewatch sim serve [MODEL] [vllm serve flags] [simulator flags]
       vllm serve [MODEL] ...            (through `wedgewatch sim install-vllm-shim DIR`)

A vLLM stand-in without a GPU. It takes the `vllm serve` command line and serves
/health, /metrics, /v1/models and /v1/completions from a simulated scheduler.

vLLM flags the simulator models:
  MODEL / --model NAME             model name (default: Qwen/Qwen3-0.6B)
  --served-model-name NAME...      name in responses and the model_name metric label
  --host HOST                      bind address (default: all interfaces, like vLLM)
  --port PORT                      port (default: 8000; 0 picks a free port)
  --tensor-parallel-size, -tp N    worker processes VLLM::Worker_TP0..N-1 (default: 1)
  --data-parallel-size, -dp N      engines VLLM::EngineCore_DP0..N-1 (default: 1)
  --api-server-count N             >1 switches /metrics to multiprocess style
                                   (default: the data-parallel size, like vLLM)
  --kv-offloading-size GIB         CPU offload tier size (default: off)
  --kv-offloading-backend NAME     native | lmcache (default: native)
  --max-num-seqs N                 (default: 256)
  --max-num-batched-tokens N       (default: 8192)
  --[no-]enable-prefix-caching     (default: on)
  --[no-]enable-chunked-prefill    (default: on)
  --block-size N                   tokens per KV block (default: 16)
  --max-model-len N                (default: 32768)
  --gpu-memory-utilization F       reported in vllm:cache_config_info (default: 0.9)
  --kv-cache-dtype NAME            reported in vllm:cache_config_info (default: auto)
  --max-num-queued-reqs N          reject with 503 beyond N queued requests
  --max-num-queued-tokens N        reject with 503 beyond N queued prompt tokens
  --seed N                         seeds the request ids (default: 0)
  --disable-log-stats              no vllm:* metrics, like vLLM
  --disable-uvicorn-access-log     no per-request access log lines
  --uvicorn-log-level LEVEL        (default: info)
  --[no-]async-scheduling          batch queue of 2 (default: on, as on CUDA)
  --[no-]scheduler-reserve-full-isl  admit only what fits whole (default: on)
  --num-gpu-blocks-override N      same as --num-gpu-blocks
Any other vLLM flag is accepted with a warning and ignored.

Simulator flags:
  --num-gpu-blocks N               GPU KV block pool size (default: the model's default)
  --step-time-seconds S            simulated model step time (default: 0.005)
  --prefill-step-time-seconds S    time of a step that computes a prefill chunk
                                   (default: the step time); with a small
                                   --max-num-batched-tokens a long prompt
                                   prefills for minutes, chunk by chunk
  --scheduler-fix POLICY           stock | skip-head-when-idle (default: stock)
  --kv-load-steps N                steps an async CPU->GPU KV load takes
  --scheduler ENGINE               sim | vllm (default: sim). vllm runs the installed
                                   vLLM's own v1 scheduler, KV-cache manager and KV
                                   connector in VLLM::EngineCore, with an emulated GPU
                                   side, and serves /metrics from vLLM's own stat logger
                                   (see docs/simulator.md to get vLLM)
  --[no-]async-scheduling          vLLM's AsyncScheduler with a batch queue of 2 (default:
                                   on, as vLLM on CUDA), for both engines
  --[no-]scheduler-reserve-full-isl
                                   full-ISL admission (default: on, vLLM's default)
  --vllm-structure 0.30|0.31+      whose scheduler the model follows (default: 0.30,
                                   vLLM 0.30.0, which wedges; 0.31+ drains block
                                   holders first, PR #58947)
  --fault NAME@SECONDS[:RANK]      inject a fault SECONDS after the server is ready (repeatable):
                                   collective-hang, engine-crash, api-hang,
                                   garbage-metrics, slow-metrics, nan-gauges, frozen-step,
                                   lost-store-event, hung-load; RANK picks one
                                   data-parallel engine for engine faults
"""
