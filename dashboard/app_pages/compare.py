"""Compare: two to four policies on the same arrival schedule, and over a load sweep."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import figures
from dashboard.i18n import chart, t
from dashboard.i18n import frame as localized
from dashboard.state import fmt, profile_choice, run_scenario
from dashboard.widgets import policy_widgets

st.title(t("Compare policies"))
st.caption(t("Every configuration sees the very same arrivals (same seed); then all of them "
             "over a range of loads."))

CURVES_NOTE = ("Throughput is what finished in the window: it follows the offered load, then "
               "flattens at the capacity while latency climbs. × marks the knee (the first "
               "load whose P99 is more than 3× the lightest load's); hollow red-edged markers "
               "are unstable runs (offered load above capacity: their latency only says how "
               "long the run lasted).")

DEFAULTS: list[dict[str, Any]] = [
            {"kind": "none"}, {"kind": "dynamic", "max_batch_size": 8, "max_wait_ms": 5},
            {"kind": "greedy", "max_batch_size": 32}, {"kind": "dynamic", "max_batch_size": 32,
                                                       "max_wait_ms": 20}]

top = st.columns(4)
with top[0]:
    profile = profile_choice("compare-profile")
with top[1]:
    rate = st.number_input(t("rate (req/s)"), 0.1, 100_000.0, 40.0, key="compare-rate")
with top[2]:
    duration = st.slider(t("duration (s)"), 5, 300, 60, key="compare-duration")
with top[3]:
    count = st.slider(t("configurations"), 2, 4, 3, key="compare-count")
slo_ms = st.number_input(t("SLO for goodput (ms)"), 1.0, 600_000.0, 250.0, key="compare-slo")

policies: list[dict[str, Any]] = []
for i, col in enumerate(st.columns(count)):
    with col:
        st.subheader(f"{t('config')} {i + 1}")
        policies.append(policy_widgets(f"cmp{i}", DEFAULTS[i]))


def scenario(policy: dict[str, Any], rate_rps: float, seconds: float) -> dict[str, Any]:
    return {"name": "compare", "seed": 3,
            "service": {"kind": "profile", "path": profile or "builtin:minilm-cpu"},
            "workload": {"kind": "poisson", "rate_rps": rate_rps, "duration_s": seconds},
            "policy": policy, "warmup_s": min(5.0, seconds / 10), "slo_ms": slo_ms}


def label(i: int, policy: dict[str, Any]) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in policy.items() if k != "kind")
    return f"{i + 1}: {policy['kind']}" + (f" ({knobs})" if knobs else "")


results = {}
for i, policy in enumerate(policies):
    result = run_scenario(scenario(policy, rate, duration))
    if result is not None:
        results[label(i, policy)] = result

if results:
    table = pd.DataFrame([{
        "config": name, "throughput (req/s)": fmt(r.summary["throughput_rps"]),
        "P50 (ms)": fmt(r.summary["latency_ms"]["p50"]),
        "P99 (ms)": fmt(r.summary["latency_ms"]["p99"]),
        "mean batch": fmt(r.summary["mean_batch_size"], 2),
        "utilisation (%)": fmt(100 * r.summary["utilization"]),
        "error rate (%)": fmt(100 * r.summary["error_rate"], 2)} for name, r in results.items()])
    st.dataframe(localized(table), hide_index=True)
    a, b = st.columns(2)
    chart(figures.latency_cdf(results), a)
    chart(figures.percentile_bars(results), b)

st.subheader(t("over a load sweep"))
factors = st.multiselect(t("offered load as a multiple of the rate above"),
                         [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0],
                         default=[0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0], key="compare-factors")
sweep_seconds = st.slider(t("duration per point (s)"), 5, 120, 20, key="compare-sweep-duration")
rows = []
for i, policy in enumerate(policies):
    for factor in sorted(factors):
        result = run_scenario(scenario(policy, rate * factor, sweep_seconds),
                              records="summary")  # the curves read summaries only
        if result is None:
            continue
        rows.append(figures.sweep_row(label(i, policy), result.summary))
if rows:
    frame = pd.DataFrame(rows)
    chart(figures.load_curves(frame))
    st.caption(t(CURVES_NOTE))
    unstable = frame[frame["verdict"] == "unstable"]
    if len(unstable):
        st.warning(t("{n} of {total} sweep points are unstable: the offered load exceeds what "
                     "the configuration can finish.").format(n=len(unstable), total=len(frame)))
    chart(figures.goodput_curves(frame))
