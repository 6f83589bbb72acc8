"""Start `wedgewatch sim serve` (or the `vllm` shim) as a real child process for tests."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

WEDGEWATCH = [sys.executable, "-m", "wedgewatch"]
READY = re.compile(r"Starting vLLM API server 0 on http://([^\s:]+):(\d+)")
PY_SPY = str(Path(sys.executable).parent / "py-spy")
LAUNCHER_FLAGS = [
    "--tensor-parallel-size", "2",
    "--kv-offloading-size", "60",
    "--kv-offloading-backend", "native",
    "--max-num-seqs", "6",
    "--max-num-batched-tokens", "4096",
    "--enable-prefix-caching",
    "--enable-chunked-prefill",
]  # fmt: skip
PROGRESS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:num_preemptions_total",
    "vllm:iteration_tokens_total_count",
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class SimProcess:
    """One simulator in its own session (so the whole tree can be stopped at once)."""

    def __init__(
        self,
        log_path: Path,
        flags: Sequence[str],
        *,
        argv: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log_path = log_path
        command = list(argv) if argv is not None else [*WEDGEWATCH, "sim", "serve", "tiny"]
        command += ["--host", "127.0.0.1", "--port", "0", "--disable-uvicorn-access-log", *flags]
        with log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
            )
        self.started_at = time.monotonic()
        self.url = ""

    def wait_ready(self, timeout_seconds: float = 30.0) -> SimProcess:
        """Wait for the "Starting vLLM API server" line and remember the URL."""
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            match = READY.search(self.log())
            if match:
                self.url = f"http://{match.group(1)}:{match.group(2)}"
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"simulator did not start; log:\n{self.log()[-4000:]}")

    def log(self) -> str:
        """Everything the simulator printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_log(self, text: str, timeout_seconds: float = 60.0) -> None:
        """Wait until the simulator has printed `text` (a fault it logs as it strikes)."""
        deadline = time.monotonic() + timeout_seconds
        while text not in self.log():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError(
                    f"the simulator never printed {text!r}; log:\n{self.log()[-4000:]}"
                )
            time.sleep(0.05)

    def get(self, path: str, timeout: float = 5.0) -> httpx.Response:
        """GET a path of the server."""
        return httpx.get(self.url + path, timeout=timeout)

    def samples(self) -> Samples:
        """Every sample of GET /metrics, keyed by (name, sorted labels)."""
        text = self.get("/metrics").text
        return {
            (s.name, tuple(sorted(s.labels.items()))): float(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def tree(self) -> list[psutil.Process]:
        """The serving process's descendants."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def titled(self, prefix: str) -> list[psutil.Process]:
        """Descendants whose title (cmdline) starts with `prefix`."""
        found = []
        for child in self.tree():
            with contextlib.suppress(psutil.Error):
                if " ".join(child.cmdline()).startswith(prefix):
                    found.append(child)
        return found

    def wait_exit(self, timeout_seconds: float) -> int | None:
        """The exit code, or None if still running after the timeout."""
        try:
            return self.proc.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL for the whole session if anything is left."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    wanted = set(labels.items())
    matched = [v for (n, ls), v in samples.items() if n == name and wanted <= set(ls)]
    assert matched, f"no sample {name} {labels}"
    return sum(matched)


def progress(samples: Samples) -> tuple[float, ...]:
    """The counters that move only when requests make progress."""
    return tuple(value(samples, name) for name in PROGRESS)


def vllm_samples(samples: Samples) -> Samples:
    """Only the `vllm:` samples."""
    return {k: v for k, v in samples.items() if k[0].startswith("vllm:")}


def py_spy_dump(pid: int) -> str:
    """A real `py-spy dump` of a process."""
    done = subprocess.run(
        [PY_SPY, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class LoadProcess:
    """`wedgewatch sim load` as a child in its own session."""

    def __init__(self, url: str, args: Sequence[str], out_path: Path) -> None:
        self.out_path = out_path
        with out_path.open("wb") as out:
            self.proc = subprocess.Popen(
                [*WEDGEWATCH, "sim", "load", "--url", url, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        """What it printed."""
        return self.out_path.read_text(errors="replace")

    def stop(self) -> None:
        """Kill it and its session."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def running(
    tmp_path: Path, name: str, flags: Sequence[str], **kwargs: object
) -> Iterator[SimProcess]:
    """A ready simulator for the duration of a `with` block."""
    sim = SimProcess(tmp_path / f"{name}.log", flags, **kwargs)  # type: ignore[arg-type]
    try:
        yield sim.wait_ready()
    finally:
        sim.stop()
