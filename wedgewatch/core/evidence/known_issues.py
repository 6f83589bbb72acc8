"""Match an evidence bundle against known upstream vLLM issues. Pure.

The issues are data (`wedgewatch/vllm/known_issues.toml`, its header says how to add
one). Each entry has a signature; every condition it sets must hold for a match:

* `families`: the detector's family (`deferred_stall`, ...) is one of these;
* `triage`: triage's kind (`scheduler_wedge`, ...) is one of these;
* `features`: every named fact holds (see `wedgewatch.vllm.build_info.features`: flags
  such as `simple_cpu_offload`, `mtp`, `async_scheduling`, state such as `running_zero`);
* `not_features`: none of these holds;
* `frames`: some `role:pattern` is seen in a stack (`worker:nccl*`,
  `engine_core:step_with_batch_queue`; the pattern is a shell glob over the frame's
  function name, with or without its class);
* `versions`: the vLLM version is in the range (`>=0.26,<0.31`); an unknown version
  does not rule a match out, and the match says the range was not checked;
* `fixed_in`: the first release that closes the path; a bundle of that release or a later
  one does not match (an unknown version does, and says so). It comes with `fix_marker`,
  `vllm/<file>.py::<text>`, a line of that release's code that shows the fix and that the
  release before it lacks (tests/vllm/test_release_fixes.py reads the released packages).
* `checked_through` + `bug_marker`: no release closes the path; `bug_marker` is the faulty
  line, still in release `checked_through` (the newest one read), so the report says
  "fix not released" and names that release.

Two optional keys change how a match is told, not whether it is made:

* `possibility`: what the evidence cannot show (a fault no bundle fact proves, a broader
  family a more specific entry narrows). Such a match is ranked after the others and
  labelled a possibility, with this text.

A match carries the evidence of every condition, so a reader sees why it matched, and one
`action` line an on-call engineer acts on: whether the bundle's release is affected, the
release that closes the path (or that none does), and the workaround.
"""

from __future__ import annotations

import operator
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from fnmatch import fnmatchcase
from importlib import resources
from typing import Any

from wedgewatch.core.values import immutable
from wedgewatch.vllm.build_info import version_tuple

_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
    "==": operator.eq,
}
_KEYS = frozenset(
    {
        "id",
        "refs",
        "url",
        "title",
        "status",
        "affected",
        "workaround",
        "families",
        "triage",
        "features",
        "not_features",
        "frames",
        "versions",
        "fixed_in",
        "fix_marker",
        "checked_through",
        "bug_marker",
        "possibility",
    }
)
_REQUIRED = ("id", "url", "title", "status", "affected", "workaround")


@immutable
class SeenFrame:
    """One frame of one process's stacks in one capture round."""

    role: str
    pid: int
    round: str
    name: str


@immutable
class Facts:
    """What a bundle says, in the terms signatures use."""

    family: str | None
    triage_kind: str | None
    version: str | None
    features: Mapping[str, str] = field(default_factory=dict)
    frames: tuple[SeenFrame, ...] = ()


@immutable
class KnownIssue:
    """One upstream issue or PR and the signature that recognises it."""

    id: str
    url: str
    title: str
    status: str
    affected: str
    workaround: str
    refs: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    triage: tuple[str, ...] = ()
    features: tuple[str, ...] = ()
    not_features: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()
    versions: str = ""
    fixed_in: str = ""
    fix_marker: str = ""
    checked_through: str = ""
    bug_marker: str = ""
    possibility: str = ""

    @property
    def ref(self) -> str:
        """How a reader names it: `#57841` for the entry of that upstream number, else its id."""
        if self.refs and self.id == f"vllm-{self.refs[0].lstrip('#')}":
            return self.refs[0]
        return self.id

    def to_json(self) -> dict[str, object]:
        """JSON-safe form (for summaries and reports)."""
        return {
            "id": self.id,
            "refs": list(self.refs),
            "url": self.url,
            "title": self.title,
            "status": self.status,
            "affected": self.affected,
            "workaround": self.workaround,
            "fixed_in": self.fixed_in or None,
            "checked_through": self.checked_through or None,
        }


@immutable
class Match:
    """A known issue that fits the bundle, the evidence for each condition, and the verdict on
    the bundle's release (`release`: the version the bundle recorded, None when unknown)."""

    issue: KnownIssue
    evidence: tuple[str, ...]
    release: str | None = None

    @property
    def possible(self) -> bool:
        """Ranked after the others and labelled: the evidence cannot show the whole fault."""
        return bool(self.issue.possibility)

    @property
    def release_verdict(self) -> str:
        """Whether the bundle's release is affected, in words."""
        issue = self.issue
        if self.release is None:
            where = issue.versions or (f"<{issue.fixed_in}" if issue.fixed_in else "")
            return "vLLM version unknown" + (f": affected if {where}" if where else "")
        if issue.fixed_in:
            return f"vLLM {self.release} is affected (before {issue.fixed_in})"
        if issue.versions:
            return f"vLLM {self.release} is affected ({issue.versions})"
        return f"vLLM {self.release} is affected (no release is known to be unaffected)"

    @property
    def fix(self) -> str:
        """The release that closes the path (read in its released code), or that none does:
        "fix not released" when the newest release read still has the faulty code."""
        issue = self.issue
        if issue.fixed_in:
            return f"fixed in vLLM {issue.fixed_in}: upgrade to it or later (closes this path)"
        if issue.checked_through:
            newest = issue.checked_through
            return f"fix not released (vLLM {newest}, the newest release read, still has it)"
        return "no release closes it yet"

    @property
    def action(self) -> str:
        """One line an on-call engineer acts on: release verdict, fix, workaround."""
        label = "possibly " if self.possible else ""
        return (
            f"{label}{self.issue.ref}: {self.release_verdict}; {self.fix}; "
            f"meanwhile: {self.issue.workaround}"
        )

    def to_json(self) -> dict[str, object]:
        """JSON-safe form."""
        return {
            **self.issue.to_json(),
            "evidence": list(self.evidence),
            "possibility": self.issue.possibility or None,
            "release": self.release,
            "action": self.action,
        }


def parse_versions(spec: str) -> list[tuple[str, tuple[int, ...]]] | str:
    """`>=0.26,<0.31` -> [(">=", (0, 26)), ("<", (0, 31))], or what is wrong with it."""
    clauses: list[tuple[str, tuple[int, ...]]] = []
    for raw in spec.split(","):
        text = raw.strip()
        if not text:
            continue
        op = next((o for o in (">=", "<=", "==", ">", "<") if text.startswith(o)), None)
        if op is None:
            return f"version clause {text!r} does not start with >=, <=, ==, > or <"
        number = version_tuple(text[len(op) :].strip())
        if number is None:
            return f"version clause {text!r} has no version number"
        clauses.append((op, number))
    return clauses


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def version_in(version: tuple[int, ...], spec: str) -> bool:
    """Whether a version satisfies every clause of a range (an empty range holds any)."""
    clauses = parse_versions(spec)
    if isinstance(clauses, str):
        raise ValueError(clauses)
    return all(_OPS[op](*_pad(version, bound)) for op, bound in clauses)


def _strings(entry: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = entry.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: {key} must be a list of strings")
    return tuple(value)


def parse_known_issues(text: str, source: str = "known_issues.toml") -> tuple[KnownIssue, ...]:
    """The entries of a known-issues file; ValueError naming the entry and key when invalid."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: {exc}") from None
    entries = data.get("issue", [])
    if not isinstance(entries, list):
        raise ValueError(f"{source}: [[issue]] must be an array of tables")
    out: list[KnownIssue] = []
    seen: set[str] = set()
    for index, entry in enumerate(entries):
        where = f"{source}: issue {index + 1}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: not a table")
        unknown = sorted(set(entry) - _KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}")
        for key in _REQUIRED:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise ValueError(f"{where}: {key} is required (a non-empty string)")
        where = f"{source}: issue {entry['id']}"
        if entry["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(entry["id"])
        versions = entry.get("versions", "")
        if not isinstance(versions, str):
            raise ValueError(f"{where}: versions must be a string such as '>=0.26,<0.31'")
        problem = parse_versions(versions)
        if isinstance(problem, str):
            raise ValueError(f"{where}: {problem}")
        for key in ("fixed_in", "possibility"):
            if not isinstance(entry.get(key, ""), str):
                raise ValueError(f"{where}: {key} must be a string")
        for key in ("fix_marker", "checked_through", "bug_marker"):
            if not isinstance(entry.get(key, ""), str):
                raise ValueError(f"{where}: {key} must be a string")
        fixed_in = entry.get("fixed_in", "")
        if fixed_in and version_tuple(fixed_in) is None:
            raise ValueError(f"{where}: fixed_in {fixed_in!r} is not a version such as '0.31.0'")
        checked = entry.get("checked_through", "")
        if checked and version_tuple(checked) is None:
            raise ValueError(f"{where}: checked_through {checked!r} is not a version")
        _check_markers(entry, where)
        frames = _strings(entry, "frames", where)
        for frame in frames:
            if ":" not in frame:
                raise ValueError(f"{where}: frame {frame!r} must be role:pattern")
        issue = KnownIssue(
            id=entry["id"],
            url=entry["url"],
            title=entry["title"],
            status=entry["status"],
            affected=entry["affected"],
            workaround=entry["workaround"],
            refs=_strings(entry, "refs", where),
            families=_strings(entry, "families", where),
            triage=_strings(entry, "triage", where),
            features=_strings(entry, "features", where),
            not_features=_strings(entry, "not_features", where),
            frames=frames,
            versions=versions,
            fixed_in=fixed_in,
            fix_marker=entry.get("fix_marker", ""),
            checked_through=checked,
            bug_marker=entry.get("bug_marker", ""),
            possibility=entry.get("possibility", ""),
        )
        if not (issue.families or issue.triage or issue.features or issue.frames):
            raise ValueError(f"{where}: a signature needs families, triage, features or frames")
        out.append(issue)
    return tuple(out)


def split_marker(marker: str) -> tuple[str, str]:
    """`vllm/path.py::text` -> (`vllm/path.py`, `text`): the file of a release and a line of it."""
    path, _, text = marker.partition("::")
    return path, text


def _check_markers(entry: Mapping[str, Any], where: str) -> None:
    """A "fixed in" claim names the code that shows the fix; a "fix not released" claim the
    code that shows the fault and the newest release it was read in."""
    for key in ("fix_marker", "bug_marker"):
        marker = entry.get(key, "")
        if marker:
            path, text = split_marker(marker)
            if not path.startswith("vllm/") or not path.endswith(".py") or not text.strip():
                raise ValueError(f"{where}: {key} must be 'vllm/<file>.py::<text in it>'")
    if entry.get("fixed_in") and not entry.get("fix_marker"):
        raise ValueError(f"{where}: fixed_in needs fix_marker (the code that shows the fix)")
    if entry.get("fix_marker") and not entry.get("fixed_in"):
        raise ValueError(f"{where}: fix_marker needs fixed_in")
    if bool(entry.get("bug_marker")) != bool(entry.get("checked_through")):
        raise ValueError(f"{where}: bug_marker and checked_through go together")
    if entry.get("bug_marker") and entry.get("fixed_in"):
        raise ValueError(f"{where}: an entry is fixed (fixed_in) or not released (bug_marker)")


def shipped_known_issues() -> tuple[KnownIssue, ...]:
    """The known issues shipped with wedgewatch (`wedgewatch/vllm/known_issues.toml`)."""
    text = resources.files("wedgewatch.vllm").joinpath("known_issues.toml").read_text("utf-8")
    return parse_known_issues(text)


def _frame_hit(pattern: str, frames: Sequence[SeenFrame]) -> SeenFrame | None:
    role, _, glob = pattern.partition(":")
    for frame in frames:
        if role not in ("*", frame.role):
            continue
        bare = frame.name.rsplit(".", 1)[-1]
        if fnmatchcase(bare, glob) or fnmatchcase(frame.name, glob):
            return frame
    return None


def match_issue(issue: KnownIssue, facts: Facts) -> Match | None:
    """The match of one issue with the evidence, or None when a condition fails."""
    evidence: list[str] = []
    if issue.families:
        if facts.family not in issue.families:
            return None
        evidence.append(f"family {facts.family}")
    if issue.triage:
        if facts.triage_kind not in issue.triage:
            return None
        evidence.append(f"triage {facts.triage_kind}")
    for name in issue.features:
        if name not in facts.features:
            return None
        evidence.append(f"{name}: {facts.features[name]}")
    for name in issue.not_features:
        if name in facts.features:
            return None
    if issue.not_features:
        evidence.append("without " + ", ".join(issue.not_features))
    if issue.frames:
        hits = [(p, _frame_hit(p, facts.frames)) for p in issue.frames]
        found = [(p, h) for p, h in hits if h is not None]
        if not found:
            return None
        evidence.extend(f"frame {h.name} in {h.role} {h.pid} ({h.round})" for _, h in found)
    version = version_tuple(facts.version)
    ranges = [r for r in (issue.versions, f"<{issue.fixed_in}" if issue.fixed_in else "") if r]
    if ranges:
        spec = ",".join(ranges)
        if version is None:
            evidence.append(f"vLLM version unknown: range {spec} not checked")
        elif not version_in(version, spec):
            return None
        else:
            evidence.append(f"vLLM {facts.version} in {spec}")
    return Match(issue, tuple(evidence), facts.version if version is not None else None)


def match_known_issues(issues: Sequence[KnownIssue], facts: Facts) -> tuple[Match, ...]:
    """Every known issue whose signature fits: the matches the evidence shows whole, in file
    order, then the possibilities."""
    found = [m for m in (match_issue(i, facts) for i in issues) if m is not None]
    return tuple(sorted(found, key=lambda m: m.possible))
