"""servelab dashboard: ``servelab dashboard`` or ``streamlit run dashboard/app.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `streamlit run dashboard/app.py` from a checkout
    sys.path.insert(0, str(ROOT))

PAGES = Path(__file__).resolve().parent / "app_pages"

st.set_page_config(page_title="servelab", layout="wide")
page = st.navigation([
    st.Page(PAGES / "explore.py", title="Explore", default=True),
    st.Page(PAGES / "compare.py", title="Compare"),
    st.Page(PAGES / "llm.py", title="LLM", url_path="llm"),
    st.Page(PAGES / "profiles.py", title="Calibration", url_path="calibration"),
    st.Page(PAGES / "verify.py", title="Verify"),
    st.Page(PAGES / "course.py", title="Course"),
])
page.run()
