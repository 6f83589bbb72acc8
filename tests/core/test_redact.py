"""Redaction: one rule for flags, environment names and URLs."""

from __future__ import annotations

import pytest

from wedgewatch.core.redact import (
    redact_argv,
    redact_command_line,
    redact_env,
    redact_url,
)


def test_argv_masks_secret_flag_values_only() -> None:
    """`--api-key X` and `--hf-token=X` are masked; `--max-num-batched-tokens 4096` is not."""
    argv = ["vllm", "serve", "m", "--api-key", "s1", "--hf-token=s2",
            "--max-num-batched-tokens", "4096", "--ssl-keyfile", "/k.pem"]  # fmt: skip
    assert redact_argv(argv) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***",
        "--max-num-batched-tokens", "4096", "--ssl-keyfile", "/k.pem",
    ]  # fmt: skip
    assert redact_command_line("x --db-password pw y") == "x --db-password *** y"


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("VLLM_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("VLLM_USE_SIMPLE_KV_OFFLOAD", False),
        ("CUDA_VISIBLE_DEVICES", False),
        ("NCCL_DEBUG", False),
    ],
)
def test_env_names(name: str, secret: bool) -> None:
    """Names containing TOKEN, KEY, SECRET, PASSWORD (and friends) have their values masked."""
    assert (redact_env({name: "v"})[name] == "***") is secret


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("https://user:pw@hooks.example/x?token=abc&a=1",
         "https://user:***@hooks.example/x?token=***&a=1"),
        ("https://hooks.example/x?api_key=k&sig=s", "https://hooks.example/x?api_key=***&sig=***"),
        ("https://user@hooks.example/x", "https://user@hooks.example/x"),
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),
        ("not a url", "not a url"),
    ],
)  # fmt: skip
def test_urls(url: str, redacted: str) -> None:
    """URLs lose their password and secret-looking query values; the rest stays."""
    assert redact_url(url) == redacted
