"""Streamlit dashboard (see the dashboard issue); nothing here yet."""
