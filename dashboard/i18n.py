"""The dashboard's language: one switch for every page, and the bundled CJK font.

English strings are the keys; :data:`dashboard.zh.ZH` holds their Chinese. Pages pass what
they show through :func:`t` (labels, KPI names, table headers), figures through
:func:`chart` (titles, axes, legends, annotations) and tables through :func:`frame`, so one
dictionary covers the whole page. The font is a subset of Noto Sans SC (SIL Open Font
License, ``dashboard/static/OFL.txt``) holding the characters the dashboard uses, declared
with ``@font-face`` for CJK code points only and named after Streamlit's own font in the
theme (:data:`THEME_FONT`, which ``servelab dashboard`` passes), so Latin text keeps
Streamlit's face and Chinese renders on a machine without CJK fonts.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboard.zh import ZH, ZH_PATTERNS

LANGS = {"English": "en", "中文": "zh"}
STATIC = Path(__file__).resolve().parent / "static"
FONT_FILE = "NotoSansSC-servelab.woff"
FONT_FAMILY = "ServelabCJK"
# CJK punctuation, ideographs, full-width forms: what the subset holds beyond Latin
CJK_RANGE = "U+2000-206F, U+2E80-2FFF, U+3000-303F, U+3400-9FFF, U+F900-FAFF, U+FF00-FFEF"
PLOTLY_FONT = f'"Open Sans", verdana, arial, {FONT_FAMILY}, sans-serif'
# Streamlit's theme font with the bundled face as its fallback (``servelab dashboard`` passes
# it as --theme.font); Latin keeps Source Sans, CJK code points come from the subset
THEME_FONT = f"Source Sans, {FONT_FAMILY}, sans-serif"


def current() -> str:
    """The chosen language: ``en`` or ``zh``."""
    return str(st.session_state.get("lang", "en"))


def t(text: str) -> str:
    """``text`` in the chosen language (itself when English or untranslated)."""
    return str(_tr(text)) if current() == "zh" else text


def translator() -> Callable[[str], str]:
    """:func:`t` bound to the language chosen now: a widget's ``format_func`` (Streamlit
    may call it where the session's state is not at hand).
    """
    lang = current()
    return lambda text: str(_tr(text)) if lang == "zh" else text


def picker() -> None:
    """The language switch (in the sidebar); stores ``en``/``zh`` in ``session_state.lang``."""
    names = list(LANGS)
    index = list(LANGS.values()).index(current())
    name = st.sidebar.radio("language / 语言", names, index=index, horizontal=True,
                            key="lang-picker")
    st.session_state["lang"] = LANGS[str(name)]


def _tr(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if value in ZH:
        return ZH[value]
    for pattern, chinese in _PATTERNS:  # labels with a number in them: "batch ≤ 8"
        hit = pattern.fullmatch(value)
        if hit:
            return chinese.format(*hit.groups())
    return value


_PATTERNS = [(re.compile(pattern), chinese) for pattern, chinese in ZH_PATTERNS]


def localize(fig: go.Figure, lang: str | None = None) -> go.Figure:
    """Translate a figure's title, axis titles, legend names and annotations in place
    (``lang`` ``zh``; None: the chosen language), and set a font stack that ends in the
    bundled CJK face.
    """
    fig.update_layout(font={"family": PLOTLY_FONT})
    if (lang or current()) != "zh":
        return fig
    layout = fig.layout
    if layout.title and layout.title.text:
        layout.title.text = _tr(layout.title.text)
    for axis in (*fig.select_xaxes(), *fig.select_yaxes()):
        if axis.title and axis.title.text:
            axis.title.text = _tr(axis.title.text)
    for note in layout.annotations or ():
        note.text = _tr(note.text)
    for trace in fig.data:
        if getattr(trace, "name", None):
            trace.name = _tr(trace.name)
        bar = getattr(getattr(trace, "marker", None), "colorbar", None)
        if bar is not None and bar.title and bar.title.text:
            bar.title.text = _tr(bar.title.text)
        if isinstance(trace, go.Bar) and trace.x is not None:
            trace.x = [_tr(x) for x in trace.x]
    return fig


def chart(fig: go.Figure, where: Any = None) -> None:
    """Show a figure (localized) with ``st.plotly_chart``, or ``where.plotly_chart``."""
    (where or st).plotly_chart(localize(fig))


def frame(table: pd.DataFrame, lang: str | None = None) -> pd.DataFrame:
    """A table with its headers (and string cells of known phrases) translated."""
    if (lang or current()) != "zh":
        return table
    out = table.rename(columns=lambda c: _tr(str(c)))
    for col in out.columns:
        if out[col].dtype == object or pd.api.types.is_string_dtype(out[col]):
            out[col] = out[col].map(_tr)
    return out


@cache
def _font_data_url() -> str:
    data = (STATIC / FONT_FILE).read_bytes()
    return "data:font/woff;base64," + base64.b64encode(data).decode("ascii")


def font_css() -> str:
    """The ``<style>`` that declares the bundled font: served by Streamlit's static file
    server when it is on (``servelab dashboard`` turns it on), else inlined as a data URL.
    """
    if st.get_option("server.enableStaticServing"):
        url = f"app/static/{FONT_FILE}"
    else:
        url = _font_data_url()
    face = (f'src: url("{url}") format("woff"); unicode-range: {CJK_RANGE}; '
            "font-weight: 100 900; font-style: normal; font-display: block;")
    return f'<style>@font-face {{ font-family: "{FONT_FAMILY}"; {face} }}</style>'


def inject_font() -> None:
    """Put :func:`font_css` into the page (once per run)."""
    st.html(font_css())
