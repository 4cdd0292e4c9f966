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

The window, the counts behind the rates (arrivals, outcomes, completions, censored), busy
time, utilisation and cost are the request-level definitions (:class:`~sim.metrics.window.Window`,
:class:`~sim.metrics.folds.RequestFold`, :class:`~sim.metrics.folds.BatchFold`,
:func:`~sim.metrics.summary.utilization_of`): an engine step is a batch, and a request
"starts" at its first token.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.metrics.folds import BatchFold, RequestFold
from sim.metrics.stability import unmeasurable, verdict
from sim.metrics.summary import (
    _stats_ms,
    cost_per_million_usd,
    queue_length_stats,
    queue_trend,
    status_codes,
    utilization_of,
)
from sim.metrics.window import Window
from sim.serving.fleet import fleet_summary
from sim.serving.types import STATUS_CATEGORIES


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
    window = Window(warmup_s=warmup_s, horizon_s=horizon_s, replicas=replicas,
                    max_batch_size=1,  # an engine step is not summarised by its size
                    price_per_replica_hour=price_per_replica_hour, end_s=end_s)
    lo, hi = window.warmup_s, window.horizon_s
    span, per_s = window.length_s, window.per_s
    arrival = requests["arrival_s"].to_numpy()
    first = requests["first_token_s"].to_numpy(float)
    finish = requests["finish_s"].to_numpy(float)
    codes = status_codes(requests)
    fold = RequestFold(lo, hi)
    fold.add(arrival, first, finish, codes, end_s=end_s, keep=True)
    inwin = arrival >= lo
    ok = (codes == STATUS_CATEGORIES.index("ok")) & inwin
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
    # the completions RequestFold counts: ok, finished inside the window
    completed = (codes == STATUS_CATEGORIES.index("ok")) & (finish >= lo) & (finish <= hi)
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
    counts = {s: int(fold.counts[STATUS_CATEGORIES.index(s)])
              for s in ("ok", "rejected", "failed", "in_flight")}
    arrivals = fold.arrivals
    completions = fold.completions
    start_s = steps["start_s"].to_numpy(float)
    replica = steps["replica"].to_numpy()
    engines = BatchFold(lo, hi, max(replicas, int(replica.max()) + 1 if replica.size else 0))
    order = np.argsort(start_s, kind="stable")
    engines.add_busy_by_replica(start_s[order], (start_s + steps["duration_s"].to_numpy(float))
                                [order], replica[order])
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
    stability = unmeasurable(stability, arrivals=arrivals, ok=counts["ok"],
                             completions=completions, in_flight=counts["in_flight"],
                             window_s=span, ended={c: counts[c] for c in ("rejected", "failed")})
    out: dict[str, Any] = {
        "driver": driver,
        "kind": "llm",
        "requests": arrivals,
        **counts,
        "censored": fold.censored,
        "completions": completions,
        "window_s": span,
        "offered_rps": offered,
        "throughput_rps": completions * per_s,
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
            .to_numpy()[ok].sum()),
        "steps": len(win_steps),
        "tokens_per_step": _dist((win_steps["prefill_tokens"] + win_steps["decode_seqs"])
                                 .to_numpy(float)) if len(win_steps) else _dist(np.empty(0)),
        "seqs_per_step": _dist(win_steps["num_seqs"].to_numpy(float)) if len(win_steps)
        else _dist(np.empty(0)),
        "kv_cache_utilization": {"mean": kv_mean, "max": kv_max},
        "utilization": math.nan,
        "queue_len": queue_length_stats(queue, lo, hi),
        "stability": stability,
        "priorities": {str(level): {"requests": int(((prio == level) & inwin).sum()),
                                    "ttft_ms": _stats_ms((first - arrival)[ok & (prio == level)]),
                                    "e2e_ms": _stats_ms((finish - arrival)[ok & (prio == level)])}
                       for level in np.unique(prio)} if np.unique(prio).size > 1 else {},
        "replicas": replicas,
        "cost_per_million_usd": None,
        "end_s": end_s,
    }
    scaling = None
    if fleet is not None:
        # a request "starts" on its engine when its first token comes
        started = requests.assign(start_s=requests["first_token_s"])
        scaling = fleet_summary(started, fleet[0], fleet[1], lo, hi,
                                (finish - arrival)[ok], ok)
    _, out["utilization"], scaling = utilization_of(engines, window, scaling)
    out["cost_per_million_usd"] = cost_per_million_usd(
        price_per_replica_hour, float(scaling["replica_seconds"]),  # type: ignore[arg-type]
        completions)
    out.update(scaling)
    return out
