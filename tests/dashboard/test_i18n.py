"""Chinese mode: every string the pages pass through t() is translated, every figure's
titles and axes come out in Chinese, and the bundled font holds every character used.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")

import sim
from dashboard import figures
from dashboard.font_subset import OUT, needed_characters
from dashboard.i18n import frame, localize
from dashboard.zh import ZH

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"


def literal_t_calls() -> list[tuple[str, str]]:
    """(file, text) of every ``t("literal")`` and ``t(NAME)`` whose NAME is a module-level
    string constant, in the dashboard's sources.
    """
    found = []
    for path in sorted(DASHBOARD.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {node.targets[0].id: node.value.value for node in tree.body
                     if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                     and isinstance(node.value, ast.Constant)
                     and isinstance(node.value.value, str)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "t" and node.args):
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((path.name, arg.value))
                elif isinstance(arg, ast.Name) and arg.id in constants:
                    found.append((path.name, constants[arg.id]))
    return found


def test_every_page_string_has_its_chinese() -> None:
    calls = literal_t_calls()
    assert len(calls) > 30  # the pages do route their labels through t()
    missing = sorted({f"{name}: {text!r}" for name, text in calls if text not in ZH})
    assert not missing, "\n".join(missing)


def test_figures_read_in_chinese() -> None:
    result = sim.run({"seed": 1, "service": {"kind": "constant", "ms": 5.0},
                      "workload": {"kind": "poisson", "rate_rps": 100, "duration_s": 5},
                      "policy": {"kind": "dynamic", "max_batch_size": 4, "max_wait_ms": 2},
                      "warmup_s": 0.5})
    runs = {"a": result}
    built = [figures.latency_cdf(runs), figures.percentile_bars(runs),
             figures.queue_over_time(result), figures.batch_histogram(result),
             figures.replica_utilization(result), figures.latency_split(result),
             figures.latency_and_replicas(runs),
             figures.load_curves(pd.DataFrame([figures.sweep_row("a", result.summary)])),
             figures.goodput_curves(pd.DataFrame([figures.sweep_row("a", result.summary)]))]
    for fig in built:
        localize(fig, "zh")
        texts = [fig.layout.title.text] if fig.layout.title.text else []
        texts += [getattr(fig.layout, a).title.text for a in dir(fig.layout)
                  if a.startswith(("xaxis", "yaxis")) and getattr(fig.layout, a) is not None
                  and getattr(fig.layout, a).title.text]
        texts += [note.text for note in fig.layout.annotations or ()]
        assert texts
        for text in texts:
            assert any("\u4e00" <= ch <= "\u9fff" for ch in text), text
        assert "ServelabCJK" in fig.layout.font.family


def test_tables_translate_their_headers() -> None:
    table = pd.DataFrame([{"scheduler": "x", "TTFT P99 (ms)": 1.0, "verdict": "unstable"}])
    out = frame(table, "zh")
    assert list(out.columns) == ["调度器", "TTFT P99（毫秒）", "结论"]
    assert out.iloc[0]["结论"] == "不稳定"
    assert frame(table, "en").equals(table)


def test_the_bundled_font_holds_every_character_the_dashboard_uses() -> None:
    ttlib = pytest.importorskip("fontTools.ttLib")
    font = ttlib.TTFont(str(OUT))
    cmap = font.getBestCmap()
    missing = sorted(ch for ch in needed_characters() if ord(ch) not in cmap)
    assert not missing, ("characters missing from the font; run python -m "
                         f"dashboard.font_subset: {''.join(missing)}")
    assert font["name"].getDebugName(1) == "Servelab CJK Subset"  # no Reserved Font Name
    assert (OUT.parent / "OFL.txt").read_text().startswith(OUT.name.join(
        ["dashboard/static/", " is a subset"]))
