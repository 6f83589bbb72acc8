"""The built-in scheduler model agrees with vLLM's own scheduler on wedge / no wedge, per release.

Both engines run the same `sim load` plans (agentic-burst, the tp2-offload configuration) under
every condition of a release: sync / async scheduling, full-ISL admission on / off, and each KV
connector whose worker side `wedgewatch/lab/real/vllm_engine.py` emulates. The real scheduler runs
in
the release's venv (tests/support/vllm_venvs.py, built by `tests/run.sh --real`), the model
(`python -m wedgewatch.lab.sim.model_run`) with the matching structure switch (0.30.0 -> "0.30",
0.33.0 -> "0.31+"). A condition fails when the two disagree on more than 10 % of its seeds.

Budget: the real scheduler costs tens of CPU seconds per seed, so the seeds of every condition
run in parallel processes (one per core) and the horizon is cut where it is safe: a run stops
at `FIDELITY_MAX_SECONDS` of simulated time, and a stall counts as a wedge after
`FIDELITY_WEDGE_STEPS` steps (docs/simulator.md, "Fidelity", has the measured cost and table).

Seeds, a deliberate size (the sweep is the dearest test; docs/simulator.md says why): the
OffloadingConnector conditions run seeds 1-15 and 24 (24 is the one seed of 1-30 on which
vLLM 0.30.0 with its defaults wedges, so that condition has a wedge to agree on), the
SimpleCPUOffloadConnector conditions, under which neither engine wedged on any of seeds 1-30,
seeds 1-8. `WEDGEWATCH_FIDELITY_SEEDS` (e.g. `1-30`, the full sweep) sets the seeds of every
condition.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from vllm_venvs import vllm_env, vllm_python

from wedgewatch.lab.real.vllm_engine import EMULATED_CONNECTORS, parse_seeds

ROOT = Path(__file__).resolve().parents[2]
FIDELITY_MAX_SECONDS = 18.0
"""Real wedges on this traffic start 4-15 s in; a run stops at 18 s of simulated time."""
FIDELITY_WEDGE_STEPS = 600
"""A 3 s stall (600 steps) with nothing running and requests waiting counts as a wedge here
(the harnesses' default is 10 s); both engines are judged by the same rule."""
OFFLOADING_SEEDS = "1-15,24"
SIMPLE_SEEDS = "1-8"
REAL_SEEDS_PER_PROCESS = 8
MAX_DISAGREEMENT = 0.10
STRUCTURE = {"0.30.0": "0.30", "0.33.0": "0.31+"}


@dataclass(frozen=True)
class Condition:
    """One column of the agreement table."""

    sync: bool
    full_isl: bool
    simple: bool

    @property
    def name(self) -> str:
        return "/".join(
            (
                "sync" if self.sync else "async",
                "full-ISL" if self.full_isl else "no-full-ISL",
                "simple" if self.simple else "offloading",
            )
        )

    def flags(self) -> list[str]:
        flags = ["--max-seconds", str(FIDELITY_MAX_SECONDS)]
        flags += ["--wedge-steps", str(FIDELITY_WEDGE_STEPS)]
        if self.sync:
            flags.append("--sync")
        if not self.full_isl:
            flags.append("--no-full-isl")
        if self.simple:
            flags.append("--simple-offload")
        return flags


def conditions() -> list[Condition]:
    """Every condition whose connector the real harness can drive."""
    simple_options = [False]
    if "SimpleCPUOffloadConnector" in EMULATED_CONNECTORS:
        simple_options.append(True)
    return [
        Condition(sync, full_isl, simple)
        for simple in simple_options
        for sync in (False, True)
        for full_isl in (True, False)
    ]


def seeds(condition: Condition) -> list[int]:
    """The seeds of `condition` (`WEDGEWATCH_FIDELITY_SEEDS` sets those of every condition)."""
    default = SIMPLE_SEEDS if condition.simple else OFFLOADING_SEEDS
    return parse_seeds(os.environ.get("WEDGEWATCH_FIDELITY_SEEDS", default))


def run_harness(python: Path, module: str, flags: list[str]) -> dict[int, bool]:
    """Run a harness (`vllm_engine` or `model_run`); seed -> wedged."""
    env = vllm_env(VLLM_LOGGING_LEVEL="ERROR")
    done = subprocess.run(
        [str(python), "-m", module, *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
    assert done.returncode == 0, f"{module} {' '.join(flags)} failed"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {int(line["seed"]): bool(line["wedged"]) for line in lines if "seed" in line}


def run_version(
    version: str, real_python: Path, condition_list: list[Condition]
) -> dict[Condition, tuple[dict[int, bool], dict[int, bool]]]:
    """Per condition, (real, model) wedged per seed. The real seeds run in chunks of
    `REAL_SEEDS_PER_PROCESS` (vLLM's import costs seconds), all conditions' chunks over one
    pool of one process per core; the model runs each condition over the same cores."""
    workers = os.cpu_count() or 1
    jobs = [
        (condition, chunk)
        for condition in condition_list
        for chunk in (
            seeds(condition)[start : start + REAL_SEEDS_PER_PROCESS]
            for start in range(0, len(seeds(condition)), REAL_SEEDS_PER_PROCESS)
        )
    ]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        parts = list(
            pool.map(
                lambda job: run_harness(
                    real_python,
                    "wedgewatch.lab.real.vllm_engine",
                    ["--seeds", ",".join(map(str, job[1])), *job[0].flags()],
                ),
                jobs,
            )
        )
    results: dict[Condition, tuple[dict[int, bool], dict[int, bool]]] = {}
    for condition in condition_list:
        real: dict[int, bool] = {}
        for (job_condition, _chunk), part in zip(jobs, parts, strict=True):
            if job_condition == condition:
                real.update(part)
        model = run_harness(
            Path(sys.executable),
            "wedgewatch.lab.sim.model_run",
            [
                "--seeds",
                ",".join(map(str, seeds(condition))),
                "--vllm-structure",
                STRUCTURE[version],
                "--jobs",
                str(workers),
                *condition.flags(),
            ],
        )
        results[condition] = (real, model)
    return results


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("version", ["0.30.0", "0.33.0"])
def test_the_model_agrees_with_vllms_own_scheduler_on_every_condition(version: str) -> None:
    """Per condition, the model and vLLM's scheduler disagree on wedge/no wedge for <= 10 %."""
    real_python = vllm_python(version)
    rows: list[str] = []
    failures: list[str] = []
    for condition, (real, model) in run_version(version, real_python, conditions()).items():
        seed_list = seeds(condition)
        assert sorted(real) == sorted(model) == seed_list
        disagree = [seed for seed in seed_list if real[seed] != model[seed]]
        rows.append(
            f"| {version} | {condition.name} | {sum(real.values())}/{len(seed_list)} | "
            f"{sum(model.values())}/{len(seed_list)} | {len(disagree)} {disagree or ''} |"
        )
        if len(disagree) > MAX_DISAGREEMENT * len(seed_list):
            failures.append(f"{condition.name}: seeds {disagree}")
    sys.stdout.write("\n".join(rows) + "\n")
    assert not failures, "the model disagrees with vLLM " + version + ": " + "; ".join(failures)
