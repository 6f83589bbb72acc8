"""A sampled profile in folded form (`py-spy record --format raw`), read. Pure.

One line per distinct stack: frames outermost first, separated by `;`, each
`function (file:line)`, then a space and the number of samples that had that stack.
py-spy drops samples of idle threads (a thread sleeping or waiting) unless asked
otherwise, so a loop that calls a short function between sleeps shows that function in a
large share of the samples even when a single dump nearly always catches the sleep.
Stacks that differ only in line numbers are merged: shares are per function path.
"""

from __future__ import annotations

import re

from wedgewatch.core.values import immutable

_FRAME_RE = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
#: The functions whose share of the samples a profile reports (bare names, see `bare`).
WATCHED_FUNCTIONS = ("schedule",)
TOP_STACKS = 5


@immutable
class FoldedStack:
    """One distinct stack and how many samples had it; frames innermost first."""

    frames: tuple[str, ...]
    files: tuple[str, ...]
    samples: int


@immutable
class FoldedProfile:
    """All stacks of one process's sampled profile, most sampled first."""

    stacks: tuple[FoldedStack, ...]

    @property
    def samples(self) -> int:
        """Samples kept (idle ones are not among them)."""
        return sum(s.samples for s in self.stacks)

    def share(self, function: str) -> float:
        """The share of samples with `function` (bare name) anywhere on the stack."""
        total = self.samples
        hits = sum(s.samples for s in self.stacks if function in {bare(f) for f in s.frames})
        return hits / total if total else 0.0

    def summary(self, top: int = TOP_STACKS) -> dict[str, object]:
        """JSON-safe: samples, the watched functions' shares, the top stacks by share."""
        total = self.samples
        return {
            "samples": total,
            "function_share": {f: round(self.share(f), 4) for f in WATCHED_FUNCTIONS},
            "top_stacks": [
                {
                    "share": round(s.samples / total, 4) if total else 0.0,
                    "samples": s.samples,
                    "stack": " < ".join(s.frames[:6]),
                }
                for s in self.stacks[:top]
            ],
        }


def bare(frame: str) -> str:
    """The function name without its class qualifier (`Scheduler.schedule` -> `schedule`)."""
    return frame.rsplit(".", 1)[-1]


def parse_folded(text: str) -> FoldedProfile:
    """The stacks of a folded profile; lines that do not parse are skipped."""
    counts: dict[tuple[tuple[str, ...], tuple[str, ...]], int] = {}
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        names: list[str] = []
        files: list[str] = []
        for raw in stack.split(";"):
            match = _FRAME_RE.match(raw.strip())
            names.append(match["name"] if match else raw.strip())
            files.append(match["file"] if match else "")
        key = (tuple(reversed(names)), tuple(reversed(files)))
        counts[key] = counts.get(key, 0) + int(count)
    stacks = [FoldedStack(k[0], k[1], n) for k, n in counts.items()]
    stacks.sort(key=lambda s: -s.samples)
    return FoldedProfile(tuple(stacks))


def profile_line(pid: int, profile: FoldedProfile) -> str:
    """One triage detail line: what the sampled profile of an EngineCore shows."""
    shares = ", ".join(f"{f} in {profile.share(f):.0%}" for f in WATCHED_FUNCTIONS)
    top = " < ".join(profile.stacks[0].frames[:3]) if profile.stacks else "none"
    return (
        f"profile: engine_core pid {pid}: {profile.samples} busy samples, {shares}; "
        f"most sampled stack: {top}"
    )
