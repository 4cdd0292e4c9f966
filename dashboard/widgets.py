"""Scenario-building widgets shared by the Explore and Compare pages."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard.i18n import t
from sim.serving.autoscaling import AGGREGATIONS

POLICY_KINDS = ["none", "greedy", "fixed", "dynamic", "aimd", "slo"]
WORKLOAD_KINDS = ["poisson", "gamma", "mmpp", "sinusoid", "constant", "closed"]



def num_or(d: Any, key: str | None, default: float) -> float:
    """A restored number for a control: ``d[key]`` (``d`` itself with no key), or the
    page's default where it is unset (None) or not one number (a list of per-state values:
    the page names it as not shown).
    """
    value = d if key is None else (d or {}).get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return value


def _pair(values: Any, i: int) -> Any:
    """The ``i``-th of a list of two, else None."""
    return values[i] if isinstance(values, list) and len(values) == 2 else None

def policy_widgets(prefix: str, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Widgets for a policy; returns its scenario section."""
    d = defaults or {}
    kind = st.selectbox(t("policy"), POLICY_KINDS,
                        index=POLICY_KINDS.index(d.get("kind", "dynamic")),
                        key=f"{prefix}-policy-kind")
    policy: dict[str, Any] = {"kind": kind}
    if kind in ("greedy", "dynamic", "aimd", "slo"):
        policy["max_batch_size"] = st.slider(t("max batch size"), 1, 64,
                                             int(num_or(d, "max_batch_size", 8)),
                                             key=f"{prefix}-max-batch")
    if kind == "fixed":
        policy["batch_size"] = st.slider(t("batch size"), 1, 64, int(num_or(d, "batch_size", 8)),
                                         key=f"{prefix}-batch")
        policy["timeout_ms"] = st.number_input(t("flush a partial batch after (ms)"), 0.0, 10_000.0,
                                               float(num_or(d, "timeout_ms", 20.0)),
                                               key=f"{prefix}-flush")
    if kind == "dynamic":
        policy["max_wait_ms"] = st.slider(t("max wait (ms)"), 0.0, 100.0,
                                          float(num_or(d, "max_wait_ms", 5.0)), 0.5,
                                          key=f"{prefix}-wait")
        policy["timer"] = st.radio(t("timer starts"), ["request", "first"], horizontal=True,
                                   index=["request", "first"].index(d.get("timer", "request")),
                                   key=f"{prefix}-timer",
                                   help="request: from each request's enqueue (Triton); first: "
                                        "from the first request taken (Ray Serve, TorchServe)")
    if kind == "aimd":
        policy["slo_ms"] = st.number_input(t("batch latency objective (ms)"), 1.0, 10_000.0,
                                           float(num_or(d, "slo_ms", 100.0)), key=f"{prefix}-aimd")
    return policy


def workload_widgets(prefix: str, defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """Widgets for a workload; returns its scenario section."""
    d = defaults or {}
    kind = st.selectbox(t("arrivals"), WORKLOAD_KINDS,
                        index=WORKLOAD_KINDS.index(d.get("kind", "poisson")),
                        key=f"{prefix}-workload-kind")
    workload: dict[str, Any] = {"kind": kind,
                                "duration_s": st.slider(t("duration (s)"), 5, 600,
                                                        int(num_or(d, "duration_s", 60)),
                                                        key=f"{prefix}-duration")}
    if kind in ("poisson", "gamma", "constant", "sinusoid"):
        workload["rate_rps"] = st.number_input(t("rate (req/s)"), 0.1, 100_000.0,
                                               float(num_or(d, "rate_rps", 40.0)),
                                               key=f"{prefix}-rate")
    if kind == "gamma":
        workload["cv"] = st.slider(t("burstiness (CV of gaps)"), 0.25, 8.0,
                                   float(num_or(d, "cv", 2.0)),
                                   0.25, key=f"{prefix}-cv")
    if kind == "sinusoid":
        workload["amplitude"] = st.slider(t("amplitude (share of the mean rate)"), 0.0, 1.0,
                                          float(num_or(d, "amplitude", 0.8)), 0.05,
                                          key=f"{prefix}-amp")
        workload["period_s"] = st.number_input(t("period (s): a 'day'"), 1.0, 86_400.0,
                                               float(num_or(d, "period_s", 120.0)),
                                               key=f"{prefix}-period")
    if kind == "mmpp":
        high = st.number_input(t("burst rate (req/s)"), 0.1, 100_000.0,
                               float(num_or(_pair(d.get("rates_rps"), 0), None, 100.0)),
                               key=f"{prefix}-hi")
        low = st.number_input(t("quiet rate (req/s)"), 0.0, 100_000.0,
                              float(num_or(_pair(d.get("rates_rps"), 1), None, 10.0)),
                              key=f"{prefix}-lo")
        dwell = st.slider(t("mean state duration (s)"), 0.1, 30.0,
                          float(num_or(d, "mean_dwell_s", 2.0)), key=f"{prefix}-dwell")
        workload.update({"rates_rps": [high, low], "mean_dwell_s": dwell})
    if kind == "closed":
        workload["clients"] = st.slider(t("clients"), 1, 256, int(num_or(d, "clients", 8)),
                                        key=f"{prefix}-clients")
        workload["think_ms"] = st.number_input(t("think time (ms)"), 0.0, 60_000.0,
                                               float(num_or(d, "think_ms", 100.0)),
                                               key=f"{prefix}-think")
    return workload


def autoscaling_widgets(kind: str, defaults: dict[str, Any] | None = None
                        ) -> dict[str, Any] | None:
    """Widgets for an autoscaler (``off``: None, fixed replicas); returns its section."""
    if kind == "off":
        return None
    d = defaults or {}
    zero = kind == "concurrency"
    out: dict[str, Any] = {"kind": kind}
    lo, hi = st.slider(t("replicas (min, max)"), 0, 16,
                       (int(num_or(d, "min_replicas", 0 if zero else 1)),
                        int(num_or(d, "max_replicas", 4))), key=f"scaling-{kind}-bounds")
    out.update({"min_replicas": lo, "max_replicas": max(hi, 1)})
    out["cold_start_s"] = st.number_input(
        t("cold start (s) when the profile has none"), 0.0, 600.0,
        float(num_or(d, "cold_start_s", 5.0)), key=f"scaling-{kind}-cold",
        help="Load weights, move to the device, first forward; used when the profile was "
             "calibrated without --load-reps")
    if kind == "target":
        out["target_ongoing_requests"] = st.number_input(
            t("target ongoing requests per replica"), 0.1, 1000.0,
            float(num_or(d, "target_ongoing_requests", 2.0)), key="scaling-target-t")
        out["upscale_delay_s"] = st.slider(t("upscale delay (s)"), 0.0, 120.0,
                                           float(num_or(d, "upscale_delay_s", 5.0)),
                                           key="scaling-target-up")
        out["downscale_delay_s"] = st.slider(t("downscale delay (s)"), 0.0, 600.0,
                                             float(num_or(d, "downscale_delay_s", 30.0)),
                                             key="scaling-target-down")
        out["look_back_period_s"] = st.slider(t("look-back period (s)"), 0.5, 60.0,
                                              float(num_or(d, "look_back_period_s", 5.0)),
                                              key="scaling-target-look")
        ways = list(AGGREGATIONS)
        way = str(d.get("aggregation_function", "mean"))
        out["aggregation_function"] = st.selectbox(
            t("look-back reduction"), ways, index=ways.index(way) if way in ways else 0,
            key="scaling-target-agg",
            help="Ray Serve's aggregation_function: the window's mean ongoing count, or its "
                 "peak (scales up sooner, down later) or trough")
    else:
        out["target_concurrency"] = st.number_input(
            t("target concurrency per replica"), 0.1, 1000.0,
            float(num_or(d, "target_concurrency", 2.0)), key="scaling-kpa-t")
        out["stable_window_s"] = st.slider(t("stable window (s)"), 1.0, 300.0,
                                           float(num_or(d, "stable_window_s", 30.0)),
                                           key="scaling-kpa-stable")
        out["panic_window_s"] = min(out["stable_window_s"], st.slider(
            t("panic window (s)"), 0.5, 60.0, float(num_or(d, "panic_window_s", 3.0)),
            key="scaling-kpa-panic"))
        out["scale_to_zero_grace_s"] = st.slider(
            t("scale-to-zero grace (s)"), 0.0, 300.0,
            float(num_or(d, "scale_to_zero_grace_s", 10.0)), key="scaling-kpa-grace")
    return out
