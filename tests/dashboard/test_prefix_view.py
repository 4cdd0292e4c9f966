"""The LLM page's prefix-caching switch: off runs nothing, on compares caching off and on."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

PAGE = Path(__file__).resolve().parents[2] / "dashboard" / "app_pages" / "llm.py"


@pytest.mark.slow
def test_prefix_switch_shows_the_hit_rate_and_a_faster_ttft() -> None:
    at = AppTest.from_file(str(PAGE), default_timeout=300)
    at.run()
    assert not at.exception, at.exception
    charts = len(at.get("plotly_chart"))
    at.toggle(key="llm-prefix").set_value(True).run()
    assert not at.exception, at.exception
    assert len(at.get("plotly_chart")) == charts + 1
    cards = {m.label: m.value for m in at.metric}
    assert 0 < float(cards["hit rate (tokens)"].rstrip("%")) < 100
    off, on = (float(x.split()[0].replace(",", "")) for x in
               cards["TTFT P50 off → on"].split("→"))
    assert on < off


@pytest.mark.slow
def test_second_turn_lesson_shows_later_turns_reusing_their_prefix() -> None:
    at = AppTest.from_file(str(PAGE.parent / "course.py"), default_timeout=300)
    at.run()
    title = next(t for t in at.selectbox(key="course-lesson").options
                 if "second turn" in t)
    at.selectbox(key="course-lesson").set_value(title).run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value.set_index("")

    def num(text: object) -> float:
        return float(str(text).replace(",", ""))

    on, off = table.loc["caching on, turns 2+"], table.loc["caching off, turns 2+"]
    assert num(on["cached tokens (mean)"]) > 0 == num(off["cached tokens (mean)"])
    assert num(on["TTFT P50 ms"]) < num(off["TTFT P50 ms"])
    at.session_state["lang"] = "zh"  # the sidebar's language switch (app.py) sets it
    at.run()
    assert not at.exception
