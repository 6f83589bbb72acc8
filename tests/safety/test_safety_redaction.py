"""What leaves the process (issue #21): redaction by value, and target values as data.

Each test plants a secret or a hostile value in one of the forms the security review found
leaking, and asserts it never appears in what the writer produces: a bundle file on disk,
a log line of a real process, a webhook body, `check`'s output, a Markdown string.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from wedgewatch.check import CheckReport, Status
from wedgewatch.core.evidence.triage import ProcessStacks, StackRound, triage
from wedgewatch.core.text.escape import (
    TRUNCATION_MARKER,
    md_fence,
    md_inline,
    md_text,
    neutralise,
    truncate,
)
from wedgewatch.core.text.redact import (
    MASK,
    is_secret_key,
    redact_argv,
    redact_env,
    redact_text,
    redact_url,
    redact_value,
)
from wedgewatch.daemon.publish import EngineSnapshot, TargetSnapshot
from wedgewatch.daemon.server import Snapshot, make_app
from wedgewatch.io.bundles import bundle_bytes, note_remedy, write_round_files
from wedgewatch.io.notify import Notification, payload
from wedgewatch.vllm.semantics import Role

S = "PLANTEDSECRET"  # every planted secret contains it, so one grep finds any leak


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(f"GET http://{S}@10.0.0.1:8000/metrics failed", id="token-only-userinfo"),
        pytest.param(f"http://bob:{S}@h/x", id="password"),
        pytest.param(f"see https://h/x?apikey={S}&a=1 now", id="apikey"),
        pytest.param(f"https://h/x?apiKey={S}", id="apiKey"),
        pytest.param(f"https://h/x?pwd={S}", id="pwd"),
        pytest.param(f"https://h/x#token={S}", id="fragment-token"),
        pytest.param(f"https://h/x?a=1&access_token={S}#x", id="access_token"),
        pytest.param(
            '--kv-transfer-config {"kv_connector":"LMCache","kv_connector_extra_config":'
            f'{{"secret_access_key": "{S}", "endpoint": "s3://b"}}}}',
            id="json-in-flag",
        ),
        pytest.param(f"{{'aws_secret_access_key': '{S}'}}", id="python-dict"),
        pytest.param(
            f"Process 7: vllm serve m --chat-template {{% for m in x %}}\n{{{{ m }}}}\n"
            f"{{% endfor %}} --api-key {S} --port 8000\nPython v3.12 (/usr/bin/python3)",
            id="pyspy-header-multiline-chat-template",
        ),
        pytest.param(f"vllm serve m --api-key\n{S}\n", id="flag-value-on-next-line"),
        pytest.param(f"vllm serve m --api-key my {S} words --port 1", id="value-with-spaces"),
        pytest.param(f"vllm serve m --api-key={S} rest", id="flag-equals"),
        pytest.param(f"vllm serve m --apikey {S}", id="apikey-flag"),
        pytest.param(f"env HF_TOKEN={S} vllm", id="assignment"),
        pytest.param(f'vllm:x{{model_name="m",api_key="{S}"}} 1', id="label"),
        pytest.param(f"Authorization: Bearer {S}", id="bearer"),
    ],
)
def test_free_text_loses_every_planted_secret(text: str) -> None:
    """Secrets are found by value, wherever in a text they are."""
    shown = redact_text(text)
    assert S not in shown
    assert MASK in shown


def test_what_is_not_secret_stays_readable() -> None:
    """`--max-num-batched-tokens 4096`, `max_tokens`, `ssl_keyfile` and plain URLs are kept."""
    text = (
        "vllm serve m --max-num-batched-tokens 4096 --ssl-keyfile /k.pem "
        '{"max_tokens": 16} http://127.0.0.1:8000/metrics?a=1 token budget'
    )
    assert redact_text(text) == text
    for key in ("max_tokens", "ssl_keyfile", "num_gpu_blocks", "kv_connector", "tokenizer"):
        assert not is_secret_key(key), key
    for key in ("apiKey", "apikey", "secret_access_key", "HF_TOKEN", "pwd", "X-Auth"):
        assert is_secret_key(key), key


def test_argv_masks_a_whole_value_with_spaces_and_json_secrets() -> None:
    """In an argument vector the value after a secret flag is one word, spaces and all."""
    argv = ["vllm", "--api-key", f"two {S} words", "--kv-transfer-config",
            json.dumps({"kv_connector": "X", "secret_access_key": S}), "m"]  # fmt: skip
    shown = redact_argv(argv)
    assert S not in json.dumps(shown)
    assert shown[:3] == ["vllm", "--api-key", MASK]
    assert shown[-1] == "m"
    assert json.loads(shown[4]) == {"kv_connector": "X", "secret_access_key": MASK}


def test_environment_values_are_redacted_by_value() -> None:
    """A `VLLM_*` URL with a password and a JSON value with a secret key go out masked."""
    env = {
        "VLLM_REMOTE_URL": f"redis://user:{S}@10.0.0.9:6379/0",
        "VLLM_CONNECTOR_JSON": json.dumps({"secret_access_key": S}),
        "HF_TOKEN": S,
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    shown = redact_env(env)
    assert S not in json.dumps(shown)
    assert shown["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert shown["VLLM_REMOTE_URL"] == f"redis://{MASK}@10.0.0.9:6379/0"


def test_structured_values_mask_secret_keys_and_argv_lists() -> None:
    """`redact_value`: secret keys, argv lists, strings nested anywhere."""
    value = {
        "command_line": ["vllm", "--hf-token", S],
        "nested": [{"apiKey": S, "n": 1}, f"http://{S}@h/"],
        "max_tokens": 5,
    }
    shown = redact_value(value)
    assert S not in json.dumps(shown)
    assert shown["max_tokens"] == 5
    assert shown["nested"][0] == {"apiKey": MASK, "n": 1}


def test_urls_in_the_issue_forms() -> None:
    """Token-only userinfo, `?apikey=`, `?apiKey=`, `?pwd=`, `#token=`."""
    assert redact_url(f"http://{S}@h:1/m") == f"http://{MASK}@h:1/m"
    shown = redact_url(f"http://h/m?apikey={S}&apiKey={S}&pwd={S}&keep=1#token={S}")
    assert S not in shown
    assert "keep=1" in shown


def test_the_bundle_writer_redacts_every_file_it_writes(tmp_path: Path) -> None:
    """Whatever a caller hands the bundle writer, no planted secret reaches the disk."""
    files = {
        "summary.json": json.dumps({"title": f"vllm --api-key {S}", "token": S}).encode(),
        "pyspy/api_server-1.txt": (
            f"Process 1: vllm \x1b[2J --chat-template a\nb --api-key {S}\n".encode()
        ),
        "pyspy/api_server-1.json": json.dumps([{"locals": {"api_key": S}}]).encode(),
        "history.jsonl": (json.dumps({"url": f"http://{S}@h/"}) + "\n").encode(),
        "nvidia-smi.txt": f"HF_TOKEN={S}\n".encode(),
    }
    bundle = tmp_path / "b"
    bundle.mkdir()
    assert write_round_files(bundle, files, replace=False) == []
    assert note_remedy(bundle, {"detail": f"exec http://u:{S}@h failed"}) is None
    for path in bundle.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert S.encode() not in data, path
            assert b"\x1b" not in data, path  # safe to `cat`
            assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert json.loads((bundle / "summary.json").read_text())["token"] == MASK


def test_bundle_bytes_keeps_binary_and_non_secret_json() -> None:
    """Bytes that are not UTF-8 pass unchanged; JSON without secrets keeps its values."""
    assert bundle_bytes("x.bin", b"\xff\x00\xfe") == b"\xff\x00\xfe"
    assert json.loads(bundle_bytes("a.json", b'{"max_tokens": 3}')) == {"max_tokens": 3}


def test_triage_details_quote_no_raw_process_title() -> None:
    """A title with a secret and an escape sequence is redacted and neutralised in triage."""
    title = f"vllm serve m --api-key {S}\x1b[2J"
    process = ProcessStacks(1, 0, Role.API_SERVER, title, None, "not dumped", "running")
    result = triage([StackRound("wedged", (process,), None)])
    text = json.dumps(result.to_json())
    assert S not in text
    assert "\x1b" not in text


def test_neutralise_escapes_controls_and_cuts_huge_values() -> None:
    """NUL, ESC, C1, direction overrides become visible; 2 MB become a bounded string."""
    shown = neutralise("a\x00b\x1b[31mc\x9b\u202ed\tü\n", newlines=False)
    assert shown == "a\\x00b\\x1b[31mc\\x9b\\u202ed\tü\\x0a"
    huge = neutralise("m" * 2_000_000, 100)
    assert len(huge) < 200
    assert huge.startswith("m" * 100 + TRUNCATION_MARKER + "1999900 chars, #")
    assert truncate("abc", 3) == "abc"


def test_markdown_escaping_holds_against_fences_images_and_html() -> None:
    """Inline code and fences are never broken; escaped text renders no image or tag."""
    hostile = "x```\n![i](http://evil.example/i.png)<img src=x>`y"
    fence = md_fence(hostile, "text")
    opening = fence[0].removesuffix("text")
    assert len(opening) > 3
    assert opening not in fence[1]
    assert fence[2] == opening
    inline = md_inline(hostile)
    ticks = len(inline) - len(inline.lstrip("`"))
    assert "`" * ticks not in inline[ticks:-ticks]
    assert "\n" not in inline
    escaped = md_text(hostile)
    assert "![" not in escaped
    assert "<" not in escaped.replace("\\<", "")
    assert "\n" not in escaped


def test_webhook_body_is_redacted_neutralised_and_slack_escaped() -> None:
    """A hostile model name cannot mention the channel, link, or carry a secret or ESC."""
    note = Notification(
        event="wedge_detected",
        target="t",
        engine="0",
        model_name=f"<!channel> <http://evil|click> \x1b[2J {'m' * 100_000} --api-key {S}",
        family="deferred_stall",
        state="wedged",
        reason=f"http://{S}@h/ down",
        bundle=None,
        timestamp=0.0,
    )
    body = payload(note, version="v", host="h")
    text = json.dumps(body)
    assert S not in text
    assert "\\u001b" not in text
    assert "<" not in body["text"]
    assert "&lt;!channel&gt;" in body["text"]
    assert len(text) < 20_000


def test_check_prints_the_url_redacted_and_no_control_character() -> None:
    """`check`'s first line shows the target without credentials; values are neutralised."""
    report = CheckReport(
        status=Status.UNKNOWN,
        metrics_url=f"http://{S}@127.0.0.1:1/metrics?apikey={S}",
        engines=(),
        error=f"model \x1b]0;pwned\x07 said --api-key {S}",
        notes=(f"see http://u:{S}@h/",),
        scrapes=1,
        at=None,
    )
    text = report.render_text()
    assert S not in text
    assert "\x1b" not in text
    assert "\x07" not in text
    assert text.splitlines()[0].startswith(
        f"UNKNOWN: {Status.UNKNOWN.value} - http://***@127.0.0.1"
    )
    assert S not in json.dumps(report.to_json())


def test_log_lines_of_a_real_process_are_redacted_and_neutralised(tmp_path: Path) -> None:
    """Whatever a module logs goes through the log processor: no secret, no ESC, bounded."""
    script = (
        "from wedgewatch.logsetup import get_logger\n"
        "log = get_logger('t')\n"
        f"log.warning('x', detail='--api-key {S}', url='http://{S}@h/', "
        f"model='\\x1b[2J' + 'm' * 3_000_000, env={{'HF_TOKEN': '{S}'}})\n"
        "try:\n"
        f"    raise ValueError('http://u:{S}@h/')\n"
        "except ValueError:\n"
        "    log.exception('boom')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ},
    )
    assert done.returncode == 0, done.stderr
    err = done.stderr
    assert S.encode() not in err
    assert b"\x1b" not in err
    assert len(err) < 100_000
    assert b"***" in err


def test_the_check_command_prints_no_url_secret_on_its_first_line() -> None:
    """`wedgewatch check` (a real process) against a refused port: the URL is redacted."""
    url = f"http://{S}@127.0.0.1:1/metrics?apikey={S}&pwd={S}"
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "check", url, "--for", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")},
    )
    assert done.returncode != 0
    first = done.stdout.splitlines()[0]
    assert first.startswith(
        "CRITICAL: unreachable - http://***@127.0.0.1:1/metrics?apikey=***&pwd=***,"
    )
    assert S not in done.stdout + done.stderr


async def test_status_and_probe_as_served_carry_no_secret() -> None:
    """The daemon's own app: `/status` and `/probe` are redacted where they are served,
    whatever the snapshot holds (a model name, a reason, a scrape error with a secret)."""
    engine: dict[str, Any] = {
        "model_name": f"m http://{S}@h/", "engine": "0", "state": "wedged",
        "family": "deferred_stall", "since_timestamp": 1.0, "stalled_seconds": 30.0,
        "last_progress_timestamp": None, "reason": f"--api-key {S}", "missing": False,
        "reading": None,
    }  # fmt: skip
    target: dict[str, Any] = {
        "name": "t", "url": f"http://127.0.0.1:1/metrics?apiKey={S}", "state": "wedged",
        "reason": f"GET http://{S}@127.0.0.1:1/metrics failed", "up": True,
        "last_scrape_timestamp": 1.0, "last_scrape_error": f"HF_TOKEN={S}",
        "engines": (EngineSnapshot(**engine),), "remedy": "none", "restarts": 0,
        "restart_budget_remaining": 1, "gave_up": False, "restart_in_progress": False,
        "next_restart_allowed_timestamp": None, "last_bundle": None,
    }  # fmt: skip
    snapshot = Snapshot("v", 0.0, 1.0, 15.0, 0.0, targets={"t": TargetSnapshot(**target)})
    app = make_app(lambda: snapshot, CollectorRegistry(), lambda: 0.0)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
        responses = [await c.get("/status"), await c.get("/probe")]
    assert responses[1].status_code == 503
    for response in responses:
        assert S not in response.text
        assert MASK in response.text
