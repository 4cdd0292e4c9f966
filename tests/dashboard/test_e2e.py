"""End to end: `servelab dashboard` on a local port, driven in headless Chromium.

Needs Debian's chromium and the playwright package (both installed by .ci/run); skipped
without them. Screenshots go to tests/artifacts/ (ignored by git).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
PAGES = {"explore": "", "compare": "compare", "llm": "llm", "calibration": "calibration",
         "verify": "verify", "course": "course"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_every_page_renders_its_figures_in_chromium() -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("Debian chromium is not installed")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "servelab.cli", "dashboard", "--port",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.5)
        ARTIFACTS.mkdir(exist_ok=True)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync"])
            view = browser.new_page(viewport={"width": 1500, "height": 1100})
            for name, path in PAGES.items():
                view.goto(f"http://127.0.0.1:{port}/{path}")
                view.wait_for_selector(".js-plotly-plot", timeout=120_000)
                time.sleep(1.0)
                assert view.locator(".js-plotly-plot").count() >= 1, name
                assert view.locator("text=Traceback").count() == 0, name
                view.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
                if name == "compare":  # the load curves sit below the fold: scroll to them
                    curves = view.locator(".js-plotly-plot").filter(
                        has_text="achieved throughput vs offered load")
                    assert curves.count() == 1
                    curves.first.scroll_into_view_if_needed()
                    time.sleep(1.0)
                    curves.first.screenshot(path=str(ARTIFACTS / "compare-curves.png"))
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    for name in [*PAGES, "compare-curves"]:
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
