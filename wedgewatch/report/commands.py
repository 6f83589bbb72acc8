"""What `wedgewatch bundles` and `wedgewatch report` do, kept out of the CLI module."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from wedgewatch.core.text.escape import neutralise
from wedgewatch.core.values import immutable
from wedgewatch.io.atomic import write_atomic
from wedgewatch.report.chart import INSTALL_HINT, timeline_svg
from wedgewatch.report.model import BundleRow, list_bundles, newest_bundle, read_bundle
from wedgewatch.report.render import human_bytes, render_html, render_markdown, render_upstream

REPORT_HTML = "report.html"
REPORT_MD = "report.md"
UPSTREAM_MD = "upstream-issue.md"


def format_bundles(rows: list[BundleRow]) -> str:
    """The `bundles` listing: one line per bundle, newest first, with a header."""
    head = (
        "when (UTC)",
        "target",
        "eng",
        "family",
        "phase",
        "triage",
        "known issue",
        "remedy",
        "size",
        "bundle",
    )
    table: list[tuple[str, ...]] = [head]
    for r in rows:
        when = (
            dt.datetime.fromtimestamp(r.created_timestamp, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            if r.created_timestamp is not None
            else "?"
        )
        table.append(  # a bundle's values are the target's data: no control character
            _terminal(
                when,
                r.target,
                r.engine,
                r.family,
                r.verdict,
                r.triage,
                r.known_issues,
                r.remedy,
                human_bytes(r.size_bytes),
                r.name + (f"  ({r.problem})" if r.problem else ""),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
        for row in table
    )


def _terminal(*cells: str) -> tuple[str, ...]:
    return tuple(neutralise(cell, 200, newlines=False) for cell in cells)


def bundle_rows(evidence_dir: Path) -> list[BundleRow]:
    """Every bundle of an evidence directory, newest first."""
    return list_bundles(evidence_dir)


@immutable
class Written:
    """What `write_report` wrote, and notes for the user (missing parts, no charts)."""

    paths: tuple[Path, ...]
    notes: tuple[str, ...]


def resolve_bundle(bundle: Path | None, evidence_dir: Path) -> Path | str:
    """The bundle to report on: the given one, or the newest in `evidence_dir`; or an error."""
    if bundle is not None:
        return bundle if bundle.is_dir() else f"{bundle}: no such bundle directory"
    newest = newest_bundle(evidence_dir)
    return newest if newest is not None else f"no evidence bundles in {evidence_dir}"


def write_report(bundle: Path, output: Path | None = None, *, upstream: bool = False) -> Written:
    """Write the report of a bundle; `output` is a file (.html/.md) or a directory.

    Default: `report.html` and `report.md` in the bundle. With `upstream`, the GitHub issue
    body (`upstream-issue.md`) instead.
    """
    model = read_bundle(bundle)
    notes = [f"missing or corrupt: {neutralise(p, 400, newlines=False)}" for p in model.problems]
    if output is None:
        directory, stem = bundle, None
    elif output.suffix in (".html", ".md"):
        directory, stem = output.parent, output
    else:
        directory, stem = output, None
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    if upstream:
        path = stem or directory / UPSTREAM_MD
        _write(path, render_upstream(model))
        return Written((path,), tuple(notes))
    svg = timeline_svg(model.points, model.marks)
    if svg is None and model.points:
        notes.append(f"no charts: matplotlib is not installed ({INSTALL_HINT})")
    html_path = stem.with_suffix(".html") if stem is not None else directory / REPORT_HTML
    md_path = stem.with_suffix(".md") if stem is not None else directory / REPORT_MD
    _write(html_path, render_html(model, svg))
    _write(md_path, render_markdown(model))
    written += [html_path, md_path]
    return Written(tuple(written), tuple(notes))


def _write(path: Path, text: str) -> None:
    """Write a report file 0600 (it describes a private bundle), replacing an older one.

    The text is written as the renderer made it: the bundle's values were redacted as they
    were read (`model.load_files`), before the renderer escaped them; a pass over the rendered
    text could undo an escape (mask the backslash of `\\<` away).
    The temporary file is always a new one (`io.atomic.write_atomic`: `O_EXCL`, 0600,
    renamed over `path`, which is replaced and never followed if it is a symlink).
    """
    write_atomic(path, text.encode())
