"""What vLLM's numbers and processes mean: progress, output, and process roles from titles."""

from __future__ import annotations

import math

import pytest

from wedgewatch.vllm.semantics import (
    PROGRESS_COUNTERS,
    Role,
    classify_role,
    is_engine_core_of,
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
        "finished requests": 3.0,
        "preemptions": 4.0,
        "iterations": 5.0,
    }


@pytest.mark.parametrize(
    ("after", "progress", "output"),
    [
        pytest.param({}, False, False, id="nothing-moved"),
        pytest.param({"prompt_tokens": 11.0}, True, False, id="prefill-only"),
        pytest.param({"generation_tokens": 11.0}, True, True, id="generation"),
        pytest.param({"request_success": 11.0}, True, True, id="finished-request"),
        pytest.param({"preemptions": 11.0}, True, False, id="preemption-only"),
        pytest.param({"iterations": 11.0}, True, False, id="empty-steps"),
        pytest.param({"generation_tokens": 9.0}, True, True, id="backwards-moves-too"),
    ],
)
def test_what_counts_as_progress_and_output(
    after: dict[str, float], progress: bool, output: bool
) -> None:
    """Any counter moving is progress; only generation tokens or finished requests are output."""
    before = reading()
    assert progress_moved(before, reading(**after)) is progress
    assert output_moved(before, reading(**after)) is output


def test_a_counter_that_stays_nan_did_not_move() -> None:
    """NaN to NaN is no movement; NaN to a number is."""
    stuck = reading(generation_tokens=NAN)
    assert not progress_moved(stuck, reading(generation_tokens=NAN))
    assert not output_moved(stuck, reading(generation_tokens=NAN))
    assert output_moved(stuck, reading(generation_tokens=1.0))


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
