"""Course: interactive lessons on serving trade-offs (English / 中文, the sidebar's switch)."""

from __future__ import annotations

import streamlit as st

from dashboard.i18n import current
from dashboard.lessons import LESSONS

lang = current()
st.title("Course" if lang == "en" else "课程")
titles = [lesson.title[lang] for lesson in LESSONS]
choice = st.selectbox("lesson" if lang == "en" else "课", titles, key="course-lesson")
lesson = LESSONS[titles.index(choice)]
st.header(lesson.title[lang])
st.markdown(lesson.text[lang])
st.subheader("Experiment" if lang == "en" else "实验")
lesson.experiment(lang)
st.info(("Question: " if lang == "en" else "问题：") + lesson.question[lang])
