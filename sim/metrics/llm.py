"""The LLM run summary, with the definitions of ``vllm bench serve``.

* ``ttft_ms``: arrival → first output token; ``e2e_ms``: arrival → last output token;
* ``tpot_ms``: (E2E − TTFT) / (output tokens − 1), over requests with more than one output
  token (it excludes the first token);
* ``itl_ms``: every gap between consecutive output tokens of a request, pooled;

each as mean, p50, p90, p95, p99, p999 and max over the ok requests that arrived in the window
``[warmup_s, horizon]``. Throughputs count what *finished* in the window, per second:
``throughput_rps`` (completed requests), ``input_tokens_per_s`` (their prompt tokens),
``output_tokens_per_s`` (output tokens produced in the window, by any request);
``goodput_rps`` counts completions meeting every SLO set (``slo.ttft_ms``, ``slo.tpot_ms``)
and is null without an SLO.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.stability import verdict
from sim.metrics.summary import _stats_ms, queue_length_stats, queue_trend
from sim.serving.fleet import fleet_summary


def _weighted_mean_max(times: np.ndarray, values: np.ndarray, lo_s: float,
                       hi_s: float) -> tuple[float, float]:
    """Time-weighted mean and max of a step function (value after each time) on [lo, hi]."""
    if hi_s <= lo_s or times.size == 0:
        return math.nan, math.nan
    edges = np.clip(np.concatenate((times, [hi_s])), lo_s, hi_s)
    widths = np.diff(edges)
    inside = widths > 0
    if not inside.any():
        idx = max(int(np.searchsorted(times, lo_s, side="right")) - 1, 0)
        return float(values[idx]), float(values[idx])
    return (float(np.sum(values * widths) / (hi_s - lo_s)),
            float(values[inside].max()))


def _dist(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return dict.fromkeys(("mean", "p50", "p99", "max"), math.nan)
    return {"mean": float(values.mean()), "p50": float(np.percentile(values, 50)),
            "p99": float(np.percentile(values, 99)), "max": float(values.max())}


def summarize_llm(requests: pd.DataFrame, token_s: np.ndarray, token_offset: np.ndarray,
                  steps: pd.DataFrame, queue: pd.DataFrame, *, warmup_s: float,
                  horizon_s: float, end_s: float, num_blocks: int | None,
                  ttft_slo_ms: float | None, tpot_slo_ms: float | None,
                  driver: str, replicas: int = 1,
                  price_per_replica_hour: float = 0.0,
                  fleet: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> dict[str, Any]:
    """The summary of an LLM run (keys in the README's LLM metrics table); ``fleet`` (the
    replica series and events of an autoscaled run) adds the autoscaling metrics and makes
    utilisation and cost count the replica-seconds held.
    """
    lo, hi = warmup_s, horizon_s
    span = max(hi - lo, 0.0)
    per_s = 1.0 / span if span > 0 else math.nan
    status = requests["status"].astype(str).to_numpy()
    arrival = requests["arrival_s"].to_numpy()
    inwin = arrival >= lo
    ok = (status == "ok") & inwin
    first = requests["first_token_s"].to_numpy()
    finish = requests["finish_s"].to_numpy()
    out_tokens = requests["output_tokens"].to_numpy()
    prio = requests["priority"].to_numpy() if "priority" in requests else np.zeros(len(requests))
    ttft = (first - arrival)[ok]
    e2e = (finish - arrival)[ok]
    multi = ok & (out_tokens > 1)
    tpot = ((finish - first)[multi] / (out_tokens[multi] - 1))
    # ITL: gaps between consecutive tokens of one request, for the ok requests
    n_req = len(requests)
    owner = np.repeat(np.arange(n_req), np.diff(token_offset[:n_req + 1]))
    times = token_s[:owner.size]
    same = (owner[1:] == owner[:-1]) & ok[owner[1:]] if owner.size > 1 else np.zeros(0, bool)
    itl = np.diff(times)[same] if owner.size > 1 else np.empty(0)
    completed = (status == "ok") & (finish >= lo) & (finish <= hi)
    good = completed.copy()
    if ttft_slo_ms is not None:
        good &= (first - arrival) * 1e3 <= ttft_slo_ms
    if tpot_slo_ms is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            per_token = np.where(out_tokens > 1, (finish - first) / np.maximum(out_tokens - 1, 1),
                                 0.0)
        good &= per_token * 1e3 <= tpot_slo_ms
    has_slo = ttft_slo_ms is not None or tpot_slo_ms is not None
    produced = token_s[(token_s >= lo) & (token_s <= hi)]
    in_flight = (status == "in_flight") & inwin
    counts = {s: int(((status == s) & inwin).sum())
              for s in ("ok", "rejected", "failed", "in_flight")}
    arrivals = int(inwin.sum())

    busy = float(np.sum(np.clip(np.minimum(steps["start_s"] + steps["duration_s"], hi)
                                - np.maximum(steps["start_s"], lo), 0, None))) if len(steps) \
        else 0.0
    utilization = busy / span / replicas if span > 0 else math.nan
    win_steps = steps[(steps["start_s"] >= lo) & (steps["start_s"] < hi)]
    kv_mean = kv_max = math.nan
    if num_blocks and len(steps):
        means, maxes = [], []
        for r in range(replicas):
            mine = steps[steps["replica"] == r]
            m, x = _weighted_mean_max((mine["start_s"] + mine["duration_s"]).to_numpy(),
                                      mine["kv_blocks_used"].to_numpy() / num_blocks, lo, hi)
            means.append(0.0 if math.isnan(m) else m)
            maxes.append(0.0 if math.isnan(x) else x)
        kv_mean, kv_max = float(np.mean(means)), float(np.max(maxes))
    trend = queue_trend(queue, lo, hi)
    offered = arrivals * per_s
    # an engine steps back to back while any sequence runs, so busy time says little about
    # headroom: the verdict rests on the waiting queue's trend, then on KV pressure
    stability = verdict(offered_rps=offered, capacity=math.nan, utilization=math.nan,
                        trend=trend, window_s=span, closed_loop=False,
                        bounded=counts["rejected"] > 0)
    preempted = int(requests["preemptions"].to_numpy()[inwin].sum())
    if stability["verdict"] == "stable" and (preempted or kv_mean >= 0.9):
        stability = {**stability, "verdict": "saturated",
                     "reason": f"KV cache at its limit: mean utilisation {kv_mean:.0%}, "
                               f"{preempted} preemptions"}
    elif stability["verdict"] == "stable":
        stability = {**stability, "reason": "the waiting queue shows no trend"}
    out: dict[str, Any] = {
        "driver": driver,
        "kind": "llm",
        "requests": arrivals,
        **counts,
        "censored": int(in_flight.sum()),
        "completions": int(completed.sum()),
        "window_s": span,
        "offered_rps": offered,
        "throughput_rps": float(completed.sum()) * per_s,
        "input_tokens_per_s": float(requests["prompt_tokens"].to_numpy()[completed].sum())
        * per_s,
        "output_tokens_per_s": float(produced.size) * per_s,
        "goodput_rps": float(good.sum()) * per_s if has_slo else None,
        "error_rate": (counts["rejected"] + counts["failed"]) / arrivals if arrivals
        else math.nan,
        "ttft_ms": _stats_ms(ttft),
        "tpot_ms": _stats_ms(tpot),
        "itl_ms": _stats_ms(itl),
        "e2e_ms": _stats_ms(e2e),
        "preemptions": preempted,
        "recomputed_tokens": int((requests["work_tokens"] - (
            requests["prompt_tokens"] + requests["output_tokens"] - 1)).clip(lower=0)
            .to_numpy()[(status == "ok") & inwin].sum()),
        "steps": len(win_steps),
        "tokens_per_step": _dist((win_steps["prefill_tokens"] + win_steps["decode_seqs"])
                                 .to_numpy(float)) if len(win_steps) else _dist(np.empty(0)),
        "seqs_per_step": _dist(win_steps["num_seqs"].to_numpy(float)) if len(win_steps)
        else _dist(np.empty(0)),
        "kv_cache_utilization": {"mean": kv_mean, "max": kv_max},
        "utilization": utilization,
        "queue_len": queue_length_stats(queue, lo, hi),
        "stability": stability,
        "priorities": {str(level): {"requests": int(((prio == level) & inwin).sum()),
                                    "ttft_ms": _stats_ms((first - arrival)[ok & (prio == level)]),
                                    "e2e_ms": _stats_ms((finish - arrival)[ok & (prio == level)])}
                       for level in np.unique(prio)} if np.unique(prio).size > 1 else {},
        "replicas": replicas,
        "cost_per_million_usd": (price_per_replica_hour * replicas / 3600
                                 / (float(completed.sum()) * per_s) * 1e6)
        if price_per_replica_hour > 0 and completed.sum() else None,
        "end_s": end_s,
    }
    held_s = replicas * span
    scaling: dict[str, Any] = {"replica_seconds": held_s, "cold_starts": 0,
                               "cold_start_waits": 0}
    if fleet is not None:
        # a request "starts" on its engine when its first token comes
        started = requests.assign(start_s=requests["first_token_s"])
        scaling = fleet_summary(started, fleet[0], fleet[1], lo, hi,
                                (finish - arrival)[ok], ok)
        held_s = float(scaling["replica_seconds"])  # type: ignore[arg-type]
        out["utilization"] = busy / held_s if held_s > 0 else math.nan
        out["cost_per_million_usd"] = (price_per_replica_hour * held_s / 3600
                                       / float(completed.sum()) * 1e6) \
            if price_per_replica_hour > 0 and completed.sum() else None
    out.update(scaling)
    return out
