"""servelab dashboard: ``servelab dashboard`` or ``streamlit run dashboard/app.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run dashboard/app.py` from a checkout
    sys.path.insert(0, str(ROOT))

from dashboard.i18n import inject_font, picker, t  # noqa: E402 - after the path fix
from dashboard.state import inject_styles  # noqa: E402

PAGES = Path(__file__).resolve().parent / "app_pages"

st.set_page_config(page_title="servelab", layout="wide")
inject_font()
inject_styles()
picker()
page = st.navigation([
    st.Page(PAGES / "explore.py", title=t("Explore"), default=True),
    st.Page(PAGES / "compare.py", title=t("Compare"), url_path="compare"),
    st.Page(PAGES / "llm.py", title=t("LLM"), url_path="llm"),
    st.Page(PAGES / "profiles.py", title=t("Calibration"), url_path="calibration"),
    st.Page(PAGES / "verify.py", title=t("Verify"), url_path="verify"),
    st.Page(PAGES / "course.py", title=t("Course"), url_path="course"),
])
page.run()
