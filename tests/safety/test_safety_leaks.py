"""No planted secret appears anywhere wedgewatch writes (issue #21 acceptance; slow).

One run against a hostile target: a real simulator whose argv, environment and model name
carry planted secrets and hostile text (a multi-line `--chat-template` pushing `--api-key`
onto the next line of py-spy's header, an `--api-key` value with spaces, a secret inside
`--kv-transfer-config` JSON, a `VLLM_*` URL with a password, a JSON environment value, a
model name with an escape sequence, Markdown and a Slack mention), watched through a URL
with a token-only userinfo and secret query keys (URLs with a #fragment are refused), and
a webhook URL with a secret path and query. Under load the engine wedges
(`collective-hang`), so the daemon's state and `check --state-file`'s file carry that engine;
evidence is captured (a py-spy dump whose header holds the multi-line argument), the exec
remedy runs, webhooks go to a real local receiver. Then every byte wedgewatch wrote is read
back: the daemon's log, its state and evidence directories (every file), the probe's state
file, `/status`, `/probe`, `/metrics`, `/health`, the webhook bodies, the exec remedy's
environment, `check` (text and JSON), `report` (HTML, Markdown) and its `--upstream` body,
`bundles` and every command's output. No planted secret may be in any of them, and no escape
character may reach a terminal or a log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_http import Reply, ScriptedServer, always
from simproc import LoadProcess, SimProcess
from wedgewatch_daemon import DaemonProcess, clean_env

pytestmark = pytest.mark.slow

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
P = "PLANTED"  # every planted secret starts with it: one grep finds any of them
HOSTILE_MODEL = f"evil\x1b[2J![i](http://evil.example/i.png)<!channel>`` http://{P}model@h/"
SIM_FLAGS = [
    "--served-model-name", HOSTILE_MODEL,
    "--chat-template", "{% for m in messages %}\n{{ m.content }}\n{% endfor %}",
    "--api-key", f"two {P}apikey words",
    "--kv-transfer-config",
    json.dumps({"kv_connector": "LMCacheConnectorV1",
                "kv_connector_extra_config": {"secret_access_key": f"{P}kvjson"}}),
    "--fault", "collective-hang@8",
]  # fmt: skip
SIM_ENV = {
    "VLLM_STORE_URL": f"redis://user:{P}envurl@10.0.0.9:6379/0",
    "VLLM_CONNECTOR_JSON": json.dumps({"aws_secret_access_key": f"{P}envjson"}),
    "HF_TOKEN": f"{P}hftoken",
    "VLLM_TOKEN_URL": f"http://{P}envtoken@10.0.0.9/",
}
DAEMON_FLAGS = [
    "--interval-seconds", "1",
    "--unreachable-after-seconds", "2",
    "--stall-after-seconds", "3",
    "--hang-after-seconds", "3",
    "--scrape-timeout-seconds", "1",
    "--startup-timeout-seconds", "3",
    "--restart-backoff-seconds", "1",
    "--restart-backoff-max-seconds", "1",
    "--restart-budget", "1",
    "--pyspy-timeout-seconds", "20",
    "--webhook-retries", "0",
]  # fmt: skip


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*WEDGEWATCH, *args], capture_output=True, timeout=timeout, check=False, env=clean_env()
    )


@pytest.fixture
def hostile_sim(tmp_path: Path) -> Iterator[SimProcess]:
    """The simulator with planted secrets in its argv, environment and model name."""
    sim = SimProcess(tmp_path / "sim.log", SIM_FLAGS, env={**os.environ, **SIM_ENV})
    try:
        yield sim.wait_ready()
    finally:
        sim.stop()


def _every_file(*roots: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                found[f"file {path.relative_to(root.parent)}"] = path.read_bytes()
    return found


def test_no_planted_secret_appears_anywhere_wedgewatch_writes(
    hostile_sim: SimProcess, tmp_path: Path
) -> None:
    """The acceptance test of #21: grep every output of a hostile run for the secrets."""
    port = hostile_sim.url.rsplit(":", 1)[1]
    target_url = (
        f"http://{P}urltoken@127.0.0.1:{port}/metrics"
        f"?apikey={P}apikeyq&apiKey={P}apiKeyq&pwd={P}pwdq"  # a #fragment is refused
    )
    exec_env = tmp_path / "exec-env.txt"
    probe_state = tmp_path / "probe" / "probe.json"
    outputs: dict[str, bytes] = {}
    load = LoadProcess(
        hostile_sim.url, ["--profile", "steady", "--duration", "60"], tmp_path / "load.txt"
    )
    with ScriptedServer(always(Reply(200, b"ok", {"Content-Type": "text/plain"}))) as hook:
        webhook = f"{hook.base_url}/services/T0/{P}hookpath?token={P}hookquery"
        daemon = DaemonProcess(
            [
                "--target", f"hostile={target_url}",
                "--webhook-url", webhook,
                "--remedy", "exec",
                "--exec-command", f"sh -c 'env > {exec_env}'",
                *DAEMON_FLAGS,
            ],
            tmp_path,
        )  # fmt: skip
        try:
            wedge = daemon.wait_for("wedge_detected", timeout_seconds=120)
            assert wedge["family"] == "progress_stall", wedge
            captured = daemon.wait_for("evidence_captured", timeout_seconds=180, phase="wedged")
            daemon.wait_for("restart_failed", timeout_seconds=120)
            deadline = time.monotonic() + 60
            while len(hook.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            for path in ("/status", "/probe", "/metrics", "/health"):
                outputs[f"GET {path}"] = daemon.get(path).content
            check = _run("check", target_url, "--for", "2", "--interval-seconds", "1")
            check_json = _run("check", target_url, "--json")
            probe_state.parent.mkdir(mode=0o700)
            probe = _run("check", target_url, "--state-file", str(probe_state), "--for", "2")
            assert daemon.stop() == 0
        finally:
            load.stop()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(daemon.proc.pid, signal.SIGKILL)
        webhooks = [r.body for r in hook.requests]
    bundle = Path(captured["bundle"])
    report = _run("report", str(bundle))
    upstream = _run("report", str(bundle), "--upstream", "-o", str(tmp_path / "upstream.md"))
    listing = _run("bundles", "--evidence-dir", str(daemon.evidence_dir))
    assert report.returncode == 0, report.stderr
    assert upstream.returncode == 0, upstream.stderr
    assert webhooks, "no webhook was delivered"
    assert exec_env.exists(), daemon.log_path.read_text()[-3000:]

    # Every output of the run.
    outputs |= {f"webhook body {i}": body for i, body in enumerate(webhooks)}
    outputs["daemon log"] = daemon.log_path.read_bytes()
    outputs["exec remedy environment"] = exec_env.read_bytes()
    for name, done in (("check", check), ("check --json", check_json), ("report", report),
                       ("report --upstream", upstream), ("bundles", listing),
                       ("check --state-file", probe)):  # fmt: skip
        outputs[f"{name} stdout"] = done.stdout
        outputs[f"{name} stderr"] = done.stderr
    outputs |= _every_file(tmp_path / "state", daemon.evidence_dir, probe_state.parent)
    outputs["upstream.md"] = (tmp_path / "upstream.md").read_bytes()

    # The run did go through the hostile values (else the test proves nothing).
    assert any(b"report.md" in name.encode() for name in outputs), sorted(outputs)
    build = json.loads((bundle / "build.json").read_text())
    assert "--api-key" in build["command_line"], build["command_line"]
    dumps = {n: d for n, d in outputs.items() if n.startswith("file ") and "pyspy" in n}
    assert any(b"--chat-template" in d.split(b"\nThread ", 1)[0] for d in dumps.values()), sorted(
        dumps
    )  # a dump was written, and its header carries the multi-line argument (item 3)
    # Both state files carry the wedged engine (by its redacted model name).
    state_files = {n: d for n, d in outputs.items() if n.endswith(".json") and "state" in n}
    state_files[f"file {probe_state.name}"] = probe_state.read_bytes()
    assert any(b"evil" in d and b"model_name" in d for d in state_files.values()), state_files
    assert b"model_name" in probe_state.read_bytes()
    assert "VLLM_STORE_URL" in build["engine_env"], build["engine_env"]
    assert rb"evil\\x1b[2J" in outputs["daemon log"]  # the model name, neutralised (in JSON)
    assert "apikey=***" in outputs["GET /status"].decode()

    leaks = sorted(
        (place, m.group(0).decode(errors="replace"))
        for place, data in outputs.items()
        for m in re.finditer(rb"PLANTED\w*", data)
    )
    assert leaks == [], leaks[:20]

    # Terminals and logs get no escape character; Slack text no mention or link.
    for place in ("daemon log", "check stdout", "bundles stdout", "report stderr"):
        assert b"\x1b" not in outputs[place], place
    for place, data in outputs.items():  # every file, too: safe to `cat`
        assert not place.startswith("file ") or b"\x1b" not in data, place
    texts = [json.loads(body)["text"] for body in webhooks]
    assert not any("<" in text for text in texts), texts
    assert any("&lt;!channel&gt;" in text for text in texts), texts  # the model name's
    # The hostile model name renders as code in Markdown, never as an image.
    markdown = (bundle / "report.md").read_text() + outputs["upstream.md"].decode()
    assert "evil\\x1b[2J![i](http://evil.example/i.png)" in markdown
    outside_code = re.sub(r"(`+)(?:(?!\1).)+?\1", "", re.sub(r"(?ms)^(`{3,}).*?^\1", "", markdown))
    assert "![i](" not in outside_code
