"""LLM: iteration-level schedulers on a step model, TTFT/TPOT against load, the KV cache."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import figures, prefix_cache_view
from dashboard.estimates import fmt_ci, quantile_ci
from dashboard.i18n import chart, frame, t, translator
from dashboard.llm_roofline_picker import ROOFLINE, roofline_policy, roofline_service
from dashboard.state import fmt, run_llm_scenario

# A short default horizon answers a knob within a second; the cards show each percentile's
# interval so the estimate reads as one (benchmarks/dashboard_speed.py measures it).
DEFAULT_REQUESTS = 300
REQUESTS_HELP = ("Requests simulated per run. The default 300 answers a knob in about a "
                 "second; more requests narrow the confidence intervals and take longer "
                 "(about 1 s per 500 requests and scheduler on one core).")
HORIZON_NOTE = ("Simulated on {n} requests: the percentiles are estimates, with their 95% "
                "order-statistic interval under each card (it treats requests as "
                "independent; queueing correlates them, so the real spread is wider). Raise "
                "'requests' for tighter numbers.")
# Incremental refinement: with more requests than the default, a knob move first shows the
# cards of the first FIRST_REQUESTS requests, then replaces them with the full run's. At the
# default the full run alone is faster to the settled page (one render of the cards, not two)
FIRST_REQUESTS = 100
FIRST_NOTE = ("First estimate from the first {first} requests only (the run starts with an "
              "empty queue, so under heavy load it reads low); refining on {n} requests…")
SWEEP_NOTE = ("Offered load around {rate:.2f} req/s × the factors. × marks the knee; "
              "hollow red-edged markers are unstable runs.")

# The figures, the other schedulers and the load sweep sit in tabs; only the open one runs.
TABS = ["this scheduler", "compare schedulers", "load sweep"]
TABS_NOTE = ("Only the open tab runs: the default tab needs the first scheduler's run alone, "
             "so a knob move answers within a second; 'compare schedulers' adds one run per "
             "other scheduler and 'load sweep' one per scheduler and load factor, for every "
             "knob move while it is open (cached: settings seen before answer at once).")
COMPARE_NOTE = "The {n} chosen schedulers on the same requests."
SWEEP_COST_NOTE = ("Each factor is one more run per scheduler (about 0.2–0.5 s each on one "
                   "core): while this tab is open, a knob move takes a few seconds.")

st.title(t("LLM serving"))
st.caption(t("Continuous batching simulated step by step: token budgets, a paged KV cache, "
             "preemption; TTFT, TPOT and where the knee is. Every scheduler sees the same "
             "requests."))

STEP_MODELS: dict[str, dict[str, Any]] = {
    "8B-class GPU (linear, builtin:llm-demo)": {
        "kind": "llm_linear", "base_ms": 6.0, "per_prefill_token_ms": 0.03,
        "per_decode_seq_ms": 0.08, "per_kv_token_ms": 0.00002},
    "CPU decoder, measured (builtin:llm-small-cpu)": {
        "kind": "llm_profile", "path": "builtin:llm-small-cpu"},
}
SCHEDULERS: dict[str, dict[str, Any]] = {
    "vllm, chunked prefill (512)": {"kind": "vllm", "max_num_batched_tokens": 512},
    "vllm, chunked prefill (2048)": {"kind": "vllm", "max_num_batched_tokens": 2048},
    "vllm, no chunking": {"kind": "vllm", "max_num_batched_tokens": 8192,
                          "enable_chunked_prefill": False},
    "vllm V0 (prefill first)": {"kind": "vllm", "max_num_batched_tokens": 8192,
                                "prefill_first": True},
    "sarathi (256)": {"kind": "sarathi", "max_num_batched_tokens": 256},
    "continuous (Orca)": {"kind": "continuous"},
    "static (batch 8)": {"kind": "static", "max_batch_size": 8, "max_wait_ms": 50},
}

left, right = st.columns([1, 3])
with left:
    model_name = st.selectbox(t("step model"), [*STEP_MODELS, ROOFLINE], key="llm-model",
                              format_func=translator())
    service: dict[str, Any] | None = roofline_service() if model_name == ROOFLINE \
        else STEP_MODELS[model_name]
    if service is None:
        st.stop()
    sources = ["Azure conversation trace", "token-length distributions"]
    source = st.radio(t("request source"), sources, format_func=translator(),
                      key="llm-source")
    n_requests = st.slider(t("requests"), 100, 5000, DEFAULT_REQUESTS, step=100,
                           key="llm-requests", help=t(REQUESTS_HELP))
    if source == "Azure conversation trace":
        scale = st.slider(t("rate × the trace's (5.5 req/s)"), 0.1, 4.0, 1.0, step=0.1,
                          key="llm-scale")
        workload: dict[str, Any] = {
            "kind": "trace", "path": "builtin:azure_llm_2023_conv.csv", "rate_scale": scale,
            "prompt_tokens_column": "ContextTokens", "output_tokens_column": "GeneratedTokens",
            "n_requests": n_requests}
        base_rate = 5.5 * scale
    else:
        rate = st.number_input(t("rate (req/s)"), 0.1, 1000.0, 4.0, key="llm-rate")
        prompt = st.number_input(t("prompt tokens (mean)"), 1, 16000, 600, key="llm-prompt")
        output = st.number_input(t("output tokens (mean)"), 1, 4000, 150, key="llm-output")
        cv = st.slider(t("length CV (lognormal)"), 0.1, 3.0, 1.0, key="llm-cv")
        workload = {"kind": "poisson", "rate_rps": float(rate), "n_requests": n_requests,
                    "prompt_tokens": {"dist": "lognormal", "mean": float(prompt), "cv": cv},
                    "output_tokens": {"dist": "lognormal", "mean": float(output), "cv": cv}}
        base_rate = float(rate)
    chosen = st.multiselect(t("schedulers (2–4)"), list(SCHEDULERS),
                            default=["vllm, chunked prefill (512)", "static (batch 8)"],
                            max_selections=4, format_func=translator(),
                            key="llm-schedulers")
    with st.expander(t("KV cache and limits")):
        blocks = st.number_input("num_gpu_blocks", 16, 1_000_000, 8192, key="llm-blocks")
        max_seqs = st.number_input("max_num_seqs", 1, 1024, 64, key="llm-seqs")
        ttft_slo = st.number_input(t("TTFT SLO (ms)"), 1.0, 600_000.0, 1000.0, key="llm-ttft")
        tpot_slo = st.number_input(t("TPOT SLO (ms)"), 1.0, 10_000.0, 60.0, key="llm-tpot")


def scenario(policy: dict[str, Any], factor: float = 1.0) -> dict[str, Any]:
    """The scenario of one scheduler at ``factor`` × the chosen load."""
    pol = dict(policy)
    if pol["kind"] != "static":
        pol.update(num_gpu_blocks=int(blocks), max_num_seqs=int(max_seqs))
        pol["max_num_batched_tokens"] = max(pol.get("max_num_batched_tokens", 8192),
                                            int(max_seqs))
    load = dict(workload)
    if load["kind"] == "trace":
        load["rate_scale"] = load["rate_scale"] * factor
    else:
        load["rate_rps"] = load["rate_rps"] * factor
    return {"name": "dashboard-llm", "seed": 0, "service": service,
            "workload": load, "policy": roofline_policy(service, pol), "warmup_s": 0.0,
            "slo": {"ttft_ms": float(ttft_slo), "tpot_ms": float(tpot_slo)}}


def ttft_tpot_ms(result: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-request TTFT and TPOT (ms) of the ok requests (for the intervals)."""
    req = result.requests
    ok = (req["status"].astype(str) == "ok").to_numpy()
    first, arrival = req["first_token_s"].to_numpy(), req["arrival_s"].to_numpy()
    finish, out = req["finish_s"].to_numpy(), req["output_tokens"].to_numpy()
    multi = ok & (out > 1)
    return ((first - arrival)[ok] * 1e3,
            (finish - first)[multi] / (out[multi] - 1) * 1e3)


def card(where: Any, label: str, value: float, samples: np.ndarray, q: float,
         digits: int) -> None:
    """A KPI card with the percentile's 95% order-statistic interval underneath."""
    low, high = quantile_ci(samples, q)
    where.metric(t(label), fmt(value, digits, " ms"))
    where.caption(fmt_ci(low, high, digits))


def cards_of(result: Any, note: str) -> None:
    """The first scheduler's KPI cards (with intervals) and the note on how they were got."""
    s = result.summary
    ttft, tpot = ttft_tpot_ms(result)
    cards = st.columns(6)
    card(cards[0], "TTFT P50", s["ttft_ms"]["p50"], ttft, 0.5, 0)
    card(cards[1], "TTFT P99", s["ttft_ms"]["p99"], ttft, 0.99, 0)
    card(cards[2], "TPOT P50", s["tpot_ms"]["p50"], tpot, 0.5, 1)
    card(cards[3], "TPOT P99", s["tpot_ms"]["p99"], tpot, 0.99, 1)
    cards[4].metric(t("output tokens/s"), fmt(s["output_tokens_per_s"], 0))
    cards[5].metric(t("preemptions"), str(s["preemptions"]))
    st.caption(note)


def compare_table(results: dict[str, Any]) -> pd.DataFrame:
    """One row per scheduler: its percentiles, throughput, goodput and verdict."""
    return pd.DataFrame([{
        "scheduler": name, "TTFT P50 (ms)": round(r.summary["ttft_ms"]["p50"], 1),
        "TTFT P99 (ms)": round(r.summary["ttft_ms"]["p99"], 1),
        "TPOT P50 (ms)": round(r.summary["tpot_ms"]["p50"], 2),
        "TPOT P99 (ms)": round(r.summary["tpot_ms"]["p99"], 2),
        "output tok/s": round(r.summary["output_tokens_per_s"], 0),
        "goodput (req/s)": round(r.summary["goodput_rps"] or 0.0, 3),
        "preemptions": r.summary["preemptions"],
        "KV util (mean)": round(r.summary["kv_cache_utilization"]["mean"] or 0.0, 3),
        "verdict": r.summary["stability"]["verdict"]} for name, r in results.items()])


def load_sweep(results: dict[str, Any], rate: float) -> None:
    """TTFT/TPOT of every scheduler in ``results`` over the chosen load factors."""
    st.caption(t(SWEEP_COST_NOTE))
    factors = st.multiselect(t("load sweep (× the load above)"),
                             [0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
                             default=[0.25, 0.5, 1.0, 1.5, 2.0], key="llm-factors")
    rows = []
    for name in results:
        for factor in sorted(factors):
            r = results[name] if factor == 1.0 else run_llm_scenario(
                scenario(SCHEDULERS[name], factor))
            if r is None:
                continue
            rows.append({"config": name, "offered_rps": r.summary["offered_rps"],
                         "ttft_ms.p50": r.summary["ttft_ms"]["p50"],
                         "ttft_ms.p99": r.summary["ttft_ms"]["p99"],
                         "tpot_ms.p50": r.summary["tpot_ms"]["p50"],
                         "tpot_ms.p99": r.summary["tpot_ms"]["p99"],
                         "verdict": r.summary["stability"]["verdict"]})
    if rows:
        chart(figures.llm_load_curves(pd.DataFrame(rows)))
        st.caption(t(SWEEP_NOTE).format(rate=rate))


with right:
    if len(chosen) < 1:
        st.info(t("Pick at least one scheduler."))
        st.stop()
    first_name = chosen[0]
    st.markdown(f"**{t(first_name)}**")
    board = st.empty()  # the cards: a first estimate, then the full run in the same place
    full = scenario(SCHEDULERS[first_name])
    done = st.session_state.setdefault("llm-done", set())
    key = json.dumps(full, sort_keys=True)
    if n_requests > DEFAULT_REQUESTS and key not in done:
        quick = scenario(SCHEDULERS[first_name])
        quick["workload"] = dict(quick["workload"], n_requests=FIRST_REQUESTS)
        early = run_llm_scenario(quick)
        if early is not None:
            with board.container():
                cards_of(early, t(FIRST_NOTE).format(first=FIRST_REQUESTS, n=n_requests))
    first = run_llm_scenario(full)
    if first is None:
        st.stop()
    done.add(key)
    with board.container():
        cards_of(first, t(HORIZON_NOTE).format(n=n_requests))
    s = first.summary
    if s["stability"]["verdict"] != "stable":
        st.warning(f"{t('This run is')} {t(s['stability']['verdict'])}: "
                   f"{s['stability']['reason']}", icon="⚠️")
    # Lazy tabs (on_change="rerun"): the other schedulers and the load sweep run only while
    # their tab is open, so a knob move on the default tab costs one scheduler's run.
    tabs = st.tabs([t(name) for name in TABS], key="llm-tab", on_change="rerun")
    if tabs[0].open is not False:
        a, b = tabs[0].columns(2)
        chart(figures.kv_and_running(first.steps, first.meta.get("num_gpu_blocks")), a)
        chart(figures.step_composition(first.steps), b)
    results = {first_name: first}
    if tabs[1].open or tabs[2].open:
        for name in chosen[1:]:
            result = run_llm_scenario(scenario(SCHEDULERS[name]))
            if result is not None:
                results[name] = result
    if tabs[1].open:
        tabs[1].caption(t(COMPARE_NOTE).format(n=len(chosen)))
        tabs[1].dataframe(frame(compare_table(results)), hide_index=True)
    if tabs[2].open:
        with tabs[2]:
            load_sweep(results, base_rate)
    st.caption(t(TABS_NOTE))
prefix_cache_view.render()
