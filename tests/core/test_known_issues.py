"""Known upstream issues: the shipped file parses, and every entry matches the bundle it should."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from report_bundles import SIMPLE_ENV, TP2_OFFLOAD, make_bundle, reading

from wedgewatch.core.evidence.known_issues import (
    Facts,
    SeenFrame,
    match_issue,
    match_known_issues,
    parse_known_issues,
    shipped_known_issues,
    version_in,
)
from wedgewatch.report.model import list_bundles, read_bundle
from wedgewatch.vllm.build_info import cache_config_labels, features

OFFLOAD = TP2_OFFLOAD  # with no VLLM_USE_SIMPLE_KV_OFFLOAD: vLLM's OffloadingConnector
MTP = ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}')
NIXL = ("--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}')
LMCACHE = ("--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}')
STALLED = {"family": "admission_stall", "wedge": reading(capacity=5)}

# entry id -> (bundle that must match, bundle that must not); make_bundle keyword arguments.
KNOWN_ISSUE_EXAMPLES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "vllm-53868": (
        {"flags": TP2_OFFLOAD, "env": SIMPLE_ENV},
        {"flags": TP2_OFFLOAD, "env": {}},
    ),
    "vllm-simple-offload-stuck-transfer": (
        # The measured fault wedges leave the pool far from full (KV 15 % on a hung load,
        # about 50 % on a lost store): the pinned blocks are not the whole pool.
        {"flags": TP2_OFFLOAD, "env": SIMPLE_ENV, "family": "admission_stall",
         "wedge": reading(capacity=29, kv=0.15)},
        {"flags": TP2_OFFLOAD, "env": {}, "family": "admission_stall",
         "wedge": reading(capacity=29, kv=0.15)},
    ),
    "vllm-57841": (
        {"flags": OFFLOAD, "version": "0.30.0"},
        {"flags": OFFLOAD, "version": "0.31.0"},
    ),
    "vllm-45406": (
        {"flags": OFFLOAD},
        {"flags": OFFLOAD, "env": SIMPLE_ENV},
    ),
    "vllm-44560": (
        {"flags": OFFLOAD, "version": "0.22.1"},
        {"flags": OFFLOAD, "version": "0.23.0"},
    ),
    "vllm-57104": (
        # 0.30.0 keeps both stuck requests in skipped_waiting: only deferred ones waiting.
        {"flags": (*OFFLOAD, *MTP), "version": "0.30.0", "family": "deferred_only_stall",
         "wedge": reading(deferred=2, kv=0.99)},
        {"flags": (*OFFLOAD, *MTP), "version": "0.31.0", "family": "deferred_only_stall",
         "wedge": reading(deferred=2, kv=0.99)},
    ),
    "vllm-49829": (
        {"flags": OFFLOAD, "wedge": reading(deferred=4)},
        {"flags": OFFLOAD, "wedge": reading(capacity=5, deferred=2)},
    ),
    "vllm-45414": (
        {**STALLED},
        {**STALLED, "flags": OFFLOAD},
    ),
    "vllm-53130": (
        {"family": "output_stall", "version": "0.27.1", "wedge": reading(3, 19, 473)},
        {"family": "output_stall", "version": "0.27.1", "wedge": reading(3, 19, 0)},
    ),
    "vllm-52520": (
        {"family": "output_stall", "flags": ("--mamba-cache-mode", "align"),
         "wedge": reading(1, 0, 0, preemptions=40)},
        {"family": "output_stall", "wedge": reading(1, 0, 0, preemptions=40)},
    ),
    "vllm-46811": (
        {"family": "progress_stall", "stacks": "collective_hang", "wedge": reading(running=2),
         "rename_frames": {"EngineCore.step": "EngineCore.step_with_batch_queue"}},
        {"family": "progress_stall", "stacks": "collective_hang", "wedge": reading(running=2)},
    ),
    "vllm-45094": (
        {"family": "progress_stall", "stacks": "collective_hang", "wedge": reading(running=2)},
        {"family": "progress_stall", "stacks": "scheduler_wedge", "wedge": reading(running=2)},
    ),
    "vllm-39863": (
        {"stacks": "engine_dead"},
        {"stacks": "scheduler_wedge"},
    ),
    "vllm-56640": (
        # What vLLM's own metric code shows for the parked request: deferred 1, running 0.
        {"flags": NIXL, "version": "0.29.0", "family": "deferred_only_stall",
         "wedge": reading(deferred=1, kv=0.8)},
        {"flags": NIXL, "version": "0.30.0", "family": "deferred_only_stall",
         "wedge": reading(deferred=1, kv=0.8)},
    ),
    "vllm-53859": (
        {"family": "progress_stall", "wedge": reading(running=3),
         "rename_frames": {"EngineCore._process_engine_step": "ZmqEventPublisher.publish"}},
        {"family": "progress_stall", "wedge": reading(running=3)},
    ),
    "vllm-metal-479": (
        {"family": "admission_stall", "wedge": reading(capacity=6, kv=0.0)},
        {"family": "admission_stall", "wedge": reading(capacity=6, deferred=1, kv=0.0)},
    ),
    "lil-vllm-191": (
        {"flags": LMCACHE, "family": "deferred_only_stall", "wedge": reading(deferred=1)},
        {"flags": LMCACHE, "family": "deferred_stall", "wedge": reading(capacity=2, deferred=1)},
    ),
}  # fmt: skip


def test_every_shipped_entry_has_examples() -> None:
    """A new known_issues.toml entry without its two example bundles fails here."""
    ids = [issue.id for issue in shipped_known_issues()]
    assert sorted(ids) == sorted(KNOWN_ISSUE_EXAMPLES)
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("issue_id", sorted(KNOWN_ISSUE_EXAMPLES))
def test_entry_matches_its_bundle_and_not_the_other(issue_id: str, tmp_path: Path) -> None:
    """Each entry matches the bundle that has its signature and not the one that lacks a part."""
    should, should_not = KNOWN_ISSUE_EXAMPLES[issue_id]
    yes = read_bundle(make_bundle(tmp_path / "yes", **should))
    no = read_bundle(make_bundle(tmp_path / "no", **should_not))
    assert yes.problems == ()
    assert no.problems == ()
    matched = {m.issue.id: m for m in yes.matches}
    assert issue_id in matched, (yes.facts, [m.issue.id for m in yes.matches])
    assert matched[issue_id].evidence  # says why
    assert issue_id not in {m.issue.id for m in no.matches}


def test_match_evidence_names_the_facts() -> None:
    """The #53868 match carries the family, triage, flags and state that matched."""
    issue = next(i for i in shipped_known_issues() if i.id == "vllm-53868")
    facts = Facts(
        "deferred_stall",
        "scheduler_wedge",
        "0.33.0",
        {"simple_cpu_offload": "x with VLLM_USE_SIMPLE_KV_OFFLOAD=1", "running_zero": "r",
         "waiting_deferred": "waiting deferred 3"},
    )  # fmt: skip
    match = match_issue(issue, facts)
    assert match is not None
    text = " ".join(match.evidence)
    for part in ("deferred_stall", "scheduler_wedge", "VLLM_USE_SIMPLE_KV_OFFLOAD", "deferred 3"):
        assert part in text


def test_unknown_version_matches_and_says_so() -> None:
    """Without a vLLM version a versioned entry still matches, saying the range went unchecked."""
    issue = next(i for i in shipped_known_issues() if i.id == "vllm-45094")
    facts = Facts("progress_stall", "collective_hang", None, {},
                  (SeenFrame("worker", 5, "wedged", "Worker.all_reduce"),))  # fmt: skip
    match = match_issue(issue, facts)
    assert match is not None
    assert any("not checked" in e for e in match.evidence) is False  # no range on this entry
    issue57 = next(i for i in shipped_known_issues() if i.id == "vllm-57841")
    facts57 = Facts("deferred_stall", "scheduler_wedge", None,
                    {"offloading_connector": "o", "running_zero": "r",
                     "waiting_deferred": "d"})  # fmt: skip
    m57 = match_issue(issue57, facts57)
    assert m57 is not None
    assert any("not checked" in e for e in m57.evidence)


@pytest.mark.parametrize(
    ("version", "spec", "inside"),
    [
        ((0, 30, 0), "<0.31", True),
        ((0, 31, 0), "<0.31", False),
        ((0, 26), ">=0.26.0", True),
        ((0, 33, 0), ">=0.26,<0.34", True),
        ((0, 25, 9), ">=0.26", False),
    ],
)
def test_version_ranges(version: tuple[int, ...], spec: str, inside: bool) -> None:
    """Version ranges compare numerically with missing parts as zero."""
    assert version_in(version, spec) is inside


ENTRY = ("[[issue]]\nid='a'\nurl='u'\ntitle='t'\nstatus='s'\naffected='a'\nworkaround='w'\n"
         "families=['x']\n")  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[issue]]\nid='a'\n", "url is required"),
        ("[[issue]]\nid='a'\nurl='u'\ntitle='t'\nstatus='s'\naffected='a'\nworkaround='w'\n",
         "a signature needs"),
        ("[[issue]]\nid='a'\nurl='u'\ntitle='t'\nstatus='s'\naffected='a'\nworkaround='w'\n"
         "families=['x']\nversions='~1'\n", "does not start with"),
        ("[[issue]]\nid='a'\nbogus=1\n", "unknown key(s) bogus"),
        ("[[issue]]\nid='a'\nurl='u'\ntitle='t'\nstatus='s'\naffected='a'\nworkaround='w'\n"
         "frames=['nocolon']\n", "role:pattern"),
        ("not toml [", "known_issues.toml"),
        (ENTRY + "fixed_in='0.31.0'\n", "fixed_in needs fix_marker"),
        (ENTRY + "fixed_in='0.31.0'\nfix_marker='scheduler.py'\n", "vllm/<file>.py::<text"),
        (ENTRY + "bug_marker='vllm/a.py::x'\n", "bug_marker and checked_through go together"),
        (ENTRY + "checked_through='0.34.0'\n", "bug_marker and checked_through go together"),
        (ENTRY + "fixed_in='0.31.0'\nfix_marker='vllm/a.py::x'\nchecked_through='0.34.0'\n"
         "bug_marker='vllm/a.py::y'\n", "fixed (fixed_in) or not released"),
    ],
)  # fmt: skip
def test_bad_entries_are_rejected_with_the_reason(text: str, message: str) -> None:
    """A broken known-issues file names the entry and what is wrong."""
    with pytest.raises(ValueError, match=r"known_issues\.toml") as info:
        parse_known_issues(text)
    assert message in str(info.value)


def test_capture_and_report_agree_on_the_matches(tmp_path: Path) -> None:
    """The capture's summary (stacks in memory) and the report (stacks from disk) match alike."""
    import json

    from wedgewatch.core.evidence.triage import ProcessStacks, StackRound, parse_pyspy_json
    from wedgewatch.io.bundles import known_issues_of
    from wedgewatch.vllm.semantics import Role

    bundle = make_bundle(tmp_path, flags=TP2_OFFLOAD, env=SIMPLE_ENV)
    summary = json.loads((bundle / "summary.json").read_text())
    processes = []
    for record in summary["phases"]["wedged"]["stacks"]:
        threads = parse_pyspy_json(json.loads((bundle / record["files"][0]).read_text()))
        assert not isinstance(threads, str)
        processes.append(
            ProcessStacks(record["pid"], record["ppid"], Role(record["role"]), "", threads)
        )
    captured = known_issues_of(bundle, summary, [StackRound("wedged", tuple(processes))])
    assert [m["id"] for m in captured] == [m.issue.id for m in read_bundle(bundle).matches]
    # A TP=2 SimpleCPUOffloadConnector wedge: #53868, then a transfer stuck on one rank as a
    # possibility (no bundle fact shows a transfer that never completed).
    assert [m["id"] for m in captured] == ["vllm-53868", "vllm-simple-offload-stuck-transfer"]
    assert captured[0]["evidence"]
    assert captured[0]["possibility"] is None
    assert captured[1]["possibility"]
    assert str(captured[1]["action"]).startswith("possibly vllm-simple-offload-stuck-transfer:")


OFFLOAD_WEDGE = {"offloading_connector": "o", "running_zero": "r", "waiting": "w",
                 "waiting_deferred": "d"}  # fmt: skip


def test_a_match_says_whether_the_release_is_affected_and_what_closes_it() -> None:
    """One action line: the bundle's release is affected, the release that closes the path,
    the workaround; a release from the fix on does not match at all."""
    issues = shipped_known_issues()
    matches = match_known_issues(
        issues, Facts("deferred_stall", "scheduler_wedge", "0.30.0+wedgewatch.sim", OFFLOAD_WEDGE)
    )
    first = matches[0]
    assert first.issue.id == "vllm-57841"
    assert not first.possible
    assert first.action.startswith(
        "#57841: vLLM 0.30.0+wedgewatch.sim is affected (before 0.31.0); "
        "fixed in vLLM 0.31.0: upgrade to it or later (closes this path); "
        "meanwhile: restart the server"
    )
    assert first.to_json()["fixed_in"] == "0.31.0"
    fixed = match_known_issues(
        issues, Facts("deferred_stall", "scheduler_wedge", "0.31.0", OFFLOAD_WEDGE)
    )
    assert "vllm-57841" not in {m.issue.id for m in fixed}
    unknown = match_issue(first.issue, Facts("deferred_stall", "scheduler_wedge", None,
                                             OFFLOAD_WEDGE))  # fmt: skip
    assert unknown is not None
    assert unknown.action.startswith("#57841: vLLM version unknown: affected if <0.31.0; fixed in")


def test_a_fault_the_evidence_cannot_show_is_ranked_last_and_labelled() -> None:
    """The broader #45406 family comes after #57841 and says it is a possibility; an entry
    without a fixed release says that no release closes it."""
    matches = match_known_issues(
        shipped_known_issues(),
        Facts("deferred_stall", "scheduler_wedge", "0.30.0", OFFLOAD_WEDGE),
    )
    ids = [m.issue.id for m in matches]
    assert ids.index("vllm-57841") < ids.index("vllm-45406")
    possible = matches[ids.index("vllm-45406")]
    assert possible.possible
    assert possible.action.startswith("possibly #45406: vLLM 0.30.0 is affected")
    assert "no release closes it yet" in possible.action
    assert [m.possible for m in matches] == sorted(m.possible for m in matches)


def test_fixed_in_must_be_a_version() -> None:
    """A fixed_in that is no version is refused with the entry's name."""
    text = ("[[issue]]\nid='a'\nurl='u'\ntitle='t'\nstatus='s'\naffected='a'\nworkaround='w'\n"
            "families=['x']\nfixed_in='soon'\n")  # fmt: skip
    with pytest.raises(ValueError, match="issue a: fixed_in 'soon' is not a version"):
        parse_known_issues(text)


# The `vllm:cache_config_info` sample of a real vLLM 0.30.0 (CPU build) with no offloading:
# it names the default offloading backend ("native") although nothing is offloaded.
REAL_0_30_CACHE_CONFIG = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",kv_cache_memory_bytes="67108864",kv_offloading_backend="native",'
    'kv_offloading_size="None",mamba_cache_mode="none",num_cpu_blocks="None"} 1.0\n'
)


def test_the_default_offloading_backend_label_is_not_offloading() -> None:
    """#57841 is told to a 0.30.0 only when its configuration offloads: a real server's
    cache_config_info says kv_offloading_backend="native" with kv_offloading_size="None"
    (no offloading), which must not count; a size does."""
    wedge = reading(capacity=2, deferred=2)
    labels = cache_config_labels(REAL_0_30_CACHE_CONFIG)
    assert labels["kv_offloading_backend"] == "native"
    issues = shipped_known_issues()

    def refs(cache: dict[str, str]) -> set[str]:
        facts = Facts("deferred_stall", "scheduler_wedge", "0.30.0", features({}, {}, cache, wedge))
        return {m.issue.ref for m in match_known_issues(issues, facts)}

    assert "#57841" not in refs(labels)
    assert "#57841" in refs({**labels, "kv_offloading_size": "60.0"})


def test_an_unfixed_entry_names_the_newest_release_read() -> None:
    """An entry whose faulty code is still in the newest release read says "fix not released"
    and names that release; an entry never read says only that no release closes it."""
    matches = match_known_issues(
        shipped_known_issues(),
        Facts("progress_stall", "event_publisher_blocked", "0.34.0", {"running_nonzero": "r"},
              (SeenFrame("engine_core", 7, "wedged", "ZmqEventPublisher.publish"),)),
    )  # fmt: skip
    (publisher,) = [m for m in matches if m.issue.id == "vllm-53859"]
    assert "fix not released (vLLM 0.34.0, the newest release read, still has it)" in (
        publisher.action
    )
    assert publisher.to_json()["checked_through"] == "0.34.0"
    assert "frame ZmqEventPublisher.publish in engine_core 7 (wedged)" in publisher.evidence


def test_bundles_says_fixed_in_or_fix_not_released(tmp_path: Path) -> None:
    """`wedgewatch bundles` names, beside each match, the release that fixes it or that no
    release read does."""
    fixed = make_bundle(tmp_path, "20261202T090000Z_local_engine0_deferred_stall",
                        flags=OFFLOAD, version="0.30.0")  # fmt: skip
    blocked = make_bundle(tmp_path, "20261202T100000Z_local_engine0_progress_stall",
                          family="progress_stall", wedge=reading(running=3),
                          rename_frames={"EngineCore._process_engine_step":
                                         "ZmqEventPublisher.publish"})  # fmt: skip
    for bundle in (fixed, blocked):
        summary = json.loads((bundle / "summary.json").read_text())
        summary["known_issues"] = [m.to_json() for m in read_bundle(bundle).matches]
        (bundle / "summary.json").write_text(json.dumps(summary))
    rows = {r.name: r.known_issues for r in list_bundles(tmp_path)}
    assert "vllm-57841 (fixed in 0.31.0)" in rows[fixed.name]
    assert "vllm-53859 (fix not released)" in rows[blocked.name]
