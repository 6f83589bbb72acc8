"""Tests of the state file: atomic, private, versioned, never a crash; kill -9 in the middle
of writing leaves a consistent file; the restart budget holds across a wedgewatch restart."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from wedgewatch.core.episode.episode_store import EpisodeRecord
from wedgewatch.core.episode.events import ReportEvent
from wedgewatch.core.restart import restart_policy
from wedgewatch.core.restart.restart_policy import Phase, PolicyRecord
from wedgewatch.io import statefile
from wedgewatch.io.statefile import (
    LockFailed,
    SavedState,
    SaveFailed,
    StateLock,
    TargetRecord,
)

CHILD = Path(__file__).parents[1] / "support" / "child_process.py"

RECORD = PolicyRecord(
    phase=Phase.GAVE_UP,
    restart_timestamps=(1_700_000_000.0, 1_700_000_600.5),
    consecutive=2,
    not_before_timestamp=None,
    phase_since_timestamp=1_700_000_700.0,
)
STATE = SavedState(
    targets={
        "vllm-a": TargetRecord(
            restart_policy=RECORD,
            open_episodes=(
                EpisodeRecord(
                    episode_id="20261202T101800Z-vllm-a-0-deferred_stall",
                    model_name="Qwen/Qwen3-8B",
                    engine="0",
                    family="deferred_stall",
                    opened_timestamp=1_700_000_650.0,
                    bundle_path="/var/lib/wedgewatch/evidence/x",
                ),
            ),
            detector={"version": 1, "engines": [], "last_at": 12.5},
        ),
        "vllm-b": TargetRecord(),
    }
)


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    """What is saved is what is loaded, with the time it was written."""
    path = statefile.state_path(tmp_path / "state")
    saved = statefile.save(path, STATE, 1_700_000_800.0)
    assert isinstance(saved, statefile.Saved)
    assert saved.size_bytes == path.stat().st_size
    loaded = statefile.load(path)
    assert loaded.problem is None
    assert loaded.state.targets == STATE.targets
    assert loaded.state.written_timestamp == 1_700_000_800.0
    document = json.loads(path.read_text())
    assert document["schema_version"] == statefile.SCHEMA_VERSION
    assert document["wedgewatch_version"]


def test_state_is_private(tmp_path: Path) -> None:
    """The directory is created 0700 and the file is written 0600, whatever the umask."""
    old_umask = os.umask(0)
    try:
        path = statefile.state_path(tmp_path / "state")
        assert isinstance(statefile.save(path, STATE, 1.0), statefile.Saved)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_missing_file_is_a_first_start(tmp_path: Path) -> None:
    """No state file yet: an empty state and no problem."""
    loaded = statefile.load(tmp_path / "state.json")
    assert loaded.problem is None
    assert loaded.state.targets == {}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        pytest.param(b"", "is not valid JSON", id="empty"),
        pytest.param(b'{"schema_version": 1, "targ', "is not valid JSON", id="truncated"),
        pytest.param(b"\xff\xfe\x00garbage", "is not UTF-8", id="binary"),
        pytest.param(b"[1, 2]", "holds a JSON list", id="array"),
        pytest.param(b'{"targets": {}}', "no integer schema_version", id="no-version"),
        pytest.param(
            b'{"schema_version": 99, "targets": {}}', "newer wedgewatch", id="newer-schema"
        ),
        pytest.param(
            json.dumps(
                {
                    "schema_version": 1,
                    "written_timestamp": 1.0,
                    "wedgewatch_version": "x",
                    "targets": {"a": {"restart_policy": {"phase": "sleepy"}}},
                }
            ).encode(),
            "targets.a: restart_policy: missing field 'consecutive'",
            id="bad-field",
        ),
        pytest.param(
            b'{"schema_version": 1, "written_timestamp": NaN, "wedgewatch_version": "x", '
            b'"targets": {}}',
            "written_timestamp",
            id="nan",
        ),
    ],
)
def test_corrupt_file_is_reported_and_set_aside(
    tmp_path: Path, content: bytes, message: str
) -> None:
    """A corrupt file gives an empty state and a specific message; it is kept for inspection."""
    path = tmp_path / "state.json"
    path.write_bytes(content)
    loaded = statefile.load(path)
    assert loaded.state.targets == {}
    assert loaded.problem is not None
    assert message in loaded.problem
    assert "starting with an empty state" in loaded.problem
    assert (tmp_path / "state.json.corrupt").read_bytes() == content
    assert not path.exists()
    assert isinstance(statefile.save(path, STATE, 2.0), statefile.Saved)
    assert statefile.load(path).problem is None


def test_unreadable_path_is_reported(tmp_path: Path) -> None:
    """A state path that is a directory is reported, not raised."""
    path = tmp_path / "state.json"
    path.mkdir()
    loaded = statefile.load(path)
    assert loaded.problem is not None
    assert "cannot be read" in loaded.problem


def test_failed_save_is_data_and_keeps_the_old_file(tmp_path: Path) -> None:
    """A save that cannot write returns SaveFailed and leaves the previous file intact."""
    path = tmp_path / "state.json"
    assert isinstance(statefile.save(path, STATE, 1.0), statefile.Saved)
    before = path.read_bytes()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    failed = statefile.save(blocker / "state.json", STATE, 2.0)
    assert isinstance(failed, SaveFailed)
    assert "cannot write state file" in failed.message
    bad = SavedState(targets={"a": TargetRecord(detector={"x": float("nan")})})
    failed = statefile.save(path, bad, 3.0)
    assert isinstance(failed, SaveFailed)
    assert path.read_bytes() == before


def test_leftover_temporary_files_are_removed(tmp_path: Path) -> None:
    """Temporary files of a writer killed before its rename are cleaned up by load."""
    path = tmp_path / "state.json"
    leftover = tmp_path / ".state.json.abc123.tmp"
    leftover.write_text("{half")
    unrelated = tmp_path / "notes.tmp"
    unrelated.write_text("keep")
    statefile.load(path)
    assert not leftover.exists()
    assert unrelated.exists()


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    """Child processes of a test, killed and reaped afterwards."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def _spawn(children: list[subprocess.Popen[str]], *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, str(CHILD), *args], stdout=subprocess.PIPE, text=True)
    children.append(proc)
    return proc


def _read_in_new_process(path: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, str(CHILD), "read-state", str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.slow
def test_kill_9_mid_write_never_leaves_a_torn_file(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A writer SIGKILLed at random moments leaves a file another process reads whole."""
    rng = random.Random(4)
    path = tmp_path / "state.json"
    for _ in range(5):
        writer = _spawn(children, "write-state", str(path), "40")
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        result = _read_in_new_process(path)
        assert result["problem"] is None
        assert result["targets"] == 40
        counters = result["counters"]
        assert isinstance(counters, list)
        assert len(counters) == 1  # every target carries the same counter: one whole save
    assert not list(tmp_path.glob(".state.json.*.tmp"))  # the reader cleaned up


def test_restart_budget_holds_across_a_kill_9(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """A wedgewatch killed after spending its budget is refused a restart after it comes back."""
    state_dir = tmp_path / "state"
    burner = _spawn(children, "burn-budget", str(state_dir))
    assert burner.stdout is not None
    assert burner.stdout.readline().strip() == "spent"
    burner.send_signal(signal.SIGKILL)
    burner.wait()
    loaded = statefile.load(statefile.state_path(state_dir))
    assert loaded.problem is None
    record = loaded.state.targets["vllm"].restart_policy
    assert record is not None
    policy = restart_policy.RestartPolicy(
        restart_backoff_seconds=0.0, restart_backoff_max_seconds=0.0
    )
    state = restart_policy.from_record(record, policy, time.monotonic(), time.time())
    assert restart_policy.budget_remaining(state, policy, time.monotonic()) == 0
    decision, step = restart_policy.decide(state, policy, time.monotonic(), time.time())
    assert isinstance(decision, restart_policy.Deny)
    assert decision.reason is restart_policy.DenyReason.BUDGET_EXHAUSTED
    assert [e.kind for e in step.events] == [ReportEvent.GAVE_UP]


def test_second_writer_is_refused_until_the_first_dies(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """Only one wedgewatch may use a state directory; the lock dies with its holder."""
    holder = _spawn(children, "hold-lock", str(tmp_path))
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    refused = statefile.lock_state_dir(tmp_path)
    assert isinstance(refused, LockFailed)
    assert f"pid {holder.pid}" in refused.message
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    lock = statefile.lock_state_dir(tmp_path)
    assert isinstance(lock, StateLock)
    assert (tmp_path / "lock").read_text().strip() == str(os.getpid())
    lock.release()
    lock.release()


def test_lock_failure_on_unusable_directory_is_data(tmp_path: Path) -> None:
    """A state_dir that cannot be created gives LockFailed with the reason."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    failed = statefile.lock_state_dir(blocker / "state")
    assert isinstance(failed, LockFailed)
    assert "cannot open lock file" in failed.message


def test_reset_requests_are_taken_once(tmp_path: Path) -> None:
    """Reset requests for a target or for all are picked up once and then gone."""
    statefile.request_reset(tmp_path, "vllm:8000[a]")
    statefile.request_reset(tmp_path, "other")
    requests = statefile.take_reset_requests(tmp_path)
    assert requests.targets == frozenset({"vllm:8000[a]", "other"})
    assert requests.covers("other")
    assert not requests.covers("third")
    assert statefile.take_reset_requests(tmp_path) == statefile.ResetRequests()
    statefile.request_reset(tmp_path)
    everything = statefile.take_reset_requests(tmp_path)
    assert everything.everything
    assert everything.covers("third")


def test_reset_requests_in_a_missing_directory_are_none(tmp_path: Path) -> None:
    """No state directory yet means no reset requests, not an error."""
    assert statefile.take_reset_requests(tmp_path / "absent") == statefile.ResetRequests()


def test_reset_restarts_edits_the_file_when_no_daemon_runs(tmp_path: Path) -> None:
    """Offline, the chosen target's restart history is cleared; others keep theirs."""
    other = TargetRecord(restart_policy=RECORD)
    state = SavedState(targets={**STATE.targets, "vllm-c": other})
    path = statefile.state_path(tmp_path)
    assert isinstance(statefile.save(path, state, 1.0), statefile.Saved)
    done = statefile.reset_restarts(tmp_path, "vllm-a", 2.0)
    assert isinstance(done, statefile.ResetDone)
    assert done.applied
    targets = statefile.load(path).state.targets
    assert targets["vllm-a"].restart_policy is None
    assert targets["vllm-a"].open_episodes == STATE.targets["vllm-a"].open_episodes
    assert targets["vllm-c"].restart_policy == RECORD
    unknown = statefile.reset_restarts(tmp_path, "nope", 3.0)
    assert isinstance(unknown, statefile.ResetDone)
    assert "no restart history for target 'nope'" in unknown.message


def test_reset_restarts_hands_over_to_a_running_daemon(
    tmp_path: Path, children: list[subprocess.Popen[str]]
) -> None:
    """With the state directory locked by a running process the reset becomes a request."""
    holder = _spawn(children, "hold-lock", str(tmp_path))
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    done = statefile.reset_restarts(tmp_path, None, 1.0)
    assert isinstance(done, statefile.ResetDone)
    assert not done.applied
    assert f"pid {holder.pid}" in done.message
    assert statefile.take_reset_requests(tmp_path).everything


def test_reset_restarts_command(tmp_path: Path) -> None:
    """`wedgewatch reset-restarts TARGET --state-dir DIR` clears that target's budget."""
    path = statefile.state_path(tmp_path)
    assert isinstance(statefile.save(path, STATE, 1.0), statefile.Saved)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "wedgewatch",
            "reset-restarts",
            "vllm-a",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "WEDGEWATCH_CONFIG": ""},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "reset the restart budget of target 'vllm-a'" in result.stdout
    assert statefile.load(path).state.targets["vllm-a"].restart_policy is None


def test_detector_state_with_nan_and_inf_readings_saves_and_loads(tmp_path: Path) -> None:
    """A detector that last saw NaN/Inf gauges and counters saves as strict JSON and loads back."""
    import math

    from wedgewatch.core.detection.detect import DetectionPolicy, Scraped, new_state, step
    from wedgewatch.core.detection.detect_state import dump_state, load_state
    from wedgewatch.vllm.signals import EngineKey, EngineReading, Exposition

    key = EngineKey("m", "0")
    bad = EngineReading(
        key=key,
        running=math.nan,
        waiting=math.inf,
        waiting_by_reason={"capacity": math.inf, "deferred": -math.inf},
        kv_cache_usage=math.nan,
        awake=None,
        prompt_tokens=math.nan,
        generation_tokens=1.0,
        request_success=math.inf,
        preemptions=0.0,
        iterations=1.0,
        finished_by_reason={"stop": math.inf, "abort": math.nan},
        prefix_cache_queries=math.nan,
    )
    detector, _ = step(
        new_state(), Scraped(5.0, Exposition({key: bad}, math.nan)), DetectionPolicy()
    )
    state = SavedState(targets={"t": TargetRecord(detector=dump_state(detector))})
    path = statefile.state_path(tmp_path / "state")
    assert isinstance(statefile.save(path, state, 1_700_000_000.0), statefile.Saved)

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")

    json.loads(path.read_text(), parse_constant=no_constants)
    loaded = statefile.load(path)
    assert loaded.problem is None
    restored = loaded.state.targets["t"].detector
    assert restored is not None
    assert dump_state(load_state(restored)) == dump_state(detector)
    reading = load_state(restored).engines[0].reading
    assert math.isnan(reading.running)
    assert reading.waiting == math.inf
    assert reading.waiting_by_reason == {"capacity": math.inf, "deferred": -math.inf}
