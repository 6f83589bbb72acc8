"""nvidia-smi for an evidence bundle: the GPUs' utilisation, power and memory, and the full
status page, each under a deadline (a wedged GPU can hang nvidia-smi too)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from typing import Any

from wedgewatch.io.runner import run_command

NVIDIA_SMI_NOT_FOUND = "nvidia-smi not found"
#: nvidia-smi's full output is a few KB per GPU; more than this is kept only in part.
NVIDIA_SMI_OUTPUT_BYTES = 1024 * 1024
NVIDIA_SMI_ERROR_BYTES = 2000
NVIDIA_SMI_QUERY = (
    "--query-gpu=index,name,utilization.gpu,power.draw,memory.used",
    "--format=csv",
)


async def _run_command(argv: Sequence[str], timeout_seconds: float) -> tuple[int | None, str, str]:
    """(exit code, -1 if it could not start, None on timeout; stdout; error text)."""
    result = await run_command(
        argv,
        timeout_seconds=timeout_seconds,
        stdout_bytes=NVIDIA_SMI_OUTPUT_BYTES,
        stderr_bytes=NVIDIA_SMI_ERROR_BYTES,
    )
    if result.start_error is not None:
        exc = result.start_error
        return -1, "", f"cannot start {argv[0]}: {exc.strerror or exc}"
    if result.timed_out:
        return None, "", f"{argv[0]} did not finish within {timeout_seconds:g} s; killed"
    return (
        result.returncode,
        result.stdout.decode("utf-8", errors="replace"),
        result.stderr.decode("utf-8", errors="replace"),
    )


async def count_gpus(exe: str, timeout_seconds: float) -> int | None:
    """GPUs that `nvidia-smi -L` lists (0 when it fails); None when it cannot run or hangs."""
    code, out, _ = await _run_command([exe, "-L"], timeout_seconds)
    if code is None or code == -1:
        return None
    if code != 0:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


async def nvidia_smi(path: str, timeout_seconds: float) -> tuple[dict[str, Any], bytes | None]:
    """(summary entry, file contents) for nvidia-smi's utilisation/power query and full output.

    `path` is the configured executable (looked up on PATH); each of the two runs gets
    `timeout_seconds`. Failures are recorded in the entry, never raised.
    """
    exe = shutil.which(path)
    if exe is None:
        return {"status": "not_found", "message": NVIDIA_SMI_NOT_FOUND}, None
    query, plain = await asyncio.gather(
        _run_command([exe, *NVIDIA_SMI_QUERY], timeout_seconds),
        _run_command([exe], timeout_seconds),
    )
    sections: list[str] = []
    errors: list[str] = []
    for title, (code, out, err) in (
        (f"$ nvidia-smi {' '.join(NVIDIA_SMI_QUERY)}", query),
        ("$ nvidia-smi", plain),
    ):
        sections.append(f"{title}\n{out}")
        if code != 0:
            errors.append(f"{title}: " + (err.strip() or f"exit code {code}"))
    entry: dict[str, Any] = {"status": "ok" if not errors else "failed", "path": exe}
    if errors:
        entry["errors"] = errors
    return entry, "\n".join(sections).encode()
