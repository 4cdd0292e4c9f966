"""LLM: iteration-level schedulers on a step model, TTFT/TPOT against load, the KV cache."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import figures, prefix_cache_view
from dashboard.state import fmt, run_llm_scenario

st.title("LLM serving")
st.caption("Continuous batching simulated step by step: token budgets, a paged KV cache, "
           "preemption; TTFT, TPOT and where the knee is. Every scheduler sees the same "
           "requests.")

STEP_MODELS = {
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
    model_name = st.selectbox("step model", list(STEP_MODELS), key="llm-model")
    source = st.radio("requests", ["Azure conversation trace", "token-length distributions"],
                      key="llm-source")
    n_requests = st.slider("requests", 200, 5000, 1500, step=100, key="llm-requests")
    if source == "Azure conversation trace":
        scale = st.slider("rate × the trace's (5.5 req/s)", 0.1, 4.0, 1.0, step=0.1,
                          key="llm-scale")
        workload: dict[str, Any] = {
            "kind": "trace", "path": "builtin:azure_llm_2023_conv.csv", "rate_scale": scale,
            "prompt_tokens_column": "ContextTokens", "output_tokens_column": "GeneratedTokens",
            "n_requests": n_requests}
        base_rate = 5.5 * scale
    else:
        rate = st.number_input("rate (req/s)", 0.1, 1000.0, 4.0, key="llm-rate")
        prompt = st.number_input("prompt tokens (mean)", 1, 16000, 600, key="llm-prompt")
        output = st.number_input("output tokens (mean)", 1, 4000, 150, key="llm-output")
        cv = st.slider("length CV (lognormal)", 0.1, 3.0, 1.0, key="llm-cv")
        workload = {"kind": "poisson", "rate_rps": float(rate), "n_requests": n_requests,
                    "prompt_tokens": {"dist": "lognormal", "mean": float(prompt), "cv": cv},
                    "output_tokens": {"dist": "lognormal", "mean": float(output), "cv": cv}}
        base_rate = float(rate)
    chosen = st.multiselect("schedulers (2–4)", list(SCHEDULERS),
                            default=["vllm, chunked prefill (512)", "static (batch 8)"],
                            max_selections=4, key="llm-schedulers")
    with st.expander("KV cache and limits"):
        blocks = st.number_input("num_gpu_blocks", 16, 1_000_000, 8192, key="llm-blocks")
        max_seqs = st.number_input("max_num_seqs", 1, 1024, 64, key="llm-seqs")
        ttft_slo = st.number_input("TTFT SLO (ms)", 1.0, 600_000.0, 1000.0, key="llm-ttft")
        tpot_slo = st.number_input("TPOT SLO (ms)", 1.0, 10_000.0, 60.0, key="llm-tpot")


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
    return {"name": "dashboard-llm", "seed": 0, "service": STEP_MODELS[model_name],
            "workload": load, "policy": pol, "warmup_s": 0.0,
            "slo": {"ttft_ms": float(ttft_slo), "tpot_ms": float(tpot_slo)}}


with right:
    if len(chosen) < 1:
        st.info("Pick at least one scheduler.")
        st.stop()
    results = {name: run_llm_scenario(scenario(SCHEDULERS[name])) for name in chosen}
    results = {k: v for k, v in results.items() if v is not None}
    if not results:
        st.stop()
    first_name, first = next(iter(results.items()))
    s = first.summary
    st.markdown(f"**{first_name}**")
    cards = st.columns(6)
    cards[0].metric("TTFT P50", fmt(s["ttft_ms"]["p50"], 0, " ms"))
    cards[1].metric("TTFT P99", fmt(s["ttft_ms"]["p99"], 0, " ms"))
    cards[2].metric("TPOT P50", fmt(s["tpot_ms"]["p50"], 1, " ms"))
    cards[3].metric("TPOT P99", fmt(s["tpot_ms"]["p99"], 1, " ms"))
    cards[4].metric("output tokens/s", fmt(s["output_tokens_per_s"], 0))
    cards[5].metric("preemptions", str(s["preemptions"]))
    if s["stability"]["verdict"] != "stable":
        st.warning(f"This run is {s['stability']['verdict']}: {s['stability']['reason']}",
                   icon="⚠️")
    table = pd.DataFrame([{
        "scheduler": name, "TTFT P50 (ms)": round(r.summary["ttft_ms"]["p50"], 1),
        "TTFT P99 (ms)": round(r.summary["ttft_ms"]["p99"], 1),
        "TPOT P50 (ms)": round(r.summary["tpot_ms"]["p50"], 2),
        "TPOT P99 (ms)": round(r.summary["tpot_ms"]["p99"], 2),
        "output tok/s": round(r.summary["output_tokens_per_s"], 0),
        "goodput (req/s)": round(r.summary["goodput_rps"] or 0.0, 3),
        "preemptions": r.summary["preemptions"],
        "KV util (mean)": round(r.summary["kv_cache_utilization"]["mean"] or 0.0, 3),
        "verdict": r.summary["stability"]["verdict"]} for name, r in results.items()])
    st.dataframe(table, hide_index=True)
    factors = st.multiselect("load sweep (× the load above)", [0.25, 0.5, 0.75, 1.0, 1.5, 2.0,
                                                                3.0],
                             default=[0.25, 0.5, 1.0, 1.5, 2.0], key="llm-factors")
    rows = []
    for name in results:
        for factor in sorted(factors):
            r = run_llm_scenario(scenario(SCHEDULERS[name], factor))
            if r is None:
                continue
            rows.append({"config": name, "offered_rps": r.summary["offered_rps"],
                         "ttft_ms.p50": r.summary["ttft_ms"]["p50"],
                         "ttft_ms.p99": r.summary["ttft_ms"]["p99"],
                         "tpot_ms.p50": r.summary["tpot_ms"]["p50"],
                         "tpot_ms.p99": r.summary["tpot_ms"]["p99"],
                         "verdict": r.summary["stability"]["verdict"]})
    if rows:
        st.plotly_chart(figures.llm_load_curves(pd.DataFrame(rows)))
        st.caption(f"Offered load around {base_rate:.2f} req/s × the factors. × marks the "
                   "knee; hollow red-edged markers are unstable runs.")
    a, b = st.columns(2)
    a.plotly_chart(figures.kv_and_running(first.steps, first.meta.get("num_gpu_blocks")))
    b.plotly_chart(figures.step_composition(first.steps))

prefix_cache_view.render()
