"""`wedgewatch check` as a Nagios plugin: performance data after `|`, and `-w`/`-c`.

The perfdata are read with the grammar of the Monitoring Plugins Development Guidelines
(`'label'=value[UOM];[warn];[crit];[min];[max]`, space separated, UOM one of the listed
units) and each datum is rebuilt with the `nagiosplugin` library's `Performance` and its
warn/crit parsed with its `Range`: the output must be what that library would print.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import nagiosplugin
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scripted_http import Reply, ScriptedServer, always
from test_check import (
    DEFERRED_WEDGE,
    FIXTURES,
    KEY,
    KEY_1,
    POLICY,
    FakeClock,
    Responder,
    bodies,
    body,
    busy,
    mock_client,
    one,
    wedgewatch,
)

from wedgewatch.check import CheckOptions, CheckReport, StallThresholds, run_check
from wedgewatch.core.detection.states import EngineState
from wedgewatch.core.text.nagios import PerfDatum, Range
from wedgewatch.io.scrape_rules import ScrapeLimits
from wedgewatch.vllm.signals import EngineKey

URL = "http://vllm.test:8000/metrics"
_NUMBER = r"-?[0-9]+(?:\.[0-9]+)?"
_DATUM = re.compile(
    r"(?:'(?P<quoted>[^'=]+)'|(?P<label>[^'=\s]+))"
    rf"=(?P<value>{_NUMBER}|U)(?P<uom>s|ms|us|%|B|KB|MB|TB|c)?"
    rf"(?:;(?P<warn>[^;\s]*)(?:;(?P<crit>[^;\s]*)(?:;(?P<min>{_NUMBER})?(?:;(?P<max>{_NUMBER})?)?)?)?)?"
)


def parse_perfdata(text: str) -> dict[str, dict[str, Any]]:
    """The data after the first `|` of a plugin's output, by the guidelines' grammar.

    Fails the test on anything that is not a sequence of well-formed data.
    """
    first_line = text.splitlines()[0]
    assert first_line.count("|") == 1, first_line
    perfdata = first_line.split("|", 1)[1].strip()
    data: dict[str, dict[str, Any]] = {}
    position = 0
    while position < len(perfdata):
        match = _DATUM.match(perfdata, position)
        assert match is not None, f"bad perfdata at {perfdata[position:]!r}"
        token = match.group(0)
        fields = match.groupdict(default="")
        label = fields["quoted"] or fields["label"]
        for threshold in (fields["warn"], fields["crit"]):
            if threshold:
                nagiosplugin.Range(threshold)  # raises on a malformed range
        rebuilt = nagiosplugin.Performance(
            label,
            fields["value"],
            fields["uom"],
            fields["warn"],
            fields["crit"],
            fields["min"],
            fields["max"],
        )
        assert str(rebuilt) == token, (str(rebuilt), token)
        assert label not in data, f"duplicate label {label!r}"
        data[label] = {**fields, "value": float(fields["value"])}
        position = match.end()
        if position < len(perfdata):
            assert perfdata[position] == " ", perfdata[position:]
            position += 1
    return data


async def checked(
    sequence: list[bytes] | Responder,
    thresholds: StallThresholds | None = None,
    *,
    window: float = 10.0,
) -> CheckReport:
    """One-shot check over `window` (fake time) of these bodies (or this responder)."""
    clock = FakeClock()
    options = CheckOptions(
        metrics_url=URL,
        window_seconds=window,
        interval_seconds=1.0,
        policy=POLICY,
        limits=ScrapeLimits(timeout_seconds=5.0, max_body_bytes=16 * 1024 * 1024),
        thresholds=thresholds,
    )
    responder = sequence if callable(sequence) else bodies(*sequence)
    async with mock_client(responder) as client:
        return await run_check(options, client=client, clock=clock, sleep=clock.sleep)


def ranges(warning: str | None = None, critical: str | None = None) -> StallThresholds:
    return StallThresholds(
        warning=None if warning is None else Range.parse(warning),
        critical=None if critical is None else Range.parse(critical),
    )


SUSPECT = [one(busy(n)) for n in range(5)] + [one(DEFERRED_WEDGE)]  # stalled ~5 s of 10


# -- perfdata -------------------------------------------------------------------------------


async def test_one_engine_perfdata_are_read_by_the_grammar_and_nagiosplugin() -> None:
    """Stalled seconds with -w/-c and min, running, waiting and by reason, scrape time."""
    report = await checked(SUSPECT, ranges("3", "@0:0.5"))
    data = parse_perfdata(report.render_text())
    assert set(data) == {
        "stalled", "running", "waiting", "waiting_capacity", "waiting_deferred", "scrape_time",
    }  # fmt: skip
    stalled = data["stalled"]
    assert (stalled["uom"], stalled["warn"], stalled["crit"], stalled["min"]) == (
        "s",
        "3",
        "@0:0.5",
        "0",
    )
    assert stalled["value"] == pytest.approx(report.engines[0].stalled_seconds, abs=0.001)
    assert 0 < stalled["value"] < 10
    assert (data["running"]["value"], data["waiting"]["value"]) == (0, 3)
    assert (data["waiting_capacity"]["value"], data["waiting_deferred"]["value"]) == (1, 2)
    assert data["scrape_time"]["uom"] == "s"
    assert all(datum["min"] == "0" for datum in data.values())


async def test_several_engines_are_told_apart_in_the_labels() -> None:
    """Two engines of one model: e0_, e1_ prefixes; no per-engine datum is lost."""
    sequence = [body(((KEY, DEFERRED_WEDGE), (KEY_1, busy(n)))) for n in range(11)]
    data = parse_perfdata((await checked(sequence)).render_text())
    assert {"e0_stalled", "e1_stalled", "e0_running", "e1_running", "e0_waiting_deferred"} <= set(
        data
    )
    assert data["e0_stalled"]["value"] == 10
    assert data["e1_stalled"]["value"] == 0
    assert data["e1_running"]["value"] == 4


async def test_labels_from_awkward_model_names_are_quoted_and_safe() -> None:
    """Model names with `/`, a space, `'`, `=` and `|`: quoted labels, one `|` in the output."""
    odd = EngineKey("org/my model='x'|y", "0")
    qwen = EngineKey("Qwen/Qwen3-32B", "0")
    sequence = [body(((odd, DEFERRED_WEDGE), (qwen, busy(n)))) for n in range(11)]
    text = (await checked(sequence)).render_text()
    data = parse_perfdata(text)  # also asserts a single `|`
    assert "org/my_model__x__y_e0_stalled" in data
    assert "Qwen/Qwen3-32B_e0_stalled" in data
    assert "org/my model='x'\u00a6y engine 0" in text  # the engine line keeps the name, `|` swapped


async def test_unknown_values_are_left_out_of_the_perfdata() -> None:
    """A failed last scrape: no running/waiting (no reading), stalled and scrape time stay."""
    first = one(busy(0))

    def responder(number: int) -> httpx.Response:
        return httpx.Response(200, content=first) if number == 0 else httpx.Response(503)

    report = await checked(responder, window=2.0)
    data = parse_perfdata(report.render_text())
    assert "running" not in data
    assert "stalled" in data
    assert "scrape_time" in data


def test_perfdatum_rendering_matches_nagiosplugin() -> None:
    """Trailing empty fields dropped, labels quoted as nagiosplugin quotes them."""
    cases = [
        PerfDatum("stalled", 12.5, "s", "30", "60", 0.0),
        PerfDatum("running", 3.0, minimum=0.0),
        PerfDatum("a b/c", 1.0, "", "", "~:5"),
        PerfDatum("plain", 2.0),
    ]
    expected = ["stalled=12.5s;30;60;0", "running=3;;;0", "'a_b/c'=1;;~:5", "plain=2"]
    assert [datum.render() for datum in cases] == expected
    for datum, text in zip(cases, expected, strict=True):
        rebuilt = nagiosplugin.Performance(
            datum.label.replace(" ", "_"),
            text.split("=", 1)[1].split(";")[0].rstrip("s"),
            datum.uom,
            datum.warn,
            datum.crit,
            "" if datum.minimum is None else "0",
        )
        assert str(rebuilt) == text


# -- -w / -c ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("warning", "critical", "code"),
    [
        pytest.param(None, None, 1, id="detector-alone"),
        pytest.param("30", None, 1, id="within-warning"),
        pytest.param(None, "3", 2, id="beyond-critical"),
        pytest.param("3", "60", 1, id="beyond-warning-only"),
        pytest.param("@0:0", None, 1, id="inverted"),
    ],
)
async def test_thresholds_raise_a_suspect_stall(
    warning: str | None, critical: str | None, code: int
) -> None:
    """A stall of ~5 s (suspect, exit 1): -c 3 makes it CRITICAL and says why."""
    report = await checked(SUSPECT, ranges(warning, critical))
    assert report.status == "suspect"
    assert report.exit_code == code
    if code == 2:
        assert report.render_text().startswith("CRITICAL: suspect - ")
        assert "; stalled 5.0 s beyond -c 3 | " in report.render_text().splitlines()[0]


async def test_thresholds_raise_a_calm_engine_only_when_asked() -> None:
    """`-w @0:0` alerts on a stall of exactly 0 s: a healthy engine goes WARNING."""
    healthy = [one(busy(n)) for n in range(11)]
    assert (await checked(healthy, ranges("30", "60"))).exit_code == 0
    assert (await checked(healthy, ranges("@0:0"))).exit_code == 1


async def test_thresholds_never_lower_the_detector() -> None:
    """A wedge stays CRITICAL under generous ranges; UNKNOWN stays UNKNOWN."""
    wedged = await checked([one(DEFERRED_WEDGE)], ranges("1000", "2000"))
    assert (wedged.status, wedged.exit_code) == ("wedged", 2)
    unknown = replace(wedged, status=EngineState.UNKNOWN)
    assert unknown.exit_code == 3


@pytest.mark.parametrize(
    ("spec", "start", "end", "inside"),
    [
        ("30", 0, 30, False),
        ("10:", 10, math.inf, False),
        ("~:10", -math.inf, 10, False),
        ("10:20", 10, 20, False),
        ("@10:20", 10, 20, True),
        ("2.5", 0, 2.5, False),
    ],
)
def test_range_parses_the_guidelines_examples(
    spec: str, start: float, end: float, inside: bool
) -> None:
    parsed = Range.parse(spec)
    assert (parsed.start, parsed.end, parsed.inside, parsed.text) == (start, end, inside, spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "is not a Nagios range"),
        ("@", "is not a Nagios range"),
        ("abc", "'abc' is not a number"),
        ("20:10", "the start 20 is above the end 10"),
        ("1:2:3", "'1:2' is not a number"),
        ("nan", "not a finite number"),
    ],
)
def test_bad_ranges_are_refused_with_a_reason(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Range.parse(spec)
    if spec not in ("", "@", "nan"):  # nagiosplugin reads "" as 0:, "nan" as a float
        with pytest.raises(ValueError, match=r"."):
            nagiosplugin.Range(spec)


_ATOMS = st.integers(-50, 50).map(str) | st.decimals(-50, 50, places=2).map(str)


@st.composite
def range_specs(draw: st.DrawFn) -> str:
    start = draw(st.none() | st.just("~") | _ATOMS)
    end = draw(st.none() | _ATOMS)
    if start not in (None, "~") and end is not None and float(start) > float(end):
        start, end = end, start
    if start is None and end is not None and float(end) < 0:
        start = "~"  # a bare negative end would put the implied start 0 above it
    invert = draw(st.booleans())
    spec = ("@" if invert else "") + ("" if start is None else f"{start}:") + (end or "")
    return spec if spec.lstrip("@") else spec + "0"


@given(spec=range_specs(), value=st.floats(-100, 100) | st.integers(-60, 60))
def test_range_alerts_exactly_where_nagiosplugin_does(spec: str, value: float) -> None:
    """Against the library: a value alerts when nagiosplugin says it does not match."""
    assert Range.parse(spec).alerts(value) == (not nagiosplugin.Range(spec).match(value))


# -- the command -----------------------------------------------------------------------------


@pytest.mark.slow
def test_cli_prints_perfdata_and_applies_thresholds(tmp_path: Path) -> None:
    """A real server, a real process: perfdata on the first line, -w/-c echoed into them."""
    fixture = (FIXTURES / "deferred_wedge.prom").read_bytes()
    with ScriptedServer(always(Reply(body=fixture))) as server:
        done = wedgewatch(
            "check", server.url, "--for", "0.6", "--interval-seconds", "0.2", "-w", "0.1",
            "--critical", "~:100",
        )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    data = parse_perfdata(done.stdout)
    assert (data["stalled"]["warn"], data["stalled"]["crit"]) == ("0.1", "~:100")
    assert data["stalled"]["value"] >= 0.6
    assert data["scrape_time"]["value"] >= 0
    assert "; stalled" in done.stdout.splitlines()[0]  # beyond -w 0.1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["-w", "10:5"], "the start 10 is above the end 5", id="reversed-range"),
        pytest.param(["-c", "soon"], "'soon' is not a number", id="not-a-number"),
        pytest.param(["-c", "30", "--critical-only"], "--critical-only is for a liveness probe",
                     id="with-critical-only"),
    ],
)  # fmt: skip
def test_cli_bad_thresholds_exit_3_with_the_reason(args: list[str], message: str) -> None:
    done = wedgewatch("check", "http://127.0.0.1:9", *args, env={"COLUMNS": "300"})
    assert done.returncode == 3, done.stdout + done.stderr
    flat = " ".join((done.stdout + done.stderr).replace("│", " ").split())
    assert message in flat
