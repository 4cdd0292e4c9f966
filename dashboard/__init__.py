"""Streamlit + Plotly dashboard: Explore, Compare, Calibration, Verify, Course.

Start it with ``servelab dashboard``. Figures live in :mod:`dashboard.figures` (no streamlit),
pages in ``dashboard/app_pages/``.
"""
