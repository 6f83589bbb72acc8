"""`wedgewatch launch`: start `vllm serve` from a named profile, the same way every time.

Building the command line is pure (profiles + extra arguments -> argv and environment);
the checks before launch (binary, port, GPUs) and running the server are thin IO at the edge.

Rules for merging flags, in order of precedence (highest first):
1. extra arguments given after `--` on the launch command line;
2. the profile's optional knobs (kv_cache_dtype, block_size, speculative_config,
   prefix_cache_retention_interval);
3. the profile's `args`.
A flag is identified by its name without a `--no-` prefix, so `--no-enable-prefix-caching`
given after `--` removes the profile's `--enable-prefix-caching`.
"""

from __future__ import annotations

import errno
import os
import re
import shlex
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

#: vLLM versions from this one on have `--prefix-cache-retention-interval` (vLLM PR #52216,
#: merged 2026-08, first released in 0.27); older ones read the environment variable.
RETENTION_FLAG_SINCE = (0, 27, 0)
RETENTION_ENV = "VLLM_PREFIX_CACHE_RETENTION_INTERVAL"
SIMULATOR_MARKER = "wedgewatch"


class Profile(BaseModel):
    """One launch profile: `vllm serve` flags and environment, plus optional knobs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: str = Field(
        "", description="One line shown by `wedgewatch launch --list-profiles`."
    )
    args: tuple[str, ...] = Field((), description="`vllm serve` flags, in order.")
    env: Mapping[str, str] = Field(default_factory=dict, description="Environment variables.")
    kv_cache_dtype: str | None = Field(None, description="Adds `--kv-cache-dtype VALUE`.")
    block_size: int | None = Field(None, gt=0, description="Adds `--block-size N`.")
    speculative_config: str | None = Field(
        None, description="Adds `--speculative-config JSON` (speculative decoding)."
    )
    prefix_cache_retention_interval: int | None = Field(
        None,
        ge=0,
        description="Flag on vLLM >= 0.27, else the VLLM_PREFIX_CACHE_RETENTION_INTERVAL variable.",
    )


class LaunchError(Exception):
    """A check before launch failed; the message says what to do."""


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """What to execute: the full argv and the environment variables set on top of ours."""

    argv: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def port(self) -> int:
        """The port `vllm serve` will listen on (vLLM's default is 8000)."""
        value = flag_value(self.argv, "--port")
        return int(value) if value is not None else 8000

    @property
    def host(self) -> str | None:
        """The host `vllm serve` will bind, or None for vLLM's default (all interfaces)."""
        return flag_value(self.argv, "--host")

    @property
    def tensor_parallel_size(self) -> int:
        """The tensor-parallel size the command asks for (1 when absent)."""
        value = flag_value(self.argv, "--tensor-parallel-size", "-tp")
        return int(value) if value is not None else 1

    def render(self) -> str:
        """Shell-quoted, copy-paste ready: `VAR=value ... /path/vllm serve MODEL ...`."""
        assignments = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.env.items())]
        return " ".join([*assignments, *(shlex.quote(part) for part in self.argv)])


def builtin_profiles() -> dict[str, Profile]:
    """The profiles shipped with the package (`wedgewatch/profiles.toml`)."""
    text = resources.files("wedgewatch").joinpath("profiles.toml").read_text(encoding="utf-8")
    return {name: Profile.model_validate(body) for name, body in tomllib.loads(text).items()}


def merge_profiles(
    shipped: Mapping[str, Profile], overrides: Mapping[str, Mapping[str, object]]
) -> dict[str, Profile]:
    """User profiles from the config file replace shipped ones key by key, or add new ones."""
    merged = dict(shipped)
    for name, body in overrides.items():
        base = merged[name].model_dump(exclude_unset=True) if name in merged else {}
        merged[name] = Profile.model_validate({**base, **body})
    return merged


@dataclass(frozen=True, slots=True)
class _Flag:
    key: str  # name without leading dashes and without a `no-` prefix
    tokens: tuple[str, ...]


def _split_flags(args: Sequence[str]) -> list[_Flag]:
    """Group argv into flags with their values; a value is a token not starting with `--`."""
    flags: list[_Flag] = []
    index = 0
    while index < len(args):
        token = args[index]
        if not token.startswith("-"):
            flags.append(_Flag(key=f"positional:{token}", tokens=(token,)))
            index += 1
            continue
        name = token.split("=", 1)[0].lstrip("-")
        key = name.removeprefix("no-")
        if "=" in token or index + 1 >= len(args) or args[index + 1].startswith("--"):
            flags.append(_Flag(key=key, tokens=(token,)))
            index += 1
        else:
            flags.append(_Flag(key=key, tokens=(token, args[index + 1])))
            index += 2
    return flags


def merge_args(*layers: Sequence[str]) -> tuple[str, ...]:
    """Merge flag lists; a later layer's flag replaces an earlier layer's flag of the same name."""
    merged: dict[str, _Flag] = {}
    for layer in layers:
        for flag in _split_flags(layer):
            merged.pop(flag.key, None)
            merged[flag.key] = flag
    return tuple(token for flag in merged.values() for token in flag.tokens)


def flag_value(argv: Sequence[str], *names: str) -> str | None:
    """The value of the last occurrence of a flag (`--x v` or `--x=v`), or None."""
    found: str | None = None
    for index, token in enumerate(argv):
        head, sep, tail = token.partition("=")
        if head in names:
            if sep:
                found = tail
            elif index + 1 < len(argv):
                found = argv[index + 1]
    return found


def parse_version(text: str) -> tuple[int, int, int] | None:
    """The first `X.Y.Z` in a `vllm --version` output, or None."""
    match = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        return None
    return (int(match[1]), int(match[2]), int(match[3]))


def build_command(
    *,
    vllm_bin: str,
    model: str,
    profile: Profile,
    extra_args: Sequence[str] = (),
    vllm_version: tuple[int, int, int] | None = None,
) -> LaunchCommand:
    """Build the `vllm serve` argv and environment for a profile (pure)."""
    knobs: list[str] = []
    env = dict(profile.env)
    if profile.kv_cache_dtype is not None:
        knobs += ["--kv-cache-dtype", profile.kv_cache_dtype]
    if profile.block_size is not None:
        knobs += ["--block-size", str(profile.block_size)]
    if profile.speculative_config is not None:
        knobs += ["--speculative-config", profile.speculative_config]
    if profile.prefix_cache_retention_interval is not None:
        interval = str(profile.prefix_cache_retention_interval)
        if vllm_version is None or vllm_version >= RETENTION_FLAG_SINCE:
            knobs += ["--prefix-cache-retention-interval", interval]
        else:
            env[RETENTION_ENV] = interval
    flags = merge_args(profile.args, knobs, extra_args)
    return LaunchCommand(argv=(vllm_bin, "serve", model, *flags), env=env)


# ---- checks before launch (IO) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VllmBinary:
    """A resolved vllm executable and what it says about itself."""

    path: str
    version_text: str

    @property
    def is_simulator(self) -> bool:
        """True for `wedgewatch sim`'s drop-in `vllm` (it names itself in `--version`)."""
        return SIMULATOR_MARKER in self.version_text

    @property
    def version(self) -> tuple[int, int, int] | None:
        """The vLLM version it reports, if any."""
        return parse_version(self.version_text)


def resolve_vllm(vllm_bin: str, timeout_seconds: float = 120.0) -> VllmBinary:
    """Find the vllm executable and ask its version; LaunchError if it is missing or broken."""
    path = shutil.which(vllm_bin)
    if path is None:
        raise LaunchError(
            f"vllm executable {vllm_bin!r} not found (not on PATH and not an executable file); "
            "install vLLM or pass --vllm-bin PATH"
        )
    try:
        done = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"{path} --version did not answer within {timeout_seconds:g}s") from exc
    except OSError as exc:
        raise LaunchError(f"cannot run {path}: {exc.strerror or exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise LaunchError(f"{path} --version failed with status {done.returncode}: {tail[0]}")
    return VllmBinary(path=path, version_text=(done.stdout or done.stderr).strip())


def check_port_free(host: str | None, port: int) -> None:
    """LaunchError when something already listens on the port the server needs."""
    address = host if host not in (None, "", "0.0.0.0", "::") else "0.0.0.0"
    family = socket.AF_INET6 if address and ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(
                    f"port {port} is already in use on {address}; stop what listens there "
                    "or pass a different --port after --"
                ) from exc
            raise LaunchError(f"cannot bind {address}:{port}: {exc.strerror}") from exc


def count_visible_gpus(environ: Mapping[str, str]) -> int | None:
    """Usable GPUs: CUDA_VISIBLE_DEVICES if set, else `nvidia-smi -L`; None if unknown."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([item for item in visible.split(",") if item.strip() not in ("", "-1")])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def check_gpus(command: LaunchCommand, binary: VllmBinary, environ: Mapping[str, str]) -> None:
    """Real vLLM needs a visible GPU per tensor-parallel rank; the simulator needs none."""
    if binary.is_simulator:
        return
    needed = command.tensor_parallel_size
    found = count_visible_gpus({**environ, **command.env})
    if found is None:
        raise LaunchError(
            "cannot count GPUs (no nvidia-smi, no CUDA_VISIBLE_DEVICES); "
            f"the profile needs {needed}"
        )
    if found < needed:
        raise LaunchError(
            f"tensor parallel size {needed} needs {needed} GPUs but {found} are visible "
            "(check CUDA_VISIBLE_DEVICES and nvidia-smi)"
        )


def server_environment(command: LaunchCommand, environ: Mapping[str, str]) -> dict[str, str]:
    """Our environment with the profile's variables on top."""
    return {**environ, **command.env}


def preflight(command: LaunchCommand, binary: VllmBinary) -> None:
    """Every check before launch, in the order an operator would fix them."""
    check_port_free(command.host, command.port)
    check_gpus(command, binary, os.environ)
