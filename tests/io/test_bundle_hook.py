"""The `on_bundle` hook (io/bundle_hook.py) and the shipped deploy/hooks/upload-bundle.sh, with
real commands: the environment it gets, failures and timeouts as data, and the script's
choice of tool for each destination (fake `aws`, `gsutil`, `rclone` on PATH record argv).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from wedgewatch.io.bundle_hook import BundleHook
from wedgewatch.io.restarters import EXEC_INHERITED_VARIABLES

UPLOAD = Path(__file__).resolve().parents[2] / "deploy" / "hooks" / "upload-bundle.sh"

RECORDER = """#!{python}
import json, os, sys
with open({out!r}, "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
"""


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def bundle(tmp_path: Path) -> Path:
    """A small bundle directory as wedgewatch writes it."""
    path = tmp_path / "evidence" / "20261203T120000Z-vllm-0-deferred_stall"
    (path / "pyspy").mkdir(parents=True)
    (path / "summary.json").write_text(json.dumps({"verdict": "wedged"}))
    (path / "pyspy" / "engine_core-1.txt").write_text("Thread 1 (idle)\n")
    return path


async def test_the_hook_gets_the_bundle_and_only_the_minimal_environment(tmp_path: Path) -> None:
    """argv + [bundle]; PATH, HOME, ... and the WEDGEWATCH_* of the bundle; no secret."""
    out = tmp_path / "seen.json"
    recorder = script(
        tmp_path / "bin" / "hook", RECORDER.format(python=sys.executable, out=str(out))
    )
    parent = {
        "PATH": os.environ["PATH"],
        "HOME": "/home/ops",
        "LANG": "C.UTF-8",
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "WEDGEWATCH_WEBHOOK_URLS": "https://hooks.example/secret-token",
    }
    hook = BundleHook([str(recorder), "s3://bucket/prefix"], timeout_seconds=30, env=parent)
    where = bundle(tmp_path)
    outcome = await hook.run(where, target="vllm", phase="wedged")
    assert outcome.result == "ok", outcome
    seen = json.loads(out.read_text())
    assert seen["argv"][1:] == ["s3://bucket/prefix", str(where)]
    env = seen["env"]
    assert env["WEDGEWATCH_BUNDLE"] == str(where)
    assert (env["WEDGEWATCH_TARGET"], env["WEDGEWATCH_PHASE"]) == ("vllm", "wedged")
    assert (env["HOME"], env["LANG"]) == ("/home/ops", "C.UTF-8")
    allowed = {
        *EXEC_INHERITED_VARIABLES,
        "WEDGEWATCH_BUNDLE",
        "WEDGEWATCH_TARGET",
        "WEDGEWATCH_PHASE",
    }
    extra = set(env) - allowed - {"PWD", "SHLVL", "_", "LC_CTYPE"}  # set by the interpreter
    assert extra == set(), extra
    assert "hunter2" not in json.dumps(env)
    assert "secret-token" not in json.dumps(env)


async def test_a_failing_hook_is_an_outcome_with_its_stderr(tmp_path: Path) -> None:
    failing = script(tmp_path / "fail", "#!/bin/sh\necho 'bucket does not exist' >&2\nexit 3\n")
    outcome = await BundleHook([str(failing)], timeout_seconds=30).run(
        bundle(tmp_path), target="vllm", phase="wedged"
    )
    assert outcome.result == "failed"
    assert "exit status 3" in outcome.detail
    assert "bucket does not exist" in outcome.detail


async def test_a_missing_program_is_a_failed_outcome(tmp_path: Path) -> None:
    outcome = await BundleHook([str(tmp_path / "nope")], timeout_seconds=30).run(
        bundle(tmp_path), target="vllm", phase="wedged"
    )
    assert outcome.result == "failed"
    assert "was not found" in outcome.detail


async def test_a_hook_past_its_deadline_is_killed_with_its_whole_group(tmp_path: Path) -> None:
    """A hook that hangs (and started a child) is killed after the timeout, child and all."""
    pid_file = tmp_path / "child.pid"
    hanging = script(tmp_path / "hang", f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nwait\n")
    outcome = await BundleHook([str(hanging)], timeout_seconds=1.0).run(
        bundle(tmp_path), target="vllm", phase="wedged"
    )
    assert outcome.result == "timeout"
    assert "did not finish within" in outcome.detail
    child = int(pid_file.read_text())
    # SIGKILL is delivered at once but a loaded machine may not have run the exit yet: give
    # the killed child a bounded moment to go, then it must be gone (or a zombie).
    with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
        psutil.Process(child).wait(timeout=10)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("argv", [[], [""]])
def test_a_hook_needs_a_program(argv: list[str]) -> None:
    with pytest.raises(ValueError, match="on_bundle must start with the program to run"):
        BundleHook(argv, timeout_seconds=1)


# -- deploy/hooks/upload-bundle.sh ------------------------------------------------------------


async def test_upload_script_copies_to_a_directory_whole(tmp_path: Path) -> None:
    """DEST a directory: the bundle lands complete at DEST/NAME, no partial copy left."""
    where = bundle(tmp_path)
    dest = tmp_path / "shipped"
    outcome = await BundleHook([str(UPLOAD), str(dest)], timeout_seconds=30).run(
        where, target="vllm", phase="wedged"
    )
    assert outcome.result == "ok", outcome
    copied = dest / where.name
    assert (copied / "summary.json").read_text() == (where / "summary.json").read_text()
    assert (copied / "pyspy" / "engine_core-1.txt").exists()
    assert sorted(p.name for p in dest.iterdir()) == [where.name]


@pytest.mark.parametrize(
    ("dest", "tool", "expected"),
    [
        pytest.param(
            "s3://bucket/ww/", "aws",
            ["s3", "cp", "--recursive", "--only-show-errors", "{bundle}", "s3://bucket/ww/{name}"],
            id="s3",
        ),
        pytest.param(
            "gs://bucket/ww", "gsutil", ["-q", "-m", "cp", "-r", "{bundle}", "gs://bucket/ww/"],
            id="gcs",
        ),
        pytest.param("remote:ww", "rclone", ["copy", "{bundle}", "remote:ww/{name}"], id="rclone"),
    ],
)  # fmt: skip
async def test_upload_script_picks_the_tool_of_the_destination(
    tmp_path: Path, dest: str, tool: str, expected: list[str]
) -> None:
    """The documented command line of each tool, found on the hook's PATH."""
    out = tmp_path / "argv.json"
    fake_bin = tmp_path / "fakebin"
    script(fake_bin / tool, RECORDER.format(python=sys.executable, out=str(out)))
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin"}
    where = bundle(tmp_path)
    outcome = await BundleHook([str(UPLOAD), dest], timeout_seconds=30, env=env).run(
        where, target="vllm", phase="wedged"
    )
    assert outcome.result == "ok", outcome
    argv = json.loads(out.read_text())["argv"][1:]
    assert argv == [part.format(bundle=where, name=where.name) for part in expected]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["s3://bucket"], "aws not found on PATH", id="no-aws"),
        pytest.param(["ftp.example"], "unknown destination ftp.example", id="unknown"),
    ],
)
async def test_upload_script_says_what_is_missing(
    tmp_path: Path, args: list[str], message: str
) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    outcome = await BundleHook([str(UPLOAD), *args], timeout_seconds=30, env=env).run(
        bundle(tmp_path), target="vllm", phase="wedged"
    )
    assert outcome.result == "failed"
    assert message in outcome.detail


async def test_upload_script_refuses_a_directory_that_is_not_a_bundle(tmp_path: Path) -> None:
    other = tmp_path / "not-a-bundle"
    other.mkdir()
    outcome = await BundleHook([str(UPLOAD), str(tmp_path / "d")], timeout_seconds=30).run(
        other, target="vllm", phase="wedged"
    )
    assert outcome.result == "failed"
    assert "is not a wedgewatch bundle" in outcome.detail
