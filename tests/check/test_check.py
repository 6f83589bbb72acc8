"""`wedgewatch check`: the scrape window, the verdict, the state file, exit codes and output."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.vllm_exposition import EngineState as Shown
from fixtures.vllm_exposition import render_single_process
from scripted_http import RefusingPort, Reply, ScriptedServer, always, in_turn

from wedgewatch.check import (
    EXIT_CODES,
    STATE_FILE_VERSION,
    CheckOptions,
    CheckReport,
    one_shot_policy,
    run_blocking,
    run_check,
)
from wedgewatch.core.detection.detect import DetectionPolicy
from wedgewatch.core.restart.restart_policy import RestartPolicy
from wedgewatch.io.scrape_rules import ScrapeLimits
from wedgewatch.vllm.signals import EngineKey

FIXTURES = Path(__file__).parents[1] / "fixtures"
KEY = EngineKey("tiny-llama", "0")
KEY_1 = EngineKey("tiny-llama", "1")
URL = "http://vllm.test:8000/metrics"
POLICY = DetectionPolicy(
    stall_after_seconds=60,
    hang_after_seconds=120,
    output_stall_after_seconds=300,
    unreachable_after_seconds=30,
    startup_timeout_seconds=900,
)
STATUSES = {"ok", "idle", "sleeping", "starting", "suspect", "wedged", "unreachable", "unknown"}
FAMILIES = {
    "deferred_stall",
    "deferred_only_stall",
    "admission_stall",
    "progress_stall",
    "output_stall",
    "unreachable",
    "canary_stall",
}
HTML = b"<!doctype html><html><head><title>Welcome to nginx!</title></head></html>"


_BODIES: dict[str, bytes] = {}


def body(engines: tuple[tuple[EngineKey, Shown], ...]) -> bytes:
    """The vLLM body showing these engines (rendered once per distinct content)."""
    key = repr(engines)
    if key not in _BODIES:
        _BODIES[key] = render_single_process(dict(engines)).encode()
    return _BODIES[key]


def busy(step: int) -> Shown:
    """An engine making progress: every counter has moved `step` times."""
    return Shown(
        running=4,
        capacity=1,
        prompt_tokens=512.0 * (step + 1),
        generation_tokens=37.0 * (step + 1),
        finished={"stop": float(step)},
        iterations=step + 1,
    )


DEFERRED_WEDGE = Shown(
    running=0,
    capacity=1,
    deferred=2,
    prompt_tokens=1000,
    generation_tokens=200,
    finished={"stop": 5},
    iterations=40,
)
ADMISSION_WEDGE = Shown(
    running=0, capacity=3, prompt_tokens=1000, generation_tokens=200, iterations=40
)
IDLE = Shown(prompt_tokens=1000, generation_tokens=200, finished={"stop": 5}, iterations=40)
ASLEEP = Shown(
    awake=0, weights_offloaded=1, capacity=2, prompt_tokens=10, generation_tokens=2, iterations=1
)


def one(shown: Shown) -> bytes:
    return body(((KEY, shown),))


class FakeClock:
    """Monotonic time that only moves when the check sleeps (or a test says so)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


Responder = Callable[[int], httpx.Response]


def mock_client(responder: Responder, log: list[int] | None = None) -> httpx.AsyncClient:
    """A client whose n-th request (from 0) is answered by `responder(n)`."""
    count = [0]

    def handler(_: httpx.Request) -> httpx.Response:
        number = count[0]
        count[0] += 1
        if log is not None:
            log.append(number)
        return responder(number)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def bodies(*sequence: bytes) -> Responder:
    """Answer with the bodies in turn, repeating the last one."""
    return lambda n: httpx.Response(200, content=sequence[min(n, len(sequence) - 1)])


async def check(
    responder: Responder,
    *,
    window: float = 10.0,
    interval: float = 1.0,
    policy: DetectionPolicy = POLICY,
    state_file: Path | None = None,
    clock: FakeClock | None = None,
    url: str = URL,
    log: list[int] | None = None,
) -> CheckReport:
    clock = clock or FakeClock()
    options = CheckOptions(
        metrics_url=url,
        window_seconds=window,
        interval_seconds=interval,
        policy=policy,
        limits=ScrapeLimits(timeout_seconds=5.0, max_body_bytes=16 * 1024 * 1024),
        state_file=state_file,
    )
    async with mock_client(responder, log) as client:
        return await run_check(options, client=client, clock=clock, sleep=clock.sleep)


# -- one-shot: the window ------------------------------------------------------------------


def test_one_shot_policy_caps_every_threshold_at_the_window() -> None:
    """Without history, a stall lasting the whole window is a wedge, and there is no grace."""
    capped = one_shot_policy(POLICY, 10.0)
    # A lone deferral (streaming input, P/D decode) is routine for minutes: never capped.
    assert capped == DetectionPolicy(
        10.0, 10.0, 10.0, 10.0, 10.0, deferred_only_after_seconds=600.0
    )
    assert (
        one_shot_policy(DetectionPolicy(5.0, 120, 300, 30, None), 10.0).stall_after_seconds == 5.0
    )


def test_one_shot_policy_keeps_the_bounds_and_the_canary_timeout() -> None:
    """One-shot keeps max_engines, the vanished-engine expiry and the canary's timeout as
    configured: only the stall thresholds and the start-up timeout are capped."""
    policy = replace(
        POLICY, max_engines=4, vanished_engine_expiry_seconds=42.0, canary_timeout_seconds=7.0
    )
    capped = one_shot_policy(policy, 10.0)
    assert capped.max_engines == 4
    assert capped.vanished_engine_expiry_seconds == 42.0
    assert capped.canary_timeout_seconds == 7.0


async def test_healthy_busy_engine_is_ok() -> None:
    """Counters moving on every scrape: OK, exit 0, eleven scrapes a second apart."""
    clock = FakeClock()
    report = await check(lambda n: httpx.Response(200, content=one(busy(n))), clock=clock)
    assert report.status == "ok"
    assert report.exit_code == 0
    assert report.scrapes == 11
    assert clock.sleeps == [1.0] * 10
    assert report.error is None


async def test_deferred_wedge_flat_for_the_window_is_critical() -> None:
    """running 0, deferred 2, counters flat for the whole window: wedged, deferred_stall, exit 2."""
    report = await check(bodies(one(DEFERRED_WEDGE)))
    assert report.status == "wedged"
    assert report.exit_code == 2
    (engine,) = report.engines
    assert engine.family is not None
    assert engine.family.value == "deferred_stall"
    assert engine.stalled_seconds == 10.0


async def test_admission_wedge_is_named_as_such() -> None:
    """Requests waiting for capacity with nothing running and flat counters: admission_stall."""
    report = await check(bodies(one(ADMISSION_WEDGE)))
    assert report.status == "wedged"
    assert report.engines[0].family is not None
    assert report.engines[0].family.value == "admission_stall"


async def test_stall_that_began_inside_the_window_is_a_warning() -> None:
    """Progress for half the window, then flat: suspect, exit 1."""
    sequence = [one(busy(n)) for n in range(5)] + [one(DEFERRED_WEDGE)]
    report = await check(bodies(*sequence))
    assert report.status == "suspect"
    assert report.exit_code == 1
    assert 0 < report.engines[0].stalled_seconds < 10


@pytest.mark.parametrize(
    ("shown", "status"),
    [pytest.param(IDLE, "idle", id="idle"), pytest.param(ASLEEP, "sleeping", id="sleeping")],
)
async def test_calm_engines_are_ok(shown: Shown, status: str) -> None:
    """An idle engine and a sleeping one (even with requests waiting) exit 0."""
    report = await check(bodies(one(shown)))
    assert report.status == status
    assert report.exit_code == 0


async def test_html_body_is_unknown_at_once() -> None:
    """A body that is not vLLM's exposition is UNKNOWN (exit 3) after the first scrape."""
    log: list[int] = []
    report = await check(bodies(HTML), log=log)
    assert report.status == "unknown"
    assert report.exit_code == 3
    assert log == [0]
    assert report.error is not None
    assert report.error.startswith("not a vLLM metrics body: ")


async def test_target_that_never_answers_is_unreachable() -> None:
    """A target that fails every scrape of the window is unreachable (exit 2): no start-up grace."""
    report = await check(lambda _: httpx.Response(503, text="loading model"))
    assert report.status == "unreachable"
    assert report.exit_code == 2
    assert report.engines == ()
    assert report.error == f"http_status: HTTP 503 from {URL}: loading model"


async def test_target_that_goes_down_inside_the_window_is_suspect() -> None:
    """Up at first, then failing for less than the window: suspect, family unreachable."""

    def responder(n: int) -> httpx.Response:
        if n < 6:
            return httpx.Response(200, content=one(busy(n)))
        raise httpx.ConnectError("[Errno 111] Connection refused")

    report = await check(responder)
    assert report.status == "suspect"
    assert report.engines[0].family is not None
    assert report.engines[0].family.value == "unreachable"
    assert report.error == "refused: connection refused by vllm.test:8000"


async def test_slow_scrapes_still_span_the_whole_window() -> None:
    """Scrapes that take 3 s each: the last one still begins at or after the window's end."""
    clock = FakeClock()

    def responder(_: int) -> httpx.Response:
        clock.now += 3.0
        return httpx.Response(200, content=one(DEFERRED_WEDGE))

    report = await check(responder, clock=clock)
    assert report.status == "wedged"
    assert report.engines[0].stalled_seconds >= 10.0
    assert report.scrapes == 4


async def test_every_engine_is_judged_separately() -> None:
    """Two data-parallel engines: one wedged and one busy make the target wedged."""
    sequence = [body(((KEY, DEFERRED_WEDGE), (KEY_1, busy(n)))) for n in range(11)]
    report = await check(bodies(*sequence))
    assert report.status == "wedged"
    assert [(e.key.engine, e.state.value) for e in report.engines] == [
        ("0", "wedged"),
        ("1", "ok"),
    ]


# -- probe mode: the state file ------------------------------------------------------------


async def probe(
    path: Path, clock: FakeClock, responder: Responder, policy: DetectionPolicy = POLICY
) -> CheckReport:
    return await check(responder, window=0, state_file=path, clock=clock, policy=policy)


async def test_probe_judges_over_many_invocations(tmp_path: Path) -> None:
    """`--for 0` every 10 s: baseline OK, suspect while flat, wedged once 60 s have passed."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    codes = []
    for _ in range(7):
        report = await probe(path, clock, bodies(one(DEFERRED_WEDGE)))
        codes.append(report.exit_code)
        assert report.scrapes == 1
        clock.now += 10
    assert codes == [0, 1, 1, 1, 1, 1, 2]
    saved = json.loads(path.read_text())
    assert saved["version"] == STATE_FILE_VERSION
    assert saved["metrics_url"] == URL
    assert saved["detector"]["engines"][0]["state"] == "wedged"


async def test_probe_uses_configured_thresholds_not_the_window(tmp_path: Path) -> None:
    """With a state file a 10 s window of flat counters is only suspect under a 60 s threshold."""
    report = await check(bodies(one(DEFERRED_WEDGE)), state_file=tmp_path / "s.json")
    assert report.status == "suspect"


async def test_probe_gives_a_loading_server_its_start_up_grace(tmp_path: Path) -> None:
    """A server that never answered is starting (exit 0) until startup_timeout, then unreachable."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    policy = DetectionPolicy(60, 120, 300, 30, startup_timeout_seconds=25)
    refused = _raiser(httpx.ConnectError("Connection refused"))
    statuses = []
    for _ in range(4):
        statuses.append((await probe(path, clock, refused, policy)).status)
        clock.now += 10
    assert statuses == ["starting", "starting", "starting", "unreachable"]


def _raiser(exc: Exception) -> Responder:
    def responder(_: int) -> httpx.Response:
        raise exc

    return responder


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(b"{not json", "is not valid JSON", id="garbage"),
        pytest.param(b"[1, 2]", "does not hold a JSON object", id="not-object"),
        pytest.param(b'{"version": 99}', "has version 99", id="version"),
        pytest.param(
            json.dumps({"version": 1, "metrics_url": "http://other:1/metrics"}).encode(),
            "belongs to 'http://other:1/metrics'",
            id="other-url",
        ),
        pytest.param(
            json.dumps({"version": 1, "metrics_url": URL, "detector": {"engines": 3}}).encode(),
            "is malformed",
            id="malformed",
        ),
    ],
)
async def test_bad_state_file_is_reported_and_replaced(
    tmp_path: Path, content: bytes, why: str
) -> None:
    """A state file that cannot be used is named in a note, replaced, and never a crash."""
    path = tmp_path / "state.json"
    path.write_bytes(content)
    clock = FakeClock()
    report = await probe(path, clock, bodies(one(busy(0))))
    assert report.status == "ok"
    (note,) = report.notes
    assert note.startswith(f"state file {path} {why}")
    assert note.endswith("; starting a new history")
    clock.now += 1
    again = await probe(path, clock, bodies(one(busy(1))))
    assert again.notes == ()


async def test_state_older_than_the_shortest_threshold_is_replaced(tmp_path: Path) -> None:
    """A gap longer than stall_after_seconds could fake a stall, so the old history is dropped."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    await probe(path, clock, bodies(one(IDLE)))
    clock.now += 61
    report = await probe(path, clock, bodies(one(DEFERRED_WEDGE)))
    assert report.status == "ok"
    assert report.notes[0].endswith(
        "is 61 s old, older than the shortest wedge threshold (60 s); starting a new history"
    )


async def test_state_from_before_a_reboot_is_replaced(tmp_path: Path) -> None:
    """A state file stamped later than now (the monotonic clock restarted) is dropped."""
    path = tmp_path / "state.json"
    await probe(path, FakeClock(5000.0), bodies(one(IDLE)))
    report = await probe(path, FakeClock(10.0), bodies(one(IDLE)))
    assert "monotonic clock went backwards" in report.notes[0]


async def test_unusable_state_path_is_unknown(tmp_path: Path) -> None:
    """A state file under a regular file cannot be used: UNKNOWN with the reason, no crash."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    report = await probe(blocker / "state.json", FakeClock(), bodies(one(IDLE)))
    assert report.status == "unknown"
    assert report.exit_code == 3
    assert report.error is not None
    assert report.error.startswith(f"cannot use state file {blocker / 'state.json'}")


async def test_state_file_is_replaced_atomically(tmp_path: Path) -> None:
    """Saving leaves exactly the state file and its lock, no temporary files."""
    path = tmp_path / "state.json"
    await probe(path, FakeClock(), bodies(one(IDLE)))
    assert names_in(tmp_path) == ["state.json", "state.json.lock"]


def names_in(directory: Path) -> list[str]:
    """The sorted file names in a directory."""
    return sorted(p.name for p in directory.iterdir())


# -- output --------------------------------------------------------------------------------


def assert_schema(document: Mapping[str, Any]) -> None:
    """The documented --json schema, exactly."""
    assert set(document) == {"status", "engines", "error"}
    assert document["status"] in STATUSES
    assert document["error"] is None or isinstance(document["error"], str)
    for engine in document["engines"]:
        assert set(engine) == {
            "model_name",
            "engine",
            "state",
            "family",
            "running",
            "waiting",
            "waiting_by_reason",
            "stalled_seconds",
        }
        assert engine["state"] in STATUSES
        assert engine["family"] is None or engine["family"] in FAMILIES
        assert isinstance(engine["stalled_seconds"], float)


async def test_json_document_follows_the_schema() -> None:
    """--json gives status, engines with readings and family, and the error."""
    report = await check(bodies(one(DEFERRED_WEDGE)))
    document = json.loads(json.dumps(report.to_json()))
    assert_schema(document)
    assert document == {
        "status": "wedged",
        "engines": [
            {
                "model_name": "tiny-llama",
                "engine": "0",
                "state": "wedged",
                "family": "deferred_stall",
                "running": 0.0,
                "waiting": 3.0,
                "waiting_by_reason": {"capacity": 1.0, "deferred": 2.0},
                "stalled_seconds": 10.0,
            }
        ],
        "error": None,
    }


async def test_json_for_an_unreachable_target_has_no_engines_and_an_error() -> None:
    """An unreachable target's document says why in `error`."""
    report = await check(_raiser(httpx.ConnectError("Connection refused")))
    document = report.to_json()
    assert_schema(document)
    assert document["engines"] == []
    assert document["error"] == "refused: connection refused by vllm.test:8000"


async def test_human_output_has_one_line_per_engine() -> None:
    """A Nagios summary line, then per engine: state, family, running, waiting by reason, time."""
    sequence = [body(((KEY, DEFERRED_WEDGE), (KEY_1, busy(n)))) for n in range(11)]
    report = await check(bodies(*sequence))
    lines = report.render_text().splitlines()
    summary, bar, _perfdata = lines[0].partition(
        " | "
    )  # perfdata: tests/check/test_check_perfdata.py
    assert (summary, bar) == (f"CRITICAL: wedged - {URL}, 2 engines, 11 scrapes", " | ")
    assert lines[1].split() == [
        "wedged", "deferred_stall", "tiny-llama", "engine", "0:", "running", "0,",
        "waiting", "3", "(capacity", "1,", "deferred", "2);", "stalled", "10.0", "s",
    ]  # fmt: skip
    assert lines[2].startswith("ok          -               tiny-llama engine 1: running 4,")
    assert lines[2].endswith("; last progress 0.0 s ago")
    assert len(lines) == 3


def test_exit_codes_follow_nagios() -> None:
    """0 for calm states, 1 for suspect, 2 for wedged and unreachable, 3 for unknown."""
    assert EXIT_CODES == {
        "ok": 0,
        "idle": 0,
        "sleeping": 0,
        "starting": 0,
        "suspect": 1,
        "wedged": 2,
        "unreachable": 2,
        "unknown": 3,
    }


# -- the command, end to end against real loopback servers ------------------------------------


def wedgewatch(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    return subprocess.run(
        [sys.executable, "-m", "wedgewatch", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_cli_healthy_busy_server_exits_0() -> None:
    """A real server whose counters move on every scrape: exit 0 and an OK line."""
    replies = [Reply(body=one(busy(n))) for n in range(30)]
    with ScriptedServer(in_turn(replies)) as server:
        done = wedgewatch("check", server.base_url, "--for", "1", "--interval-seconds", "0.2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"OK: ok - {server.url}, 1 engine, ")
    assert "ok          -               tiny-llama engine 0: running 4" in done.stdout


@pytest.mark.slow
def test_cli_deferred_wedge_exits_2_with_json() -> None:
    """The composed deferred-wedge body, flat for the window: exit 2, JSON names the family."""
    fixture = (FIXTURES / "deferred_wedge.prom").read_bytes()
    with ScriptedServer(always(Reply(body=fixture))) as server:
        done = wedgewatch("check", server.url, "--for", "1", "--interval-seconds", "0.25", "--json")
    assert done.returncode == 2, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert_schema(document)
    assert document["status"] == "wedged"
    assert document["engines"][0]["family"] == "deferred_stall"
    assert document["engines"][0]["waiting_by_reason"] == {"capacity": 1.0, "deferred": 2.0}


@pytest.mark.slow
def test_cli_refused_port_exits_2() -> None:
    """Nobody listening: unreachable, exit 2, the refusal named."""
    with RefusingPort() as port:
        done = wedgewatch("check", port.url, "--for", "0.3", "--interval-seconds", "0.1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("CRITICAL: unreachable - ")
    assert "error: refused: connection refused by 127.0.0.1:" in done.stdout


@pytest.mark.slow
def test_cli_html_exits_3() -> None:
    """A web page instead of vLLM metrics: UNKNOWN, exit 3."""
    with ScriptedServer(always(Reply(body=HTML, headers={"Content-Type": "text/html"}))) as server:
        done = wedgewatch("check", server.url, "--json")
    assert done.returncode == 3, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["status"] == "unknown"
    assert document["error"].startswith("not a vLLM metrics body: ")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param([], {}, "Missing argument", id="no-url"),
        pytest.param(["http://h:1", "--for", "-1"], {}, "--for", id="negative-window"),
        pytest.param(["http://h:1", "--for", "0"], {}, "needs --state-file", id="zero-window"),
        pytest.param(["http://h:1", "--for", "nan"], {}, "'--for'", id="nan-window"),
        pytest.param(["ftp://h:1"], {}, "must start with http:// or https://", id="scheme"),
        pytest.param(["http://h:1", "--bogus"], {}, "No such option", id="unknown-option"),
        pytest.param(
            ["http://h:1", "--stall-after-seconds", "-3"],
            {},
            "stall_after_seconds = -3.0 (from flag --stall-after-seconds): must be greater than 0",
            id="bad-threshold",
        ),
        pytest.param(
            ["http://h:1"],
            {"WEDGEWATCH_HANG_AFTER": "5"},
            "WEDGEWATCH_HANG_AFTER is not a wedgewatch setting",
            id="unknown-env",
        ),
    ],
)
def test_cli_bad_arguments_exit_3(args: list[str], env: dict[str, str], message: str) -> None:
    """Every kind of bad invocation is UNKNOWN (exit 3) with a message saying what is wrong."""
    done = wedgewatch("check", *args, env={"COLUMNS": "200", **env})
    assert done.returncode == 3, done.stdout + done.stderr
    flat = " ".join((done.stdout + done.stderr).replace("│", " ").split())
    assert message in flat


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--json", "http://h:1", "--bogus"], "No such option", id="parse-error"),
        pytest.param(["http://h:1", "--for", "0", "--json"], "needs --state-file", id="bad-value"),
    ],
)
def test_cli_bad_arguments_with_json_print_the_json_object(args: list[str], message: str) -> None:
    """With --json a usage error is still one JSON object on stdout: status unknown, exit 3."""
    done = wedgewatch("check", *args)
    assert done.returncode == 3
    answer = json.loads(done.stdout)
    assert answer["status"] == "unknown"
    assert answer["engines"] == []
    assert message in answer["error"]


@pytest.mark.slow
def test_cli_probe_mode_across_invocations(tmp_path: Path) -> None:
    """Repeated `--for 0 --state-file` runs on a flat deferred wedge go OK, WARNING..., CRITICAL."""
    fixture = (FIXTURES / "deferred_wedge.prom").read_bytes()
    state = tmp_path / "probe.json"
    codes: list[int] = []
    give_up_at = time.monotonic() + 60  # the stall needs 5 s of probes, however fast each is
    with ScriptedServer(always(Reply(body=fixture))) as server:
        while time.monotonic() < give_up_at:
            done = wedgewatch(
                "check", server.url, "--for", "0", "--state-file", str(state),
                "--stall-after-seconds", "5", "--interval-seconds", "0.1",
            )  # fmt: skip
            codes.append(done.returncode)
            if done.returncode == 2:
                break
    assert codes[0] == 0
    assert codes[-1] == 2, codes
    assert set(codes[1:-1]) == {1}, codes
    assert "deferred_stall" in done.stdout


@pytest.mark.slow
def test_cli_probe_in_observe_mode_never_asks_for_a_restart(tmp_path: Path) -> None:
    """remedy = "none" (rule P0): a wedge still shows, but exits 1 (0 with --critical-only)."""
    fixture = (FIXTURES / "deferred_wedge.prom").read_bytes()
    state = tmp_path / "probe.json"
    # 10 s: the stall needs that long of probes, and the detector's history outlives a gap
    # between two runs that long (a loaded machine starts the full command line slowly).
    args = ["--for", "0", "--state-file", str(state), "--stall-after-seconds", "10"]
    observe = {"WEDGEWATCH_REMEDY": "none"}
    give_up_at = time.monotonic() + 90  # the stall needs 10 s of probes, however fast each is
    with ScriptedServer(always(Reply(body=fixture))) as server:
        while time.monotonic() < give_up_at:
            done = wedgewatch("check", server.url, *args, "--json", env=observe)
            assert done.returncode in (0, 1), done.stdout + done.stderr
            answer = json.loads(done.stdout)
            if answer["status"] == "wedged":
                break
        assert answer["status"] == "wedged", answer
        assert done.returncode == 1
        assert answer["restart_policy"]["decision"] == "observe"
        text = wedgewatch("check", server.url, *args, env=observe)
        assert text.returncode == 1
        assert text.stdout.startswith("WARNING: wedged")
        assert 'restart policy: observe: remedy = "none"' in text.stdout
        assert "restart policy: restart" not in text.stdout
        probe = wedgewatch("check", server.url, *args, "--critical-only", env=observe)
        assert probe.returncode == 0, probe.stdout
        # The same state, remedy left unset: the check is the restarting probe again.
        restarting = wedgewatch("check", server.url, *args, "--json")
        assert restarting.returncode == 2, restarting.stdout
        assert json.loads(restarting.stdout)["restart_policy"]["decision"] == "restart"


@pytest.mark.slow
def test_cli_critical_only_turns_a_warning_into_0(tmp_path: Path) -> None:
    """--critical-only exits 0 on suspect (a probe must not fail early) but 2 on wedged."""
    sequence = [Reply(body=one(busy(n))) for n in range(3)] + [Reply(body=one(DEFERRED_WEDGE))]
    with ScriptedServer(in_turn(sequence)) as server:
        args = ["check", server.url, "--for", "1", "--interval-seconds", "0.2", "--json"]
        warned = wedgewatch(*args, "--critical-only")
        assert json.loads(warned.stdout)["status"] == "suspect"
        assert warned.returncode == 0, warned.stdout + warned.stderr
        wedged = wedgewatch(*args, "--critical-only")
        assert json.loads(wedged.stdout)["status"] == "wedged"
        assert wedged.returncode == 2


# -- issue #10: non-finite values, too many engines, one server, internal errors ------------------

NAN_INF = (FIXTURES / "nan_inf.prom").read_bytes()


async def test_non_finite_gauges_are_unknown_with_the_reason() -> None:
    """A body whose queue gauges read Inf/NaN is UNKNOWN (exit 3), the error names the fields."""
    report = await check(bodies(NAN_INF))
    assert report.status == "unknown"
    assert report.exit_code == 3
    assert report.error is not None
    assert "non-finite values (waiting, waiting (capacity))" in report.error
    assert report.engines[0].state.value == "unknown"


async def test_non_finite_gauges_in_probe_mode_save_a_strict_json_state(tmp_path: Path) -> None:
    """Probe mode saves the state of a NaN/Inf reading as strict JSON and loads it again."""
    state = tmp_path / "probe.json"
    for _ in range(3):
        report = await check(bodies(NAN_INF), window=0, state_file=state)
        assert report.status == "unknown"
        assert report.notes == ()  # the saved state was read back, not replaced

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    json.loads(state.read_text(), parse_constant=no_constants)


@functools.cache
def many_engines_body(engines: int) -> bytes:
    """One busy engine's body whose `vllm:num_requests_running` also names engines 1..N-1.

    The parser refuses a body by the engines it names, before judging any: a 65 KB body
    names 300 engines as well as the 9.5 MB one with 300 complete engines would.
    """
    lines = one(busy(0)).decode().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running{"))
    more = [lines[at].replace('engine="0"', f'engine="{i}"') for i in range(1, engines)]
    return "".join([*lines[: at + 1], *more, *lines[at + 1 :]]).encode()


async def test_too_many_engines_is_unknown_at_once() -> None:
    """A body naming more engines than max_engines is not judged: UNKNOWN with that reason."""
    log: list[int] = []
    report = await check(bodies(many_engines_body(300)), log=log)
    assert report.status == "unknown"
    assert report.error is not None
    assert report.error.startswith("not a vLLM metrics body: ")
    assert "more than 256 engines" in report.error
    assert log == [0]


async def test_url_reaching_two_servers_is_unknown_not_a_restart() -> None:
    """process_start_time_seconds alternating between two values: UNKNOWN, one server asked for."""
    first, second = (
        one(busy(0)),
        one(busy(0)).replace(b"process_start_time_seconds 1.", b"process_start_time_seconds 2."),
    )
    assert first != second
    report = await check(lambda n: httpx.Response(200, content=(first, second)[n % 2]))
    assert report.status == "unknown"
    assert report.error is not None
    assert "the URL reaches more than one server; point wedgewatch at one pod or process" in (
        report.error
    )


def _no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr


@pytest.mark.slow
def test_cli_nan_body_in_probe_mode_exits_3_never_a_traceback(tmp_path: Path) -> None:
    """A real server with NaN/Inf gauges, exec-probe style: exit 3 every time, no traceback."""
    state = tmp_path / "probe.json"
    with ScriptedServer(always(Reply(body=NAN_INF))) as server:
        for _ in range(2):  # the second run loads the state the first one saved
            done = wedgewatch("check", server.url, "--for", "0", "--state-file", str(state))
            _no_traceback(done)
            assert done.returncode == 3, done.stdout + done.stderr
            assert done.stdout.startswith(f"UNKNOWN: unknown - {server.url}, 1 engine, 1 scrape")
            assert "note:" not in done.stdout  # the state file was read back fine
        as_json = wedgewatch(
            "check", server.url, "--for", "0", "--state-file", str(state), "--json"
        )
    _no_traceback(as_json)
    assert as_json.returncode == 3
    (line,) = as_json.stdout.splitlines()  # one JSON object on one line
    document = json.loads(line)
    assert document["status"] == "unknown"
    assert "non-finite values" in document["error"]


@pytest.mark.slow
def test_cli_nan_body_under_critical_only_never_fails_the_probe(tmp_path: Path) -> None:
    """The exec liveness probe (--critical-only) exits 0 on NaN gauges, saying UNKNOWN and why."""
    state = tmp_path / "probe.json"
    with ScriptedServer(always(Reply(body=NAN_INF))) as server:
        for _ in range(2):  # the second run loads the state the first one saved
            done = wedgewatch(
                "check", server.url, "--for", "0", "--state-file", str(state), "--critical-only"
            )
            _no_traceback(done)
            assert done.returncode == 0, done.stdout + done.stderr
            assert done.stdout.startswith(f"UNKNOWN: unknown - {server.url}")
            assert "non-finite values" in done.stdout


def test_cli_usage_error_under_critical_only_still_exits_3() -> None:
    """--critical-only hides no configuration mistake: a bad argument still exits 3."""
    done = wedgewatch("check", "http://127.0.0.1:1", "--for", "-1", "--critical-only")
    assert done.returncode == 3, done.stdout + done.stderr


def test_cli_internal_error_is_one_unknown_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any failure inside check is UNKNOWN, exit 3, one line (one JSON object with --json)."""
    from typer.testing import CliRunner

    from wedgewatch.check import run as check_module
    from wedgewatch.cli import app

    async def broken(*_: object, **__: object) -> CheckReport:
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(check_module, "run_check", broken)
    runner = CliRunner()
    text = runner.invoke(app, ["check", "http://127.0.0.1:9/", "--for", "0.1"])
    assert text.exit_code == 3
    assert text.output == (
        "UNKNOWN: internal error in wedgewatch check (RuntimeError: a bug over two lines)\n"
    )
    as_json = runner.invoke(app, ["check", "http://127.0.0.1:9/", "--for", "0.1", "--json"])
    assert as_json.exit_code == 3
    (line,) = as_json.output.splitlines()
    assert json.loads(line) == {
        "status": "unknown",
        "engines": [],
        "error": "internal error in wedgewatch check (RuntimeError: a bug over two lines)",
    }


# -- without an event loop: how `execute` runs a check ---------------------------------------


def test_a_blocking_check_runs_its_window_without_an_event_loop() -> None:
    """No client: blocking scrapes and sleeps, the coroutine run to its end by run_blocking."""
    replies = [Reply(body=one(busy(n))) for n in range(5)]
    with ScriptedServer(in_turn(replies)) as server:
        options = CheckOptions(
            metrics_url=server.url,
            window_seconds=0.2,
            interval_seconds=0.1,
            policy=POLICY,
            limits=ScrapeLimits(timeout_seconds=5.0, max_body_bytes=16 * 1024 * 1024),
        )
        report = run_blocking(run_check(options))
    assert report.status == "ok"
    assert report.scrapes == 3
    assert len(server.requests) == 3


class _Suspend:
    """An awaitable that suspends, as real asynchronous IO does."""

    def __await__(self) -> Iterator[None]:
        yield


def test_run_blocking_refuses_a_coroutine_that_suspends() -> None:
    """Awaiting asynchronous IO without an event loop is a bug: reported, never a hang."""

    async def suspends() -> None:
        await _Suspend()

    with pytest.raises(RuntimeError, match="suspended"):
        run_blocking(suspends())


# -- the restart state: the daemon's codec (core/restart/restart_codec.py)
# --------------------------


async def _probe_with_budget(path: Path, clock: FakeClock) -> CheckReport:
    options = CheckOptions(
        metrics_url=URL,
        window_seconds=0,
        interval_seconds=1.0,
        policy=POLICY,
        limits=ScrapeLimits(timeout_seconds=5.0, max_body_bytes=16 * 1024 * 1024),
        state_file=path,
        restart=RestartPolicy(restart_budget=2),
    )
    async with mock_client(bodies(one(busy(0)))) as client:
        return await run_check(options, client=client, clock=clock, sleep=clock.sleep)


async def test_a_malformed_restart_state_is_named_and_replaced(tmp_path: Path) -> None:
    """A restart_policy the codec refuses is a note saying which field, and a fresh one."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    await _probe_with_budget(path, clock)
    saved = json.loads(path.read_text())
    assert saved["restart_policy"]["healthy_since_timestamp"] is not None  # kept between runs
    saved["restart_policy"]["consecutive"] = -1
    path.write_text(json.dumps(saved))
    clock.now += 1
    report = await _probe_with_budget(path, clock)
    assert report.status == "ok"
    (note,) = report.notes
    assert note == (
        f"state file {path} holds a malformed restart state (restart_policy: consecutive: "
        "expected a whole number >= 0, got -1); starting a new history"
    )
    assert json.loads(path.read_text())["restart_policy"]["consecutive"] == 0


async def test_malformed_probe_failures_alone_keep_the_budget(tmp_path: Path) -> None:
    """Bad served-failure memory is forgotten with a note; the restarts counted stay counted."""
    path = tmp_path / "state.json"
    clock = FakeClock()
    await _probe_with_budget(path, clock)
    saved = json.loads(path.read_text())
    spent = time.time() - 5  # the check's wall clock is the real one
    saved["restart_policy"]["restart_timestamps"] = [spent]
    saved["probe"] = {"failures": "two"}
    path.write_text(json.dumps(saved))
    clock.now += 1
    report = await _probe_with_budget(path, clock)
    (note,) = report.notes
    assert note.startswith(f"state file {path} holds malformed probe failures (probe: ")
    assert note.endswith("; forgot them")
    again = json.loads(path.read_text())
    assert again["restart_policy"]["restart_timestamps"] == [pytest.approx(spent, abs=60)]
    assert again["probe"] is None
