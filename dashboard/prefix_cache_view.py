"""The LLM page's prefix-caching section: the shipped multi-turn chat trace (synthetic) with
vLLM-style prefix caching off and on, across replicas and routers, and the hit rate over time.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calibration.report import PALETTE
from dashboard.i18n import chart, t
from dashboard.state import fmt, run_llm_scenario

TRACE = "builtin:synthetic_chat_blksz_16.jsonl"
EVICTED_NOTE = ("{evicted} blocks evicted (LRU). The trace is synthetic: 400 chats sharing 8 "
                "system prompts, each turn extending the previous one.")
SERVICE = {"kind": "llm_linear", "base_ms": 6.0, "per_prefill_token_ms": 0.12,
           "per_decode_seq_ms": 0.3, "per_kv_token_ms": 0.00008}


def hit_rate_figure(series: dict[str, list[dict[str, float]]]) -> go.Figure:
    """Token hit rate per window of arrival time, one line per configuration."""
    fig = go.Figure()
    for k, (name, windows) in enumerate(series.items()):
        frame = pd.DataFrame(windows)
        fig.add_trace(go.Scatter(x=(frame["start_s"] + frame["end_s"]) / 2,
                                 y=100 * frame["hit_rate"], mode="lines+markers", name=name,
                                 line={"color": PALETTE[k % len(PALETTE)]}))
    fig.update_layout(title="prefix-cache hit rate over time (tokens)",
                      xaxis_title="arrival time (s)", yaxis_title="hit rate (%)",
                      yaxis_range=[0, 100], height=320, margin={"t": 40})
    return fig


def scenario(caching: bool, replicas: int, routing: str, blocks: int, n: int,
             time_scale: float) -> dict[str, Any]:
    """One configuration on the shipped chat trace."""
    return {"name": "dashboard-prefix", "seed": 0, "service": SERVICE,
            "workload": {"kind": "hash_trace", "path": TRACE, "n_requests": n,
                         "time_scale": time_scale},
            "policy": {"kind": "vllm", "max_num_seqs": 128, "max_num_batched_tokens": 2048,
                       "num_gpu_blocks": blocks, "enable_prefix_caching": caching},
            "replicas": replicas, "routing": routing if caching else "jsq"}


def render() -> None:
    """The section (nothing runs until its switch is on)."""
    st.subheader(t("Prefix caching"))
    if not st.toggle(t("simulate prefix caching on a multi-turn chat trace (synthetic)"),
                     value=False, key="llm-prefix"):
        st.caption(t("vLLM reuses the KV blocks of a prompt's cached prefix: the second "
                     "turn of a chat prefills only its new tokens. Turn the switch on to "
                     "compare."))
        return
    c = st.columns(4)
    replicas = c[0].number_input(t("replicas"), 1, 8, 2, key="llm-prefix-replicas")
    routing = c[1].selectbox(t("routing (caching on)"), ["prefix_affinity", "jsq", "round_robin"],
                             key="llm-prefix-routing")
    blocks = c[2].number_input(t("KV blocks per replica (16 tokens)"), 64, 100_000, 1024,
                               key="llm-prefix-blocks")
    scale = c[3].slider(t("time scale (smaller: more load)"), 0.1, 2.0, 0.5,
                        key="llm-prefix-scale")
    runs = {}
    for caching in (False, True):
        r = run_llm_scenario(scenario(caching, int(replicas), routing, int(blocks), 500,
                                      float(scale)))
        if r is None:
            return
        runs["on" if caching else "off"] = r
    on, off = runs["on"].summary, runs["off"].summary
    pc = on["prefix_cache"]
    cards = st.columns(4)
    cards[0].metric(t("hit rate (tokens)"), fmt(100 * pc["hit_rate"], 1, "%"))
    cards[1].metric(t("prefill tokens saved"), f"{pc['prefill_tokens_saved']:,}")
    cards[2].metric(t("TTFT P50 off → on"), f"{off['ttft_ms']['p50']:.0f} → "
                                         f"{on['ttft_ms']['p50']:.0f} ms")
    cards[3].metric(t("TTFT P99 off → on"), f"{off['ttft_ms']['p99']:.0f} → "
                                         f"{on['ttft_ms']['p99']:.0f} ms")
    chart(hit_rate_figure({f"{t('caching on')}, {routing}": pc["hit_rate_over_time"]}))
    st.caption(t(EVICTED_NOTE).format(evicted=f"{pc['evictions']:,}"))
