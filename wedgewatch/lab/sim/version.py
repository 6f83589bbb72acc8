"""The version string the simulator reports where vLLM reports its own.

The built-in scheduler model follows a named vLLM release (`--vllm-structure`); the simulator
reports that release, marked as the simulator (`0.30.0+wedgewatch.sim`), on `GET /version`, in
`vllm --version` and in its start-up log line. So a bundle's `build.json` records the release
whose behaviour the server showed, and known-issue matching judges that release, never another.
"""

from __future__ import annotations

SIM_MARK = "+wedgewatch.sim"
"""Appended to the emulated release: a version with it is the simulator, never a real vLLM."""

EMULATED_RELEASES: dict[str, str] = {"0.30": "0.30.0", "0.31+": "0.33.0"}
"""The release each scheduler structure emulates: ``0.30`` is vLLM 0.30.0 (the last release with
one mixed ``skipped_waiting`` queue); ``0.31+`` follows 0.31.0 and later and was checked against
0.33.0, whose metric families and routes every structure serves."""

DEFAULT_STRUCTURE = "0.30"


def sim_vllm_version(structure: str = DEFAULT_STRUCTURE) -> str:
    """`0.30.0+wedgewatch.sim` for the ``0.30`` structure; ValueError for an unknown one."""
    try:
        return EMULATED_RELEASES[structure] + SIM_MARK
    except KeyError:
        known = ", ".join(EMULATED_RELEASES)
        raise ValueError(f"unknown scheduler structure {structure!r} (known: {known})") from None


SIM_VLLM_VERSION = sim_vllm_version()
"""What the default simulator (and `vllm --version` of its shim) reports: 0.30.0, simulated."""
