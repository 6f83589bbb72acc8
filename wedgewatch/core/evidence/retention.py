"""Evidence retention, planned: which bundles to evict so that the evidence budget holds.

Pure: the planner sees bundles as (name, creation time, size, wedge or routine) and returns
what to delete; `io.bundles.apply_retention` scans the directory and deletes. The rules:
keep at most `keep` bundles of at most `max_bytes`; routine bundles (suspect bundles,
resolved or still open, and manual captures) go first, oldest first; a wedge bundle is
evicted only to make room for a newer wedge bundle, oldest first, never the newest
`protected_wedges`; the bundle just written is never evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from wedgewatch.core.values import immutable


@immutable
class StoredBundle:
    """A bundle on disk, as retention sees it."""

    name: str
    created_timestamp: float
    size_bytes: int
    wedge: bool


@immutable
class RetentionPlan:
    """Which bundles to delete, and whether the budget still is exceeded after that."""

    evict: tuple[str, ...]
    keep: tuple[str, ...]
    over_budget: bool


def plan_retention(
    bundles: Sequence[StoredBundle],
    keep: int,
    max_bytes: int,
    *,
    protect: Iterable[str] = (),
    protected_wedges: int = 1,
) -> RetentionPlan:
    """Evict until at most `keep` bundles of at most `max_bytes` remain, as far as allowed.

    `protect` names the bundle just written (the trigger); it is never evicted. Routine
    bundles go first, oldest first. Wedge bundles are evicted only when the plan is for a
    wedge bundle (a protected bundle is a wedge bundle), then oldest first, and never the
    newest `protected_wedges` of them: a routine bundle never costs a wedge bundle. What
    cannot be evicted under these rules stays, and `over_budget` says the budget is exceeded.
    """
    newest_first = sorted(bundles, key=lambda b: (b.created_timestamp, b.name), reverse=True)
    protected = set(protect)
    for_wedge = any(b.wedge and b.name in protected for b in bundles)
    protected.update(b.name for b in [b for b in newest_first if b.wedge][:protected_wedges])
    oldest_first = list(reversed(newest_first))
    candidates = [b for b in oldest_first if not b.wedge and b.name not in protected]
    if for_wedge:
        candidates += [b for b in oldest_first if b.wedge and b.name not in protected]
    count = len(bundles)
    total = sum(b.size_bytes for b in bundles)
    evicted: list[str] = []
    for bundle in candidates:
        if count <= keep and total <= max_bytes:
            break
        evicted.append(bundle.name)
        count -= 1
        total -= bundle.size_bytes
    gone = set(evicted)
    kept = tuple(b.name for b in newest_first if b.name not in gone)
    return RetentionPlan(tuple(evicted), kept, count > keep or total > max_bytes)
