"""The evidence retention planner (pure): rule tables and hypothesis invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wedgewatch.core.evidence.retention import StoredBundle, plan_retention


def b(name: str, t: float, size: int = 10, wedge: bool = False) -> StoredBundle:
    """A stored bundle for planner tables."""
    return StoredBundle(name, t, size, wedge)


@pytest.mark.parametrize(
    ("bundles", "budget", "protect", "evict", "over"),
    [
        pytest.param([b("r1", 1), b("r2", 2)], (5, 1000), (), (), False, id="under-budget"),
        pytest.param(
            [b("r1", 1), b("r2", 2), b("r3", 3)], (2, 1000), (), ("r1",), False, id="count-oldest"
        ),
        pytest.param(
            [b("w1", 1, wedge=True), b("r2", 2), b("r3", 3), b("r4", 4)],
            (2, 1000),
            (),
            ("r2", "r3"),
            False,
            id="routine-before-older-wedge",
        ),
        pytest.param(
            [b("w1", 1, wedge=True), b("w2", 2, wedge=True), b("r3", 3)],
            (1, 1000),
            ("r3",),
            (),
            True,
            id="routine-current-never-costs-a-wedge",
        ),
        pytest.param(
            [b("w0", 0, wedge=True), b("w1", 1, wedge=True), b("w2", 2, wedge=True), b("s3", 3)],
            (3, 1000),
            ("s3",),
            (),
            True,
            id="reviewer-case-suspect-after-three-wedges-keep-3",
        ),
        pytest.param(
            [b("w0", 0, wedge=True), b("r1", 1), b("w2", 2, wedge=True), b("m3", 3)],
            (2, 1000),
            ("m3",),
            ("r1",),
            True,
            id="routine-current-evicts-older-routine-only",
        ),
        pytest.param(
            [b("w0", 0, 60, True), b("w1", 1, 60, True), b("m2", 2, 60)],
            (10, 130),
            ("m2",),
            (),
            True,
            id="routine-current-over-size-keeps-wedges",
        ),
        pytest.param(
            [b("w0", 0, wedge=True), b("w1", 1, wedge=True), b("w2", 2, wedge=True)],
            (1, 1000),
            (),
            (),
            True,
            id="no-trigger-evicts-no-wedge",
        ),
        pytest.param(
            [b("w0", 0, wedge=True), b("w1", 1, wedge=True), b("w2", 2, wedge=True)],
            (2, 1000),
            ("w2",),
            ("w0",),
            False,
            id="wedge-current-evicts-oldest-wedge",
        ),
        pytest.param(
            [b("w1", 1, wedge=True), b("r2", 2), b("w3", 3, wedge=True)],
            (2, 1000),
            ("w3",),
            ("r2",),
            False,
            id="wedge-current-evicts-routine-before-wedge",
        ),
        pytest.param(
            [b("w1", 1, 500, True), b("w2", 2, 500, True), b("w3", 3, 500, True)],
            (10, 100),
            ("w3",),
            ("w1", "w2"),
            True,
            id="wedge-current-kept-over-size",
        ),
        pytest.param(
            [b("w1", 1, wedge=True), b("w3", 3, wedge=True), b("w2", 2, wedge=True)],
            (1, 1000),
            ("w2",),
            ("w1",),
            True,
            id="older-wedge-current-and-newest-wedge-both-kept",
        ),
        pytest.param(
            [b("r1", 1, 60), b("r2", 2, 60), b("r3", 3, 60)],
            (10, 130),
            (),
            ("r1",),
            False,
            id="size-cap",
        ),
        pytest.param(
            [b("w1", 1, wedge=True), b("w2", 2, wedge=True), b("w3", 3, wedge=True)],
            (1, 1000),
            ("w3",),
            ("w1", "w2"),
            False,
            id="old-wedges-go-for-a-new-wedge-when-no-routine-left",
        ),
        pytest.param(
            [b("r1", 1), b("r2", 2)], (1, 1000), ("r1",), ("r2",), False, id="protected-routine"
        ),
    ],
)
def test_plan_retention(
    bundles: list[StoredBundle],
    budget: tuple[int, int],
    protect: tuple[str, ...],
    evict: tuple[str, ...],
    over: bool,
) -> None:
    """Routine bundles go first; only a wedge trigger evicts wedges, never the newest one."""
    keep, max_bytes = budget
    plan = plan_retention(bundles, keep, max_bytes, protect=protect)
    assert plan.evict == evict
    assert plan.over_budget is over
    assert set(plan.keep) == {x.name for x in bundles} - set(evict)


def test_plan_retention_protects_several_wedges_when_asked() -> None:
    """`protected_wedges=2` keeps the two newest wedge bundles."""
    bundles = [b("w1", 1, wedge=True), b("w2", 2, wedge=True), b("w3", 3, wedge=True)]
    plan = plan_retention(bundles, 1, 1000, protect=("w3",), protected_wedges=2)
    assert plan.evict == ("w1",)


@given(
    st.lists(
        st.tuples(st.integers(0, 50), st.integers(1, 100), st.booleans()),
        max_size=12,
        unique_by=lambda t: t[0],
    ),
    st.integers(1, 6),
    st.integers(1, 600),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(0, 11)),
)
def test_plan_retention_invariants(
    raw: list[tuple[int, int, bool]],
    keep: int,
    max_bytes: int,
    protected_wedges: int,
    trigger: int | None,
) -> None:
    """Routine triggers never cost a wedge; wedges go only after routine ones, newest kept."""
    bundles = [b(f"n{t:03d}", float(t), size, wedge) for t, size, wedge in raw]
    current = bundles[trigger] if trigger is not None and trigger < len(bundles) else None
    protect = () if current is None else (current.name,)
    plan = plan_retention(
        bundles, keep, max_bytes, protect=protect, protected_wedges=protected_wedges
    )
    by_name = {x.name: x for x in bundles}
    evicted_wedges = [name for name in plan.evict if by_name[name].wedge]
    if current is None or not current.wedge:
        assert evicted_wedges == []  # a routine bundle (or none) never evicts a wedge bundle
    assert current is None or current.name not in plan.evict
    wedges = sorted((x for x in bundles if x.wedge), key=lambda x: x.created_timestamp)
    newest = (
        {x.name for x in wedges[max(len(wedges) - protected_wedges, 0) :]}
        if protected_wedges
        else set()
    )
    assert not newest & set(plan.evict)
    kinds = [by_name[name].wedge for name in plan.evict]
    assert kinds == sorted(kinds)  # all routine evictions come before any wedge eviction
    for kind in (False, True):  # within a class, oldest first
        times = [by_name[n].created_timestamp for n in plan.evict if by_name[n].wedge is kind]
        assert times == sorted(times)
    left = [x for x in bundles if x.name not in plan.evict]
    within = len(left) <= keep and sum(x.size_bytes for x in left) <= max_bytes
    assert within != plan.over_budget
    if plan.over_budget:  # over only when nothing evictable is left
        evictable = [
            x
            for x in left
            if x.name not in protect
            and x.name not in newest
            and (not x.wedge or (current is not None and current.wedge))
        ]
        assert evictable == []
    elif plan.evict:  # and never evicts more than needed
        last = by_name[plan.evict[-1]]
        back = [*left, last]
        assert len(back) > keep or sum(x.size_bytes for x in back) > max_bytes
