"""Chinese mode shows no English sentence: every page and every lesson rendered in zh, each
visible text (titles, captions, markdown, notes, KPI labels, widget labels and options,
expanders, table headers, index and cells) must hold Chinese, unless it is a scenario
keyword (one lowercase token such as ``poisson``, ``builtin:minilm-cpu``, ``max_num_seqs``:
what a scenario file says) or has no English word at all (numbers, units, ``P99``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest

from dashboard.widgets import POLICY_KINDS, WORKLOAD_KINDS

PAGES = Path(__file__).resolve().parents[2] / "dashboard" / "app_pages"
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
ENGLISH_WORD = re.compile(r"(?<![\w`/.:-])[a-z]{3,}(?![\w`/.:-])")
KEYWORD = re.compile(r"[\w.:/\-…]+")  # one token: a scenario keyword, a path, a file name
CODE = re.compile(r"`[^`]*`")  # inline code: commands and flags stay as typed
SETTING = re.compile(r"\w+=[^,)\s]+")  # key=value: a scenario setting as written
KEYWORDS = {*POLICY_KINDS, *WORKLOAD_KINDS}  # a configuration's name: "2: dynamic (…)"


def is_text(values: Any) -> bool:
    """Whether a column or index holds text (pandas 3 gives text its own dtype)."""
    return values.dtype == object or pd.api.types.is_string_dtype(values)


def visible_texts(at: AppTest) -> list[tuple[str, str]]:
    """(where, text) of everything an AppTest run shows."""
    out: list[tuple[str, str]] = []
    for kind in ("title", "header", "subheader", "caption", "markdown", "info", "warning",
                 "error", "success"):
        out += [(kind, str(e.value)) for e in at.get(kind)]
    out += [("metric", str(m.label)) for m in at.metric]
    for kind in ("selectbox", "slider", "number_input", "text_input", "checkbox", "radio",
                 "multiselect", "toggle", "select_slider", "text_area"):
        for w in at.get(kind):
            out.append((f"{kind} label", str(w.label)))
            if kind in ("selectbox", "radio", "multiselect", "select_slider"):
                out += [(f"{kind} option", str(o)) for o in w.options]
    out += [("expander", str(e.label)) for e in at.get("expander")]
    out += [("tab", str(e.label)) for e in at.get("tab")]
    for table in [*at.dataframe, *at.table]:
        value: Any = table.value
        out += [("table header", str(c)) for c in value.columns]
        if is_text(value.index):
            out += [("table index", str(i)) for i in value.index]
        for col in value.columns:
            if is_text(value[col]):
                out += [("table cell", str(x)) for x in value[col].dropna().unique()]
    return out


def untranslated(at: AppTest) -> list[str]:
    """The visible texts that read as English in zh mode."""
    bad = set()
    for where, text in visible_texts(at):
        plain = SETTING.sub("", CODE.sub("", text)).strip()
        words = set(ENGLISH_WORD.findall(plain))
        if CJK.search(plain) or KEYWORD.fullmatch(plain) or words <= KEYWORDS:
            continue
        bad.add(f"{where}: {text[:100]!r}")
    return sorted(bad)


def zh_page(name: str) -> AppTest:
    at = AppTest.from_file(str(PAGES / f"{name}.py"), default_timeout=300)
    at.session_state["lang"] = "zh"  # the sidebar's switch (app.py) sets it
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_checker_catches_english_and_passes_chinese() -> None:
    at = zh_page("profiles")
    assert untranslated(at) == []
    at.session_state["lang"] = "en"
    at.run()
    assert any("Latency of one batch" in line for line in untranslated(at))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["explore", "compare", "profiles", "verify", "llm"])
def test_pages_show_no_english_sentence_in_chinese(name: str) -> None:
    at = zh_page(name)
    missing = untranslated(at)
    if name == "verify":  # the endpoint comparison too
        stub = next(o for o in at.selectbox(key="verify-run").options if "端点" in o)
        at.selectbox(key="verify-run").select(stub).run()
        assert not at.exception
        missing += untranslated(at)
    if name in ("explore", "llm"):  # every figure tab, opened (their labels are Chinese)
        for tab in at.get("tab")[1:]:
            at.session_state[f"{name}-tab"] = tab.label
            at.run()
            assert not at.exception
            missing += untranslated(at)
    if name == "llm":  # the prefix-caching section, switched on
        at.toggle(key="llm-prefix").set_value(True).run()
        assert not at.exception
        missing += untranslated(at)
    assert not missing, "\n".join(sorted(set(missing)))


@pytest.mark.slow
def test_every_lesson_shows_no_english_sentence_in_chinese() -> None:
    at = zh_page("course")
    missing = []
    for title in at.selectbox(key="course-lesson").options:
        at.selectbox(key="course-lesson").set_value(title).run()
        assert not at.exception, title
        missing += [f"{title[:12]} {line}" for line in untranslated(at)]
    assert not missing, "\n".join(missing)
