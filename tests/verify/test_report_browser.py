"""The verify report opens offline in headless Chromium and shows the verdict, the plots and a working filter."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
             "--window-size=1280,2000"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


def test_report_renders_verdict_and_plots_in_chromium(verified: tuple[Path, int, dict[str, Any]],
                                                      tmp_path: Path) -> None:
    # a requirement of the suite, like Java: .ci/run installs it; never skipped, so CI cannot pass without it
    assert CHROMIUM is not None, "chromium is not installed: apt-get install chromium (.ci/run does it as root)"
    folder, _, report = verified
    page = (folder / "index.html").resolve()
    text = page.read_text()
    # self-contained: one inline script (the samples' filter), nothing loaded: no script source, no remote
    # stylesheet, font or image
    assert text.lower().count("<script") == 1 and "<script>" in text and not re.search(r"\bsrc=", text)
    assert not re.search(r"(src|href)=['\"]?https?:", text)
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    verdict = re.search(r"<div id=\"verdict\"[^>]*>(.*?)</div>", html, re.S)
    assert verdict and f"verdict: {report['verdict']}" in verdict.group(1)
    for plot in ("plot-timeline-agg", "plot-lateness-agg"):
        figure = re.search(rf"<figure[^>]*id=\"{plot}\"[^>]*>(.*?)</figure>", html, re.S)
        assert figure and "<svg" in figure.group(1) and "<path" in figure.group(1)
    assert "late_drop_differs" in html and "agg.stream.unique" in html
    # the filter, set from the address as a reader's link would: only the chosen cause's samples stay visible
    filtered = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#cause=late_drop_differs").stdout
    samples = re.findall(r"<div class=\"sample\"([^>]*)>", filtered)
    visible = [a for a in samples if "hidden" not in a]
    assert len(samples) == len(report["sections"][0]["samples"]) and samples != visible
    assert visible and all('data-cause="late_drop_differs"' in a for a in visible)
    assert len(visible) == report["causes"]["late_drop_differs"]
    assert f"{len(visible)} of {len(samples)} samples shown" in filtered
    keyed = _chromium(tmp_path, "--dump-dom", page.as_uri() + "#key=q").stdout
    assert all('data-key="q"' in a for a in re.findall(r"<div class=\"sample\"([^>]*)>", keyed) if "hidden" not in a)
    shot = REPO / "test-artifacts" / "verify-report.png"
    shot.parent.mkdir(exist_ok=True)
    done = _chromium(tmp_path, f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0 and shot.stat().st_size > 20_000, done.stderr[-2000:]
