"""Evidence bundles: naming, privacy, retention planning, and captures of real process trees."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bundle_files import assert_private, fake_bundle, modes
from standin_tree import StandinTree, standin_tree

from wedgewatch.core.detection.states import CapturePhase
from wedgewatch.core.evidence.triage import TriageKind
from wedgewatch.io.bundles import scan_bundles
from wedgewatch.io.evidence import (
    BundleResult,
    CaptureRequest,
    EvidenceDeps,
    EvidenceSettings,
    capture_bundle,
    complete_bundle,
    mark_cut_off,
    open_bundle,
    resolve_bundle,
)
from wedgewatch.io.nvidia_smi import NVIDIA_SMI_NOT_FOUND
from wedgewatch.io.procs import ProcessSelector, read_proc_state
from wedgewatch.io.pyspy import PTRACE_FIX, PySpyRunner
from wedgewatch.report.model import read_bundle
from wedgewatch.report.render import render_html, render_markdown

SUSPECT_BODY = b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n'
WEDGED_BODY = b'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n# later\n'


def settings_for(tmp_path: Path, **changes: Any) -> EvidenceSettings:
    """Settings for a test: short CPU sample, no nvidia-smi unless a test provides one."""
    values: dict[str, Any] = {
        "evidence_dir": tmp_path / "evidence",
        "process_sample_seconds": 0.2,
        "pyspy_timeout_seconds": 20.0,
        "nvidia_smi_path": "nvidia-smi-that-does-not-exist",
    }
    values.update(changes)
    return EvidenceSettings(**values)


def request_for(selector: ProcessSelector, **changes: Any) -> CaptureRequest:
    """A suspect request for engine 0 of target `local`."""
    values: dict[str, Any] = {
        "target": "local",
        "selector": selector,
        "phase": CapturePhase.SUSPECT,
        "family": "deferred_stall",
        "engine": "0",
        "model_name": "m",
        "episode_id": "ep-1",
        "metrics_body": SUSPECT_BODY,
        "history": [{"at": 1.0, "running": 0.0, "waiting": 3.0}],
        "thresholds": {"stall_after_seconds": 30.0},
        "verdict": {"state": "suspect", "reason": "3 deferred, nothing running for 12 s"},
        "verdict_at": 0.0,
    }
    values.update(changes)
    return CaptureRequest(**values)


def summary_of(result: BundleResult) -> dict[str, Any]:
    """The bundle's summary.json."""
    assert result.bundle is not None
    data: dict[str, Any] = json.loads((result.bundle / "summary.json").read_text())
    return data


# ---------------------------------------------------------------- requests and settings


def test_request_accepts_plain_phase_strings(tmp_path: Path) -> None:
    """`phase="wedged"` (a plain string, as a saved record carries it) becomes CapturePhase."""
    request = CaptureRequest(
        target="t", selector=ProcessSelector(pid=1), phase="wedged", bundle=str(tmp_path)
    )  # type: ignore[arg-type]
    assert request.phase is CapturePhase.WEDGED
    assert request.bundle == tmp_path
    with pytest.raises(ValueError, match="'sideways' is not a valid CapturePhase"):
        CaptureRequest(target="t", selector=ProcessSelector(pid=1), phase="sideways")  # type: ignore[arg-type]


def test_settings_reject_nonsense() -> None:
    """Bad evidence settings are rejected with the field named."""
    with pytest.raises(ValueError, match="process_sample_seconds must be > 0"):
        EvidenceSettings(evidence_dir=Path("/x"), process_sample_seconds=0)
    with pytest.raises(ValueError, match="evidence_keep must be >= 1"):
        EvidenceSettings(evidence_dir=Path("/x"), evidence_keep=0)


# ---------------------------------------------------------------- captures without a tree


def gone_or_zombie(pid: int) -> bool:
    """True when the process no longer runs."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return ") Z " in f.read()
    except FileNotFoundError:
        return True


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def test_missing_pid_file_is_recorded_and_bundle_still_written(tmp_path: Path) -> None:
    """A missing pid file ends up in the summary; metrics and history are still saved."""
    deps = EvidenceDeps(settings_for(tmp_path))
    pid_file = tmp_path / "vllm.pid"
    result = await capture_bundle(request_for(ProcessSelector(pid_file=pid_file)), deps)
    assert result.bundle is not None
    assert f"processes: pid file {pid_file} does not exist" in result.failures
    assert result.triage.kind is TriageKind.NO_STACKS
    assert (result.bundle / "metrics_suspect.prom").read_bytes() == SUSPECT_BODY
    summary = summary_of(result)
    assert summary["phases"]["suspect"]["discovery"]["error"] == (
        f"pid file {pid_file} does not exist"
    )
    assert summary["nvidia_smi"] == {"status": "not_found", "message": NVIDIA_SMI_NOT_FOUND}
    assert not result.complete


async def test_missing_metrics_body_is_a_recorded_failure(tmp_path: Path) -> None:
    """When the daemon had no body (scrape failed) the summary says so."""
    deps = EvidenceDeps(settings_for(tmp_path))
    request = request_for(
        ProcessSelector(pid=dead_pid()), metrics_body=None, metrics_error="timeout after 5 s"
    )
    result = await capture_bundle(request, deps)
    assert "metrics_suspect.prom: no /metrics body (timeout after 5 s)" in result.failures
    assert result.bundle is not None
    assert not (result.bundle / "metrics_suspect.prom").exists()


async def test_unusable_evidence_dir_is_a_result_not_an_exception(tmp_path: Path) -> None:
    """An evidence_dir that cannot be created gives a failed result, never an exception."""
    (tmp_path / "file").write_text("in the way")
    deps = EvidenceDeps(settings_for(tmp_path, evidence_dir=tmp_path / "file" / "evidence"))
    result = await capture_bundle(request_for(ProcessSelector(pid=dead_pid())), deps)
    assert result.bundle is None
    assert result.failures[0].startswith(f"cannot create a bundle in {tmp_path / 'file'}")
    assert not result.complete


async def test_fake_nvidia_smi_output_is_saved(tmp_path: Path) -> None:
    """When nvidia-smi exists its query (utilisation, power) and full output are saved."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--query-gpu=index,name,utilization.gpu,power.draw,memory.used" ]; then\n'
        '  echo "index, name, utilization.gpu [%], power.draw [W], memory.used [MiB]"\n'
        '  echo "0, NVIDIA H100, 0 %, 71.3 W, 70000 MiB"\n'
        "else\n"
        '  echo "| NVIDIA-SMI 560.35 |"\n'
        "fi\n"
    )
    smi.chmod(0o755)
    deps = EvidenceDeps(settings_for(tmp_path, nvidia_smi_path=str(smi)))
    result = await capture_bundle(request_for(ProcessSelector(pid=dead_pid())), deps)
    assert result.bundle is not None
    text = (result.bundle / "nvidia-smi.txt").read_text()
    assert "0, NVIDIA H100, 0 %, 71.3 W, 70000 MiB" in text
    assert "| NVIDIA-SMI 560.35 |" in text
    assert summary_of(result)["nvidia_smi"]["status"] == "ok"


async def test_failing_nvidia_smi_is_a_recorded_failure(tmp_path: Path) -> None:
    """nvidia-smi exiting non-zero (driver gone) is recorded with its message."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(0o755)
    deps = EvidenceDeps(settings_for(tmp_path, nvidia_smi_path=str(smi)))
    result = await capture_bundle(request_for(ProcessSelector(pid=dead_pid())), deps)
    failure = next(f for f in result.failures if f.startswith("nvidia-smi:"))
    assert "NVIDIA-SMI has failed" in failure


async def test_complete_of_missing_bundle_writes_a_one_shot_bundle(tmp_path: Path) -> None:
    """Completing a bundle that is gone writes a full wedge bundle and says why."""
    deps = EvidenceDeps(settings_for(tmp_path))
    gone = tmp_path / "evidence" / "20261201T000000Z_local_engine0_deferred_stall"
    request = request_for(
        ProcessSelector(pid=dead_pid()),
        phase=CapturePhase.WEDGED,
        bundle=gone,
        metrics_body=WEDGED_BODY,
    )
    result = await complete_bundle(gone, request, deps)
    assert result.bundle is not None
    assert result.bundle != gone
    assert result.failures[0].startswith(f"suspect bundle {gone} unusable")
    assert summary_of(result)["verdict"] == "wedged"
    assert (result.bundle / "metrics_wedged.prom").read_bytes() == WEDGED_BODY


async def test_resolved_suspect_bundle_is_routine(tmp_path: Path) -> None:
    """A suspect episode that resolved is marked so and counts as routine for retention."""
    deps = EvidenceDeps(settings_for(tmp_path))
    result = await open_bundle(request_for(ProcessSelector(pid=dead_pid())), deps)
    assert result.bundle is not None
    assert resolve_bundle(result.bundle, deps, "engine recovered") is None
    summary = summary_of(result)
    assert summary["verdict"] == "resolved"
    assert summary["resolution"] == "engine recovered"
    assert [x.wedge for x in scan_bundles(tmp_path / "evidence")] == [False]
    assert resolve_bundle(tmp_path, deps) == f"{tmp_path}: cannot mark resolved: " + (
        f"[Errno 2] No such file or directory: '{tmp_path / 'summary.json'}'"
    )


async def test_cut_off_wedged_round_marks_the_bundle_wedged(tmp_path: Path) -> None:
    """A wedged round cut off at its limit leaves a summary that says wedged, with the failure."""
    deps = EvidenceDeps(settings_for(tmp_path))
    result = await open_bundle(request_for(ProcessSelector(pid=dead_pid())), deps)
    assert result.bundle is not None
    assert mark_cut_off(result.bundle, deps, "evidence capture did not finish within 9 s") is None
    summary = summary_of(result)
    assert summary["verdict"] == "wedged"
    assert summary["phases"]["wedged"] == {
        "failures": ["evidence capture did not finish within 9 s"],
        "cut_off": True,
    }
    assert "evidence capture did not finish within 9 s" in summary["failures"]
    assert [x.wedge for x in scan_bundles(tmp_path / "evidence")] == [True]


async def test_retention_runs_after_each_capture(tmp_path: Path) -> None:
    """Old routine bundles are evicted after a capture; the new bundle is kept."""
    root = tmp_path / "evidence"
    for hour in range(3):
        fake_bundle(root, f"20200101T0{hour}0000Z_local_manual", "manual")
    deps = EvidenceDeps(settings_for(tmp_path, evidence_keep=2))
    result = await capture_bundle(request_for(ProcessSelector(pid=dead_pid())), deps)
    assert result.evicted == ("20200101T000000Z_local_manual", "20200101T010000Z_local_manual")
    assert result.bundle is not None
    assert sorted(p.name for p in root.iterdir()) == sorted(
        ["20200101T020000Z_local_manual", result.bundle.name]
    )


# ---------------------------------------------------------------- captures of real trees


@pytest.fixture(scope="module")
def tree() -> Iterator[StandinTree]:
    """One stand-in vLLM tree (scheduler wedge) shared by this module's captures."""
    with standin_tree("scheduler_wedge") as running:
        yield running


def url_of(tree: StandinTree) -> ProcessSelector:
    """Selector that finds the tree from its listening port."""
    return ProcessSelector(url=f"http://127.0.0.1:{tree.port}/metrics")


@pytest.mark.slow
async def test_suspect_then_wedged_bundle(
    tree: StandinTree, tmp_path: Path, umask_zero: None
) -> None:
    """Phase 1 writes everything; phase 2 adds the wedge's metrics and stacks and says wedged."""
    deps = EvidenceDeps(settings_for(tmp_path))
    suspect = await capture_bundle(request_for(url_of(tree)), deps)
    assert suspect.complete, suspect.failures
    assert suspect.bundle is not None
    bundle = suspect.bundle
    assert bundle.name.endswith("_local_engine0_deferred_stall")
    stems = [
        f"api_server-{tree.api_pid}",
        f"engine_core-{tree.engine_pid}",
        *(f"worker-{pid}" for pid in tree.worker_pids),
    ]
    expected = {
        "summary.json",
        "metrics_suspect.prom",
        "history.jsonl",
        "processes.json",
        "build.json",
        "pyspy",
        *(f"pyspy/{s}.{ext}" for s in stems for ext in ("json", "txt")),
    }
    assert set(modes(bundle)) - {"."} == expected
    assert suspect.triage.kind is TriageKind.SCHEDULER_WEDGE
    summary = summary_of(suspect)
    assert summary["verdict"] == "suspect"
    assert summary["family"] == "deferred_stall"
    assert summary["engine_labels"] == {"model_name": "m", "engine": "0"}
    assert summary["thresholds"] == {"stall_after_seconds": 30.0}
    assert summary["pids"] == {
        "api_server": [tree.api_pid],
        "engine_core": [tree.engine_pid],
        "worker": list(tree.worker_pids),
        "other": [],
    }
    assert summary["triage"]["kind"] == "scheduler_wedge"
    phase = summary["phases"]["suspect"]
    assert {s["status"] for s in phase["stacks"]} == {"ok"}
    # The suspect round never pauses a process: one nonblocking JSON run each, text rendered.
    assert phase["pyspy_mode"] == "nonblocking"
    # (A torn read of a running process is repeated, nonblocking again, at most 3 times.)
    for stack in phase["stacks"]:
        runs = {(a["output"], a["native"], a["nonblocking"]) for a in stack["attempts"]}
        assert runs == {("json", False, True)}, stack
        assert 1 <= len(stack["attempts"]) <= 3
    engine_txt = (bundle / f"pyspy/engine_core-{tree.engine_pid}.txt").read_text()
    assert "rendered from py-spy dump --json --nonblocking" in engine_txt
    assert phase["nvidia_smi"]["message"] == NVIDIA_SMI_NOT_FOUND
    assert set(phase["durations"]) == {
        "discovery_seconds",
        "stacks_seconds",
        "pyspy_seconds",
        "profile_seconds",
        "write_seconds",
    }
    assert phase["durations"]["profile_seconds"] == 0  # no profile before the wedge
    assert phase["profiles"] == []
    assert summary["wedgewatch_version"]
    assert summary["host"]
    build = json.loads((bundle / "build.json").read_text())
    assert build["api_server_pid"] == tree.api_pid
    assert "standin_tree.py" in " ".join(build["command_line"])
    assert build["engine_core_pid"] == tree.engine_pid
    assert isinstance(build["engine_env"], dict)
    # The stand-in's API server closes every connection: /version is recorded as failed.
    assert build["version"]["status"] == "failed"
    assert build["version"]["url"].endswith("/version")
    assert summary["vllm_version"] is None
    assert isinstance(summary["known_issues"], list)
    processes = json.loads((bundle / "processes.json").read_text())["processes"]
    engine = next(p for p in processes if p["role"] == "engine_core")
    assert engine["title"] == "VLLM::EngineCore"
    assert engine["cpu_percent"] is not None
    assert engine["num_threads"] >= 2
    assert (bundle / "history.jsonl").read_text().count("\n") == 1

    wedged = await capture_bundle(
        request_for(
            url_of(tree),
            phase=CapturePhase.WEDGED,
            bundle=bundle,
            metrics_body=WEDGED_BODY,
            history=[{"at": float(i)} for i in range(5)],
            verdict={
                "state": "wedged",
                "reason": "deferred stall for 31 s",
                "verdict_timestamp": 1_796_000_015.0,
            },
            verdict_at=15.0,
        ),
        deps,
    )
    assert wedged.complete, wedged.failures
    assert wedged.bundle == bundle
    assert wedged.triage.kind is TriageKind.SCHEDULER_WEDGE
    assert any(d.startswith("suspect:") for d in wedged.triage.details)
    assert any(d.startswith("wedged:") for d in wedged.triage.details)
    assert (bundle / "metrics_suspect.prom").read_bytes() == SUSPECT_BODY
    assert (bundle / "metrics_wedged.prom").read_bytes() == WEDGED_BODY
    assert (bundle / f"pyspy/wedged/engine_core-{tree.engine_pid}.json").is_file()
    assert (bundle / "processes_wedged.json").is_file()
    assert (bundle / "history.jsonl").read_text().count("\n") == 5
    summary = summary_of(wedged)
    assert summary["verdict"] == "wedged"
    assert summary["reason"] == "deferred stall for 31 s"
    # The wedge's verdict, not the suspect verdict that opened the bundle (verdict_at 0.0).
    assert (summary["verdict_at"], summary["verdict_timestamp"]) == (15.0, 1_796_000_015.0)
    assert set(summary["phases"]) == {"suspect", "wedged"}
    wedge_round = summary["phases"]["wedged"]
    assert wedge_round["pyspy_mode"] == "blocking"  # the engine is stuck anyway
    assert all(not a["nonblocking"] for s in wedge_round["stacks"] for a in s["attempts"])
    # The wedge round samples the EngineCore (only it), nonblocking, into a folded file.
    (profile,) = wedge_round["profiles"]
    assert profile["pid"] == tree.engine_pid
    assert (profile["status"], profile["nonblocking"]) == ("ok", True), profile
    assert profile["file"] == f"profile-enginecore-{tree.engine_pid}.folded"
    assert profile["samples"] > 0
    assert profile["top_stacks"][0]["stack"]
    folded = (bundle / profile["file"]).read_text()
    assert "run_busy_loop" in folded
    assert wedge_round["durations"]["profile_seconds"] > 1  # py-spy samples for ~2 s
    assert any(
        d.startswith(f"profile: engine_core pid {tree.engine_pid}: ") for d in wedged.triage.details
    )
    assert_private(bundle)
    assert not list(bundle.rglob(".*.tmp"))


@pytest.mark.slow
async def test_one_shot_wedge_bundle(tree: StandinTree, tmp_path: Path) -> None:
    """A wedge without a suspect bundle gets a complete bundle in one call (here without
    the sampled profile: `profile_seconds = 0` turns it off)."""
    deps = EvidenceDeps(settings_for(tmp_path, profile_seconds=0))
    result = await capture_bundle(
        request_for(url_of(tree), phase=CapturePhase.WEDGED, metrics_body=WEDGED_BODY), deps
    )
    assert result.complete, result.failures
    assert result.bundle is not None
    assert (result.bundle / "metrics_wedged.prom").read_bytes() == WEDGED_BODY
    assert (result.bundle / f"pyspy/engine_core-{tree.engine_pid}.txt").is_file()
    summary = summary_of(result)
    assert summary["verdict"] == "wedged"
    assert list(summary["phases"]) == ["wedged"]
    assert summary["phases"]["wedged"]["profiles"] == []
    assert not list(result.bundle.glob("profile-*"))
    assert not any(d.startswith("profile:") for d in result.triage.details)
    assert result.since_verdict_seconds is not None


@pytest.mark.slow
async def test_manual_capture_by_pid(tree: StandinTree, tmp_path: Path) -> None:
    """`wedgewatch capture --pid` style: family manual, the pid's subtree, no engine label."""
    deps = EvidenceDeps(settings_for(tmp_path))
    request = CaptureRequest(
        target=f"pid{tree.api_pid}",
        selector=ProcessSelector(pid=tree.api_pid),
        metrics_body=SUSPECT_BODY,
    )
    result = await capture_bundle(request, deps)
    assert result.bundle is not None
    assert result.bundle.name.endswith(f"_pid{tree.api_pid}_manual")
    assert (result.bundle / "metrics_manual.prom").is_file()
    summary = summary_of(result)
    assert summary["family"] == "manual"
    assert summary["selector"] == f"pid {tree.api_pid}"
    assert summary["triage"]["kind"] == "scheduler_wedge"


@pytest.mark.slow
async def test_permission_denied_is_recorded_and_counted(tree: StandinTree, tmp_path: Path) -> None:
    """py-spy without ptrace rights: every process is counted, the fix is spelled out."""
    prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    deps = EvidenceDeps(
        settings_for(tmp_path), dumper=PySpyRunner(timeout_seconds=20, argv_prefix=prefix)
    )
    result = await capture_bundle(request_for(url_of(tree)), deps)
    assert result.ptrace_denied == 4
    assert result.triage.kind is TriageKind.NO_STACKS
    assert any(PTRACE_FIX in f for f in result.failures)
    summary = summary_of(result)
    assert summary["ptrace_denied"] == 4
    assert {s["status"] for s in summary["phases"]["suspect"]["stacks"]} == {"permission_denied"}
    assert {s["fix"] for s in summary["phases"]["suspect"]["stacks"]} == {PTRACE_FIX}
    assert result.bundle is not None
    assert (result.bundle / "processes.json").is_file()
    assert not (result.bundle / "pyspy").exists()


@pytest.mark.slow
async def test_deadline_bounds_a_hanging_capture(tree: StandinTree, tmp_path: Path) -> None:
    """A py-spy hanging past the capture deadline is cancelled and recorded; the bundle is saved."""
    marker = tmp_path / "pids"
    hang = tmp_path / "py-spy"
    hang.write_text(f"#!/bin/sh\necho $$ >> {marker}\nexec sleep 60\n")
    hang.chmod(0o755)
    deps = EvidenceDeps(
        settings_for(
            tmp_path, pyspy_path=str(hang), pyspy_timeout_seconds=60, capture_deadline_seconds=1.0
        )
    )
    result = await capture_bundle(request_for(url_of(tree)), deps)
    assert result.deadline_exceeded
    assert f"py-spy engine_core {tree.engine_pid}: cancelled at the capture deadline" in (
        result.failures
    )
    assert result.duration_seconds < 30  # far below the 60 s py-spy would have hung
    summary = summary_of(result)
    assert summary["phases"]["suspect"]["deadline_exceeded"] is True
    for pid in marker.read_text().split():
        assert gone_or_zombie(int(pid))


@pytest.fixture
def secret_process() -> Iterator[int]:
    """A Python process whose command line carries an API key."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; print('ready', flush=True); time.sleep(60)",
            "--api-key",
            "sk-very-secret",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    yield proc.pid
    proc.kill()
    proc.wait()
    proc.stdout.close()


@pytest.mark.slow
async def test_secrets_in_command_lines_stay_out_of_the_bundle(
    secret_process: int, tmp_path: Path
) -> None:
    """An `--api-key` value appears nowhere in the bundle, py-spy's text header included."""
    deps = EvidenceDeps(settings_for(tmp_path))
    result = await capture_bundle(request_for(ProcessSelector(pid=secret_process)), deps)
    assert result.bundle is not None
    texts = [p.read_text() for p in result.bundle.rglob("*") if p.is_file()]
    assert any("--api-key ***" in t for t in texts)
    assert not any("sk-very-secret" in t for t in texts)


@pytest.mark.slow
async def test_collective_hang_tree_is_triaged(tmp_path: Path) -> None:
    """A tree hung in a collective is named as such in the summary."""
    deps = EvidenceDeps(settings_for(tmp_path))
    with standin_tree("collective_hang") as hung:
        result = await capture_bundle(
            request_for(url_of(hung), phase=CapturePhase.WEDGED, family="progress_stall"), deps
        )
    assert summary_of(result)["triage"]["kind"] == "collective_hang"


def wait_stopped(pid: int) -> None:
    """Until /proc shows the (not our child) process stopped: there is no event to await."""
    while read_proc_state(pid).word != "stopped":
        time.sleep(0.01)


@pytest.mark.slow
async def test_a_stopped_worker_is_read_named_and_left_stopped(tmp_path: Path) -> None:
    """A stand-in worker SIGSTOPped (a hung collective tree, so the stacks alone would say
    collective_hang): the wedge bundle says in words that it is stopped, with its /proc state
    and kernel wait, triage names it, the report shows it, and it is never resumed."""
    deps = EvidenceDeps(settings_for(tmp_path, profile_seconds=0))
    with standin_tree("collective_hang") as hung:
        worker = hung.worker_pids[1]
        os.kill(worker, signal.SIGSTOP)
        try:
            wait_stopped(worker)
            result = await capture_bundle(
                request_for(url_of(hung), phase=CapturePhase.WEDGED, family="progress_stall"),
                deps,
            )
            assert read_proc_state(worker).word == "stopped"  # left as found
        finally:
            os.kill(worker, signal.SIGCONT)
    summary = summary_of(result)
    assert summary["triage"]["kind"] == "process_stopped"
    assert summary["triage"]["summary"] == (
        f"worker pid {worker} (VLLM::Worker_TP1) is stopped (SIGSTOP or a debugger): "
        "the engine waits for it"
    )
    record = next(r for r in summary["phases"]["wedged"]["stacks"] if r["pid"] == worker)
    assert record["why"].startswith(f"process {worker} state T: stopped (SIGSTOP or a debugger)")
    assert record["process_state"]["state"] == "T"
    assert not record["resumed_target"]
    assert all(a["nonblocking"] for a in record["attempts"])
    if os.geteuid() == 0:
        assert record["process_state"]["wchan"] == "do_signal_stop"
        assert "do_signal_stop" in record["process_state"]["kernel_stack"]
    assert result.bundle is not None
    model = read_bundle(result.bundle)
    html, md = render_html(model, None), render_markdown(model)
    for page in (html, md):
        assert f"worker pid {worker} (VLLM::Worker_TP1) is stopped" in page
        assert f"process {worker} state T: stopped (SIGSTOP or a debugger)" in page
