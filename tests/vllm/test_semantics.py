"""What vLLM's numbers and processes mean: progress, output, and process roles from titles."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wedgewatch.vllm.semantics import (
    PROGRESS_COUNTERS,
    Role,
    classify_role,
    completed_requests,
    decode_float,
    encode_float,
    is_engine_core_of,
    keep_finite,
    movement,
    non_finite_fields,
    output_counters,
    output_moved,
    progress_counters,
    progress_moved,
)
from wedgewatch.vllm.signals import EngineKey, EngineReading

NAN = math.nan


def reading(**counters: float) -> EngineReading:
    """A busy engine's reading with every counter at 10 unless given."""
    values = {
        "prompt_tokens": 10.0,
        "generation_tokens": 10.0,
        "request_success": 10.0,
        "preemptions": 10.0,
        "iterations": 10.0,
    }
    values.update(counters)
    return EngineReading(
        key=EngineKey("m", "0"),
        running=1.0,
        waiting=0.0,
        waiting_by_reason={},
        kv_cache_usage=None,
        awake=None,
        **values,
    )


def test_progress_counters_follow_their_names() -> None:
    """The counters come in the order their names are listed for messages."""
    counters = progress_counters(
        reading(
            prompt_tokens=1.0,
            generation_tokens=2.0,
            request_success=3.0,
            preemptions=4.0,
            iterations=5.0,
        )
    )
    assert dict(zip(PROGRESS_COUNTERS, counters, strict=True)) == {
        "prompt tokens": 1.0,
        "generation tokens": 2.0,
        "completed requests": 3.0,
        "preemptions": 4.0,
    }


@pytest.mark.parametrize(
    ("after", "progress", "output"),
    [
        pytest.param({}, False, False, id="nothing-moved"),
        pytest.param({"prompt_tokens": 11.0}, True, False, id="prefill-only"),
        pytest.param({"generation_tokens": 11.0}, True, True, id="generation"),
        pytest.param({"request_success": 11.0}, True, True, id="finished-request"),
        pytest.param({"preemptions": 11.0}, True, False, id="preemption-only"),
        # The batch that reports an aborted finish moves the iteration count (0 tokens).
        pytest.param({"iterations": 11.0}, False, False, id="iterations-alone-not-progress"),
        pytest.param({"generation_tokens": 9.0}, True, True, id="backwards-moves-too"),
    ],
)
def test_what_counts_as_progress_and_output(
    after: dict[str, float], progress: bool, output: bool
) -> None:
    """A token, finish or preemption counter moving is progress (not the iteration count alone);
    only generation tokens or finished requests are output."""
    before = reading()
    assert progress_moved(before, reading(**after)) is progress
    assert output_moved(before, reading(**after)) is output


_COUNTER = st.sampled_from([0.0, 1.0, 2.0, NAN, math.inf, -math.inf])
_REASONS = st.dictionaries(st.sampled_from(["stop", "length", "abort", "error"]), _COUNTER)


@given(
    before=st.tuples(_COUNTER, _COUNTER, _COUNTER, _COUNTER, _REASONS),
    now=st.tuples(_COUNTER, _COUNTER, _COUNTER, _COUNTER, _REASONS),
)
def test_movement_is_any_counter_of_its_tuple_moving(
    before: tuple[float, float, float, float, dict[str, float]],
    now: tuple[float, float, float, float, dict[str, float]],
) -> None:
    """`movement` says progress (output) exactly when a counter of `progress_counters`
    (`output_counters`) moved, including finished reasons and non-finite values."""

    def made(counters: tuple[float, float, float, float, dict[str, float]]) -> EngineReading:
        prompt, generation, success, preemptions, reasons = counters
        made = reading(
            prompt_tokens=prompt,
            generation_tokens=generation,
            request_success=success,
            preemptions=preemptions,
        )
        return replace(made, finished_by_reason=reasons)

    a, b = made(before), made(now)
    moved = movement(a, b)
    pairs = zip(progress_counters(a), progress_counters(b), strict=True)
    assert moved.progress == any(x != y and math.isfinite(x) and math.isfinite(y) for x, y in pairs)
    pairs = zip(output_counters(a), output_counters(b), strict=True)
    assert moved.output == any(x != y and math.isfinite(x) and math.isfinite(y) for x, y in pairs)


def test_a_non_finite_counter_never_moves() -> None:
    """NaN to NaN, NaN to a number and a number to Inf are no movement: only finite values move."""
    stuck = reading(generation_tokens=NAN)
    assert not progress_moved(stuck, reading(generation_tokens=NAN))
    assert not output_moved(stuck, reading(generation_tokens=NAN))
    assert not output_moved(stuck, reading(generation_tokens=1.0))
    assert not output_moved(reading(), reading(generation_tokens=math.inf))


def finished(**by_reason: float) -> EngineReading:
    """A reading whose request_success is split by finished_reason."""
    return replace(
        reading(),
        request_success=sum(by_reason.values()),
        finished_by_reason={"stop": 0.0, "length": 0.0, "abort": 0.0, "error": 0.0, **by_reason},
    )


@pytest.mark.parametrize(
    ("after", "counts"),
    [
        pytest.param({"stop": 1.0}, True, id="stop"),
        pytest.param({"length": 1.0}, True, id="length"),
        pytest.param({"repetition": 1.0}, True, id="repetition"),
        pytest.param({"abort": 5.0}, False, id="abort-is-neither"),
        pytest.param({"error": 5.0}, False, id="error-is-neither"),
    ],
)
def test_aborted_and_errored_finishes_are_neither_progress_nor_output(
    after: dict[str, float], counts: bool
) -> None:
    """request_success_total counts every finish; only the non-abort, non-error ones count."""
    before = finished()
    assert progress_moved(before, finished(**after)) is counts
    assert output_moved(before, finished(**after)) is counts
    assert completed_requests(finished(stop=2.0, abort=7.0, error=1.0)) == 2.0


def gauges(running: float, kv: float | None, prefix: float | None = None) -> EngineReading:
    """A reading with these gauges and every counter at 10."""
    return replace(reading(), running=running, kv_cache_usage=kv, prefix_cache_queries=prefix)


@pytest.mark.parametrize(
    ("before", "after", "prefill"),
    [
        pytest.param(gauges(1, 0.2), gauges(1, 0.3), True, id="kv-grows-running"),
        pytest.param(gauges(1, 0.3), gauges(1, 0.3), False, id="kv-flat"),
        pytest.param(gauges(1, 0.3), gauges(1, 0.2), False, id="kv-shrinks"),
        pytest.param(gauges(0, 0.2), gauges(0, 0.9), False, id="kv-grows-nothing-running"),
        pytest.param(gauges(0, 0.2), gauges(2, 0.9), True, id="kv-grows-on-admission"),
        pytest.param(gauges(1, None), gauges(1, 0.3), False, id="kv-appears"),
        pytest.param(gauges(1, 0.2), gauges(1, NAN), False, id="kv-nan"),
        pytest.param(gauges(1, 0.2, 100), gauges(1, 0.2, 900), True, id="prefix-queries-running"),
        pytest.param(gauges(0, 0.2, 100), gauges(0, 0.2, 900), False, id="prefix-queries-idle"),
        pytest.param(gauges(NAN, 0.2), gauges(NAN, 0.9), False, id="running-nan"),
    ],
)
def test_prefill_progress_needs_running_requests(
    before: EngineReading, after: EngineReading, prefill: bool
) -> None:
    """KV growth or prefix-cache queries count as prefill only while requests run; never output."""
    moved = movement(before, after)
    assert moved.prefill is prefill
    assert not moved.output
    assert not moved.progress


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        pytest.param(1.5, 1.5, id="finite"),
        pytest.param(NAN, "NaN", id="nan"),
        pytest.param(math.inf, "Infinity", id="inf"),
        pytest.param(-math.inf, "-Infinity", id="minus-inf"),
    ],
)
def test_non_finite_values_round_trip_through_strict_json(value: float, encoded: object) -> None:
    """encode_float/decode_float carry NaN and Inf through JSON, which has no NaN."""
    assert encode_float(value) == encoded
    text = json.dumps(encode_float(value), allow_nan=False)
    back = decode_float(json.loads(text), "x")
    assert back == value or (math.isnan(back) and math.isnan(value))
    with pytest.raises(ValueError, match="x: expected a number, got 'nan'"):
        decode_float("nan", "x")


def test_non_finite_fields_name_queue_gauges_and_counters() -> None:
    """A NaN KV usage is not listed (it is optional); NaN queue gauges and counters are."""
    bad = replace(reading(generation_tokens=NAN), running=math.inf, kv_cache_usage=NAN)
    assert non_finite_fields(bad) == ("running", "generation tokens")
    assert non_finite_fields(reading()) == ()
    by_reason = replace(
        reading(request_success=NAN),
        waiting_by_reason={"deferred": NAN, "capacity": 1.0},
        finished_by_reason={"stop": 3.0, "abort": math.inf},
    )
    # the total is not judged when the reasons are there; each reason is, by name
    assert non_finite_fields(by_reason) == ("waiting (deferred)", "finished requests (abort)")
    assert (
        non_finite_fields(
            replace(by_reason, waiting_by_reason={}, finished_by_reason={"stop": 3.0})
        )
        == ()
    )


@pytest.mark.parametrize(
    ("title", "listener", "role"),
    [
        pytest.param("VLLM::EngineCore", False, Role.ENGINE_CORE, id="engine"),
        pytest.param("VLLM::EngineCore_DP1", False, Role.ENGINE_CORE, id="engine-dp"),
        pytest.param("VLLM::Worker_TP0", False, Role.WORKER, id="worker-tp"),
        pytest.param("VLLM::Worker", False, Role.WORKER, id="worker-before-init"),
        pytest.param("VLLM::APIServer_1", False, Role.API_SERVER, id="api-child"),
        pytest.param(
            "python -m vllm.entrypoints.openai.api_server", True, Role.API_SERVER, id="listener"
        ),
        pytest.param("VLLM::EngineCore", True, Role.ENGINE_CORE, id="title-beats-listener"),
        pytest.param(
            "/usr/bin/python -c from multiprocessing.resource_tracker import main",
            False,
            Role.OTHER,
            id="resource-tracker",
        ),
        pytest.param("VLLM::DPCoordinator", False, Role.OTHER, id="dp-coordinator"),
    ],
)
def test_classify_role(title: str, listener: bool, role: Role) -> None:
    """Roles come from the title prefix; the listener is the API server."""
    assert classify_role(title, is_listener=listener) is role


@pytest.mark.parametrize(
    ("title", "engine", "matches"),
    [
        pytest.param("VLLM::EngineCore_DP1", "1", True, id="its-rank"),
        pytest.param("VLLM::EngineCore_DP1", "0", False, id="other-rank"),
        pytest.param("VLLM::EngineCore_DP11", "1", False, id="longer-rank"),
        pytest.param("VLLM::EngineCore", "0", False, id="no-data-parallelism"),
        pytest.param("", "0", False, id="no-title"),
    ],
)
def test_engine_core_of_a_data_parallel_rank(title: str, engine: str, matches: bool) -> None:
    """A data-parallel EngineCore is told apart by the `_DP<rank>` suffix of its title."""
    assert is_engine_core_of(title, engine) is matches


@pytest.mark.parametrize(
    "field",
    [
        "prompt_tokens",
        "generation_tokens",
        "request_success",
        "preemptions",
        "iterations",
        "kv_cache_usage",
        "prefix_cache_queries",
        "finished_by_reason",
    ],
)
def test_keep_finite_keeps_the_last_finite_value_of_each_field(field: str) -> None:
    """A NaN in any field `keep_finite` looks at takes `before`'s value; a wholly finite
    reading is the next base as it is (nothing copied)."""
    before = replace(
        reading(), kv_cache_usage=0.5, prefix_cache_queries=7.0, finished_by_reason={"stop": 3.0}
    )
    now = replace(
        reading(prompt_tokens=20.0, generation_tokens=21.0, request_success=22.0),
        kv_cache_usage=0.6,
        prefix_cache_queries=8.0,
        finished_by_reason={"stop": 4.0},
    )
    assert keep_finite(before, now) is now
    nan: object = {"stop": NAN} if field == "finished_by_reason" else NAN
    kept = keep_finite(before, replace(now, **{field: nan}))
    assert getattr(kept, field) == getattr(before, field)
    others = [f for f in ("prompt_tokens", "kv_cache_usage", "finished_by_reason") if f != field]
    assert all(getattr(kept, f) == getattr(now, f) for f in others)
