"""Summary metrics from the record tables (the same code for simulated and live runs).

The measurement window is ``[warmup_s, horizon_s]``: ``horizon_s`` is the workload's
``duration_s`` when it has one, else the last arrival (a stopped live run: the stop time).
A run may go on after the horizon to drain its queue; ``end_s`` is when it stopped.

* throughput = ok requests that *finish* inside the window / window length: what a load
  tester reports; under overload it is the capacity, never the offered load;
* offered = arrivals in the window / window length;
* goodput = those completions whose latency met ``slo_s`` / window length (None without an
  SLO: it is not the throughput);
* latency = finish − arrival, queue wait = start − arrival, service = finish − start: mean,
  p50, p90, p95, p99, p99.9, max (numpy's default linear percentiles) over the requests that
  *arrive* in the window and end ok. Requests still unfinished when the run stopped are
  *censored*: latency and queue wait count them with ``end_s`` as their finish (a lower
  bound), and each of those stats says how many (``censored``);
* error rate (total and per cause) = non-ok terminal outcomes / arrivals in the window;
* batch size (requests and items) over the batches that *start* in the window, batch
  utilisation = mean batch / max batch size;
* device utilisation = busy time / (window × replicas), busy time counted per replica as the
  union of its batch intervals;
* queue length: time-weighted mean, p95 and max of the total over all queues;
* requests in system: time-weighted mean over the window, with Little's law as a check
  (``littles_law``: in-system mean against throughput × mean latency);
* stability: see :mod:`sim.stability`;
* cost per million ok requests from a price per replica-hour, over the replica-seconds held in
  the window (replicas × window for a fixed fleet; the integral of the replica count, cold
  starts and draining included, for an autoscaled one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from sim.fleet import fleet_summary
from sim.stability import queue_trend, time_weighted_total, verdict
from sim.types import ERROR_CAUSES
from sim.window import Window

PERCENTILES = {"p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0, "p999": 99.9}


def _stats_ms(values_s: np.ndarray, censored: int | None = None) -> dict[str, Any]:
    out: dict[str, Any]
    if values_s.size == 0:
        out = dict.fromkeys(("mean", *PERCENTILES, "max"), math.nan)
    else:
        ms = values_s * 1e3
        q = np.percentile(ms, list(PERCENTILES.values()))
        out = {"mean": float(ms.mean())}
        out.update({k: float(v) for k, v in zip(PERCENTILES, q, strict=True)})
        out["max"] = float(ms.max())
    if censored is not None:
        out["censored"] = censored
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
    times, total = time_weighted_total(queue)
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


def in_system_mean(requests: pd.DataFrame, lo_s: float, hi_s: float, end_s: float) -> float:
    """Time-mean number of requests in the system (queued or running) over [lo, hi].

    A request is in the system from its arrival to its terminal time (finish, rejection,
    expiry, drop); one still unfinished counts until ``end_s``.
    """
    if hi_s <= lo_s or requests.empty:
        return math.nan
    arrival = requests["arrival_s"].to_numpy()
    leave = requests["finish_s"].to_numpy(dtype=float, na_value=np.nan)
    leave = np.where(np.isnan(leave), end_s, leave)
    overlap = np.minimum(leave, hi_s) - np.maximum(arrival, lo_s)
    return float(np.sum(np.clip(overlap, 0.0, None)) / (hi_s - lo_s))


def _stop_s(window: Window) -> float:
    """When the run stopped (the horizon when it drained everything)."""
    return window.end_s if math.isfinite(window.end_s) else window.horizon_s


def latency_with_censored_s(ok: pd.DataFrame, pending: pd.DataFrame,
                            stop_s: float) -> np.ndarray:
    """Latencies (s) of ``ok`` requests, then of the ``pending`` (censored) ones with the
    stop time as their finish (lower bounds).
    """
    return np.concatenate(((ok["finish_s"] - ok["arrival_s"]).to_numpy(),
                           stop_s - pending["arrival_s"].to_numpy()))


def ok_requests(requests: pd.DataFrame, warmup_s: float) -> pd.DataFrame:
    """The ok requests that arrived in the measurement window (after ``warmup_s``): the rows
    behind every latency statistic (summary, batch means, reports, dashboard figures).
    """
    inwin = requests[requests["arrival_s"] >= warmup_s]
    return inwin[inwin["status"].astype(str) == "ok"]


def ok_latency_s(requests: pd.DataFrame, warmup_s: float) -> np.ndarray:
    """Latency (s) of :func:`ok_requests`, in request order."""
    ok = ok_requests(requests, warmup_s)
    return (ok["finish_s"] - ok["arrival_s"]).to_numpy()


def summarize(requests: pd.DataFrame, batches: pd.DataFrame, queue: pd.DataFrame,
              window: Window, driver: str,
              fleet: tuple[pd.DataFrame, pd.DataFrame] | None = None) -> dict[str, Any]:
    """The run summary (keys as in the README's metrics table); ``fleet`` (the replica
    series and fleet events of an autoscaled run) adds the autoscaling metrics, and makes
    utilisation and cost count the replica-seconds the fleet really held.
    """
    lo, hi, span = window.warmup_s, window.horizon_s, window.length_s
    inwin = requests[requests["arrival_s"] >= lo]
    status = inwin["status"].astype(str)
    ok = ok_requests(requests, lo)
    arrivals = len(inwin)
    latency = (ok["finish_s"] - ok["arrival_s"]).to_numpy()
    counts = {cause: int((status == cause).sum()) for cause in ERROR_CAUSES}
    errors = sum(counts.values())
    per_s = (1.0 / span) if span > 0 else math.nan
    completions, good = completions_in_window(requests, window)
    # censored: arrived in the window, still queued or running when the run stopped
    pending = inwin[status == "in_flight"]
    censored = len(pending)
    end_s = _stop_s(window)
    lat_all_in = latency_with_censored_s(ok, pending, end_s)
    started = pending["start_s"].to_numpy(dtype=float, na_value=np.nan)
    wait_pending = np.where(np.isnan(started), end_s, started) - pending["arrival_s"].to_numpy()
    wait = np.concatenate(((ok["start_s"] - ok["arrival_s"]).to_numpy(), wait_pending))
    bwin = batches[batches["start_s"] >= lo]
    mean_batch = float(bwin["size"].mean()) if len(bwin) else math.nan
    busy = np.array([busy_s(batches, r, lo, hi) for r in range(window.replicas)])
    util = busy / span if span > 0 else np.full(window.replicas, math.nan)
    hist = bwin["size"].value_counts().sort_index()
    throughput = completions * per_s
    offered = arrivals * per_s
    if fleet is not None:
        ok_mask = ((requests["arrival_s"] >= lo) & (requests["status"].astype(str) == "ok")
                   ).to_numpy()
        scaling = fleet_summary(requests, fleet[0], fleet[1], lo, hi, latency, ok_mask)
        held_s = float(scaling["replica_seconds"])  # type: ignore[arg-type]
        utilization = float(busy.sum() / held_s) if held_s > 0 else math.nan
    else:
        held_s = window.replicas * span
        scaling = {"replica_seconds": held_s, "cold_starts": 0, "cold_start_waits": 0}
        utilization = float(util.mean()) if util.size else math.nan
    cost = math.nan
    if window.price_per_replica_hour > 0 and completions > 0:
        cost = window.price_per_replica_hour * held_s / 3600.0 / completions * 1e6
    in_system = in_system_mean(requests, lo, hi, end_s)
    mean_latency_s = float(latency.mean()) if latency.size else math.nan
    little = throughput * mean_latency_s
    stability = verdict(offered_rps=offered, capacity=window.capacity_rps,
                        utilization=utilization, trend=queue_trend(queue, lo, hi),
                        window_s=span, closed_loop=window.closed_loop, bounded=window.bounded)
    return {
        "driver": driver,
        "requests": arrivals,
        "ok": len(ok),
        **counts,
        "in_flight": int((status == "in_flight").sum()),
        "censored": censored,
        "completions": completions,
        "window_s": span,
        "offered_rps": offered,
        "throughput_rps": throughput,
        "goodput_rps": None if good is None else good * per_s,
        "error_rate": errors / arrivals if arrivals else math.nan,
        "error_rate_by_cause": {c: (n / arrivals if arrivals else math.nan)
                                for c, n in counts.items()},
        "latency_ms": _stats_ms(lat_all_in, censored),
        "queue_ms": _stats_ms(wait, censored),
        "service_ms": _stats_ms((ok["finish_s"] - ok["start_s"]).to_numpy()),
        "batches": len(bwin),
        "mean_batch_size": mean_batch,
        "mean_batch_items": float(bwin["items"].mean()) if len(bwin) else math.nan,
        "batch_size_hist": {str(k): int(v) for k, v in hist.items()},
        "batch_utilization": mean_batch / window.max_batch_size if len(bwin) else math.nan,
        "utilization": utilization,
        "utilization_per_replica": [float(u) for u in util],
        "queue_len": queue_length_stats(queue, lo, hi),
        "in_system_mean": in_system,
        "littles_law": {"in_system_mean": in_system, "throughput_x_latency": little,
                        "rel_gap": (in_system - little) / little if little else math.nan},
        "stability": stability,
        "cost_per_million_usd": cost,
        **scaling,
        **({"classes": class_summaries(requests, window)} if "klass" in requests else {}),
    }


def completions_in_window(requests: pd.DataFrame, window: Window) -> tuple[int, int | None]:
    """Ok requests (whenever they arrived) that finished inside the window, and how many of
    those met their SLO (their own deadline when requests carry one; None without any SLO).
    """
    lo, hi = window.warmup_s, window.horizon_s
    all_ok = requests[requests["status"].astype(str) == "ok"]
    finish = all_ok["finish_s"].to_numpy()
    done_in = (finish >= lo) & (finish <= hi)
    if window.slo_s is None and not window.has_deadlines:
        return int(done_in.sum()), None
    latency = finish - all_ok["arrival_s"].to_numpy()
    if "deadline_s" in all_ok:
        budget = all_ok["deadline_s"].to_numpy() - all_ok["arrival_s"].to_numpy()
        met = latency <= budget * (1 + 1e-12)
    else:
        met = latency <= (window.slo_s if window.slo_s is not None else math.inf)
    return int(done_in.sum()), int(np.sum(done_in & met))


def class_summaries(requests: pd.DataFrame, window: Window) -> dict[str, dict[str, Any]]:
    """Per request class: arrivals, ok, completions, throughput, goodput, error rate and
    latency (as in the summary, over that class's requests).
    """
    lo, span = window.warmup_s, window.length_s
    per_s = (1.0 / span) if span > 0 else math.nan
    end_s = _stop_s(window)
    out: dict[str, dict[str, Any]] = {}
    for name, group in requests.groupby("klass", sort=True):
        if name == "":
            continue
        inwin = group[group["arrival_s"] >= lo]
        status = inwin["status"].astype(str)
        ok = inwin[status == "ok"]
        pending = inwin[status == "in_flight"]
        completions, good = completions_in_window(group, window)
        errors = int(status.isin(list(ERROR_CAUSES)).sum())
        latency = latency_with_censored_s(ok, pending, end_s)
        out[str(name)] = {
            "requests": len(inwin), "ok": len(ok), "completions": completions,
            "throughput_rps": completions * per_s,
            "goodput_rps": None if good is None else good * per_s,
            "error_rate": errors / len(inwin) if len(inwin) else math.nan,
            "error_rate_by_cause": {c: (int((status == c).sum()) / len(inwin) if len(inwin)
                                        else math.nan) for c in ERROR_CAUSES},
            "latency_ms": _stats_ms(latency, len(pending)),
        }
    return out
