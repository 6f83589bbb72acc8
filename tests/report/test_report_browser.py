"""The report of a real simulator wedge, rendered by headless Chromium and checked on screen."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WIDTH, HEIGHT = 1280, 900
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    f"--window-size={WIDTH},{HEIGHT}",
)
# Measures where the parts are on the first screen; written into the DOM for --dump-dom.
PROBE = """<script>
window.addEventListener('load', () => {
  const out = {};
  for (const id of ['verdict', 'known-line', 'chart']) {
    const el = document.getElementById(id);
    if (el) { const r = el.getBoundingClientRect();
      out[id] = {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
                 text: el.innerText.slice(0, 400)}; }
  }
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


def run_chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run with a throwaway profile."""
    return subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_report_of_a_real_wedge_shows_verdict_match_and_chart(
    demo_report: Path, tmp_path: Path
) -> None:
    """Chromium draws the chart, and the verdict and the #53868 match are on the first screen."""
    from PIL import Image

    html = demo_report.read_text(encoding="utf-8")
    assert "http://" not in html.split("<body>", 1)[0]  # no network: nothing loaded from outside
    assert "<script" not in html
    probed = tmp_path / "probed.html"
    probed.write_text(html.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    dom = run_chromium(["--dump-dom", probed.as_uri()], tmp_path / "profile1")
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.DOTALL)
    assert found, dom.stdout[-2000:] + dom.stderr[-2000:]
    where = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))

    assert "wedged" in where["verdict"]["text"]
    assert where["verdict"]["bottom"] <= HEIGHT
    assert "#53868" in where["known-line"]["text"]
    assert where["known-line"]["bottom"] <= HEIGHT
    chart = where["chart"]
    assert chart["top"] < HEIGHT  # the chart starts on the first screen

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
