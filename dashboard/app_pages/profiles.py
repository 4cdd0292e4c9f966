"""Calibration: measured latency curves, overlaid (CPU vs GPU, model vs model).

Named profiles.py, not calibration.py: Streamlit puts this folder on sys.path, and a page
named calibration would shadow the calibration package.
"""

from __future__ import annotations

import json

import streamlit as st

from calibration.profile import (
    LatencyProfile,
    ProfileError,
    builtin_profiles,
    load_profile,
    profile_summary,
)
from calibration.report import profile_figure
from dashboard.i18n import chart, t
from dashboard.state import parse_upload

st.title(t("Calibration profiles"))
st.caption(t("Latency of one batch against batch size, as measured (median with p5–p95 "
             "band), the throughput it gives, and what each item costs."))

names = [f"builtin:{n}" for n in builtin_profiles()]
chosen = st.multiselect(t("profiles"), names, default=[n for n in names if "cpu" in n][:2],
                        key="calibration-profiles")
uploads = st.file_uploader(t("or upload profile JSON files"), type=["json"],
                           accept_multiple_files=True, key="calibration-upload")
profiles: list[LatencyProfile] = []
labels: list[str] = []
for ref in chosen:
    try:
        profiles.append(load_profile(ref))
        labels.append(ref.removeprefix("builtin:"))
    except ProfileError as exc:
        st.error(str(exc))
for upload in uploads or []:
    try:
        profiles.append(LatencyProfile.from_dict(parse_upload(upload.getvalue(), upload.name),
                                                 source=upload.name))
        labels.append(upload.name)
    except (ValueError, ProfileError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        # parse_upload's and from_dict's messages start with the file's name already
        message = str(exc)
        st.error(message if message.startswith(f"{upload.name}: ")
                 else f"{upload.name}: {message}")

if not profiles:
    st.info(t("Pick at least one profile."))
else:
    chart(profile_figure(profiles, labels))
    for profile, name in zip(profiles, labels, strict=True):
        meta = profile.meta
        st.markdown(f"**{name}** — {profile.device.get('name', profile.device.get('kind'))}, "
                    f"{meta.get('dtype')}, {meta.get('threads')} {t('threads')}, torch "
                    f"{meta.get('torch_version')}, {t('measured')} {meta.get('created_at')}"
                    + (f" — **{t('synthetic')}**" if meta.get("synthetic") else ""))
        st.dataframe(profile_summary(profile), hide_index=True)
