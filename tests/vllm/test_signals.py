"""signals.parse on real and generated vLLM expositions, and on bodies that are not one."""

from __future__ import annotations

import gzip
import hashlib
import importlib
import json
import math
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wedgewatch.vllm import signals
from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition, ParseFailure, parse

FIXTURES = Path(__file__).parents[1] / "fixtures"
REAL = FIXTURES / "vllm-0.33.0" / "healthy_busy.prom"


def _load(name: str) -> ModuleType:
    """Import a helper module that lives next to the fixtures it writes."""
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))
    return importlib.import_module(name)


exposition = _load("vllm_exposition")
make_fixtures = _load("make_fixtures")
# Only this module's fixtures: other suites may keep their own .prom files in the directory.
ALL_FIXTURES = [*(FIXTURES / name for name in make_fixtures.FIXTURES), REAL]


def _counters(reading: EngineReading) -> tuple[float, ...]:
    """The counters of a reading: prompt, generation, success, preemptions, iterations."""
    return (
        reading.prompt_tokens,
        reading.generation_tokens,
        reading.request_success,
        reading.preemptions,
        reading.iterations,
    )


def _comparable(reading: EngineReading) -> tuple[Any, ...]:
    """A reading as a tuple in which NaN equals NaN."""

    def fix(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if isinstance(value, Mapping):
            return tuple(sorted((k, fix(v)) for k, v in value.items()))
        return value

    return tuple(
        fix(getattr(reading, name))
        for name in (
            "key",
            "running",
            "waiting",
            "waiting_by_reason",
            "kv_cache_usage",
            "awake",
            "prompt_tokens",
            "generation_tokens",
            "request_success",
            "preemptions",
            "iterations",
        )
    )


def _summary(result: Exposition) -> tuple[Any, ...]:
    """An exposition as a comparable tuple in which NaN equals NaN."""
    readings = tuple(_comparable(r) for r in result.engines.values())
    return readings, result.process_start_time_seconds


def _parsed(body: str | bytes) -> Exposition:
    """Parse a body that must be readable."""
    result = parse(body)
    assert isinstance(result, Exposition), result
    return result


def _failure(body: str | bytes) -> str:
    """Parse a body that must not be readable; return the message."""
    result = parse(body)
    assert isinstance(result, ParseFailure), result
    return result.message


def _only(result: Exposition) -> EngineReading:
    (reading,) = result.engines.values()
    return reading


def _real_text() -> str:
    return REAL.read_text(encoding="utf-8")


# --- the real vLLM 0.33.0 body ---------------------------------------------------------------


def test_real_fixture_reads_as_its_readme_says() -> None:
    """The real vLLM 0.33.0 body yields exactly the engine state its README documents."""
    result = _parsed(REAL.read_bytes())
    reading = _only(result)
    assert reading.key == EngineKey("tiny-llama", "0")
    assert (reading.running, reading.waiting) == (4.0, 1.0)
    assert (reading.capacity, reading.deferred) == (1.0, 0.0)
    assert reading.waiting_by_reason == {"capacity": 1.0, "deferred": 0.0}
    assert reading.kv_cache_usage == 0.62
    assert reading.awake is True
    assert _counters(reading) == (512.0, 37.0, 1.0, 0.0, 1.0)
    assert result.process_start_time_seconds == 1.79620363156e09


def test_committed_copy_of_real_fixture_is_identical() -> None:
    """The real body is byte-for-byte what vLLM produced: the SHA-256 its README records."""
    readme = (REAL.parent / "README.md").read_text(encoding="utf-8")
    recorded = re.search(r"SHA-256, as produced: `([0-9a-f]{64})`", readme)
    assert recorded is not None
    assert hashlib.sha256(REAL.read_bytes()).hexdigest() == recorded.group(1)


def test_str_and_bytes_bodies_read_the_same() -> None:
    """A body passed as bytes reads exactly like the same body as text."""
    assert parse(REAL.read_bytes()) == parse(_real_text())


# --- generated fixtures ----------------------------------------------------------------------

QWEN_MOE = "Qwen/Qwen3-30B-A3B"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def test_deferred_wedge_fixture() -> None:
    """A deferred-type wedge reads as 0 running and 3 waiting: 1 capacity + 2 deferred."""
    result = _parsed((FIXTURES / "deferred_wedge.prom").read_bytes())
    reading = _only(result)
    assert reading.key == EngineKey("Qwen/Qwen3-32B", "0")
    assert (reading.running, reading.waiting, reading.capacity, reading.deferred) == (0, 3, 1, 2)
    assert reading.kv_cache_usage == 0.9312
    assert reading.awake is True
    assert _counters(reading) == (1.8432e06, 96512.0, 416.0, 0.0, 4213.0)
    assert result.process_start_time_seconds == 1.79620356444e09


def test_idle_fixture() -> None:
    """An idle engine reads as nothing running or waiting, awake, counters where they stopped."""
    reading = _only(_parsed((FIXTURES / "idle.prom").read_bytes()))
    assert (reading.running, reading.waiting, reading.capacity, reading.deferred) == (0, 0, 0, 0)
    assert reading.kv_cache_usage == 0.0
    assert reading.awake is True
    assert _counters(reading) == (20480.0, 5120.0, 40.0, 0.0, 5160.0)


def test_sleeping_fixture() -> None:
    """An engine at sleep level 1 (awake 0, weights_offloaded 1) reads as not awake."""
    reading = _only(_parsed((FIXTURES / "sleeping.prom").read_bytes()))
    assert reading.awake is False
    assert (reading.running, reading.waiting) == (0.0, 0.0)


def test_data_parallel_multiprocess_fixture() -> None:
    """Multiprocess DP=2 output reads as two engines, one wedged and one busy, no start time."""
    result = _parsed((FIXTURES / "dp2_multiproc.prom").read_bytes())
    assert list(result.engines) == [EngineKey(QWEN_MOE, "0"), EngineKey(QWEN_MOE, "1")]
    wedged = result.engines[EngineKey(QWEN_MOE, "0")]
    busy = result.engines[EngineKey(QWEN_MOE, "1")]
    assert (wedged.running, wedged.capacity, wedged.deferred) == (0.0, 1.0, 2.0)
    assert (busy.running, busy.waiting, busy.capacity, busy.deferred) == (7.0, 2.0, 2.0, 0.0)
    assert _counters(busy) == (734003.0, 215990.0, 1251.0, 3.0, 6021.0)
    assert result.process_start_time_seconds is None


def test_multiprocess_fixture_has_multiprocess_structure() -> None:
    """The DP fixtures really are multiprocess output: no _created, no process_*, _sum first."""
    text = (FIXTURES / "dp2_multiproc.prom").read_text(encoding="utf-8")
    assert "_created" not in text
    assert "process_" not in text
    first_iteration_line = next(
        line for line in text.splitlines() if line.startswith("vllm:iteration_tokens_total_")
    )
    assert first_iteration_line.startswith("vllm:iteration_tokens_total_sum{")


def test_eight_engine_fixture() -> None:
    """The DP=8 body reads as eight engines; engine 5 is the wedged one."""
    result = _parsed((FIXTURES / "dp8_multiproc.prom").read_bytes())
    assert [key.engine for key in result.engines] == [str(rank) for rank in range(8)]
    stalled = [key.engine for key, r in result.engines.items() if r.running == 0 and r.waiting > 0]
    assert stalled == ["5"]


def test_old_vllm_without_reasons_or_sleep_state() -> None:
    """Without the by-reason and sleep families the reading works: capacity is total waiting."""
    reading = _only(_parsed((FIXTURES / "old_vllm_no_reason.prom").read_bytes()))
    assert reading.waiting_by_reason == {}
    assert (reading.waiting, reading.capacity, reading.deferred) == (5.0, 5.0, 0.0)
    assert reading.awake is None
    assert _counters(reading) == (9000.0, 1500.0, 13.0, 1.0, 1530.0)


def test_escaped_model_name_fixture() -> None:
    """A model name with quotes, commas, braces, backslashes and a newline is unescaped exactly."""
    reading = _only(_parsed((FIXTURES / "escaped_model_name.prom").read_bytes()))
    assert reading.key == EngineKey(make_fixtures.ESCAPED_MODEL, "0")
    assert reading.key.model_name == 'acme/llama "v2", ctx={8k}=x C:\\models\\\nsecond line}'
    assert reading.running == 7.0


def test_nan_and_inf_fixture() -> None:
    """NaN and +Inf gauges are taken as printed; a NaN awake series means awake is unknown."""
    reading = _only(_parsed((FIXTURES / "nan_inf.prom").read_bytes()))
    assert reading.kv_cache_usage is not None
    assert math.isnan(reading.kv_cache_usage)
    assert reading.waiting == math.inf
    assert reading.capacity == math.inf
    assert reading.awake is None
    assert reading.running == 1.0


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.name)
def test_parse_agrees_with_library_reference(path: Path) -> None:
    """On every fixture, parse gives what a slow full parse with prometheus_client gives."""
    text = path.read_text(encoding="utf-8")
    result = _parsed(text)
    expected, process_start = exposition.reference_readings(text)
    assert list(result.engines) == sorted(expected)
    for key, reading in result.engines.items():
        assert _comparable(reading) == _comparable(expected[key])
    assert result.process_start_time_seconds == process_start


def test_committed_fixtures_match_their_generator() -> None:
    """The generated .prom files are exactly what make_fixtures.py writes today."""
    rendered = make_fixtures.render_all()
    committed = {name: (FIXTURES / name).read_text(encoding="utf-8") for name in rendered}
    assert [n for n in rendered if rendered[n] != committed[n]] == []


def test_generator_reproduces_the_real_body_shape() -> None:
    """Rendering the real body's state gives the real body's lines, differing only in values."""
    state = exposition.EngineState(
        running=4,
        capacity=1,
        kv_cache_usage=0.62,
        prompt_tokens=512,
        generation_tokens=37,
        finished={"stop": 1},
        iterations=1,
    )
    generated = exposition.render_single_process({EngineKey("tiny-llama", "0"): state})

    def shape(text: str) -> list[str]:
        return [re.sub(r" [^ ]+$", " V", line) for line in text.splitlines()]

    assert shape(generated) == shape(_real_text())
    assert parse(generated) == parse(_real_text())


# --- how lines are read ----------------------------------------------------------------------


def _reverse_labels(line: str) -> str:
    match = re.fullmatch(r"([^{ ]+)\{(.*)\} (\S+)", line)
    if match is None:
        return line
    pairs = re.findall(r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"', match.group(2))
    return f"{match.group(1)}{{{','.join(reversed(pairs))}}} {match.group(3)}"


@pytest.mark.parametrize("path", ALL_FIXTURES, ids=lambda p: p.name)
def test_label_order_does_not_matter(path: Path) -> None:
    """Reversing the label order of every sample line changes nothing in the result."""
    text = path.read_text(encoding="utf-8")
    reordered = "\n".join(_reverse_labels(line) for line in text.split("\n"))
    assert reordered != text
    assert _summary(_parsed(reordered)) == _summary(_parsed(text))


def test_waiting_is_not_taken_from_waiting_by_reason() -> None:
    """Names match exactly: by-reason lines never stand in for vllm:num_requests_waiting."""
    text = re.sub(r"(?m)^vllm:num_requests_waiting\{.*\n", "", _real_text())
    assert "vllm:num_requests_waiting_by_reason{" in text
    message = _failure(text)
    assert "has no vllm:num_requests_waiting sample" in message
    assert "engine '0' of model 'tiny-llama'" in message


def test_unknown_waiting_reason_is_kept_by_name() -> None:
    """A reason label vLLM may add later is kept under its own name."""
    extra = (
        "vllm:num_requests_waiting_by_reason"
        '{engine="0",model_name="tiny-llama",reason="lora"} 4.0\n'
    )
    reading = _only(_parsed(_real_text() + extra))
    assert reading.waiting_by_reason == {"capacity": 1.0, "deferred": 0.0, "lora": 4.0}
    assert (reading.capacity, reading.deferred) == (1.0, 0.0)


def _minimal(labels: str = 'engine="0",model_name="m"', **overrides: str) -> str:
    """A minimal body with every required sample of one engine; overrides replace whole lines."""
    lines = {
        "running": f"vllm:num_requests_running{{{labels}}} 1.0",
        "waiting": f"vllm:num_requests_waiting{{{labels}}} 2.0",
        "prompt": f"vllm:prompt_tokens_total{{{labels}}} 3.0",
        "generation": f"vllm:generation_tokens_total{{{labels}}} 4.0",
        "success": f'vllm:request_success_total{{{labels},finished_reason="stop"}} 5.0',
        "preemptions": f"vllm:num_preemptions_total{{{labels}}} 6.0",
        "iterations": f"vllm:iteration_tokens_total_count{{{labels}}} 7.0",
    }
    lines.update(overrides)
    return "".join(line + "\n" for line in lines.values() if line)


def test_minimal_body_reads() -> None:
    """A body with only the required samples (no HELP/TYPE, no optional families) reads."""
    result = _parsed(_minimal())
    reading = _only(result)
    assert _counters(reading) == (3.0, 4.0, 5.0, 6.0, 7.0)
    assert (reading.running, reading.waiting) == (1.0, 2.0)
    assert (reading.kv_cache_usage, reading.awake, reading.waiting_by_reason) == (None, None, {})
    assert result.process_start_time_seconds is None


@pytest.mark.parametrize(
    ("line", "running"),
    [
        pytest.param(
            'vllm:num_requests_running{engine="0",model_name="m"} 1.8432e+06',
            1.8432e06,
            id="exponent",
        ),
        pytest.param(
            'vllm:num_requests_running{engine="0",model_name="m"} -Inf', -math.inf, id="minus-inf"
        ),
        pytest.param('vllm:num_requests_running{engine="0",model_name="m"} 3', 3.0, id="integer"),
        pytest.param(
            'vllm:num_requests_running{engine="0",model_name="m",} 2.0', 2.0, id="trailing-comma"
        ),
        pytest.param(
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0 1700000000000',
            2.0,
            id="timestamp",
        ),
        pytest.param(
            'vllm:num_requests_running{ engine="0", model_name="m" }   5.0', 5.0, id="spaces"
        ),
        pytest.param('vllm:num_requests_running{engine="0",model_name="m"}\t6.0', 6.0, id="tab"),
        pytest.param(
            'vllm:num_requests_running {engine="0",model_name="m"} 7.0',
            7.0,
            id="space-before-brace",
        ),
        pytest.param('vllm:num_requests_running{engine="0",model_name="m"} 8.0\r', 8.0, id="crlf"),
    ],
)
def test_sample_line_variants(line: str, running: float) -> None:
    """Exposition-format variants of a needed line (canonical or not) read to the same value."""
    assert _only(_parsed(_minimal(running=line))).running == running


def test_missing_engine_label_means_engine_zero() -> None:
    """A sample without an engine label (vLLM V0 style) belongs to engine "0"."""
    assert _only(_parsed(_minimal(labels='model_name="m"'))).key == EngineKey("m", "0")


def test_request_success_is_summed_over_finished_reasons() -> None:
    """request_success adds up every finished_reason series of the engine."""
    extra = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 2.5\n'
    assert _only(_parsed(_minimal() + extra)).request_success == 7.5
    reading = _only(_parsed(_minimal() + extra))
    assert reading.finished_by_reason == {"stop": 5.0, "abort": 2.5}


def test_prefix_cache_queries_are_read_when_present() -> None:
    """vllm:prefix_cache_queries_total is optional: its value, or None when absent."""
    extra = 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 4096.0\n'
    assert _only(_parsed(_minimal() + extra)).prefix_cache_queries == 4096.0
    assert _only(_parsed(_minimal())).prefix_cache_queries is None


def test_more_engines_than_max_engines_is_a_too_many_engines_failure() -> None:
    """A body naming more engines than allowed is refused while scanning, with its own reason."""
    body = "".join(_minimal(labels=f'engine="{i}",model_name="m"') for i in range(5))
    assert len(_parsed(body).engines) == 5
    assert isinstance(parse(body, max_engines=5), Exposition)
    failure = parse(body, max_engines=4)
    assert isinstance(failure, ParseFailure)
    assert failure.reason == "too_many_engines"
    assert failure.message.startswith("body names more than 4 engines (max_engines)")
    other = parse("garbage\n")
    assert isinstance(other, ParseFailure)
    assert other.reason == "parse_error"


def test_engines_of_several_models_are_kept_apart() -> None:
    """Two model names with the same engine number are two engines."""
    body = _minimal(labels='engine="0",model_name="a"') + _minimal(
        labels='engine="0",model_name="b"'
    )
    assert list(_parsed(body).engines) == [EngineKey("a", "0"), EngineKey("b", "0")]


def test_label_sets_remembered_across_bodies_stay_bounded_and_checked() -> None:
    """Where a label set lands is remembered across bodies (a server prints the same ones on
    every scrape), in a bounded table; a label set that failed is read, and fails, anew."""
    for index in range(signals._MAX_SLOTS_KEPT // 7 + 10):  # ever-new model names
        assert list(_parsed(_minimal(labels=f'model_name="m{index}"')).engines) == [
            EngineKey(f"m{index}", "0")
        ]
        assert 0 < len(signals._SLOTS) <= signals._MAX_SLOTS_KEPT
    assert _only(_parsed(_minimal())).request_success == 5.0  # a remembered label set
    no_series = _minimal(success='vllm:request_success_total{engine="0",model_name="m"} 5.0')
    for _ in range(2):
        assert "request_success_total sample has no finished_reason label" in _failure(no_series)
    twice = _minimal() + 'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
    for _ in range(2):
        assert "duplicate vllm:num_requests_running sample" in _failure(twice)


def test_other_sleep_states_do_not_decide_awake() -> None:
    """Only the sleep_state="awake" series decides awake; the level series are ignored."""
    extra = (
        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} 1.0\n'
        'vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 1.0\n'
    )
    assert _only(_parsed(_minimal() + extra)).awake is True


# --- bodies that are not a readable vLLM exposition ------------------------------------------


def _cut_mid_line(text: str) -> str:
    index = text.index("vllm:generation_tokens_total{")
    return text[: index + 40]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b"", "body is empty", id="empty"),
        pytest.param(" \n\n", "body is empty", id="blank"),
        pytest.param(
            "<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head></html>\n",
            "body is HTML, not Prometheus text (starts with '<!DOCTYPE html>",
            id="html",
        ),
        pytest.param(
            json.dumps({"object": "error", "message": "Not Found"}),
            "body is JSON, not Prometheus text",
            id="json",
        ),
        pytest.param(
            b"\x00\x01\xff\xfe binary",
            "body is binary, not Prometheus text (invalid UTF-8 at byte 2)",
            id="binary",
        ),
        pytest.param(
            b"abc\x00def\n", "body is binary, not Prometheus text (contains NUL bytes)", id="nul"
        ),
        pytest.param(gzip.compress(b"vllm:x 1\n"), "body is gzip-compressed", id="gzip"),
        pytest.param(
            "# HELP up Whether the target is up.\n# TYPE up gauge\nup 1.0\n",
            "no vllm:num_requests_running samples: not a vLLM /metrics body or stats disabled "
            "(--disable-log-stats)",
            id="plain-prometheus",
        ),
        pytest.param(
            "Internal Server Error",
            "no vllm:num_requests_running samples: not a vLLM /metrics body or stats disabled "
            "(--disable-log-stats); the body also ends mid-line (truncated?)",
            id="plain-text-error",
        ),
        pytest.param(
            'vllm_num_requests_running{engine="0",model_name="m"} 1.0\n# EOF\n',
            "the body uses OpenMetrics-escaped names",
            id="openmetrics-escaped",
        ),
        pytest.param(
            _minimal(running=""),
            "no vllm:num_requests_running samples although other vllm: samples are present",
            id="vllm-without-running",
        ),
    ],
)
def test_not_a_vllm_body(body: str | bytes, expected: str) -> None:
    """A body that is not vLLM's exposition is a ParseFailure that says what it is instead."""
    assert expected in _failure(body)


def test_deeply_nested_json_like_body_is_a_failure_not_a_crash() -> None:
    """A body of 100 000 opening brackets is reported, not a RecursionError."""
    assert "no vllm:num_requests_running samples" in _failure("[" * 100_000 + "\n")


def test_truncated_mid_line_is_a_failure() -> None:
    """A real body cut off mid-line is reported as truncated, naming the line."""
    text = _cut_mid_line(_real_text())
    message = _failure(text)
    line_number = text.count("\n") + 1
    assert message.startswith(f"body is truncated: line {line_number} ends without a newline")


def test_truncated_after_a_complete_value_is_still_a_failure() -> None:
    """Even when the cut lands right after a number, the unterminated last line is not trusted."""
    text = _real_text()
    end = text.index("\n", text.index("vllm:iteration_tokens_total_count{"))
    message = _failure(text[:end])
    assert message.startswith("body is truncated: line ")


def test_truncated_at_line_boundary_names_missing_counters() -> None:
    """A body cut between lines, before some required counters, names them per engine."""
    text = _real_text()
    cut = text[: text.index("# HELP vllm:generation_tokens_total")]
    message = _failure(cut)
    assert message == (
        "engine '0' of model 'tiny-llama' has no vllm:generation_tokens_total, "
        "vllm:request_success_total, vllm:iteration_tokens_total_count sample: "
        "truncated body or an unsupported vLLM version"
    )


def test_engine_with_gauges_but_no_counter_is_a_failure() -> None:
    """An engine missing one progress counter fails instead of reading the counter as 0."""
    assert "has no vllm:num_preemptions_total sample" in _failure(_minimal(preemptions=""))


@pytest.mark.parametrize(
    "path",
    # dp8 has the same layout as dp2 and 2 700 lines: cutting it everywhere only adds seconds.
    [p for p in ALL_FIXTURES if p.name != "dp8_multiproc.prom"],
    ids=lambda p: p.name,
)
def test_every_line_boundary_cut_is_a_failure_or_the_full_reading(path: Path) -> None:
    """Cutting a body after any line never yields a different reading than the whole body."""
    text = path.read_text(encoding="utf-8")
    full = parse(text)
    assert isinstance(full, Exposition)
    offset = text.find("\n")
    while offset != -1:
        cut = parse(text[: offset + 1])
        if isinstance(cut, Exposition):
            assert _summary(cut) == _summary(full)
        offset = text.find("\n", offset + 1)


def test_malformed_needed_line_names_its_line_number() -> None:
    """A needed line that cannot be read is a failure naming the line and showing it."""
    text = _real_text().replace(
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 4.0',
        'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 4.0.0',
    )
    line_number = (
        text.split("\n").index(
            'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 4.0.0'
        )
        + 1
    )
    message = _failure(text)
    assert message.startswith(f"line {line_number}: malformed vllm:num_requests_running sample")
    assert "4.0.0" in message


def test_only_exact_read_names_are_read() -> None:
    """The needed-line pattern (a prefix tree of the names) matches each read name exactly:
    a sample whose name extends a read name, or stops short of one, is another family."""
    body = _minimal()
    near_misses = sorted(
        {name + "x" for name in signals.READ_NAMES}
        | {name[:cut] for name in signals.READ_NAMES for cut in range(1, len(name))}
        - set(signals.READ_NAMES)
    )
    noise = [f'{name}{{engine="0",model_name="m"}} 99.0\n' for name in near_misses]
    assert [line for line in noise if signals._NEEDED_LINE.match("\n" + line)] == []
    assert parse("".join(noise) + body) == parse(body)
    for name in signals.READ_NAMES:  # and each read name is read (a second sample changes it)
        extra = f'{name}{{engine="0",model_name="m",reason="r",finished_reason="r"}} 1.0\n'
        assert parse(body + extra) != parse(body), name


def test_malformed_skipped_line_is_ignored() -> None:
    """Lines of families that are not read are not validated."""
    text = _real_text().replace("process_open_fds 6.0", "process_open_fds six")
    assert parse(text) == parse(_real_text())


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        pytest.param(
            {"running": 'vllm:num_requests_running{engine="0"} 1.0'},
            "has no model_name label",
            id="no-model",
        ),
        pytest.param(
            {"running": 'vllm:num_requests_running{engine="0",model_name="m} 1.0'},
            "malformed",
            id="open-quote",
        ),
        pytest.param(
            {"running": 'vllm:num_requests_running{engine="0",model_name="m"}'},
            "malformed",
            id="no-value",
        ),
        pytest.param(
            {"running": 'vllm:num_requests_running{engine="0",model_name="m"} one'},
            "malformed",
            id="word-value",
        ),
        pytest.param(
            {"running": 'vllm:num_requests_running{engine="0",engine="1",model_name="m"} 1'},
            "duplicate label",
            id="dup-label",
        ),
        pytest.param(
            {"extra": 'vllm:num_requests_waiting_by_reason{engine="0",model_name="m"} 1.0'},
            "has no reason label",
            id="no-reason",
        ),
        pytest.param(
            {"extra": 'vllm:num_requests_running{model_name="m",engine="0"} 9.0'},
            "duplicate vllm:num_requests_running sample",
            id="dup-sample",
        ),
    ],
)
def test_malformed_needed_lines(override: dict[str, str], expected: str) -> None:
    """Broken needed lines are failures with a line number and a specific reason."""
    message = _failure(_minimal(**override))
    assert re.match(r"line \d+: ", message), message
    assert expected in message


def test_two_concatenated_bodies_are_a_failure() -> None:
    """Two bodies back to back would double-count request_success, so they are refused."""
    assert "duplicate" in _failure(_real_text() + _real_text())


# --- properties ------------------------------------------------------------------------------

_gauges = st.floats(allow_nan=True, allow_infinity=True)
_counts = st.floats(min_value=0.0, max_value=1e18, allow_nan=False, allow_infinity=False)
_states = st.builds(
    exposition.EngineState,
    running=_gauges,
    capacity=_gauges,
    deferred=_gauges,
    waiting=st.none() | _gauges,
    kv_cache_usage=_gauges,
    awake=st.sampled_from([0.0, 1.0, math.nan]) | _gauges,
    prompt_tokens=_counts,
    generation_tokens=_counts,
    finished=st.dictionaries(st.sampled_from(exposition.FINISHED_REASONS), _counts),
    preemptions=_counts,
    iterations=st.integers(min_value=0, max_value=30),
)
_model_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)


def _expected(key: EngineKey, state: Any) -> EngineReading:
    success = 0.0
    for reason in exposition.FINISHED_REASONS:
        success += state.finished.get(reason, 0.0)
    awake = None if math.isnan(state.awake) else state.awake == 1.0
    return EngineReading(
        key=key,
        running=state.running,
        waiting=state.total_waiting,
        waiting_by_reason={"capacity": state.capacity, "deferred": state.deferred},
        kv_cache_usage=state.kv_cache_usage,
        awake=awake,
        prompt_tokens=state.prompt_tokens,
        generation_tokens=state.generation_tokens,
        request_success=success,
        preemptions=state.preemptions,
        iterations=float(state.iterations),
    )


@settings(deadline=None, max_examples=60)
@given(
    model_names=st.lists(_model_names, min_size=1, max_size=2, unique=True),
    states=st.lists(_states, min_size=1, max_size=3),
)
def test_generate_latest_round_trips(model_names: list[str], states: list[Any]) -> None:
    """Whatever a vLLM-shaped registry holds, generate_latest's text parses back to it."""
    engines = {
        EngineKey(model, str(rank)): state
        for model in model_names
        for rank, state in enumerate(states)
    }
    result = _parsed(exposition.render_vllm_families(engines))
    assert list(result.engines) == sorted(engines)
    for key, state in engines.items():
        assert _comparable(result.engines[key]) == _comparable(_expected(key, state))


@settings(deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_never_raises_on_arbitrary_input(body: bytes | str) -> None:
    """Any input at all gives an Exposition or a ParseFailure, never an exception."""
    assert isinstance(parse(body), Exposition | ParseFailure)


_needed_fragments = st.sampled_from(
    [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:request_success_total",
        "process_start_time_seconds",
        "{",
        "}",
        '"',
        "\\",
        ",",
        "=",
        " ",
        "\t",
        "\n",
        'engine="0"',
        'model_name="m"',
        "1.0",
        "NaN",
        "+Inf",
        "e+06",
    ]
)


@settings(deadline=None)
@given(st.lists(_needed_fragments, max_size=40).map("".join))
def test_never_raises_on_near_miss_input(body: str) -> None:
    """Jumbles of needed names, labels, quotes and escapes never raise."""
    assert isinstance(parse("\n" + body), Exposition | ParseFailure)
