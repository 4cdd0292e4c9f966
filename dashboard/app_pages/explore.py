"""Explore: one scenario, every knob, the numbers and figures that matter."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import figures
from dashboard.i18n import chart, frame, t
from dashboard.restore import RestoreError, forget_widgets_once, restorable, unshown_fields
from dashboard.state import fmt, profile_choice, run_scenario
from dashboard.widgets import autoscaling_widgets, num_or, policy_widgets, workload_widgets
from sim.metrics.stability import stability_warning

DEFAULT_CLASSES = [
    {"name": "interactive", "share": 0.2, "priority": 0, "slo_ms": 100.0},  # level 0 first
    {"name": "batch", "share": 0.8, "priority": 1, "slo_ms": 1000.0},
]

# The figures sit in tabs; only the open one is computed and drawn (a knob move stays fast).
TABS = ["latency", "over time", "batches and replicas"]
TABS_NOTE = ("Only the open tab's figures are drawn, so a knob move answers quickly; "
             "opening a tab draws its figures for the current settings.")

st.title(t("Explore"))
st.caption(t("Pick a profile, arrivals and a policy; everything re-simulates as you move a knob."))

restore = st.file_uploader(t("restore a scenario (YAML)"), type=["yaml", "yml"], key="restore")
loaded: dict[str, Any] = {}
if restore is not None:
    try:  # one error surface: any problem is one line naming the field; defaults stay
        loaded = restorable(restore.getvalue(), restore.name)
    except RestoreError as exc:
        st.error(f"Could not restore {exc}")
    else:
        forget_widgets_once(restore.getvalue(), "explore-restored",
                            ("explore-", "scaling-"), keep=("explore-tab",))
else:  # the file taken away: the same file uploaded again restores again
    st.session_state.pop("explore-restored", None)

left, right = st.columns([1, 3])
with left:
    profile = profile_choice("explore-profile",
                             default=(loaded.get("service") or {}).get("path"))
    workload = workload_widgets("explore", loaded.get("workload"))
    policy = policy_widgets("explore", loaded.get("policy"))
    with st.expander(t("queue, replicas, SLO")):
        max_len = st.number_input(t("queue bound (0 = none)"), 0, 100_000,
                                  int((loaded.get("queue") or {}).get("max_len") or 0),
                                  key="explore-maxlen")
        timeout = st.number_input(t("request timeout ms (0 = none)"), 0.0, 600_000.0,
                                  float((loaded.get("queue") or {}).get("timeout_ms") or 0.0),
                                  key="explore-timeout")
        replicas = st.slider(t("replicas"), 1, 32, int(num_or(loaded, "replicas", 1)),
                             key="explore-replicas")
        routings = ["shared", "round_robin", "random", "jsq", "p2c", "least_work"]
        routing = st.selectbox(t("routing"), routings,
                               index=routings.index(loaded.get("routing", "shared"))
                               if loaded.get("routing", "shared") in routings else 0,
                               key="explore-routing")
        slo_ms = st.number_input(t("SLO (ms)"), 1.0, 600_000.0,
                                 float(num_or(loaded, "slo_ms", 250)),
                                 key="explore-slo")
        seed = st.number_input(t("seed"), 0, 1_000_000, int(num_or(loaded, "seed", 7)),
                               key="explore-seed")
    with st.expander(t("request classes and queue discipline")):
        disciplines = ["fifo", "priority", "edf"]
        loaded_discipline = (loaded.get("queue") or {}).get("discipline", "fifo")
        discipline = st.selectbox(t("queue discipline"), disciplines,
                                  index=disciplines.index(loaded_discipline)
                                  if loaded_discipline in disciplines else 0,
                                  key="explore-discipline")
        use_classes = st.checkbox(t("request classes (share, priority, own SLO)"),
                                  bool(loaded.get("classes")), key="explore-use-classes")
        classes: list[dict[str, Any]] = []
        if use_classes:
            default = loaded.get("classes") or DEFAULT_CLASSES
            edited = st.data_editor(pd.DataFrame(default), num_rows="dynamic",
                                    key="explore-classes")
            classes = [{str(k): (None if pd.isna(v) else v) for k, v in row.items()}
                       for row in edited.to_dict("records") if row.get("name")]

    with st.expander(t("autoscaling and cold starts")):
        scaling_loaded = loaded.get("autoscaling") or {}
        kinds = ["off", "target", "concurrency"]
        scaling_kind = st.selectbox(
            t("autoscaler"), kinds, index=kinds.index(scaling_loaded.get("kind", "off"))
            if scaling_loaded.get("kind", "off") in kinds else 0, key="explore-scaling",
            help="target: Ray Serve's target_ongoing_requests; concurrency: Knative's KPA "
                 "(min replicas 0 = scale to zero). Off: the fixed replicas above.")
        autoscaling = autoscaling_widgets(scaling_kind, scaling_loaded)
        price = st.number_input(t("price per replica-hour (USD)"), 0.0, 1000.0,
                                float(num_or(loaded, "price_per_replica_hour", 1.0)),
                                key="explore-price")

scenario: dict[str, Any] = {
    "name": "dashboard", "seed": int(seed),
    "service": {"kind": "profile", "path": profile or "builtin:minilm-cpu"},
    "workload": workload, "policy": policy,
    "queue": {"discipline": discipline, "max_len": int(max_len) or None,
              "timeout_ms": float(timeout) or None},
    "replicas": int(replicas), "routing": routing,
    "warmup_s": min(5.0, workload["duration_s"] / 10), "slo_ms": float(slo_ms),
}
if classes:
    scenario["classes"] = classes
scenario["price_per_replica_hour"] = float(price)
if autoscaling is not None:
    scenario.pop("replicas")
    scenario["autoscaling"] = autoscaling
if policy["kind"] == "aimd":
    scenario["policy"]["slo_ms"] = policy.get("slo_ms", slo_ms)

with right:
    unshown = unshown_fields(loaded, scenario) if loaded else []
    if unshown:  # said once, in one line: the run below is not quite the file
        st.warning(f"{t('Restored without')}: {', '.join(unshown)} "
                   f"({t('no control here; run the file with servelab simulate')})")
    result = run_scenario(scenario)
    if result is not None:
        s = result.summary
        warning = stability_warning(s)
        if warning:
            st.warning(f"{t('This run is')} {warning}", icon="⚠️")
        cards = st.columns(5)
        cards[0].metric(t("throughput (req/s)"), fmt(s["throughput_rps"], 1))
        cards[1].metric(t("P50 latency"), fmt(s["latency_ms"]["p50"], 1, " ms"))
        cards[2].metric(t("P95 latency"), fmt(s["latency_ms"]["p95"], 1, " ms"))
        cards[3].metric(t("P99 latency"), fmt(s["latency_ms"]["p99"], 1, " ms"))
        cards[4].metric(t("error rate"), fmt(100 * s["error_rate"], 2, " %"))
        second = st.columns(4)
        second[0].metric(t("device utilisation"), fmt(100 * s["utilization"], 1, " %"))
        second[1].metric(t("mean batch"), fmt(s["mean_batch_size"], 2))
        second[2].metric(t("batch utilisation"), fmt(100 * s["batch_utilization"], 1, " %"))
        second[3].metric(t("queue length p95"), fmt(s["queue_len"]["p95"], 0))
        third = st.columns(4)
        third[0].metric(t("replicas (mean)"), fmt(s["replica_seconds"] / s["window_s"], 2)
                        if s["window_s"] else "–")
        third[1].metric(t("cost per million"), fmt(s["cost_per_million_usd"], 2, " USD"))
        third[2].metric(t("cold starts"), fmt(s["cold_starts"], 0))
        third[3].metric(t("waited on a cold start"), fmt(s["cold_start_waits"], 0))
        if s.get("classes"):
            st.markdown(t("**per request class** (a class whose P99 or error rate runs away "
                          "is being starved)"))
            st.dataframe(frame(figures.class_table(s, scenario.get("classes", []))),
                         hide_index=True)
        runs = {"this scenario": result}
        # Lazy tabs (on_change="rerun"): only the open tab's figures are built and drawn, so a
        # knob move redraws two figures, not seven (benchmarks/dashboard_speed.py).
        tabs = st.tabs([t(name) for name in TABS], key="explore-tab", on_change="rerun")
        if tabs[0].open is not False:
            a, b = tabs[0].columns(2)
            chart(figures.latency_cdf(runs), a)
            chart(figures.percentile_bars(runs), b)
        if tabs[1].open:
            chart(figures.latency_and_replicas(runs), tabs[1])
            chart(figures.queue_over_time(result), tabs[1])
        if tabs[2].open:
            a, b, c = tabs[2].columns(3)
            chart(figures.batch_histogram(result), a)
            chart(figures.replica_utilization(result), b)
            chart(figures.latency_split(result), c)
        st.caption(t(TABS_NOTE))
        st.download_button(t("download this scenario (YAML)"), result.scenario.to_yaml(),
                           file_name="scenario.yaml", mime="application/x-yaml")
