"""Resident memory of `wedgewatch run` watching 1 and 20 targets, beside a bare interpreter.

Run: `.venv/bin/python bench/bench_memory.py` (from the repo root; `--seconds N`, default
60; `--baseline-ref REF` to run that commit's daemons too; `--json FILE` to keep the numbers).

Everything runs at once, side by side, so every process sees the same machine: a bare
`python -c 'import time; time.sleep(N)'` (the floor), and for this checkout (and the
baseline's, extracted with `git archive` and run with the same interpreter) one daemon
watching one target and one watching twenty. The targets are loopback servers in this
process answering a real vLLM 0.33.0 `/metrics` body whose generation counter moves on every
scrape; the daemons scrape every second (the default interval) with fresh state and
evidence directories, `remedy = "none"`, py-spy pointed at nothing. After `--seconds` of
scraping, the RSS of each process (psutil) and its peak over the run (sampled each second).

Goals (docs/benchmarks.md, "The daemon's memory"): at most 40 MiB for one target and 48 MiB
for twenty. Exit status 1 when this checkout misses one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from checkouts import extract  # bench/checkouts.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "support"))
from scripted_http import Reply, ScriptedServer  # noqa: E402  (test helper)

BODY = REPO / "tests" / "fixtures" / "vllm-0.33.0" / "healthy_busy.prom"
GOALS_MIB = {1: 40.0, 20: 48.0}
COUNTER = b'vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 37.0'


def busy(number: int, _path: str) -> Reply:
    """The real busy body, its generation counter moving on every scrape."""
    moved = f'vllm:generation_tokens_total{{engine="0",model_name="tiny-llama"}} {37 + number}.0'
    return Reply(body=BODY.read_bytes().replace(COUNTER, moved.encode()))


@contextlib.contextmanager
def servers(count: int) -> Iterator[list[str]]:
    """`count` loopback /metrics servers; their URLs."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(ScriptedServer(busy)).url for _ in range(count)]


def start_daemon(urls: list[str], workdir: Path, tree: Path | None) -> subprocess.Popen[bytes]:
    """`wedgewatch run` watching `urls` (the code under `tree`, else this checkout's)."""
    workdir.mkdir(parents=True)
    lines = [
        'remedy = "none"',
        f'pyspy_path = "{workdir / "no-py-spy-in-the-bench"}"',
        f'state_dir = "{workdir / "state"}"',
        f'evidence_dir = "{workdir / "evidence"}"',
        "listen_port = 0",
        "",
    ]
    for index, url in enumerate(urls):
        lines += ["[[targets]]", f'name = "t{index:02d}"', f'url = "{url}"', ""]
    config = workdir / "wedgewatch.toml"
    config.write_text("\n".join(lines))
    env = {k: v for k, v in os.environ.items() if not k.startswith("WEDGEWATCH_")}
    env.pop("NOTIFY_SOCKET", None)
    if tree is not None:  # the other checkout first on the path, not the current directory
        env.update(PYTHONPATH=str(tree), PYTHONSAFEPATH="1")
    with (workdir / "daemon.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "wedgewatch", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def main() -> int:
    """Run every process at once, print a table, return 1 when a goal is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--baseline-ref", default=None)
    parser.add_argument("--json", type=Path, default=None)
    options = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="wedgewatch-bench-memory-") as tmp, servers(20) as urls:
        work = Path(tmp)
        codes: dict[str, Path | None] = {"now": None}
        if options.baseline_ref is not None:
            codes[f"baseline {options.baseline_ref}"] = extract(options.baseline_ref, work / "b")
        floor = "python -c 'import time; time.sleep(N)'"
        children = {
            floor: subprocess.Popen(
                [sys.executable, "-c", f"import time; time.sleep({options.seconds + 5})"]
            )
        }
        for code, tree in codes.items():
            for count in GOALS_MIB:
                name = f"{code}, {count} target{'s' if count > 1 else ''}"
                children[name] = start_daemon(urls[:count], work / name.replace(" ", "_"), tree)
        peaks = dict.fromkeys(children, 0)
        deadline = time.monotonic() + options.seconds
        while time.monotonic() < deadline:
            for name, child in children.items():
                if child.poll() is not None:
                    raise SystemExit(f"{name} exited {child.returncode}; see {work}")
                peaks[name] = max(peaks[name], psutil.Process(child.pid).memory_info().rss)
            time.sleep(1.0)
        final = {name: psutil.Process(c.pid).memory_info().rss for name, c in children.items()}
        for child in children.values():
            child.terminate()
        for child in children.values():
            child.wait(30)
    mib = 2**20
    print(
        f"# RSS after {options.seconds:.0f} s of scraping, side by side; Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(f"{'process':<44} {'RSS':>9} {'peak':>9}")
    for name in children:
        print(f"{name:<44} {final[name] / mib:>5.1f}MiB {peaks[name] / mib:>5.1f}MiB")
    met = all(
        final[f"now, {count} target{'s' if count > 1 else ''}"] / mib <= goal
        for count, goal in GOALS_MIB.items()
    )
    print(f"goals (1 target <= 40 MiB, 20 targets <= 48 MiB): {'met' if met else 'MISSED'}")
    if options.json is not None:
        document = {
            "rss_mib": {name: final[name] / mib for name in children},
            "peak_rss_mib": {name: peaks[name] / mib for name in children},
            "seconds": options.seconds,
            "goals_met": met,
        }
        options.json.write_text(json.dumps(document, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
