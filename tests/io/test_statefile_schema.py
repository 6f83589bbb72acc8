"""The state file's schema, checked by hand (the daemon holds no pydantic): every problem is
named with its place in the document, the first three of them in the message."""

from __future__ import annotations

import json
from typing import Any

import pytest

from wedgewatch.core.episode.episode_store import EpisodeRecord
from wedgewatch.io import statefile
from wedgewatch.io.statefile import SavedState, TargetRecord

EPISODE = {
    "episode_id": "e1",
    "model_name": "m",
    "engine": "0",
    "family": "deferred_stall",
    "opened_timestamp": 12,
}


def _document(**targets: Any) -> dict[str, Any]:
    return {
        "schema_version": 2,
        "written_timestamp": 5,
        "wedgewatch_version": "x",
        "targets": targets,
    }


def _problem(document: Any) -> str:
    decoded = statefile.decode(json.dumps(document).encode())
    assert isinstance(decoded, str), decoded
    return decoded


def test_a_valid_document_is_read_with_its_numbers_as_floats() -> None:
    """Whole numbers where floats belong are read as floats; missing optional keys default."""
    decoded = statefile.decode(json.dumps(_document(a={"open_episodes": [EPISODE]})).encode())
    assert decoded == SavedState(
        targets={
            "a": TargetRecord(
                open_episodes=(EpisodeRecord(**{**EPISODE, "opened_timestamp": 12.0}),)
            )
        },
        written_timestamp=5.0,
    )
    assert isinstance(decoded.targets["a"].open_episodes[0].opened_timestamp, float)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param(
            {**_document(), "extra": 1}, "extra: Extra inputs are not permitted", id="extra-key"
        ),
        pytest.param(
            {"schema_version": 2, "targets": {}},
            "written_timestamp: Field required; wedgewatch_version: Field required",
            id="missing",
        ),
        pytest.param(
            {**_document(), "schema_version": 0}, "schema_version: Input should be 1 or 2", id="v0"
        ),
        pytest.param(
            {**_document(), "written_timestamp": "soon"},
            "written_timestamp: Input should be a valid number, unable to parse string as a number",
            id="not-a-number",
        ),
        pytest.param(
            _document(a={"open_episodes": None}),
            "targets.a.open_episodes: Input should be a valid list",
            id="null-episodes",
        ),
        pytest.param(
            {**_document(), "targets": []}, "targets: Input should be a valid dictionary", id="list"
        ),
        pytest.param(
            _document(a={"open_episodes": [{**EPISODE, "episode_id": ""}]}),
            "targets.a.open_episodes.0.episode_id: String should have at least 1 character",
            id="empty-id",
        ),
        pytest.param(
            _document(a={"open_episodes": [{**EPISODE, "engine": 0, "bundle_path": 3}]}),
            "targets.a.open_episodes.0.engine: Input should be a valid string; "
            "targets.a.open_episodes.0.bundle_path: Input should be a valid string",
            id="not-strings",
        ),
        pytest.param(
            _document(a={"detector": [1], "open_episodes": {}}),
            "targets.a.open_episodes: Input should be a valid list; "
            "targets.a.detector: Input should be a valid dictionary",
            id="target-types",
        ),
        pytest.param(
            _document(a={"open_episodes": [{}]}),
            "targets.a.open_episodes.0.episode_id: Field required; "
            "targets.a.open_episodes.0.model_name: Field required; "
            "targets.a.open_episodes.0.engine: Field required; and 2 more",
            id="three-and-more",
        ),
    ],
)
def test_each_problem_is_named_where_it_is(document: Any, message: str) -> None:
    """The message names the place and the rule, as the file's readers expect."""
    problem = _problem(document)
    assert problem.startswith("does not match schema_version")
    assert message in problem


def test_an_infinite_timestamp_is_refused() -> None:
    """JSON's `Infinity` (Python's json writes and reads it) is no timestamp."""
    data = json.dumps(_document(a={"open_episodes": [{**EPISODE, "opened_timestamp": 1e999}]}))
    problem = statefile.decode(data.encode())
    assert isinstance(problem, str)
    assert "opened_timestamp: Input should be a finite number" in problem
