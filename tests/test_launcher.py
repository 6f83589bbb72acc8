"""The launcher's pure parts: profiles, flag merging, the command line, and its checks."""

from __future__ import annotations

import shlex
import socket
import stat
from pathlib import Path

import pytest

from wedgewatch.launcher import (
    LaunchCommand,
    LaunchError,
    Profile,
    VllmBinary,
    build_command,
    builtin_profiles,
    check_gpus,
    check_port_free,
    count_visible_gpus,
    merge_args,
    merge_profiles,
    resolve_vllm,
)

TP2_FLAGS = [
    *("--tensor-parallel-size", "2", "--kv-offloading-size", "60"),
    *("--kv-offloading-backend", "native", "--max-num-seqs", "6"),
    *("--max-num-batched-tokens", "4096", "--enable-prefix-caching", "--enable-chunked-prefill"),
]


def test_tp2_offload_profile_is_the_reported_production_setup() -> None:
    """The shipped tp2-offload profile carries exactly the reporter's flags and environment."""
    profile = builtin_profiles()["tp2-offload"]
    command = build_command(vllm_bin="vllm", model="m", profile=profile)
    assert command.argv == ("vllm", "serve", "m", *TP2_FLAGS)
    assert dict(command.env) == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}
    assert command.tensor_parallel_size == 2
    assert command.port == 8000


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        pytest.param(
            (["--max-num-seqs", "6"], ["--max-num-seqs", "8"]), ["--max-num-seqs", "8"], id="value"
        ),
        pytest.param(
            (["--max-num-seqs=6"], ["--max-num-seqs", "8"]), ["--max-num-seqs", "8"], id="equals"
        ),
        pytest.param(
            (["--enable-prefix-caching", "--port", "1"], ["--no-enable-prefix-caching"]),
            ["--port", "1", "--no-enable-prefix-caching"],
            id="negation",
        ),
        pytest.param(
            (["--enforce-eager"], ["--port", "9"]), ["--enforce-eager", "--port", "9"], id="bool"
        ),
        pytest.param(
            (["--speculative-config", '{"n": 7}'], []),
            ["--speculative-config", '{"n": 7}'],
            id="json-value",
        ),
    ],
)
def test_later_layers_replace_flags_of_the_same_name(
    layers: tuple[list[str], ...], expected: list[str]
) -> None:
    """Extra arguments win over the profile, flag by flag, keeping the rest in order."""
    assert list(merge_args(*layers)) == expected


def test_extra_args_after_dashdash_win_over_profile_and_knobs() -> None:
    """`-- --max-num-seqs 12 --block-size 32` overrides both the profile flag and the knob."""
    profile = builtin_profiles()["tp2-offload"].model_copy(update={"block_size": 16})
    command = build_command(
        vllm_bin="vllm",
        model="m",
        profile=profile,
        extra_args=["--max-num-seqs", "12", "--block-size", "32", "--port", "8123"],
    )
    argv = list(command.argv)
    assert argv.count("--max-num-seqs") == 1
    assert argv[argv.index("--max-num-seqs") + 1] == "12"
    assert argv[argv.index("--block-size") + 1] == "32"
    assert command.port == 8123


@pytest.mark.parametrize(
    ("version", "flag", "env"),
    [
        pytest.param((0, 33, 0), True, False, id="new-vllm-flag"),
        pytest.param((0, 26, 1), False, True, id="old-vllm-env"),
        pytest.param(None, True, False, id="unknown-version-flag"),
    ],
)
def test_prefix_cache_retention_is_a_flag_where_the_version_has_it(
    version: tuple[int, int, int] | None, flag: bool, env: bool
) -> None:
    """The retention knob becomes the flag on new vLLM and the environment variable on old."""
    profile = Profile(prefix_cache_retention_interval=1648, kv_cache_dtype="fp8")
    command = build_command(vllm_bin="vllm", model="m", profile=profile, vllm_version=version)
    assert ("--prefix-cache-retention-interval" in command.argv) is flag
    assert ("VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in command.env) is env
    assert "--kv-cache-dtype" in command.argv


def test_user_profiles_override_key_by_key() -> None:
    """A [profiles.tp2-offload] table in the config changes only the keys it names."""
    merged = merge_profiles(
        builtin_profiles(), {"tp2-offload": {"kv_cache_dtype": "fp8"}, "mine": {"args": ["--x"]}}
    )
    assert merged["tp2-offload"].kv_cache_dtype == "fp8"
    assert merged["tp2-offload"].args == builtin_profiles()["tp2-offload"].args
    assert merged["mine"].args == ("--x",)


def test_unknown_profile_key_is_rejected_with_its_name() -> None:
    """A typo in a user profile is an error that names the key."""
    with pytest.raises(ValueError, match="kv_cache_dtpye"):
        merge_profiles(builtin_profiles(), {"tp2-offload": {"kv_cache_dtpye": "fp8"}})


def test_dry_run_rendering_is_shell_quoted_and_round_trips() -> None:
    """The printed command line splits back into exactly the argv and environment."""
    command = LaunchCommand(
        argv=("/opt/v llm/vllm", "serve", "m", "--speculative-config", '{"a": 1}'),
        env={"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"},
    )
    words = shlex.split(command.render())
    assert words[0] == "VLLM_USE_SIMPLE_KV_OFFLOAD=1"
    assert tuple(words[1:]) == command.argv


def test_port_in_use_is_refused_with_a_clear_message() -> None:
    """The launcher will not start a server on a port that something already listens on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} is already in use"):
            check_port_free("127.0.0.1", port)


def test_free_port_passes() -> None:
    """A port nobody listens on passes the check."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    check_port_free("127.0.0.1", port)


def test_missing_vllm_binary_is_a_clear_error(tmp_path: Path) -> None:
    """A vllm that does not exist fails before anything starts, naming the fix."""
    with pytest.raises(LaunchError, match="not found"):
        resolve_vllm(str(tmp_path / "nope" / "vllm"))


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_resolve_reads_the_version_and_recognises_the_simulator(tmp_path: Path) -> None:
    """`vllm --version` decides whether GPU checks apply and which flags the version has."""
    real = resolve_vllm(_script(tmp_path / "vllm", "echo 0.26.1rc1.dev1214"))
    assert real.version == (0, 26, 1)
    assert not real.is_simulator
    broken = _script(tmp_path / "broken", "echo boom >&2; exit 3")
    with pytest.raises(LaunchError, match="status 3: boom"):
        resolve_vllm(broken)


def test_gpu_check_counts_visible_devices_for_real_vllm() -> None:
    """TP=2 with one visible GPU is refused; the simulator needs none."""
    command = build_command(vllm_bin="vllm", model="m", profile=builtin_profiles()["tp2-offload"])
    real = VllmBinary(path="vllm", version_text="0.33.0")
    one_gpu = {**command.env, "CUDA_VISIBLE_DEVICES": "0"}
    assert count_visible_gpus(one_gpu) == 1
    with pytest.raises(LaunchError, match="needs 2 GPUs but 1 are visible"):
        check_gpus(command, real, one_gpu)
    check_gpus(command, real, {"CUDA_VISIBLE_DEVICES": "0,1"})
    check_gpus(command, VllmBinary(path="vllm", version_text="0.33.0 (wedgewatch simulator)"), {})
