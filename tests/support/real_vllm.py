"""A real `vllm serve` on a CPU for the real-server tier: vLLM's CPU build and a tiny local model.

The serving venvs are built by `bash wedgewatch/lab/real/install-vllm.sh --serve VERSION` into the
same cache as the scheduler venvs (tests/support/vllm_venvs.py); the tiny model
(wedgewatch/lab/real/tiny_model.py) is made once per recipe into
`${XDG_CACHE_HOME:-~/.cache}/wedgewatch/models/`. Every server runs in its own process group,
with its own VLLM_CACHE_ROOT under the test's directory and its own short TMPDIR, and
`RealServer.stop()` ends the group and removes the /dev/shm files it left (docs/real-vllm.md).

A test reaching `serve_python` is marked `vllm` (tests/support/needs.py): it runs in the real tier.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from tests.support.vllm_venvs import ROOT, complete_python, venv_dir
from wedgewatch.io.procs import read_proc_state
from wedgewatch.lab.demo_real import server_environment

SERVE_VERSIONS = ("0.30.0", "0.32.0")
MODEL_NAME = "tiny"
KV_CACHE_BYTES = 64 * 1024 * 1024
START_DEADLINE_S = 900.0  # a cold start on a busy 2-core machine; ~40 s when quiet
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wedgewatch"


def serve_venv(version: str) -> Path:
    """The cache directory of the serving vLLM `version` venv (built or not)."""
    return venv_dir(version, serve=True)


def serve_python(version: str) -> Path:
    """The python of the complete serving venv for `version`; else skip (fail under --real)."""
    return complete_python(version, serve=True)


def tiny_model(python: Path) -> Path:
    """The tiny model's directory in the cache, made (once, under a lock) with `python`."""
    models = CACHE / "models"
    models.mkdir(parents=True, exist_ok=True)
    out = models / "tiny-llama"
    with open(models / "tiny-llama.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(
            [str(python), "-m", "wedgewatch.lab.real.tiny_model", str(out)],
            env=serve_env(),
            check=True,
            capture_output=True,
            timeout=600,
        )
    return out


def serve_env(**extra: str) -> dict[str, str]:
    """The environment a real CPU vLLM needs here: the demo's own (wedgewatch/lab/demo_real.py,
    docs/real-vllm.md), with `extra` on top."""
    env = server_environment(ROOT, Path(tempfile.gettempdir()), CACHE / "vllm-cache")
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _shm_entries() -> set[str]:
    try:
        return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("vllm")}
    except OSError:
        return set()


@dataclass
class RealServer:
    """One real `vllm serve` and what it is made of."""

    version: str
    python: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    argv: list[str]
    shm_before: set[str] = field(default_factory=set)
    tmpdir: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def processes(self) -> list[psutil.Process]:
        """The API server and every process below it."""
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def named(self, title: str) -> list[psutil.Process]:
        """The processes whose title starts with `title` (e.g. VLLM::EngineCore, VLLM::Worker)."""
        found = []
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                words = p.cmdline()
                if (words and words[0].startswith(title)) or p.name().startswith(title):
                    found.append(p)
        return found

    def wait_healthy(self, deadline_s: float = START_DEADLINE_S) -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"vllm serve {self.version} exited {self.proc.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            time.sleep(1)
        raise AssertionError(f"vllm serve {self.version} not healthy in time:\n{self.log_tail()}")

    def complete(self, prompt: Sequence[int] | str, max_tokens: int = 16, **kw: object) -> dict:  # type: ignore[type-arg]
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, **kw}
        r = self.client.post(f"{self.url}/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    @functools.cached_property
    def client(self) -> httpx.Client:
        """One client shared by every thread: a new httpx client per request builds an SSL
        context first (tens of ms under the GIL and OpenSSL's locks), and 20 threads doing so
        reached the server one request at a time (running 1, waiting 0), so no load stood.
        No keep-alive: a connection the server closed while it was stopped must not be reused
        for a POST (httpx does not retry one: "Server disconnected without sending a
        response")."""
        return httpx.Client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=0))

    def stop(self) -> None:
        """End the whole process group (SIGCONT first: a stopped member would hold it up)."""
        if "client" in self.__dict__:
            self.client.close()
        pgid = self.proc.pid
        for sig in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        end = time.monotonic() + 30
        while time.monotonic() < end and _group_alive(pgid):
            time.sleep(0.2)
        for name in _shm_entries() - self.shm_before:
            with contextlib.suppress(OSError):
                (Path("/dev/shm") / name).unlink()
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def metric_sum(url: str, name: str) -> float:
    """The sum of a metric's samples on the server at `url` (its /metrics), 0 when it does not
    answer (a server restarting or gone reads as nothing running)."""
    try:
        body = httpx.get(f"{url.rstrip('/')}/metrics", timeout=30).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name == name
    )


def wait_running(url: str, deadline_s: float = 300) -> None:
    """Until the server reports requests running and tokens made: the engine is stepping."""
    end = time.monotonic() + deadline_s
    while not (
        metric_sum(url, "vllm:num_requests_running") > 0
        and metric_sum(url, "vllm:generation_tokens_total") > 0
    ):
        assert time.monotonic() < end, "the load never showed on /metrics"
        time.sleep(0.2)


def wait_stopped(pid: int, deadline_s: float = 120) -> None:
    """Until /proc shows the process stopped (a SIGSTOP takes effect when it next runs)."""
    end = time.monotonic() + deadline_s
    while read_proc_state(pid).word != "stopped":
        assert time.monotonic() < end, read_proc_state(pid)
        time.sleep(0.05)


FROZEN_CHECK_S = 3.0
"""How long after a stop /metrics is read to decide whether the stop counts: a step that
ended just before the stop has published its gauges to the API server by then, even on a
starved machine."""


def stop_while_running(url: str, pids: Sequence[int], tries: int = 20) -> None:
    """SIGSTOP the processes (the workers) at a moment /metrics shows requests running, and
    keep them stopped only if the frozen gauges still say so.

    vLLM publishes its gauges after a step. A stop that lands between two requests (the last
    step finished one, the next step waits for the stopped worker) leaves /metrics at idle for
    ever, which no reading of /metrics can tell from idle (only the canary can): seen on the
    2-core CI machine, where the server took the load's requests one at a time. Such a stop is
    resumed and tried again."""
    for _ in range(tries):
        wait_running(url)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        for pid in pids:
            wait_stopped(pid)
        time.sleep(FROZEN_CHECK_S)
        if metric_sum(url, "vllm:num_requests_running") > 0:
            return
        sys.stderr.write(f"stop_while_running: {list(pids)} stopped with /metrics idle: resumed\n")
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    raise AssertionError(f"never stopped {list(pids)} with a request running in {tries} tries")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve_argv(
    python: Path, model: Path, port: int, extra: Sequence[str] = (), tp: int = 1
) -> list[str]:
    argv = [
        str(python.parent / "vllm"),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL_NAME,
        "--max-model-len",
        "512",
        "--dtype",
        "bfloat16",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
    ]
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    return argv + list(extra)


def start(
    version: str,
    workdir: Path,
    *,
    extra_args: Sequence[str] = (),
    tp: int = 1,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> RealServer:
    """Start a real `vllm serve` (not yet healthy: call `wait_healthy`)."""
    python = serve_python(version)
    model = tiny_model(python)
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    # A short TMPDIR of its own: vLLM puts its ZMQ IPC sockets there, and a path under
    # pytest's tmp_path can pass the 107-byte limit of a socket path (ZMQError).
    tmp = Path(tempfile.mkdtemp(prefix="ww-vllm-", dir="/tmp"))
    extra_env = {"VLLM_CACHE_ROOT": str(workdir / "vllm-cache"), "TMPDIR": str(tmp)}
    if tp > 1:
        extra_env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i) for i in range(tp))
    extra_env.update(env or {})
    argv = serve_argv(python, model, port, extra_args, tp)
    log = workdir / f"vllm-serve-{port}.log"
    shm_before = _shm_entries()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=serve_env(**extra_env),
            # Its own process group (stop() ends it with killpg), in the test's session: a busy
            # CPU vLLM in a session of its own starved the test process for as long as it was
            # busy (13 s without a time slice, kernel 6.18 with sched_autogroup on, 2 cores), so
            # a test reading /metrics saw the queue it made only after it had drained
            # (docs/real-vllm.md, "A starved observer").
            process_group=0,
            cwd=workdir,
        )
    return RealServer(version, python, port, proc, log, argv, shm_before, tmp)


@contextlib.contextmanager
def running(
    version: str,
    workdir: Path,
    *,
    extra_args: Sequence[str] = (),
    tp: int = 1,
    env: dict[str, str] | None = None,
) -> Iterator[RealServer]:
    """A healthy real `vllm serve`, stopped (group and leftovers) however the block ends."""
    server = start(version, workdir, extra_args=extra_args, tp=tp, env=env)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()
