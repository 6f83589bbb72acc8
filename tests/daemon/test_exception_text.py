"""An unexpected exception becomes an outcome's detail (a failed remedy, a failed abort):
redacted before it is cut, so a cut through a URL's password cannot keep half of it."""

from __future__ import annotations

import asyncio

from wedgewatch.config import Target
from wedgewatch.daemon.target import _abort_outcome, exception_text

PLANTED = "hunter2hunter2hunter2"


def _failing_near_the_cut() -> RuntimeError:
    # The password straddles character 500 of "RuntimeError: ...": a cut first keeps
    # "admin:hunter2hun" with no "@" after it, which no URL rule masks any more.
    prefix = "x" * (500 - len("RuntimeError: ") - len(" http://admin:hunter2hun"))
    return RuntimeError(f"{prefix} http://admin:{PLANTED}@10.0.0.7:8000/abort_requests")


def test_the_text_is_redacted_before_it_is_cut() -> None:
    text = exception_text(_failing_near_the_cut())
    assert "hunter2" not in text
    assert text.startswith("RuntimeError: xxx")


class _RaisingAborter:
    async def abort(self, target: Target, *, proof_seconds: float) -> object:
        raise _failing_near_the_cut()


def test_a_failed_abort_keeps_no_half_password() -> None:
    target = Target(url="http://127.0.0.1:8000")
    outcome = asyncio.run(_abort_outcome(_RaisingAborter(), target, None, 1.0))  # type: ignore[arg-type]
    assert not outcome.ok
    assert "the abort could not be sent: RuntimeError" in outcome.detail
    assert "hunter2" not in outcome.detail
