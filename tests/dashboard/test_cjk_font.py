"""Chinese renders as glyphs, not boxes, in a browser that has no CJK font of its own.

Chromium runs with a fontconfig that lists only the Latin system fonts (so any CJK character
it cannot find in a web font is drawn as a box), against ``servelab dashboard``. The Course
page in Chinese must load the bundled face, draw different characters differently, and look
different from the same page with the bundled font blocked. Screenshots of Chinese pages go
to tests/artifacts/ (the README's docs/img/*-zh.png come from there).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LATIN_FONTS = Path("/usr/share/fonts/truetype")
FONT_FILE = "NotoSansSC-servelab.woff"

# alpha channel of one character drawn on a canvas with a given CSS font
DRAW_JS = """async ([font, a, b]) => {
  await document.fonts.load(font, a + b);
  const draw = (ch) => {
    const c = document.createElement('canvas'); c.width = 64; c.height = 64;
    const x = c.getContext('2d'); x.font = font; x.fillText(ch, 4, 50);
    return Array.from(x.getImageData(0, 0, 64, 64).data.filter((_, i) => i % 4 === 3));
  };
  const da = draw(a), db = draw(b);
  return {differ: da.some((v, i) => v !== db[i]), ink: da.filter(v => v > 0).length};
}"""
LOADED_JS = """() => document.fonts.ready.then(() => [...document.fonts].filter(
  f => f.family.replace(/["']/g, '') === 'ServelabCJK' && f.status === 'loaded').length)"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ink(png: bytes) -> int:
    """Dark pixels of a screenshot."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("L")
    return sum(count for value, count in enumerate(image.histogram()) if value < 128)


@pytest.mark.slow
def test_chinese_renders_with_the_bundled_font_where_chromium_has_no_cjk_font(
        tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    if CHROMIUM is None:
        pytest.skip("Debian chromium is not installed")
    conf = tmp_path / "fonts.conf"
    conf.write_text('<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd">'
                    f"<fontconfig><dir>{LATIN_FONTS}</dir>"
                    f"<cachedir>{tmp_path / 'fc-cache'}</cachedir></fontconfig>")
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "servelab.cli", "dashboard", "--port",
                               str(port)], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.time() + 90
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
                break
            except OSError:
                assert time.time() < deadline, "the dashboard did not start"
                time.sleep(0.5)
        ARTIFACTS.mkdir(exist_ok=True)
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, env={
                **os.environ, "FONTCONFIG_FILE": str(conf)}, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update"])

            def course_in_chinese(block_font: bool) -> tuple[object, bytes]:
                view = browser.new_page(viewport={"width": 1400, "height": 1000})
                if block_font:
                    view.route(f"**/{FONT_FILE}", lambda route: route.abort())
                view.goto(f"http://127.0.0.1:{port}/course")
                view.wait_for_selector("h1", timeout=120_000)
                view.get_by_text("中文", exact=True).click()
                view.wait_for_selector("h1:has-text('课程')", timeout=60_000)
                view.wait_for_selector(".js-plotly-plot", timeout=120_000)
                time.sleep(1.5)
                return view, view.locator("h1").first.screenshot()

            view, with_font = course_in_chinese(block_font=False)
            # the machine's fonts as this browser sees them: CJK is boxes (identical glyphs)
            system = view.evaluate(DRAW_JS, ["40px sans-serif", "课", "程"])
            if system["differ"]:
                pytest.skip("Chromium found a CJK system font despite FONTCONFIG_FILE")
            assert view.evaluate(LOADED_JS) >= 1  # the page's text pulled in the subset
            ours = view.evaluate(DRAW_JS, ["40px ServelabCJK", "课", "程"])
            assert ours["differ"] and ours["ink"] > 50
            view.screenshot(path=str(ARTIFACTS / "course-zh.png"), full_page=True)
            view.get_by_text("探索", exact=True).click()  # the language lives in the session
            view.wait_for_selector("h1:has-text('探索')", timeout=60_000)
            view.wait_for_selector(".js-plotly-plot", timeout=120_000)
            time.sleep(1.5)
            view.screenshot(path=str(ARTIFACTS / "explore-zh.png"), full_page=True)

            blocked_view, without_font = course_in_chinese(block_font=True)
            assert blocked_view.evaluate(LOADED_JS) == 0
            # the same title drawn as boxes: a different picture, with different ink
            assert with_font != without_font
            assert abs(ink(with_font) - ink(without_font)) > 0.05 * max(ink(without_font), 1)
            browser.close()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
