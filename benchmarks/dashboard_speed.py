"""How fast the dashboard answers a knob, measured in headless Chromium.

Starts ``servelab dashboard`` on a free local port, drives it with Debian's chromium through
the ``playwright`` package (as tests/dashboard/test_e2e.py does) and times, per page:

* the first load: from navigation until the page's first KPI card shows a number, and until
  the page has settled;
* knob moves: from the key press (a new value typed into a number input, or an arrow key on a
  focused slider) until the KPI cards show new numbers ("answered") and until the whole page
  has settled: the script run has finished (no stale element, no "running" indicator) and
  the DOM has not changed for ``QUIET_S`` (a MutationObserver stamps every change, Plotly
  drawing its figures included); the time reported is that of the last change. Every move
  goes to a value not seen before in the run, so no answer comes from the dashboard's cache.

Targets (issue 31): every knob move on Explore settles the whole page in <= 0.5 s, on the
LLM page in <= 1 s, for the default scenarios. The machine's load average is printed beside
the numbers: on a shared VM they vary from run to run.

With ``--baseline REV`` the same cases also run against the dashboard of git revision REV
(exported to a temporary directory, served on a second port), page by page in turn with the
current code, so that both see the same machine load: on a shared VM only such a same-run
comparison says whether a change made the dashboard faster.

Usage: python benchmarks/dashboard_speed.py [--repeats 3] [--baseline REV] [--label NAME]
       [--pages explore,llm]
Writes benchmarks/results/dashboard_speed[-LABEL].md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGET_S = {"explore": 0.5, "llm": 1.0}

# True once the script run has finished: no element is stale and the status widget is gone.
SETTLED_JS = """() => !document.querySelector('[data-stale="true"]')
  && !document.querySelector('[data-testid="stStatusWidgetRunningIcon"], '
                             + '[data-testid="stStatusWidgetRunningManIcon"]')"""
# The LLM page first shows the cards of a short run, marked "refining on N requests…", then
# the full run's: *final* is when that mark has gone (on Explore it equals *answered*).
FINAL_JS = """() => !Array.from(document.querySelectorAll('[data-testid="stCaptionContainer"]'))
  .some(e => e.textContent.includes('refining on'))"""
METRICS_JS = """() => Array.from(document.querySelectorAll('[data-testid="stMetricValue"]'))
  .map(e => e.textContent).join('|')"""
# Every change to the page's DOM (an element added or removed, an attribute, a text; a Plotly
# figure drawing its SVG counts) stamps window.__lastChange with the browser's clock: the page
# has *settled* when the script run has finished and nothing changed for QUIET_S, and its
# settle time is that of the last change (so deferred work that runs by itself, e.g. a
# fragment, a figure still drawing, is counted until it stops).
OBSERVER_JS = """(() => {
  window.__lastChange = performance.now();
  const stamp = () => { window.__lastChange = performance.now(); };
  const start = () => new MutationObserver(stamp).observe(document, {subtree: true,
    childList: true, attributes: true, characterData: true});
  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})()"""
QUIET_S = 1.0
QUIET_JS = f"""() => ({SETTLED_JS})()
  && performance.now() - window.__lastChange > {QUIET_S * 1e3}"""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def export_revision(rev: str, into: Path) -> Path:
    """The tree of git revision ``rev`` under ``into`` (``git archive``)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def start_server(port: int, root: Path = ROOT) -> subprocess.Popen[bytes]:
    """``servelab dashboard`` of the tree ``root`` on ``port``, waiting until it answers its
    health check.
    """
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen([sys.executable, "-m", "servelab.cli", "dashboard", "--port",
                             str(port)], cwd=root, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
            return proc
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                stop_server(proc)
                raise RuntimeError("the dashboard did not start") from None
            time.sleep(0.3)


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """End the server and everything it started."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_answer(view: Any, before: str, timeout_s: float = 120.0
                ) -> tuple[float, float, float]:
    """Seconds (from now) until the KPI cards differ from ``before``, until they hold the
    final numbers (no "refining" mark), and until settled.
    """
    t0 = time.perf_counter()
    view.wait_for_function(f"(b) => ({METRICS_JS})() !== b && ({METRICS_JS})() !== ''",
                           arg=before, polling="raf", timeout=timeout_s * 1e3)
    answered = time.perf_counter() - t0
    view.wait_for_function(FINAL_JS, polling="raf", timeout=timeout_s * 1e3)
    final = time.perf_counter() - t0
    return answered, final, last_change_s(view, t0, timeout_s)


def last_change_s(view: Any, t0: float, timeout_s: float) -> float:
    """Wait until the run has finished and the DOM has been still for :data:`QUIET_S`;
    return the seconds from ``t0`` (``time.perf_counter``) to the last change.
    """
    view.wait_for_function(QUIET_JS, polling=50, timeout=timeout_s * 1e3)
    # map the browser's clock onto ours: read both now
    now_browser_ms, last_ms = view.evaluate("() => [performance.now(), window.__lastChange]")
    now = time.perf_counter()
    return (now - t0) - (now_browser_ms - last_ms) / 1e3


def first_load(view: Any, url: str) -> tuple[float, float, float]:
    """Seconds from navigation to the first KPI number, and to the settled page."""
    t0 = time.perf_counter()
    view.goto(url)
    view.wait_for_selector('[data-testid="stMetricValue"]', timeout=180_000)
    shown = time.perf_counter() - t0
    view.wait_for_function(FINAL_JS, polling="raf", timeout=180_000)
    final = time.perf_counter() - t0
    return shown, final, last_change_s(view, t0, 180.0)


def settle(view: Any) -> str:
    """Wait until the run has finished and the page is still; return the KPI cards' text."""
    view.wait_for_function(QUIET_JS, polling=50, timeout=180_000)
    return str(view.evaluate(METRICS_JS))


def type_number(view: Any, label: str, value: float) -> None:
    """Type ``value`` into the number input labelled ``label`` and commit it (Enter)."""
    box = view.get_by_label(label, exact=True)
    box.fill(f"{value:g}")
    box.press("Enter")


def slider_key(view: Any, label: str, key: str) -> None:
    """Press ``key`` on the slider labelled ``label`` (one step)."""
    thumb = view.get_by_role("slider", name=label)
    thumb.focus()
    thumb.press(key)


def move(view: Any, action: Any) -> tuple[float, float, float]:
    """Apply ``action`` to the settled page and time the answer."""
    before = settle(view)
    action()
    return wait_answer(view, before)


def measure(bases: dict[str, str], repeats: int,
            pages: tuple[str, ...] = ("explore", "llm")) -> list[dict[str, Any]]:
    """Every timed case of ``pages`` against every server in ``bases`` (label -> URL), page
    by page in turn; one row per (code, page, case) with each repeat's seconds.
    """
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    rows: list[dict[str, Any]] = []

    def record(code: str, page: str, case: str,
               times: list[tuple[float, float, float]]) -> None:
        rows.append({"code": code, "page": page, "case": case,
                     "answered_s": [round(a, 3) for a, _, _ in times],
                     "final_s": [round(f, 3) for _, f, _ in times],
                     "settled_s": [round(s, 3) for _, _, s in times]})
        print(f"{code:8} {page:8} {case:36} answered {[round(a, 2) for a, _, _ in times]} "
              f"final {[round(f, 2) for _, f, _ in times]} "
              f"settled {[round(s, 2) for _, _, s in times]}", flush=True)

    def explore(view: Any, code: str, base: str) -> None:
        record(code, "explore", "first load", [first_load(view, f"{base}/")])
        record(code, "explore", "rate (number input)",
               [move(view, lambda i=i: type_number(view, "rate (req/s)", 41.0 + i))
                for i in range(repeats)])
        record(code, "explore", "max batch size (slider, one step)",
               [move(view, lambda: slider_key(view, "max batch size", "ArrowRight"))
                for _ in range(repeats)])
        record(code, "explore", "max wait (slider, one step)",
               [move(view, lambda: slider_key(view, "max wait (ms)", "ArrowRight"))
                for _ in range(repeats)])

    def llm(view: Any, code: str, base: str) -> None:
        record(code, "llm", "first load", [first_load(view, f"{base}/llm")])
        record(code, "llm", "rate scale (slider, one step)",
               [move(view, lambda: slider_key(view, "rate × the trace's (5.5 req/s)",
                                              "ArrowRight")) for _ in range(repeats)])
        view.get_by_text("KV cache and limits").click()  # open the expander
        record(code, "llm", "max_num_seqs (number input)",
               [move(view, lambda i=i: type_number(view, "max_num_seqs", 8.0 + 2 * i))
                for i in range(repeats)])

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update"])
        views = {code: browser.new_page(viewport={"width": 1500, "height": 1100})
                 for code in bases}
        for view in views.values():
            view.add_init_script(OBSERVER_JS)
        for page in [{"explore": explore, "llm": llm}[name] for name in pages]:
            for code, base in bases.items():
                page(views[code], code, base)
        browser.close()
    return rows


def write(rows: list[dict[str, Any]], label: str, note: str = "",
          meta_extra: dict[str, Any] | None = None) -> None:
    """The markdown table and the JSON next to it (``note``: how the run was made, e.g. with
    CPU priority; ``meta_extra`` overrides fields of the run's description).
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = f"-{label}" if label else ""
    load = os.getloadavg()
    meta = {"when": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "loadavg_1min": round(load[0], 2), "label": label, "note": note,
            **(meta_extra or {})}
    lines = [f"# Dashboard speed{f' ({label})' if label else ''}", "",
             f"Headless Chromium against `servelab dashboard`, {meta['when']}, "
             f"{meta['cpus']} CPUs, load average {meta['loadavg_1min']} at the end (a shared "
             "VM: absolute times vary between runs; rows of one run share its load). "
             "*answered*: the KPI cards show new numbers (on the LLM page first the "
             "estimate of a short run, marked as such); *final*: the cards hold the full "
             "run's numbers; *settled*: the last change to the page's DOM (figures drawn "
             f"included), once the script run has finished and nothing changed for {QUIET_S:g} s "
             "more. Targets: the whole page settled within Explore <= 0.5 s, LLM <= 1 s per "
             "knob move (on the median of *settled*; min–max: the spread over the moves).",
             *(["", note] if note else []), "",
             "| code | page | case | answered median (s) | final median (s) | settled median "
             "(s) | settled min–max (s) | target (s) | met |",
             "|---|---|---|---:|---:|---:|---:|---:|:---:|"]
    for row in sorted(rows, key=lambda r: (r["page"], r["case"], r["code"] != "current")):
        answered, settled = row["answered_s"], row["settled_s"]
        final = row.get("final_s") or answered
        first = row["case"] == "first load"
        target = TARGET_S[row["page"]]
        met = "—" if first else ("yes" if statistics.median(settled) <= target else "no")
        lines.append(f"| {row['code']} | {row['page']} | {row['case']} | "
                     f"{statistics.median(answered):.2f} | {statistics.median(final):.2f} | "
                     f"{statistics.median(settled):.2f} | {min(settled):.2f}–{max(settled):.2f} | "
                     f"{'—' if first else target} | {met} |")
    (RESULTS / f"dashboard_speed{suffix}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"dashboard_speed{suffix}.json").write_text(
        json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))


def main() -> None:
    """Run the benchmark and write its results."""
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="moves per case")
    parser.add_argument("--baseline", default=None,
                        help="also time this git revision's dashboard, in turn with this one")
    parser.add_argument("--label", default="", help="suffix of the result files")
    parser.add_argument("--pages", default="explore,llm",
                        help="comma-separated pages to time (explore, llm)")
    parser.add_argument("--note", default="", help="how the run was made (into the results)")
    args = parser.parse_args()
    # SIGTERM (``timeout``, a killed fgrun) unwinds like Ctrl-C, so the servers are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    servers: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="servelab-baseline-") as tmp:
        try:
            bases: dict[str, str] = {}
            if args.baseline:
                port = free_port()
                servers.append(start_server(port, export_revision(args.baseline, Path(tmp))))
                bases[f"{args.baseline}"] = f"http://127.0.0.1:{port}"
            port = free_port()
            servers.append(start_server(port))
            bases["current"] = f"http://127.0.0.1:{port}"
            rows = measure(bases, args.repeats, tuple(args.pages.split(",")))
        finally:
            for server in servers:
                stop_server(server)
    write(rows, args.label, args.note)


if __name__ == "__main__":
    main()
