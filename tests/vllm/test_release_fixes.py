"""Every "fixed in" and "fix not released" claim of the shipped known issues, read in the
released code of vLLM (tests/support/release_code.py: the real tier's venvs, or the wheels
`python tests/support/release_code.py --fetch` downloads)."""

from __future__ import annotations

import pytest
from release_code import previous_release, release_file

from wedgewatch.core.evidence.known_issues import KnownIssue, shipped_known_issues, split_marker

FIXED = [i for i in shipped_known_issues() if i.fixed_in]
UNFIXED = [i for i in shipped_known_issues() if i.checked_through]


@pytest.mark.parametrize("issue", FIXED, ids=[i.id for i in FIXED])
def test_the_fix_is_in_the_release_named_and_not_in_the_one_before(issue: KnownIssue) -> None:
    """The fix's code is in the `fixed_in` release and missing from the release before it,
    so "fixed in X" names the first release that carries it."""
    path, text = split_marker(issue.fix_marker)
    assert text in release_file(issue.fixed_in, path), f"{issue.id}: not in {issue.fixed_in}"
    before = previous_release(issue.fixed_in)
    assert text not in release_file(before, path), f"{issue.id}: already in {before}"


@pytest.mark.parametrize("issue", UNFIXED, ids=[i.id for i in UNFIXED])
def test_the_faulty_code_is_still_in_the_newest_release_read(issue: KnownIssue) -> None:
    """The faulty line of an entry without a fix release is still in `checked_through`, so
    "fix not released" is true up to that release."""
    path, text = split_marker(issue.bug_marker)
    assert text in release_file(issue.checked_through, path), (
        f"{issue.id}: the faulty line is gone from {issue.checked_through}: a fix was released"
    )


def test_every_fix_claim_is_checked() -> None:
    """Every entry with a fix release is in the fixed set above (none escapes the check) and
    the shipped file has both kinds of claim."""
    ids = {i.id for i in FIXED}
    assert {"vllm-57841", "vllm-57104", "vllm-56640", "vllm-44560"} <= ids
    assert {"vllm-53859", "vllm-49829"} <= {i.id for i in UNFIXED}
