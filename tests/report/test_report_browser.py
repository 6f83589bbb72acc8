"""The report of a real simulator wedge, rendered by headless Chromium and checked on screen."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WIDTH, HEIGHT = 1280, 900  # a laptop
# A phone in portrait. Headless Chromium never lays a page out narrower than 500 CSS px (its
# smallest window), so the phone check runs at that width: still a phone's layout (the
# report's narrow-screen rules apply below 600 px), and no sideways scrolling is allowed.
PHONE_WIDTH, PHONE_HEIGHT = 390, 844
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
# Measures where the parts are on the first screen; written into the DOM for --dump-dom.
PROBE = """<script>
window.addEventListener('load', () => {
  const out = {};
  for (const id of ['verdict', 'what-now', 'known-line', 'chart']) {
    const el = document.getElementById(id);
    if (el) { const r = el.getBoundingClientRect();
      out[id] = {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
                 text: el.innerText.slice(0, 2000)}; }
  }
  const chart = document.getElementById('chart');
  const svg = chart && chart.querySelector('svg');
  if (svg) { const r = svg.getBoundingClientRect(); const box = svg.viewBox.baseVal;
    out.chart_svg = {left: r.left, right: r.right, width: r.width, height: r.height,
                     ratio: box.width / box.height,
                     scroll: chart.scrollWidth - chart.clientWidth}; }
  out.page_width = document.documentElement.scrollWidth;
  out.client_width = document.documentElement.clientWidth;
  const pre = document.createElement('pre'); pre.id = 'probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
});
</script>"""


def chromium() -> str:
    """The Chromium binary (Debian's `chromium`; tests/run.sh installs it)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: run tests/run.sh or apt-get install -y chromium")
    return found


def run_chromium(
    args: list[str], profile: Path, size: tuple[int, int] = (WIDTH, HEIGHT)
) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run with a throwaway profile and a window of `size`."""
    window = f"--window-size={size[0]},{size[1]}"
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, window, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`wedgewatch demo` wedges the simulator for real and ends by writing the report."""
    directory = tmp_path_factory.mktemp("demo")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WEDGEWATCH_", "NOTIFY_"))}
    done = subprocess.run(
        [sys.executable, "-m", "wedgewatch", "demo", "--dir", str(directory / "d")],
        capture_output=True,
        text=True,
        env=clean,
        timeout=540,
        check=False,
        cwd=directory,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    match = re.search(r"^\s+report\s+(\S+report\.html)", done.stdout, re.MULTILINE)
    assert match, done.stdout[-3000:]
    return Path(match.group(1))


def probe(report: Path, tmp_path: Path, size: tuple[int, int]) -> dict[str, Any]:
    """Where the verdict, the what-now box, the known-issue line and the chart are on screen."""
    html = report.read_text(encoding="utf-8")
    probed = tmp_path / f"probed-{size[0]}.html"
    probed.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = run_chromium(["--dump-dom", probed.as_uri()], tmp_path / f"profile-{size[0]}", size)
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.DOTALL)
    assert found, dom.stdout[-2000:] + dom.stderr[-2000:]
    where: dict[str, Any] = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    return where


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_of_a_real_wedge_reads_at_3am_on_a_laptop_and_a_phone(
    demo_report: Path, tmp_path: Path
) -> None:
    """Chromium draws the chart; the verdict (at the verdict's time), the what-now box and the
    #57841 match with the release that closes it come first, at a laptop and a phone width."""
    from PIL import Image

    html = demo_report.read_text(encoding="utf-8")
    assert "http://" not in html.split("<body>", 1)[0]  # no network: nothing loaded from outside
    assert "<script" not in html
    summary = json.loads((demo_report.parent / "summary.json").read_text())
    verdict_time = dt.datetime.fromtimestamp(summary["verdict_timestamp"], tz=dt.UTC)
    opened = dt.datetime.fromtimestamp(summary["created_timestamp"], tz=dt.UTC)
    assert verdict_time - opened >= dt.timedelta(seconds=5)  # opened at suspect, judged later

    for size in ((WIDTH, HEIGHT), (PHONE_WIDTH, PHONE_HEIGHT)):
        where = probe(demo_report, tmp_path, size)
        assert where["client_width"] <= max(size[0], 500)
        # no sideways scrolling: nothing is wider than the window
        assert where["page_width"] <= where["client_width"], (size, where)
        assert "wedged" in where["verdict"]["text"]
        assert verdict_time.strftime("%H:%M:%S") in where["verdict"]["text"]
        assert where["verdict"]["bottom"] <= where["what-now"]["top"]  # what now comes next
        assert where["what-now"]["top"] < size[1]  # ... on the first screen
        now = where["what-now"]["text"]
        for part in ("wedgewatch did", "restarted the server", "do next", "#57841",
                     "vLLM 0.30.0+wedgewatch.sim is affected", "vLLM 0.31.0 or later closes",
                     "wedgewatch report --upstream"):  # fmt: skip
            assert part in now, (size, now)
        assert where["what-now"]["bottom"] <= where["known-line"]["top"]
        assert where["known-line"]["bottom"] <= where["chart"]["top"]
        assert where["chart"]["left"] >= 0
        assert where["chart"]["right"] <= where["client_width"]
        # The chart itself scales to the width: no sideways scroll inside its box either.
        drawn = where["chart_svg"]
        assert drawn["left"] >= 0, (size, drawn)
        assert drawn["right"] <= where["client_width"], (size, drawn)
        assert drawn["scroll"] <= 0, (size, drawn)
        assert drawn["width"] / drawn["height"] == pytest.approx(drawn["ratio"], rel=0.05)

    where = probe(demo_report, tmp_path, (WIDTH, HEIGHT))
    chart = where["chart"]
    assert chart["top"] < HEIGHT  # the chart starts on the first screen of a laptop
    shot = tmp_path / "report.png"
    done = run_chromium([f"--screenshot={shot}", demo_report.as_uri()], tmp_path / "profile2")
    assert shot.exists(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    box = (
        int(chart["left"]) + 2,
        int(chart["top"]) + 2,
        int(chart["right"]) - 2,
        min(int(chart["bottom"]), HEIGHT) - 2,
    )
    region = image.crop(box)
    raw = region.tobytes()  # RGB triples, row by row
    pixels = [(raw[i], raw[i + 1], raw[i + 2]) for i in range(0, len(raw), 3)]
    drawn = [p for p in pixels if min(p) < 235]
    assert len(drawn) > 0.02 * len(pixels), f"chart looks blank: {len(drawn)}/{len(pixels)}"
    # Lines in several colours (running, capacity, deferred, KV, tokens), not one grey blob.
    saturated = {
        (r // 32, g // 32, b // 32) for r, g, b in drawn if max(r, g, b) - min(r, g, b) > 60
    }
    assert len(saturated) >= 3, saturated
    # Every mark and the failed-scrape band have a legend entry in the chart itself.
    svg = html[html.index("<svg") : html.index("</svg>")]
    for label in ("suspect", "wedged", "restart", "back", "failed scrape"):
        assert label in svg, label
    if os.environ.get("WEDGEWATCH_REPORT_SCREENSHOT"):  # docs/img/report.png, on request
        shutil.copyfile(shot, os.environ["WEDGEWATCH_REPORT_SCREENSHOT"])
