"""Upstream wedge variants on vLLM's own code (wedgewatch/lab/real/variants.py), in the
cached vLLM venvs: the exposition vLLM's own metric code writes for each state, parsed and
judged by wedgewatch, and the KV-event publisher's blocked stack read as a watchdog dump.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from vllm_venvs import vllm_env, vllm_python

from wedgewatch.core.detection.detect import DetectionPolicy, Scraped, new_state, step
from wedgewatch.core.detection.states import EngineState, Family
from wedgewatch.core.evidence.bundle_facts import seen_frames
from wedgewatch.core.evidence.known_issues import Facts, match_known_issues, shipped_known_issues
from wedgewatch.core.evidence.triage import ProcessStacks, StackRound, TriageKind, triage
from wedgewatch.core.evidence.watchdog import parse_dump_name, parse_dump_text
from wedgewatch.vllm.semantics import Role
from wedgewatch.vllm.signals import Exposition, parse

VERSIONS = ("0.30.0", "0.33.0")


def run_variant(version: str, scenario: str) -> dict[str, object]:
    """Run one scenario in the `version` venv; its JSON line."""
    done = subprocess.run(
        [str(vllm_python(version)), "-m", "wedgewatch.lab.real.variants", scenario],
        capture_output=True,
        text=True,
        env=vllm_env(VLLM_LOGGING_LEVEL="ERROR"),
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
    assert done.returncode == 0
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("{")]
    result = json.loads(line)
    assert result["vllm"] == version
    return dict(result)


def judge_frozen(
    exposition: Exposition, seconds: float
) -> list[tuple[float, EngineState, Family | None]]:
    """The detector's verdicts on the same body scraped every 10 s (nothing moves)."""
    state = new_state()
    out = []
    for i in range(int(seconds // 10) + 1):
        state, verdict = step(state, Scraped(i * 10.0, exposition), DetectionPolicy())
        (engine,) = verdict.engines
        out.append((i * 10.0, engine.state, engine.family))
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_a_load_never_reported_finished_shows_as_deferred_not_idle(version: str) -> None:
    """#56640's state on vLLM's own scheduler and metric code: the request waits in
    WAITING_FOR_REMOTE_KVS holding blocks; /metrics says running 0, waiting 1, deferred 1,
    KV held (not idle), and wedgewatch wedges it as deferred_only_stall at 600 s."""
    result = run_variant(version, "parked-load-never-finished")
    state = result["end_state"]
    assert isinstance(state, dict)
    parked = [e for q in ("skipped_waiting", "kv_holding_waiting") for e in state.get(q, [])]
    assert [(e[1], e[2] > 0) for e in parked] == [("WAITING_FOR_REMOTE_KVS", True)]
    exposition = parse(str(result["exposition"]))
    assert isinstance(exposition, Exposition)
    (reading,) = exposition.engines.values()
    assert (reading.running, reading.waiting, reading.deferred, reading.capacity) == (0, 1, 1, 0)
    assert reading.kv_cache_usage is not None
    assert reading.kv_cache_usage > 0.3
    judged = judge_frozen(exposition, 600)
    assert judged[-2][1] is not EngineState.WEDGED
    assert judged[-1][1:] == (EngineState.WEDGED, Family.DEFERRED_ONLY_STALL)


@pytest.mark.parametrize("version", VERSIONS)
def test_hit_pending_for_ever_shows_as_deferred_only_with_an_empty_pool(version: str) -> None:
    """#49829's state (a store one TP rank never confirms): the request is deferred on every
    pass holding nothing; /metrics: running 0, deferred 1, capacity 0, KV 0; the judgement is
    deferred_only_stall at 600 s."""
    result = run_variant(version, "hit-pending")
    state = result["end_state"]
    assert isinstance(state, dict)
    deferred = [e for q in ("skipped_waiting", "deferred_waiting") for e in state.get(q, [])]
    assert [(e[1], e[2]) for e in deferred] == [("WAITING", 0)]
    exposition = parse(str(result["exposition"]))
    assert isinstance(exposition, Exposition)
    (reading,) = exposition.engines.values()
    assert (reading.running, reading.deferred, reading.capacity) == (0, 1, 0)
    assert reading.kv_cache_usage == 0
    assert judge_frozen(exposition, 600)[-1][1:] == (
        EngineState.WEDGED,
        Family.DEFERRED_ONLY_STALL,
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_a_blocked_event_publisher_is_named_by_triage_and_the_known_issue(version: str) -> None:
    """#53859 on vLLM's own ZmqEventPublisher: with its queue full the caller blocks in
    publish -> Queue.put; the dump (vLLM's watchdog format) is read into threads whose
    triage is event_publisher_blocked and whose frames match the known issue #53859."""
    result = run_variant(version, "publisher-blocked")
    assert result["blocked"] is True
    assert result["published"] == 2  # one in the stalled sender, one in the queue
    name = parse_dump_name(str(result["dump_name"]))
    assert name is not None
    assert name.role is Role.ENGINE_CORE
    (dump,) = parse_dump_text(str(result["dump"]))
    assert dump.reason == "feed timeout"
    engine = ProcessStacks(name.pid, 1, Role.ENGINE_CORE, "VLLM::EngineCore", dump.threads)
    verdict = triage([StackRound("watchdog", (engine,))])
    assert verdict.kind is TriageKind.EVENT_PUBLISHER_BLOCKED
    frames = seen_frames([("watchdog", str(Role.ENGINE_CORE), name.pid, dump.threads)])
    facts = Facts("progress_stall", str(verdict.kind), version, {"running_nonzero": "3"}, frames)
    matched = {m.issue.id: m for m in match_known_issues(shipped_known_issues(), facts)}
    assert "fix not released" in matched["vllm-53859"].action
