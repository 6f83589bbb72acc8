"""`check` output is the one place its text is redacted: raw values in, no secret out."""

from __future__ import annotations

from wedgewatch.check import CheckReport
from wedgewatch.core.detection.states import EngineState


def test_check_output_redacts_a_raw_url_and_a_raw_note_itself() -> None:
    """A report built from a metrics URL with credentials and a note quoting another such
    URL (as the state file's mismatch note does) prints neither secret: `render_text` is the
    sink, nothing upstream has to redact."""
    report = CheckReport(
        status=EngineState.OK,
        metrics_url="http://admin:planted-pw-1@127.0.0.1:8000/metrics?token=planted-tok-2",
        engines=(),
        error="GET http://u:planted-pw-3@127.0.0.1:1/metrics failed",
        notes=("state file belongs to 'http://x:planted-pw-4@127.0.0.1:2/metrics'",),
        scrapes=1,
        at=None,
    )
    text = report.render_text()
    for secret in ("planted-pw-1", "planted-tok-2", "planted-pw-3", "planted-pw-4"):
        assert secret not in text
    assert "127.0.0.1:8000/metrics" in text.splitlines()[0]
    assert "planted" not in str(report.to_json())
