"""Redaction: one rule for flags, environment names, URLs, webhook URLs and free text."""

from __future__ import annotations

import pytest

from wedgewatch.core.text.redact import (
    MASK,
    redact_argv,
    redact_command_line,
    redact_env,
    redact_url,
    redact_webhook_url,
    scrub_text,
    secret_fragments,
)


def test_argv_masks_secret_flag_values_only() -> None:
    """`--api-key X` and `--hf-token=X` are masked; `--max-num-batched-tokens 4096` is not."""
    argv = ["vllm", "serve", "m", "--api-key", "s1", "--hf-token=s2",
            "--max-num-batched-tokens", "4096", "--ssl-keyfile", "/k.pem"]  # fmt: skip
    assert redact_argv(argv) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf-token=***",
        "--max-num-batched-tokens", "4096", "--ssl-keyfile", "/k.pem",
    ]  # fmt: skip
    # In a title (words joined by spaces) a value may hold spaces: masked to the next -flag.
    assert redact_command_line("x --db-password pw y") == "x --db-password ***"
    assert redact_command_line("x --db-password pw y --port 1") == "x --db-password *** --port 1"


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
        # userinfo without a password may be a token (`http://TOKEN@host`): masked whole
        ("https://user@hooks.example/x", "https://***@hooks.example/x"),
        ("http://127.0.0.1:8000/metrics", "http://127.0.0.1:8000/metrics"),
        ("not a url", "not a url"),
    ],
)  # fmt: skip
def test_urls(url: str, redacted: str) -> None:
    """URLs lose their password and secret-looking query values; the rest stays."""
    assert redact_url(url) == redacted


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param(
            "https://hooks.slack.com/services/T000/B000/XXXXSECRET",
            "https://hooks.slack.com/***",
            id="slack-path",
        ),
        pytest.param(
            "https://discord.com/api/webhooks/123/tok-en", "https://discord.com/***", id="discord"
        ),
        pytest.param(
            "https://example.org:8443/hook?token=s3cr3t", "https://example.org:8443/***", id="query"
        ),
        pytest.param("https://u:p@example.org/x", "https://***@example.org/***", id="userinfo"),
        pytest.param("https://example.org", "https://example.org", id="no-path"),
        pytest.param("http://[::1]:9/x#frag", "http://[::1]:9/***", id="ipv6"),
        pytest.param("hooks.slack.com/services/X", MASK, id="not-a-url-masked"),
    ],
)
def test_webhook_urls_show_only_scheme_and_host(url: str, shown: str) -> None:
    """Webhook URLs keep their secret in the path or query: only scheme, host, port remain."""
    assert redact_webhook_url(url) == shown


def test_argv_masks_secret_assignments_and_url_credentials() -> None:
    """`HF_TOKEN=X` and `https://user:pw@host` in a command line are masked as well."""
    argv = ["env", "HF_TOKEN=hf_abc", "vllm", "--kv-transfer-config", "http://u:p@10.0.0.1:9/x"]
    assert redact_argv(argv) == [
        "env", f"HF_TOKEN={MASK}", "vllm", "--kv-transfer-config", f"http://{MASK}@10.0.0.1:9/x",
    ]  # fmt: skip


def test_scrub_text_masks_fragments_of_configured_urls() -> None:
    """A library's error text that embeds a webhook URL loses the URL's secret parts."""
    url = "https://hooks.slack.com/services/T0/B0/SECRETXYZ?t=tok12345"
    scrubbed = scrub_text(f"ConnectError: cannot POST {url}", secret_fragments([url]))
    assert "SECRETXYZ" not in scrubbed
    assert "tok12345" not in scrubbed
    assert "hooks.slack.com" in scrubbed


def test_secret_fragments_of_target_keep_the_path() -> None:
    """For target URLs the path is not secret: only the password and the query are."""
    url = "http://bob:hunter2@127.0.0.1:8000/metrics?k=abcd"
    assert set(secret_fragments([url], keep_path=True)) == {"hunter2", "k=abcd"}
