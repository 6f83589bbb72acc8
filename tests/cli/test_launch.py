"""The launcher's pure parts: profiles, flag merging, the command line, and its checks."""

from __future__ import annotations

import io
import shlex
import socket
import stat
from pathlib import Path

import pytest
from ports import free_port

from wedgewatch.config import ConfigError, load_config, render_toml
from wedgewatch.launch import (
    LaunchCommand,
    LaunchError,
    LaunchOptions,
    VllmBinary,
    build_command,
    check_gpus,
    check_port_free,
    count_visible_gpus,
    exit_status,
    launch,
    merge_args,
    preflight,
    prepare,
    render_profiles,
    resolve_vllm,
    select_profile,
    target_url,
    watch_config,
)
from wedgewatch.vllm.profiles import Profile, builtin_profiles, merge_profiles

TP2_FLAGS = [
    *("--tensor-parallel-size", "2", "--kv-offloading-size", "60"),
    *("--kv-offloading-backend", "native", "--max-num-seqs", "6"),
    *("--max-num-batched-tokens", "4096", "--enable-prefix-caching", "--enable-chunked-prefill"),
]


def test_reporters_full_setup_adds_the_optional_knobs() -> None:
    """tp2-offload-53868 is tp2-offload plus fp8, block size 1648, eager and retention 1648."""
    profile = builtin_profiles()["tp2-offload-53868"]
    old = build_command(vllm_bin="v", model="m", profile=profile, vllm_version=(0, 26, 1))
    assert old.argv[: 3 + len(TP2_FLAGS)] == ("v", "serve", "m", *TP2_FLAGS)
    assert old.argv[3 + len(TP2_FLAGS) :] == (
        "--enforce-eager",
        "--kv-cache-dtype",
        "fp8",
        "--block-size",
        "1648",
    )
    assert dict(old.env) == {
        "VLLM_USE_SIMPLE_KV_OFFLOAD": "1",
        "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": "1648",
    }
    new = build_command(vllm_bin="v", model="m", profile=profile, vllm_version=(0, 33, 0))
    assert new.argv[-2:] == ("--prefix-cache-retention-interval", "1648")
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" not in new.env


def test_the_default_profile_passes_the_users_flags_through() -> None:
    """`launch --model X -- FLAGS` is `vllm serve X FLAGS`: no flag or variable added."""
    options = LaunchOptions(model="X", extra_args=("--max-num-seqs", "8", "--port", "8123"))
    prepared = prepare(options, builtin_profiles(), resolve=_unresolved)
    assert prepared.command.argv == ("vllm", "serve", "X", "--max-num-seqs", "8", "--port", "8123")
    assert dict(prepared.command.env) == {}
    bare = prepare(LaunchOptions(model="X"), builtin_profiles(), resolve=_unresolved)
    assert (bare.command.argv, dict(bare.command.env)) == (("vllm", "serve", "X"), {})


def _unresolved(vllm_bin: str) -> VllmBinary:
    return VllmBinary(path=vllm_bin, version_text="0.30.0")


def test_the_mitigated_profile_drops_the_cpu_kv_offloading() -> None:
    """tp2-mitigated: two GPUs, the reporter's batching, no offloading flag or variable."""
    command = build_command(vllm_bin="vllm", model="m", profile=builtin_profiles()["tp2-mitigated"])
    assert command.tensor_parallel_size == 2
    assert dict(command.env) == {}
    assert not any("offload" in part for part in command.argv)
    assert "--max-num-seqs" not in command.argv
    assert "--max-num-batched-tokens" in command.argv


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
    check_port_free("127.0.0.1", free_port())


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


def test_gpu_count_asks_nvidia_smi_through_the_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CUDA_VISIBLE_DEVICES the GPUs are the `GPU n:` lines of `nvidia-smi -L`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _script(bindir / "nvidia-smi", 'echo "GPU 0: A100 (UUID: x)"; echo "GPU 1: A100 (UUID: y)"')
    monkeypatch.setenv("PATH", str(bindir))
    assert count_visible_gpus({}) == 2
    _script(bindir / "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert count_visible_gpus({}) == 0


async def test_resolve_works_from_inside_a_running_event_loop(tmp_path: Path) -> None:
    """The demo prepares from inside its event loop: the blocking runner still answers."""
    assert resolve_vllm(_script(tmp_path / "vllm", "echo 0.33.0")).version == (0, 33, 0)


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


def test_cpu_build_needs_no_gpu_but_a_core_set_per_rank() -> None:
    """vLLM's CPU build (`+cpu`, or VLLM_TARGET_DEVICE=cpu) is never asked for GPUs; TP=2 on
    it needs VLLM_CPU_OMP_THREADS_BIND with two core sets, which cpu-tiny-tp2 sets."""
    profiles = builtin_profiles()
    cpu_build = VllmBinary(path="vllm", version_text="0.32.0+cpu")
    real = VllmBinary(path="vllm", version_text="0.32.0")
    tiny = build_command(vllm_bin="vllm", model="m", profile=profiles["cpu-tiny"])
    assert tiny.env["VLLM_TARGET_DEVICE"] == "cpu"
    check_gpus(tiny, real, {"CUDA_VISIBLE_DEVICES": ""})  # its environment says CPU
    tp2 = build_command(vllm_bin="vllm", model="m", profile=profiles["cpu-tiny-tp2"])
    check_gpus(tp2, cpu_build, {"CUDA_VISIBLE_DEVICES": ""})
    unbound = build_command(
        vllm_bin="vllm", model="m", profile=Profile(), extra_args=["--tensor-parallel-size", "2"]
    )
    with pytest.raises(LaunchError, match=r"VLLM_CPU_OMP_THREADS_BIND .* but it is ''"):
        check_gpus(unbound, cpu_build, {})
    with pytest.raises(LaunchError, match="needs 2 GPUs but 0 are visible"):
        check_gpus(unbound, real, {"CUDA_VISIBLE_DEVICES": ""})


# -- profiles from the config file ------------------------------------------------------------


def test_profiles_come_from_toml_tables(tmp_path: Path) -> None:
    """[profiles.NAME] tables in the config file add profiles and override shipped ones."""
    path = tmp_path / "w.toml"
    path.write_text(
        '[profiles."tp2-offload"]\nkv_cache_dtype = "fp8"\n\n'
        '[profiles.tp4]\nargs = ["--tensor-parallel-size", "4"]\nenv = { A = "1" }\n'
    )
    loaded = load_config(config_file=path)
    profiles = merge_profiles(builtin_profiles(), loaded.config.profiles)
    command = build_command(vllm_bin="vllm", model="m", profile=profiles["tp2-offload"])
    assert command.argv[-2:] == ("--kv-cache-dtype", "fp8")
    assert command.env == {"VLLM_USE_SIMPLE_KV_OFFLOAD": "1"}
    assert profiles["tp4"].args == ("--tensor-parallel-size", "4")
    assert loaded.sources["profiles"] == f"file:{path}"


def test_profiles_come_from_json_in_the_environment() -> None:
    """WEDGEWATCH_PROFILES holds the same tables as one JSON object."""
    loaded = load_config(environ={"WEDGEWATCH_PROFILES": '{"mine": {"block_size": 32}}'})
    assert merge_profiles(builtin_profiles(), loaded.config.profiles)["mine"].block_size == 32


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param(
            {"WEDGEWATCH_PROFILES": '{"tp2-offload": {"kv_cache_dtpye": "fp8"}}'},
            "profile 'tp2-offload': unknown key 'kv_cache_dtpye'; did you mean 'kv_cache_dtype'?",
            id="unknown-key",
        ),
        pytest.param(
            {"WEDGEWATCH_PROFILES": '{"x": {"block_size": 0}}'},
            "profile 'x': block_size = 0: Input should be greater than 0",
            id="bad-value",
        ),
        pytest.param(
            {"WEDGEWATCH_PROFILES": '{"x": "--tp 2"}'},
            "profile 'x' must be a table of keys",
            id="not-a-table",
        ),
        pytest.param(
            {"WEDGEWATCH_PROFILES": "{x"},
            "is not a JSON object of profiles",
            id="bad-json",
        ),
    ],
)
def test_bad_profiles_in_the_config_are_named(environ: dict[str, str], expected: str) -> None:
    """A bad user profile fails config loading with the profile, the key and the rule."""
    with pytest.raises(ConfigError) as caught:
        load_config(environ=environ)
    (message,) = caught.value.messages
    assert message.startswith("profiles = ")
    assert "(from environment WEDGEWATCH_PROFILES)" in message
    assert expected in message


def test_rendered_toml_keeps_profiles(tmp_path: Path) -> None:
    """`config show` prints profiles as [profiles.NAME] tables that load back the same."""
    original = load_config(
        environ={"WEDGEWATCH_PROFILES": '{"tp 2": {"args": ["--x", "1"], "env": {"A": "b c"}}}'}
    )
    path = tmp_path / "shown.toml"
    path.write_text(render_toml(original))
    assert load_config(config_file=path).config == original.config


def test_unknown_profile_name_lists_the_known_ones() -> None:
    """`--profile tp2-offlaod` is refused with a suggestion and the list of profiles."""
    with pytest.raises(
        LaunchError,
        match=r"did you mean 'tp2-offload'\?.*known: cpu-tiny, cpu-tiny-tp2, plain, tp2-mitig",
    ):
        select_profile(builtin_profiles(), "tp2-offlaod")


def test_profile_listing_shows_each_profile_command() -> None:
    """--list-profiles prints every profile with its description and rendered command."""
    text = render_profiles(builtin_profiles())
    assert "tp2-offload: Tensor parallel 2" in text
    assert "VLLM_USE_SIMPLE_KV_OFFLOAD=1 vllm serve MODEL --tensor-parallel-size 2" in text
    assert "plain: " in text
    assert "\n    vllm serve MODEL\n" in text  # plain adds nothing


# -- the watchdog's view of the server ---------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "url"),
    [
        pytest.param([], "http://127.0.0.1:8000", id="defaults"),
        pytest.param(["--host", "0.0.0.0", "--port", "9000"], "http://127.0.0.1:9000", id="any"),
        pytest.param(["--host", "::", "--port", "9000"], "http://[::1]:9000", id="any6"),
        pytest.param(["--host", "10.1.2.3"], "http://10.1.2.3:8000", id="address"),
        pytest.param(["--host=fe80::1", "--port=81"], "http://[fe80::1]:81", id="ipv6"),
    ],
)
def test_target_url_follows_host_and_port(extra: list[str], url: str) -> None:
    """The watchdog scrapes where the server listens; all interfaces means loopback."""
    command = build_command(vllm_bin="v", model="m", profile=Profile(), extra_args=extra)
    assert target_url(command) == url


def test_watch_config_watches_the_launched_server_with_supervise() -> None:
    """--watch keeps the user's watchdog settings but fixes the target and the remedy."""
    config = load_config(
        flags={"stall_after_seconds": 12.0, "remedy": "signal", "targets": ("http://127.0.0.1:1",)}
    ).config
    command = build_command(
        vllm_bin="v", model="m", profile=Profile(), extra_args=["--port", "8123"]
    )
    watched = watch_config(config, command)
    assert watched.remedy == "supervise"
    assert [(t.name, t.metrics_url) for t in watched.targets] == [
        ("127.0.0.1:8123", "http://127.0.0.1:8123/metrics")
    ]
    assert watched.stall_after_seconds == 12.0


@pytest.mark.parametrize(
    ("returncode", "status"),
    [
        pytest.param(0, 0, id="ok"),
        pytest.param(3, 3, id="error"),
        pytest.param(-15, 143, id="TERM"),
    ],
)
def test_exit_status_is_what_a_shell_reports(returncode: int, status: int) -> None:
    """A server killed by signal N makes the launcher exit 128 + N, like a shell."""
    assert exit_status(returncode) == status


def test_non_numeric_port_is_a_launch_error() -> None:
    """`-- --port http` is refused before anything starts."""
    with pytest.raises(LaunchError, match="--port 'http' is not a port number"):
        prepare(
            LaunchOptions(model="m", extra_args=("--port", "http")),
            builtin_profiles(),
            resolve=lambda name: VllmBinary(path=name, version_text="0.33.0"),
        )


def test_dry_run_goes_on_without_vllm_but_a_launch_does_not(tmp_path: Path) -> None:
    """A dry run prints the command even where vLLM is not installed; a launch refuses."""
    missing = str(tmp_path / "vllm")
    prepared = prepare(LaunchOptions(model="m", vllm_bin=missing, dry_run=True), builtin_profiles())
    assert prepared.binary is None
    assert prepared.command.argv[:3] == (missing, "serve", "m")
    with pytest.raises(LaunchError, match="not found"):
        prepare(LaunchOptions(model="m", vllm_bin=missing), builtin_profiles())


def test_watch_refuses_port_zero_and_a_busy_watchdog_port() -> None:
    """--watch needs a fixed server port and a free port for its own endpoints."""
    binary = VllmBinary(path="v", version_text="0.1.0 wedgewatch simulator")
    zero = build_command(vllm_bin="v", model="m", profile=Profile(), extra_args=["--port", "0"])
    with pytest.raises(LaunchError, match="--watch needs a fixed server port"):
        preflight(zero, binary, load_config().config)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        free = free_port()
        command = build_command(
            vllm_bin="v", model="m", profile=Profile(), extra_args=["--port", str(free)]
        )
        config = load_config(flags={"listen_port": busy}).config
        with pytest.raises(LaunchError, match=f"wedgewatch's own endpoints: port {busy}"):
            preflight(command, binary, config)
        preflight(command, binary, None)  # without --watch the watchdog port does not matter


def test_launch_dry_run_prints_only_the_command_on_stdout(tmp_path: Path) -> None:
    """`--dry-run` writes the copy-paste command to stdout and the notes to stderr."""
    vllm = _script(tmp_path / "vllm", "echo 0.26.1")
    out, err = io.StringIO(), io.StringIO()
    profiles = merge_profiles(
        builtin_profiles(), {"tp2-offload": {"prefix_cache_retention_interval": 1648}}
    )
    options = LaunchOptions(
        model="Qwen/Qwen3-8B",
        profile="tp2-offload",
        vllm_bin=vllm,
        extra_args=("--port", "8123"),
        dry_run=True,
        watch=True,
    )
    code = launch(options, load_config().config, profiles, stdout=out, stderr=err)
    assert code == 0
    words = shlex.split(out.getvalue())
    assert words[:3] == [
        "VLLM_PREFIX_CACHE_RETENTION_INTERVAL=1648",
        "VLLM_USE_SIMPLE_KV_OFFLOAD=1",
        vllm,
    ]
    assert words[3:5] == ["serve", "Qwen/Qwen3-8B"]
    assert words[-2:] == ["--port", "8123"]
    notes = err.getvalue()
    assert "# profile tp2-offload:" in notes
    assert "--version` says '0.26.1'" in notes
    assert "watches http://127.0.0.1:8123/metrics" in notes


def test_connections_in_time_wait_do_not_make_a_port_busy() -> None:
    """A port whose last server just stopped (connections in TIME_WAIT) counts as free."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end goes to TIME_WAIT
        client.close()
    check_port_free("127.0.0.1", port)
