"""Summary metrics from the record tables (the same code for simulated and live runs).

The measurement window is ``[warmup_s, horizon_s]``: ``horizon_s`` is the workload's
``duration_s`` when it has one, else the last arrival. Request metrics cover the requests that
*arrive* in the window; batch metrics the batches that *start* in it; utilisation and queue
length are time-weighted over it.

* latency = finish − arrival, queue wait = start − arrival, service = finish − start, over ok
  requests: mean, p50, p90, p95, p99, p99.9, max (numpy's default linear percentiles);
* throughput = ok / window; goodput = ok within the SLO / window;
* error rate (total and per cause) = non-ok terminal outcomes / arrivals;
* batch size (requests and items), batch utilisation = mean batch / max batch size;
* device utilisation = busy time / (window × replicas), busy time counted per replica as the
  union of its batch intervals;
* queue length: time-weighted mean, p95 and max of the total over all queues;
* cost per million ok requests from a price per replica-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.types import ERROR_CAUSES

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


@dataclass(frozen=True)
class Window:
    """What the summary needs to know besides the tables.

    Attributes:
        warmup_s: Start of the measurement window.
        horizon_s: End of the measurement window.
        replicas: Number of replicas.
        max_batch_size: Largest batch the policy may form.
        slo_s: Latency objective for goodput (None: goodput = throughput).
        price_per_replica_hour: For cost per million requests (0: not reported).
    """

    warmup_s: float
    horizon_s: float
    replicas: int
    max_batch_size: int
    slo_s: float | None = None
    price_per_replica_hour: float = 0.0

    @property
    def length_s(self) -> float:
        """Window length in seconds."""
        return max(self.horizon_s - self.warmup_s, 0.0)


def _stats_ms(values_s: np.ndarray) -> dict[str, float]:
    if values_s.size == 0:
        return dict.fromkeys(("mean", *PERCENTILES, "max"), math.nan)
    ms = values_s * 1e3
    q = np.percentile(ms, list(PERCENTILES.values()))
    out = {"mean": float(ms.mean())}
    out.update({k: float(v) for k, v in zip(PERCENTILES, q, strict=True)})
    out["max"] = float(ms.max())
    return out


def busy_s(batches: pd.DataFrame, replica: int, lo_s: float, hi_s: float) -> float:
    """Seconds replica ``replica`` was busy inside [lo, hi] (union of its batch intervals;
    batches still running count up to ``hi_s``).
    """
    group = batches[batches["replica"] == replica]
    if group.empty:
        return 0.0
    start = np.clip(group["start_s"].to_numpy(), lo_s, hi_s)
    finish = np.clip(group["finish_s"].fillna(hi_s).to_numpy(), lo_s, hi_s)
    order = np.argsort(start, kind="stable")
    start, finish = start[order], finish[order]
    reach_before = np.concatenate(([lo_s], np.maximum.accumulate(finish)[:-1]))
    return float(np.sum(np.maximum(0.0, finish - np.maximum(start, reach_before))))


def queue_length_stats(queue: pd.DataFrame, lo_s: float, hi_s: float) -> dict[str, float]:
    """Time-weighted mean, p95 and max of the total queue length over [lo, hi]."""
    if queue.empty or hi_s <= lo_s:
        return {"mean": math.nan, "p95": math.nan, "max": math.nan}
    frame = queue.sort_values("time_s", kind="stable")
    delta = frame.groupby("queue")["length"].diff().fillna(frame["length"]).to_numpy()
    total = np.cumsum(delta)
    times = frame["time_s"].to_numpy()
    # keep the last value at each instant
    last = np.concatenate((times[1:] != times[:-1], [True]))
    times, total = times[last], total[last]
    before = times <= lo_s
    start_len = total[before][-1] if before.any() else 0.0
    inside = (times > lo_s) & (times < hi_s)
    t = np.concatenate(([lo_s], times[inside], [hi_s]))
    vals = np.concatenate(([start_len], total[inside]))
    weights = np.diff(t)
    mean = float(np.sum(vals * weights) / (hi_s - lo_s))
    order = np.argsort(vals, kind="stable")
    cum = np.cumsum(weights[order]) / weights.sum()
    p95 = float(vals[order][np.searchsorted(cum, 0.95)]) if cum.size else math.nan
    return {"mean": mean, "p95": p95, "max": float(vals.max())}


def summarize(requests: pd.DataFrame, batches: pd.DataFrame, queue: pd.DataFrame,
              window: Window, driver: str) -> dict[str, Any]:
    """The run summary (keys as in ``shared/design.md``)."""
    lo, hi, span = window.warmup_s, window.horizon_s, window.length_s
    inwin = requests[requests["arrival_s"] >= lo]
    status = inwin["status"].astype(str)
    ok = inwin[status == "ok"]
    arrivals = len(inwin)
    latency = (ok["finish_s"] - ok["arrival_s"]).to_numpy()
    counts = {cause: int((status == cause).sum()) for cause in ERROR_CAUSES}
    errors = sum(counts.values())
    per_s = (1.0 / span) if span > 0 else math.nan
    good = int(np.sum(latency <= window.slo_s)) if window.slo_s is not None else len(ok)
    bwin = batches[batches["start_s"] >= lo]
    mean_batch = float(bwin["size"].mean()) if len(bwin) else math.nan
    busy = np.array([busy_s(batches, r, lo, hi) for r in range(window.replicas)])
    util = busy / span if span > 0 else np.full(window.replicas, math.nan)
    hist = bwin["size"].value_counts().sort_index()
    throughput = len(ok) * per_s
    cost = math.nan
    if window.price_per_replica_hour > 0 and throughput > 0:
        cost = window.price_per_replica_hour * window.replicas / 3600.0 / throughput * 1e6
    return {
        "driver": driver,
        "requests": arrivals,
        "ok": len(ok),
        **counts,
        "in_flight": int((status == "in_flight").sum()),
        "window_s": span,
        "offered_rps": arrivals * per_s,
        "throughput_rps": throughput,
        "goodput_rps": good * per_s,
        "error_rate": errors / arrivals if arrivals else math.nan,
        "error_rate_by_cause": {c: (n / arrivals if arrivals else math.nan)
                                for c, n in counts.items()},
        "latency_ms": _stats_ms(latency),
        "queue_ms": _stats_ms((ok["start_s"] - ok["arrival_s"]).to_numpy()),
        "service_ms": _stats_ms((ok["finish_s"] - ok["start_s"]).to_numpy()),
        "batches": len(bwin),
        "mean_batch_size": mean_batch,
        "mean_batch_items": float(bwin["items"].mean()) if len(bwin) else math.nan,
        "batch_size_hist": {str(k): int(v) for k, v in hist.items()},
        "batch_utilization": mean_batch / window.max_batch_size if len(bwin) else math.nan,
        "utilization": float(util.mean()) if util.size else math.nan,
        "utilization_per_replica": [float(u) for u in util],
        "queue_len": queue_length_stats(queue, lo, hi),
        "cost_per_million_usd": cost,
    }
